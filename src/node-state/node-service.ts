// Owns the one way answers get their data: the current snapshot (through the cache) paired with
// the view derived from it and the registry's current version; and, when there is no snapshot to
// serve (nvidia-smi failing past max-stale, or never answered), whether each shard's process still
// runs, from /proc alone.
//
// That liveness comes from the /proc facts the latest failed refresh read anyway (node-snapshot.ts,
// procFactsAfter), not from a read of its own: probes stay free of /proc reads, and the facts are
// as fresh as refreshes are frequent (at least one per failure window, 30 s at most, while anything
// asks). It is derived once per facts and registry version, like the node view. Facts read before a
// shard was registered say nothing about it (its PID may have been another process's then): such a
// shard's liveness is unknown. The last good snapshot, however old, is not used for this: past
// max-stale it may describe processes that have changed since, while a failed refresh read /proc
// just now.
import type { Logger } from 'pino';
import type { ShardRecord } from '../shards/shard.js';
import { attribute, type Liveness } from './attribution.js';
import { unreachableGpusIn, type UnreachableGpu } from '../system/nvidia-smi.js';
import { procFactsAfter, type NodeSnapshot, type ProcFacts } from './node-snapshot.js';
import { createNodeViewCache, type NodeView } from './node-view.js';
import { listedAs, type UnreachableListedGpu } from './placement.js';
import type { GetOptions, SnapshotSource, SnapshotView } from './snapshot.js';
import type { StatAnswer } from '../system/procfs.js';

export interface Current {
  view: SnapshotView<NodeSnapshot>;
  node: NodeView;
}

/** Shard liveness read from /proc while nvidia-smi could not be asked. */
export interface ProcOnly {
  /** When /proc was read. */
  takenAt: number;
  /** Per shard id; absent for a shard the facts do not describe (registered since). */
  liveness: ReadonlyMap<string, Liveness>;
  /** The stats read: the shards' processes, and the GPU processes of the last good snapshot. */
  proc: ReadonlyMap<number, StatAnswer>;
}

export interface NodeService {
  current(options?: GetOptions): Promise<Current>;
  /** current() when it need not wait, at once; null when it would wait for a refresh. */
  available(): Current | null;
  /** The cached snapshot and its view without refreshing anything; null before the first success. */
  peek(): Current | null;
  invalidate(): void;
  /** What the latest refresh read in /proc for the shards when its nvidia-smi query failed; null when it did not fail or read nothing. */
  procOnly(): ProcOnly | null;
  /**
   * The GPUs nvidia-smi said it cannot reach in the refreshes that failed since the last good one, as
   * that snapshot knew them (a later failure that names none, a timeout say, does not bring a GPU
   * back: only a good refresh does); empty while refreshes succeed. The same array until it changes.
   */
  unreachable(): readonly UnreachableListedGpu[];
  readonly snapshots: SnapshotSource<NodeSnapshot>;
}

/** Liveness alone: the attribution of a snapshot with no GPU, over the shards registered when the facts were read. */
export function procOnlyLiveness(facts: ProcFacts, shards: readonly ShardRecord[]): ProcOnly {
  const snapshot: NodeSnapshot = {
    takenAt: facts.takenAt,
    gpus: [],
    proc: facts.proc,
    cgroupPids: facts.cgroupPids,
    ...(facts.cgroupScanFailed === undefined ? {} : { cgroupScanFailed: facts.cgroupScanFailed }),
    bootId: facts.bootId,
    unmatchedProcesses: [],
    lostGpus: [],
    timings: { nvidiaSmiMs: 0, procMs: 0 },
  };
  const described = shards.filter((shard) => shard.registeredAt <= facts.startedAt);
  return { takenAt: facts.takenAt, liveness: attribute(snapshot, described).liveness, proc: facts.proc };
}

/** What the node service reads of the shard registry: its shards and a version that changes with them. */
export interface ShardList {
  readonly version: number;
  list(): readonly ShardRecord[];
}

const NONE_UNREACHABLE: readonly UnreachableListedGpu[] = [];

export function createNodeService(snapshots: SnapshotSource<NodeSnapshot>, registry: ShardList, log: Logger): NodeService {
  const derive = createNodeViewCache(log);
  let lastProcOnly: { facts: ProcFacts; registryVersion: number; answer: ProcOnly } | null = null;
  /** What the failures since the good snapshot of `generation` named, by bus id: the last failure read, and the answer. */
  let named: { generation: number; seen: Error | null; gpus: Map<string, UnreachableGpu>; answer: readonly UnreachableListedGpu[] } | null = null;
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
    procOnly() {
      const facts = procFactsAfter(snapshots.lastError);
      if (facts === undefined) return null;
      if (lastProcOnly?.facts !== facts || lastProcOnly.registryVersion !== registry.version) {
        lastProcOnly = { facts, registryVersion: registry.version, answer: procOnlyLiveness(facts, registry.list()) };
      }
      return lastProcOnly.answer;
    },
    unreachable() {
      const error = snapshots.lastError;
      if (error === null) return NONE_UNREACHABLE;
      if (named?.generation !== snapshots.generation) named = { generation: snapshots.generation, seen: null, gpus: new Map(), answer: NONE_UNREACHABLE };
      if (named.seen !== error) {
        named.seen = error;
        const before = named.gpus.size;
        for (const gpu of unreachableGpusIn(error.message)) if (!named.gpus.has(gpu.busId)) named.gpus.set(gpu.busId, gpu);
        if (named.gpus.size !== before) named.answer = listedAs([...named.gpus.values()], snapshots.peek()?.snapshot ?? null);
      }
      return named.answer;
    },
    snapshots,
  };
}
