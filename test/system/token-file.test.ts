// The token file's reader against real files: it reads a file only when its identity changed, takes
// a content only when the file stayed the same while it was read, and answers within its bound even
// when the file never answers (a FIFO without a writer stands in for a hung network mount: open()
// waits for a writer, as a read on a dead NFS server waits for the server), listing the read that
// is stuck meanwhile.
import { renameSync, symlinkSync, truncateSync, utimesSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { createTokenFileReader, type TokenFileLook } from '../../src/system/token-file.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { blockedOpeningFifo, fifoTestdir, releaseFifo, repoint } from '../helpers/fifo.js';

const A = 'token-a-0123456789abcdef\n';
const B = 'token-b-0123456789abcdef\n';
const LONG_AGO = 1_700_000_000;

t.test('a file is read when its identity changes, and only then', async (t) => {
  const dir = t.testdir({ '..v1': { token: A }, '..v2': { token: `${A}${B}` } });
  symlinkSync('..v1', join(dir, '..data'));
  symlinkSync('..data/token', join(dir, 'token'));
  const reader = createTokenFileReader(join(dir, 'token'));
  t.equal(reader.path, join(dir, 'token'));
  t.same(await reader.look(), { kind: 'read', text: A });
  t.same(await reader.look(), { kind: 'unchanged' });

  repoint(join(dir, '..data'), '..v2');
  t.same(await reader.look(), { kind: 'read', text: `${A}${B}` }, 'a kubelet swap of ..data (symlinks followed)');

  const inPlace = join(dir, '..v2', 'token');
  utimesSync(inPlace, LONG_AGO, LONG_AGO);
  t.same(await reader.look(), { kind: 'read', text: `${A}${B}` }, 'an mtime changed is a change');
  writeFileSync(inPlace, B);
  utimesSync(inPlace, LONG_AGO, LONG_AGO);
  t.same(await reader.look(), { kind: 'read', text: B }, 'rewritten in place: another size');
  writeFileSync(inPlace, A);
  utimesSync(inPlace, LONG_AGO, LONG_AGO);
  t.same(await reader.look(), { kind: 'unchanged' }, 'same inode, size and mtime: not read (only a read could tell)');
});

t.test('a failed look is not remembered: the file is read again even if it comes back unchanged', async (t) => {
  const dir = t.testdir({ token: A });
  const path = join(dir, 'token');
  const reader = createTokenFileReader(path);
  t.same(await reader.look(), { kind: 'read', text: A });
  renameSync(path, join(dir, 'away'));
  const failed = await reader.look();
  t.equal(failed.kind, 'failed');
  t.match((failed as Extract<TokenFileLook, { kind: 'failed' }>).err, { code: 'ENOENT' });
  renameSync(join(dir, 'away'), path);
  t.same(await reader.look(), { kind: 'read', text: A }, 'same inode, size and mtime as before, read again');
  t.same(await reader.look(), { kind: 'unchanged' });
});

t.test('a file rewritten in place between the stat and the read is not taken; the next look reads the finished file', async (t) => {
  const dir = t.testdir({ token: A });
  const path = join(dir, 'token');
  // An mtime of long ago: the rewrite changes it even within one tick of the filesystem's clock.
  utimesSync(path, LONG_AGO, LONG_AGO);
  let rewrites = 0;
  const reader = createTokenFileReader(path, {
    beforeRead: () => {
      // The first step of an in-place rewrite of A into "B + A": truncated, then B written.
      if (rewrites++ === 0) writeFileSync(path, B);
    },
  });
  t.same(await reader.look(), { kind: 'unstable', detail: 'it changed while it was read' }, 'B alone would have replaced A');
  writeFileSync(path, `${B}${A}`);
  t.same(await reader.look(), { kind: 'read', text: `${B}${A}` });
  t.equal(rewrites, 2);
});

t.test('a file that is truncated between the stat and the read is not taken either', async (t) => {
  const dir = t.testdir({ token: A });
  const path = join(dir, 'token');
  const reader = createTokenFileReader(path, { beforeRead: () => truncateSync(path, 0) });
  t.same(await reader.look(), { kind: 'unstable', detail: 'it changed while it was read' });
});

t.test('as many bytes must be read as the size says: a /proc file (size 0, yet a token-like text) is never taken', async (t) => {
  const dir = t.testdir({});
  symlinkSync('/proc/sys/kernel/random/boot_id', join(dir, 'token'));
  const reader = createTokenFileReader(join(dir, 'token'));
  const expected = { kind: 'unstable', detail: '37 bytes were read from it, but its size says 0' };
  t.same(await reader.look(), expected);
  t.same(await reader.look(), expected, 'and at every look: nothing was taken');
});

t.test('concurrent looks share one read', async (t) => {
  const dir = t.testdir({ token: A });
  let reads = 0;
  const reader = createTokenFileReader(join(dir, 'token'), { beforeRead: () => void reads++ });
  const first = reader.look();
  t.equal(reader.look(), first, 'the same answer');
  t.same(await first, { kind: 'read', text: A });
  t.equal(reads, 1);
});

t.test('a file that does not answer: late within the bound, no second read while the first is pending, and it is read again once it answers', async (t) => {
  const { dir, fifo: makeFifo } = fifoTestdir(t, { token: A });
  const fifo = makeFifo('fifo');
  const path = join(dir, 'current');
  symlinkSync('fifo', path);
  let reads = 0;
  const reader = createTokenFileReader(path, { timeoutMs: 200, beforeRead: () => void reads++ });

  const first = reader.look();
  t.equal(reader.look(), first, 'a look while the first is within its bound shares it');
  t.same(await first, { kind: 'late', timeoutMs: 200 });
  await waitUntil(() => reads === 1, { what: 'the read to reach open()' });
  // Each of these would block a threadpool thread if it started a read: 6 > libuv's 4 threads.
  for (let i = 0; i < 6; i += 1) t.same(await reader.look(), { kind: 'late', timeoutMs: 200 });
  t.equal(await readFile(join(dir, 'token'), 'utf8'), A, 'other file operations of the process still run');
  t.equal(reads, 1, 'no second read was started');

  // The hung read returns (once it waits in open(): the writer end opens only then), and the file
  // is fixed: the link points at a regular file again.
  await waitUntil(() => releaseFifo(fifo), { what: 'the read to wait in open() on the FIFO' });
  repoint(path, 'token');
  let look: TokenFileLook = { kind: 'late', timeoutMs: 200 };
  while (look.kind === 'late') {
    look = await reader.look();
    if (look.kind === 'late') await new Promise((resolve) => setTimeout(resolve, 20));
  }
  t.same(look, { kind: 'read', text: A }, "the late read's own result (the FIFO's end of file) was dropped; the file is read afresh");
  t.notOk(blockedOpeningFifo(process.pid), 'no read is pending any more');
});
