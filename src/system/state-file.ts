// Owns the shard registry's file on disk. Writes are atomic and durable: a temp file in the same
// directory is written and fsynced, renamed over the state file, and the directory is fsynced, so
// a crash at any moment leaves either the old or the new file, never a torn one, and a write that
// resolved survives a power cut. Reading never repairs or overwrites: a file that cannot be read
// or parsed is the operator's to look at.
import { mkdir, open, readFile, rename, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

export interface StateFile {
  readonly path: string;
  /** The file's text, or null when it does not exist yet. Other errors propagate. */
  read(): Promise<string | null>;
  /** Replaces the file's content atomically and durably. */
  write(text: string): Promise<void>;
  /** Whether a write would succeed now: creates and removes a probe file beside the state file. */
  checkWritable(): Promise<{ ok: true } | { ok: false; reason: string }>;
}

async function fsyncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

export function createStateFile(path: string): StateFile {
  const dir = dirname(path);
  let sequence = 0;
  return {
    path,
    async read() {
      try {
        return await readFile(path, 'utf8');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw err;
      }
    },
    async write(text) {
      await mkdir(dir, { recursive: true });
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
      await fsyncDirectory(dir);
    },
    async checkWritable() {
      const probe = join(dir, `.${basename(path)}.${process.pid}.probe`);
      try {
        await mkdir(dir, { recursive: true });
        const handle = await open(probe, 'w', 0o600);
        await handle.close();
        await rm(probe, { force: true });
        return { ok: true };
      } catch (err) {
        return { ok: false, reason: `cannot write in ${dir}: ${(err as Error).message}` };
      }
    },
  };
}
