// What a failed /proc read means for an operator, and what to do (readStats' UnreadableStat, the reader's errors).
import { ProcParseError } from './procfs-parse.js';

/** readStats' answer for a PID whose stat could not be read or parsed this time (not a sign that it exited): what failed, what to do. */
export type UnreadableStat = { pid: number; unreadable: string; advice: string };

const DENIED_CODES = new Set(['EACCES', 'EPERM']);

export const DEPLOYMENT_ADVICE =
  "Point the proc root setting at the host's /proc (for example mounted read-only at /host/proc) " +
  'and run the pod with hostPID: true, so the host PIDs that nvidia-smi reports can be looked up.';

export const OUT_OF_DESCRIPTORS_ADVICE: Readonly<Record<string, string>> = {
  EMFILE:
    "Raise the container's open-file limit (nofile, for example 65536), or look for what else holds descriptors (ls /proc/<nodecompute pid>/fd | wc -l).",
  ENFILE: "The whole host is out of file descriptors: check what holds them (the largest counts in /proc/*/fd) and the host's fs.file-max.",
};

/** What kept readStats from a PID's stat, from the error statOf threw (the errno is its cause). */
export function unreadableStat(pid: number, err: unknown, root: string): UnreadableStat {
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

export function describeReadFailure(path: string, root: string, err: unknown): string {
  const code = codeOf(err);
  if (!DENIED_CODES.has(code)) return `cannot read ${path}: ${(err as Error).message}`;
  return `cannot read ${path}: permission denied (${code}). The proc root ${root} is not readable by this process. ${DEPLOYMENT_ADVICE}`;
}

export function codeOf(err: unknown): string {
  return String((err as NodeJS.ErrnoException).code ?? '');
}
