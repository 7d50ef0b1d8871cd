// Owns the tests' stand-ins for a token file on a hung mount: a FIFO (open() on one with no writer
// blocks, as a read on a hung network filesystem does), the kubelet's symlink swap, and a running
// server brought to a stuck read of its token file.
import { spawnSync } from 'node:child_process';
import { closeSync, constants, openSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Test } from 'tap';
import { startServer, type RunningServer } from './server.js';

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

/** Points the symlink `link` at `target` with one rename, as the kubelet swaps `..data`. */
export function repoint(link: string, target: string): void {
  symlinkSync(target, `${link}.tmp`);
  renameSync(`${link}.tmp`, link);
}

/**
 * Starts the service (without nvidia-smi) on the token file `<dir>/token`: a symlink to `good`, which
 * holds `token`, beside a FIFO `fifo` that hangTokenFile can point it at. The FIFO is released at
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

/**
 * Points the token file `link` of a server started by startWithTokenFile at its FIFO, then writes
 * with `token` every 100 ms until the server warns that its read of the file is stuck (it looks at
 * the file at most once a second, on a write), or `timeoutMs` passes. Answers the statuses of those
 * writes.
 */
export async function hangTokenFile(server: RunningServer, link: string, token: string, timeoutMs: number): Promise<number[]> {
  repoint(link, 'fifo');
  const statuses: number[] = [];
  const giveUpAt = Date.now() + timeoutMs;
  while (!server.logs().some(isStuckReadWarning) && Date.now() < giveUpAt) {
    statuses.push((await server.fetch('/shards/none', { method: 'DELETE', headers: { authorization: `Bearer ${token}` } })).status);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return statuses;
}
