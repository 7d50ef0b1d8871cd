// The registry and its state file: loading (missing, corrupt, wrong shape, unreadable), group commit,
// refused writes that lose nothing, and engine output kept per shard.
import { mkdirSync, readdirSync, readFileSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { loadRegistry } from '../../src/shards/registry.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import { createStateFile, LEFTOVER_AGE_MS, type StateFile } from '../../src/system/state-file.js';

const log = pino({ level: 'silent' });

function record(id: string, engine: ShardRecord['engine'] = 'other'): ShardRecord {
  return { id, pid: 42, cgroup: null, gpus: [0], engine, graceMs: 1000, registeredAt: 1, identity: { pid: 42, pgid: 42, startTime: 7, name: 'x' } };
}

/** Counts writes, and fails them while `failing` is set. */
function instrumented(file: StateFile) {
  const counter = { writes: 0, failing: false };
  const wrapped: StateFile = {
    ...file,
    path: file.path,
    write: async (text) => {
      counter.writes += 1;
      if (counter.failing) throw Object.assign(new Error('EROFS: read-only file system'), { code: 'EROFS' });
      return file.write(text);
    },
  };
  return { wrapped, counter };
}

t.test('a missing file is an empty registry; writes create it, durable and parseable', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'deep', 'shards.json');
  const registry = await loadRegistry({ stateFile: createStateFile(path, { log }), log });
  t.same(registry.list(), []);
  t.same(await registry.put(record('a')), { created: true });
  t.same(await registry.put(record('a')), { created: false });
  const state = JSON.parse(readFileSync(path, 'utf8'));
  t.equal(state.format, 'nodecompute-shards/v1');
  t.same(state.shards.map((s: ShardRecord) => s.id), ['a']);
  t.same(readdirSync(join(dir, 'deep')), ['shards.json'], 'no temp file left behind');
  const again = await loadRegistry({ stateFile: createStateFile(path, { log }), log });
  t.same(again.get('a'), record('a'));
  t.same(again.interest(), { pids: [42], cgroups: [] });
});

t.test('a corrupt, foreign or unreadable state file stops the load, naming it, and is left untouched', async (t) => {
  const dir = t.testdir({ 'torn.json': '{"format": "nodecompute-shards/v1", "sha', 'other.json': '{"shards": 3}', 'dir.json': {} });
  for (const [file, message] of [
    ['torn.json', /torn\.json is not valid JSON .*left untouched/],
    ['other.json', /other\.json is not a nodecompute shard registry: \/format/],
    ['dir.json', /Cannot read the state file .*dir\.json: EISDIR/],
  ] as const) {
    await t.rejects(loadRegistry({ stateFile: createStateFile(join(dir, file), { log }), log }), { code: 'NODECOMPUTE_STATE_FILE_INVALID', message }, file);
  }
  t.equal(readFileSync(join(dir, 'torn.json'), 'utf8'), '{"format": "nodecompute-shards/v1", "sha');
});

t.test('concurrent changes are group-committed, and a failed write refuses the batch and loses nothing', async (t) => {
  const dir = t.testdir({});
  const { wrapped, counter } = instrumented(createStateFile(join(dir, 'shards.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  await Promise.all(Array.from({ length: 50 }, (_, i) => registry.put(record(`s${i}`))));
  t.equal(registry.list().length, 50);
  t.ok(counter.writes <= 3, `50 concurrent registrations took ${counter.writes} writes`);
  const version = registry.version;

  counter.failing = true;
  await t.rejects(registry.put(record('lost')), { code: 'NODECOMPUTE_STATE_WRITE_FAILED', message: /The change was not stored: .*EROFS.*Nothing already registered was lost/ });
  await t.rejects(registry.remove('s1'), { code: 'NODECOMPUTE_STATE_WRITE_FAILED' });
  t.equal(registry.get('lost'), undefined, 'not acknowledged, not kept');
  t.ok(registry.get('s1'), 'a refused removal keeps the shard');
  t.equal(registry.version, version);
  counter.failing = false;
  t.equal(await registry.remove('s1'), true);
  const writes = counter.writes;
  t.equal(await registry.remove('never-registered'), false);
  t.equal(counter.writes, writes, 'removing an unknown id writes nothing');
});

t.test('removing an unknown id while a write fails: not registered (false), not a failed write', async (t) => {
  const dir = t.testdir({});
  const { wrapped, counter } = instrumented(createStateFile(join(dir, 'shards.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  await registry.put(record('kept'));
  counter.failing = true;
  // Every write fails now: the registration is refused, and the removals ride refused batches too.
  const lost = registry.put(record('new'));
  const outcomes = await Promise.allSettled([lost, registry.remove('never-registered'), registry.remove('new'), registry.remove('kept')]);
  t.match(outcomes[0], { status: 'rejected', reason: { code: 'NODECOMPUTE_STATE_WRITE_FAILED' } });
  t.same(outcomes[1], { status: 'fulfilled', value: false }, 'an id that was never registered is not registered');
  t.same(outcomes[2], { status: 'fulfilled', value: false }, 'its registration was refused, so it is not registered either');
  t.match(outcomes[3], { status: 'rejected', reason: { code: 'NODECOMPUTE_STATE_WRITE_FAILED' } }, 'a registered shard stays, and the removal says it failed');
  t.ok(registry.get('kept'));
  t.equal(registry.get('new'), undefined);
});

t.test('engine output: kept per shard, read only for llama.cpp, cleared by re-registration', async (t) => {
  const dir = t.testdir({});
  const registry = await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log });
  await registry.put(record('llama', 'llama.cpp'));
  await registry.put(record('vllm', 'vllm'));
  t.equal(registry.appendEngineOutput('nope', 'x', 1), undefined);
  const failed = registry.appendEngineOutput('llama', 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n', 2);
  t.equal(failed?.account?.backend, 'CPU');
  const other = registry.appendEngineOutput('vllm', 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n', 3);
  t.equal(other?.account, null, 'only llama.cpp output is understood');
  t.match(other?.tail, 'failed to initialize CUDA');
  await registry.put(record('llama', 'llama.cpp'));
  t.equal(registry.engine('llama'), undefined, 'a new registration starts with no engine output');
  await registry.remove('vllm');
  t.equal(registry.engine('vllm'), undefined);
});

t.test('a directory that cannot be fsynced: the change is stored and acknowledged, with one warning per kind of failure', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'shards.json');
  const lines: Array<Record<string, unknown>> = [];
  const logged = pino({ level: 'debug' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  let failure = { code: 'EINVAL', message: 'EINVAL: invalid argument, fsync' };
  const syncDirectory = async () => {
    throw Object.assign(new Error(failure.message), { code: failure.code });
  };
  const registry = await loadRegistry({ stateFile: createStateFile(path, { log: logged, syncDirectory }), log });
  t.same(await registry.put(record('a')), { created: true });
  t.ok(registry.get('a'), 'served');
  t.same(JSON.parse(readFileSync(path, 'utf8')).shards.map((s: ShardRecord) => s.id), ['a'], 'and in the file');
  t.equal(await registry.remove('a'), true, 'a removal is acknowledged too');
  t.same((await loadRegistry({ stateFile: createStateFile(path, { log }), log })).list(), [], 'the file and the registry agree');
  failure = { code: 'EIO', message: 'EIO: i/o error, fsync' };
  await registry.put(record('b'));
  t.match(
    lines.map((line) => [line.level, line.stateFile, line.msg]),
    [
      [40, path, /was replaced, but the fsync of .* failed \(EINVAL: invalid argument, fsync\): a change is stored .*cannot fsync a directory .*local disk\.$/],
      [20, path, /fsync of .* failed \(EINVAL/],
      [40, path, /fsync of .* failed \(EIO: i\/o error, fsync\): .*Check the volume .*dmesg/],
    ],
    'a warning the first time each way, then debug',
  );
});

t.test('reading at start-up removes the temp files of interrupted writes once a minute old, and nothing else', async (t) => {
  const dir = t.testdir({
    'shards.json': '{"format": "nodecompute-shards/v1", "shards": []}',
    '.shards.json.4242.7.tmp': '{"torn',
    '.shards.json.4242.probe': '',
    '.shards.json.4243.1.tmp': '{"in flight',
    '.shards.json.bak': 'an operator copy',
    'other.4242.1.tmp': 'not ours',
  });
  const old = (Date.now() - LEFTOVER_AGE_MS - 1_000) / 1000;
  for (const name of ['.shards.json.4242.7.tmp', '.shards.json.4242.probe', '.shards.json.bak', 'other.4242.1.tmp']) utimesSync(join(dir, name), old, old);
  // A leftover that cannot be looked at (a dangling link) is reported and skipped.
  symlinkSync(join(dir, 'nowhere'), join(dir, '.shards.json.4244.2.tmp'));
  const lines: Array<{ level: number; msg: string; removed?: string[] }> = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const file = createStateFile(join(dir, 'shards.json'), { log: logger });
  t.match(await file.read(), /nodecompute-shards/);
  t.same(
    readdirSync(dir).sort(),
    ['.shards.json.4243.1.tmp', '.shards.json.4244.2.tmp', '.shards.json.bak', 'other.4242.1.tmp', 'shards.json'],
    'the old temp and probe files are gone; a fresh one (a writer may own it) and other files stay',
  );
  t.match(lines, [
    { level: 40, msg: /Could not remove .*\.shards\.json\.4244\.2\.tmp, a temp file an interrupted write of the state file left behind/ },
    { level: 30, removed: ['.shards.json.4242.7.tmp', '.shards.json.4242.probe'], msg: /Removed 2 temp file\(s\) that an interrupted write/ },
  ]);
  t.equal(await createStateFile(join(dir, 'missing', 'shards.json'), { log }).read(), null, 'no directory yet: nothing to sweep, no file');
});

t.test('the state file: a failed replace leaves no temp file; checkWritable says why not, or what is at risk', async (t) => {
  const dir = t.testdir({ 'is-a-dir': { keep: 'x' }, file: 'plain' });
  const blocked = createStateFile(join(dir, 'is-a-dir'), { log });
  await t.rejects(blocked.write('{}'), { code: 'EISDIR' });
  t.same(readdirSync(dir).sort(), ['file', 'is-a-dir'], 'the temp file was removed');
  t.same(await createStateFile(join(dir, 'file', 'x.json'), { log }).checkWritable(), { ok: false, reason: `cannot write in ${join(dir, 'file')}: EEXIST: file already exists, mkdir '${join(dir, 'file')}'` });
  mkdirSync(join(dir, 'ok'));
  writeFileSync(join(dir, 'ok', 'x.json'), '');
  t.same(await createStateFile(join(dir, 'ok', 'x.json'), { log }).checkWritable(), { ok: true, warning: null });
  const syncDirectory = async () => {
    throw Object.assign(new Error('EINVAL: invalid argument, fsync'), { code: 'EINVAL' });
  };
  t.same(await createStateFile(join(dir, 'ok', 'x.json'), { log, syncDirectory }).checkWritable(), {
    ok: true,
    warning: {
      problem: `fsync of ${join(dir, 'ok')} failed (EINVAL: invalid argument, fsync): a change is stored and served, yet a power cut right after it could bring back the previous file.`,
      fix: 'This filesystem cannot fsync a directory (some FUSE and network filesystems): put NODECOMPUTE_STATE_FILE on a local disk.',
    },
  }, 'a directory that cannot be fsynced still takes writes: a warning');
});
