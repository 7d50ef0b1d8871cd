// Reads the token file: a look reads it only when it changed, answers within a bound (concurrent
// looks share one read), and takes a content only when it was stable while read (same device, inode,
// size and mtime before and after, as many bytes as its size), so it is never taken half-written.
import type { BigIntStats } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { settleWithin } from '../deadline.js';

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

/** beforeRead runs between the stat and the open: tests change the file there, as a writer racing the read would. */
export type TokenFileReaderOptions = { timeoutMs?: number; beforeRead?: () => void | Promise<void> };

/** Who may read a file: what is said when this process may not (EACCES). */
export type FileOwner = { uid: number; gid: number; mode: number };

/** Changes when the file is replaced (a kubelet symlink swap gives a new inode) or rewritten in place. */
type FileIdentity = Pick<BigIntStats, 'dev' | 'ino' | 'size' | 'mtimeNs'>;

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
    // A plain blocking open (a FIFO without a writer waits, as a hung mount does); the identity after
    // the read comes from the open file, so it is that of the bytes read even if the path is swapped.
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
    if (BigInt(bytes.length) !== after.size) return { kind: 'unstable', detail: `${bytes.length} bytes were read from it, but its size says ${after.size}` };
    return { kind: 'read', text: bytes.toString('utf8'), identity: after };
  } catch (err) {
    return { kind: 'failed', err: err as Error, file: owner };
  }
}

export function createTokenFileReader(path: string, options: TokenFileReaderOptions = {}) {
  const { timeoutMs = TOKEN_FILE_READ_TIMEOUT_MS, beforeRead } = options;
  // The identity of the content last taken; null: read the file at the next look.
  let taken: FileIdentity | null = null;
  /** The look under way, shared by every caller until its read settles (past the bound, it answers `late` at once). */
  let flight: Promise<TokenFileLook> | null = null;

  /** Looks at the file; never rejects, and resolves within the reader's timeout. */
  function look(): Promise<TokenFileLook> {
    if (flight !== null) return flight;
    let late = false;
    const read = readIfChanged(path, taken, beforeRead).then((outcome): TokenFileLook => {
      flight = null;
      if (late) return { kind: 'late', timeoutMs }; // its callers were answered without it
      if (outcome.kind === 'read') {
        taken = outcome.identity;
        return { kind: 'read', text: outcome.text };
      }
      // Not remembered as read: a permission fix changes neither size nor mtime.
      if (outcome.kind === 'failed') taken = null;
      return outcome;
    });
    const answerLate = (): TokenFileLook => {
      late = true;
      // Read again once the file answers, so that its recovery is noticed even if it is unchanged.
      taken = null;
      return { kind: 'late', timeoutMs };
    };
    flight = settleWithin(read, timeoutMs, answerLate, { unref: true });
    return flight;
  }

  return { path, look };
}
