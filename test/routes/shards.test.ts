// Shards end to end through the app: real process groups in the real /proc, the fake nvidia-smi
// listing chosen PIDs on chosen GPUs, and a clock the test moves (helpers/two-gpu-node.ts).
// Registrations refused as one process or cgroup under two ids are in shard-conflicts.test.ts.
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { createProcReader } from '../../src/system/procfs.js';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { failDriver, NO_GPUS_FAILED, NO_XIDS, UNREACHABLE_SAID, UNSAMPLED_SM } from '../helpers/backend.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';
import { readSample as sample } from '../helpers/samples.js';
import { setup, twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';

t.test('a shard holds a GPU through a grandchild in its process group; another group on that GPU is foreign', async (t) => {
  const shard = await spawnShardProcess(t, 2);
  const other = await spawnShardProcess(t, 1);
  const { app, step } = await setup(
    t,
    twoGpuNode([
      { gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 12595 },
      { gpuUuid: UUIDS[1]!, pid: other.members[0]!, name: 'python3', usedMiB: 2048 },
      { gpuUuid: UUIDS[0]!, pid: 999_999, name: '[Not Found]', usedMiB: 300 },
    ]),
  );
  const put = await app.inject({ method: 'PUT', url: '/shards/llama-a', payload: { pid: shard.pid, gpus: [1], engine: 'llama.cpp' } });
  t.equal(put.statusCode, 201);
  const record = put.json();
  t.equal(record.identity.pid, shard.pid);
  t.equal(record.identity.pgid, shard.pid, 'a detached child leads its own group');
  t.equal(record.identity.name, 'sh');
  t.ok(record.identity.startTime > 0);
  t.equal(record.engine, 'llama.cpp');
  t.equal(record.graceMs, 15000, 'the default grace');
  step();

  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.same(
    gpus.gpus[1].processes.map((p: { pid: number; shard: string | null }) => [p.pid, p.shard]),
    [
      [shard.members[0], 'llama-a'],
      [other.members[0], null],
    ],
  );

  const compute = (await app.inject({ method: 'GET', url: '/shards/llama-a/compute' })).json();
  t.equal(compute.shard, 'llama-a');
  t.equal(compute.backend, 'CUDA');
  t.same(compute.devices, ['GPU 1: 12.3 GiB']);
  t.same(compute.gpus, [{ index: 1, usedMiB: 12595, smUtilPct: UNSAMPLED_SM, xidErrors: NO_XIDS, utilizationPct: 0, migDevices: null }]);
  t.same(compute.strayGpus, []);
  t.equal(compute.engine, null);

  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.same(foreign.gpus, [
    { index: 0, uuid: UUIDS[0], usedMiB: 318, shardMiB: 0, unreportedShardProcesses: 0, foreignMiB: 318, foreignProcesses: [{ pid: 999_999, name: '[Not Found]', usedMiB: 300 }], migDevices: null, unreachable: null },
    { index: 1, uuid: UUIDS[1], usedMiB: 14661, shardMiB: 12595, unreportedShardProcesses: 0, foreignMiB: 2066, foreignProcesses: [{ pid: other.members[0], name: 'python3', usedMiB: 2048 }], migDevices: null, unreachable: null },
  ]);

  const ready = await app.inject({ method: 'GET', url: '/shards/llama-a/ready' });
  t.equal(ready.statusCode, 200);
  t.same({ ...ready.json(), observedAt: 'x' }, { shard: 'llama-a', ready: true, state: 'ready', cause: null, reason: null, warnings: [], observedAt: 'x' });
});

t.test('timeline: starting -> ready, and a stray GPU is a warning', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step, setProcesses } = await setup(t);
  await app.inject({ method: 'PUT', url: '/shards/s1', payload: { pid: shard.pid, gpus: [0], graceMs: 10_000 } });
  step(2000);
  let res = await app.inject({ method: 'GET', url: '/shards/s1/ready' });
  t.equal(res.statusCode, 503);
  t.equal(res.json().state, 'starting');
  t.match(res.json().reason, /GPU 0.*8\.0 s of its 10\.0 s grace left/);

  setProcesses([
    { gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'vllm', usedMiB: 4000 },
    { gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'vllm', usedMiB: 100 },
  ]);
  step();
  res = await app.inject({ method: 'GET', url: '/shards/s1/ready' });
  t.equal(res.statusCode, 200);
  t.equal(res.json().state, 'ready');
  t.match(res.json().warnings, [/GPU 1, which it was not given/]);
  const compute = (await app.inject({ method: 'GET', url: '/shards/s1/compute' })).json();
  t.same(compute.strayGpus, [{ index: 1, usedMiB: 100, smUtilPct: UNSAMPLED_SM, xidErrors: NO_XIDS, utilizationPct: 0, migDevices: null }]);
});

t.test('grace is judged by when the listing was begun: a refresh begun inside the grace that lands after it says starting, not on-cpu', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 1_000, maxStaleMs: 60_000 }, deps: { now: clock.now } });
  await app.inject({ method: 'PUT', url: '/shards/slow', payload: { pid: shard.pid, gpus: [1], graceMs: 5_000 } });
  t.equal((await app.inject({ method: 'GET', url: '/shards/slow/ready' })).json().state, 'starting');
  await settle(app);
  // nvidia-smi now takes a while (real time), and the clock passes the grace while it runs.
  fake.setScenario({ ...twoGpuNode(), delayMs: 300 });
  clock.advance(4_500);
  const during = await app.inject({ method: 'GET', url: '/shards/slow/ready' });
  t.equal(during.json().state, 'starting', 'answered from the expired snapshot while the refresh runs');
  t.ok(app.services.node.snapshots.refreshing, 'a refresh began 4.5 s after registration');
  clock.advance(1_000);
  await settle(app);
  const landed = await app.inject({ method: 'GET', url: '/shards/slow/ready' });
  t.equal(landed.statusCode, 503);
  t.equal(landed.json().state, 'starting', 'the grace is over by the clock, but not at the time of the evidence');
  t.equal(
    landed.json().reason,
    "waiting for the shard to hold memory on GPU 1 (the GPU driver lists none of its memory there yet). Its 5.0 s grace is over, but the GPU driver's latest listing was begun 4.5 s after registration, before the grace ended: " +
      'the verdict waits for a listing begun after the grace.',
    'no blame on nvidia-smi: its refresh was routine',
  );
  t.same(landed.json().warnings, [], 'nor a warning');

  fake.setScenario(twoGpuNode());
  clock.advance(1_001);
  await app.inject({ method: 'GET', url: '/shards/slow/ready' });
  await settle(app);
  const after = await app.inject({ method: 'GET', url: '/shards/slow/ready' });
  t.equal(after.json().state, 'on-cpu', 'a listing begun after the grace decides');
  t.match(after.json().reason, /its processes hold no memory on GPU 1, 6\.5 s after registration \(grace 5\.0 s\)/);
});

t.test('timeline: starting -> on-cpu after grace, with an actionable reason; then ready -> exited when killed', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step, setProcesses } = await setup(t);
  await app.inject({ method: 'PUT', url: '/shards/s2', payload: { pid: shard.pid, gpus: [1], engine: 'llama.cpp', graceMs: 5000 } });
  step(100);
  t.equal((await app.inject({ method: 'GET', url: '/shards/s2/ready' })).json().state, 'starting');
  step(5000);
  const onCpu = await app.inject({ method: 'GET', url: '/shards/s2/ready' });
  t.equal(onCpu.statusCode, 503);
  t.equal(onCpu.json().state, 'on-cpu');
  t.match(onCpu.json().reason, /placed on GPU 1 but computing on the CPU: its processes hold no memory on GPU 1/);
  t.match(onCpu.json().reason, /engine-output/);
  t.match(onCpu.json().reason, /nodecompute doctor/);
  t.equal((await app.inject({ method: 'GET', url: '/shards/s2/compute' })).json().backend, 'CPU');

  setProcesses([{ gpuUuid: UUIDS[1]!, pid: shard.pid, name: 'llama-server', usedMiB: 9000 }]);
  step();
  t.equal((await app.inject({ method: 'GET', url: '/shards/s2/ready' })).json().state, 'ready');

  await shard.kill();
  setProcesses([]);
  step();
  const exited = await app.inject({ method: 'GET', url: '/shards/s2/ready' });
  t.equal(exited.statusCode, 503);
  t.equal(exited.json().state, 'exited');
  t.match(exited.json().reason, new RegExp(`process ${shard.pid}`));
  const listed = (await app.inject({ method: 'GET', url: '/shards' })).json();
  t.equal(listed.shards[0].id, 's2', 'an exited shard stays registered: the control plane decides');
});

t.test('each verdict change is logged once, on-cpu and exited as warnings; probes in between log nothing', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { lines, log: logger } = captureLog('info');
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now, logger } });
  const verdictLines = () => lines.filter((line) => typeof line.shard === 'string' && 'state' in line).map((line) => [line.level, line.state, line.previous, line.msg]);
  const probe = async (times = 3) => {
    for (let i = 0; i < times; i += 1) {
      clock.advance(1);
      await app.inject({ method: 'GET', url: '/shards/v/ready' });
    }
  };
  await app.inject({ method: 'PUT', url: '/shards/v', payload: { pid: shard.pid, gpus: [1], graceMs: 5000 } });
  await probe();
  clock.advance(5000);
  await probe();
  // A new grace for the same process: the registration goes on, and so does its verdict (still on-cpu).
  await app.inject({ method: 'PUT', url: '/shards/v', payload: { pid: shard.pid, gpus: [1], graceMs: 4000 } });
  await probe();
  await settle(app);
  fake.setScenario(twoGpuNode([{ gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'vllm', usedMiB: 9000 }]));
  await probe();
  await app.inject({ method: 'GET', url: '/metrics' });
  await settle(app);
  failDriver(fake, { kind: 'driver-unreachable' });
  await probe();
  await settle(app);
  fake.update((scenario) => ({ ...scenario, failures: {} }));
  await probe();
  await shard.kill();
  await settle(app);
  fake.setScenario(twoGpuNode());
  await probe();

  t.match(verdictLines(), [
    [30, 'starting', null, /^Shard "v" is now starting: waiting for the shard to hold memory on GPU 1/],
    [40, 'on-cpu', 'starting', /^Shard "v" is now on-cpu: placed on GPU 1 but computing on the CPU: its processes hold no memory on GPU 1/],
    [30, 'ready', 'on-cpu', 'Shard "v" is now ready'],
    [40, 'exited', 'ready', /^Shard "v" is now exited: the shard's process exited/],
  ]);
  t.equal(verdictLines().length, 4, 'nothing for repeated probes, a new grace, /metrics, or nvidia-smi being away and back');
  t.match(lines.find((line) => line.state === 'on-cpu'), { shard: 'v', shardPid: shard.pid, cgroup: null, gpus: [1] }, 'a line says which process to look at');
  t.notOk(lines.some((line) => line.msg === 'Request answered'), 'a 503 verdict is not logged as a failed request');
});

t.test('a list that waited on a refresh while a shard was removed answers it as listed, and logs no verdict for it', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { lines, log: logger } = captureLog('info');
  // nvidia-smi may take longer than the held refresh below: the list must get a verdict, not "unverified".
  const config = { cacheTtlMs: 0, maxStaleMs: 0, smiTimeoutMs: 30_000 };
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode(), config, deps: { logger } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/gone', payload: { pid: shard.pid, gpus: [1] } })).statusCode, 201);
  await settle(app);
  // The list's refresh takes 5 s: the removal is stored well within it, even on a loaded machine.
  fake.update((scenario) => ({ ...scenario, delayMs: 5_000 }));
  const listing = app.inject({ method: 'GET', url: '/shards' });
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/gone' })).statusCode, 204);
  const listed = (await listing).json();
  t.same(listed.shards.map((s: { id: string; status: { state: string } }) => [s.id, s.status.state]), [['gone', 'starting']], 'listed before its removal, with a verdict');
  t.notOk(lines.some((line) => line.shard === 'gone' && 'state' in line), 'no verdict logged for a shard no longer registered');
});

t.test('a removed shard\'s verdict is forgotten, and so is that of one replaced on other GPUs: its first verdict is news again', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { lines, log: logger } = captureLog('info');
  const { app } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { logger } });
  const verdictLines = () => lines.filter((line) => line.shard === 'w' && 'state' in line).map((line) => [line.state, line.previous]);
  for (let round = 0; round < 2; round += 1) {
    t.equal((await app.inject({ method: 'PUT', url: '/shards/w', payload: { pid: shard.pid, gpus: [1], graceMs: 0 } })).statusCode, 201);
    t.equal((await app.inject({ method: 'GET', url: '/shards/w/ready' })).json().state, 'on-cpu');
    await settle(app);
    t.equal((await app.inject({ method: 'DELETE', url: '/shards/w' })).statusCode, 204);
  }
  t.equal((await app.inject({ method: 'PUT', url: '/shards/w', payload: { pid: shard.pid, gpus: [1], graceMs: 0 } })).statusCode, 201);
  t.equal((await app.inject({ method: 'GET', url: '/shards/w/ready' })).json().state, 'on-cpu');
  await settle(app);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/w', payload: { pid: shard.pid, gpus: [0], graceMs: 0 } })).statusCode, 200);
  t.equal((await app.inject({ method: 'GET', url: '/shards/w/ready' })).json().state, 'on-cpu');
  t.same(verdictLines(), [
    ['on-cpu', null],
    ['on-cpu', null],
    ['on-cpu', null],
    ['on-cpu', null],
  ], 'each registration and the move to GPU 0 logs its verdict; nothing else');
});

t.test('the engine saying CPU makes a GPU shard on-cpu at once, quoting what it saw', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step } = await setup(t);
  await app.inject({ method: 'PUT', url: '/shards/llama', payload: { pid: shard.pid, gpus: [0], engine: 'llama.cpp' } });
  const log = [
    'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected',
    'load_tensors: offloaded 33/33 layers to GPU',
    'load_tensors:   CPU_Mapped model buffer size =  4685.30 MiB',
  ].join('\n');
  const post = await app.inject({ method: 'POST', url: '/shards/llama/engine-output', payload: log, headers: { 'content-type': 'text/plain' } });
  t.equal(post.statusCode, 200);
  t.equal(post.json().account.backend, 'CPU');
  t.ok(post.json().tailBytes > 0);
  step();
  const ready = await app.inject({ method: 'GET', url: '/shards/llama/ready' });
  t.equal(ready.json().state, 'on-cpu', 'within grace, the engine\'s own word is enough');
  t.match(ready.json().reason, /the engine itself reports it/);
  t.match(ready.json().reason, /failed to initialize CUDA/);
  const compute = (await app.inject({ method: 'GET', url: '/shards/llama/compute' })).json();
  t.equal(compute.engine.backend, 'CPU');
});

t.test('on-cpu reasons agree with the engine output posted: weights on CUDA0 conflict with nvidia-smi, a CPU engine gets no offload warning, silent output is named', async (t) => {
  const [d, elsewhere, c, e] = await Promise.all([spawnShardProcess(t, 1), spawnShardProcess(t, 1), spawnShardProcess(t, 1), spawnShardProcess(t, 1)]);
  // GPU 1 holds the model of a process in another process group, which shard d does not cover.
  const { app, step } = await setup(t, twoGpuNode([{ gpuUuid: UUIDS[1]!, pid: elsewhere.members[0]!, name: 'llama-server', usedMiB: 64400 }]));
  for (const [id, shard, gpus] of [['d', d, [1]], ['c', c, [0]], ['e', e, [0]]] as const) {
    t.equal((await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid: shard.pid, gpus, engine: 'llama.cpp', graceMs: 0 } })).statusCode, 201);
  }
  const post = (id: string, file: string) => app.inject({ method: 'POST', url: `/shards/${id}/engine-output`, payload: sample(file), headers: { 'content-type': 'text/plain' } });
  t.match((await post('d', 'llamacpp-log_2025_load_tensors_cuda0_cpu_48of48.txt')).json().account, { backend: 'CUDA', layersOffloaded: 48, layersTotal: 48 });
  t.match((await post('c', 'llamacpp-log_2024-10_cortex1470_cuda-init-failed_claims-offload_cpu-only-buffer.txt')).json().account, { backend: 'CPU', layersOffloaded: 13, layersTotal: 33 });
  t.equal((await post('e', 'llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt')).json().account, null);
  // A refresh begun before e's registration may still run: the first probe would join it, and the
  // ones after it be answered from it (stale-while-revalidate), without e.
  await settle(app);
  step();

  const conflict = (await app.inject({ method: 'GET', url: '/shards/d/ready' })).json();
  t.equal(conflict.state, 'on-cpu');
  t.match(conflict.reason, /^placed on GPU 1, but its processes hold no memory on GPU 1, \d ms after registration \(grace 0 ms\), although the engine output posted to \/shards\/d\/engine-output says llama\.cpp put its model buffers on CUDA0 and offloaded 48\/48 layers \(load_tensors: CUDA0 model buffer size = 63980\.86 MiB\)\. /);
  t.match(conflict.reason, 'under no shard, the engine runs in a process this shard does not cover (a child started in another process group, or the wrong PID registered');
  t.notMatch(conflict.reason, /probably did not load|Post the engine's log/);
  t.same(conflict.warnings, []);
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.match(gpus.gpus[1].processes, [{ pid: elsewhere.members[0], shard: null }], 'GET /gpus shows the memory the reason points at, under no shard');

  const cpu = (await app.inject({ method: 'GET', url: '/shards/c/ready' })).json();
  t.equal(cpu.state, 'on-cpu');
  t.match(cpu.reason, 'llama.cpp found no usable GPU (ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected) although it reported 13/33 layers offloaded');
  t.same(cpu.warnings, [], 'no "offloaded only 13 of 33 layers" beside a reason that says the claim is false');

  const silent = (await app.inject({ method: 'GET', url: '/shards/e/ready' })).json();
  t.equal(silent.state, 'on-cpu');
  t.match(silent.reason, 'The output posted to /shards/e/engine-output says nothing about where llama.cpp computes: post its log at -lv 4');
});

t.test('a reused PID (fixture /proc) makes the shard exited', async (t) => {
  const root = t.testdir({ '4242': { stat: '4242 (llama-server) S 1 4242 4242 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 0' } });
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: 4242, name: 'llama-server', usedMiB: 500 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now, proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/r', payload: { pid: 4242, gpus: [0] } })).statusCode, 201);
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/r/ready' })).json().state, 'ready');
  writeFileSync(join(root, '4242', 'stat'), '4242 (bash) S 1 4242 4242 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 2000 0 0');
  clock.advance(1);
  const res = await app.inject({ method: 'GET', url: '/shards/r/ready' });
  t.equal(res.json().state, 'exited');
  t.match(res.json().reason, /PID 4242 now belongs to another process \(bash/);
});

t.test('after the node restarts, a registration of the last boot is exited even when its PID and start time come round again', async (t) => {
  const BOOT_1 = 'aaaaaaaa-0000-4000-8000-000000000001';
  const BOOT_2 = 'bbbbbbbb-0000-4000-8000-000000000002';
  // The same PID, group and start time in both boots (early processes of a node come up alike),
  // and in the second boot another member of that group holds GPU 1.
  const tree = (bootId: string) => ({
    sys: { kernel: { random: { boot_id: `${bootId}\n` } } },
    '4242': { stat: '4242 (llama-server) S 1 4242 4242 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 0' },
    '4243': { stat: '4243 (python3) S 1 4242 4242 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 1200 0 0' },
  });
  const scenario = twoGpuNode([
    { gpuUuid: UUIDS[0]!, pid: 4242, name: 'llama-server', usedMiB: 500 },
    { gpuUuid: UUIDS[1]!, pid: 4243, name: 'python3', usedMiB: 700 },
  ]);
  const dir = t.testdir({ [BOOT_1]: tree(BOOT_1), [BOOT_2]: tree(BOOT_2), state: {} });
  const stateFile = join(dir, 'state', 'shards.json');
  const boot = async (bootId: string) => {
    const clock = manualClock();
    const root = join(dir, bootId);
    const built = await buildTestApp(t, {
      scenario,
      config: { cacheTtlMs: 0, maxStaleMs: 0, stateFile },
      deps: { now: clock.now, proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
    });
    return { ...built, clock };
  };

  const first = await boot(BOOT_1);
  const put = await first.app.inject({ method: 'PUT', url: '/shards/r', payload: { pid: 4242, gpus: [0] } });
  t.equal(put.statusCode, 201);
  t.equal(put.json().identity.bootId, BOOT_1, 'the registration names its boot');
  first.clock.advance(1);
  t.equal((await first.app.inject({ method: 'GET', url: '/shards/r/ready' })).json().state, 'ready');
  await first.app.close();

  const second = await boot(BOOT_2);
  const probe = await second.app.inject({ method: 'GET', url: '/shards/r/ready' });
  t.equal(probe.statusCode, 503);
  t.equal(probe.json().state, 'exited');
  const restarted = new RegExp(
    `node has restarted since it was registered \\(boot ${BOOT_1}, now ${BOOT_2}\\): process 4242 ended with that boot, .*not this shard's\\. ` +
      'Register the engine\'s new process \\(PUT /shards/r\\), or remove the shard \\(DELETE /shards/r\\)',
  );
  t.match(probe.json().reason, restarted);
  t.notMatch(probe.json().reason, /kill/, 'and names no process of this boot to kill');
  const gpus = (await second.app.inject({ method: 'GET', url: '/gpus' })).json().gpus;
  t.same(
    gpus.map((gpu: { processes: Array<{ pid: number; shard: string | null }> }) => gpu.processes.map((p) => [p.pid, p.shard])),
    [[[4242, null]], [[4243, null]]],
    'this boot\'s PID 4242 and its group are not the shard\'s',
  );
  const foreign = (await second.app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json().gpus;
  t.same(foreign.map((gpu: { foreignMiB: number }) => gpu.foreignMiB), [518, 718], 'their memory is foreign');

  const again = await second.app.inject({ method: 'PUT', url: '/shards/now', payload: { pid: 4242, gpus: [0] } });
  t.equal(again.statusCode, 201, 'the process of this boot registers under another id: no conflict with the last boot\'s');
  t.equal(again.json().identity.bootId, BOOT_2);
  second.clock.advance(1);
  t.equal((await second.app.inject({ method: 'GET', url: '/shards/now/ready' })).json().state, 'ready');

  await settle(second.app);
  failDriver(second.fake, { kind: 'driver-unreachable' });
  second.clock.advance(1);
  const blind = (await second.app.inject({ method: 'GET', url: '/shards/r/ready' })).json();
  t.equal(blind.state, 'exited', 'with nvidia-smi failing, /proc and the boot id still say exited');
  t.match(blind.reason, restarted);
  t.equal((await second.app.inject({ method: 'GET', url: '/shards/now/ready' })).json().state, 'unverified', "and this boot's process is unverified");
});

t.test('a registration stored without a boot id (by an earlier version) is judged by PID and start time, and gains one when re-PUT', async (t) => {
  const BOOT = 'cccccccc-0000-4000-8000-000000000003';
  const dir = t.testdir({
    proc: {
      sys: { kernel: { random: { boot_id: `${BOOT}\n` } } },
      '4242': { stat: '4242 (llama-server) S 1 4242 4242 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 0' },
    },
    state: {},
  });
  const root = join(dir, 'proc');
  const stateFile = join(dir, 'state', 'shards.json');
  const stored = { id: 'old', pid: 4242, cgroup: null, gpus: [0], engine: 'llama.cpp', graceMs: 0, registeredAt: 1_000, identity: { pid: 4242, pgid: 4242, startTime: 1000, name: 'llama-server' } };
  writeFileSync(stateFile, JSON.stringify({ format: 'nodecompute-shards/v1', shards: [stored] }));
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: 4242, name: 'llama-server', usedMiB: 500 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0, stateFile },
    deps: { now: clock.now, proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  t.equal((await app.inject({ method: 'GET', url: '/shards/old/ready' })).json().state, 'ready', 'the same PID and start time: its process');
  const replaced = await app.inject({ method: 'PUT', url: '/shards/old', payload: { pid: 4242, gpus: [0], engine: 'llama.cpp', graceMs: 0 } });
  t.equal(replaced.statusCode, 200);
  t.equal(replaced.json().registeredAt, new Date(1_000).toISOString(), 'the same process: its registration time (and grace) go on');
  t.equal(replaced.json().identity.bootId, BOOT);
  t.equal(JSON.parse(readFileSync(stateFile, 'utf8')).shards[0].identity.bootId, BOOT, 'stored with it');
});

t.test('a shard removed while its probe waits for a refresh is a 404, not a verdict on the removed record', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step, fake } = await setup(t);
  await app.inject({ method: 'PUT', url: '/shards/gone', payload: { pid: shard.pid, gpus: [1] } });
  fake.setScenario({ ...twoGpuNode(), delayMs: 300 });
  step();
  const probe = app.inject({ method: 'GET', url: '/shards/gone/ready' });
  const state = app.inject({ method: 'GET', url: '/shards/gone' });
  await waitUntil(() => app.services.node.snapshots.refreshing, { what: 'the requests to start a refresh' });
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/gone' })).statusCode, 204);
  for (const res of await Promise.all([probe, state])) {
    t.equal(res.statusCode, 404);
    t.equal(res.json().code, 'NODECOMPUTE_SHARD_NOT_FOUND');
  }
});

t.test('a DELETE that says application/json but carries no body is a plain DELETE; a PUT with no body is still refused', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  const json = { 'content-type': 'application/json' };
  t.equal((await app.inject({ method: 'PUT', url: '/shards/d', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/d', headers: json })).statusCode, 204);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/d', headers: json })).statusCode, 404, 'and it was removed');
  const put = await app.inject({ method: 'PUT', url: '/shards/d', headers: json });
  t.equal(put.statusCode, 400);
  t.match(put.json().message, 'The JSON body is empty');
  const broken = await app.inject({ method: 'DELETE', url: '/shards/d', headers: json, payload: '{"a":' });
  t.equal(broken.statusCode, 400, 'a DELETE body that is there must still be JSON');
  const poisoned = await app.inject({ method: 'PUT', url: '/shards/d', headers: json, payload: `{"pid": ${shard.pid}, "gpus": [0], "__proto__": {"x": 1}}` });
  t.equal(poisoned.statusCode, 400, 'Fastify\'s own parser still refuses __proto__');
});

t.test('a body is taken as sent in UTF-8: identity and UTF-8 or US-ASCII however spelt pass; another coding is 415 with Accept-Encoding: identity', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  const put = (headers: Record<string, string>) => app.inject({ method: 'PUT', url: '/shards/utf', headers, payload: JSON.stringify({ pid: shard.pid, gpus: [0] }) });
  for (const type of ['application/json', 'application/json; charset=utf-8', 'application/json;charset=UTF-8', 'application/json; charset="utf8"', 'application/json; charset=US-ASCII', 'application/json; charset=ascii', 'application/json; charset=ANSI_X3.4-1968']) {
    t.ok([200, 201].includes((await put({ 'content-type': type })).statusCode), `${type}: registered`);
  }
  t.equal((await put({ 'content-type': 'application/json', 'content-encoding': 'Identity' })).statusCode, 200, 'Content-Encoding: identity is the body as sent');
  const post = (headers: Record<string, string>, payload: string) => app.inject({ method: 'POST', url: '/shards/utf/engine-output', headers, payload });
  const accepted = await post({ 'content-type': 'text/plain; format=flowed; charset=utf-8', 'content-encoding': '' }, 'load_tensors: offloaded 33/33 layers to GPU — café\n');
  t.equal(accepted.statusCode, 200, 'UTF-8 text with an empty Content-Encoding');
  t.match(app.services.registry.engine('utf')?.tail, /café\n$/, 'kept as it was written');
  const gzipped = await post({ 'content-type': 'text/plain', 'content-encoding': 'gzip' }, 'x');
  t.equal(gzipped.statusCode, 415);
  t.equal(gzipped.headers['accept-encoding'], 'identity', 'RFC 9110 15.5.16: the codings a request may use');
  const latin1 = await post({ 'content-type': 'text/plain; charset=ISO-8859-1' }, 'x');
  t.equal(latin1.statusCode, 415);
  t.equal(latin1.headers['accept-encoding'], undefined, 'not for a charset');
  t.match(app.services.registry.engine('utf')?.tail, /café\n$/, 'neither was kept');
});

t.test('registering a zombie is refused: the process has already exited', async (t) => {
  // The background sleep exits at once; its parent, exec'd into a long sleep, never reaps it.
  const parent = spawn('sh', ['-c', 'sleep 0 & echo $!; exec sleep 600'], { stdio: ['ignore', 'pipe', 'ignore'], detached: true });
  t.teardown(() => void parent.kill('SIGKILL'));
  const zombie = Number(await new Promise<string>((resolve) => parent.stdout.once('data', (chunk: Buffer) => resolve(chunk.toString()))));
  await waitUntil(() => /^\d+ \(sleep\) Z /.test(readFileSync(`/proc/${zombie}/stat`, 'utf8')), { what: 'the child to be a zombie' });
  const { app } = await setup(t);
  const res = await app.inject({ method: 'PUT', url: '/shards/z', payload: { pid: zombie, gpus: [0] } });
  t.equal(res.statusCode, 422);
  t.equal(res.json().code, 'NODECOMPUTE_PROCESS_NOT_FOUND');
  t.match(res.json().message, `Process ${zombie} (sleep) has already exited: it is a zombie`);
  t.match(res.json().message, "Register the engine's live process");
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards, []);
});

t.test('registering a kernel thread (fixture /proc) is refused as a container PID mistaken for a host PID', async (t) => {
  const root = t.testdir({
    '2': { stat: '2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 2 0 0' },
    '57': { stat: '57 (kworker/1:1-events) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 30 0 0' },
  });
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode(),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  for (const [pid, comm] of [[2, 'kthreadd'], [57, 'kworker/1:1-events']] as const) {
    const res = await app.inject({ method: 'PUT', url: `/shards/k${pid}`, payload: { pid, gpus: [0] } });
    t.equal(res.statusCode, 422, comm);
    t.equal(res.json().code, 'NODECOMPUTE_NOT_A_SHARD_PROCESS', `${comm}: it exists, but is no shard`);
    t.match(res.json().message, `PID ${pid} in ${root} is the kernel thread ${comm}, not a shard. A PID as a container sees it?`);
    t.match(res.json().message, "docker inspect -f '{{.State.Pid}}' CONTAINER");
  }
});

t.test('nvidia-smi gone -> a shard it saw ready is unverified (200, with a warning); compute and foreign memory are 503', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step, fake, setProcesses } = await setup(t);
  setProcesses([{ gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 4096 }]);
  await app.inject({ method: 'PUT', url: '/shards/u', payload: { pid: shard.pid, gpus: [0] } });
  await settle(app);
  t.equal((await app.inject({ method: 'GET', url: '/shards/u/ready' })).json().state, 'ready');
  failDriver(fake, { kind: 'driver-unreachable' });
  step();
  const res = await app.inject({ method: 'GET', url: '/shards/u/ready' });
  t.equal(res.statusCode, 200);
  t.equal(res.json().state, 'unverified');
  t.equal(res.json().observedAt, null);
  t.match(res.json().warnings, [new RegExp(`the GPU driver cannot be asked.*${UNREACHABLE_SAID}`)]);
  t.equal((await app.inject({ method: 'GET', url: '/shards/u/compute' })).statusCode, 503);
  t.equal((await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).statusCode, 503);
  const list = (await app.inject({ method: 'GET', url: '/shards' })).json();
  t.equal(list.observedAt, null);
  t.match(list.staleReason, /no snapshot/);
  t.equal(list.shards[0].status.state, 'unverified');
  t.equal(list.shards[0].compute, null);
  const one = await app.inject({ method: 'GET', url: '/shards/u' });
  t.equal(one.statusCode, 200, 'one shard is still answered, as unverified');
  t.match(one.json(), { id: 'u', observedAt: null, ageMs: null, stale: true, status: { state: 'unverified' }, compute: null });
  t.match(one.json().staleReason, new RegExp(`^no snapshot: .*${UNREACHABLE_SAID}`));
});

t.test('a cgroup shard is every process whose cgroup contains the string', async (t) => {
  const podUid = '7d5b1f2c-1111-4c3e-9e0a-3f7c2b9d8e11';
  const root = t.testdir({
    '100': { stat: '100 (vllm) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0', cgroup: `0::/kubepods.slice/kubepods-pod${podUid.replaceAll('-', '_')}.slice/cri-containerd-abc.scope\n` },
    '101': { stat: '101 (vllm-worker) S 100 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 501 0 0', cgroup: `0::/kubepods/pod${podUid}/abc\n` },
    '200': { stat: '200 (python3) S 1 200 200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 600 0 0', cgroup: '0::/system.slice/other.service\n' },
  });
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, {
    scenario: twoGpuNode([
      { gpuUuid: UUIDS[0]!, pid: 101, name: 'vllm-worker', usedMiB: 7000 },
      { gpuUuid: UUIDS[0]!, pid: 200, name: 'python3', usedMiB: 1000 },
    ]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now, proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  const put = await app.inject({ method: 'PUT', url: '/shards/pod-a', payload: { cgroup: podUid, gpus: [0], engine: 'vllm' } });
  t.equal(put.statusCode, 201);
  t.equal(put.json().identity.pid, 100, 'identity is the lowest PID of the cgroup');
  t.equal(put.json().cgroup, podUid);
  t.equal(put.json().pid, null);
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/pod-a/ready' })).json().state, 'ready');
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.equal(foreign.gpus[0].shardMiB, 7000);
  t.same(foreign.gpus[0].foreignProcesses.map((p: { pid: number }) => p.pid), [200]);

  const { rmSync } = await import('node:fs');
  rmSync(join(root, '100'), { recursive: true });
  rmSync(join(root, '101'), { recursive: true });
  fake.setScenario(twoGpuNode([]));
  clock.advance(1);
  const gone = (await app.inject({ method: 'GET', url: '/shards/pod-a/ready' })).json();
  t.equal(gone.state, 'exited');
  t.match(gone.reason, /no process is left in cgroup/);
});

t.test('registration: create 201, replace 200, list, get, delete 204 then 404', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0, 1] } })).statusCode, 201);
  const replaced = await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [] } });
  t.equal(replaced.statusCode, 200);
  t.same(replaced.json().gpus, []);
  const one = (await app.inject({ method: 'GET', url: '/shards/a' })).json();
  t.equal(one.id, 'a');
  t.equal(one.status.state, 'ready', 'a shard given no GPU is ready while alive');
  t.equal(one.compute.backend, 'CPU');
  const { shards: listed, ...listHeader } = (await app.inject({ method: 'GET', url: '/shards' })).json();
  t.strictSame(one, { ...listed[0], ...listHeader }, 'the shard as the list has it, from the same snapshot, which it names as the list does');
  t.ok(Number.isFinite(Date.parse(one.observedAt)), 'observedAt is a date');
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/a' })).statusCode, 204);
  const again = await app.inject({ method: 'DELETE', url: '/shards/a' });
  t.equal(again.statusCode, 404);
  t.equal(again.json().code, 'NODECOMPUTE_SHARD_NOT_FOUND');
  for (const url of ['/shards/a', '/shards/a/ready', '/shards/a/compute']) {
    t.equal((await app.inject({ method: 'GET', url })).statusCode, 404, url);
  }
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards, []);
});

t.test('registration is validated against the node and /proc', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  const unknownGpu = await app.inject({ method: 'PUT', url: '/shards/x', payload: { pid: shard.pid, gpus: [0, 5] } });
  t.equal(unknownGpu.statusCode, 422);
  t.equal(unknownGpu.json().code, 'NODECOMPUTE_UNKNOWN_GPU');
  t.match(unknownGpu.json().message, 'GPU 5 does not exist on this node; it has GPU 0, 1');
  const noProcess = await app.inject({ method: 'PUT', url: '/shards/x', payload: { pid: 4_194_000, gpus: [0] } });
  t.equal(noProcess.statusCode, 422);
  t.equal(noProcess.json().code, 'NODECOMPUTE_PROCESS_NOT_FOUND');
  t.match(noProcess.json().message, 'No process with PID 4194000');
  const noCgroup = await app.inject({ method: 'PUT', url: '/shards/x', payload: { cgroup: 'deadbeefdeadbeef', gpus: [0] } });
  t.equal(noCgroup.statusCode, 422);
  t.match(noCgroup.json().message, 'deadbeefdeadbeef');
  const both = await app.inject({ method: 'PUT', url: '/shards/x', payload: { pid: shard.pid, cgroup: 'deadbeefdeadbeef', gpus: [0] } });
  t.equal(both.statusCode, 400);
  t.match(both.json().message, 'not both');
  const neither = await app.inject({ method: 'PUT', url: '/shards/x', payload: { gpus: [0] } });
  t.equal(neither.statusCode, 400);
  t.match(neither.json().message, 'Give "pid"');
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards, [], 'nothing registered by rejected writes');
});

t.test('GPUs are taken on trust when nvidia-smi cannot be asked at registration, with one warning per registration stored', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { lines, log: logger } = captureLog('info');
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode(), deps: { logger } });
  failDriver(fake, { kind: 'no-devices' });
  const put = (pid: number, gpus: number[]) => app.inject({ method: 'PUT', url: '/shards/trust', payload: { pid, gpus } });
  const unchecked = () => lines.filter((line) => String(line.msg).includes('unchecked'));

  t.equal((await put(shard.pid, [7])).statusCode, 201);
  t.match(unchecked(), [
    {
      level: 40,
      shard: 'trust',
      gpus: [7],
      nvidiaSmi: new RegExp(`^${NO_GPUS_FAILED}`),
      msg: /^Shard "trust" was stored with GPU 7 unchecked \(the GPU driver cannot be asked\): .*GET \/gpus/,
    },
  ]);
  t.notOk('err' in unchecked()[0]!, 'the failure is said in its own words, without a stack');
  t.equal((await put(shard.pid, [7])).statusCode, 200, 'a control plane repeating it');
  t.equal(unchecked().length, 1, 'is not warned about again');
  await shard.kill();
  t.equal((await put(shard.pid, [6])).statusCode, 422, 'a registration refused for its process');
  t.equal(unchecked().length, 1, 'is not said to be registered');
});

t.test('a verdict says nothing about a routine refresh, however long nobody asked; it warns once the refresh is slow', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, {
    scenario: twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'vllm', usedMiB: 100 }]),
    config: { cacheTtlMs: 1000, maxStaleMs: 60_000, smiTimeoutMs: 120_000 },
    deps: { now: clock.now },
  });
  await app.inject({ method: 'PUT', url: '/shards/slow', payload: { pid: shard.pid, gpus: [0] } });
  await settle(app);
  clock.advance(1);
  t.same((await app.inject({ method: 'GET', url: '/shards/slow/ready' })).json().warnings, [], 'a fresh snapshot: nothing to say');
  await settle(app);
  // nvidia-smi now takes a minute (real time); this clock moves only when the test says.
  fake.update((s) => ({ ...s, delayMs: 60_000 }));
  clock.advance(20_000);
  const routine = (await app.inject({ method: 'GET', url: '/shards/slow/ready' })).json();
  t.equal(routine.state, 'ready');
  t.same(routine.warnings, [], 'a 20 s old snapshot while its refresh has just begun: routine, not news');
  const list = (await app.inject({ method: 'GET', url: '/shards' })).json();
  t.same([list.stale, list.staleReason], [true, 'refreshing: this snapshot is 20.0 s old and a newer one is being taken'], 'the answer says it is stale, without blaming nvidia-smi');
  clock.advance(7000);
  const old = (await app.inject({ method: 'GET', url: '/shards/slow/ready' })).json();
  t.equal(old.state, 'ready');
  t.match(old.warnings, [/^answered from an older snapshot: the GPU driver is slow: a refresh has been running for 7\.0 s \(the last one took \d+ ms\), so answers come from a snapshot 27\.0 s old/]);
});

t.test('a steady probe keeps its verdict only while the snapshot, the registration and the engine output stay the same', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 4000 }]),
    config: { cacheTtlMs: 60_000, maxStaleMs: 60_000 },
    deps: { now: clock.now },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/steady', payload: { pid: shard.pid, gpus: [0], engine: 'llama.cpp' } })).statusCode, 201);
  const before = await app.inject({ method: 'GET', url: '/gpus' });
  t.same([before.json().stale, before.json().staleReason], [true, 'the shard registry changed since it was taken; a refresh is under way'], 'the snapshot from before the registration is stale');
  t.equal(before.headers['cache-control'], 'max-age=0', 'and not to be cached, although young');
  await settle(app);
  clock.advance(1);
  const probes = await Promise.all([1, 2, 3].map(() => app.inject({ method: 'GET', url: '/shards/steady/ready' })));
  t.same(probes.map((probe) => probe.statusCode), [200, 200, 200]);
  t.equal(probes[0]!.json().state, 'ready');
  t.ok(probes.every((probe) => probe.body === probes[0]!.body), 'one verdict, the same bytes for every probe');

  const post = await app.inject({
    method: 'POST',
    url: '/shards/steady/engine-output',
    payload: 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\nload_tensors:   CPU_Mapped model buffer size =  4685.30 MiB\n',
    headers: { 'content-type': 'text/plain' },
  });
  t.equal(post.statusCode, 200);
  const afterEngine = await app.inject({ method: 'GET', url: '/shards/steady/ready' });
  t.same([afterEngine.statusCode, afterEngine.json().state], [503, 'on-cpu'], 'new engine output changes the verdict at once, same snapshot');

  t.equal((await app.inject({ method: 'PUT', url: '/shards/steady', payload: { pid: shard.pid, gpus: [1] } })).statusCode, 200);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  const replaced = await app.inject({ method: 'GET', url: '/shards/steady/ready' });
  t.same([replaced.statusCode, replaced.json().state], [503, 'starting'], 'a replaced registration is judged afresh (GPU 1 is not held yet)');

  const logged = await app.inject({ method: 'POST', url: '/shards/steady/engine-output', payload: 'main: loading model\n', headers: { 'content-type': 'text/plain' } });
  t.equal(logged.statusCode, 200);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/steady' })).statusCode, 204);
  t.equal((await app.inject({ method: 'GET', url: '/shards/steady/ready' })).statusCode, 404, 'removed, with its engine output');
});

const CUDA_FAILED_LOG = 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\nload_tensors:   CPU_Mapped model buffer size =  4685.30 MiB\n';

t.test('engine output is one stream: a log posted in pieces cut mid-line reads as one post; a post without a final newline is continued by the next', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/pieces', payload: { pid: shard.pid, gpus: [1], engine: 'llama.cpp' } })).statusCode, 201);
  const post = async (text: string) =>
    (await app.inject({ method: 'POST', url: '/shards/pieces/engine-output', payload: text, headers: { 'content-type': 'text/plain' } })).json();
  const cut = CUDA_FAILED_LOG.indexOf('CUDA') + 2;
  t.match(await post(CUDA_FAILED_LOG.slice(0, cut)), { account: null }, 'half a line says nothing yet');
  const whole = await post(CUDA_FAILED_LOG.slice(cut));
  t.match(whole, { account: { backend: 'CPU' }, tailBytes: Buffer.byteLength(CUDA_FAILED_LOG) }, 'the rest of it completes the line');
  t.match(whole.account.evidence, /failed to initialize CUDA/);
});

t.test('engine output is one stream of bytes: a character cut between two posts, at any of its bytes, is read whole, and the account reads it', async (t) => {
  const [listed, using] = await Promise.all([spawnShardProcess(t, 0), spawnShardProcess(t, 0)]);
  const { app } = await setup(t);
  for (const [id, shard] of [['listed', listed], ['using', using]] as const) {
    t.equal((await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid: shard.pid, gpus: [1], engine: 'llama.cpp' } })).statusCode, 201);
  }
  const post = (id: string, bytes: Buffer) => app.inject({ method: 'POST', url: `/shards/${id}/engine-output`, payload: bytes, headers: { 'content-type': 'text/plain' } });

  // What a log shipper cutting at 8 KiB did to llama.cpp's --list-devices: the euro sign's 3 bytes, 2 and 1.
  const list = Buffer.from('Available devices:\n  CUDA0: NVIDIA Ünïcødé€ (8187 MiB, 7900 MiB free)\n');
  const cut = list.indexOf('€') + 2;
  const first = await post('listed', list.subarray(0, cut));
  t.same([first.statusCode, first.json().tailBytes], [200, list.indexOf('€')], 'the start of the euro sign is held, not counted as kept');
  const second = await post('listed', list.subarray(cut));
  t.same([second.statusCode, second.json().tailBytes], [200, list.length]);
  t.same(second.json().account.devices, ['CUDA0: NVIDIA Ünïcødé€ (8187 MiB)']);
  t.equal(app.services.registry.engine('listed')?.tail, list.toString(), 'kept as written, no U+FFFD');

  // Every cut of a 2-, 3- and 4-byte character, each in its own device line posted in two pieces.
  const devices: string[] = [];
  let answer = first;
  for (const char of ['é', '€', '🚀']) {
    for (let at = 1; at < Buffer.byteLength(char); at += 1) {
      const name = `NVIDIA ${char} cut after byte ${at}`;
      const line = Buffer.from(`llama_model_load_from_file_impl: using device CUDA${devices.length} (${name}) - 8187 MiB free\n`);
      const split = line.indexOf(char) + at;
      const statuses = [(await post('using', line.subarray(0, split))).statusCode, (answer = await post('using', line.subarray(split))).statusCode];
      t.same(statuses, [200, 200], name);
      devices.push(`CUDA${devices.length}: ${name}`);
    }
  }
  t.equal(devices.length, 6);
  t.same(answer.json().account.devices, devices, 'every cut character read whole');
  t.notMatch(app.services.registry.engine('using')?.tail, /\uFFFD/);
});

t.test('engine output that is not UTF-8 is kept as U+FFFD, not refused; the start of a cut character goes with the tail, or when the next post does not go on with it', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  const put = async (gpus: number[]) => (await app.inject({ method: 'PUT', url: '/shards/bytes', payload: { pid: shard.pid, gpus, engine: 'llama.cpp' } })).statusCode;
  const post = async (bytes: string) =>
    (await app.inject({ method: 'POST', url: '/shards/bytes/engine-output', payload: Buffer.from(bytes, 'latin1'), headers: { 'content-type': 'text/plain' } })).statusCode;
  const tail = () => app.services.registry.engine('bytes')?.tail;
  t.equal(await put([1]), 201);
  t.equal(await post(CUDA_FAILED_LOG), 200);

  const bad = { 'Latin-1 é': 'caf\xe9\n', 'a lone continuation byte': '\x80\n', 'an encoded surrogate': '\xed\xa0\x80\n', '0xFF mid-line': 'a\xffb\n' };
  for (const [what, bytes] of Object.entries(bad)) t.equal(await post(bytes), 200, `${what}: kept, not refused`);
  t.equal(tail(), `${CUDA_FAILED_LOG}caf\uFFFD\n\uFFFD\n\uFFFD\uFFFD\uFFFD\na\uFFFDb\n`, 'each as U+FFFD, as a UTF-8 reader shows it');
  t.match(await app.inject({ method: 'GET', url: '/shards/bytes' }).then((res) => res.json()), { status: { state: 'on-cpu', cause: 'engine-gpu-backend-failed' } }, 'the account still reads the log');

  t.equal(await post('x \xe2\x82'), 200);
  t.equal(await post('\xac\n'), 200);
  t.match(tail(), /x €\n$/, 'a character cut between two posts');
  t.equal(await post('y \xe2\x82'), 200);
  t.equal(await post('z\n'), 200);
  t.match(tail(), /y \uFFFDz\n$/, 'a post that does not go on with the cut character: its start reads as U+FFFD');

  t.equal(await post('v \xf0\x9f'), 200);
  t.equal(await put([0]), 200);
  t.equal(await post('\x9a\x80\n'), 200, 'the same process on other GPUs keeps its tail, and the held bytes with it');
  t.match(tail(), /v 🚀\n$/);

  t.equal(await post('w \xe2\x82'), 200);
  t.equal(await post('\xe2'), 200);
  t.match(tail(), /v 🚀\nw \uFFFD$/, 'a cut character broken off by the start of another: U+FFFD, and the new start is held');
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/bytes' })).statusCode, 204);
  t.equal(await put([1]), 201);
  t.equal(await post('\x82\xac\n'), 200);
  t.equal(tail(), '\uFFFD\uFFFD\n', 'removed: the held bytes went with the tail');
});

t.test('nvidia-smi gone: /proc still says exited and the engine still says on-cpu; a shard it saw ready is unverified, with no /proc read per probe', async (t) => {
  const [gone, cpu, alive] = await Promise.all([spawnShardProcess(t, 1), spawnShardProcess(t, 1), spawnShardProcess(t, 1)]);
  const clock = manualClock();
  const reads = { stats: 0 };
  const real = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  const proc = { ...real, readStats: (...args: Parameters<typeof real.readStats>) => ((reads.stats += 1), real.readStats(...args)) };
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now, proc } });
  for (const [id, shard, gpus] of [['gone', gone, [0]], ['cpu', cpu, [1]], ['alive', alive, [0]]] as const) {
    t.equal((await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid: shard.pid, gpus, engine: 'llama.cpp' } })).statusCode, 201);
  }
  await app.inject({ method: 'POST', url: '/shards/cpu/engine-output', payload: CUDA_FAILED_LOG, headers: { 'content-type': 'text/plain' } });
  // A registration's background refresh may still be running and may have read the old scenario:
  // let it finish, then move the clock so the probe cannot be answered by that snapshot.
  await settle(app);
  fake.setScenario(twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: alive.members[0]!, name: 'llama-server', usedMiB: 4096 }]));
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/alive/ready' })).json().state, 'ready');
  failDriver(fake, { kind: 'driver-unreachable' });
  await gone.kill();
  clock.advance(1);

  const exited = await app.inject({ method: 'GET', url: '/shards/gone/ready' });
  t.equal(exited.statusCode, 503, 'not ready: its process is gone, whatever nvidia-smi says');
  t.match(exited.json(), { state: 'exited', reason: new RegExp(`^the shard's process exited: process ${gone.pid} (no longer exists|has exited)`), observedAt: null });
  const onCpu = await app.inject({ method: 'GET', url: '/shards/cpu/ready' });
  t.equal(onCpu.statusCode, 503);
  t.match(onCpu.json(), {
    state: 'on-cpu',
    reason: /^placed on GPU 1 but computing on the CPU: the engine itself reports it\..*failed to initialize CUDA/,
    warnings: [new RegExp(`^the GPU driver cannot be asked, so this verdict rests on the engine's own output: .*${UNREACHABLE_SAID}`)],
  });
  const unverified = await app.inject({ method: 'GET', url: '/shards/alive/ready' });
  t.equal(unverified.statusCode, 200, 'alive, last seen ready, and only nvidia-smi could tell where it computes now');
  t.match(unverified.json(), { state: 'unverified', warnings: [/^the GPU driver cannot be asked, so where this shard computes is unverified and it keeps serving: /] });

  const readsBefore = reads.stats;
  for (let i = 0; i < 20; i += 1) await app.inject({ method: 'GET', url: `/shards/${['gone', 'cpu', 'alive'][i % 3]}/ready` });
  t.equal(reads.stats, readsBefore, 'probes within the failure window read nothing: the failed refresh read /proc once for all');
  const list = (await app.inject({ method: 'GET', url: '/shards' })).json();
  t.same(list.shards.map((s: { id: string; status: { state: string }; compute: unknown }) => [s.id, s.status.state, s.compute]), [['alive', 'unverified', null], ['cpu', 'on-cpu', null], ['gone', 'exited', null]]);

  // A shard registered after that read is not described by it: not exited; and nvidia-smi never saw it, so starting.
  const late = await spawnShardProcess(t, 0);
  clock.advance(1);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/late', payload: { pid: late.pid, gpus: [0] } })).statusCode, 201, 'GPUs taken on trust');
  t.match((await app.inject({ method: 'GET', url: '/shards/late/ready' })).json(), { state: 'starting', cause: 'awaiting-nvidia-smi' });
});

t.test('an identical re-PUT keeps registeredAt and the grace clock: an on-cpu shard stays on-cpu; other GPUs restart the grace', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { lines, log: logger } = captureLog('debug');
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now, logger } });
  const body = { pid: shard.pid, gpus: [1], graceMs: 5000 };
  const first = await app.inject({ method: 'PUT', url: '/shards/r', payload: body });
  t.equal(first.statusCode, 201);
  clock.advance(6000);
  t.equal((await app.inject({ method: 'GET', url: '/shards/r/ready' })).json().state, 'on-cpu');
  const logged = lines.length;

  clock.advance(1);
  const again = await app.inject({ method: 'PUT', url: '/shards/r', payload: body });
  t.equal(again.statusCode, 200, 'a replacement answers 200');
  t.equal(again.json().registeredAt, first.json().registeredAt, 'registeredAt kept');
  clock.advance(1);
  const probe = (await app.inject({ method: 'GET', url: '/shards/r/ready' })).json();
  t.equal(probe.state, 'on-cpu', 'still on-cpu: a reconciling control plane does not hide it');
  t.match(probe.reason, /its processes hold no memory on GPU 1, 6\.0 s after registration \(grace 5\.0 s\)/);
  const since = lines.slice(logged).filter((line) => line.shard === 'r');
  t.match(since, [{ level: 20, msg: 'Shard registration repeated unchanged; its grace clock goes on', created: false, registeredAt: first.json().registeredAt }]);
  t.equal(since.length, 1, 'one debug line: no info line, and the verdict, unchanged, is not logged again');

  clock.advance(1);
  const registrations = () => lines.filter((line) => String(line.msg).startsWith('Shard registration'));
  const longer = await app.inject({ method: 'PUT', url: '/shards/r', payload: { ...body, graceMs: 600_000 } });
  t.same([longer.statusCode, longer.json().registeredAt, longer.json().graceMs], [200, first.json().registeredAt, 600_000], 'a longer grace counts from the first registration');
  t.match(registrations().at(-1), { level: 30, msg: /^Shard registration replaced for the same process and GPUs; its grace clock goes on/ });
  clock.advance(1);
  t.match((await app.inject({ method: 'GET', url: '/shards/r/ready' })).json().reason, /; 9\.9 min of its 10 min grace left\.$/, 'long graces in minutes');

  clock.advance(1);
  const moved = await app.inject({ method: 'PUT', url: '/shards/r', payload: { ...body, gpus: [0] } });
  t.equal(moved.statusCode, 200);
  t.not(moved.json().registeredAt, first.json().registeredAt, 'other GPUs: registered anew');
  t.match(registrations().at(-1), { level: 30, msg: 'Shard registration replaced with another process or other GPUs; its grace starts again' });
  clock.advance(1);
  const restarted = (await app.inject({ method: 'GET', url: '/shards/r/ready' })).json();
  t.match(restarted, { state: 'starting', reason: /GPU 0.*; 5\.0 s of its 5\.0 s grace left\.$/ });
});

t.test('a shard as GET answers it, nulls and read-only fields too, PUT back unchanged is an unchanged repeat: 200, the same record, its grace going on', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { lines, log: logger } = captureLog('debug');
  const clock = manualClock();
  const { app, config } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now, logger } });
  const first = await app.inject({ method: 'PUT', url: '/shards/r', payload: { pid: shard.pid, gpus: [1], graceMs: 5000 } });
  t.equal(first.statusCode, 201);
  clock.advance(6000);
  const read = (await app.inject({ method: 'GET', url: '/shards/r' })).json();
  t.match(read, { cgroup: null, migDevices: null, minGpuWeightsShare: null, gpuUuids: [UUIDS[1]], status: { state: 'on-cpu' }, compute: { backend: 'CPU' } });
  const stored = readFileSync(config.stateFile, 'utf8');

  clock.advance(1);
  const back = await app.inject({ method: 'PUT', url: '/shards/r', payload: read });
  t.equal(back.statusCode, 200);
  t.strictSame(back.json(), first.json(), 'the same record, registeredAt included');
  t.equal(readFileSync(config.stateFile, 'utf8'), stored, 'nothing written');
  t.match(lines.filter((line) => line.shard === 'r').at(-1), { level: 20, msg: /^Shard registration repeated unchanged/ });
  clock.advance(1);
  t.match((await app.inject({ method: 'GET', url: '/shards/r/ready' })).json(), { state: 'on-cpu', reason: /6\.0 s after registration \(grace 5\.0 s\)/ });

  clock.advance(1);
  const changed = await app.inject({ method: 'PUT', url: '/shards/r', payload: { ...read, graceMs: 600_000 } });
  t.same([changed.statusCode, changed.json().registeredAt, changed.json().graceMs], [200, first.json().registeredAt, 600_000], 'one field changed: a replacement, its grace counted from the first registration');

  const elsewhere = await app.inject({ method: 'PUT', url: '/shards/q', payload: read });
  t.same([elsewhere.statusCode, elsewhere.json().code], [400, 'NODECOMPUTE_BAD_REQUEST'], "another shard's body is refused");
  t.match(elsewhere.json().message, /"id" is "r".*path names shard "q"/);
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards.map((one: { id: string }) => one.id), ['r']);
});

t.test('null for pid, cgroup, migDevices or minGpuWeightsShare means what leaving it out means: the same answer and stored record', async (t) => {
  const podUid = '7d5b1f2c-2222-4c3e-9e0a-3f7c2b9d8e11';
  const root = t.testdir({
    '100': { stat: '100 (vllm) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0', cgroup: `0::/kubepods/pod${podUid}/abc\n` },
    '200': { stat: '200 (llama-server) S 1 200 200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 600 0 0', cgroup: '0::/system.slice/llama.service\n' },
  });
  const { app, config } = await buildTestApp(t, {
    scenario: twoGpuNode(),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: manualClock().now, proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  const cases: [string, Record<string, unknown>][] = [
    ['pid', { cgroup: podUid, gpus: [0], engine: 'vllm' }],
    ['cgroup', { pid: 200, gpus: [1] }],
    ['migDevices', { pid: 200, gpus: [1] }],
    ['minGpuWeightsShare', { pid: 200, gpus: [1], engine: 'llama.cpp' }],
  ];
  const state = () => readFileSync(config.stateFile, 'utf8');
  for (const [field, absent] of cases) {
    const url = `/shards/${field}`;
    const nulled = { ...absent, [field]: null };
    const withNull = await app.inject({ method: 'PUT', url, payload: nulled });
    t.equal(withNull.statusCode, 201, field);
    t.equal(withNull.json()[field], null, `${field}: null, as GET writes it`);
    const stored = state();
    const repeated = await app.inject({ method: 'PUT', url, payload: absent });
    t.equal(repeated.statusCode, 200, `${field} left out after null: a repeat`);
    t.strictSame(repeated.json(), withNull.json(), `${field}: the same record`);
    t.equal(state(), stored, `${field}: an unchanged repeat writes nothing`);

    t.equal((await app.inject({ method: 'DELETE', url })).statusCode, 204);
    const without = await app.inject({ method: 'PUT', url, payload: absent });
    t.equal(without.statusCode, 201, field);
    t.strictSame(without.json(), withNull.json(), `${field}: registered without it, the same answer`);
    t.equal(state(), stored, `${field}: the same stored record`);
    t.equal((await app.inject({ method: 'PUT', url, payload: nulled })).statusCode, 200, `${field} null after left out: a repeat`);
    t.equal(state(), stored, `${field}: still the same stored record`);
    t.equal((await app.inject({ method: 'DELETE', url })).statusCode, 204);
  }
});

t.test('compute.backend: null while starting and once exited, CPU when on-cpu, CUDA when a GPU is held', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step, setProcesses } = await setup(t);
  await app.inject({ method: 'PUT', url: '/shards/b', payload: { pid: shard.pid, gpus: [1], graceMs: 5000 } });
  const backend = async () => (await app.inject({ method: 'GET', url: '/shards/b/compute' })).json().backend;
  const listed = async () => (await app.inject({ method: 'GET', url: '/shards/b' })).json().compute.backend;
  t.equal(await backend(), null, 'freshly registered: not known yet');
  step(100);
  t.same([await backend(), await listed()], [null, null], 'starting: not CPU');
  step(5000);
  t.same([await backend(), await listed()], ['CPU', 'CPU'], 'on-cpu');
  setProcesses([{ gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'vllm', usedMiB: 9000 }]);
  step();
  t.equal(await backend(), 'CUDA');
  await shard.kill();
  setProcesses([]);
  step();
  t.same([await backend(), await listed()], [null, null], 'exited: not running, so not CPU either');
});

t.test('engine output for an engine other than llama.cpp is kept, with a note saying it is not read', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const other = await spawnShardProcess(t, 0);
  const { app } = await setup(t);
  await app.inject({ method: 'PUT', url: '/shards/v', payload: { pid: shard.pid, gpus: [0], engine: 'vllm' } });
  await app.inject({ method: 'PUT', url: '/shards/l', payload: { pid: other.pid, gpus: [1], engine: 'llama.cpp' } });
  const post = (id: string, payload: string) => app.inject({ method: 'POST', url: `/shards/${id}/engine-output`, payload, headers: { 'content-type': 'text/plain' } });
  const vllm = await post('v', CUDA_FAILED_LOG);
  t.equal(vllm.statusCode, 200);
  t.same(Object.keys(vllm.json()), ['shard', 'account', 'tailBytes', 'note']);
  t.match(vllm.json(), { shard: 'v', account: null, tailBytes: Buffer.byteLength(CUDA_FAILED_LOG), note: /^Shard "v" is registered with engine "vllm" and only llama\.cpp and Ollama output is read/ });
  t.match(vllm.json().note, /kept \(the last 256 KiB\) but decides nothing: the GPU driver alone judges the shard\. .*PUT \/shards\/v again with "engine": "llama\.cpp" or "ollama"/);
  t.match((await post('l', 'main: loading model\n')).json(), { account: null, note: /^Nothing in the output kept so far says where llama\.cpp computes: .*-lv 4/ });
  t.match((await post('l', CUDA_FAILED_LOG)).json(), { account: { backend: 'CPU' }, note: null });
  const reread = await app.inject({ method: 'PUT', url: '/shards/v', payload: { pid: shard.pid, gpus: [0], engine: 'llama.cpp' } });
  t.equal(reread.statusCode, 200);
  t.match((await app.inject({ method: 'GET', url: '/shards/v/compute' })).json().engine, { backend: 'CPU' }, 'as the note says: registered as llama.cpp, the kept output is read');
});

t.test("an Ollama shard's server log is read: a plan its missing GPU libraries contradict makes it on-cpu", async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, step } = await setup(t, twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'ollama', usedMiB: 300 }]));
  t.equal((await app.inject({ method: 'PUT', url: '/shards/o', payload: { pid: shard.pid, gpus: [0], engine: 'ollama', graceMs: 0 } })).statusCode, 201);
  const log = sample('ollama-log_2025-08_issue11723_offload-library-cuda_no-compatible-gpu-libraries.txt');
  const posted = await app.inject({ method: 'POST', url: '/shards/o/engine-output', payload: log, headers: { 'content-type': 'text/plain' } });
  t.match(posted.json(), { account: { backend: 'CPU', gpuBackendLoaded: false, summary: /^Ollama found no usable GPU/ }, note: null });
  step();
  t.match((await app.inject({ method: 'GET', url: '/shards/o/ready' })).json(), { state: 'on-cpu', cause: 'engine-gpu-backend-failed' });
});

