// GET /metrics: promtool accepts it; values match /gpus and /gpus/foreign-memory for the same
// snapshot; shards in every state; a deleted shard's series disappear; a scrape reads the cache.
import { spawnSync } from 'node:child_process';
import { Registry, collectDefaultMetrics } from 'prom-client';
import t from 'tap';
import { DRIVER_FAILURE_CODES } from '../../src/errors.js';
import { createMetrics } from '../../src/metrics.js';
import { VERSION } from '../../src/version.js';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { DRIVER_FAILED, driverQueries, failDriver, NO_XIDS, UNSAMPLED_SM } from '../helpers/backend.js';
import { waitUntil, type FakeProcess, type FakeScenario } from '../helpers/fake-nvidia-smi.js';

const UUIDS = ['GPU-aaaaaaaa-0000-0000-0000-000000000000', 'GPU-bbbbbbbb-0000-0000-0000-000000000000'];
const MIB = 1024 * 1024;

function node(processes: FakeProcess[]): FakeScenario {
  return {
    gpus: UUIDS.map((uuid, index) => ({ index, uuid, name: 'NVIDIA H100 80GB HBM3', totalMiB: 81559, usedMiB: 20000 + index, freeMiB: 61000, reservedMiB: 479 })),
    processes,
  };
}

function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const labelText = line.slice(name.length).split(' ')[0] ?? '';
    if (wanted.every((pair) => labelText.includes(pair))) return Number(line.split(' ').at(-1));
  }
  return undefined;
}

t.test('promtool accepts the metrics of a node with shards in every state, and the values match the JSON views', async (t) => {
  const ready = await spawnShardProcess(t, 1);
  const starting = await spawnShardProcess(t, 0);
  const onCpu = await spawnShardProcess(t, 0);
  const exited = await spawnShardProcess(t, 0);
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: node([
      { gpuUuid: UUIDS[0]!, pid: ready.members[0]!, name: 'llama-server', usedMiB: 12000 },
      { gpuUuid: UUIDS[0]!, pid: 77777, name: '[Not Found]', usedMiB: 3000 },
    ]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now },
  });
  const put = (id: string, body: object) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload: body });
  await put('ready-one', { pid: ready.pid, gpus: [0] });
  await put('starting-one', { pid: starting.pid, gpus: [1], graceMs: 600_000 });
  await put('on-cpu-one', { pid: onCpu.pid, gpus: [1], graceMs: 0 });
  await put('exited-one', { pid: exited.pid, gpus: [] });
  await exited.kill();
  await settle(app);
  clock.advance(5);

  const queriesBefore = await driverQueries(app, 'gpus');
  const res = await app.inject({ method: 'GET', url: '/metrics' });
  t.equal(res.statusCode, 200);
  t.match(res.headers['content-type'], /^text\/plain; version=0\.0\.4/);
  const text = res.body;
  // Same snapshot: TTL 0, and the clock has not moved since the scrape.
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.equal((await driverQueries(app, 'gpus')) - queriesBefore, 1, 'the three answers came from one snapshot');

  const check = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  t.equal(check.status, 0, `promtool check metrics: ${check.stdout}${check.stderr}`);

  for (const gpu of gpus.gpus) {
    const labels = { gpu: String(gpu.index), uuid: gpu.uuid };
    t.equal(sample(text, 'nodecompute_gpu_memory_total_bytes', labels), gpu.memory.totalMiB * MIB);
    t.equal(sample(text, 'nodecompute_gpu_memory_used_bytes', labels), gpu.memory.usedMiB * MIB);
    t.equal(sample(text, 'nodecompute_gpu_memory_free_bytes', labels), gpu.memory.freeMiB * MIB);
    t.equal(sample(text, 'nodecompute_gpu_memory_reserved_bytes', labels), gpu.memory.reservedMiB * MIB);
    t.equal(sample(text, 'nodecompute_gpu_memory_foreign_bytes', labels), foreign.gpus[gpu.index].foreignMiB * MIB);
  }
  t.equal(sample(text, 'nodecompute_gpu_memory_foreign_bytes', { gpu: '0' }), (20000 - 12000) * MIB);
  t.equal(sample(text, 'nodecompute_shard_gpu_memory_bytes', { shard: 'ready-one', gpu: '0', uuid: UUIDS[0]! }), 12000 * MIB, 'shard memory joins GPU series by uuid');
  t.equal(sample(text, 'nodecompute_shard_gpu_placed', { shard: 'ready-one', gpu: '0' }), 1);
  t.equal(sample(text, 'nodecompute_shard_gpu_placed', { shard: 'starting-one', gpu: '1' }), 1);
  t.equal(sample(text, 'nodecompute_shard_gpu_placed', { shard: 'ready-one', gpu: '1' }), undefined, 'only the GPUs of the registration');
  t.equal(sample(text, 'nodecompute_shard_gpu_placed', { shard: 'exited-one' }), undefined, 'a shard placed on no GPU has no series');
  t.equal(sample(text, 'nodecompute_gpu_processes_visible', {}), 1, 'a listed PID exists in /proc');
  t.equal(sample(text, 'nodecompute_build_info', { version: VERSION }), 1);
  t.equal(sample(text, 'nodecompute_nvidia_smi_failures_total', { query: 'gpus', reason: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' }), 0, 'failure counters start at 0');
  const states: Record<string, string> = { 'ready-one': 'ready', 'starting-one': 'starting', 'on-cpu-one': 'on-cpu', 'exited-one': 'exited' };
  for (const [shard, state] of Object.entries(states)) {
    t.equal(sample(text, 'nodecompute_shard_ready', { shard }), state === 'ready' ? 1 : 0, `${shard} ready`);
    t.equal(sample(text, 'nodecompute_shard_state', { shard, state }), 1, `${shard} is ${state}`);
    t.equal(sample(text, 'nodecompute_shard_state', { shard, state: 'unverified' }), 0);
  }
  t.equal(sample(text, 'nodecompute_nvidia_smi_up', {}), 1);
  t.ok(sample(text, 'nodecompute_nvidia_smi_query_duration_seconds_count', { query: 'gpus' })! >= 1);
  t.match(text, /^process_resident_memory_bytes /m, 'default process metrics');

  await app.inject({ method: 'DELETE', url: '/shards/ready-one' });
  const after = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.notMatch(after, 'shard="ready-one"', "a deleted shard's series disappear, placement included");
  t.match(after, 'shard="starting-one"');
});

t.test("prom-client's default series are all served but the GC histogram, whose per-GC observer costs every request", async (t) => {
  const names = (registry: Registry) => registry.getMetricsAsArray().map((metric) => metric.name);
  const reference = new Registry();
  collectDefaultMetrics({ register: reference });
  // Gauges prom-client names like counters (promtool rejects them), left out on purpose (metrics.ts).
  const renamedAway = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];
  const served = names(createMetrics().registry);
  t.ok(names(reference).includes('nodejs_gc_duration_seconds'), 'prom-client itself would add it');
  t.notOk(served.includes('nodejs_gc_duration_seconds'));
  const expected = names(reference).filter((name) => name !== 'nodejs_gc_duration_seconds' && !renamedAway.includes(name));
  t.ok(expected.length >= 20, `prom-client still has its defaults (${expected.length})`);
  t.same(
    expected.filter((name) => !served.includes(name)),
    [],
    'every other default series is served',
  );
});

t.test('when the driver fails, metrics still answer: up 0, failures counted, no GPU series', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: node([]), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0] } });
  failDriver(fake, { kind: 'library-mismatch' });
  clock.advance(5);
  const text = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.equal(spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' }).status, 0);
  t.equal(sample(text, 'nodecompute_nvidia_smi_up', {}), 0);
  // The two queries run together and the refresh fails with the first to fail: the other's failure
  // may be counted only after this scrape.
  const failed = ['gpus', 'compute-apps'].map((query) => sample(text, 'nodecompute_nvidia_smi_failures_total', { query, reason: DRIVER_FAILED }) ?? 0);
  t.ok(failed[0]! + failed[1]! >= 1, `failures counted by reason (${failed.join(' + ')})`);
  t.notMatch(text, /^nodecompute_gpu_memory_total_bytes\{/m);
  t.ok(Number.isNaN(sample(text, 'nodecompute_gpu_processes_visible', {})), 'whether processes are visible is unknown, not 0');
  t.equal(sample(text, 'nodecompute_shard_state', { shard: 's', state: 'starting' }), 1, 'registered since the last good listing: never seen on its GPU');
  t.equal(sample(text, 'nodecompute_shard_state', { shard: 's', state: 'unverified' }), 0);
  t.equal(sample(text, 'nodecompute_snapshot_age_seconds', {}), 0.005, 'the age of the last good snapshot keeps growing');
});

t.test('while refreshes fail and an older snapshot is still served, up is 0 at once and the GPU series stay', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: node([]), config: { cacheTtlMs: 1_000, maxStaleMs: 60_000 }, deps: { now: clock.now } });
  const scrape = async () => (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.equal(sample(await scrape(), 'nodecompute_nvidia_smi_up', {}), 1);
  await settle(app);
  failDriver(fake, { kind: 'driver-unreachable' });
  clock.advance(1_001);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  t.equal(app.services.node.peek()!.view.failing, true, 'the refresh failed; the last good snapshot is served');
  // Within a second of the last rendering, with no new snapshot: the failure alone renders afresh.
  const text = await scrape();
  t.equal(sample(text, 'nodecompute_nvidia_smi_up', {}), 0, 'the alert on up == 0 fires now, not after max-stale');
  t.equal(sample(text, 'nodecompute_gpu_memory_total_bytes', { gpu: '0' }), 81559 * 1024 * 1024, 'the last good GPU series are still there');
  t.equal(sample(text, 'nodecompute_snapshot_age_seconds', {}), 1.001);
  fake.update((s) => ({ ...s, failures: {} }));
  clock.advance(1_000);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  t.equal(sample(await scrape(), 'nodecompute_nvidia_smi_up', {}), 1, 'and back to 1 when a refresh works again');
});

t.test('a query refused while a killed nvidia-smi is stuck counts as a failure but adds no duration', async (t) => {
  const metrics = createMetrics();
  metrics.observeQuery({ query: 'gpus', durationMs: 5000, outcome: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' });
  metrics.observeQuery({ query: 'gpus', durationMs: null, outcome: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' });
  const text = await metrics.registry.metrics();
  t.equal(sample(text, 'nodecompute_nvidia_smi_failures_total', { query: 'gpus', reason: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' }), 2);
  t.equal(sample(text, 'nodecompute_nvidia_smi_query_duration_seconds_count', { query: 'gpus' }), 1, 'only the run that ran is timed');
  t.equal(sample(text, 'nodecompute_nvidia_smi_query_duration_seconds_sum', { query: 'gpus' }), 5);
});

t.test('every query starts a failure counter at 0 for each code an nvidia-smi run can fail with, and no other', async (t) => {
  // errors.test.ts checks that the list holds the code of every nvidia-smi error class.
  const text = await createMetrics().registry.metrics();
  const series = text.split('\n').filter((line) => line.startsWith('nodecompute_nvidia_smi_failures_total{'));
  const expected = ['gpus', 'compute-apps', 'version'].flatMap((query) =>
    DRIVER_FAILURE_CODES.map((reason) => `nodecompute_nvidia_smi_failures_total{query="${query}",reason="${reason}"} 0`),
  );
  t.same(series.sort(), expected.sort());
});

t.test('before any snapshot the age is NaN', async (t) => {
  const { app } = await buildTestApp(t, { scenario: { ...node([]), failures: { all: { kind: 'no-devices' } } } });
  const text = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(text, /^nodecompute_snapshot_age_seconds nan$/im);
  t.equal(spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' }).status, 0);
});

t.test('scrapes read the cache: many scrapes within the TTL cause one nvidia-smi run per query', async (t) => {
  const { app } = await buildTestApp(t, { scenario: node([]), config: { cacheTtlMs: 60_000 } });
  const scrapes = await Promise.all(Array.from({ length: 20 }, () => app.inject({ method: 'GET', url: '/metrics' })));
  t.ok(scrapes.every((res) => res.statusCode === 200));
  await settle(app);
  t.equal(await driverQueries(app, 'gpus'), 1);
  t.equal(await driverQueries(app, 'compute-apps'), 1);
});

t.test('a rendering is reused within a second only while the snapshot, the registry and the engine output stay the same', async (t) => {
  const clock = manualClock();
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: node([]), config: { cacheTtlMs: 500, maxStaleMs: 60_000 }, deps: { now: clock.now } });
  const { registry } = app.services.metrics;
  const render = registry.metrics.bind(registry);
  let renders = 0;
  registry.metrics = () => {
    renders += 1;
    return render();
  };
  const scrape = async () => {
    const res = await app.inject({ method: 'GET', url: '/metrics' });
    t.equal(res.statusCode, 200);
    return res.body;
  };
  await scrape();
  await scrape();
  t.equal(renders, 1, 'the second scrape reused the first rendering');
  await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] } });
  t.match(await scrape(), /nodecompute_shard_ready\{shard="a"\}/, 'a registration shows at the next scrape');
  t.equal(renders, 2);
  await app.inject({ method: 'POST', url: '/shards/a/engine-output', headers: { 'content-type': 'text/plain' }, payload: 'ggml_cuda_init: found 1 CUDA devices:\n' });
  await scrape();
  t.equal(renders, 3, 'new engine output renders afresh');
  await scrape();
  t.equal(renders, 3);
  // Past the TTL a scrape within the second still reuses the rendering (it does not ask for the
  // snapshot); once another answer's refresh lands, the next scrape renders it.
  const { snapshots } = app.services.node;
  await settle(app);
  const generation = snapshots.generation;
  await scrape();
  const before = renders;
  clock.advance(600);
  await scrape();
  t.equal(renders, before, 'a stale snapshot is not a new one');
  await app.inject({ method: 'GET', url: '/gpus' });
  await waitUntil(() => snapshots.generation > generation, { what: 'the background refresh' });
  await settle(app);
  await scrape();
  t.equal(renders, before + 1, 'a new snapshot renders afresh, though less than a second went by');
  await scrape();
  t.equal(renders, before + 1, 'and is then reused');
  clock.advance(1000);
  await scrape();
  t.equal(renders, before + 2, 'a second later it renders afresh');
});

t.test('GPU processes hidden from this /proc read 0 on nodecompute_gpu_processes_visible, the series to alert on', async (t) => {
  const { app } = await buildTestApp(t, {
    scenario: node([{ gpuUuid: UUIDS[0]!, pid: 4194305, name: '[Not Found]', usedMiB: 12000 }]),
    config: { cacheTtlMs: 60_000 },
  });
  const text = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.equal(sample(text, 'nodecompute_gpu_processes_visible', {}), 0);
  t.equal(sample(text, 'nodecompute_gpu_memory_foreign_bytes', { gpu: '0' }), 20000 * MIB, 'the memory reads as foreign');
});

t.test('a shard process whose memory nvidia-smi reports as [N/A] holds its GPU, with the amount unknown in every view', async (t) => {
  const engine = await spawnShardProcess(t, 1);
  const { app } = await buildTestApp(t, {
    scenario: node([
      { gpuUuid: UUIDS[0]!, pid: engine.members[0]!, name: 'llama-server', usedMiB: '[N/A]' },
      { gpuUuid: UUIDS[0]!, pid: 77777, name: '[Not Found]', usedMiB: 3000 },
    ]),
    config: { cacheTtlMs: 60_000 },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/wsl', payload: { pid: engine.pid, gpus: [0], graceMs: 0 } })).statusCode, 201);
  await settle(app);
  const compute = (await app.inject({ method: 'GET', url: '/shards/wsl/compute' })).json();
  t.same({ backend: compute.backend, devices: compute.devices, gpus: compute.gpus }, { backend: 'CUDA', devices: ['GPU 0: memory not reported'], gpus: [{ index: 0, usedMiB: null, smUtilPct: UNSAMPLED_SM, xidErrors: NO_XIDS, utilizationPct: 0, migDevices: null }] });
  t.equal((await app.inject({ method: 'GET', url: '/shards/wsl/ready' })).json().state, 'ready');
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json().gpus[0];
  t.same({ shardMiB: foreign.shardMiB, unreportedShardProcesses: foreign.unreportedShardProcesses, foreignMiB: foreign.foreignMiB }, { shardMiB: 0, unreportedShardProcesses: 1, foreignMiB: 20000 });

  const text = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  const check = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  t.equal(check.status, 0, `promtool check metrics: ${check.stdout}${check.stderr}`);
  t.ok(Number.isNaN(sample(text, 'nodecompute_shard_gpu_memory_bytes', { shard: 'wsl', gpu: '0' })), 'NaN: the series says the GPU is held, the value that its size is unknown');
  t.equal(sample(text, 'nodecompute_gpu_memory_foreign_bytes', { gpu: '0' }), 20000 * MIB, 'foreign stays an upper bound');

  const page = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/plain' } })).body;
  t.match(page, /wsl memory not reported/, 'the text page names the shard without a size');
  const html = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } })).body;
  t.match(html, 'foreign: up to 19.5 GiB (it includes the memory of 1 shard process(es) the GPU driver does not report)');
  t.match(html, 'wsl: memory not reported on GPU 0');
  t.notMatch(html, /wsl[^<]*0 MiB/, 'nowhere 0 MiB');
});
