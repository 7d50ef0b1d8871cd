// Owns what one node snapshot holds and how it is taken: both nvidia-smi queries joined by GPU UUID,
// then one /proc read of every PID answers ask about (GPU processes, shard processes, cgroup members,
// and the parents between them). When nvidia-smi fails, /proc is still read for the shards and kept
// with the error (procFactsAfter), so an outage does not hide a shard's exit.
import type { Logger } from 'pino';
import type { ComputeAppRecord, GpuListing, GpuRecord, NvidiaSmi } from '../system/nvidia-smi.js';
import { isReadable, type ProcReader, type ProcStat, type StatAnswer } from '../system/procfs.js';
import { createRepeatLimit, type RepeatLimit } from '../repeat-limit.js';
import { createGpuRoster, type LostGpu } from './gpu-roster.js';

/** Generations above a GPU process in which attribution looks for its shard (vLLM's workers sit a few forks down). */
export const ANCESTRY_DEPTH = 4;

export interface GpuProcess {
  pid: number;
  name: string;
  usedMiB: number | null;
  gpuIndex: number;
  gpuUuid: string;
}

export interface GpuState extends GpuRecord {
  processes: GpuProcess[];
}

export interface NodeSnapshot {
  takenAt: number;
  gpus: GpuState[];
  /** Per PID of interest: null when it is not in this /proc; an UnreadableStat says nothing about whether it runs. */
  proc: ReadonlyMap<number, StatAnswer>;
  /** For each cgroup string of a registered shard, the PIDs whose cgroup paths contain it. */
  cgroupPids: ReadonlyMap<string, ReadonlySet<number>>;
  /** Why the cgroup scan failed this refresh (cgroupPids is then empty); absent when it did not. */
  cgroupScanFailed?: string;
  /** The boot these PIDs belong to (ProcReader.bootId); null when /proc cannot say. */
  bootId: string | null;
  /** Rows nvidia-smi listed under a UUID that matches no GPU of the GPU query. */
  unmatchedProcesses: ComputeAppRecord[];
  /** GPUs an earlier snapshot of this process listed and this one does not (gpu-roster.ts), by index. */
  lostGpus: LostGpu[];
  timings: { nvidiaSmiMs: number; procMs: number };
}

/** The /proc part of a snapshot, read for the shards alone by a refresh whose nvidia-smi query failed. */
export interface ProcFacts {
  /** When the refresh that read them began: a shard registered after it is not described by them. */
  startedAt: number;
  takenAt: number;
  proc: ReadonlyMap<number, StatAnswer>;
  cgroupPids: ReadonlyMap<string, ReadonlySet<number>>;
  /** As NodeSnapshot's. */
  cgroupScanFailed?: string;
  bootId: string | null;
}

/** Keyed by the error a failed refresh threw, so the error itself carries no data into logs. */
const factsAfterFailure = new WeakMap<Error, ProcFacts>();

/** The /proc facts the refresh that failed with `error` read for the shards; undefined when none were read. */
export function procFactsAfter(error: Error | null): ProcFacts | undefined {
  return error === null ? undefined : factsAfterFailure.get(error);
}

/** What the registry wants read along with the GPU processes. */
export interface SnapshotInterest {
  pids: Iterable<number>;
  cgroups: Iterable<string>;
}

export interface SnapshotTakerDeps {
  nvidiaSmi: NvidiaSmi;
  proc: ProcReader;
  log: Logger;
  interest: () => SnapshotInterest;
  now: () => number;
}

export function joinGpusAndProcesses(
  gpus: GpuRecord[],
  apps: ComputeAppRecord[],
): { gpus: GpuState[]; unmatched: ComputeAppRecord[] } {
  const byUuid = new Map<string, GpuState>();
  const states = gpus.map((gpu) => {
    const state: GpuState = { ...gpu, processes: [] };
    byUuid.set(gpu.uuid, state);
    return state;
  });
  const unmatched: ComputeAppRecord[] = [];
  for (const app of apps) {
    const gpu = byUuid.get(app.gpuUuid);
    if (!gpu) {
      unmatched.push(app);
      continue;
    }
    gpu.processes.push({ pid: app.pid, name: app.name, usedMiB: app.usedMiB, gpuIndex: gpu.index, gpuUuid: gpu.uuid });
  }
  return { gpus: states, unmatched };
}

/** A PID's stat when this snapshot read it; undefined when it was not asked about, is gone or was unreadable. */
export function statOf(snapshot: NodeSnapshot, pid: number): ProcStat | undefined {
  const answer = snapshot.proc.get(pid);
  return isReadable(answer) ? answer : undefined;
}

/**
 * Reads into `stats` the parents attribution walks from a GPU process up to its shard (ANCESTRY_DEPTH
 * - 1 generations), following a chain only while it stays in a shard process's session.
 */
async function readParents(proc: ProcReader, stats: Map<number, StatAnswer>, gpuPids: Iterable<number>, shardPids: ReadonlySet<number>): Promise<void> {
  const sessions = new Set<number>();
  for (const pid of shardPids) {
    const stat = stats.get(pid);
    if (isReadable(stat)) sessions.add(stat.session);
  }
  const walked = new Set<number>();
  let frontier = new Set(gpuPids);
  for (let generation = 1; generation < ANCESTRY_DEPTH && sessions.size > 0; generation += 1) {
    const parents = new Set<number>();
    for (const pid of frontier) {
      const stat = stats.get(pid);
      walked.add(pid);
      if (shardPids.has(pid) || !isReadable(stat) || stat.pid === stat.session || !sessions.has(stat.session)) continue;
      // A shard found ends the chain; init (1) and the kernel (0) are never below a shard.
      if (shardPids.has(stat.ppid) || stat.ppid <= 1 || walked.has(stat.ppid)) continue;
      parents.add(stat.ppid);
    }
    if (parents.size === 0) return;
    const unread = [...parents].filter((pid) => !stats.has(pid));
    if (unread.length > 0) for (const [pid, stat] of await proc.readStats(unread)) stats.set(pid, stat);
    frontier = parents;
  }
}

async function scanCgroups(proc: ProcReader, needles: string[]): Promise<Map<string, Set<number>>> {
  const found = await proc.findPidsInCgroups(needles);
  return new Map([...found].map(([needle, pids]) => [needle, new Set(pids)]));
}

/** The cgroup scan, or why it failed: a failed scan must not fail the snapshot (its cgroup shards read unverified). */
async function scanCgroupsOrWhy(deps: SnapshotTakerDeps, needles: string[], level: RepeatLimit): Promise<{ cgroupPids: Map<string, Set<number>>; failed?: string }> {
  try {
    return { cgroupPids: await scanCgroups(deps.proc, needles) };
  } catch (err) {
    const failed = (err as Error).message;
    // Keyed by the errno: the message names a different process each time.
    const code = ((err as Error).cause as NodeJS.ErrnoException | undefined)?.code;
    deps.log[level(code ?? failed)](
      { err, cgroupShards: needles.length },
      `Could not find the processes of the cgroup shards in /proc: ${failed}. Until a refresh can, whether each cgroup shard runs is unverified (it keeps serving, with this reason) ` +
        "and its processes' GPU memory counts as foreign. PID shards and the GPUs are not affected. Run `nodecompute doctor` on this node.",
    );
    return { cgroupPids: new Map(), failed };
  }
}

/** Reads the shards' /proc facts after nvidia-smi failed and leaves them with the error; none when /proc fails too. */
async function readFactsAfterFailure(
  deps: SnapshotTakerDeps,
  error: unknown,
  startedAt: number,
  listedPids: readonly number[],
  scanFailureLevel: RepeatLimit,
): Promise<void> {
  if (!(error instanceof Error)) return;
  try {
    const interest = deps.interest();
    const { cgroupPids, failed } = await scanCgroupsOrWhy(deps, [...new Set(interest.cgroups)], scanFailureLevel);
    const members = [...cgroupPids.values()].flatMap((pids) => [...pids]);
    // Not kept (the kept set is the full snapshot's). The last listing's GPU processes are read too.
    const proc = await deps.proc.readStats([...new Set([...interest.pids, ...members, ...listedPids])]);
    factsAfterFailure.set(error, { startedAt, takenAt: deps.now(), proc, cgroupPids, ...(failed === undefined ? {} : { cgroupScanFailed: failed }), bootId: deps.proc.bootId() });
  } catch (err) {
    deps.log.warn({ err }, "Could not read the shards' processes in /proc after nvidia-smi failed: until it answers again, no exit or stop of a shard can be seen, and each keeps the verdict nvidia-smi's last listing gave it (one it showed ready reads unverified)");
  }
}

export function createSnapshotTaker(deps: SnapshotTakerDeps): () => Promise<NodeSnapshot> {
  const { now } = deps;
  const roster = createGpuRoster(deps.log);
  const scanFailureLevel = createRepeatLimit(now);
  /** The last snapshot's GPU processes: read again after a failure. */
  let listedPids: readonly number[] = [];
  return async () => {
    const startedAt = now();
    const started = performance.now();
    let listing: GpuListing;
    let apps: ComputeAppRecord[];
    try {
      [listing, apps] = await Promise.all([deps.nvidiaSmi.queryGpus(), deps.nvidiaSmi.queryComputeApps()]);
    } catch (err) {
      await readFactsAfterFailure(deps, err, startedAt, listedPids, scanFailureLevel);
      throw err;
    }
    const smiDone = performance.now();
    const { gpus, unmatched } = joinGpusAndProcesses(listing.gpus, apps);
    if (unmatched.length > 0) {
      deps.log.warn(
        { rows: unmatched.length, uuids: [...new Set(unmatched.map((row) => row.gpuUuid))] },
        'nvidia-smi listed processes on GPU UUIDs its GPU query did not return; they are left out of per-GPU answers',
      );
    }
    const interest = deps.interest();
    const gpuPids = new Set<number>(apps.map((app) => app.pid));
    const shardPids = new Set<number>(interest.pids);
    // The scan comes first so that one read covers the members too; the same PIDs come back next
    // refresh, so their stat files are kept open.
    const { cgroupPids, failed } = await scanCgroupsOrWhy(deps, [...new Set(interest.cgroups)], scanFailureLevel);
    const members = [...cgroupPids.values()].flatMap((pids) => [...pids]);
    const proc = await deps.proc.readStats([...new Set([...gpuPids, ...shardPids, ...members])], { keep: true });
    await readParents(deps.proc, proc, gpuPids, shardPids);
    const done = performance.now();
    const takenAt = now();
    listedPids = [...gpuPids];
    return {
      takenAt,
      gpus,
      proc,
      cgroupPids,
      ...(failed === undefined ? {} : { cgroupScanFailed: failed }),
      bootId: deps.proc.bootId(),
      unmatchedProcesses: unmatched,
      lostGpus: roster.update(listing.gpus, takenAt, listing.unreachable),
      timings: { nvidiaSmiMs: smiDone - started, procMs: done - smiDone },
    };
  };
}
