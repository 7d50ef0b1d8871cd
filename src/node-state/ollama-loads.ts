// Owns what each Ollama server's latest model load leaves once its runner exits: the runner, the last
// listing that saw it, whether any listing saw it hold GPU memory, and its GPUs' free memory then. An
// idle server whose last load ran on the CPU would otherwise read ready at each unload and take
// traffic onto the CPU once per keep-alive. A record lives while the process that started the runner
// (its parent, by PID and start time) does, and the server's next runner replaces it.
import type { ModelRunner } from '../system/model-runners.js';
import { isReadable, type StatAnswer } from '../system/procfs.js';

/** What a listing says of a GPU that matters here (a GpuState is one). */
type ListedGpu = { index: number; freeMiB: number | null; processes: ReadonlyArray<{ pid: number }> };

export type LastLoad = {
  runner: ModelRunner;
  /** When the last listing that saw the runner alive began. */
  seenAt: number;
  /** Whether a listing ever saw the runner itself hold GPU memory. */
  heldGpuMemory: boolean;
  /** Free memory per GPU index in that listing; null where the driver did not say. */
  freeMiB: ReadonlyMap<number, number | null>;
  server: { pid: number; startTime: number };
};

export function createLoadHistory() {
  const last = new Map<number | string, LastLoad>();

  /** Whether the process that started the runner is gone or replaced, as far as this refresh read it. */
  const serverGone = (load: LastLoad, stats: ReadonlyMap<number, StatAnswer>): boolean => {
    const stat = stats.get(load.server.pid);
    return stat === null || (isReadable(stat) && stat.startTime !== load.server.startTime);
  };

  return {
    /** Records this refresh's runners (`listedAt`: when its GPU listing began) and returns the last load of each of `hosts`. */
    update(hosts: ReadonlySet<number | string>, runners: ReadonlyMap<number | string, readonly ModelRunner[]>, gpus: readonly ListedGpu[], stats: ReadonlyMap<number, StatAnswer>, listedAt: number) {
      const onGpu = new Set(gpus.flatMap((gpu) => gpu.processes.map((process) => process.pid)));
      const freeMiB = new Map(gpus.map((gpu) => [gpu.index, gpu.freeMiB]));
      for (const [host, now] of runners) {
        const latest = [...now].sort((a, b) => (b.startedAt ?? 0) - (a.startedAt ?? 0))[0];
        const stat = latest === undefined ? undefined : stats.get(latest.pid);
        const parent = isReadable(stat) ? stats.get(stat.ppid) : undefined;
        if (latest === undefined || !isReadable(parent)) continue;
        const before = last.get(host);
        const same = before?.runner.pid === latest.pid && before.runner.startedAt === latest.startedAt;
        const heldGpuMemory = onGpu.has(latest.pid) || (same && before.heldGpuMemory);
        last.set(host, { runner: latest, seenAt: listedAt, heldGpuMemory, freeMiB, server: { pid: parent.pid, startTime: parent.startTime } });
      }
      for (const [host, load] of last) if (!hosts.has(host) || serverGone(load, stats)) last.delete(host);
      return new Map(last) as ReadonlyMap<number | string, LastLoad>;
    },
  };
}
