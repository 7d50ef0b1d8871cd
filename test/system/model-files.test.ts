// A process's model files from its /proc text (parseMappedFiles, modelArgument) and through the
// reader over a fixture proc root: GGUF magic decides, a deleted file counts by its name, the command
// line is the fallback, what cannot be read says why. Real processes: test/routes/weights.test.ts.
import { closeSync, mkdirSync, openSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { fifoTestdir } from '../helpers/fifo.js';
import { ggufHeader } from '../helpers/gguf.js';
import { createModelFileReader, gpuLayersArgument, mapsUnreadable, modelArgument, modelVariable, namedLikeModel, parseCmdline, parseMappedFiles, splitsOf } from '../../src/system/model-files.js';

const BLOB = `/root/.ollama/models/blobs/sha256-${'ab'.repeat(32)}`;

// As a llama-server's maps reads: its code, a library's data, the model in two ranges, anonymous memory, a device.
const MAPS = [
  '55d0c0a00000-55d0c0b00000 r-xp 00000000 fe:00 100 /usr/bin/llama-server',
  '7f0000000000-7f0000100000 r--p 00020000 fe:00 101 /usr/lib/libggml-cpu.so',
  '7f1000000000-7f1040000000 r--s 00000000 fe:00 200 /models/my model.gguf',
  '7f2000000000-7f2000200000 r--s 40200000 fe:00 200 /models/my model.gguf',
  '7f3000000000-7f3000001000 rw-p 00000000 00:00 0 ',
  '7f4000000000-7f4000001000 rw-s 00000000 00:05 300 /dev/nvidia0',
  '7f5000000000-7f5000400000 r--s 00000000 00:01 301 /memfd:cuda (deleted)',
  `7f6000000000-7f6001000000 r--s 00000000 fe:00 400 ${BLOB} (deleted)`,
  '7f6100000000-7f6100100000 r--s 00000000 00:1a 410 /dev/shm/staged.gguf',
  '7f6200000000-7f6200100000 r--s 00000000 fe:00 420 /devdata/q.gguf',
  '7f6300000000-7f6300001000 r--s 00000000 00:05 430 /dev/dri/card0',
  '7f6400000000-7f6400001000 r--s 00000000 00:01 440 /SYSV00000000 (deleted)',
  '7f7000000000-7f7000001000 ---p 00000000 fe:00 500 /models/guard.gguf',
  'not a maps line',
].join('\n');

t.test('parseMappedFiles: read-only file mappings, code, anonymous memory and devices left out (not /dev/shm), ranges of a file summed', async (t) => {
  t.same(parseMappedFiles(MAPS), [
    { path: '/usr/lib/libggml-cpu.so', deleted: false, device: 'fe:00', inode: '101', mappedBytes: 0x100000 },
    { path: '/models/my model.gguf', deleted: false, device: 'fe:00', inode: '200', mappedBytes: 0x40000000 + 0x200000 },
    { path: BLOB, deleted: true, device: 'fe:00', inode: '400', mappedBytes: 0x1000000 },
    { path: '/dev/shm/staged.gguf', deleted: false, device: '00:1a', inode: '410', mappedBytes: 0x100000 },
    { path: '/devdata/q.gguf', deleted: false, device: 'fe:00', inode: '420', mappedBytes: 0x100000 },
  ]);
});

t.test('modelArgument: -m, --model and --model= name the model; a flag with no value does not', async (t) => {
  t.equal(modelArgument(['llama-server', '-m', '/m.gguf', '-ngl', '99']), '/m.gguf');
  t.equal(modelArgument(['ollama', 'runner', '--model', BLOB]), BLOB);
  t.equal(modelArgument(['llama-server', '--model=/m.gguf']), '/m.gguf');
  t.equal(modelArgument(['llama-server', '-m']), null);
  t.equal(modelArgument(['llama-server', '-m', '', '--model=']), null);
  t.equal(modelArgument(['python3', '-m', 'vllm.entrypoints.openai.api_server']), 'vllm.entrypoints.openai.api_server', 'a Python module: probed, then found no GGUF');
  t.same(parseCmdline(Buffer.from('llama-server\0-m\0/m.gguf\0')), ['llama-server', '-m', '/m.gguf']);
  t.same(parseCmdline(Buffer.from('kthreadd')), ['kthreadd']);
  t.ok(namedLikeModel('/models/X.GGUF'));
  t.ok(namedLikeModel(BLOB));
  t.notOk(namedLikeModel('/models/x.bin'));
});

const GGUF = Buffer.from([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0]);

t.test('the reader: GGUF magic through the process root, cached per file; the command line as fallback', async (t) => {
  const root = t.testdir({});
  const proc = (pid: number, maps: string, cmdline = 'llama-server\0') => {
    mkdirSync(join(root, String(pid), 'root', 'models'), { recursive: true });
    mkdirSync(join(root, String(pid), 'cwd', 'models'), { recursive: true });
    writeFileSync(join(root, String(pid), 'maps'), maps);
    writeFileSync(join(root, String(pid), 'cmdline'), cmdline);
  };
  const line = (path: string, inode: number, suffix = '') => `7f1000000000-7f1040000000 r--s 00000000 fe:00 ${inode} ${path}${suffix}\n`;
  proc(10, line('/models/a.gguf', 1) + line('/models/notes.bin', 2) + line('/models/short', 3) + line('/models/gone.gguf', 4, ' (deleted)') + line('/data/old.bin', 5, ' (deleted)'));
  writeFileSync(join(root, '10', 'root', 'models', 'a.gguf'), GGUF);
  writeFileSync(join(root, '10', 'root', 'models', 'notes.bin'), 'plain text');
  writeFileSync(join(root, '10', 'root', 'models', 'short'), 'GG');
  const reader = createModelFileReader(`${root}/`);
  const forgetful = createModelFileReader(root, { probedMax: 1 });
  await forgetful.read(10);
  const first = await reader.read(10);
  t.same(first, {
    files: [
      { path: '/models/a.gguf', deleted: false, bytes: GGUF.length, mappedBytes: 0x40000000, seenIn: 'mapping', layers: null },
      { path: '/models/gone.gguf', deleted: true, bytes: null, mappedBytes: 0x40000000, seenIn: 'mapping', layers: null },
    ],
    unreadable: null,
  });
  rmSync(join(root, '10', 'root', 'models', 'a.gguf'));
  t.same((await reader.read(10))?.files.map((file) => file.bytes), [GGUF.length, null], 'a file probed once is not opened again');
  t.same((await forgetful.read(10))?.files.map((file) => file.bytes), [null, null], 'past its bound the memory starts again: opened afresh, now gone');

  // No model mapped: the command line's, relative to the process's working directory.
  proc(11, '', 'llama-server\0--no-mmap\0-m\0models/b.gguf\0');
  writeFileSync(join(root, '11', 'cwd', 'models', 'b.gguf'), GGUF);
  t.same((await reader.read(11))?.files, [{ path: 'models/b.gguf', deleted: false, bytes: GGUF.length, mappedBytes: null, seenIn: 'command-line', layers: null }]);
  proc(12, '', 'llama-server\0-m\0/models/missing.gguf\0');
  t.same((await reader.read(12))?.files, [{ path: '/models/missing.gguf', deleted: false, bytes: null, mappedBytes: null, seenIn: 'command-line', layers: null }], 'not openable: its name says model');
  // llama.cpp's own variable for -m, as its container images are often configured; an argument wins.
  proc(15, '', 'llama-server\0--no-mmap\0');
  writeFileSync(join(root, '15', 'environ'), 'PATH=/bin\0LLAMA_ARG_MODEL=/models/env.gguf\0');
  writeFileSync(join(root, '15', 'root', 'models', 'env.gguf'), GGUF);
  t.same((await reader.read(15))?.files.map((file) => [file.path, file.seenIn]), [['/models/env.gguf', 'command-line']]);
  proc(16, '', 'llama-server\0-m\0/models/arg.gguf\0');
  writeFileSync(join(root, '16', 'environ'), 'LLAMA_ARG_MODEL=/models/env.gguf\0');
  t.same((await reader.read(16))?.files.map((file) => file.path), ['/models/arg.gguf']);
  t.equal(modelVariable(['/app/llama-server'], ['LLAMA_ARG_MODEL=']), null, 'an empty value names nothing');
  t.equal(modelVariable(['tini', '--', '/app/llama-server'], ['LLAMA_ARG_MODEL=/m.gguf']), null, 'a wrapper inherits it and loads nothing');
  t.equal(modelVariable(['/app/llama-server'], ['LLAMA_ARG_MODEL=/m.gguf']), '/m.gguf');
  t.equal(modelVariable([], ['LLAMA_ARG_MODEL=/m.gguf']), null, 'an empty command line (a kernel thread, a zombie)');
  // The GPU layers asked: an argument (the last one), else llama.cpp's variable for a llama-* program.
  proc(17, '', 'llama-server\0-m\0/models/arg.gguf\0-ngl\x0099\0--n-gpu-layers\0auto\0');
  writeFileSync(join(root, '17', 'environ'), 'LLAMA_ARG_N_GPU_LAYERS=0\0');
  t.equal((await reader.read(17))?.gpuLayers, 'auto');
  proc(18, line('/models/a.gguf', 1), '/app/llama-server\0');
  writeFileSync(join(root, '18', 'environ'), 'LLAMA_ARG_N_GPU_LAYERS=0\0');
  t.match(await reader.read(18), { files: [{ path: '/models/a.gguf' }], gpuLayers: '0' }, 'with a model mapped too');
  proc(19, '', 'sh\0-c\0llama-server -ngl 0\0');
  writeFileSync(join(root, '19', 'environ'), 'LLAMA_ARG_N_GPU_LAYERS=0\0');
  t.same(await reader.read(19), { files: [], unreadable: null }, 'a wrapper: neither its argument nor the variable');
  t.equal(gpuLayersArgument(['ollama_llama_server', '--model', '/b', '--n-gpu-layers', '33']), '33', "Ollama's runner to 0.11.4");
  t.equal(gpuLayersArgument(['llama-server', '--gpu-layers', 'all']), 'all');
  t.equal(gpuLayersArgument(['llama-server', '-ngl']), null, 'a flag without its value');
  t.equal(gpuLayersArgument(['llama-server', '-ngl', '']), null, 'an empty value');
  // Gone between its maps and its command line: as one gone before (no answer), not one with no model.
  proc(20, line('/models/a.gguf', 1));
  rmSync(join(root, '20', 'cmdline'));
  t.equal(await reader.read(20), null);
  // A command line it may not read (a directory stands in for hidepid's EACCES): the maps' files still count.
  proc(21, line('/models/a.gguf', 1));
  rmSync(join(root, '21', 'cmdline'));
  mkdirSync(join(root, '21', 'cmdline'));
  t.same((await reader.read(21))?.files.map((file) => file.path), ['/models/a.gguf']);
  // The model's layers from its header, mapped or named (test/system/gguf-header.test.ts reads the header's every case).
  const header = ggufHeader([['general.architecture', { string: 'llama' }], ['llama.block_count', { u32: 32 }]]);
  proc(22, line('/models/llama.gguf', 22), 'llama-server\0-m\0/models/llama.gguf\0');
  writeFileSync(join(root, '22', 'root', 'models', 'llama.gguf'), header);
  proc(23, '', 'llama-server\0--no-mmap\0-m\0/models/llama.gguf\0');
  writeFileSync(join(root, '23', 'root', 'models', 'llama.gguf'), header);
  // A file named on the command line is opened at every refresh, its header read once per version of the file.
  const named = join(root, '23', 'root', 'models', 'llama.gguf');
  const mtime = new Date('2026-01-01T00:00:00Z');
  utimesSync(named, mtime, mtime);
  for (const pid of [22, 23]) t.match(await reader.read(pid), { files: [{ path: '/models/llama.gguf', layers: 33 }] }, `${pid}: 32 blocks and the output layer`);
  t.match(await reader.read(23), { files: [{ layers: 33 }] }, 'unchanged: as read before');
  writeFileSync(named, ggufHeader([['general.architecture', { string: 'llama' }], ['llama.block_count', { u32: 48 }]]));
  utimesSync(named, mtime, mtime);
  t.match(await reader.read(23), { files: [{ layers: 49 }] }, 'rewritten at the same size, its time set back: its change time says it is another version');
  proc(13, '', 'python3\0-m\0vllm.entrypoints.openai.api_server\0');
  t.same(await reader.read(13), { files: [], unreadable: null });
  proc(14, '');
  t.same(await reader.read(14), { files: [], unreadable: null });
});

t.test('a model in splits: its other splits are found beside the one seen, mapped or named', async (t) => {
  t.same(splitsOf('/m/big-00002-of-00003.gguf'), ['/m/big-00001-of-00003.gguf', '/m/big-00002-of-00003.gguf', '/m/big-00003-of-00003.gguf']);
  t.same(splitsOf('/m/big.gguf'), []);
  const split = (n: number) => `/models/big-0000${n}-of-00003.gguf`;
  const root = t.testdir({});
  for (const pid of [40, 41]) mkdirSync(join(root, String(pid), 'root', 'models'), { recursive: true });
  // 40 maps the first and last splits (the middle one went to a GPU whole); 41 ran with --no-mmap.
  writeFileSync(join(root, '40', 'maps'), [1, 3].map((n) => `7f1000000000-7f1040000000 r--s 00000000 fe:00 ${n} ${split(n)}\n`).join(''));
  writeFileSync(join(root, '40', 'cmdline'), `llama-server\0-m\0${split(1)}\0`);
  writeFileSync(join(root, '41', 'maps'), '');
  writeFileSync(join(root, '41', 'cmdline'), `llama-server\0--no-mmap\0-m\0${split(1)}\0`);
  for (const n of [1, 2, 3]) writeFileSync(join(root, '40', 'root', split(n)), GGUF);
  writeFileSync(join(root, '41', 'root', split(1)), GGUF);
  writeFileSync(join(root, '41', 'root', split(2)), 'not GGUF');
  const reader = createModelFileReader(root);
  t.same(
    (await reader.read(40))?.files.map((file) => [file.path, file.mappedBytes, file.seenIn]),
    [[split(1), 0x40000000, 'mapping'], [split(3), 0x40000000, 'mapping'], [split(2), 0, 'mapping']],
    'the unmapped split: nothing of it in host memory',
  );
  t.same(
    (await reader.read(41))?.files.map((file) => [file.path, file.bytes, file.mappedBytes]),
    [[split(1), GGUF.length, null], [split(3), null, null]],
    'named on the command line; a file that is no GGUF is no split, one that cannot be opened counts with its size unknown',
  );
});

t.test('the reader: a gone process reads null; maps that cannot be read say why', async (t) => {
  const root = t.testdir({ '20': { maps: {} } });
  const reader = createModelFileReader(root);
  t.equal(await reader.read(99), null);
  const unreadable = await reader.read(20);
  t.match(unreadable, { files: [], unreadable: /reading \/proc\/20\/maps failed \(EISDIR\)/ });
  const denied = Object.assign(new Error('permission denied'), { code: 'EACCES' });
  t.match(mapsUnreadable(7, denied), /CAP_SYS_PTRACE/);
  t.equal(mapsUnreadable(7, Object.assign(new Error('gone'), { code: 'ESRCH' })), null);
  t.match(mapsUnreadable(7, new Error('odd')), /failed \(odd\)/);
});

t.test('the reader: a read that does not answer (a hung mount) is answered at its deadline, and not started again until it answers', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  for (const pid of ['30', '31', '32']) {
    mkdirSync(join(dir, pid));
    writeFileSync(join(dir, pid, 'cmdline'), 'llama-server\0');
  }
  writeFileSync(join(dir, '32', 'maps'), '');
  const hung = [fifo('30/maps'), fifo('31/maps')];
  const reader = createModelFileReader(dir, { deadlineMs: 50 });
  t.match(await reader.read(30), { files: [], unreadable: /did not answer within 50 ms/ });
  t.match(await reader.read(30), { unreadable: /has not answered yet/ }, 'no second read while the first hangs');
  t.match(await reader.read(31), { unreadable: /did not answer/ });
  t.match(await reader.read(32), { unreadable: /not read: 2 reads of other processes' maps have not answered/ }, 'two stuck reads: no more are started');
  for (const path of hung) closeSync(openSync(path, 'w'));
  // Released, the stuck reads end: reads start again.
  let after = await reader.read(32);
  for (let i = 0; i < 200 && after?.unreadable !== null; i += 1) {
    await new Promise((resolve) => setTimeout(resolve, 10));
    after = await reader.read(32);
  }
  t.same(after, { files: [], unreadable: null });
});

