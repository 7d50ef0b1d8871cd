// Owns every read of /proc: the pure parsers of /proc/PID/stat, /proc/PID/cgroup and /proc/uptime
// (the clock that start times count in), and a reader bound to one proc root. The root is a
// parameter because a container sees the host's processes only through the host's /proc mounted
// elsewhere (e.g. /host/proc), and tests point it at fixture trees. Reads never shell out: they
// run for every process of a snapshot.
//
// Each /proc file is read with openSync + readSync into one shared, reused buffer, not readFile.
// Measured on the dev VM: readFile costs 150-230 us per /proc file and, because /proc files report
// size 0, allocates a 64 KiB chunk buffer per read that lives until GC (~20 MiB and ~40 ms for a
// snapshot of 256 GPU processes read all at once); openSync/readSync costs 22-30 us, and a stat is
// scanned in the buffer itself (other files are decoded to text). A /proc read never waits on a
// disk, so blocking is short and bounded, and readStats and the cgroup scan read in synchronous
// batches of SCAN_BATCH, yielding to the event loop between batches, so a node with thousands of
// processes does not stall requests. The methods stay async so callers (and test doubles) need not
// care how the reading is done.
//
// Failure policy, so that callers can tell "gone" from "broken":
// - A PID that is gone (ENOENT, or ESRCH when it exits between open and read) is an ordinary answer,
//   null, never an exception: processes come and go during every scan.
// - EACCES/EPERM throws an Error saying the proc root is not readable and what to change in the
//   deployment: every later read would fail the same way, so guessing an answer would hide it.
// - A stat that exists but does not parse throws ProcParseError, and any other I/O error (EIO, ...)
//   throws an Error wrapping it ({ cause }): the caller decides whether one bad process spoils its
//   answer. Each of these is logged at warn with the pid and err first, so none goes unseen.
// - readStats, the many-PID read behind a snapshot, is the one exception: a PID whose stat cannot be
//   read or parsed (any of the errors above) maps to an UnreadableStat saying what failed and what
//   to do, never to null: out of descriptors, EIO or an odd line say nothing about whether the
//   process runs, and reading them as "gone" would call every shard of the node exited at once.
//   The call logs one warning with the count and the first error. A snapshot must not fail because
//   one process has an odd /proc entry, and one warning per call (not per PID) keeps a root-wide
//   EACCES from flooding the log.
// - Running out of file descriptors (EMFILE, ENFILE) while stat files are kept open gives half of
//   them back and reads on (see readKept), with a warning saying what to raise.
// - A zombie (state Z or X) still has a stat and is read like any process; hasExited tells such a
//   stat apart. Deciding what an exit means (and that a PID with another start time was reused) is
//   attribution's job.
import { closeSync, openSync, readSync, statfsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';

export interface ProcStat {
  pid: number;
  comm: string;
  state: string;
  ppid: number;
  pgrp: number;
  session: number;
  /** Field 22, clock ticks since boot: with the pid, it tells the original process from a reused PID. */
  startTime: number;
}

/**
 * readStats' answer for a PID whose stat exists, or may, but could not be read or parsed this time.
 * Not a sign that the process exited (that is null): the next read may well succeed.
 */
export interface UnreadableStat {
  pid: number;
  /** What failed, for an operator: "nodecompute is out of file descriptors (EMFILE)". */
  unreadable: string;
  /** What to do about it. */
  advice: string;
}

/** One PID's answer from readStats: its stat, null when it is gone, or what kept it from being read. */
export type StatAnswer = ProcStat | UnreadableStat | null;

export function isReadable(answer: StatAnswer | undefined): answer is ProcStat {
  return answer != null && !('unreadable' in answer);
}

/** A zombie (Z) or a dead task (X): the process has exited, and its stat only waits for its parent to reap it. */
export function hasExited(stat: ProcStat): boolean {
  return stat.state === 'Z' || stat.state === 'X';
}

export class ProcParseError extends Error {
  override name = 'ProcParseError';
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
  /**
   * The snapshot's read, asked again every refresh: keep each stat open for the next one, and close
   * those of PIDs it no longer asks about. Other reads (the doctor's) leave what is kept alone.
   */
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
  /**
   * One process's stat now, as readStats answers it but not logged, and synchronously: a probe's hot
   * path reads it without a promise in between, by the descriptor a snapshot keeps open where it
   * keeps one (one pread).
   */
  statNow(pid: number): StatAnswer;
  /** Closes the descriptors readStats keeps open between snapshots, and keeps none after (the service stops). */
  release(): void;
  /** How many stat files readStats may keep open now (null: the root is not a proc filesystem, so none), and the open-file limit that caps it. */
  keeping(): { keepLimit: number | null; openFilesLimit: number | null };
  checkReadable(): Promise<{ ok: true } | { ok: false; reason: string }>;
  /**
   * The kernel's clock now, in the unit of ProcStat.startTime (clock ticks since boot), from the proc
   * root's uptime file: a moment to compare start times with. Synchronous (one small read), so a
   * caller can date what it records without awaiting. Null when the root has no uptime file (a
   * fixture tree) or it cannot be read or parsed (logged).
   */
  ticksNow(): number | null;
  /**
   * The boot this proc root belongs to (sys/kernel/random/boot_id, new at every boot of the node):
   * PIDs and start times name processes of one boot only. Read once; null when the root has no such
   * file (a fixture tree) or it does not read as one (logged once).
   */
  bootId(): string | null;
}

// Field numbers of proc(5); fields after the command name start at 3.
const FIELD = { state: 3, ppid: 4, pgrp: 5, session: 6, startTime: 22 } as const;
const FIRST_FIELD_AFTER_COMM = FIELD.state;
const UNSIGNED = /^\d+$/;
/**
 * USER_HZ, the unit of starttime: 100 on every Linux architecture nodecompute runs on (x86-64,
 * arm64; sysconf(_SC_CLK_TCK)), which Node cannot ask. /proc/uptime counts the same boot-based
 * clock in seconds with two decimals.
 */
export const CLOCK_TICKS_PER_SECOND = 100;
const GONE_CODES = new Set(['ENOENT', 'ESRCH']);
// The process (EMFILE) or the system (ENFILE) is out of file descriptors.
const OUT_OF_DESCRIPTORS = new Set(['EMFILE', 'ENFILE']);
const DENIED_CODES = new Set(['EACCES', 'EPERM']);
// PIDs read synchronously between two yields to the event loop in readStats and the cgroup scan:
// at 22-30 us a file, a batch blocks for about 2 ms.
const SCAN_BATCH = 64;
// Descriptors readStats keeps open between snapshots: more GPU processes than a node runs, far below
// the descriptor limit (Node raises its soft limit to the hard one at start; container runtimes set
// 1048576). Past it, further processes are read afresh each time. Never more than half of this
// process's own open-file limit, and running out of descriptors halves what is kept (see readKept).
const KEPT_MAX = 2048;
/** This process's limits, wherever the proc root of the host's processes is. */
const OWN_LIMITS_FILE = '/proc/self/limits';
// Most /proc/PID files fit; a larger one (a cgroup file in nested containers) grows the buffer.
const INITIAL_BUFFER_BYTES = 4096;
const DEPLOYMENT_ADVICE =
  "Point the proc root setting at the host's /proc (for example mounted read-only at /host/proc) " +
  'and run the pod with hostPID: true, so the host PIDs that nvidia-smi reports can be looked up.';

/**
 * The fields of one /proc/PID/stat record: the bytes as read (the snapshot's path) or text. A record
 * as the kernel writes it is scanned in place, decoding only the command name. Measured on the dev
 * VM per process: the kernel's read costs about 6 us, decoding the record and splitting it cost 1.5
 * to 3 us more, the scan costs about 0.7 us. Anything the scan does not expect goes to the text
 * parser, which reads it (trailing whitespace, say) or throws a ProcParseError naming what is wrong.
 */
export function parseProcStat(stat: Buffer | string): ProcStat {
  if (typeof stat === 'string') return parseStatText(stat);
  return scanStat(stat) ?? parseStatText(stat.toString('utf8'));
}

const NEWLINE = 0x0a;
const SPACE = 0x20;
const OPEN_PAREN = 0x28;
const CLOSE_PAREN = 0x29;
const DIGIT_ZERO = 0x30;

// A record exactly as the kernel writes it: "pid (comm) S f4 f5 ... f22[ more...]\n", one space
// between fields. Null for anything else, so that parseStatText decides. Bytes are found by plain
// loops, not Buffer#indexOf: each indexOf is a call into C++ that costs more than the scan itself.
function scanStat(b: Buffer): ProcStat | null {
  const length = b.length;
  let open = 0;
  while (open < length && b[open] !== OPEN_PAREN) open += 1;
  let close = length - 1;
  while (close > open && b[close] !== CLOSE_PAREN) close -= 1;
  if (open < 2 || close <= open || b[open - 1] !== SPACE || b[close + 1] !== SPACE || b[close + 3] !== SPACE) return null;
  const pid = wholeNumber(b, 0, open - 1);
  const state = b[close + 2]!;
  if (pid < 0 || !isAsciiLetter(state)) return null;
  let ppid = -1;
  let pgrp = -1;
  let session = -1;
  let at = close + 4;
  for (let field = FIELD.ppid; field < FIELD.startTime; field += 1) {
    let end = at;
    while (end < length && b[end] !== SPACE) end += 1;
    if (end === length) return null;
    if (field === FIELD.ppid) ppid = wholeNumber(b, at, end);
    else if (field === FIELD.pgrp) pgrp = wholeNumber(b, at, end);
    else if (field === FIELD.session) session = wholeNumber(b, at, end);
    at = end + 1;
  }
  let end = at;
  while (end < length && b[end] !== SPACE) end += 1;
  if (end === length && b[length - 1] === NEWLINE) end -= 1;
  const startTime = wholeNumber(b, at, end);
  if (ppid < 0 || pgrp < 0 || session < 0 || startTime < 0) return null;
  return { pid, comm: b.toString('utf8', open + 1, close), state: String.fromCharCode(state), ppid, pgrp, session, startTime };
}

/** The digits of b[from, to) as a safe integer; -1 when empty, not all digits, or too large. */
function wholeNumber(b: Buffer, from: number, to: number): number {
  if (to <= from) return -1;
  let value = 0;
  for (let i = from; i < to; i += 1) {
    const digit = b[i]! - DIGIT_ZERO;
    if (digit < 0 || digit > 9) return -1;
    value = value * 10 + digit;
  }
  return Number.isSafeInteger(value) ? value : -1;
}

function isAsciiLetter(byte: number): boolean {
  const lower = byte | 0x20;
  return lower >= 0x61 && lower <= 0x7a;
}

function parseStatText(text: string): ProcStat {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) malformed('no "(command name)"', text);
  const head = /^(\d+) $/.exec(text.slice(0, open));
  if (head === null) malformed('field 1 (pid) is not a number followed by a space', text);
  const rest = text.slice(close + 1);
  if (!rest.startsWith(' ')) malformed('no space after the command name', text);
  // Only the fields up to starttime are split out: a stat has 52.
  const fields = rest.slice(1).trimEnd().split(' ', FIELD.startTime - FIRST_FIELD_AFTER_COMM + 1);
  const field = (n: number): string => fields[n - FIRST_FIELD_AFTER_COMM] ?? malformed(`field ${n} is missing`, text);
  const state = field(FIELD.state);
  if (!/^[A-Za-z]$/.test(state)) malformed(`field 3 (state) ${JSON.stringify(state)} is not one letter`, text);
  return {
    pid: toCount(head[1] as string, 'field 1 (pid)', text),
    comm: text.slice(open + 1, close),
    state,
    ppid: toCount(field(FIELD.ppid), 'field 4 (ppid)', text),
    pgrp: toCount(field(FIELD.pgrp), 'field 5 (pgrp)', text),
    session: toCount(field(FIELD.session), 'field 6 (session)', text),
    startTime: toCount(field(FIELD.startTime), 'field 22 (starttime)', text),
  };
}

/** The soft "Max open files" of a /proc/PID/limits text; null when it is unlimited or not there. */
export function parseOpenFilesLimit(text: string): number | null {
  const match = /^Max open files +(\d+|unlimited) /m.exec(text);
  return match === null || match[1] === 'unlimited' ? null : Number(match[1]);
}

/** /proc/uptime ("12345.67 54321.09"): seconds since boot, in clock ticks (truncated, as starttime is); null when malformed. */
export function parseUptimeTicks(text: string): number | null {
  const match = /^(\d+)\.(\d\d) /.exec(text);
  if (match === null) return null;
  const ticks = Number(match[1]) * CLOCK_TICKS_PER_SECOND + Math.floor((Number(match[2]) * CLOCK_TICKS_PER_SECOND) / 100);
  return Number.isSafeInteger(ticks) ? ticks : null;
}

/** sys/kernel/random/boot_id ("6f1c0b6e-...\n", a random UUID); null when it is not one. */
export function parseBootId(text: string): string | null {
  const id = text.trim();
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(id) ? id : null;
}

export function parseCgroup(text: string): string[] {
  const paths: string[] = [];
  for (const line of text.split('\n')) {
    const path = cgroupPathOf(line);
    if (path !== null && !paths.includes(path)) paths.push(path);
  }
  return paths;
}

type Warn = (fields: object, msg: string) => void;
/**
 * Reads one process file whole: afresh (open, read, close), or through a descriptor kept open. The
 * answer is a view of the module's one read buffer, valid until the next read.
 */
type PidFileRead = (path: string, pid: number) => Buffer;

export function createProcReader({ root, log, keepMax = KEPT_MAX, limitsFile = OWN_LIMITS_FILE }: ProcReaderOptions): ProcReader {
  const warn: Warn = (fields, msg) => log.warn(fields, msg);
  // readStats reports its failures itself, once per call.
  const quiet: Warn = () => {};

  // Paths are built by concatenation, not path.join: this runs for every process of every snapshot.
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

  // readStats({ keep }) keeps each /proc/PID/stat open from one snapshot to the next and reads it again from
  // offset 0: one syscall per process instead of three (open, read, close), which were most of a
  // refresh. A kept descriptor belongs to the process it was opened for, not to its PID: once that
  // process is reaped, reading it fails (ESRCH) even if the PID has been reused, and the PID is then
  // opened afresh. Descriptors of PIDs a snapshot no longer asks about are closed at its end; at
  // most keepMax are kept, since the descriptor limit is the whole service's. Only on a real proc
  // filesystem: in a tree of plain files (tests), an open descriptor would outlive a deleted entry.
  // Keeping never takes more than half of the service's open-file limit (a hard nofile of 1,024 and
  // a thousand GPU processes must leave room for connections). If descriptors still run out (other
  // work holds them, or the host's are exhausted), processes must not read as absent: an open
  // refused for want of descriptors while some are kept gives half of them back, for good, and the
  // process is read afresh with one just freed. With none kept there is nothing to give back: the
  // read fails, as any other read would, and keeping goes on once descriptors are free again.
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

  // One pass over the proc root answers every needle: a snapshot with many cgroup shards must not
  // read every process's cgroup file once per shard. Unlike readStats, an unreadable cgroup file
  // fails the scan: a process passed over could be the one a shard is looking for. Its callers say
  // what the failure means (a registration refused, a snapshot whose cgroup shards are unverified),
  // so the scan itself logs nothing.
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

// One buffer for every read of this module: reads are synchronous, so two never overlap. It only
// grows, to the largest /proc file read so far (a few KiB in practice).
let shared = Buffer.allocUnsafe(INITIAL_BUFFER_BYTES);

// Reads from offset 0 until a read returns 0: /proc files report size 0, and a short read is not
// the end. The exception is a one-line file (stat): the kernel writes its single record whole, so a
// read that ends with its newline is the end, which saves a read syscall per process per snapshot.
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

function malformed(what: string, text: string): never {
  const excerpt = text.length > 120 ? `${text.slice(0, 120)}...` : text;
  throw new ProcParseError(`malformed /proc stat: ${what}, in ${JSON.stringify(excerpt)}`);
}

function toCount(value: string, name: string, text: string): number {
  const n = Number(value);
  if (!UNSIGNED.test(value) || !Number.isSafeInteger(n)) malformed(`${name} ${JSON.stringify(value)} is not a whole number`, text);
  return n;
}

// Lines are "hierarchy-ID:controller-list:path" (v1) or "0::path" (v2); the path may itself hold ':'.
function cgroupPathOf(line: string): string | null {
  const first = line.indexOf(':');
  const second = first < 0 ? -1 : line.indexOf(':', first + 1);
  return second < 0 || second === line.length - 1 ? null : line.slice(second + 1);
}

/**
 * Tells whether a process whose /proc/PID/cgroup paths are given (parseCgroup) is in the cgroup named
 * by `needle`, a container id or pod UID: a path holds it, as cgroupfs writes it or as the systemd
 * cgroup driver does, with '_' for '-' (kubepods-pod<uid>.slice).
 */
export function cgroupMatcher(needle: string): (paths: readonly string[]) => boolean {
  const systemd = needle.replaceAll('-', '_');
  const forms = systemd === needle ? [needle] : [needle, systemd];
  return (paths) => paths.some((path) => forms.some((form) => path.includes(form)));
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

function codeOf(err: unknown): string {
  return String((err as NodeJS.ErrnoException).code ?? '');
}
