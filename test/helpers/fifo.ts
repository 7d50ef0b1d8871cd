// Owns the tests' stand-ins for a file on a hung mount: a FIFO (open() on one blocks until the other
// end is opened, as a read or write on a hung network filesystem does), the kubelet's symlink swap,
// and a running server whose token file can be pointed at a FIFO.
import { spawnSync } from 'node:child_process';
import { closeSync, constants, openSync, readdirSync, readFileSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Test } from 'tap';
import { startServer, type RunningServer } from './server.js';

/**
 * A test directory (holding `files`) for FIFOs, each released (both ends opened once) when the test ends, before the
 * directory is removed: a FIFO removed first would leave whatever is blocked opening it blocked for
 * good, and the test process with it. (t.testdir() removes its directory before the teardowns
 * registered after it run, so this one registers its own first.)
 */
export function fifoTestdir(t: Test, files: Record<string, string> = {}): { dir: string; fifo: (name: string) => string } {
  const made: string[] = [];
  t.teardown(() => {
    for (const path of made) {
      releaseFifo(path);
      releaseBlockedWriter(path);
    }
  });
  const dir = t.testdir(files);
  return {
    dir,
    fifo: (name) => {
      const path = join(dir, name);
      mkfifo(path);
      made.push(path);
      return path;
    },
  };
}

/** Whether a thread of process `pid` is blocked opening a FIFO, waiting for its other end (Linux names that wait wait_for_partner). */
export function blockedOpeningFifo(pid: number): boolean {
  return readdirSync(`/proc/${pid}/task`).some((task) => {
    try {
      return readFileSync(`/proc/${pid}/task/${task}/wchan`, 'utf8') === 'wait_for_partner';
    } catch {
      return false; // the thread ended meanwhile
    }
  });
}

export function mkfifo(path: string): void {
  const result = spawnSync('mkfifo', [path], { encoding: 'utf8' });
  if (result.status !== 0) throw new Error(`mkfifo ${path} failed: ${result.stderr}`);
}

/**
 * Opens and closes the FIFO's writer end, which lets a reader blocked in open() go on (it then reads
 * end of file). Non-blocking, so it never waits itself: false when no reader was waiting.
 */
export function releaseFifo(path: string): boolean {
  let fd: number;
  try {
    fd = openSync(path, constants.O_WRONLY | constants.O_NONBLOCK);
  } catch (err) {
    if (['ENXIO', 'ENOENT'].includes(String((err as NodeJS.ErrnoException).code))) return false;
    throw err;
  }
  closeSync(fd);
  return true;
}

/**
 * Opens and closes the FIFO's reader end, which lets a writer blocked in open() go on (its writes
 * then fail: EPIPE). Non-blocking, so it never waits itself; false when the FIFO is gone.
 */
export function releaseBlockedWriter(path: string): boolean {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
  closeSync(fd);
  return true;
}

/** Points the symlink `link` at `target` with one rename, as the kubelet swaps `..data`. */
export function repoint(link: string, target: string): void {
  symlinkSync(target, `${link}.tmp`);
  renameSync(`${link}.tmp`, link);
}

/**
 * Starts the service (without nvidia-smi) on the token file `<dir>/token`: a symlink to `good`, which
 * holds `token`, beside a FIFO `fifo` that `repoint` can point it at. The FIFO is released at
 * teardown, so that no read stays blocked in open(). `env` adds to the server's environment.
 */
export async function startWithTokenFile(
  t: Test,
  dir: string,
  token: string,
  env: Record<string, string> = {},
): Promise<{ server: RunningServer; path: string }> {
  const path = join(dir, 'token');
  const fifo = join(dir, 'fifo');
  writeFileSync(join(dir, 'good'), `${token}\n`);
  repoint(path, 'good');
  mkfifo(fifo);
  t.teardown(() => void releaseFifo(fifo));
  const server = await startServer(t, { NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi', NODECOMPUTE_STATE_FILE: join(dir, 's.json'), NODECOMPUTE_TOKEN_FILE: path, ...env });
  return { server, path };
}

/** The server's warning that a read of its token file did not answer (auth.ts). */
export const isStuckReadWarning = (entry: Record<string, unknown>): boolean =>
  entry.level === 40 && String(entry.msg).includes('did not answer within 1000 ms');
