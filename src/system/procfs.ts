// Owns every read of /proc: the pure parsers of /proc/PID/stat and /proc/PID/cgroup, and a reader
// bound to one proc root. The root is a parameter because a container sees the host's processes
// only through the host's /proc mounted elsewhere (e.g. /host/proc), and tests point it at fixture
// trees. Reads are one readFile each and never shell out: they run for every process of a snapshot.
//
// Failure policy, so that callers can tell "gone" from "broken":
// - A PID that is gone (ENOENT, or ESRCH when it exits between open and read) is an ordinary answer,
//   null, never an exception: processes come and go during every scan.
// - EACCES/EPERM throws an Error saying the proc root is not readable and what to change in the
//   deployment: every later read would fail the same way, so guessing an answer would hide it.
// - A stat that exists but does not parse throws ProcParseError, and any other I/O error (EIO, ...)
//   throws an Error wrapping it ({ cause }): the caller decides whether one bad process spoils its
//   answer. Each of these is logged at warn with the pid and err first, so none goes unseen.
// - A zombie (state Z or X) is not alive: it has exited and only waits to be reaped, and a PID 1
//   that never reaps (common in containers) would otherwise keep a killed shard "alive" forever.
import { readdir, readFile } from 'node:fs/promises';
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

export class ProcParseError extends Error {
  override name = 'ProcParseError';
}

export interface ProcReaderOptions {
  root: string;
  log: Logger;
}

export interface ProcReader {
  readonly root: string;
  readStat(pid: number): Promise<ProcStat | null>;
  readCgroup(pid: number): Promise<string[] | null>;
  listPids(): Promise<number[]>;
  findPidsInCgroup(needle: string): Promise<number[]>;
  findPidsInCgroups(needles: string[]): Promise<Map<string, number[]>>;
  isAlive(pid: number, startTime: number): Promise<boolean>;
  checkReadable(): Promise<{ ok: true } | { ok: false; reason: string }>;
}

// Field numbers of proc(5); fields after the command name start at 3.
const FIELD = { state: 3, ppid: 4, pgrp: 5, session: 6, startTime: 22 } as const;
const FIRST_FIELD_AFTER_COMM = FIELD.state;
const UNSIGNED = /^\d+$/;
const DEAD_STATES = new Set(['Z', 'X', 'x']);
const GONE_CODES = new Set(['ENOENT', 'ESRCH']);
const DENIED_CODES = new Set(['EACCES', 'EPERM']);
// Bounds the files open at once during a scan, so a node with thousands of processes cannot hit EMFILE.
const SCAN_BATCH = 64;
const DEPLOYMENT_ADVICE =
  "Point the proc root setting at the host's /proc (for example mounted read-only at /host/proc) " +
  'and run the pod with hostPID: true, so the host PIDs that nvidia-smi reports can be looked up.';

export function parseProcStat(text: string): ProcStat {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) malformed('no "(command name)"', text);
  const head = /^(\d+) $/.exec(text.slice(0, open));
  if (head === null) malformed('field 1 (pid) is not a number followed by a space', text);
  const rest = text.slice(close + 1);
  if (!rest.startsWith(' ')) malformed('no space after the command name', text);
  const fields = rest.slice(1).trimEnd().split(' ');
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

export function parseCgroup(text: string): string[] {
  const paths: string[] = [];
  for (const line of text.split('\n')) {
    const path = cgroupPathOf(line);
    if (path !== null && !paths.includes(path)) paths.push(path);
  }
  return paths;
}

export function createProcReader({ root, log }: ProcReaderOptions): ProcReader {
  const readPidFile = async (pid: number, file: string): Promise<string | null> => {
    const path = join(root, String(pid), file);
    try {
      return await readFile(path, 'utf8');
    } catch (err) {
      if (GONE_CODES.has(codeOf(err))) return null;
      log.warn({ pid, path, err }, 'cannot read a process file under the proc root');
      throw new Error(describeReadFailure(path, root, err), { cause: err });
    }
  };

  const readStat = async (pid: number): Promise<ProcStat | null> => {
    const text = await readPidFile(pid, 'stat');
    if (text === null) return null;
    try {
      return parseProcStat(text);
    } catch (err) {
      log.warn({ pid, err }, 'unparsable /proc stat of an existing process');
      throw new ProcParseError(`${join(root, String(pid), 'stat')}: ${(err as Error).message}`, { cause: err });
    }
  };

  const readCgroup = async (pid: number): Promise<string[] | null> => {
    const text = await readPidFile(pid, 'cgroup');
    return text === null ? null : parseCgroup(text);
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
  // read every process's cgroup file once per shard.
  const findPidsInCgroups = async (needles: string[]): Promise<Map<string, number[]>> => {
    if (needles.some((needle) => needle === '')) {
      throw new Error('findPidsInCgroup needs a container id or pod UID: an empty one matches every process');
    }
    const variants = needles.map((needle) => [needle, needleVariants(needle)] as const);
    const found = new Map<string, number[]>(needles.map((needle) => [needle, []]));
    if (needles.length === 0) return found;
    const pids = await listPids();
    const paths = await mapInBatches(pids, SCAN_BATCH, readCgroup);
    pids.forEach((pid, i) => {
      const mine = paths[i];
      if (!mine) return;
      for (const [needle, forms] of variants) {
        if (mine.some((path) => forms.some((form) => path.includes(form)))) found.get(needle)!.push(pid);
      }
    });
    return found;
  };

  const findPidsInCgroup = async (needle: string): Promise<number[]> => (await findPidsInCgroups([needle])).get(needle)!;

  const isAlive = async (pid: number, startTime: number): Promise<boolean> => {
    const stat = await readStat(pid);
    return stat !== null && stat.startTime === startTime && !DEAD_STATES.has(stat.state);
  };

  const checkReadable = async (): Promise<{ ok: true } | { ok: false; reason: string }> => {
    const selfProblem = await problemReadingSelf(root);
    if (selfProblem === null) return { ok: true };
    const listProblem = await problemListing(root);
    if (listProblem === null) return { ok: true };
    return { ok: false, reason: `${selfProblem}, and ${listProblem}. ${DEPLOYMENT_ADVICE}` };
  };

  return { root, readStat, readCgroup, listPids, findPidsInCgroup, findPidsInCgroups, isAlive, checkReadable };
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

// The systemd cgroup driver writes a pod UID with '_' for '-' (kubepods-pod<uid>.slice), cgroupfs keeps '-'.
function needleVariants(needle: string): string[] {
  const systemd = needle.replaceAll('-', '_');
  return systemd === needle ? [needle] : [needle, systemd];
}

function pidsOf(names: string[]): number[] {
  return names.filter((name) => UNSIGNED.test(name)).map(Number).sort((a, b) => a - b);
}

async function mapInBatches<T, R>(items: T[], size: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = [];
  for (let i = 0; i < items.length; i += size) {
    results.push(...(await Promise.all(items.slice(i, i + size).map(fn))));
  }
  return results;
}

async function problemReadingSelf(root: string): Promise<string | null> {
  const path = join(root, 'self', 'stat');
  try {
    parseProcStat(await readFile(path, 'utf8'));
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

function describeReadFailure(path: string, root: string, err: unknown): string {
  const code = codeOf(err);
  if (!DENIED_CODES.has(code)) return `cannot read ${path}: ${(err as Error).message}`;
  return `cannot read ${path}: permission denied (${code}). The proc root ${root} is not readable by this process. ${DEPLOYMENT_ADVICE}`;
}

function codeOf(err: unknown): string {
  return String((err as NodeJS.ErrnoException).code ?? '');
}
