// Owns what each Ollama server's latest model load leaves once its runner exits: the runner, the last
// listing that saw it, whether any listing saw it hold GPU memory, and the least free memory its GPUs
// had while it ran (Ollama places a load by the free memory it finds). An idle server whose last load
// ran on the CPU would otherwise read ready at each unload and take traffic onto the CPU once per
// keep-alive. A record lives while the process that started the runner (its parent, by PID and start
// time) does; a runner started later replaces it, an older one never does.
import type { ModelRunner } from '../system/model-runners.js';
import { isReadable, type StatAnswer } from '../system/procfs.js';

/** What a listing says of a GPU that matters here (a GpuState is one). */
type ListedGpu = { uuid: string; freeMiB: number | null; processes: ReadonlyArray<{ pid: number }> };

export type LastLoad = {
  runner: ModelRunner;
  /** When the last listing that saw the runner alive began. */
  seenAt: number;
  /** Whether a listing ever saw the runner itself hold GPU memory. */
  heldGpuMemory: boolean;
  /** Per GPU UUID, the least free memory the listings that saw it alive gave; null where none said. */
  freeMiB: ReadonlyMap<string, number | null>;
  server: { pid: number; startTime: number };
};

const startOf = (runner: ModelRunner): number => runner.startedAt ?? -Infinity;

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

  /** Whether the process that started the runner is gone or replaced. */
  const serverGone = (load: LastLoad, stats: ReadonlyMap<number, StatAnswer>): boolean => {
    const stat = stats.get(load.server.pid);
    return stat === null || (isReadable(stat) && stat.startTime !== load.server.startTime);
  };

  return {
    /** The servers of the loads kept: the snapshot reads their stats (a cgroup's old server is no member of it any more). */
    servers: (): number[] => [...new Set([...last.values()].map((load) => load.server.pid))],

    /** Records this refresh's runners (`listedAt`: when its GPU listing began) and returns the last load of each of `hosts`. */
    update(hosts: ReadonlySet<number | string>, runners: ReadonlyMap<number | string, readonly ModelRunner[]>, gpus: readonly ListedGpu[], stats: ReadonlyMap<number, StatAnswer>, listedAt: number) {
      const onGpu = new Set(gpus.flatMap((gpu) => gpu.processes.map((process) => process.pid)));
      const freeMiB = new Map(gpus.map((gpu) => [gpu.uuid, gpu.freeMiB]));
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
          heldGpuMemory: onGpu.has(latest.pid) || (same && before.heldGpuMemory),
          freeMiB: same ? leastFree(before.freeMiB, freeMiB) : freeMiB,
          server: { pid: parent.pid, startTime: parent.startTime },
        });
      }
      for (const [host, load] of last) if (!hosts.has(host) || serverGone(load, stats)) last.delete(host);
      return new Map(last) as ReadonlyMap<number | string, LastLoad>;
    },
  };
}
