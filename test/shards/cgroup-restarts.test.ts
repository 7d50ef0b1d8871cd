// A shard registered by cgroup (a pod UID) outlives its engine's container: Kubernetes restarts the
// container inside the same pod, and between two starts only the pod's sandbox (`pause`) is left in
// the cgroup. So: a pod holding only its sandbox is exited (nothing computes), engine output posted
// before every process now running started is an earlier run's (set aside from the verdict, and the
// new run's output starts a new tail), and a replacing registration of the same target keeps the
// engine's output. Real processes throughout: a `pause` is a copy of sleep by that name (the kernel
// takes the command name from the executable's file name), and cgroup membership, which a test
// cannot arrange for real processes, is what the /proc reader's cgroup scan answers.
import { spawn, type ChildProcess } from 'node:child_process';
import { copyFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Test } from 'tap';
import t from 'tap';
import { pino } from 'pino';
import { createProcReader, parseUptimeTicks, type ProcReader } from '../../src/system/procfs.js';
import { buildTestApp, spawnShardProcess, type ShardProcess } from '../helpers/app.js';
import { idleEightGpuNode, waitUntil, type FakeProcess, type FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';
import { isProcessAlive } from '../helpers/process-scan.js';
import { readSample as sample } from '../helpers/samples.js';

/** A run that died at CUDA init (quoted from llama.cpp issue 6184): it says CPU. */
const NO_DEVICES = sample('llamacpp-log_2024-03_issue6184_no-cuda-devices-found_quoted.txt');
/** What a b9829+ llama-server prints at its default verbosity: nothing about its devices. */
const B9829 = sample('llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt');
const POD_UID = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';
const silent = pino({ level: 'silent' });
const text = { 'content-type': 'text/plain' };

function node(processes: FakeProcess[] = []): FakeScenario {
  return { ...idleEightGpuNode(), processes };
}

const GPU0 = node().gpus[0]!.uuid;

/** A process whose command name is `pause`, like a pod's sandbox: sleep copied under that name. */
async function spawnPause(t: Test): Promise<ChildProcess> {
  const path = join(t.testdir({}), 'pause');
  copyFileSync('/bin/sleep', path);
  // argv0 stays "sleep", for a sleep that is a multi-call binary choosing by it (busybox).
  const child = spawn(path, ['600'], { argv0: 'sleep', detached: true, stdio: 'ignore' });
  t.teardown(() => void child.kill('SIGKILL'));
  await waitUntil(() => {
    try {
      return readFileSync(`/proc/${child.pid}/stat`, 'utf8').startsWith(`${child.pid} (pause) S `);
    } catch {
      return false;
    }
  }, { what: 'the pause process to run' });
  return child;
}

/** The real /proc, but the pod's cgroup holds the processes the test says. */
function podProc(members: () => number[]): ProcReader {
  const real = createProcReader({ root: '/proc', log: silent });
  const inPod = (needle: string) => (needle === POD_UID ? members() : []);
  return {
    ...real,
    findPidsInCgroup: async (needle) => inPod(needle),
    findPidsInCgroups: async (needles) => new Map(needles.map((needle) => [needle, inPod(needle)])),
  };
}

async function pod(t: Test, graceMs: number) {
  const pause = await spawnPause(t);
  let engine: ShardProcess = await spawnShardProcess(t, 0);
  const proc = podProc(() => [pause.pid!, engine.pid].filter(isProcessAlive));
  const { app, fake } = await buildTestApp(t, { scenario: node(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { proc } });
  const put = await app.inject({ method: 'PUT', url: '/shards/pod', payload: { cgroup: POD_UID, gpus: [0], engine: 'llama.cpp', graceMs } });
  t.equal(put.statusCode, 201, put.body);
  const ready = async () => {
    const res = await app.inject({ method: 'GET', url: '/shards/pod/ready' });
    return { status: res.statusCode, ...(res.json() as { state: string; reason: string | null; warnings: string[] }) };
  };
  const post = async (output: string) => {
    const res = await app.inject({ method: 'POST', url: '/shards/pod/engine-output', payload: output, headers: text });
    t.equal(res.statusCode, 200, res.body);
    return res.json() as { account: { backend: string } | null; tailBytes: number };
  };
  /** The engine container restarts: a new engine, started in a later clock tick than the last engine output. */
  const restart = async () => {
    const posted = proc.ticksNow();
    t.ok(typeof posted === 'number', '/proc\'s clock can be read');
    await engine.kill();
    await waitUntil(() => (proc.ticksNow() ?? 0) > posted!, { what: 'the clock tick of the last post to pass' });
    engine = await spawnShardProcess(t, 0);
    return engine;
  };
  return { app, fake, pause, engine: () => engine, ready, post, restart };
}

t.test('a pod whose engine container exited, its sandbox left: exited, not on-cpu', async (t) => {
  const { fake, pause, engine, ready } = await pod(t, 0);
  fake.setScenario(node([{ gpuUuid: GPU0, pid: engine().pid, name: 'llama-server', usedMiB: 4000 }]));
  t.match(await ready(), { status: 200, state: 'ready' });

  await engine().kill();
  fake.setScenario(node());
  const exited = await ready();
  t.match(exited, { status: 503, state: 'exited' }, 'nothing computes, on the GPU or on the CPU');
  t.match(exited.reason, `only the pod's sandbox process is left in cgroup "${POD_UID}" (pause, PID ${pause.pid}): the engine's container exited`);
  t.match(exited.reason, '`kubectl describe pod`');
  t.notMatch(exited.reason, /computing on the CPU/);
});

t.test('a restarted container is not judged by its previous run\'s engine output', async (t) => {
  const { fake, engine, ready, post, restart } = await pod(t, 600_000);
  // The first run died at CUDA init, and its log says so.
  t.equal((await post(NO_DEVICES)).account?.backend, 'CPU');
  t.match(await ready(), { status: 503, state: 'on-cpu', reason: /the engine itself reports it/ });
  t.ok(engine().pid > 0);

  // The container restarts and this run takes GPU 0; nobody has posted its output yet.
  const second = await restart();
  fake.setScenario(node([{ gpuUuid: GPU0, pid: second.pid, name: 'llama-server', usedMiB: 4000 }]));
  const restarted = await ready();
  t.match(restarted, { status: 200, state: 'ready' }, 'nvidia-smi decides: the old run\'s CPU is set aside');
  t.match(restarted.warnings, [/^the engine output posted \(it says CPU\) came, at least in part, from an earlier run: every process in cgroup ".*" started after it/]);

  // The new run's own output (b9829+: no device lines) starts a new tail. Appended to the old run's,
  // it would still read CPU: a run that got no further than CUDA init cannot be told by the text
  // from the next process's own lines (llama-log-restart.test.ts).
  const fresh = await post(B9829);
  t.equal(fresh.account, null, 'the new run says nothing about its devices');
  t.equal(fresh.tailBytes, Buffer.byteLength(B9829), 'the previous run\'s output is dropped');
  t.match(await ready(), { status: 200, state: 'ready', warnings: [] });
  const idle = 'srv  update_slots: all slots are idle\n';
  t.equal((await post(idle)).tailBytes, Buffer.byteLength(B9829 + idle), 'the same run\'s next output is appended');

  // GPU 0 released again: within its grace the shard is starting, which the old run's words no longer turn into on-cpu.
  fake.setScenario(node());
  t.match(await ready(), { status: 503, state: 'starting' });
});

t.test("a restarted container's output posted before any snapshot saw the restart: the mixed tail is set aside, and the next post begins a new one", async (t) => {
  const { fake, ready, post, restart } = await pod(t, 600_000);
  t.equal((await post(NO_DEVICES)).account?.backend, 'CPU');
  t.match(await ready(), { status: 503, state: 'on-cpu' });

  // The container restarts, and its first output is posted before any snapshot shows the new run:
  // it is appended to the old run's, and together they read CPU (llama-log-restart.test.ts).
  const second = await restart();
  t.equal((await post(B9829)).account?.backend, 'CPU', 'the mixed tail reads CPU');

  // The next snapshot shows the new run holding GPU 0: the tail began before it started.
  fake.setScenario(node([{ gpuUuid: GPU0, pid: second.pid, name: 'llama-server', usedMiB: 4000 }]));
  const judged = await ready();
  t.match(judged, { status: 200, state: 'ready' }, 'nvidia-smi decides, not the mixed tail');
  t.match(judged.warnings, [/came, at least in part, from an earlier run/]);

  const idle = 'srv  update_slots: all slots are idle\n';
  const next = await post(idle);
  t.equal(next.tailBytes, Buffer.byteLength(idle), 'the next post begins a new tail');
  t.equal(next.account, null);
  t.match(await ready(), { status: 200, state: 'ready', warnings: [] });
});

t.test('re-registering the same process or cgroup keeps the engine output; another process starts without it', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: node(), config: { cacheTtlMs: 0, maxStaleMs: 0 } });
  const put = async (body: object) => (await app.inject({ method: 'PUT', url: '/shards/s', payload: { engine: 'llama.cpp', ...body } })).statusCode;
  const state = async () => (await app.inject({ method: 'GET', url: '/shards/s' })).json() as { status: { state: string; reason: string }; compute: { engine: unknown } };
  t.equal(await put({ pid: shard.pid, gpus: [0] }), 201);
  t.equal((await app.inject({ method: 'POST', url: '/shards/s/engine-output', payload: NO_DEVICES, headers: text })).statusCode, 200);
  t.match((await state()).status, { state: 'on-cpu', reason: /the engine itself reports it/ });

  t.equal(await put({ pid: shard.pid, gpus: [1], graceMs: 120_000 }), 200);
  const moved = await state();
  t.match(moved.status, { state: 'on-cpu', reason: /placed on GPU 1 .*the engine itself reports it/ }, 'new GPUs and grace: the engine\'s account stays');
  t.match(moved.compute.engine, { backend: 'CPU' });

  const other = await spawnShardProcess(t, 0);
  t.equal(await put({ pid: other.pid, gpus: [1], graceMs: 120_000 }), 200);
  const replaced = await state();
  t.equal(replaced.status.state, 'starting', 'another process: judged afresh');
  t.equal(replaced.compute.engine, null);
});

t.test('the clock that /proc start times count in', async (t) => {
  t.equal(parseUptimeTicks('66536.95 48635.60\n'), 6_653_695, 'seconds with two decimals, in ticks of 1/100 s');
  t.equal(parseUptimeTicks('0.07 0.00\n'), 7);
  for (const bad of ['', '66536 1.00\n', '66536.9 1.00\n', '-1.00 1.00\n', `${'9'.repeat(20)}.00 1.00\n`]) t.equal(parseUptimeTicks(bad), null, JSON.stringify(bad));

  const real = createProcReader({ root: '/proc', log: silent });
  const before = real.ticksNow()!;
  const child = spawn('sleep', ['600'], { stdio: 'ignore' });
  t.teardown(() => void child.kill('SIGKILL'));
  await waitUntil(() => isProcessAlive(child.pid!), { what: 'sleep to start' });
  const started = Number(readFileSync(`/proc/${child.pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[19]);
  t.ok(before <= started && started <= real.ticksNow()!, `a process started between two readings (${before}, then ${started}) is dated between them`);

  const { log, messages: warnings } = captureLog('warn');
  t.equal(createProcReader({ root: t.testdir({}), log }).ticksNow(), null, 'a fixture tree without an uptime file: no clock');
  t.same(warnings(), [], 'and nothing to warn about');
  const junk = createProcReader({ root: t.testdir({ uptime: 'soon\n' }), log });
  t.equal(junk.ticksNow(), null);
  t.equal(junk.ticksNow(), null);
  t.equal(createProcReader({ root: t.testdir({ uptime: {} }), log }).ticksNow(), null);
  t.equal(warnings().length, 2, 'one warning per reader, however often it is asked');
  t.match(warnings()[0], /uptime does not read as \/proc\/uptime does, so engine output cannot be dated: .* Check that NODECOMPUTE_PROC points at the host's \/proc\./);
  t.match(warnings()[1], /^Cannot read .*uptime \(EISDIR/);
  t.equal(createProcReader({ root: t.testdir({ uptime: '12.34 5.00\n' }), log }).ticksNow(), 1234);
});

t.test("a pod's identity is its engine process, not its sandbox: a restarted container's re-PUT gives the new run its grace", async (t) => {
  const { app, engine, ready, post, restart } = await pod(t, 0);
  const registered = app.services.registry.get('pod')!;
  t.equal(registered.identity.pid, engine().pid, 'the engine, though the sandbox has the lower PID');
  t.not(registered.identity.name, 'pause');
  t.match(await ready(), { state: 'on-cpu' }, 'grace 0, no GPU memory');

  const again = { cgroup: POD_UID, gpus: [0], engine: 'llama.cpp', graceMs: 600_000 };
  const put = (payload: object) => app.inject({ method: 'PUT', url: '/shards/pod', payload });
  t.equal((await put({ ...again, graceMs: 0 })).statusCode, 200);
  t.equal(app.services.registry.get('pod')!.registeredAt, registered.registeredAt, 'the same run re-PUT: the grace clock goes on');

  await post(NO_DEVICES);
  const next = await restart();
  t.equal((await put(again)).statusCode, 200);
  t.equal(app.services.registry.engine('pod'), undefined, "the earlier run's output went with it");
  const replaced = app.services.registry.get('pod')!;
  t.equal(replaced.identity.pid, next.pid, 'the new run');
  t.ok(replaced.registeredAt >= registered.registeredAt);
  t.match(await ready(), { status: 503, state: 'starting' }, 'the new run loads within its own grace, not on-cpu');
});
