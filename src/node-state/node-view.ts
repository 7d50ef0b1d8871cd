// Owns the one way answers get their data: the cached snapshot with its view for the registry's
// current version, derived once and shared by every request that sees the pair (attribution walks
// every GPU process); and, with no snapshot to serve, each shard's liveness from the /proc facts the
// latest failed refresh read (never a read of its own, nor the last good snapshot's). Also GET
// /gpus's GPU view and the CPU cores each shard's processes use.
import type { Logger } from 'pino';
import type { Static } from '@sinclair/typebox';
import type { SnapshotMetaComponent } from '../schemas/common.js';
import type { GpusResponse } from '../schemas/gpus.js';
import type { ShardRecord } from '../shards/shard.js';
import { unreachableOf, type UnreachableGpu } from '../system/nvidia-smi.js';
import type { StatAnswer } from '../system/procfs.js';
import { attribute, type Attribution, type Liveness } from './attribution.js';
import { procFactsAfter, statOf, type FactsAfterFailure, type NodeSnapshot } from './node-snapshot.js';
import { listedAs, type UnreachableListedGpu } from './placement.js';
import type { GetOptions, SnapshotSource, SnapshotView } from './snapshot.js';

export interface NodeView {
  snapshot: NodeSnapshot;
  attribution: Attribution;
  registryVersion: number;
  /** Why nvidia-smi's processes cannot be matched to this /proc (verdicts are then unverified); null when they can. */
  processesHidden: string | null;
}

export const PID_NAMESPACE_WARNING =
  "the GPU driver lists GPU processes whose PIDs do not exist in this /proc: nodecompute does not share the host's PID namespace, so it cannot tell whose memory is whose. Run it with --pid=host (Docker) or hostPID: true (Kubernetes), or point NODECOMPUTE_PROC at the host's /proc.";

/** Used memory on a GPU that says someone computes there (idle GPUs show < 300 MiB). */
const BUSY_MIB = 1024;

export function busyGpus(gpus: ReadonlyArray<{ index: number; usedMiB: number | null }>): number[] {
  return gpus.filter((gpu) => gpu.usedMiB !== null && gpu.usedMiB >= BUSY_MIB).map((gpu) => gpu.index);
}

/** Busy GPUs with no process listed: another PID namespace or a GPU-sharing layer hides them. */
export function hiddenProcessesWarning(busy: number[]): string {
  const gpus = busy.map((index) => `GPU ${index}`).join(', ');
  const hidden = `the GPU driver lists no GPU process, yet ${gpus} ${busy.length === 1 ? 'has' : 'have'} memory in use: the processes are hidden from it`;
  return `${hidden}. Either nodecompute does not share the host's PID namespace (--pid=host / hostPID: true) or a GPU-sharing layer (HAMi, vGPU) hides them.`;
}

/** What one snapshot says about the PIDs nvidia-smi lists (`hidden`: NodeView.processesHidden), to judge the next by. */
export type PidsJudged = { snapshot: NodeSnapshot; missing: ReadonlySet<number>; hidden: string | null };

/** Hidden: every listed PID missing, one of them in `previous` too (one exited process does not count); idle GPUs keep the last judgement. */
export function judgePids(snapshot: NodeSnapshot, previous: PidsJudged | null): PidsJudged {
  const listed = new Set(snapshot.gpus.flatMap((gpu) => gpu.processes.map((process) => process.pid)));
  const missing = new Set([...listed].filter((pid) => snapshot.proc.get(pid) == null));
  if (listed.size > 0) {
    const persists = previous === null || previous.hidden !== null || [...missing].some((pid) => previous.missing.has(pid));
    return { snapshot, missing, hidden: missing.size === listed.size && persists ? PID_NAMESPACE_WARNING : null };
  }
  const busy = busyGpus(snapshot.gpus);
  if (busy.length > 0) return { snapshot, missing, hidden: hiddenProcessesWarning(busy) };
  return previous === null ? { snapshot, missing, hidden: null } : { ...previous, snapshot };
}

/** The view of one snapshot for one registry version; `pids` defaults to judging it as a first snapshot. */
export function createNodeView(snapshot: NodeSnapshot, shards: readonly ShardRecord[], registryVersion: number, pids = judgePids(snapshot, null)): NodeView {
  return { snapshot, attribution: attribute(snapshot, shards), registryVersion, processesHidden: pids.hidden };
}

export type SnapshotMeta = Static<typeof SnapshotMetaComponent>;

export function snapshotMeta(view: SnapshotView<unknown>): SnapshotMeta {
  const meta: SnapshotMeta = { observedAt: new Date(view.observedAt).toISOString(), ageMs: Math.round(view.ageMs), stale: view.stale };
  if (view.staleReason !== null) meta.staleReason = view.staleReason;
  return meta;
}

/** Memoises the view per snapshot and registry version, and logs once when processes turn hidden or visible. */
export function createNodeViewCache(log: Logger): (snapshot: NodeSnapshot, registryVersion: number, shards: () => readonly ShardRecord[]) => NodeView {
  let last: NodeView | null = null;
  let pids: PidsJudged | null = null;
  return (snapshot, registryVersion, shards) => {
    if (last && last.snapshot === snapshot && last.registryVersion === registryVersion) return last;
    if (pids?.snapshot !== snapshot) {
      const judged = judgePids(snapshot, pids);
      if ((judged.hidden === null) !== ((pids?.hidden ?? null) === null)) reportHidden(log, judged);
      pids = judged;
    }
    last = createNodeView(snapshot, shards(), registryVersion, pids);
    return last;
  };
}

function reportHidden(log: Logger, { hidden, missing }: PidsJudged): void {
  if (hidden === null) {
    log.info("The GPU driver's GPU processes match this /proc again: shard verdicts are verified again, and GPU memory is attributed to its shards.");
    return;
  }
  const meaning = 'every shard reads unverified (its probe answers 200: there is no evidence either way), all GPU memory reads as foreign, and /readyz fails';
  log.warn({ missingPids: [...missing].slice(0, 10) }, `${hidden} Until this is fixed, ${meaning}.`);
}

/** What nvidia-smi said of the GPU of `uuid` in NodeService.unreachable(); null when it did not name it. */
export function unreachableSaid(uuid: string, unreachable: readonly UnreachableListedGpu[]): string | null {
  return unreachable.find(({ listed }) => listed?.uuid === uuid)?.said ?? null;
}

/** GET /gpus after its snapshot header. */
export function gpusResponse(node: NodeView, unreachable: readonly UnreachableListedGpu[]): Pick<GpusResponse, 'gpus' | 'lostGpus'> {
  const owner = node.attribution.ownerByPid;
  const gpus = node.snapshot.gpus.map(({ totalMiB, usedMiB, freeMiB, reservedMiB, processes, events, migDevices, ...gpu }) => ({
    ...gpu,
    memory: { totalMiB, usedMiB, freeMiB, reservedMiB },
    migDevices: migDevices?.map(({ totalMiB: total, usedMiB: used, freeMiB: free, ...mig }) => ({ ...mig, memory: { totalMiB: total, usedMiB: used, freeMiB: free } })) ?? null,
    processes: processes.map(({ pid, name, usedMiB: held, smUtilPct, migUuid }) => ({ pid, name, usedMiB: held, shard: owner.get(pid) ?? null, smUtilPct: smUtilPct ?? null, migUuid: migUuid ?? null })),
    unreachable: unreachableSaid(gpu.uuid, unreachable),
    events: events === undefined ? null : { ...events, lastXid: events.lastXid && { ...events.lastXid, at: new Date(events.lastXid.at).toISOString() } },
  }));
  return { gpus, lostGpus: lostGpusJson(node) };
}

/** The GPUs no longer listed, as GET /gpus and GET /gpus/foreign-memory say them. */
export function lostGpusJson(node: NodeView): GpusResponse['lostGpus'] {
  return node.snapshot.lostGpus.map(({ lastListedAt, lostAt, said, ...gpu }) => ({
    ...gpu,
    lastListedAt: new Date(lastListedAt).toISOString(),
    lostAt: new Date(lostAt).toISOString(),
    unreachable: said ?? null,
  }));
}

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

/** Past the bound for callers with no budget: the driver's own deadline is shorter, so the refresh's /proc reads hang. */
function refreshHung(ms: number): string {
  const why = "longer than the GPU backend's own deadline, so a read of /proc (or of a process's files) does not return";
  return `The snapshot refresh has not finished within ${ms} ms, ${why}. Run \`nodecompute doctor\` (its proc check) and look for processes in state D (ps -eo pid,stat,wchan).`;
}

/** `waitBoundMs`: the longest a caller that names no wait of its own waits for a refresh (a /proc read that hangs must not hold it for good). */
export function createNodeService(snapshots: SnapshotSource<NodeSnapshot>, registry: ShardList, log: Logger, waitBoundMs?: number) {
  const derive = createNodeViewCache(log);
  let lastProcOnly: { facts: FactsAfterFailure; registryVersion: number; answer: ProcOnly } | null = null;
  /** The bus ids the failures since the good snapshot of `generation` named. */
  let named: { generation: number; seen: Error | null; gpus: Map<string, UnreachableGpu>; answer: readonly UnreachableListedGpu[] } | null = null;
  const withNode = (view: SnapshotView<NodeSnapshot>): Current => ({ view, node: derive(view.snapshot, registry.version, () => registry.list()) });
  return {
    current: async (options: GetOptions = {}): Promise<Current> =>
      withNode(await snapshots.get(options.maxWaitMs !== undefined || waitBoundMs === undefined ? options : { maxWaitMs: waitBoundMs, late: refreshHung(waitBoundMs) })),
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

// A shard's CPU use between the last two snapshots, over its registered process (while it is the one
// registered), its cgroup's members and its GPU processes: each counts once, and only when both
// snapshots read it; none read twice reads null, not 0.
/** Cores, to two decimals: the 10 ms clock tick makes finer figures noise. */
const round2 = (value: number): number => Math.round(value * 100) / 100;

export function shardCpuCores(shard: ShardRecord, node: NodeView): number | null {
  const { snapshot } = node;
  const pids = new Set<number>();
  if (shard.pid !== null && statOf(snapshot, shard.pid)?.startTime === shard.identity.startTime) pids.add(shard.pid);
  if (shard.cgroup !== null) for (const pid of snapshot.cgroupPids.get(shard.cgroup) ?? []) pids.add(pid);
  for (const holding of node.attribution.holdings.get(shard.id)?.values() ?? []) for (const process of holding.processes) pids.add(process.pid);
  let cores: number | null = null;
  for (const pid of pids) {
    const used = snapshot.cpuCores.get(pid);
    if (used !== undefined) cores = (cores ?? 0) + used;
  }
  return cores === null ? null : round2(cores);
}
