// Owns the tests' stand-ins for a token file on a hung mount: a FIFO (open() on one with no writer
// blocks, as a read on a hung network filesystem does) and the kubelet's symlink swap.
import { spawnSync } from 'node:child_process';
import { closeSync, constants, openSync, renameSync, symlinkSync } from 'node:fs';

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
