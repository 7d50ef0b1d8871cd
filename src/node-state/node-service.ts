// Owns the one way answers get their data: the cached snapshot with the view derived from it for the
// registry's current version; and, with no snapshot to serve, each shard's liveness from the /proc
// facts the latest failed refresh read (never a read of its own, nor the last good snapshot's).
import type { Logger } from 'pino';
import type { ShardRecord } from '../shards/shard.js';
import { attribute, type Liveness } from './attribution.js';
import { unreachableOf, type UnreachableGpu } from '../system/nvidia-smi.js';
import { procFactsAfter, type FactsAfterFailure, type NodeSnapshot } from './node-snapshot.js';
import { createNodeViewCache, type NodeView } from './node-view.js';
import { listedAs, type UnreachableListedGpu } from './placement.js';
import type { GetOptions, SnapshotSource, SnapshotView } from './snapshot.js';
import type { StatAnswer } from '../system/procfs.js';

export type Current = { view: SnapshotView<NodeSnapshot>; node: NodeView };

/** While nvidia-smi cannot be asked: liveness per shard id (none for one registered since), and the stats of the shards' and last listing's processes. */
type ProcOnly = { liveness: ReadonlyMap<string, Liveness>; proc: ReadonlyMap<number, StatAnswer> };

export type NodeService = ReturnType<typeof createNodeService>;

/** Liveness alone: the attribution of a GPU-less snapshot, over the shards registered when the facts were read. */
export function procOnlyLiveness(facts: FactsAfterFailure, shards: readonly ShardRecord[]): ProcOnly {
  const snapshot: NodeSnapshot = { ...facts, gpus: [], unmatchedProcesses: [], lostGpus: [], cpuCores: new Map(), modelFiles: new Map(), timings: { driverMs: 0, procMs: 0 } };
  const described = shards.filter((shard) => shard.registeredAt <= facts.startedAt);
  return { liveness: attribute(snapshot, described).liveness, proc: facts.proc };
}

export type ShardList = { readonly version: number; list(): readonly ShardRecord[] };

const NONE_UNREACHABLE: readonly UnreachableListedGpu[] = [];

export function createNodeService(snapshots: SnapshotSource<NodeSnapshot>, registry: ShardList, log: Logger) {
  const derive = createNodeViewCache(log);
  let lastProcOnly: { facts: FactsAfterFailure; registryVersion: number; answer: ProcOnly } | null = null;
  /** The bus ids the failures since the good snapshot of `generation` named. */
  let named: { generation: number; seen: Error | null; gpus: Map<string, UnreachableGpu>; answer: readonly UnreachableListedGpu[] } | null = null;
  const withNode = (view: SnapshotView<NodeSnapshot>): Current => ({ view, node: derive(view.snapshot, registry.version, () => registry.list()) });
  return {
    current: async (options?: GetOptions): Promise<Current> => withNode(await snapshots.get(options)),
    peek(): Current | null {
      const view = snapshots.peek();
      return view ? withNode(view) : null;
    },
    invalidate: () => snapshots.invalidate(),
    /** What the latest refresh read in /proc for the shards when nvidia-smi failed; null otherwise. */
    procOnly(): ProcOnly | null {
      const facts = procFactsAfter(snapshots.lastError);
      if (facts === undefined) return null;
      if (lastProcOnly?.facts !== facts || lastProcOnly.registryVersion !== registry.version) {
        lastProcOnly = { facts, registryVersion: registry.version, answer: procOnlyLiveness(facts, registry.list()) };
      }
      return lastProcOnly.answer;
    },
    /** What the failures since the last good refresh say nvidia-smi cannot reach, as that snapshot knew them. */
    unreachable(): readonly UnreachableListedGpu[] {
      const error = snapshots.lastError;
      if (error === null) return NONE_UNREACHABLE;
      if (named?.generation !== snapshots.generation) named = { generation: snapshots.generation, seen: null, gpus: new Map(), answer: NONE_UNREACHABLE };
      if (named.seen !== error) {
        named.seen = error;
        const before = named.gpus.size;
        for (const gpu of unreachableOf(error)) if (!named.gpus.has(gpu.busId)) named.gpus.set(gpu.busId, gpu);
        if (named.gpus.size !== before) named.answer = listedAs([...named.gpus.values()], snapshots.peek()?.snapshot ?? null);
      }
      return named.answer;
    },
    snapshots,
  };
}
