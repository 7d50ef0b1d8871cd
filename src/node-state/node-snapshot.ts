// Owns what one node snapshot holds and how it is taken: both nvidia-smi queries run concurrently,
// their rows are joined by GPU UUID, then /proc is read once for every PID that answers will ask
// about (GPU processes and registered shards' processes), plus one cgroup scan when cgroup shards
// exist. Everything a request derives later comes from this one consistent picture.
import type { Logger } from 'pino';
import type { ComputeAppRecord, GpuRecord, NvidiaSmi } from '../system/nvidia-smi.js';
import type { ProcReader, ProcStat } from '../system/procfs.js';

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
  /** /proc facts per PID of interest; null when the PID does not exist in this /proc. */
  proc: ReadonlyMap<number, ProcStat | null>;
  /** For each cgroup string of a registered shard, the PIDs whose cgroup paths contain it. */
  cgroupPids: ReadonlyMap<string, ReadonlySet<number>>;
  /** Rows nvidia-smi listed under a UUID that matches no GPU of the GPU query. */
  unmatchedProcesses: ComputeAppRecord[];
  timings: { nvidiaSmiMs: number; procMs: number };
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

async function scanCgroups(proc: ProcReader, needles: string[]): Promise<Map<string, Set<number>>> {
  const found = await proc.findPidsInCgroups(needles);
  return new Map([...found].map(([needle, pids]) => [needle, new Set(pids)]));
}

export function createSnapshotTaker(deps: SnapshotTakerDeps): () => Promise<NodeSnapshot> {
  const { now } = deps;
  return async () => {
    const started = performance.now();
    const [gpuRecords, apps] = await Promise.all([deps.nvidiaSmi.queryGpus(), deps.nvidiaSmi.queryComputeApps()]);
    const smiDone = performance.now();
    const { gpus, unmatched } = joinGpusAndProcesses(gpuRecords, apps);
    if (unmatched.length > 0) {
      deps.log.warn(
        { rows: unmatched.length, uuids: [...new Set(unmatched.map((row) => row.gpuUuid))] },
        'nvidia-smi listed processes on GPU UUIDs its GPU query did not return; they are left out of per-GPU answers',
      );
    }
    const interest = deps.interest();
    const pids = new Set<number>(apps.map((app) => app.pid));
    for (const pid of interest.pids) pids.add(pid);
    // A PID whose stat is unreadable or malformed reads as absent from this /proc for this snapshot
    // (the reader logs those once per call); the same PIDs come back next refresh, so they are kept.
    const [proc, cgroupPids] = await Promise.all([
      deps.proc.readStats([...pids], { keep: true }),
      scanCgroups(deps.proc, [...new Set(interest.cgroups)]),
    ]);
    const done = performance.now();
    return {
      takenAt: now(),
      gpus,
      proc,
      cgroupPids,
      unmatchedProcesses: unmatched,
      timings: { nvidiaSmiMs: smiDone - started, procMs: done - smiDone },
    };
  };
}
