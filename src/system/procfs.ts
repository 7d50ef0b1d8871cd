// Reads /proc under one root (the host's /proc mounted elsewhere in a container; fixture trees in
// tests), never shelling out. A PID that is gone reads as null; EACCES/EPERM, a stat that does not
// parse and other I/O errors throw, logged at warn. readStats, behind every snapshot, never throws
// for one PID: an unreadable stat is an UnreadableStat (not null: it says nothing about an exit),
// logged once per call. Reads are synchronous into one shared buffer, in batches that yield.
import { closeSync, openSync, readSync, statfsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { codeOf, DEPLOYMENT_ADVICE, describeReadFailure, OUT_OF_DESCRIPTORS_ADVICE, unreadableStat, type UnreadableStat } from './procfs-failures.js';
import { cgroupMatcher, parseBootId, parseCgroup, parseOpenFilesLimit, parseProcStat, parseUptimeTicks, ProcParseError, type ProcStat } from './procfs-parse.js';

export type { UnreadableStat } from './procfs-failures.js';
export {
  CLOCK_TICKS_PER_SECOND,
  cgroupMatcher,
  hasExited,
  parseBootId,
  parseCgroup,
  parseOpenFilesLimit,
  parseProcStat,
  parseUptimeTicks,
  ProcParseError,
  type ProcStat,
} from './procfs-parse.js';

/** One PID's answer from readStats: its stat, null when it is gone, or what kept it from being read. */
export type StatAnswer = ProcStat | UnreadableStat | null;

export function isReadable(answer: StatAnswer | undefined): answer is ProcStat {
  return answer != null && !('unreadable' in answer);
}

export interface ProcReaderOptions {
  root: string;
  log: Logger;
  /** Most /proc/PID/stat descriptors readStats keeps open between snapshots (default KEPT_MAX). */
  keepMax?: number;
  /** This process's limits file, whose open-file limit caps keepMax at half (tests point it elsewhere). */
  limitsFile?: string;
}

export interface ReadStatsOptions {
  /** The snapshot's read: keep each stat open for the next one, and close those of PIDs not asked. */
  keep?: boolean;
}

export interface ProcReader {
  readonly root: string;
  readStat(pid: number): Promise<ProcStat | null>;
  readCgroup(pid: number): Promise<string[] | null>;
  listPids(): Promise<number[]>;
  findPidsInCgroup(needle: string): Promise<number[]>;
  findPidsInCgroups(needles: string[]): Promise<Map<string, number[]>>;
  /** The stat of each pid, keyed by pid; null when gone, an UnreadableStat when unreadable or malformed (logged once per call). */
  readStats(pids: number[], options?: ReadStatsOptions): Promise<Map<number, StatAnswer>>;
  /** One stat as readStats answers it, synchronously and unlogged, through a kept descriptor where there is one (a probe's hot path). */
  statNow(pid: number): StatAnswer;
  /** Closes the descriptors readStats keeps open between snapshots, and keeps none after (the service stops). */
  release(): void;
  /** How many stat files readStats may keep open (null: not a proc filesystem, none), and the open-file limit that caps it. */
  keeping(): { keepLimit: number | null; openFilesLimit: number | null };
  checkReadable(): Promise<{ ok: true } | { ok: false; reason: string }>;
  /** The kernel's clock now in ProcStat.startTime's unit, from the root's uptime file; null without one or when unreadable (logged once). */
  ticksNow(): number | null;
  /** The root's boot id (PIDs and start times name processes of one boot only), read once; null without one (logged when malformed). */
  bootId(): string | null;
}

const UNSIGNED = /^\d+$/;
const NEWLINE = 0x0a;
const GONE_CODES = new Set(['ENOENT', 'ESRCH']);
// The process (EMFILE) or the system (ENFILE) is out of file descriptors.
const OUT_OF_DESCRIPTORS = new Set(['EMFILE', 'ENFILE']);
// PIDs read synchronously between two yields to the event loop: about 2 ms of blocking.
const SCAN_BATCH = 64;
// Stat descriptors kept open between snapshots: more GPU processes than a node runs. Capped at half
// this process's open-file limit; running out of descriptors halves it (see readKept).
const KEPT_MAX = 2048;
const OWN_LIMITS_FILE = '/proc/self/limits';
// Most /proc/PID files fit; a larger one (a cgroup file in nested containers) grows the buffer.
const INITIAL_BUFFER_BYTES = 4096;

type Warn = (fields: object, msg: string) => void;
/** Reads one process file whole, afresh or through a kept descriptor: a view of the shared buffer, valid until the next read. */
type PidFileRead = (path: string, pid: number) => Buffer;

export function createProcReader({ root, log, keepMax = KEPT_MAX, limitsFile = OWN_LIMITS_FILE }: ProcReaderOptions): ProcReader {
  const warn: Warn = (fields, msg) => log.warn(fields, msg);
  // readStats reports its failures itself, once per call.
  const quiet: Warn = () => {};

  // Concatenation, not path.join: this runs for every process of every snapshot.
  const base = root.endsWith('/') ? root : `${root}/`;
  const readPidFile = (pid: number, file: string, report: Warn, read: PidFileRead = readWhole): Buffer | null => {
    const path = `${base}${pid}/${file}`;
    try {
      return read(path, pid);
    } catch (err) {
      if (GONE_CODES.has(codeOf(err))) return null;
      report({ procPid: pid, path, err }, 'cannot read a process file under the proc root');
      throw new Error(describeReadFailure(path, root, err), { cause: err });
    }
  };

  // readStats({ keep }) re-reads each kept stat descriptor from offset 0: one syscall instead of
  // three. A kept descriptor belongs to its process, not its PID: once reaped it fails (ESRCH) and
  // the PID is opened afresh. Only on a real proc filesystem (a plain file outlives its deletion).
  // Out of descriptors while some are kept: give half back for good and read afresh, so no process
  // reads as absent; with none kept the read fails as any other would.
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
        // Reaped (or unreadable): forget it; a fresh open says which.
        kept.delete(pid);
        closeSync(fd);
      }
    }
    try {
      if (stopped || kept.size >= keepLimit) return readWhole(path);
      const fresh = openSync(path, 'r');
      // Kept before the read: if the process exits in between, the next snapshot forgets it.
      kept.set(pid, fresh);
      return readFd(fresh, true);
    } catch (err) {
      if (!OUT_OF_DESCRIPTORS.has(codeOf(err)) || kept.size === 0) throw err;
      keepFewer(err);
      return readWhole(path);
    }
  };

  const keepFewer = (err: unknown): void => {
    keepLimit = Math.floor(kept.size / 2);
    for (const [pid, fd] of kept) {
      if (kept.size <= keepLimit) break;
      kept.delete(pid);
      closeSync(fd);
    }
    const code = codeOf(err);
    log.warn(
      { err, keepLimit },
      `Out of file descriptors (${code}) while keeping /proc stat files open between snapshots: from now on at most ${keepLimit} are kept ` +
        `and the other processes are read afresh, which makes each snapshot slower. ${OUT_OF_DESCRIPTORS_ADVICE[code]}`,
    );
  };

  const closeKeptExcept = (keep: ReadonlySet<number>): void => {
    for (const [pid, fd] of kept) {
      if (keep.has(pid)) continue;
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

  const readStats = async (pids: number[], { keep = false }: ReadStatsOptions = {}): Promise<Map<number, StatAnswer>> => {
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
    if (keeping) closeKeptExcept(new Set(pids));
    if (first !== undefined) {
      log.warn(
        { failed, procPid: first.answer.pid, err: first.err },
        `could not read or parse the /proc stat of ${failed} existing process(es) (the first error is attached): this answer has no facts about them, ` +
          `which does not mean that they exited; the next refresh reads them again. ${first.answer.advice}`,
      );
    }
    return stats;
  };

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

  const checkReadable = async (): Promise<{ ok: true } | { ok: false; reason: string }> => {
    const selfProblem = problemReadingSelf(root);
    if (selfProblem === null) return { ok: true };
    const listProblem = await problemListing(root);
    if (listProblem === null) return { ok: true };
    return { ok: false, reason: `${selfProblem}, and ${listProblem}. ${DEPLOYMENT_ADVICE}` };
  };

  const release = (): void => {
    stopped = true;
    closeKeptExcept(new Set());
  };

  const keeping = () => ({ keepLimit: keeps ? keepLimit : null, openFilesLimit });

  // Said once: it would repeat on every engine-output post.
  let uptimeWarned = false;
  const uptimeProblem = (fields: Record<string, unknown>, what: string): null => {
    if (!uptimeWarned) {
      uptimeWarned = true;
      log.warn(
        fields,
        `${what}, so engine output cannot be dated: output a pod's earlier run posted is not told apart from its current run's. ` +
          "Check that NODECOMPUTE_PROC points at the host's /proc.",
      );
    }
    return null;
  };
  const ticksNow = (): number | null => {
    const path = `${base}uptime`;
    let text: string;
    try {
      text = readWhole(path).toString('utf8');
    } catch (err) {
      return codeOf(err) === 'ENOENT' ? null : uptimeProblem({ path, err }, `Cannot read ${path} (${(err as Error).message})`);
    }
    return parseUptimeTicks(text) ?? uptimeProblem({ path, uptime: text.slice(0, 80) }, `${path} does not read as /proc/uptime does`);
  };

  let boot: { id: string | null } | null = null;
  const readBootId = (): string | null => {
    const path = `${base}sys/kernel/random/boot_id`;
    let text: string;
    try {
      text = readWhole(path).toString('utf8');
    } catch (err) {
      if (codeOf(err) === 'ENOENT') return null;
      log.warn({ path, err }, `Cannot read ${path} (${(err as Error).message}), so ${BOOT_UNKNOWN}`);
      return null;
    }
    const id = parseBootId(text);
    if (id === null) log.warn({ path, bootId: text.slice(0, 80) }, `${path} does not read as a boot id, so ${BOOT_UNKNOWN}`);
    return id;
  };
  const bootId = (): string | null => (boot ??= { id: readBootId() }).id;

  return { root, readStat, readCgroup, readStats, statNow, listPids, findPidsInCgroup, findPidsInCgroups, checkReadable, release, keeping, ticksNow, bootId };
}

const BOOT_UNKNOWN =
  "a shard registered before the node last restarted is told apart from today's processes by PID and start time alone. Check that NODECOMPUTE_PROC points at the host's /proc.";

// One buffer for every read (they are synchronous, so never overlap); it only grows.
let shared = Buffer.allocUnsafe(INITIAL_BUFFER_BYTES);

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

/** The soft open-file limit a limits file gives; null when there is none to respect (or no such file). */
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

function problemReadingSelf(root: string): string | null {
  const path = join(root, 'self', 'stat');
  try {
    parseProcStat(readWhole(path));
    return null;
  } catch (err) {
    return `cannot read ${path} (${codeOf(err) || (err as Error).message})`;
  }
}

async function problemListing(root: string): Promise<string | null> {
  try {
    const pids = pidsOf(await readdir(root));
    return pids.length > 0 ? null : `${root} lists no processes, so it is not a proc filesystem`;
  } catch (err) {
    return `cannot list ${root} (${codeOf(err)})`;
  }
}
