// The pure parsers of /proc files: /proc/PID/stat (field 22, the start time, is in clock ticks since
// boot), /proc/PID/cgroup, /proc/uptime, the boot id and a limits file. A stat that does not parse
// throws ProcParseError naming what is wrong; the other parsers answer null (or nothing) instead.

/**
 * startTime: field 22, clock ticks since boot; with the pid, it tells the original process from a reused PID.
 * cpuTicks: fields 14 and 15 (utime + stime), the CPU the process has used, in clock ticks.
 */
export type ProcStat = { pid: number; comm: string; state: string; ppid: number; pgrp: number; session: number; startTime: number; cpuTicks: number };

/** A zombie (Z) or a dead task (X): the process has exited, and its stat only waits for its parent to reap it. */
export function hasExited(stat: ProcStat): boolean {
  return stat.state === 'Z' || stat.state === 'X';
}

export class ProcParseError extends Error {
  override name = 'ProcParseError';
}

// Field numbers of proc(5); fields after the command name start at 3.
const FIELD = { state: 3, ppid: 4, pgrp: 5, session: 6, utime: 14, stime: 15, startTime: 22 } as const;
const FIRST_FIELD_AFTER_COMM = FIELD.state;
const UNSIGNED = /^\d+$/;
/** USER_HZ, the unit of starttime: 100 on x86-64 and arm64 (Node cannot ask sysconf). */
export const CLOCK_TICKS_PER_SECOND = 100;

/** One /proc/PID/stat record: scanned in place when as the kernel writes it, else read by the text parser (or a ProcParseError). */
export function parseProcStat(stat: Buffer | string): ProcStat {
  if (typeof stat === 'string') return parseStatText(stat);
  return scanStat(stat) ?? parseStatText(stat.toString('utf8'));
}

const NEWLINE = 0x0a;
const SPACE = 0x20;
const OPEN_PAREN = 0x28;
const CLOSE_PAREN = 0x29;
const DIGIT_ZERO = 0x30;

// "pid (comm) S f4 f5 ... f22[ more...]\n", one space between fields; null for anything else, which
// parseStatText decides. Plain loops, not Buffer#indexOf: each indexOf call costs more than the scan.
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
  let utime = -1;
  let stime = -1;
  let at = close + 4;
  for (let field = FIELD.ppid; field < FIELD.startTime; field += 1) {
    let end = at;
    while (end < length && b[end] !== SPACE) end += 1;
    if (end === length) return null;
    if (field === FIELD.ppid) ppid = wholeNumber(b, at, end);
    else if (field === FIELD.pgrp) pgrp = wholeNumber(b, at, end);
    else if (field === FIELD.session) session = wholeNumber(b, at, end);
    else if (field === FIELD.utime) utime = wholeNumber(b, at, end);
    else if (field === FIELD.stime) stime = wholeNumber(b, at, end);
    at = end + 1;
  }
  let end = at;
  while (end < length && b[end] !== SPACE) end += 1;
  if (end === length && b[length - 1] === NEWLINE) end -= 1;
  const startTime = wholeNumber(b, at, end);
  if (ppid < 0 || pgrp < 0 || session < 0 || utime < 0 || stime < 0 || startTime < 0) return null;
  return { pid, comm: b.toString('utf8', open + 1, close), state: String.fromCharCode(state), ppid, pgrp, session, startTime, cpuTicks: utime + stime };
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
    cpuTicks: toCount(field(FIELD.utime), 'field 14 (utime)', text) + toCount(field(FIELD.stime), 'field 15 (stime)', text),
  };
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

/** The Tgid of a /proc/PID/status text: the process a thread belongs to (its own PID for a process); null when not there. */
export function parseTgid(text: string): number | null {
  const match = /^Tgid:\s*(\d+)$/m.exec(text);
  return match === null ? null : Number(match[1]);
}

// Lines are "hierarchy-ID:controller-list:path" (v1) or "0::path" (v2); the path may itself hold ':'.
const CGROUP_LINE = /^[^:]*:[^:]*:(.+)$/s;

/** The cgroup paths of a /proc/PID/cgroup text, each once, in order. */
export function parseCgroup(text: string): string[] {
  return [...new Set(text.split('\n').flatMap((line) => CGROUP_LINE.exec(line)?.[1] ?? []))];
}

/** Whether cgroup paths are in the cgroup of `needle` (a container id or pod UID), as cgroupfs or systemd ('_' for '-') writes it. */
export function cgroupMatcher(needle: string): (paths: readonly string[]) => boolean {
  const systemd = needle.replaceAll('-', '_');
  const forms = systemd === needle ? [needle] : [needle, systemd];
  return (paths) => paths.some((path) => forms.some((form) => path.includes(form)));
}
