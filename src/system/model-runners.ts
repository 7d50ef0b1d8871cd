// Owns finding the model runners of an Ollama server in /proc: the processes below it whose command
// line names a model with --model, and the GPU layers it asks for. Ollama starts one per loaded model as its child
// (`ollama_llama_server --model` until 2024, `ollama runner --model` since, `llama-server --model` in 2026) and it
// exits when the model unloads. Children come from /proc/PID/task/*/children (Go forks from any thread); a kernel
// without CONFIG_PROC_CHILDREN has no such file, and the runners are then unknown, never "none".
import { readdirSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { settleWithin } from '../deadline.js';
import { environmentOf, gpuLayersOf, parseCmdline } from './model-files.js';
import { CLOCK_TICKS_PER_SECOND } from './procfs-parse.js';
import { hasExited, isGone, isReadable, type ProcReader, type StatAnswer } from './procfs.js';

/**
 * startedAt: when it started (ms since the epoch, on the snapshot's clock); null when /proc's uptime cannot be read.
 * gpuLayers: the GPU layers its argv asks for (`--n-gpu-layers 0` and `-ngl 0`: num_gpu 0), absent when unsaid.
 */
export type ModelRunner = { pid: number; model: string; startedAt: number | null; gpuLayers?: string };

/** What a runner's argv says: the model, and the GPU layers asked (null: unsaid). */
type RunnerArgs = { model: string; gpuLayers: string | null };

/** A server's process (a PID shard) or the cgroup whose processes are read (a cgroup shard). */
export type RunnerHost = { pid: number } | { cgroup: string };

/** How answers name a host: its PID, or its cgroup. */
export const hostKey = (host: RunnerHost): number | string => ('cgroup' in host ? host.cgroup : host.pid);

/** Generations below a registered process searched for runners: the server's children, behind up to two wrappers (tini, a script). */
const RUNNER_DEPTH = 3;

/**
 * The children of every thread of `pid`; null when it is gone or the kernel keeps no children files. Read synchronously, as
 * stats are: a children file is walked from the kernel's task list, never behind a lock a stuck process holds.
 */
function childrenOf(base: string, pid: number): number[] | null {
  try {
    // The main thread's file first: when it is missing, so are the others'.
    const found = parseChildren(readFileSync(`${base}${pid}/task/${pid}/children`, 'latin1'));
    for (const task of readdirSync(`${base}${pid}/task`)) {
      if (task === String(pid)) continue;
      try {
        found.push(...parseChildren(readFileSync(`${base}${pid}/task/${task}/children`, 'latin1')));
      } catch (err) {
        // A thread that exits between the listing and the read has no children left.
        if (!isGone(err)) throw err;
      }
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

/** The model a runner's argv names: `--model PATH` or `--model=PATH`, as Ollama starts every runner (not `-m`: `python3 -m` is no runner). */
export function runnerModel(argv: readonly string[]): string | null {
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i]!;
    if (arg === '--model' && (argv[i + 1] ?? '') !== '') return argv[i + 1]!;
    if (arg.startsWith('--model=') && arg.length > '--model='.length) return arg.slice('--model='.length);
  }
  return null;
}

/** A runner's model and the GPU layers it was asked for, as for any process (model-files.ts); null when it names no model. */
async function runnerArgs(argv: readonly string[], environment: () => Promise<readonly string[]>): Promise<RunnerArgs | null> {
  const model = runnerModel(argv);
  return model === null ? null : { model, gpuLayers: await gpuLayersOf(argv, environment) };
}

/** A command line answers in microseconds; one whose process is stuck in the kernel, holding its memory map, never does. */
const READ_DEADLINE_MS = 1000;
/** Late reads at most: each holds a thread of libuv's pool, which NVML's calls and the state file need too. */
const LATE_MAX = 2;
/**
 * Younger than this (clock ticks), a process's "no model" is read again next refresh: Go forks with CLONE_VFORK, and until
 * the child's exec its command line is its parent's.
 */
const SETTLED_TICKS = CLOCK_TICKS_PER_SECOND;

type Process = { startTime: number; args: RunnerArgs | null; startedAt: number | null };

export function createModelRunnerReader(proc: ProcReader, { deadlineMs = READ_DEADLINE_MS } = {}) {
  // A doubled slash, where the root ends in one, names the same file.
  const base = `${proc.root}/`;
  // What a process's command line names, read once (by PID and start time; dropped when it is no longer seen), and its start dated once.
  const known = new Map<number, Process>();
  // Reads past their deadline, by PID: not started again until they answer; then their answer waits for the next refresh.
  const late = new Map<number, Promise<unknown>>();
  const answeredLate = new Map<number, { startTime: number; args: RunnerArgs | null | undefined }>();

  /** What its argv says of a model; null for none (or a process gone); undefined when unknown: unreadable, or no answer within the deadline. */
  const argsOf = async (pid: number, startTime: number): Promise<RunnerArgs | null | undefined> => {
    const answered = answeredLate.get(pid);
    answeredLate.delete(pid);
    if (answered?.startTime === startTime) return answered.args;
    if (late.has(pid) || late.size >= LATE_MAX) return undefined;
    const reading = readFile(`${base}${pid}/cmdline`).then(
      (bytes) => runnerArgs(parseCmdline(bytes), () => environmentOf(base, pid)),
      (err: unknown) => (isGone(err) ? null : undefined),
    );
    const args = await settleWithin(reading, deadlineMs, () => 'late' as const);
    if (args !== 'late') return args;
    const kept = reading.then((answer) => void answeredLate.set(pid, { startTime, args: answer }));
    late.set(pid, kept.finally(() => late.delete(pid)));
    return undefined;
  };

  /** One refresh's search: `ticks` is the kernel's clock now (null: unknown), `takenAt` the snapshot's. */
  type Search = { stats: Map<number, StatAnswer>; seen: Set<number>; ticks: number | null; takenAt: number };

  /** The process `pid` is now (cached); undefined when what it runs cannot be known this refresh. */
  const processOf = async (pid: number, startTime: number, search: Search): Promise<Process | undefined> => {
    const cached = known.get(pid);
    if (cached?.startTime === startTime) return cached;
    const args = await argsOf(pid, startTime);
    if (args === undefined) return undefined;
    const found = { startTime, args, startedAt: null };
    const settled = search.ticks !== null && search.ticks - startTime >= SETTLED_TICKS;
    if (args !== null || settled) known.set(pid, found);
    return found;
  };

  /**
   * Runners among `pids` (their stats read into the search's), and below those that run no model while `depth` lasts
   * (0: none, as in a cgroup, whose members are all listed); null when what one of them runs cannot be known.
   */
  const runnersAmong = async (pids: number[], depth: number, search: Search): Promise<ModelRunner[] | null> => {
    const { stats, ticks, takenAt } = search;
    const unread = pids.filter((pid) => !stats.has(pid));
    if (unread.length > 0) for (const [pid, stat] of await proc.readStats(unread)) stats.set(pid, stat);
    const runners: ModelRunner[] = [];
    for (const pid of pids) {
      const stat = stats.get(pid);
      if (stat === null || (isReadable(stat) && hasExited(stat))) continue;
      if (!isReadable(stat)) return null;
      search.seen.add(pid);
      const process = await processOf(pid, stat.startTime, search);
      if (process === undefined) return null;
      if (process.args !== null) {
        process.startedAt ??= ticks === null ? null : takenAt - ((ticks - stat.startTime) * 1000) / CLOCK_TICKS_PER_SECOND;
        const { model, gpuLayers } = process.args;
        runners.push({ pid, model, startedAt: process.startedAt, ...(gpuLayers === null ? {} : { gpuLayers }) });
        continue;
      }
      if (depth === 0) continue;
      const children = childrenOf(base, pid) ?? [];
      // Past the depth searched, a process that runs no model but has children may hide a runner.
      const below = depth === 1 ? (children.length === 0 ? [] : null) : await runnersAmong(children, depth - 1, search);
      if (below === null) return null;
      runners.push(...below);
    }
    return runners;
  };

  return {
    /**
     * Per host (a server's PID, or a cgroup), its runners now; a host is left out when its runners cannot be known
     * (its process is gone or its children unreadable, its cgroup was not scanned, a process below it could not be
     * read, or runs no model but has children deeper than the search goes). Stats read go into `stats`.
     */
    async read(hosts: readonly RunnerHost[], stats: Map<number, StatAnswer>, cgroupPids: ReadonlyMap<string, ReadonlySet<number>>, takenAt: number) {
      const search: Search = { stats, seen: new Set(), ticks: hosts.length === 0 ? null : proc.ticksNow(), takenAt };
      const found = new Map<number | string, ModelRunner[]>();
      for (const host of hosts) {
        let runners: ModelRunner[] | null = null;
        if ('cgroup' in host) {
          const members = cgroupPids.get(host.cgroup);
          if (members !== undefined) runners = await runnersAmong([...members], 0, search);
        } else if (isReadable(stats.get(host.pid))) {
          const children = childrenOf(base, host.pid);
          if (children !== null) runners = await runnersAmong(children, RUNNER_DEPTH, search);
        }
        if (runners !== null) found.set(hostKey(host), runners);
      }
      for (const cache of [known, answeredLate]) for (const pid of cache.keys()) if (!search.seen.has(pid)) cache.delete(pid);
      return found;
    },
  };
}
