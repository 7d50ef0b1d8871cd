// Owns reading the token file (NODECOMPUTE_TOKEN_FILE) while the service runs: one look says whether
// the file changed since the content last taken from it and, when it did, reads it. What the text
// means (one token a line) is config.ts's parseTokenFile; which tokens are in force is auth.ts's.
//
// Three rules keep a write (and everything else on the event loop) safe from the file:
// - Reads are asynchronous. A Secret is a tmpfs, but the setting can point anywhere, and a read on a
//   hung network mount never returns: done synchronously it would stall every request, probes too.
// - A look answers within a bound (TOKEN_FILE_READ_TIMEOUT_MS), `late` if the file did not answer by
//   then. The stuck read is left to finish (it cannot be cancelled) and no other is started while it
//   is pending: each would hold one of libuv's 4 threadpool threads, and a few would stall every
//   other file operation of the process (the state file's writes among them). Concurrent looks
//   share the one in flight. A result that comes after its bound is dropped; the next look reads
//   again.
// - A content is taken only when it is stable: the file's identity (device, inode, size, mtime) is
//   the same before and after the read, and as many bytes were read as its size says. A file
//   rewritten in place (truncated, then written) can otherwise be caught half-written, and its
//   partial tokens would replace the good ones. An unstable read is answered as such, and the
//   next look tries again.
// A read still pending past its bound is listed in stuck-io.ts until it returns: Node's exit waits for
// every read it started (libuv joins its threadpool threads), so one stuck on a hung mount keeps the
// process from exiting at all, and main.ts must know it to end otherwise. A read within its bound is
// not listed: a working file answers within milliseconds, and an exit waits for that (and, should it
// start to hang, for its bound to pass: stuck-io.ts's operationsKnown).
import type { BigIntStats } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { watch } from './stuck-io.js';

/** How long a look at the token file may take before the caller is answered without it. */
export const TOKEN_FILE_READ_TIMEOUT_MS = 1000;

export type TokenFileLook =
  /** The file has the identity of the content last taken from it: nothing was read. */
  | { kind: 'unchanged' }
  /** A new, stable content. */
  | { kind: 'read'; text: string }
  /** The file changed while it was read, or its size does not match what was read: nothing taken. */
  | { kind: 'unstable'; detail: string }
  /** stat, open or read failed (ENOENT, EACCES, EISDIR...); `file`: its owner and mode, when the stat worked. */
  | { kind: 'failed'; err: Error; file: FileOwner | null }
  /** The file did not answer within timeoutMs; a read of it is still pending. */
  | { kind: 'late'; timeoutMs: number };

export interface TokenFileReader {
  readonly path: string;
  /** Looks at the file; never rejects, and resolves within the reader's timeout. */
  look(): Promise<TokenFileLook>;
}

export interface TokenFileReaderOptions {
  timeoutMs?: number;
  /**
   * Runs after the file is stat'd and before it is opened. Tests change the file there, as a writer
   * racing the read would: there is no other way to land a change in that gap on demand.
   */
  beforeRead?: () => void | Promise<void>;
}

/** Who may read a file: what is said when this process may not (EACCES). */
export interface FileOwner {
  uid: number;
  gid: number;
  /** The permission bits, e.g. 0o600. */
  mode: number;
}

/** Changes when the file is replaced (a kubelet symlink swap gives a new inode) or rewritten in place. */
interface FileIdentity {
  dev: bigint;
  ino: bigint;
  size: bigint;
  mtimeNs: bigint;
}

function identityOf(stats: BigIntStats): FileIdentity {
  return { dev: stats.dev, ino: stats.ino, size: stats.size, mtimeNs: stats.mtimeNs };
}

function sameIdentity(a: FileIdentity, b: FileIdentity): boolean {
  return a.dev === b.dev && a.ino === b.ino && a.size === b.size && a.mtimeNs === b.mtimeNs;
}

type ReadOutcome = Exclude<TokenFileLook, { kind: 'read' | 'late' }> | { kind: 'read'; text: string; identity: FileIdentity };

async function readIfChanged(path: string, taken: FileIdentity | null, beforeRead: TokenFileReaderOptions['beforeRead']): Promise<ReadOutcome> {
  let owner: FileOwner | null = null;
  try {
    // Follows symlinks: the identity of the file the tokens are read from.
    const stats = await stat(path, { bigint: true });
    owner = { uid: Number(stats.uid), gid: Number(stats.gid), mode: Number(stats.mode & 0o7777n) };
    const before = identityOf(stats);
    if (taken !== null && sameIdentity(before, taken)) return { kind: 'unchanged' };
    await beforeRead?.();
    // A plain blocking open, as a path read does: on a FIFO without a writer it waits, like a read
    // on a hung mount. The identity after the read is taken from the open file (fstat), so it is
    // that of the bytes read even if the path is swapped meanwhile.
    const handle = await open(path, 'r');
    let bytes: Buffer;
    let after: FileIdentity;
    try {
      bytes = await handle.readFile();
      after = identityOf(await handle.stat({ bigint: true }));
    } finally {
      await handle.close();
    }
    if (!sameIdentity(before, after)) return { kind: 'unstable', detail: 'it changed while it was read' };
    if (BigInt(bytes.length) !== after.size) {
      return { kind: 'unstable', detail: `${bytes.length} bytes were read from it, but its size says ${after.size}` };
    }
    return { kind: 'read', text: bytes.toString('utf8'), identity: after };
  } catch (err) {
    return { kind: 'failed', err: err as Error, file: owner };
  }
}

/** What is said of a read of the token file stuck on a hung mount (stuck-io.ts, main.ts). */
const STUCK_READ_FIX = 'If this repeats, check that filesystem, or mount the token from a Kubernetes Secret (a tmpfs, which does not hang).';

interface Flight {
  answer: Promise<TokenFileLook>;
  /** Whether the bound passed while the read is pending: later looks then answer `late` at once. */
  isLate: () => boolean;
}

export function createTokenFileReader(path: string, options: TokenFileReaderOptions = {}): TokenFileReader {
  const { timeoutMs = TOKEN_FILE_READ_TIMEOUT_MS, beforeRead } = options;
  // The identity of the content last taken; null: read the file at the next look.
  let taken: FileIdentity | null = null;
  let flight: Flight | null = null;

  function look(): Promise<TokenFileLook> {
    if (flight !== null) return flight.isLate() ? Promise.resolve({ kind: 'late', timeoutMs }) : flight.answer;
    let late = false;
    let answerLate!: () => void;
    const deadline = new Promise<TokenFileLook>((resolve) => {
      answerLate = () => resolve({ kind: 'late', timeoutMs });
    });
    const about = { what: 'A read of the token file', file: path, fix: STUCK_READ_FIX };
    const read = watch(readIfChanged(path, taken, beforeRead), timeoutMs, about, () => {
      late = true;
      // Read again once the file answers, so that its recovery is noticed (and said) even if it is unchanged.
      taken = null;
      answerLate();
    }).then((outcome): TokenFileLook => {
      flight = null;
      if (late) return { kind: 'late', timeoutMs }; // dropped: its callers were answered without it
      if (outcome.kind === 'read') {
        taken = outcome.identity;
        return { kind: 'read', text: outcome.text };
      }
      // Not remembered as read: a permission fix changes neither size nor mtime.
      if (outcome.kind === 'failed') taken = null;
      return outcome;
    });
    const answer = Promise.race([read, deadline]);
    flight = { answer, isLate: () => late };
    return answer;
  }

  return { path, look };
}
