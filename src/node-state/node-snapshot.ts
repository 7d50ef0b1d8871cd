// Owns what one node snapshot holds and how it is taken: both nvidia-smi queries joined by GPU UUID,
// then one /proc read of every PID answers ask about (GPU processes, shard processes, cgroup members,
// and the parents between them). When nvidia-smi fails, /proc is still read for the shards and kept
// with the error (procFactsAfter), so an outage does not hide a shard's exit.
import type { Logger } from 'pino';
import type { ComputeAppRecord, GpuDriver, GpuListing, GpuRecord } from '../system/gpu-driver.js';
import { CLOCK_TICKS_PER_SECOND } from '../system/procfs-parse.js';
import { createModelFileReader, type ModelFileReader, type ProcessModelFiles } from '../system/model-files.js';
import { createModelRunnerReader, hostKey, type ModelRunner, type RunnerHost } from '../system/model-runners.js';
import { isReadable, type ProcReader, type ProcStat, type StatAnswer } from '../system/procfs.js';
import { createRepeatLimit, type RepeatLimit } from '../repeat-limit.js';
import { createGpuRoster, type LostGpu } from './gpu-roster.js';
import { createLoadHistory, type LastLoad } from './ollama-loads.js';

/** Generations above a GPU process in which attribution looks for its shard (vLLM's workers sit a few forks down). */
export const ANCESTRY_DEPTH = 4;

/** smUtilPct: as ComputeAppRecord's (absent under nvidia-smi); migUuid: the MIG device it runs on, null when none is known. */
export type GpuProcess = { pid: number; name: string; usedMiB: number | null; gpuIndex: number; gpuUuid: string; smUtilPct?: number | null; migUuid?: string | null };

export type GpuState = GpuRecord & { processes: GpuProcess[] };

/** What /proc says of the shards' processes; a snapshot has it, and so does a refresh whose nvidia-smi query failed. */
export interface ProcFacts {
  takenAt: number;
  /** Per PID of interest: null when it is not in this /proc; an UnreadableStat says nothing about whether it runs. */
  proc: ReadonlyMap<number, StatAnswer>;
  /** For each cgroup string of a registered shard, the PIDs whose cgroup paths contain it. */
  cgroupPids: ReadonlyMap<string, ReadonlySet<number>>;
  /** Why the cgroup scan failed this refresh (cgroupPids is then empty). */
  cgroupScanFailed?: string;
  /** The boot these PIDs belong to (ProcReader.bootId); null when /proc cannot say. */
  bootId: string | null;
}

export interface NodeSnapshot extends ProcFacts {
  gpus: GpuState[];
  /** Rows nvidia-smi listed under a UUID that matches no GPU of the GPU query. */
  unmatchedProcesses: ComputeAppRecord[];
  /** GPUs an earlier snapshot of this process listed and this one does not (gpu-roster.ts), by index. */
  lostGpus: LostGpu[];
  /** Per PID read in this snapshot and the one before (the same process: PID and start time), the CPU cores it used in between. */
  cpuCores: ReadonlyMap<number, number>;
  /** Per process that may be a shard's (a shard's own, or a GPU process in a shard's session or cgroup), the model files it loaded. */
  modelFiles: ReadonlyMap<number, ProcessModelFiles>;
  /** Per Ollama shard (its PID, or its cgroup), the model runners it runs; absent for one whose runners cannot be known. */
  modelRunners?: ReadonlyMap<number | string, readonly ModelRunner[]>;
  /** Per Ollama shard, as modelRunners, its latest runner, kept after it exits (ollama-loads.ts). */
  lastLoads?: ReadonlyMap<number | string, LastLoad>;
  timings: { driverMs: number; procMs: number };
}

/** The facts read after nvidia-smi failed; `startedAt`: a shard registered after the refresh began is not described. */
export type FactsAfterFailure = ProcFacts & { startedAt: number };

// Keyed by the error a failed refresh threw, so the error itself carries no data into logs.
const factsAfterFailure = new WeakMap<Error, FactsAfterFailure>();

export function procFactsAfter(error: Error | null): FactsAfterFailure | undefined {
  return error === null ? undefined : factsAfterFailure.get(error);
}

export interface SnapshotTakerDeps {
  driver: GpuDriver;
  proc: ProcReader;
  log: Logger;
  /** What the registry wants read along with the GPU processes; runnerHosts: where to look for Ollama's model runners. */
  interest: () => { pids: Iterable<number>; cgroups: Iterable<string>; runnerHosts?: readonly RunnerHost[] };
  now: () => number;
  /** The reader of model files, shared with the doctor so that a stuck read is never started twice; one of its own when absent. */
  modelFiles?: ModelFileReader;
}

export function joinGpusAndProcesses(gpus: GpuRecord[], apps: ComputeAppRecord[]): { gpus: GpuState[]; unmatched: ComputeAppRecord[] } {
  const states = gpus.map((gpu): GpuState => ({ ...gpu, processes: [] }));
  const byUuid = new Map(states.map((gpu) => [gpu.uuid, gpu]));
  for (const app of apps) {
    const gpu = byUuid.get(app.gpuUuid);
    if (gpu === undefined) continue;
    const at = app.migInstance;
    const mig = at ? gpu.migDevices?.find((device) => device.gpuInstanceId === at.gpuInstanceId && device.computeInstanceId === at.computeInstanceId) : undefined;
    const { pid, name, usedMiB, smUtilPct } = app;
    gpu.processes.push({ pid, name, usedMiB, gpuIndex: gpu.index, gpuUuid: gpu.uuid, smUtilPct, migUuid: mig?.uuid ?? null });
  }
  return { gpus: states, unmatched: apps.filter((app) => !byUuid.has(app.gpuUuid)) };
}

/** A PID's stat when this snapshot read it; undefined when it was not asked about, is gone or was unreadable. */
export function statOf(snapshot: ProcFacts, pid: number): ProcStat | undefined {
  const answer = snapshot.proc.get(pid);
  return isReadable(answer) ? answer : undefined;
}

/** The sessions of the shards' processes that were read. */
const sessionsOf = (proc: ReadonlyMap<number, StatAnswer>, shardPids: ReadonlySet<number>): Set<number> =>
  new Set([...shardPids].flatMap((pid) => [proc.get(pid)].filter(isReadable).map((stat) => stat.session)));

/** Reads into `stats` those of `pids` not read yet. */
async function readMissing(proc: ProcReader, stats: Map<number, StatAnswer>, pids: Iterable<number>): Promise<void> {
  const unread = [...new Set(pids)].filter((pid) => !stats.has(pid));
  if (unread.length > 0) for (const [pid, stat] of await proc.readStats(unread)) stats.set(pid, stat);
}

/**
 * The sessions a shard's descendants started (setsid; torchrun starts its workers so): those of GPU
 * processes whose leader's parent is a shard's process or in a shard's session. One level, at most
 * two stat reads per session, so a foreign workload's processes cost little.
 */
async function startedSessions(proc: ProcReader, stats: Map<number, StatAnswer>, gpuPids: Iterable<number>, sessions: ReadonlySet<number>, shardPids: ReadonlySet<number>) {
  const others = new Set<number>();
  for (const pid of gpuPids) {
    const stat = stats.get(pid);
    if (isReadable(stat) && stat.session > 1 && !sessions.has(stat.session)) others.add(stat.session);
  }
  await readMissing(proc, stats, others);
  const parentOf = (session: number) => {
    const leader = stats.get(session);
    return isReadable(leader) && leader.ppid > 1 ? leader.ppid : null;
  };
  await readMissing(proc, stats, [...others].flatMap((session) => parentOf(session) ?? []));
  const started = new Set<number>();
  for (const session of others) {
    const parent = parentOf(session);
    const stat = parent === null ? undefined : stats.get(parent);
    if (parent !== null && (shardPids.has(parent) || (isReadable(stat) && sessions.has(stat.session)))) started.add(session);
  }
  return started;
}

/** Reads the parents attribution walks from a GPU process up to its shard, while the chain stays in a shard's session or one it started. */
async function readParents(proc: ProcReader, stats: Map<number, StatAnswer>, gpuPids: Iterable<number>, shardPids: ReadonlySet<number>): Promise<void> {
  const sessions = sessionsOf(stats, shardPids);
  if (sessions.size === 0) return;
  const started = await startedSessions(proc, stats, gpuPids, sessions, shardPids);
  for (const session of started) sessions.add(session);
  const walked = new Set<number>();
  let frontier = new Set(gpuPids);
  for (let generation = 1; generation < ANCESTRY_DEPTH; generation += 1) {
    const parents = new Set<number>();
    for (const pid of frontier) {
      const stat = stats.get(pid);
      walked.add(pid);
      if (shardPids.has(pid) || !isReadable(stat) || !sessions.has(stat.session)) continue;
      // Above the leader of a shard's own session is the shard's parent; above one a shard started, its way to the shard.
      if (stat.pid === stat.session && !started.has(stat.session)) continue;
      // A shard found ends the chain; init (1) and the kernel (0) are never below a shard.
      if (shardPids.has(stat.ppid) || stat.ppid <= 1 || walked.has(stat.ppid)) continue;
      parents.add(stat.ppid);
    }
    if (parents.size === 0) return;
    await readMissing(proc, stats, parents);
    frontier = parents;
  }
}

/** The stats of `pids` and of the shards' processes, cgroup members included; a failed scan leaves its shards unverified. */
async function readProcFacts(deps: SnapshotTakerDeps, scanFailure: RepeatLimit, pids: Iterable<number>, keep: boolean) {
  const interest = deps.interest();
  const needles = [...new Set(interest.cgroups)];
  let cgroupPids = new Map<string, Set<number>>();
  let cgroupScanFailed: string | undefined;
  try {
    cgroupPids = new Map([...(await deps.proc.findPidsInCgroups(needles))].map(([needle, found]) => [needle, new Set(found)]));
  } catch (err) {
    cgroupScanFailed = (err as Error).message;
    // Keyed by the errno: the message names a different process each time.
    const code = ((err as Error).cause as NodeJS.ErrnoException | undefined)?.code;
    deps.log[scanFailure(code ?? cgroupScanFailed)](
      { err, cgroupShards: needles.length },
      `Could not find the processes of the cgroup shards in /proc: ${cgroupScanFailed}. Until a refresh can, cgroup shards read unverified (still serving) ` +
        "and their GPU memory counts as foreign; PID shards and the GPUs are not affected. Run `nodecompute doctor` on this node.",
    );
  }
  const members = [...cgroupPids.values()].flatMap((found) => [...found]);
  const proc = await deps.proc.readStats([...new Set([...pids, ...interest.pids, ...members])], { keep });
  const facts = { proc, cgroupPids, cgroupScanFailed, bootId: deps.proc.bootId() };
  return { shardPids: new Set(interest.pids), runnerHosts: interest.runnerHosts ?? [], facts };
}

/** Per PID, its CPU time and when it was read (performance.now()): what the next snapshot measures from. */
type CpuSample = ReadonlyMap<number, { startTime: number; cpuTicks: number; at: number }>;

/** Shorter than this, a rate would be mostly the 10 ms tick's rounding: the older reading stays the baseline. */
const MIN_CPU_INTERVAL_MS = 500;

/** Each process's CPU cores since its reading in `before` (same PID and start time), and the readings to measure the next snapshot from. */
export function cpuSince(before: CpuSample, proc: ReadonlyMap<number, StatAnswer>, at: number): { cores: Map<number, number>; sample: CpuSample } {
  const cores = new Map<number, number>();
  const sample = new Map<number, { startTime: number; cpuTicks: number; at: number }>();
  for (const [pid, stat] of proc) {
    if (!isReadable(stat)) continue;
    const then = before.get(pid);
    const same = then !== undefined && then.startTime === stat.startTime;
    if (same) cores.set(pid, (stat.cpuTicks - then.cpuTicks) / CLOCK_TICKS_PER_SECOND / ((at - then.at) / 1000));
    sample.set(pid, same && at - then.at < MIN_CPU_INTERVAL_MS ? then : { startTime: stat.startTime, cpuTicks: stat.cpuTicks, at });
  }
  return { cores, sample };
}

/** A process's model files are read again after this long even when its GPU memory says nothing changed. */
const MODEL_FILES_MAX_AGE_MS = 30_000;

type ModelFilesCache = Map<number, { startTime: number; held: string; at: number; answer: ProcessModelFiles }>;

/** The processes whose model files are worth reading: the shards' own, and GPU processes in a shard's session or cgroup. */
function modelFileCandidates(proc: ReadonlyMap<number, StatAnswer>, gpus: GpuState[], shardPids: ReadonlySet<number>, cgroupPids: ProcFacts['cgroupPids']): number[] {
  const sessions = sessionsOf(proc, shardPids);
  const members = new Set([...cgroupPids.values()].flatMap((found) => [...found]));
  const gpuPids = gpus.flatMap((gpu) => gpu.processes.map((process) => process.pid));
  const near = gpuPids.filter((pid) => {
    const stat = proc.get(pid);
    return members.has(pid) || (isReadable(stat) && sessions.has(stat.session));
  });
  return [...new Set([...shardPids, ...near])].filter((pid) => isReadable(proc.get(pid)));
}

// Maps change when a model loads: read again when a process is new, when its GPU memory moved (a load
// under way), or after MODEL_FILES_MAX_AGE_MS; a steady node re-reads almost nothing.
async function readModelFiles(reader: ModelFileReader, cache: ModelFilesCache, proc: ReadonlyMap<number, StatAnswer>, gpus: GpuState[], pids: number[], at: number) {
  const held = new Map<number, string>();
  for (const gpu of gpus) for (const process of gpu.processes) held.set(process.pid, `${held.get(process.pid) ?? ''}${gpu.index}:${process.usedMiB};`);
  const files = new Map<number, ProcessModelFiles>();
  for (const pid of pids) {
    const startTime = (proc.get(pid) as ProcStat).startTime;
    const key = held.get(pid) ?? '';
    const known = cache.get(pid);
    if (known !== undefined && known.startTime === startTime && known.held === key && at - known.at < MODEL_FILES_MAX_AGE_MS) {
      files.set(pid, known.answer);
      continue;
    }
    const answer = await reader.read(pid);
    if (answer === null) continue;
    files.set(pid, answer);
    cache.set(pid, { startTime, held: key, at, answer });
  }
  for (const pid of cache.keys()) if (!files.has(pid)) cache.delete(pid);
  return files;
}

export function createSnapshotTaker(deps: SnapshotTakerDeps): () => Promise<NodeSnapshot> {
  const { now, log } = deps;
  const modelFileReader = deps.modelFiles ?? createModelFileReader(deps.proc.root);
  const modelFilesCache: ModelFilesCache = new Map();
  const runnerReader = createModelRunnerReader(deps.proc);
  const loadHistory = createLoadHistory();
  const roster = createGpuRoster(log);
  const scanFailure = createRepeatLimit(now);
  /** The last snapshot's GPU processes: read again, with the shards', after nvidia-smi fails. */
  let listedPids: readonly number[] = [];
  let cpuBaseline: CpuSample = new Map();
  return async () => {
    const startedAt = now();
    const started = performance.now();
    let listing: GpuListing;
    let apps: ComputeAppRecord[];
    try {
      [listing, apps] = await Promise.all([deps.driver.queryGpus(), deps.driver.queryComputeApps()]);
    } catch (err) {
      if (!(err instanceof Error)) throw err;
      try {
        // Not kept open: the kept set is the full snapshot's.
        const { facts } = await readProcFacts(deps, scanFailure, listedPids, false);
        factsAfterFailure.set(err, { ...facts, startedAt, takenAt: now() });
      } catch (procErr) {
        const meaning = "no exit or stop of a shard can be seen, and each keeps its last listing's verdict (ready reads unverified)";
        log.warn({ err: procErr }, `Could not read the shards' processes in /proc after the GPU driver failed: until it answers again, ${meaning}`);
      }
      throw err;
    }
    const smiDone = performance.now();
    const { gpus, unmatched } = joinGpusAndProcesses(listing.gpus, apps);
    if (unmatched.length > 0) {
      const uuids = [...new Set(unmatched.map((row) => row.gpuUuid))];
      log.warn({ rows: unmatched.length, uuids }, 'The GPU driver listed processes on GPU UUIDs its GPU query did not return; per-GPU answers leave them out');
    }
    const gpuPids = new Set(apps.map((app) => app.pid));
    // The same PIDs come back next refresh, so their stat files are kept open.
    const { shardPids, runnerHosts, facts } = await readProcFacts(deps, scanFailure, gpuPids, true);
    // CPU time is measured over the span between stat reads, not up to the model files read after them (up to 1 s).
    const statsRead = performance.now();
    await readParents(deps.proc, facts.proc, gpuPids, shardPids);
    const modelRunners = await runnerReader.read(runnerHosts, facts.proc, facts.cgroupPids, now());
    const servers = loadHistory.servers().filter((pid) => !facts.proc.has(pid));
    if (servers.length > 0) for (const [pid, stat] of await deps.proc.readStats(servers)) facts.proc.set(pid, stat);
    const candidates = modelFileCandidates(facts.proc, gpus, shardPids, facts.cgroupPids);
    const modelFiles = await readModelFiles(modelFileReader, modelFilesCache, facts.proc, gpus, candidates, now());
    const lastLoads = loadHistory.update(new Set(runnerHosts.map(hostKey)), modelRunners, gpus, { stats: facts.proc, modelFiles }, startedAt);
    const done = performance.now();
    const takenAt = now();
    listedPids = [...gpuPids];
    const cpu = cpuSince(cpuBaseline, facts.proc, statsRead);
    cpuBaseline = cpu.sample;
    return {
      ...facts,
      takenAt,
      gpus,
      unmatchedProcesses: unmatched,
      lostGpus: roster.update(listing.gpus, takenAt, listing.unreachable),
      cpuCores: cpu.cores,
      modelFiles,
      modelRunners,
      lastLoads,
      timings: { driverMs: smiDone - started, procMs: done - smiDone },
    };
  };
}
