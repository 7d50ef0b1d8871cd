// The shard registry's file on disk. A write is atomic and durable (temp file fsynced, renamed over
// it, directory fsynced). One writer only: the file must still hold what this process last wrote or
// first read, so a second nodecompute's registrations are never thrown away. An operation pending
// past timeoutMs marks the directory unwritable, and nothing else starts there until it returns.
import { mkdir, open, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { Logger } from 'pino';
import { settleWithin } from '../deadline.js';
import { cannotStoreMessage } from '../errors.js';

/** checkWritable's answer: writable (perhaps with a warning), or not, why, and what to do where it is not the directory's own fault. */
export type Writability = { ok: true; warning: { problem: string; fix: string } | null } | { ok: false; reason: string; fix?: string };

export const STATE_FILE_CHANGED = 'NODECOMPUTE_STATE_FILE_CHANGED';

/** How a write or a look fails: an errno error, or one of this module's own, which says what to do (`fix`). */
export type StateFileFailure = NodeJS.ErrnoException & { fix?: string };

export const STATE_FILE_CHANGED_FIX =
  'Only one nodecompute may use a state file: stop the other one (same NODECOMPUTE_STATE_FILE on this node), then restart this one to read the file again.';

/** How old an answer of writable() gets before it is looked at again: each look writes and fsyncs a probe file. */
export const WRITABLE_LOOK_MS = 60_000;

/** How long a read, write or look may take before its filesystem is taken for one that does not answer. */
export const STATE_FILE_TIMEOUT_MS = 5_000;

/** Enough to need a block of its own, so that a full disk shows. */
const PROBE_CONTENT = Buffer.alloc(4096);

export type StateFile = ReturnType<typeof createStateFile>;

/** syncDirectory: makes the rename durable (fsync of the directory); tests stand in one that fails, as some filesystems' does. */
export type StateFileOptions = { log: Logger; syncDirectory?: (dir: string) => Promise<void>; now?: () => number; timeoutMs?: number };

function unwritable(dir: string, err: StateFileFailure): Writability {
  return err.fix === undefined ? { ok: false, reason: `cannot write in ${dir}: ${err.message}` } : { ok: false, reason: err.message, fix: err.fix };
}

const notFinished = (doing: string, ms: number): string => `${doing} did not finish within ${ms} ms: its filesystem does not answer (a hung network mount?)`;

/** errno codes with which a filesystem says it cannot fsync a directory at all. */
const CANNOT_SYNC_DIRECTORIES = new Set(['EINVAL', 'ENOTSUP', 'EOPNOTSUPP']);

/** A directory fsync that failed: the error, what it puts at risk and what to do. */
type DirectorySyncProblem = { err: NodeJS.ErrnoException; problem: string; fix: string };

/** How old a temp file is before a start takes it for a crash's leftover. */
export const LEFTOVER_AGE_MS = 60_000;

/** `mkdir -p` one level at a time: Node's recursive mkdir never settles where mkdir answers ENOENT below an existing directory (/proc). */
async function makeDirectory(dir: string, parentMade = false): Promise<void> {
  try {
    await mkdir(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EEXIST') {
      if ((await stat(dir)).isDirectory()) return;
      throw Object.assign(new Error(`${dir} exists and is not a directory`), { code: 'ENOTDIR' });
    }
    const parent = dirname(dir);
    if (code !== 'ENOENT' || parentMade || parent === dir) throw err;
    await makeDirectory(parent);
    await makeDirectory(dir, true);
  }
}

/** The file holds other text than this process last wrote there (or, before its first write, read at start). */
function changedElsewhere(path: string): StateFileFailure {
  const message = `${path} was changed by another process (a second nodecompute, or an edit by hand) since this one read or wrote it; writing would lose that`;
  return Object.assign(new Error(message), { code: STATE_FILE_CHANGED, fix: STATE_FILE_CHANGED_FIX });
}

/** A failed write's error as its caller gets it, without the syscall's tail; the original is its cause. */
function writeFailure(err: unknown): StateFileFailure {
  const { message, code, syscall, fix } = err as StateFileFailure;
  const said = syscall === undefined ? message : message.split(`, ${syscall}`)[0]!;
  return Object.assign(new Error(said, { cause: err }), fix === undefined ? { code } : { code, fix });
}

const textOrNull = (path: string): Promise<string | null> =>
  readFile(path, 'utf8').catch((err: NodeJS.ErrnoException) => (err.code === 'ENOENT' ? null : Promise.reject(err)));

/** Opens `file` (a directory: only to fsync it), writes `data` into it unless null, fsyncs it, then closes it and runs `after`. */
async function synced(file: string, data: Buffer | string | null, after?: () => Promise<void>): Promise<void> {
  const handle = await open(file, data === null ? 'r' : 'w', 0o600);
  try {
    if (data !== null) await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
    await after?.();
  }
}

const fsyncDirectory = (dir: string): Promise<void> => synced(dir, null);

export function createStateFile(path: string, options: StateFileOptions) {
  const { log, syncDirectory = fsyncDirectory, now = Date.now, timeoutMs = STATE_FILE_TIMEOUT_MS } = options;
  const dir = dirname(path);
  const directorySyncFailures = new Set<string>();
  let sequence = 0;
  /** The text this process last wrote there, or read first (null: no file); undefined before either. */
  let ownText: string | null | undefined;
  /** Throws changedElsewhere when the file holds another text than ownText. */
  const checkUnchanged = async (): Promise<void> => {
    if (ownText !== undefined && (await textOrNull(path)) !== ownText) throw changedElsewhere(path);
  };
  const syncDirectoryProblem = async (): Promise<DirectorySyncProblem | null> => {
    try {
      await syncDirectory(dir);
      return null;
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      const problem =
        `fsync of ${dir} failed (${err.message}): a change is stored and served, yet a power cut right after it could bring back the previous file.`;
      const fix = CANNOT_SYNC_DIRECTORIES.has(String(err.code))
        ? 'This filesystem cannot fsync a directory (some FUSE and network filesystems): put NODECOMPUTE_STATE_FILE on a local disk.'
        : 'Check the volume the state file lives on (`dmesg` for I/O errors).';
      return { err, problem, fix };
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
    if (removed.length > 0) log.info({ stateFile: path, removed }, `Removed ${removed.length} temp file(s) that an interrupted write left; ${path} is whole.`);
  };
  /** Per operation on the directory pending past timeoutMs: why the directory is not writable meanwhile. */
  const hung = new Set<{ reason: string }>();
  /** Settles as `operation` does; past timeoutMs, `onStuck` is told why (by default that is the directory's answer) until it returns. */
  function watched<T>(operation: Promise<T>, doing: string, onStuck = (reason: string): unknown => record({ ok: false, reason })): Promise<T> {
    const entry = { reason: notFinished(doing, timeoutMs) };
    const timer = setTimeout(() => {
      hung.add(entry);
      onStuck(entry.reason);
    }, timeoutMs);
    timer.unref();
    return operation.finally(() => {
      clearTimeout(timer);
      hung.delete(entry);
    });
  }
  /** Why nothing is started on the directory now (an operation on it is stuck past its bound); null when something may be. */
  const stuckReason = (): string | null => {
    const [first] = hung;
    return first === undefined ? null : `${first.reason}; that is still pending, and nothing else is written there until it returns`;
  };
  /** Whether a write would succeed now (see StateFile.checkWritable), however long that takes to say. */
  async function lookAtDirectory(): Promise<Writability> {
    const probe = join(dir, `.${basename(path)}.${process.pid}.probe`);
    try {
      await makeDirectory(dir);
      await synced(probe, PROBE_CONTENT, () => rm(probe, { force: true }));
      await checkUnchanged();
    } catch (err) {
      return unwritable(dir, err as StateFileFailure);
    }
    const failed = await syncDirectoryProblem();
    return { ok: true, warning: failed && { problem: failed.problem, fix: failed.fix } };
  }
  /** Writes `text` to `temp`, durably, and renames it over the state file; answers what the directory fsync that follows put at risk. */
  async function replaceWith(temp: string, text: string): Promise<DirectorySyncProblem | null> {
    try {
      await makeDirectory(dir);
      await synced(temp, text);
      await checkUnchanged();
      await rename(temp, path);
      ownText = text;
    } catch (err) {
      await rm(temp, { force: true }).catch(() => undefined);
      throw err;
    }
    return syncDirectoryProblem();
  }
  async function readText(): Promise<string | null> {
    await removeLeftovers();
    const text = await textOrNull(path);
    if (ownText === undefined) ownText = text;
    return text;
  }

  let known: { at: number; answer: Writability } | null = null;
  let looking: Promise<Writability> | null = null;
  /** Takes an answer as the one known (unwritable while something is stuck); logs a change between writable and not. */
  const record = (found: Writability): Writability => {
    const stuck = stuckReason();
    const answer: Writability = found.ok && stuck !== null ? { ok: false, reason: stuck } : found;
    const was = known?.answer.ok ?? true;
    known = { at: now(), answer };
    if (!answer.ok && was) log.error({ stateFile: path, reason: answer.reason }, cannotStoreMessage(path, answer));
    if (answer.ok && !was) log.info({ stateFile: path }, `Registrations can be stored in ${path} again.`);
    return answer;
  };
  /**
   * One look at a time; settles when it lands or when `maxWaitMs` passes (unwritable for its callers
   * until it lands). Only what lands, or the stuck bound (timeoutMs) passing, is recorded and logged:
   * a caller's shorter budget says nothing of the directory.
   */
  function startLook(maxWaitMs: number): Promise<Writability> {
    const stuck = stuckReason();
    if (stuck !== null) return Promise.resolve({ ok: false, reason: stuck });
    if (looking) return looking;
    const doing = `writing a probe file in ${dir}`;
    const landed = watched(lookAtDirectory(), doing).then((answer) => {
      looking = null;
      return record(answer);
    });
    looking = settleWithin(landed, maxWaitMs, (): Writability => ({ ok: false, reason: notFinished(doing, maxWaitMs) }), { unref: true });
    return looking;
  }
  /** The last answer at once (looked at again in the background once WRITABLE_LOOK_MS old); the first waits up to `maxWaitMs`. */
  async function writable(maxWaitMs: number): Promise<Writability> {
    if (known === null) return startLook(maxWaitMs);
    if (now() - known.at >= WRITABLE_LOOK_MS && stuckReason() === null) void startLook(maxWaitMs);
    return known.answer;
  }

  return {
    path,
    timeoutMs,
    /** The file's text (null: no file), after clearing old temp files; rejects past `timeoutMs`. */
    read() {
      return new Promise<string | null>((resolve, reject) => {
        watched(readText(), `reading ${path}`, (reason) => reject(new Error(reason))).then(resolve, reject);
      });
    },
    /** Replaces the content atomically and durably; settles when the filesystem answers. */
    async write(text: string) {
      const stuck = stuckReason();
      if (stuck !== null) throw new Error(stuck);
      sequence += 1;
      const temp = join(dir, `.${basename(path)}.${process.pid}.${sequence}.tmp`);
      let failed: DirectorySyncProblem | null;
      try {
        failed = await watched(replaceWith(temp, text), `writing the state file (its temp file ${temp})`);
      } catch (err) {
        const failure = writeFailure(err);
        record(unwritable(dir, failure));
        throw failure;
      }
      record({ ok: true, warning: failed && { problem: failed.problem, fix: failed.fix } });
      if (failed) {
        const kind = String(failed.err.code);
        const level = directorySyncFailures.has(kind) ? 'debug' : 'warn';
        directorySyncFailures.add(kind);
        log[level]({ err: failed.err, stateFile: path }, `The state file ${path} was replaced, but the ${failed.problem} ${failed.fix}`);
      }
    },
    /** Whether a write would succeed now: a probe file beside it written, fsynced and removed. */
    checkWritable: () => startLook(timeoutMs),
    writable,
    stuck: stuckReason,
  };
}
