// Both backends, one node: an app on the fake nvidia-smi and an app on the fake NVML, each on the
// same scenario with the same real shard processes, answer every GPU and shard route alike. Only
// times and the backend's own series differ. Then a GPU NVML says is lost reads gpu-lost.
import t, { type Test } from 'tap';
import type { FakeProcess, FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { buildTestApp, manualClock, settle, spawnShardProcess, type TestApp } from '../helpers/app.js';
import { twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';

const BACKENDS = ['nvidia-smi', 'nvml'] as const;
/** Keys whose values are times, ages, freshness or rates over time (they differ between two apps by when each was asked: a spawn is slower than a call), and those only NVML fills. */
const TIMES = /(At|Ms|Since|ageS|Seconds|^stale|staleReason|^events|^smUtilPct|^xidErrors|^cpuCores)$/;

function withoutTimes(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutTimes);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(Object.entries(value).filter(([key]) => !TIMES.test(key)).map(([key, v]) => [key, withoutTimes(v)]));
}

/** The /metrics lines both backends must give alike: not process, timing or backend series. */
function comparableMetrics(text: string): string[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith('nodecompute_') && !/duration|backend_info|age_seconds|process_|nodejs_|xid|ecc|sm_utilization|cpu_cores/.test(line));
}

/** The text status page but for its times and the shards' CPU CORES column (a rate, as cpuCores), which differ by when each app was asked. */
function comparablePage(text: string): string {
  const lines = text.replace(/\d{4}-\d\d-\d\dT[\d:.]+Z|\d\d:\d\d:\d\d( UTC)?|\(\d+(\.\d+)? ?(ms|s|min|h) (old|ago)\)/g, '<time>').split('\n');
  const header = lines.findIndex((line) => line.includes('CPU CORES'));
  const [from, to] = [lines[header]!.indexOf('CPU CORES'), lines[header]!.indexOf('WEIGHTS')];
  for (let i = header + 1; i < lines.length && lines[i] !== ''; i += 1) lines[i] = `${lines[i]!.slice(0, from)}${' '.repeat(to - from)}${lines[i]!.slice(to)}`;
  return lines.join('\n');
}

type Clocked = TestApp & { clock: ReturnType<typeof manualClock> };

/** Each app on a clock of its own that the test moves alike: with a TTL of 0 each step makes the next request take a fresh snapshot. */
async function bothApps(t: Test, scenario: FakeScenario): Promise<Record<(typeof BACKENDS)[number], Clocked>> {
  const start = Date.now();
  const build = async (backend: (typeof BACKENDS)[number]): Promise<Clocked> => {
    const clock = manualClock(start);
    const built = await buildTestApp(t, { scenario, backend, config: { cacheTtlMs: 0, maxStaleMs: 0, gpuGraceMs: 0 }, deps: { now: clock.now } });
    return { ...built, clock };
  };
  return { 'nvidia-smi': await build('nvidia-smi'), nvml: await build('nvml') };
}

t.test('GPUs, shards, compute, readiness, metrics and the status page agree under both backends', async (t) => {
  const [ready, onCpu, foreign] = await Promise.all([spawnShardProcess(t), spawnShardProcess(t), spawnShardProcess(t, 0)]);
  const processes: FakeProcess[] = [
    { gpuUuid: UUIDS[0]!, pid: ready.members[0]!, name: 'llama-server', usedMiB: 40000 },
    { gpuUuid: UUIDS[1]!, pid: ready.members[1]!, name: 'llama-server', usedMiB: 40000 },
    { gpuUuid: UUIDS[1]!, pid: foreign.pid, name: 'python3', usedMiB: 1200 },
  ];
  const apps = await bothApps(t, twoGpuNode(processes));
  const answers: Record<string, unknown[]> = {};
  for (const backend of BACKENDS) {
    const { app, clock } = apps[backend];
    t.equal(app.services.driver.backend, backend);
    for (const [id, pid, gpus] of [['ready', ready.pid, [0, 1]], ['on-cpu', onCpu.pid, [1]]] as const) {
      const put = await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus } });
      t.equal(put.statusCode, 201, `${backend}: ${id} registered`);
    }
    // Whatever refresh the registrations started lands before the clock moves, under either backend.
    await settle(app);
    clock.advance(1000);
    const get = async (url: string, accept = 'application/json') => {
      const res = await app.inject({ method: 'GET', url, headers: { accept } });
      if (url === '/metrics') return { status: res.statusCode, body: comparableMetrics(res.body) };
      return { status: res.statusCode, body: accept === 'text/plain' ? comparablePage(res.body) : withoutTimes(res.json()) };
    };
    answers[backend] = [
      await get('/gpus'),
      await get('/gpus/foreign-memory'),
      await get('/shards'),
      await get('/shards/ready'),
      await get('/shards/ready/compute'),
      await get('/shards/on-cpu/compute'),
      await get('/shards/ready/ready'),
      await get('/shards/on-cpu/ready'),
      await get('/metrics'),
      await get('/readyz'),
      await get('/', 'text/plain'),
    ];
  }
  t.same(answers.nvml, answers['nvidia-smi']);
  const [gpus, foreignMemory, , , , , readyProbe, onCpuProbe, metrics, readyz, page] = answers.nvml as Array<{ status: number; body: unknown }>;
  t.match(foreignMemory, { status: 200, body: { gpus: [{ foreignMiB: 18 }, { foreignMiB: 1218, foreignProcesses: [{ pid: foreign.pid }] }] } });
  t.match(readyz, { status: 200 });
  t.match(page, { status: 200, body: /on-cpu/ });
  const held = [{ shard: 'ready' }];
  t.match(gpus!.body, { gpus: [{ index: 0, processes: held }, { index: 1, processes: [...held, { pid: foreign.pid, shard: null }] }] }, 'real answers');
  t.match(readyProbe, { status: 200, body: { state: 'ready' } });
  t.match(onCpuProbe, { status: 503, body: { state: 'on-cpu' } });
  t.ok((metrics!.body as string[]).some((line) => line.startsWith('nodecompute_gpu_memory_foreign_bytes{gpu="1"')));
  t.equal(apps['nvidia-smi'].fake.countQueries('gpu') > 0, true);
  t.equal(apps.nvml.fake.countQueries('gpu'), 0, 'the NVML app never ran nvidia-smi');
});

t.test('a GPU NVML says is lost: the shard on it reads gpu-lost, as with nvidia-smi', async (t) => {
  const shard = await spawnShardProcess(t);
  const processes: FakeProcess[] = [{ gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 40000 }];
  const apps = await bothApps(t, twoGpuNode(processes));
  const states: Record<string, unknown> = {};
  for (const backend of BACKENDS) {
    const { app, fake, clock } = apps[backend];
    t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [1] } })).statusCode, 201);
    await settle(app);
    clock.advance(1000);
    t.equal((await app.inject({ method: 'GET', url: '/shards/s/ready' })).statusCode, 200, `${backend}: ready first`);
    fake.update((s) => ({ ...s, unreachable: [{ index: 1, said: 'GPU is lost' }] }));
    clock.advance(1000);
    const res = await app.inject({ method: 'GET', url: '/shards/s/ready' });
    states[backend] = { status: res.statusCode, state: res.json().state, cause: res.json().cause };
    const gpus = await app.inject({ method: 'GET', url: '/gpus' });
    t.match(gpus.json(), { gpus: [{ index: 0 }], lostGpus: [{ index: 1, uuid: UUIDS[1] }] }, `${backend}: the GPU is lost in /gpus`);
  }
  t.same(states.nvml, states['nvidia-smi']);
  t.match(states.nvml, { status: 503, state: 'gpu-lost' });
});

t.test('the doctor under NVML: the backend and NVML rows, and the GPUs', async (t) => {
  const { nvml } = await bothApps(t, twoGpuNode());
  const res = await nvml.app.inject({ method: 'GET', url: '/doctor' });
  const checks = Object.fromEntries((res.json().checks as Array<{ name: string }>).map((check) => [check.name, check]));
  t.match(checks.backend, { status: 'ok', detail: /nvml .*libnvidia-ml\.so\.1.*NODECOMPUTE_BACKEND is nvml/ });
  t.match(checks.nvml, { status: 'ok', detail: /driver 590\.48\.01, CUDA 13\.1/ });
  t.match(checks.gpus, { status: 'ok', detail: /^2 GPU\(s\) visible/ });
});

t.test('what only NVML tells: SM utilization and Xid events in /gpus, /compute, /metrics and the status page', async (t) => {
  const shard = await spawnShardProcess(t);
  const processes: FakeProcess[] = [
    { gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 40000, smUtilPct: 61 },
    { gpuUuid: UUIDS[0]!, pid: shard.members[1]!, name: 'llama-server', usedMiB: 1000, smUtilPct: 9 },
  ];
  const apps = await bothApps(t, twoGpuNode(processes));
  const { app, fake, clock } = apps.nvml;
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  await settle(app);
  fake.update((s) => ({ ...s, nvml: { events: [{ id: 'x', index: 0, type: 'xid', xid: 79 }, { id: 'e', index: 0, type: 'ecc-double' }] } }));
  clock.advance(1000);
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.match(gpus.gpus[0], { processes: [{ smUtilPct: 61 }, { smUtilPct: 9 }], events: { xid: { 79: 1 }, eccDoubleBit: 1, lastXid: { xid: 79, at: /T/ } } });
  t.match(gpus.gpus[1], { processes: [], events: { xid: {}, lastXid: null } });
  const compute = (await app.inject({ method: 'GET', url: '/shards/s/compute' })).json();
  t.match(compute.gpus, [{ index: 0, smUtilPct: 70, xidErrors: 1 }]);
  const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(metrics, /^nodecompute_gpu_xid_errors_total\{gpu="0",uuid="[^"]+",xid="79"\} 1$/m);
  t.match(metrics, /^nodecompute_gpu_ecc_errors_total\{gpu="0",uuid="[^"]+",type="double-bit"\} 1$/m);
  t.match(metrics, /^nodecompute_shard_gpu_sm_utilization_ratio\{shard="s",gpu="0",uuid="[^"]+"\} 0\.7$/m);
  const page = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/plain' } })).body;
  t.match(page, /\(EVENTS\) GPU 0: NVML reported Xid 79 x1, 1 uncorrected \(double-bit\) ECC error\(s\)/);
  const html = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } })).body;
  t.match(html, /SM 70% busy/);
  t.match(html, /Xid 79 x1/);

  const smi = apps['nvidia-smi'].app;
  t.equal((await smi.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  await settle(smi);
  apps['nvidia-smi'].clock.advance(1000);
  t.match((await smi.inject({ method: 'GET', url: '/gpus' })).json().gpus[0], { processes: [{ smUtilPct: null }], events: null }, 'nvidia-smi: no such figures');
  const smiCompute = (await smi.inject({ method: 'GET', url: '/shards/s/compute' })).json();
  t.match(JSON.stringify(smiCompute), /"smUtilPct":null,"xidErrors":null/);
  t.notMatch((await smi.inject({ method: 'GET', url: '/metrics' })).body, /xid_errors_total\{|sm_utilization_ratio\{/);
});
