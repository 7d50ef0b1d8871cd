// Owns the one way answers get their data: the current snapshot (through the cache) paired with
// the view derived from it and the registry's current version.
import type { Registry } from '../shards/registry.js';
import type { NodeSnapshot } from './node-snapshot.js';
import { createNodeViewCache, type NodeView } from './node-view.js';
import type { GetOptions, SnapshotSource, SnapshotView } from './snapshot.js';

export interface Current {
  view: SnapshotView<NodeSnapshot>;
  node: NodeView;
}

export interface NodeService {
  current(options?: GetOptions): Promise<Current>;
  /** current() when it need not wait, at once; null when it would wait for a refresh. */
  available(): Current | null;
  /** The cached snapshot and its view without refreshing anything; null before the first success. */
  peek(): Current | null;
  invalidate(): void;
  readonly snapshots: SnapshotSource<NodeSnapshot>;
}

export function createNodeService(snapshots: SnapshotSource<NodeSnapshot>, registry: Registry): NodeService {
  const derive = createNodeViewCache();
  const withNode = (view: SnapshotView<NodeSnapshot>): Current => ({
    view,
    node: derive(view.snapshot, registry.version, () => registry.list()),
  });
  return {
    async current(options) {
      return withNode(await snapshots.get(options));
    },
    available() {
      const view = snapshots.available();
      return view ? withNode(view) : null;
    },
    peek() {
      const view = snapshots.peek();
      return view ? withNode(view) : null;
    },
    invalidate: () => snapshots.invalidate(),
    snapshots,
  };
}
