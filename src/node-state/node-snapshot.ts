// Owns what one node snapshot holds and how it is taken: both nvidia-smi queries run concurrently,
// their rows are joined by GPU UUID, then /proc is read once for every PID that answers will ask
// about (GPU processes, registered shards' processes and, after one cgroup scan when cgroup shards
// exist, the members of their cgroups: their names tell a pod's sandbox from its engine, their
// start times which run is current), plus the parents through which a GPU process may descend from
// a shard (see readParents). Everything a request derives later comes from this one consistent
// picture.
//
// A refresh whose nvidia-smi query fails still reads /proc for the registered shards (their PIDs,
// their cgroups' members) and leaves those facts with its error (procFactsAfter): whether a shard's
// process runs, and whether the engine said CPU, do not depend on nvidia-smi, so an outage must not
// turn an exited shard into an unverified, ready one. The read happens once per failed refresh, which
// the snapshot cache runs at most once per failure window, never per request.
import type { Logger } from 'pino';
import type { ComputeAppRecord, GpuListing, GpuRecord, NvidiaSmi } from '../system/nvidia-smi.js';
import { isReadable, type ProcReader, type ProcStat, type StatAnswer } from '../system/procfs.js';
import { createRepeatLimit, type RepeatLimit } from '../repeat-limit.js';
import { createGpuRoster, type LostGpu } from './gpu-roster.js';

/**
 * Generations above a GPU process among which attribution looks for its shard: an engine's GPU
 * memory sits at most a few forks below the PID it is registered with (vLLM: API server, EngineCore,
 * one worker per GPU; a wrapper script adds one). So at most ANCESTRY_DEPTH - 1 parents are read
 * above each GPU process.
 */
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
  /**
   * /proc facts per PID of interest (GPU processes, shard processes, cgroup shards' members, the
   * parents between them): null when the PID does not exist in this /proc (it exited, or
   * lives in another PID namespace), an UnreadableStat when it could not be read or parsed this time
   * (out of descriptors, EIO, a malformed line), which says nothing about whether it runs.
   */
  proc: ReadonlyMap<number, StatAnswer>;
  /** For each cgroup string of a registered shard, the PIDs whose cgroup paths contain it. */
  cgroupPids: ReadonlyMap<string, ReadonlySet<number>>;
  /**
   * Why the scan for the cgroup shards' processes failed in this refresh (cgroupPids is then empty,
   * and whether each cgroup shard runs is unknown); absent when it did not fail.
   */
  cgroupScanFailed?: string;
  /** The boot these PIDs belong to (ProcReader.bootId); null when /proc cannot say. */
  bootId: string | null;
  /** Rows nvidia-smi listed under a UUID that matches no GPU of the GPU query. */
  unmatchedProcesses: ComputeAppRecord[];
  /** GPUs an earlier snapshot of this process listed and this one does not (gpu-roster.ts), by index. */
  lostGpus: LostGpu[];
  timings: { nvidiaSmiMs: number; procMs: number };
}

/**
 * The /proc part of a snapshot, read for the registered shards alone by a refresh whose nvidia-smi
 * query failed: enough to tell whether each shard's process still runs.
 */
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

/** Keyed by the error a failed refresh threw: the error stays what nvidia-smi said, and carries no data into logs. */
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
 * Reads, into `stats`, the parents that attribution needs to walk from a GPU process up to the shard
 * it descends from, ANCESTRY_DEPTH - 1 generations at most. Only parents that can lead to a shard are
 * read, so the cost stays near zero on a node whose GPU processes are shards or their children (their
 * parent is a shard PID, read already) and on one full of foreign processes: a chain is followed only
 * while it stays in the session of a registered shard process (a session is inherited; a chain leaves
 * it only through a session leader, whose parent is in another session), and parents shared by many
 * processes are read once. So a GPU process that started its own session (setsid) below its shard is
 * found only when the shard is its parent, which needs no read. Fresh reads, not kept ones:
 * readStats({ keep }) keeps the first read's set, and these parents are few.
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

/**
 * The cgroup scan of a snapshot whose nvidia-smi answered. One process whose cgroup file cannot be
 * read (out of descriptors, EIO) fails the scan, and the snapshot must not fail with it: the GPUs and
 * every PID shard are as readable as ever. Its cgroup shards then read unverified (attribution.ts),
 * and their processes' memory counts as foreign, which errs on the safe side for placement.
 */
async function scanCgroupsOrWhy(deps: SnapshotTakerDeps, needles: string[], level: RepeatLimit): Promise<{ cgroupPids: Map<string, Set<number>>; failed?: string }> {
  try {
    return { cgroupPids: await scanCgroups(deps.proc, needles) };
  } catch (err) {
    const failed = (err as Error).message;
    // Keyed by the system's code, not the message: that names the process, a different one each time.
    const code = ((err as Error).cause as NodeJS.ErrnoException | undefined)?.code;
    deps.log[level(code ?? failed)](
      { err, cgroupShards: needles.length },
      `Could not find the processes of the cgroup shards in /proc: ${failed}. Until a refresh can, whether each cgroup shard runs is unverified (it keeps serving, with this reason) ` +
        "and its processes' GPU memory counts as foreign. PID shards and the GPUs are not affected. Run `nodecompute doctor` on this node.",
    );
    return { cgroupPids: new Map(), failed };
  }
}

/**
 * Reads the shards' /proc facts after nvidia-smi failed and leaves them with the error. A /proc that
 * cannot be read here leaves none: the nvidia-smi failure is the answer either way.
 */
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
    // Not kept: the stat files kept open are the full snapshot's, which this read must not shrink.
    // The last good listing's GPU processes too: whether they still run says whether what it showed of a shard still holds.
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
  /** The GPU processes of the last snapshot taken: read again after a failure. */
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
    // The scan comes first so that one read covers the members too (no scan, no cost, when there is
    // no cgroup shard). A PID whose stat is unreadable or malformed is an UnreadableStat in this
    // snapshot, not null (gone): running out of descriptors must not call every shard exited. The
    // reader logs those once per call. The same PIDs come back next refresh, so their stat files
    // are kept open.
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
