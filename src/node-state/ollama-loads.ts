// Owns what each Ollama server's latest model load leaves once its runner exits: the runner, the last
// listing that saw it, what the last listing that saw it on a GPU said it held there, per GPU (with
// its model files as last read, so the domain can tell weights from a bare CUDA context), and the
// least free memory its GPUs had while it ran, its own memory counted as free (Ollama places a load
// by the free memory it finds, and the runner's own goes when it exits). An idle server whose last load
// ran on the CPU would otherwise read ready at each unload and take traffic onto the CPU once per
// keep-alive. A record lives while the process that started the runner (its parent, by PID and start
// time) runs; a runner started later replaces it, an older one never does.
import type { ModelFile, ProcessModelFiles } from '../system/model-files.js';
import type { ModelRunner } from '../system/model-runners.js';
import { hasExited, isReadable, type StatAnswer } from '../system/procfs.js';

/** What a listing says of a GPU that matters here (a GpuState is one). */
type ListedGpu = { uuid: string; freeMiB: number | null; processes: ReadonlyArray<{ pid: number; usedMiB: number | null }> };

/** A runner as the last listing that saw it on a GPU had it: MiB per GPU UUID (null: not reported), and its model files as last read. */
export type RunnerOnGpu = { usedMiB: ReadonlyMap<string, number | null>; files: readonly ModelFile[] };

export type LastLoad = {
  runner: ModelRunner;
  /** When the last listing that saw the runner alive began. */
  seenAt: number;
  /** The runner on its GPUs as last listed there; null when no listing saw it hold GPU memory. */
  onGpu: RunnerOnGpu | null;
  /** Per GPU UUID, the least free memory, the runner's own counted as free, the listings that saw it alive gave; null where none said. */
  freeMiB: ReadonlyMap<string, number | null>;
  server: { pid: number; startTime: number };
};

const startOf = (runner: ModelRunner): number => runner.startedAt ?? -Infinity;

/** What `pid` holds on `gpu` (MiB): 0 when it is not listed there; null when not reported. */
function usedBy(pid: number, gpu: ListedGpu): number | null {
  let used: number | null = 0;
  for (const process of gpu.processes) if (process.pid === pid) used = used === null || process.usedMiB === null ? null : used + process.usedMiB;
  return used;
}

/** Per GPU UUID, its free memory as if `pid` held none there; null where that is not known. */
function freeWithout(pid: number, gpus: readonly ListedGpu[]): Map<string, number | null> {
  return new Map(
    gpus.map((gpu) => {
      const own = usedBy(pid, gpu);
      return [gpu.uuid, gpu.freeMiB === null || own === null ? null : gpu.freeMiB + own];
    }),
  );
}

/** The runner on the GPUs now, its files as read this refresh or else as before; `before` when no GPU lists it. */
function onGpuNow(pid: number, gpus: readonly ListedGpu[], files: ProcessModelFiles | undefined, before: RunnerOnGpu | null): RunnerOnGpu | null {
  const listing = gpus.filter((gpu) => gpu.processes.some((process) => process.pid === pid));
  if (listing.length === 0) return before;
  return { usedMiB: new Map(listing.map((gpu) => [gpu.uuid, usedBy(pid, gpu)])), files: files?.files ?? before?.files ?? [] };
}

/** The lesser of two free-memory figures per GPU, a known one over an unknown one. */
function leastFree(before: ReadonlyMap<string, number | null>, now: ReadonlyMap<string, number | null>): Map<string, number | null> {
  const least = new Map(before);
  for (const [uuid, free] of now) {
    const then = least.get(uuid) ?? null;
    least.set(uuid, then === null ? free : free === null ? then : Math.min(then, free));
  }
  return least;
}

export function createLoadHistory() {
  const last = new Map<number | string, LastLoad>();

  /** Whether the process that started the runner is gone, replaced, or exited (a zombie its parent has not reaped yet). */
  const serverGone = (load: LastLoad, stats: ReadonlyMap<number, StatAnswer>): boolean => {
    const stat = stats.get(load.server.pid);
    return stat === null || (isReadable(stat) && (stat.startTime !== load.server.startTime || hasExited(stat)));
  };

  return {
    /** The servers of the loads kept: the snapshot reads their stats (a cgroup's old server is no member of it any more). */
    servers: (): number[] => [...new Set([...last.values()].map((load) => load.server.pid))],

    /** Records this refresh's runners (`listedAt`: when its GPU listing began) and returns the last load of each of `hosts`. */
    update(
      hosts: ReadonlySet<number | string>,
      runners: ReadonlyMap<number | string, readonly ModelRunner[]>,
      gpus: readonly ListedGpu[],
      { stats, modelFiles }: { stats: ReadonlyMap<number, StatAnswer>; modelFiles: ReadonlyMap<number, ProcessModelFiles> },
      listedAt: number,
    ) {
      for (const [host, now] of runners) {
        const latest = [...now].sort((a, b) => startOf(b) - startOf(a))[0];
        const stat = latest === undefined ? undefined : stats.get(latest.pid);
        const parent = isReadable(stat) ? stats.get(stat.ppid) : undefined;
        if (latest === undefined || !isReadable(parent)) continue;
        const before = last.get(host);
        const same = before?.runner.pid === latest.pid && before.runner.startedAt === latest.startedAt;
        if (before !== undefined && !same && startOf(latest) < startOf(before.runner)) continue;
        last.set(host, {
          runner: latest,
          seenAt: listedAt,
          onGpu: onGpuNow(latest.pid, gpus, modelFiles.get(latest.pid), same ? before.onGpu : null),
          freeMiB: same ? leastFree(before.freeMiB, freeWithout(latest.pid, gpus)) : freeWithout(latest.pid, gpus),
          server: { pid: parent.pid, startTime: parent.startTime },
        });
      }
      for (const [host, load] of last) if (!hosts.has(host) || serverGone(load, stats)) last.delete(host);
      return new Map(last) as ReadonlyMap<number | string, LastLoad>;
    },
  };
}
