// Owns the shard registry's file on disk. Writes are atomic and durable: a temp file in the same
// directory is written and fsynced, renamed over the state file, and the directory is fsynced, so
// a crash at any moment leaves either the old or the new file, never a torn one, and (where the
// directory fsync works) a write that resolved survives a power cut. Reading never repairs or
// overwrites: a file that cannot be read or parsed is the operator's to look at. It does clear away
// the temp files a crash between write and rename left beside it (read runs at start-up), once they
// are old enough that no live writer can own them.
//
// Once the rename is done the write has happened, whatever follows: a directory fsync that fails
// then (some FUSE and network filesystems cannot fsync a directory: EINVAL) is logged, not thrown,
// so the registry never refuses a change that the file already holds. Each kind of failure is
// logged as a warning once, then at debug: on such a filesystem every write fails the same way.
// Whether the directory takes writes is also watched for /readyz (writable()): looked at afresh
// at most every WRITABLE_LOOK_MS, bounded in time, and logged when it changes, so an unwritable
// volume shows at start-up and whenever it turns, not only at the next registration.
// Missing directories are made one level at a time: Node's recursive mkdir never settles (and
// spins a core) where mkdir answers ENOENT below a directory that exists, as it does under /proc.
import { mkdir, open, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { Logger } from 'pino';

/** checkWritable's answer: writable (perhaps with a warning), or not and why. */
export type Writability = { ok: true; warning: { problem: string; fix: string } | null } | { ok: false; reason: string };

/** How long one look at whether the directory takes writes stands: each look writes a probe file there. */
export const WRITABLE_LOOK_MS = 10_000;

/** What an unwritable state directory means and what to do: one text for the log and for /readyz. */
export function cannotStore(path: string, reason: string): string {
  return (
    `Registrations cannot be stored in ${path}: ${reason}. Every registration and removal is refused (503) until they can; ` +
    'the shards already stored are kept and served. Make the directory writable (mount its volume read-write; check for a full disk) ' +
    'or set NODECOMPUTE_STATE_FILE to a path on a writable volume.'
  );
}

export interface StateFile {
  readonly path: string;
  /**
   * The file's text, or null when it does not exist yet. Other errors propagate. Temp files of
   * crashed writes older than LEFTOVER_AGE_MS are removed first.
   */
  read(): Promise<string | null>;
  /** Replaces the file's content atomically and durably. */
  write(text: string): Promise<void>;
  /**
   * Whether a write would succeed now: creates and removes a probe file beside the state file, and
   * fsyncs the directory. A directory that cannot be fsynced still takes writes: that is a warning.
   */
  checkWritable(): Promise<Writability>;
  /**
   * checkWritable's answer, looked at afresh at most once per WRITABLE_LOOK_MS (one look at a time);
   * a look not finished within `maxWaitMs` (a filesystem that does not answer) reads as not
   * writable. A change between writable and not is logged, once.
   */
  writable(maxWaitMs: number): Promise<Writability>;
}

export interface StateFileOptions {
  log: Logger;
  /** Makes the rename durable (fsync of the directory); tests stand in one that fails, as some filesystems' does. */
  syncDirectory?: (dir: string) => Promise<void>;
  now?: () => number;
}

/** errno codes with which a filesystem says it cannot fsync a directory at all. */
const CANNOT_SYNC_DIRECTORIES = new Set(['EINVAL', 'ENOTSUP', 'EOPNOTSUPP']);

/** A directory fsync that failed: the error, what it puts at risk and what to do. */
interface DirectorySyncProblem {
  err: NodeJS.ErrnoException;
  problem: string;
  fix: string;
}

function directorySyncProblem(dir: string, err: NodeJS.ErrnoException): DirectorySyncProblem {
  return {
    err,
    problem: `fsync of ${dir} failed (${err.message}): a change is stored and served, yet a power cut right after it could bring back the previous file.`,
    fix: CANNOT_SYNC_DIRECTORIES.has(String(err.code))
      ? 'This filesystem cannot fsync a directory (some FUSE and network filesystems): put NODECOMPUTE_STATE_FILE on a local disk.'
      : 'Check the volume the state file lives on (`dmesg` for I/O errors).',
  };
}

/**
 * A temp file is this old before a start-up takes it for a crash's leftover: a writer finishes in
 * milliseconds, and a second nodecompute on the same state file (never intended) is not raced.
 */
export const LEFTOVER_AGE_MS = 60_000;

/**
 * `mkdir -p`, one level at a time (see the header). Another writer making the same level meanwhile
 * is fine; a level that still cannot be made once its parent exists is an error.
 */
async function makeDirectory(dir: string, parentMade = false): Promise<void> {
  try {
    await mkdir(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EEXIST' && (await stat(dir)).isDirectory()) return;
    const parent = dirname(dir);
    if (code !== 'ENOENT' || parentMade || parent === dir) throw err;
    await makeDirectory(parent);
    await makeDirectory(dir, true);
  }
}

async function fsyncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

export function createStateFile(path: string, options: StateFileOptions): StateFile {
  const { log, syncDirectory = fsyncDirectory, now = Date.now } = options;
  const dir = dirname(path);
  const directorySyncFailures = new Set<string>();
  let sequence = 0;
  /** Null when the directory fsync worked. */
  const syncDirectoryProblem = async (): Promise<DirectorySyncProblem | null> => {
    try {
      await syncDirectory(dir);
      return null;
    } catch (err) {
      return directorySyncProblem(dir, err as NodeJS.ErrnoException);
    }
  };
  /** Temp files this module names (`.NAME.PID.SEQ.tmp`, `.NAME.PID.probe`) that a crash left behind. */
  const removeLeftovers = async (): Promise<void> => {
    const prefix = `.${basename(path)}.`;
    let names: string[];
    try {
      names = await readdir(dir);
    } catch {
      return; // No directory yet (or an unreadable one, which read() itself then reports).
    }
    const ours = names.filter((name) => name.startsWith(prefix) && /^\d+\.(?:\d+\.tmp|probe)$/.test(name.slice(prefix.length)));
    const removed: string[] = [];
    for (const name of ours) {
      const file = join(dir, name);
      try {
        if (Date.now() - (await stat(file)).mtimeMs < LEFTOVER_AGE_MS) continue;
        await rm(file, { force: true });
        removed.push(name);
      } catch (err) {
        log.warn({ err, file }, `Could not remove ${file}, a temp file an interrupted write of the state file left behind; it is harmless, remove it by hand.`);
      }
    }
    if (removed.length > 0) {
      log.info({ stateFile: path, removed }, `Removed ${removed.length} temp file(s) that an interrupted write (a crash or a kill) left beside the state file; the state file itself is whole.`);
    }
  };
  /** Whether a write would succeed now (see StateFile.checkWritable). */
  async function checkWritable(): Promise<Writability> {
    const probe = join(dir, `.${basename(path)}.${process.pid}.probe`);
    try {
      await makeDirectory(dir);
      const handle = await open(probe, 'w', 0o600);
      await handle.close();
      await rm(probe, { force: true });
    } catch (err) {
      return { ok: false, reason: `cannot write in ${dir}: ${(err as Error).message}` };
    }
    const failed = await syncDirectoryProblem();
    return { ok: true, warning: failed && { problem: failed.problem, fix: failed.fix } };
  }

  let lastLook: { at: number; answer: Writability } | null = null;
  let looking: Promise<Writability> | null = null;
  /** Logs a change between writable and not; the first look logs only when it is not. */
  const record = (answer: Writability): Writability => {
    const was = lastLook?.answer.ok ?? true;
    lastLook = { at: now(), answer };
    if (!answer.ok && was) log.error({ stateFile: path, reason: answer.reason }, cannotStore(path, answer.reason));
    if (answer.ok && !was) log.info({ stateFile: path }, `Registrations can be stored in ${path} again.`);
    return answer;
  };
  async function writable(maxWaitMs: number): Promise<Writability> {
    if (lastLook && now() - lastLook.at < WRITABLE_LOOK_MS) return lastLook.answer;
    looking ??= checkWritable().then(record).finally(() => {
      looking = null;
    });
    let timer: NodeJS.Timeout | undefined;
    const unanswered = new Promise<Writability>((resolve) => {
      timer = setTimeout(
        () => resolve({ ok: false, reason: `writing a probe file in ${dir} did not finish within ${maxWaitMs} ms: its filesystem does not answer (a hung network mount?)` }),
        maxWaitMs,
      );
    });
    try {
      return await Promise.race([looking, unanswered]);
    } finally {
      clearTimeout(timer);
    }
  }

  return {
    path,
    async read() {
      await removeLeftovers();
      try {
        return await readFile(path, 'utf8');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw err;
      }
    },
    async write(text) {
      await makeDirectory(dir);
      sequence += 1;
      const temp = join(dir, `.${basename(path)}.${process.pid}.${sequence}.tmp`);
      try {
        const handle = await open(temp, 'w', 0o600);
        try {
          await handle.writeFile(text, 'utf8');
          await handle.sync();
        } finally {
          await handle.close();
        }
        await rename(temp, path);
      } catch (err) {
        await rm(temp, { force: true }).catch(() => undefined);
        throw err;
      }
      const failed = await syncDirectoryProblem();
      if (failed) {
        const kind = String(failed.err.code);
        const level = directorySyncFailures.has(kind) ? 'debug' : 'warn';
        directorySyncFailures.add(kind);
        log[level]({ err: failed.err, stateFile: path }, `The state file ${path} was replaced, but the ${failed.problem} ${failed.fix}`);
      }
    },
    checkWritable,
    writable,
  };
}
