// The registry and its state file: loading (missing, corrupt, wrong shape, unreadable), group commit,
// refused writes that lose nothing, and engine output kept per shard.
import { mkdirSync, readdirSync, readFileSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { pino } from 'pino';
import { readRegistryFile } from '../../src/shards/registry-file.js';
import { loadRegistry } from '../../src/shards/registry.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import { createStateFile, LEFTOVER_AGE_MS, type StateFile } from '../../src/system/state-file.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';

const log = pino({ level: 'silent' });

function record(id: string, engine: ShardRecord['engine'] = 'other', pid = 42): ShardRecord {
  return { id, pid, cgroup: null, gpus: [0], engine, graceMs: 1000, registeredAt: 1, identity: { pid, pgid: pid, startTime: 7, name: 'x' } };
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
  t.match(await registry.put(record('a')), { created: true, shard: record('a'), graceKept: false, unchanged: false });
  t.match(await registry.put(record('a')), { created: false, graceKept: true, unchanged: true });
  const state = JSON.parse(readFileSync(path, 'utf8'));
  t.equal(state.format, 'nodecompute-shards/v1');
  t.same(state.shards.map((s: ShardRecord) => s.id), ['a']);
  t.same(readdirSync(join(dir, 'deep')), ['shards.json'], 'no temp file left behind');
  const again = await loadRegistry({ stateFile: createStateFile(path, { log }), log });
  t.same(again.get('a'), record('a'));
  t.same(again.interest(null), { pids: [42], cgroups: [], runnerHosts: [] });
});

t.test('interest: the PIDs of shards of this boot or of no known boot, and every cgroup; not the PIDs of another boot', async (t) => {
  const registry = await loadRegistry({ stateFile: createStateFile(join(t.testdir({}), 's.json'), { log }), log });
  const ofBoot = (id: string, pid: number, bootId?: string, engine: ShardRecord['engine'] = 'other'): ShardRecord => {
    const plain = record(id, engine, pid);
    return bootId === undefined ? plain : { ...plain, identity: { ...plain.identity, bootId } };
  };
  await registry.put(ofBoot('now', 10, 'boot-now'));
  await registry.put(ofBoot('before', 11, 'boot-before', 'ollama'));
  await registry.put(ofBoot('unknown', 12, undefined, 'ollama'));
  await registry.put({ ...ofBoot('pod', 13, 'boot-before'), pid: null, cgroup: 'pod-uid' });
  await registry.put({ ...ofBoot('ollama-pod', 14, 'boot-before', 'ollama'), pid: null, cgroup: 'ollama-uid' });
  t.same(
    registry.interest('boot-now'),
    { pids: [10, 12], cgroups: ['pod-uid', 'ollama-uid'], runnerHosts: [{ pid: 12 }, { cgroup: 'ollama-uid' }] },
    "a pod carries on across a restart: its cgroup is still read; Ollama's runners are looked for where it is",
  );
  t.same(registry.interest(null).pids, [10, 11, 12], 'with no boot to go by, every PID');
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
  await Promise.all(Array.from({ length: 50 }, (_, i) => registry.put(record(`s${i}`, 'other', 1000 + i))));
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

t.test('a precondition is judged when the change is decided: of queued create-only puts of one id, the first is stored', async (t) => {
  const { wrapped, counter } = instrumented(createStateFile(join(t.testdir({}), 's.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  const absent = (current: ShardRecord | undefined) => (current === undefined ? null : 'registered');
  const results = await Promise.allSettled([1, 2, 3].map((pid) => registry.put(record('a', 'other', pid), undefined, undefined, absent)));
  t.same(results.map((result) => result.status), ['fulfilled', 'rejected', 'rejected']);
  t.match(results[1], { reason: { code: 'NODECOMPUTE_PRECONDITION_FAILED', statusCode: 412, message: 'registered' } });
  t.equal(registry.get('a')!.pid, 1);
  // With nothing queued, a refusal by the stored shard is answered at once: no write, even while writes fail.
  const [writes, version] = [counter.writes, registry.version];
  counter.failing = true;
  await t.rejects(registry.put(record('a'), undefined, undefined, absent), { code: 'NODECOMPUTE_PRECONDITION_FAILED' });
  await t.rejects(registry.remove('a', undefined, () => 'kept'), { code: 'NODECOMPUTE_PRECONDITION_FAILED', message: 'kept' });
  t.same([counter.writes, registry.version], [writes, version], 'nothing written');
  counter.failing = false;
  // Queued behind another change: judged against it.
  const [, removal] = await Promise.allSettled([registry.put(record('c', 'other', 11)), registry.remove('c', undefined, absent)]);
  t.match(removal, { status: 'rejected', reason: { statusCode: 412, message: 'registered' } });
  t.ok(registry.get('c'), 'not removed');
  const present = (current: ShardRecord | undefined) => (current === undefined ? 'absent' : null);
  const [first, second] = await Promise.all([registry.remove('a'), registry.remove('a', undefined, present)]);
  t.same([first, second], [true, false], 'removed by the DELETE before it: not registered (404), not 412');
});

t.test('removing an unknown id while a write fails: not registered (false), not a failed write', async (t) => {
  const dir = t.testdir({});
  const { wrapped, counter } = instrumented(createStateFile(join(dir, 'shards.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  await registry.put(record('kept'));
  counter.failing = true;
  // Every write fails now: the registration is refused, and the removals ride refused batches too.
  const lost = registry.put(record('new', 'other', 43));
  const outcomes = await Promise.allSettled([lost, registry.remove('never-registered'), registry.remove('new'), registry.remove('kept')]);
  t.match(outcomes[0], { status: 'rejected', reason: { code: 'NODECOMPUTE_STATE_WRITE_FAILED' } });
  t.same(outcomes[1], { status: 'fulfilled', value: false }, 'an id that was never registered is not registered');
  t.same(outcomes[2], { status: 'fulfilled', value: false }, 'its registration was refused, so it is not registered either');
  t.match(outcomes[3], { status: 'rejected', reason: { code: 'NODECOMPUTE_STATE_WRITE_FAILED' } }, 'a registered shard stays, and the removal says it failed');
  t.ok(registry.get('kept'));
  t.equal(registry.get('new'), undefined);
});

const CUDA_FAILED = 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n';
const CUDA_BUFFER = 'load_tensors:        CUDA0 model buffer size =  4403.49 MiB\n';

t.test('engine output: kept per shard, read only for llama.cpp, cleared by a registration of another process', async (t) => {
  const dir = t.testdir({});
  const registry = await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log });
  await registry.put(record('llama', 'llama.cpp'));
  await registry.put(record('vllm', 'vllm', 43));
  t.equal(registry.appendEngineOutput('nope', 'x', null), undefined);
  const failed = registry.appendEngineOutput('llama', CUDA_FAILED, 900);
  t.equal(failed?.account?.backend, 'CPU');
  t.match(failed, { tailStartedAtTicks: 900 }, 'dated by /proc\'s ticks');
  const other = registry.appendEngineOutput('vllm', CUDA_FAILED, null);
  t.equal(other?.account, null, 'only llama.cpp output is understood');
  t.match(other?.tail, 'failed to initialize CUDA');
  const fresh = registry.appendEngineOutput('llama', CUDA_BUFFER, 950, true);
  t.same([fresh?.tail, fresh?.account?.backend], [CUDA_BUFFER, 'CUDA'], 'a fresh tail (an earlier run\'s output dropped)');
  await registry.put({ ...record('llama', 'llama.cpp'), identity: { ...record('x').identity, startTime: 8 } });
  t.equal(registry.engine('llama'), undefined, 'another process behind the same PID starts with no engine output');
  await registry.remove('vllm');
  t.equal(registry.engine('vllm'), undefined);
});

t.test('engine output is one stream of bytes: the start of a cut character is held with the tail, and dropped where the tail is', async (t) => {
  const dir = t.testdir({});
  const registry = await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log });
  const bytes = (text: string) => Buffer.from(text, 'latin1');
  await registry.put(record('s', 'llama.cpp'));
  const held = registry.appendEngineOutput('s', bytes('a \xe2\x82'), 10);
  t.same([held?.tail, held?.pending], ['a ', bytes('\xe2\x82')], 'held, not kept as text');
  const whole = registry.appendEngineOutput('s', bytes('\xac\n'), 11);
  t.same([whole?.tail, whole?.pending.length, whole?.tailStartedAtTicks], ['a €\n', 0, 10]);

  registry.appendEngineOutput('s', bytes('b \xe2\x82'), 12);
  t.equal(registry.appendEngineOutput('s', bytes('\xac\n'), 13, true)?.tail, '\uFFFD\n', "a new run's tail: the earlier run's held bytes are dropped, so its first byte is no UTF-8");
  t.same(registry.appendEngineOutput('s', bytes('\x80\x80'), 13, true)?.pending.length, 0, 'continuation bytes that end a post begin nothing: not held');
  for (const whole of ['é', '€', '🚀']) t.equal(registry.appendEngineOutput('s', `ends with ${whole}`, 13, true)?.pending.length, 0, `a post ending with a whole ${whole}: nothing held`);
  registry.appendEngineOutput('s', bytes('\xe2\x82'), 10, true);
  t.same([registry.appendEngineOutput('s', bytes('\xac\n'), 20)?.tailStartedAtTicks], [10], 'a tail begun with the start of a character is dated by it');
  t.equal(registry.appendEngineOutput('s', 'c €\n', 13, true)?.tail, 'c €\n', 'text is taken as its UTF-8 bytes');

  registry.appendEngineOutput('s', bytes('d \xf0\x9f'), 14);
  await registry.put({ ...record('s', 'llama.cpp'), gpus: [1] });
  t.equal(registry.appendEngineOutput('s', bytes('\x9a\x80\n'), 15)?.tail, 'c €\nd 🚀\n', 'the same run on other GPUs: kept with the tail');

  registry.appendEngineOutput('s', bytes('e \xe2'), 16);
  await registry.put({ ...record('s', 'llama.cpp'), identity: { ...record('x').identity, startTime: 8 } });
  t.equal(registry.engine('s'), undefined, 'another process: dropped with the tail');
  t.equal(registry.appendEngineOutput('s', bytes('\x82\xac\n'), 17)?.tail, '\uFFFD\uFFFD\n');
  registry.appendEngineOutput('s', bytes('f \xe2'), 18);
  await registry.remove('s');
  await registry.put(record('s', 'llama.cpp'));
  t.equal(registry.appendEngineOutput('s', bytes('\x82\xac\n'), 19)?.tail, '\uFFFD\uFFFD\n', 'removed: dropped with the tail');
});

t.test('a replacing registration keeps the engine output while it names the same run of the same process or cgroup', async (t) => {
  const dir = t.testdir({});
  const registry = await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log });
  const pod = (id: string, cgroup: string, engine: ShardRecord['engine'] = 'llama.cpp'): ShardRecord => ({ ...record(id, engine), pid: null, cgroup });
  await registry.put(record('p', 'llama.cpp'));
  await registry.put(pod('c', 'pod-a'));
  registry.appendEngineOutput('p', CUDA_FAILED, 100);
  registry.appendEngineOutput('c', CUDA_FAILED, 100);
  const before = registry.engineVersion;

  t.match(await registry.put({ ...record('p', 'llama.cpp'), gpus: [1, 2], graceMs: 60_000, registeredAt: 9 }), { created: false });
  t.match(registry.engine('p'), { tail: CUDA_FAILED, account: { backend: 'CPU' }, tailStartedAtTicks: 100 }, 'new gpus and grace, same PID and start time: kept');
  await registry.put({ ...pod('c', 'pod-a'), gpus: [3] });
  t.match(registry.engine('c'), { account: { backend: 'CPU' } }, 'the same cgroup and engine process, new gpus: kept');
  t.equal(registry.engineVersion, before, 'nothing changed for the verdicts');
  await registry.put({ ...pod('c', 'pod-a'), gpus: [3], identity: { pid: 77, pgid: 77, startTime: 500, name: 'llama-server' } });
  t.equal(registry.engine('c'), undefined, "the same cgroup, another engine process (its container restarted): the earlier run's output is dropped");
  t.equal(registry.engineVersion, before + 1);
  registry.appendEngineOutput('c', CUDA_FAILED, 100);

  const beforeEngine = registry.engineVersion;
  await registry.put(record('p', 'vllm'));
  t.match(registry.engine('p'), { tail: CUDA_FAILED, account: null }, 'kept, and read again for the engine it now names');
  t.equal(registry.engineVersion, beforeEngine + 1);
  await registry.put(record('p', 'llama.cpp'));
  t.match(registry.engine('p'), { account: { backend: 'CPU' } });

  await registry.put({ ...record('p', 'llama.cpp'), pid: 43, identity: { pid: 43, pgid: 43, startTime: 7, name: 'x' } });
  t.equal(registry.engine('p'), undefined, 'another PID: dropped');
  await registry.put(pod('c', 'pod-b'));
  t.equal(registry.engine('c'), undefined, 'another cgroup: dropped');
  registry.appendEngineOutput('c', CUDA_FAILED, 100);
  await registry.put({ ...record('c', 'llama.cpp'), identity: { pid: 42, pgid: 42, startTime: 7, name: 'x' } });
  t.equal(registry.engine('c'), undefined, 'a cgroup shard replaced by a PID shard: dropped');
});

t.test('one process or cgroup under two ids is refused, naming the other id and what to do; nothing is written', async (t) => {
  const dir = t.testdir({});
  const { wrapped, counter } = instrumented(createStateFile(join(dir, 's.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  const pod = (id: string, cgroup: string): ShardRecord => ({ ...record(id), pid: null, cgroup, identity: { pid: 9, pgid: 9, startTime: 3, name: 'pause' } });
  await registry.put(record('a'));
  await registry.put(pod('p', 'pod-a'));
  const writes = counter.writes;
  const version = registry.version;
  await t.rejects(registry.put(record('b')), {
    code: 'NODECOMPUTE_SHARD_CONFLICT',
    statusCode: 409,
    message: /^Process 42 \(x, started at tick 7\) is already registered as shard "a"\. .*two ids .*on-cpu.* DELETE \/shards\/a first; to change its GPUs, grace or engine, PUT \/shards\/a instead\.$/,
  });
  await t.rejects(registry.put({ ...pod('q', 'pod-a'), gpus: [3] }), { code: 'NODECOMPUTE_SHARD_CONFLICT', message: /^The cgroup "pod-a" is already registered as shard "p"\. .*DELETE \/shards\/p first/ });
  t.same([counter.writes, registry.version, registry.list().map((s) => s.id).sort()], [writes, version, ['a', 'p']], 'refused before any write');
  t.match(await registry.put({ ...record('a'), gpus: [1] }), { created: false }, 're-PUT under its own id: fine');
  t.match(await registry.put({ ...record('b'), identity: { ...record('b').identity, startTime: 8 } }), { created: true }, 'the same PID with another start time is another process');
  t.match(await registry.put({ ...record('a'), pid: null, cgroup: 'pod-b' }), { created: false }, 'a PID shard and a cgroup shard never conflict by themselves');
});

t.test('overlaps: a registration /proc says covers another id\'s processes is refused; an unchanged repeat of one stored before is not', async (t) => {
  const dir = t.testdir({});
  const { wrapped, counter } = instrumented(createStateFile(join(dir, 's.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  const pod: ShardRecord = { ...record('pod'), pid: null, cgroup: 'pod-a', identity: { pid: 9, pgid: 9, startTime: 3, name: 'pause' } };
  const inPod = (other: ShardRecord) => (other.cgroup === 'pod-a' ? 'runs in the cgroup "pod-a"' : null);
  await registry.put(pod);
  await t.rejects(registry.put(record('engine'), inPod), { code: 'NODECOMPUTE_SHARD_CONFLICT', message: /^Process 42 \(x, started at tick 7\) runs in the cgroup "pod-a", which is already registered as shard "pod"\. / });
  t.same(registry.list().map((s) => s.id), ['pod']);

  // As a release that did not refuse overlaps stored them: both ids.
  await registry.put(record('engine'));
  const writes = counter.writes;
  t.match(await registry.put(record('engine'), inPod), { created: false, unchanged: true }, 'a control plane reconciling it is not refused');
  t.equal(counter.writes, writes, 'and nothing is written');
  await t.rejects(registry.put({ ...record('engine'), gpus: [1] }, inPod), { code: 'NODECOMPUTE_SHARD_CONFLICT' }, 'a change to it is');
  // The same with a write under way, when the batch decides.
  const { wrapped: slow, writing, open } = gated(createStateFile(join(dir, 'g.json'), { log }));
  const queued = await loadRegistry({ stateFile: slow, log });
  const first = queued.put(pod);
  await writing;
  const again = queued.put(record('engine'));
  open();
  await Promise.all([first, again]);
  const unrelated = queued.put(record('x', 'other', 77));
  const repeat = queued.put(record('engine'), inPod);
  const changed = queued.put({ ...record('engine'), engine: 'vllm' }, inPod);
  await unrelated;
  t.match(await repeat, { unchanged: true }, 'queued behind a write: the unchanged repeat');
  await t.rejects(changed, { code: 'NODECOMPUTE_SHARD_CONFLICT' }, 'queued behind a write: the change');
});

t.test('a put made as a repeat (no overlap judge) is stored only as an unchanged repeat; otherwise it is refused for the caller to judge it in full', async (t) => {
  const dir = t.testdir({});
  const { wrapped, counter } = instrumented(createStateFile(join(dir, 's.json'), { log }));
  const registry = await loadRegistry({ stateFile: wrapped, log });
  t.equal(registry.repeats(record('a')), false, 'nothing stored under the id: no repeat');
  await t.rejects(registry.put(record('a'), null), { name: 'NotARepeatError' }, 'so a put made as one is refused');
  await registry.put(record('a'));
  t.equal(registry.repeats(record('a')), true);
  t.equal(registry.repeats({ ...record('a'), gpus: [1] }), false, 'another GPU is a change');
  t.match(await registry.put(record('a'), null), { created: false, unchanged: true }, 'a repeat needs no judge');
  const writes = counter.writes;
  await t.rejects(registry.put({ ...record('a'), gpus: [1] }, null), { name: 'NotARepeatError' }, 'a change is refused');
  t.equal(counter.writes, writes, 'before any write');

  // Decided in a batch, behind a write: the id was removed meanwhile.
  const { wrapped: slow, writing, open } = gated(createStateFile(join(dir, 'g.json'), { log }));
  const queued = await loadRegistry({ stateFile: slow, log });
  const first = queued.put(record('b'));
  await writing;
  t.equal(queued.repeats(record('b')), false, 'nothing is a repeat while a write is under way');
  open();
  await first;
  const { wrapped: held, writing: removing, open: land } = gated(slow);
  const again = await loadRegistry({ stateFile: held, log });
  t.equal(again.repeats(record('b')), true, 'read back: a repeat');
  const removal = again.remove('b');
  await removing;
  const repeat = again.put(record('b'), null);
  land();
  await removal;
  await t.rejects(repeat, { name: 'NotARepeatError' }, 'removed before its batch decided: refused');
  t.same(again.list(), [], 'and not stored');
});

/** A state file whose writes wait until the test opens the gate (then fail, with `refuse`): the test acts while a PUT is in flight. */
function gated(file: StateFile, refuse = false) {
  let open: () => void = () => {};
  let started: () => void = () => {};
  const writing = new Promise<void>((resolve) => {
    started = resolve;
  });
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  const wrapped: StateFile = {
    ...file,
    path: file.path,
    write: async (text) => {
      started();
      await gate;
      if (refuse) throw Object.assign(new Error('EROFS: read-only file system'), { code: 'EROFS' });
      return file.write(text);
    },
  };
  return { wrapped, writing, open };
}

t.test('engine output posted while a replacing PUT is in flight is not lost', async (t) => {
  const newProcess = { ...record('s', 'llama.cpp'), pid: 43, identity: { pid: 43, pgid: 43, startTime: 9, name: 'llama-server' } };
  /** A registry holding shard "s" (PID 42) with a CPU account, whose next write waits for the gate. */
  async function inFlight(t: Test, refuse = false) {
    const path = join(t.testdir({}), 's.json');
    await (await loadRegistry({ stateFile: createStateFile(path, { log }), log })).put(record('s', 'llama.cpp'));
    const { wrapped, writing, open } = gated(createStateFile(path, { log }), refuse);
    const registry = await loadRegistry({ stateFile: wrapped, log });
    registry.appendEngineOutput('s', CUDA_FAILED, 10);
    return { registry, writing, open };
  }

  await t.test('the same process: everything posted is kept', async (t) => {
    const { registry, writing, open } = await inFlight(t);
    const put = registry.put({ ...record('s', 'llama.cpp'), gpus: [1] });
    await writing;
    registry.appendEngineOutput('s', 'main: loading model\n', 20);
    open();
    await put;
    t.match(registry.engine('s'), { tail: `${CUDA_FAILED}main: loading model\n`, account: { backend: 'CPU' }, tailStartedAtTicks: 10 });
  });

  await t.test('another process: what was posted after the PUT arrived is the new process\'s, and stays', async (t) => {
    const { registry, writing, open } = await inFlight(t);
    const put = registry.put(newProcess);
    await writing;
    registry.appendEngineOutput('s', 'main: loading model\n', 20);
    registry.appendEngineOutput('s', CUDA_BUFFER, 30);
    open();
    await put;
    t.match(registry.engine('s'), { tail: `main: loading model\n${CUDA_BUFFER}`, account: { backend: 'CUDA' }, tailStartedAtTicks: 20 }, 'the old process\'s output is gone');
    t.equal(registry.get('s')?.pid, 43);
  });

  await t.test('another process: a character cut as the PUT arrived is read whole, and one cut since is carried over', async (t) => {
    const { registry, writing, open } = await inFlight(t);
    registry.appendEngineOutput('s', Buffer.from('main: \xe2\x82', 'latin1'), 15);
    const put = registry.put(newProcess);
    await writing;
    registry.appendEngineOutput('s', Buffer.from('\xac loading model \xf0\x9f', 'latin1'), 20);
    open();
    await put;
    t.same([registry.engine('s')?.tail, registry.engine('s')?.pending], ['€ loading model ', Buffer.from([0xf0, 0x9f])]);
    t.equal(registry.appendEngineOutput('s', Buffer.from([0x9a, 0x80, 0x0a]), 30)?.tail, '€ loading model 🚀\n');
  });

  await t.test('another process, and a fresh tail posted meanwhile: only that', async (t) => {
    const { registry, writing, open } = await inFlight(t);
    const put = registry.put(newProcess);
    await writing;
    registry.appendEngineOutput('s', 'main: loading model\n', 20);
    registry.appendEngineOutput('s', CUDA_BUFFER, 30, true);
    open();
    await put;
    t.match(registry.engine('s'), { tail: CUDA_BUFFER, tailStartedAtTicks: 30 });
  });

  await t.test('a refused PUT changes nothing', async (t) => {
    const { registry, writing, open } = await inFlight(t, true);
    const put = registry.put(newProcess);
    await writing;
    registry.appendEngineOutput('s', 'main: loading model\n', 20);
    open();
    await t.rejects(put, { code: 'NODECOMPUTE_STATE_WRITE_FAILED' });
    t.equal(registry.get('s')?.pid, 42);
    t.match(registry.engine('s'), { tail: `${CUDA_FAILED}main: loading model\n`, tailStartedAtTicks: 10 }, 'the registration and its output stay as they were');
  });

  await t.test('two ids for one process in one batch: the second is refused, and the batch stores the first', async (t) => {
    const { registry, writing, open } = await inFlight(t);
    const first = registry.put({ ...record('s', 'llama.cpp'), gpus: [1] });
    await writing;
    const removed = registry.remove('s');
    const moved = registry.put(newProcess);
    const twin = registry.put({ ...newProcess, id: 'twin' });
    open();
    await Promise.all([first, removed, moved]);
    await t.rejects(twin, { code: 'NODECOMPUTE_SHARD_CONFLICT', message: /^Process 43 \(llama-server, started at tick 9\) is already registered as shard "s"/ });
    t.same(registry.list().map((shard) => shard.id), ['s'], 'a removal then a PUT in one batch is fine; the twin is not stored');
    t.equal(registry.get('s')?.pid, 43);
  });

  await t.test('two PUTs in one batch: the second judges the first', async (t) => {
    const { registry, writing, open } = await inFlight(t);
    const first = registry.put({ ...record('s', 'llama.cpp'), gpus: [1] });
    await writing;
    // Queued behind the first write: one batch, same process then another.
    const same = registry.put({ ...record('s', 'llama.cpp'), gpus: [2] });
    const other = registry.put(newProcess);
    registry.appendEngineOutput('s', 'main: loading model\n', 20);
    open();
    await Promise.all([first, same, other]);
    t.match(registry.engine('s'), { tail: 'main: loading model\n' }, 'the other process keeps only what was posted after it was asked for');
  });
});

t.test('a write that does not finish within the bound: its change is answered pending and stored if it lands; changes queued behind it are withdrawn', async (t) => {
  const path = join(t.testdir({}), 's.json');
  await (await loadRegistry({ stateFile: createStateFile(path, { log }), log })).put(record('s', 'llama.cpp'));
  const { wrapped, writing, open } = gated(createStateFile(path, { log }));
  let stuck: string | null = null;
  const { log: recording, lines } = captureLog('info');
  // The registry answers within 100 ms; the real state file under it keeps its own bound.
  const registry = await loadRegistry({ stateFile: { ...wrapped, timeoutMs: 100, stuck: () => stuck }, log: recording });
  const version = registry.version;

  const told: unknown[] = [];
  const replacing = registry.put({ ...record('s', 'llama.cpp', 43), identity: { pid: 43, pgid: 43, startTime: 9, name: 'llama-server' } }, undefined, (result) =>
    told.push(result),
  );
  await writing;
  registry.appendEngineOutput('s', CUDA_BUFFER, 20);
  const behind = registry.put(record('t', 'other', 44));
  const removal = registry.remove('s');
  await t.rejects(replacing, {
    code: 'NODECOMPUTE_STATE_WRITE_PENDING',
    statusCode: 503,
    message: `The change is not acknowledged: 100 ms after it came, the state file ${path} had not finished writing it (a hung network mount?)`,
  });
  await t.rejects(replacing, { message: /may yet be stored \(see GET \/shards\)\. Retry once GET \/readyz passes; a repeat is safe \(a repeated DELETE answering 404/ });
  await t.rejects(behind, {
    code: 'NODECOMPUTE_STATE_WRITE_FAILED',
    statusCode: 503,
    message: `The change was not stored: 100 ms after it came, the state file ${path} was still being written for earlier changes`,
  });
  await t.rejects(behind, { message: /It was withdrawn; nothing changed\. Retry once GET \/readyz passes\.$/ });
  await t.rejects(removal, { code: 'NODECOMPUTE_STATE_WRITE_FAILED', message: /withdrawn/ }, 'a removal too');
  await t.rejects(
    registry.remove('unknown'),
    { code: 'NODECOMPUTE_STATE_WRITE_FAILED' },
    'even of an id not stored: not "not registered" while a write that may still add it is pending',
  );
  t.same(told, [], 'what follows a stored registration waits for it to be stored');
  stuck = 'writing it did not finish within 100 ms';
  await t.rejects(
    registry.put(record('u', 'other', 45)),
    { code: 'NODECOMPUTE_STATE_WRITE_FAILED', message: `The change was not stored: the state file ${path} cannot be written now (${stuck}). Nothing was changed. Retry once GET /readyz passes.` },
    'once the state file says its write is stuck, a change is refused at once',
  );
  stuck = null;
  t.equal(registry.get('s')?.pid, 42, 'nothing acknowledged, nothing served');
  t.equal(registry.version, version);

  open();
  await waitUntil(() => registry.version > version, { what: 'the late write to land' });
  t.equal(registry.get('s')?.pid, 43, 'the pending change is stored after all');
  t.match(told, [{ created: false, graceKept: false, shard: { pid: 43 } }], 'and what follows a stored registration is done then, though its caller was answered');
  t.equal(told.length, 1, 'once');
  t.match(registry.engine('s'), { tail: CUDA_BUFFER, tailStartedAtTicks: 20 }, 'with the output posted since its PUT came, as if it had been answered in time');
  t.equal(registry.get('t'), undefined, 'a withdrawn change is never applied');
  t.same(JSON.parse(readFileSync(path, 'utf8')).shards.map((shard: ShardRecord) => [shard.id, shard.pid]), [['s', 43]], 'the file agrees');
  t.match(lines.at(-1), {
    level: 30,
    changes: 1,
    msg: /^A late write of the state file returned: the 1 change\(s\) answered 503 NODECOMPUTE_STATE_WRITE_PENDING meanwhile are stored after all/,
  });
  t.match(await registry.put(record('t', 'other', 44)), { created: true }, 'writes go on');
});

t.test('a write that does not finish within the bound and then fails: nothing is stored, and that is said', async (t) => {
  const path = join(t.testdir({}), 's.json');
  await (await loadRegistry({ stateFile: createStateFile(path, { log }), log })).put(record('s'));
  const { wrapped, writing, open } = gated(createStateFile(path, { log }), true);
  const { log: recording, lines } = captureLog();
  const registry = await loadRegistry({ stateFile: { ...wrapped, timeoutMs: 100 }, log: recording });
  const removal = registry.remove('s');
  await writing;
  await t.rejects(removal, { code: 'NODECOMPUTE_STATE_WRITE_PENDING' });
  open();
  await waitUntil(() => lines.length === 3, { what: 'the refused write to be said' });
  t.ok(registry.get('s'), 'the shard stays');
  t.match(lines.slice(1), [
    // Detail only: the state file logs its directory turning unwritable (state-dir.test.ts).
    { level: 20, msg: 'Could not write the state file; the changes were refused and nothing stored was lost' },
    { level: 30, changes: 1, msg: /the 1 change\(s\) answered 503 NODECOMPUTE_STATE_WRITE_PENDING meanwhile were not stored after all: the write failed when it returned\.$/ },
  ]);
});

t.test('what follows a stored change is told once it is stored, unchanged repeats too; one that throws is logged and stops nothing', async (t) => {
  const { log: recording, lines } = captureLog('info');
  const registry = await loadRegistry({ stateFile: createStateFile(join(t.testdir({}), 's.json'), { log }), log: recording });
  const told: string[] = [];
  await registry.put(record('a'), undefined, (result) => told.push(`a created=${result.created}`));
  await registry.put(record('a'), undefined, (result) => told.push(`a unchanged=${result.unchanged}`));
  t.equal(await registry.remove('a', () => told.push('a removed')), true);
  t.equal(await registry.remove('a', () => told.push('a removed again')), false);
  t.same(told, ['a created=true', 'a unchanged=true', 'a removed']);

  const stored = await registry.put(record('b', 'other', 43), undefined, () => {
    throw new Error('a bug in what follows');
  });
  t.equal(stored.created, true, 'the change is stored and answered all the same');
  t.match(lines.at(-1), { level: 50, err: { message: 'a bug in what follows' }, msg: /the registry itself is as answered\. This is a bug in nodecompute/ });
  t.match(await registry.put(record('c', 'other', 44)), { created: true }, 'and the registry goes on');
});

t.test('a replacement for the same target and GPUs keeps the registration time (the grace clock); another target or other GPUs restart it', async (t) => {
  const dir = t.testdir({});
  const registry = await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log });
  const first = { ...record('a'), gpus: [0, 1], registeredAt: 100 };
  await registry.put(first);
  const stored = registry.get('a');
  t.match(await registry.put({ ...first, registeredAt: 200 }), { created: false, graceKept: true, unchanged: true, shard: { registeredAt: 100 } });
  t.equal(registry.get('a'), stored, 'an identical re-PUT keeps the very record');
  t.match(await registry.put({ ...first, gpus: [1, 0], graceMs: 60_000, engine: 'vllm', registeredAt: 300 }), { graceKept: true, unchanged: false, shard: { registeredAt: 100, graceMs: 60_000 } }, 'a new grace or engine goes on from the first registration');
  t.equal(registry.get('a')?.registeredAt, 100);
  t.same(JSON.parse(readFileSync(join(dir, 's.json'), 'utf8')).shards[0].registeredAt, 100, 'and so does the state file');
  t.match(await registry.put({ ...first, gpus: [0, 1, 2], registeredAt: 350 }), { graceKept: false, unchanged: false, shard: { gpus: [0, 1, 2], registeredAt: 350 } }, 'one GPU more: stored, and the grace restarts');
  t.same(registry.get('a')?.gpus, [0, 1, 2]);
  t.equal(registry.repeats({ ...first, gpus: [0, 1, 2, 3] }), false, 'a superset is no repeat');
  t.equal(registry.repeats({ ...first, gpus: [0, 1] }), false, 'nor is a subset');
  t.match(await registry.put({ ...first, gpus: [0, 1], registeredAt: 380 }), { graceKept: false, unchanged: false, shard: { gpus: [0, 1], registeredAt: 380 } }, 'one GPU fewer: stored, and the grace restarts');
  t.match(await registry.put({ ...first, gpus: [2], registeredAt: 400 }), { graceKept: false, unchanged: false, shard: { registeredAt: 400 } }, 'other GPUs: the grace restarts');
  t.match(await registry.put({ ...first, gpus: [2], identity: { ...first.identity, startTime: 8 }, registeredAt: 500 }), { graceKept: false, shard: { registeredAt: 500 } }, 'another process: the grace restarts');
  const pod = { ...first, pid: null, cgroup: 'pod-a', registeredAt: 600 };
  t.match(await registry.put(pod), { graceKept: false, shard: { registeredAt: 600 } });
  t.match(await registry.put({ ...pod, graceMs: 5_000, registeredAt: 700 }), { graceKept: true, unchanged: false, shard: { registeredAt: 600 } }, 'the same cgroup and engine process');
  t.match(
    await registry.put({ ...pod, graceMs: 5_000, identity: { pid: 77, pgid: 77, startTime: 900, name: 'llama-server' }, registeredAt: 800 }),
    { graceKept: false, unchanged: false, shard: { registeredAt: 800 } },
    'the same cgroup, another engine process (its container restarted, and the postStart hook re-PUTs): the new run gets its grace',
  );
});

t.test('with GPU UUIDs, the same GPUs are the same devices: a new index for one keeps the grace clock, the same index for another restarts it', async (t) => {
  const dir = t.testdir({});
  const registry = await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log });
  const first = { ...record('a'), gpus: [2], gpuUuids: ['GPU-c'], registeredAt: 100 };
  await registry.put(first);
  t.same(JSON.parse(readFileSync(join(dir, 's.json'), 'utf8')).shards[0].gpuUuids, ['GPU-c'], 'kept in the state file');
  t.same((await loadRegistry({ stateFile: createStateFile(join(dir, 's.json'), { log }), log })).get('a')?.gpuUuids, ['GPU-c'], 'and read back');
  t.match(await registry.put({ ...first, gpus: [1], registeredAt: 200 }), { graceKept: true, unchanged: false, shard: { gpus: [1], registeredAt: 100 } }, 'renumbered: the same device under its new index');
  t.match(await registry.put({ ...first, gpus: [1], gpuUuids: ['GPU-b'], registeredAt: 300 }), { graceKept: false, shard: { registeredAt: 300 } }, 'the same index, another device: the grace restarts');
  t.match(await registry.put({ ...first, gpus: [1], gpuUuids: undefined, registeredAt: 400 }), { graceKept: true, unchanged: false, shard: { registeredAt: 300 } }, 'taken on trust: judged by index, stored without UUIDs');
  t.equal(registry.get('a')?.gpuUuids, undefined);
});

t.test('a state file whose GPU UUIDs do not match its GPUs stops the load, naming the shard, and is left untouched', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 's.json');
  const text = JSON.stringify({ format: 'nodecompute-shards/v1', shards: [{ ...record('a'), gpus: [0, 1], gpuUuids: ['GPU-a'] }] });
  writeFileSync(path, text);
  const read = await readRegistryFile(createStateFile(path, { log }));
  t.match(read, { ok: false, problem: `The state file ${path} gives shard "a" 2 GPU(s) but 1 GPU UUID(s): each GPU index needs its UUID, in the same order.`, fix: /remove "gpuUuids"/ });
  t.equal(readFileSync(path, 'utf8'), text);
});

t.test('a repeated registration with nothing queued is answered without a write or a new registry version', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 's.json');
  const registry = await loadRegistry({ stateFile: createStateFile(path, { log }), log });
  const first = { ...record('a'), gpus: [0], registeredAt: 100 };
  await registry.put(first);
  const version = registry.version;
  const written = statSync(path).ino;
  t.match(await registry.put({ ...first, registeredAt: 200 }), { created: false, unchanged: true, shard: { registeredAt: 100 } });
  t.equal(registry.version, version, 'no new version: attribution and the caches built on it stay');
  t.equal(statSync(path).ino, written, 'the state file was not rewritten (each write renames a new file into place)');
});

t.test('a DELETE queued before a PUT of the same target under another id frees it: the PUT is not a conflict', async (t) => {
  const dir = t.testdir({});
  let release: () => void = () => {};
  let gate: Promise<void> | null = null;
  const stateFile = createStateFile(join(dir, 's.json'), { log, syncDirectory: async () => gate ?? undefined });
  const registry = await loadRegistry({ stateFile, log });
  await registry.put(record('a'));
  gate = new Promise((resolve) => (release = resolve));
  const renaming = registry.put({ ...record('a'), gpus: [1] });
  // The write of that change is held; the DELETE and the PUT below queue behind it, in this order.
  const removing = registry.remove('a');
  const putting = registry.put(record('b'));
  release();
  gate = null;
  await renaming;
  t.equal(await removing, true);
  t.match(await putting, { created: true });
  t.same(registry.list().map((shard) => shard.id), ['b']);
});

t.test('a directory that cannot be fsynced: the change is stored and acknowledged, with one warning per kind of failure', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'shards.json');
  const { log: logged, lines } = captureLog();
  let failure = { code: 'EINVAL', message: 'EINVAL: invalid argument, fsync' };
  const syncDirectory = async () => {
    throw Object.assign(new Error(failure.message), { code: failure.code });
  };
  const registry = await loadRegistry({ stateFile: createStateFile(path, { log: logged, syncDirectory }), log });
  t.match(await registry.put(record('a')), { created: true });
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
  const { log: logger, lines } = captureLog('info');
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
  t.same(await createStateFile(join(dir, 'file', 'x.json'), { log }).checkWritable(), { ok: false, reason: `cannot write in ${join(dir, 'file')}: ${join(dir, 'file')} exists and is not a directory` });
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

t.test('the state file: missing directories are made level by level, and one that cannot be made is an error, not a hang', async (t) => {
  const dir = t.testdir({});
  const nested = join(dir, 'a', 'b', 'c');
  // Writers racing to make the same levels all succeed.
  await Promise.all(['1', '2', '3'].map((name) => createStateFile(join(nested, `${name}.json`), { log }).write(name)));
  t.same(readdirSync(nested).sort(), ['1.json', '2.json', '3.json']);
  t.same(await createStateFile(join(dir, 'd', 'e', 'x.json'), { log }).checkWritable(), { ok: true, warning: null });
  // Under /proc, mkdir answers ENOENT below a directory that exists: Node's recursive mkdir spins
  // for ever there. The real /proc, as an operator's typo would meet it.
  const underProc = createStateFile('/proc/nodecompute-no-such-dir/state/shards.json', { log });
  t.same(await underProc.checkWritable(), {
    ok: false,
    reason: "cannot write in /proc/nodecompute-no-such-dir/state: ENOENT: no such file or directory, mkdir '/proc/nodecompute-no-such-dir'",
  });
  await t.rejects(underProc.write('{}'), { code: 'ENOENT' });
});
