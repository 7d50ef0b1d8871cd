// Owns the one way answers get their data: the current snapshot (through the cache) paired with
// the view derived from it and the registry's current version.
import type { Registry } from '../shards/registry.js';
import type { NodeSnapshot } from './node-snapshot.js';
import { createNodeViewCache, type NodeView } from './node-view.js';
import type { GetOptions, SnapshotSource, SnapshotView } from './snapshot.js';

export interface NodeService {
  current(options?: GetOptions): Promise<{ view: SnapshotView<NodeSnapshot>; node: NodeView }>;
  /** The cached snapshot and its view without refreshing anything; null before the first success. */
  peek(): { view: SnapshotView<NodeSnapshot>; node: NodeView } | null;
  invalidate(): void;
  readonly snapshots: SnapshotSource<NodeSnapshot>;
}

export function createNodeService(snapshots: SnapshotSource<NodeSnapshot>, registry: Registry): NodeService {
  const derive = createNodeViewCache();
  const withNode = (view: SnapshotView<NodeSnapshot>) => ({
    view,
    node: derive(view.snapshot, registry.version, () => registry.list()),
  });
  return {
    async current(options) {
      return withNode(await snapshots.get(options));
    },
    peek() {
      const view = snapshots.peek();
      return view ? withNode(view) : null;
    },
    invalidate: () => snapshots.invalidate(),
    snapshots,
  };
}
