// Reads /proc under one root (the host's, or a fixture tree), never shelling out. A gone PID reads
// as null; other failures throw. readStats never throws for one PID: an unreadable stat is an
// UnreadableStat (not null: it says nothing about an exit), logged once per call. It also words
// read failures for the operator (what each errno means in a container, and what to do).
import { closeSync, openSync, readSync, statfsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { cgroupMatcher, parseBootId, parseCgroup, parseOpenFilesLimit, parseProcStat, parseTgid, parseUptimeTicks, ProcParseError, type ProcStat } from './procfs-parse.js';

export { cgroupMatcher, hasExited, parseBootId, parseCgroup, parseOpenFilesLimit, parseProcStat, parseUptimeTicks } from './procfs-parse.js';
export { ProcParseError, type ProcStat } from './procfs-parse.js';

/** readStats' answer for a PID whose stat could not be read or parsed this time (not a sign that it exited): what failed, what to do. */
export type UnreadableStat = { pid: number; unreadable: string; advice: string };

const DENIED_CODES = new Set(['EACCES', 'EPERM']);

const DEPLOYMENT_ADVICE =
  "Point the proc root setting at the host's /proc (for example mounted read-only at /host/proc) " +
  'and run the pod with hostPID: true, so the host PIDs that the GPU driver reports can be looked up.';

const OUT_OF_DESCRIPTORS_ADVICE: Readonly<Record<string, string>> = {
  EMFILE:
    "Raise the container's open-file limit (nofile, for example 65536), or look for what else holds descriptors (ls /proc/<nodecompute pid>/fd | wc -l).",
  ENFILE: "The whole host is out of file descriptors: check what holds them (the largest counts in /proc/*/fd) and the host's fs.file-max.",
};

/** What kept readStats from a PID's stat, from the error statOf threw (the errno is its cause). */
function unreadableStat(pid: number, err: unknown, root: string): UnreadableStat {
  if (err instanceof ProcParseError) {
    return {
      pid,
      unreadable: 'its stat does not parse',
      advice: "nodecompute's log quotes the line (warning \"could not read or parse the /proc stat\"): report it with the kernel version (uname -r).",
    };
  }
  const code = codeOf((err as Error).cause);
  if (code === 'EMFILE') return { pid, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: OUT_OF_DESCRIPTORS_ADVICE.EMFILE! };
  if (code === 'ENFILE') return { pid, unreadable: 'the host is out of file descriptors (ENFILE)', advice: OUT_OF_DESCRIPTORS_ADVICE.ENFILE! };
  if (DENIED_CODES.has(code)) return { pid, unreadable: `permission denied (${code}) under ${root}`, advice: DEPLOYMENT_ADVICE };
  return {
    pid,
    unreadable: `reading it failed (${code || (err as Error).message})`,
    advice: "nodecompute's log has the error (warning \"could not read or parse the /proc stat\"); if it repeats, check the kernel log (dmesg) and run `nodecompute doctor`.",
  };
}

function describeReadFailure(path: string, root: string, err: unknown): string {
  const code = codeOf(err);
  if (!DENIED_CODES.has(code)) return `cannot read ${path}: ${(err as Error).message}`;
  return `cannot read ${path}: permission denied (${code}). The proc root ${root} is not readable by this process. ${DEPLOYMENT_ADVICE}`;
}

export function codeOf(err: unknown): string {
  return String((err as NodeJS.ErrnoException).code ?? '');
}

/** One PID's answer from readStats: its stat, null when it is gone, or what kept it from being read. */
export type StatAnswer = ProcStat | UnreadableStat | null;

export function isReadable(answer: StatAnswer | undefined): answer is ProcStat {
  return answer != null && !('unreadable' in answer);
}

/** keepMax: most stat descriptors kept open between snapshots; limitsFile: whose open-file limit caps keepMax at half (for tests). */
export type ProcReaderOptions = { root: string; log: Logger; keepMax?: number; limitsFile?: string };

export type ProcReader = ReturnType<typeof createProcReader>;

const UNSIGNED = /^\d+$/;
const NEWLINE = 0x0a;
const GONE_CODES = new Set(['ENOENT', 'ESRCH']);

/** Whether a read of a process's file failed because the process is gone (ENOENT, or ESRCH while it is reaped). */
export function isGone(err: unknown): boolean {
  return GONE_CODES.has(codeOf(err));
}
// PIDs read synchronously between two yields to the event loop: about 2 ms of blocking.
const SCAN_BATCH = 64;
// More GPU processes than a node runs; capped at half the open-file limit, halved on EMFILE.
const KEPT_MAX = 2048;

type Warn = (fields: object, msg: string) => void;
/** Reads one process file whole, afresh or through a kept descriptor: a view of the shared buffer, valid until the next read. */
type PidFileRead = (path: string, pid: number) => Buffer;

export function createProcReader({ root, log, keepMax = KEPT_MAX, limitsFile = '/proc/self/limits' }: ProcReaderOptions) {
  const warn: Warn = (fields, msg) => log.warn(fields, msg);
  const quiet: Warn = () => {};

  // Concatenation, not path.join: this runs for every process of every snapshot.
  const base = root.endsWith('/') ? root : `${root}/`;
  const readPidFile = (pid: number, file: string, report: Warn, read: PidFileRead = readWhole): Buffer | null => {
    const path = `${base}${pid}/${file}`;
    try {
      return read(path, pid);
    } catch (err) {
      if (isGone(err)) return null;
      report({ procPid: pid, path, err }, 'cannot read a process file under the proc root');
      throw new Error(describeReadFailure(path, root, err), { cause: err });
    }
  };

  // A kept stat descriptor is re-read from offset 0 (one syscall, not three) until its process is
  // reaped (ESRCH). Only on a real proc filesystem: a plain file outlives its deletion.
  const kept = new Map<number, number>();
  const keeps = isProcFilesystem(root);
  const openFilesLimit = readOpenFilesLimit(limitsFile);
  let keepLimit = openFilesLimit === null ? keepMax : Math.min(keepMax, Math.floor(openFilesLimit / 2));
  // Set by release(): a snapshot still reading when the service stops keeps nothing more open.
  let stopped = false;

  const readKept: PidFileRead = (path, pid) => {
    const fd = kept.get(pid);
    if (fd !== undefined) {
      try {
        return readFd(fd, true);
      } catch {
        kept.delete(pid);
        closeSync(fd);
      }
    }
    try {
      if (stopped || kept.size >= keepLimit) return readWhole(path);
      const fresh = openSync(path, 'r');
      kept.set(pid, fresh);
      return readFd(fresh, true);
    } catch (err) {
      // Out of descriptors: give half the kept ones back for good, so no process reads as absent.
      const code = codeOf(err);
      if (!Object.hasOwn(OUT_OF_DESCRIPTORS_ADVICE, code) || kept.size === 0) throw err;
      keepLimit = Math.floor(kept.size / 2);
      closeKept(() => kept.size > keepLimit);
      log.warn(
        { err, keepLimit },
        `Out of file descriptors (${code}) while keeping /proc stat files open: at most ${keepLimit} are kept from now on. ${OUT_OF_DESCRIPTORS_ADVICE[code]}`,
      );
      return readWhole(path);
    }
  };

  const closeKept = (drop: (pid: number) => boolean): void => {
    for (const [pid, fd] of kept) {
      if (!drop(pid)) continue;
      kept.delete(pid);
      closeSync(fd);
    }
  };

  const statOf = (pid: number, report: Warn, read: PidFileRead = readWhole): ProcStat | null => {
    const bytes = readPidFile(pid, 'stat', report, read);
    if (bytes === null) return null;
    try {
      return parseProcStat(bytes);
    } catch (err) {
      report({ procPid: pid, err }, 'unparsable /proc stat of an existing process');
      throw new ProcParseError(`${base}${pid}/stat: ${(err as Error).message}`, { cause: err });
    }
  };

  const cgroupOf = (pid: number, report: Warn = warn): string[] | null => {
    const bytes = readPidFile(pid, 'cgroup', report);
    return bytes === null ? null : parseCgroup(bytes.toString('utf8'));
  };

  const readStat = async (pid: number): Promise<ProcStat | null> => statOf(pid, warn);

  const readCgroup = async (pid: number): Promise<string[] | null> => cgroupOf(pid);

  /** The process a PID's task belongs to (a thread's id is a PID in /proc too, unlisted); null when gone or not said. */
  const readTgid = async (pid: number): Promise<number | null> => {
    const bytes = readPidFile(pid, 'status', warn);
    return bytes === null ? null : parseTgid(bytes.toString('utf8'));
  };

  /** keep: the snapshot's read, which keeps each stat open for the next one and closes those of PIDs not asked. */
  const readStats = async (pids: number[], { keep = false }: { keep?: boolean } = {}): Promise<Map<number, StatAnswer>> => {
    const stats = new Map<number, StatAnswer>();
    let failed = 0;
    let first: { err: unknown; answer: UnreadableStat } | undefined;
    const keeping = keep && keeps;
    const read: PidFileRead = keeping ? readKept : readWhole;
    await forEachInBatches(pids, SCAN_BATCH, (pid) => {
      try {
        stats.set(pid, statOf(pid, quiet, read));
      } catch (err) {
        failed += 1;
        const answer = unreadableStat(pid, err, root);
        first ??= { err, answer };
        stats.set(pid, answer);
      }
    });
    if (keeping) {
      const asked = new Set(pids);
      closeKept((pid) => !asked.has(pid));
    }
    if (first !== undefined) {
      log.warn(
        { failed, procPid: first.answer.pid, err: first.err },
        `could not read or parse the /proc stat of ${failed} existing process(es) (first error attached), which does not mean that they exited; ` +
          `the next refresh retries. ${first.answer.advice}`,
      );
    }
    return stats;
  };

  /** One stat as readStats answers it, synchronously and unlogged, through a kept descriptor where there is one (a probe's hot path). */
  const statNow = (pid: number): StatAnswer => {
    try {
      return statOf(pid, quiet, keeps ? readKept : readWhole);
    } catch (err) {
      return unreadableStat(pid, err, root);
    }
  };

  const listPids = async (): Promise<number[]> => {
    try {
      return pidsOf(await readdir(root));
    } catch (err) {
      log.warn({ root, err }, 'cannot list the proc root');
      throw new Error(describeReadFailure(root, root, err), { cause: err });
    }
  };

  // One pass answers every needle. Unlike readStats, an unreadable cgroup file fails the scan (the
  // process passed over could be the one sought); callers say what that means, so it logs nothing.
  const findPidsInCgroups = async (needles: string[]): Promise<Map<string, number[]>> => {
    if (needles.some((needle) => needle === '')) {
      throw new Error('findPidsInCgroup needs a container id or pod UID: an empty one matches every process');
    }
    const matchers = needles.map((needle) => [needle, cgroupMatcher(needle)] as const);
    const found = new Map<string, number[]>(needles.map((needle) => [needle, []]));
    if (needles.length === 0) return found;
    await forEachInBatches(await listPids(), SCAN_BATCH, (pid) => {
      const mine = cgroupOf(pid, quiet);
      if (!mine) return;
      for (const [needle, holds] of matchers) if (holds(mine)) found.get(needle)!.push(pid);
    });
    return found;
  };

  const findPidsInCgroup = async (needle: string): Promise<number[]> => (await findPidsInCgroups([needle])).get(needle)!;

  // Readable when its self/stat parses, or when it lists processes at all.
  const checkReadable = async (): Promise<{ ok: true } | { ok: false; reason: string }> => {
    const self = join(root, 'self', 'stat');
    let selfProblem: string;
    try {
      parseProcStat(readWhole(self));
      return { ok: true };
    } catch (err) {
      selfProblem = `cannot read ${self} (${codeOf(err) || (err as Error).message})`;
    }
    let listProblem: string;
    try {
      if (pidsOf(await readdir(root)).length > 0) return { ok: true };
      listProblem = `${root} lists no processes, so it is not a proc filesystem`;
    } catch (err) {
      listProblem = `cannot list ${root} (${codeOf(err)})`;
    }
    return { ok: false, reason: `${selfProblem}, and ${listProblem}. ${DEPLOYMENT_ADVICE}` };
  };

  /** Closes the descriptors readStats keeps, and keeps none after (the service stops). */
  const release = (): void => {
    stopped = true;
    closeKept(() => true);
  };

  /** How many stat files readStats may keep open (null: not a proc filesystem, none), and the open-file limit that caps it. */
  const keeping = () => ({ keepLimit: keeps ? keepLimit : null, openFilesLimit });

  /** A file under the root, parsed; null when there is none or it cannot be read or parsed (`warn` is told why). */
  const readRootFile = <T>(file: string, like: string, field: string, parse: (text: string) => T | null, warn: Warn) => {
    const path = `${base}${file}`;
    let text: string;
    try {
      text = readWhole(path).toString('utf8');
    } catch (err) {
      if (codeOf(err) !== 'ENOENT') warn({ path, err }, `Cannot read ${path} (${(err as Error).message})`);
      return null;
    }
    const value = parse(text);
    if (value === null) warn({ path, [field]: text.slice(0, 80) }, `${path} does not read ${like}`);
    return value;
  };

  let uptimeWarned = false;
  /** The kernel's clock now in ProcStat.startTime's unit, from the root's uptime file; null without one or when unreadable (logged once). */
  const ticksNow = (): number | null =>
    readRootFile('uptime', 'as /proc/uptime does', 'uptime', parseUptimeTicks, (fields, what) => {
      // Said once: it would repeat on every engine-output post.
      if (!uptimeWarned) log.warn(fields, `${what}, so ${UNDATED}`);
      uptimeWarned = true;
    });

  let boot: { id: string | null } | null = null;
  /** The root's boot id (PIDs and start times name processes of one boot only), read once; null without one (logged when malformed). */
  const bootId = (): string | null => {
    const warn: Warn = (fields, what) => log.warn(fields, `${what}, so ${BOOT_UNKNOWN}`);
    return (boot ??= { id: readRootFile('sys/kernel/random/boot_id', 'as a boot id', 'bootId', parseBootId, warn) }).id;
  };

  return { root, readStat, readCgroup, readTgid, readStats, statNow, listPids, findPidsInCgroup, findPidsInCgroups, checkReadable, release, keeping, ticksNow, bootId };
}

const CHECK_PROC = "Check that NODECOMPUTE_PROC points at the host's /proc.";
const UNDATED = `engine output cannot be dated: a pod's earlier run is not told apart from its current one. ${CHECK_PROC}`;
const BOOT_UNKNOWN = `a shard registered before the node last restarted is told apart from today's processes by PID and start time alone. ${CHECK_PROC}`;

// One buffer for every read (they are synchronous, so never overlap); it grows for a larger file.
let shared = Buffer.allocUnsafe(4096);

// Reads from offset 0 until a read returns 0 (/proc files report size 0); a one-line file (stat)
// ends at its newline, since the kernel writes that record whole: one syscall saved per process.
function readFd(fd: number, oneLine: boolean): Buffer {
  let length = 0;
  for (;;) {
    if (length === shared.length) {
      const bigger = Buffer.allocUnsafe(shared.length * 2);
      shared.copy(bigger, 0, 0, length);
      shared = bigger;
    }
    const n = readSync(fd, shared, length, shared.length - length, length);
    if (n === 0) return shared.subarray(0, length);
    length += n;
    if (oneLine && shared[length - 1] === NEWLINE) return shared.subarray(0, length);
  }
}

function readWhole(path: string): Buffer {
  const fd = openSync(path, 'r');
  try {
    return readFd(fd, path.endsWith('/stat'));
  } finally {
    closeSync(fd);
  }
}

const PROC_SUPER_MAGIC = 0x9fa0;

function readOpenFilesLimit(path: string): number | null {
  try {
    return parseOpenFilesLimit(readWhole(path).toString('utf8'));
  } catch {
    return null;
  }
}

function isProcFilesystem(root: string): boolean {
  try {
    return statfsSync(root).type === PROC_SUPER_MAGIC;
  } catch {
    return false;
  }
}

async function forEachInBatches<T>(items: T[], size: number, fn: (item: T) => void): Promise<void> {
  for (let i = 0; i < items.length; i += size) {
    if (i > 0) await new Promise<void>((resolve) => setImmediate(resolve));
    for (const item of items.slice(i, i + size)) fn(item);
  }
}

function pidsOf(names: string[]): number[] {
  return names.filter((name) => UNSIGNED.test(name)).map(Number).sort((a, b) => a - b);
}
