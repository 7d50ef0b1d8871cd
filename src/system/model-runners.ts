// Owns finding the model runners of an Ollama server in /proc: the processes below it whose command
// line names a model. Ollama starts one per loaded model as its child (`ollama_llama_server --model`
// until 2024, `ollama runner --model` since, `llama-server --model` in 2026) and it exits when the
// model unloads. Children come from /proc/PID/task/*/children (Go forks from any thread); a kernel
// without CONFIG_PROC_CHILDREN has no such file, and the runners are then unknown, never "none".
import { readdir, readFile } from 'node:fs/promises';
import { settleWithin } from '../deadline.js';
import { modelArgument, parseCmdline } from './model-files.js';
import { CLOCK_TICKS_PER_SECOND } from './procfs-parse.js';
import { codeOf, isReadable, type ProcReader, type StatAnswer } from './procfs.js';

/** startedAt: when it started (ms since the epoch, on the snapshot's clock); null when /proc's uptime cannot be read. */
export type ModelRunner = { pid: number; model: string; startedAt: number | null };

/** A server's process (a PID shard) or the cgroup whose processes are read (a cgroup shard). */
export type RunnerHost = { pid: number } | { cgroup: string };

/** Generations below a server's process searched for runners: its own children, and theirs behind a wrapper (tini, sh -c). */
const RUNNER_DEPTH = 2;

/** The children of every thread of `pid`; null when it is gone or the kernel keeps no children files. */
async function childrenOf(base: string, pid: number): Promise<number[] | null> {
  try {
    // The main thread's file first: when it is missing, so are the others'.
    const found = parseChildren(await readFile(`${base}${pid}/task/${pid}/children`, 'latin1'));
    for (const task of await readdir(`${base}${pid}/task`)) {
      if (task === String(pid)) continue;
      // A thread that exits between the listing and the read has no children left.
      const text = await readFile(`${base}${pid}/task/${task}/children`, 'latin1').catch((err: unknown) => (codeOf(err) === 'ENOENT' ? '' : Promise.reject(err)));
      found.push(...parseChildren(text));
    }
    return found;
  } catch {
    return null;
  }
}

/** Whether the kernel under `root` keeps children files (CONFIG_PROC_CHILDREN), as PID 1's main thread shows. */
export function childrenKept(root: string): Promise<boolean> {
  return readFile(`${root}/1/task/1/children`).then(() => true, () => false);
}

/** A children file: PIDs separated by spaces. */
export function parseChildren(text: string): number[] {
  return text.split(' ').filter((word) => /^\d+$/.test(word)).map(Number);
}

export type ModelRunnerReader = ReturnType<typeof createModelRunnerReader>;

/** A command line answers in microseconds; one whose process is stuck in the kernel, holding its memory map, never does. */
const READ_DEADLINE_MS = 1000;
/** Late reads at most: each holds a thread of libuv's pool, which NVML's calls and the state file need too. */
const LATE_MAX = 2;

export function createModelRunnerReader(proc: ProcReader, { deadlineMs = READ_DEADLINE_MS } = {}) {
  // A doubled slash, where the root ends in one, names the same file.
  const base = `${proc.root}/`;
  // A process's command line is read, and its start dated, once: by PID and start time, dropped when it is no longer seen.
  const known = new Map<number, { startTime: number; model: string | null; startedAt: number | null }>();
  // Reads past their deadline, by PID: not started again until they answer.
  const late = new Map<number, Promise<unknown>>();

  /** The model its command line names; undefined when the read did not answer within the deadline (its answer is kept once it comes). */
  const modelOf = async (pid: number, startTime: number): Promise<string | null | undefined> => {
    if (late.has(pid) || late.size >= LATE_MAX) return undefined;
    const reading = readFile(`${base}${pid}/cmdline`).then((bytes) => modelArgument(parseCmdline(bytes)), () => null);
    const model = await settleWithin(reading, deadlineMs, () => undefined);
    if (model !== undefined) return model;
    const answered = reading.then((answer) => void known.set(pid, { startTime, model: answer, startedAt: null }));
    late.set(pid, answered.finally(() => late.delete(pid)));
    return undefined;
  };

  type Dating = (startTime: number) => number | null;

  /** Runners among `pids` (their stats read into `stats`), and below those that run no model while `depth` lasts; null when a command line did not answer. */
  const search = async (pids: number[], depth: number, stats: Map<number, StatAnswer>, seen: Set<number>, dated: Dating): Promise<ModelRunner[] | null> => {
    const unread = pids.filter((pid) => !stats.has(pid));
    if (unread.length > 0) for (const [pid, stat] of await proc.readStats(unread)) stats.set(pid, stat);
    const runners: ModelRunner[] = [];
    for (const pid of pids) {
      const stat = stats.get(pid);
      if (!isReadable(stat)) continue;
      seen.add(pid);
      let process = known.get(pid);
      if (process?.startTime !== stat.startTime) {
        const model = await modelOf(pid, stat.startTime);
        if (model === undefined) return null;
        process = { startTime: stat.startTime, model, startedAt: null };
        known.set(pid, process);
      }
      if (process.model !== null) {
        runners.push({ pid, model: process.model, startedAt: (process.startedAt ??= dated(stat.startTime)) });
      } else if (depth > 1) {
        const below = await search((await childrenOf(base, pid)) ?? [], depth - 1, stats, seen, dated);
        if (below === null) return null;
        runners.push(...below);
      }
    }
    return runners;
  };

  return {
    /**
     * Per host (a server's PID, or a cgroup), its runners now; a host is left out when its runners cannot be known
     * (its process is gone or its children unreadable, its cgroup was not scanned, or a command line did not answer).
     * Stats read go into `stats`.
     */
    async read(hosts: readonly RunnerHost[], stats: Map<number, StatAnswer>, cgroupPids: ReadonlyMap<string, ReadonlySet<number>>, takenAt: number) {
      let ticks: number | null | undefined;
      // The kernel's clock is read at most once a refresh, and only for a runner not dated yet.
      const dated: Dating = (startTime) => {
        if (ticks === undefined) ticks = proc.ticksNow();
        return ticks === null ? null : takenAt - ((ticks - startTime) * 1000) / CLOCK_TICKS_PER_SECOND;
      };
      const seen = new Set<number>();
      const found = new Map<number | string, ModelRunner[]>();
      for (const host of hosts) {
        let runners: ModelRunner[] | null = null;
        if ('cgroup' in host) {
          const members = cgroupPids.get(host.cgroup);
          if (members !== undefined) runners = await search([...members], 1, stats, seen, dated);
        } else if (isReadable(stats.get(host.pid))) {
          const children = await childrenOf(base, host.pid);
          if (children !== null) runners = await search(children, RUNNER_DEPTH, stats, seen, dated);
        }
        if (runners !== null) found.set('cgroup' in host ? host.cgroup : host.pid, runners);
      }
      for (const pid of known.keys()) if (!seen.has(pid)) known.delete(pid);
      return found;
    },
  };
}
