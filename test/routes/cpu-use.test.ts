// The CPU a shard's processes burn, read from the real /proc across two snapshots: a real busy loop
// in a shard's process group against a group that only sleeps, under both backends, in /compute,
// /metrics and the status page; with each GPU's utilization, which both backends read alike. The warning it feeds (several cores, no GPU work) is pinned in
// test/node-state/cpu-use.test.ts: a loaded 2-core CI machine cannot promise two busy cores.
import { spawn } from 'node:child_process';
import t, { type Test } from 'tap';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { livePidsInGroup, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';

/** A detached shell (its own process group) whose child spins: `members[0]` burns a core while it may. */
async function spawnBusyShard(t: Test): Promise<{ pid: number; members: number[] }> {
  const child = spawn('sh', ['-c', 'while :; do :; done & wait'], { detached: true, stdio: 'ignore' });
  const pid = child.pid!;
  t.teardown(() => {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // already gone
    }
  });
  await waitUntil(() => livePidsInGroup(pid).length === 2, { what: `process group ${pid} to have its busy child` });
  return { pid, members: livePidsInGroup(pid).filter((member) => member !== pid) };
}

for (const backend of ['nvidia-smi', 'nvml'] as const) {
  t.test(`${backend}: a busy shard's cores are read from /proc across two snapshots; an idle one's are 0`, async (t) => {
    const [busy, idle] = await Promise.all([spawnBusyShard(t), spawnShardProcess(t, 1)]);
    const scenario = twoGpuNode([
      { gpuUuid: UUIDS[0]!, pid: busy.members[0]!, name: 'llama-server', usedMiB: 900, smUtilPct: 0 },
      { gpuUuid: UUIDS[1]!, pid: idle.members[0]!, name: 'llama-server', usedMiB: 40000, smUtilPct: 70 },
    ]);
    scenario.gpus[1]!.utilizationPct = 87;
    const clock = manualClock();
    const { app } = await buildTestApp(t, { scenario, backend, config: { cacheTtlMs: 0, maxStaleMs: 0, gpuGraceMs: 0 }, deps: { now: clock.now } });
    for (const [id, pid, gpus] of [['busy', busy.pid, [0]], ['idle', idle.pid, [1]]] as const) {
      t.equal((await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus } })).statusCode, 201);
    }
    await settle(app);
    const compute = async (id: string) => (await app.inject({ method: 'GET', url: `/shards/${id}/compute` })).json();
    clock.advance(1);
    const first = await compute('busy');
    t.equal(first.backend, 'CUDA');
    // A snapshot has been taken since the registrations' one; 600 ms of real time later, another.
    await new Promise((resolve) => setTimeout(resolve, 600));
    clock.advance(1);
    const busyNow = await compute('busy');
    t.ok(busyNow.cpuCores > 0.2, `the spinning child burns CPU (${busyNow.cpuCores} cores)`);
    t.ok(busyNow.cpuCores <= 1.1, 'one spinning process, at most about one core');
    const idleNow = await compute('idle');
    t.equal(idleNow.cpuCores, 0, 'a group that sleeps burns none');
    t.same([busyNow.gpus[0].utilizationPct, idleNow.gpus[0].utilizationPct], [0, 87], "each GPU's utilization, whoever runs there");
    const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
    t.same(gpus.gpus.map((gpu: { utilizationPct: number | null }) => gpu.utilizationPct), [0, 87]);

    const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
    const series = /^nodecompute_shard_cpu_cores\{shard="busy"\} ([\d.]+)$/m.exec(metrics);
    t.ok(series !== null && Number(series[1]) > 0.2, 'the busy shard has its series');
    t.match(metrics, /^nodecompute_shard_cpu_cores\{shard="idle"\} 0$/m);
    t.match(metrics, /^nodecompute_gpu_utilization_ratio\{gpu="1",uuid="GPU-2[^"]*"\} 0\.87$/m);

    const text = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/plain' } })).body;
    t.match(text, /CPU CORES/);
    const html = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } })).body;
    t.match(html, /· CPU [\d.]+ cores<\/small>/);
    t.match(html, /<span class="gpu-busy" [^>]*>87% busy<\/span>/);
  });
}

t.test('one snapshot alone gives no rate: cpuCores is null, not 0, and no series is written', async (t) => {
  const idle = await spawnShardProcess(t, 1);
  // A clock that does not move: the registration's snapshot stays the one served.
  const clock = manualClock();
  const scenario = twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: idle.members[0]!, name: 'llama-server', usedMiB: 900 }]);
  const { app } = await buildTestApp(t, { scenario, config: { gpuGraceMs: 0 }, deps: { now: clock.now } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: idle.pid, gpus: [0] } })).statusCode, 201);
  await settle(app);
  const compute = (await app.inject({ method: 'GET', url: '/shards/s/compute' })).json();
  t.equal(compute.cpuCores, null);
  t.notMatch((await app.inject({ method: 'GET', url: '/metrics' })).body, /nodecompute_shard_cpu_cores\{/);
});

t.test("pollers: rates that move at every snapshot (CPU cores, SM and GPU utilization) leave the ETags of /shards and /gpus as they were", async (t) => {
  const busy = await spawnBusyShard(t);
  const processes = (smUtilPct: number) => [{ gpuUuid: UUIDS[0]!, pid: busy.members[0]!, name: 'llama-server', usedMiB: 900, smUtilPct }];
  const clock = manualClock();
  const scenario = (smUtilPct: number, utilizationPct: number) => {
    const node = twoGpuNode(processes(smUtilPct));
    node.gpus[0]!.utilizationPct = utilizationPct;
    return node;
  };
  const { app, fake } = await buildTestApp(t, { scenario: scenario(10, 15), backend: 'nvml', config: { cacheTtlMs: 0, maxStaleMs: 0, gpuGraceMs: 0 }, deps: { now: clock.now } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: busy.pid, gpus: [0] } })).statusCode, 201);
  await settle(app);
  const poll = async () => {
    clock.advance(1);
    const res = await app.inject({ method: 'GET', url: '/shards' });
    const gpus = await app.inject({ method: 'GET', url: '/gpus' });
    return { etag: res.headers.etag, shard: res.json().shards[0], gpusEtag: gpus.headers.etag, gpu: gpus.json().gpus[0] };
  };
  const before = await poll();
  await new Promise((resolve) => setTimeout(resolve, 600));
  fake.setScenario(scenario(40, 95));
  const after = await poll();
  t.not(after.shard.compute.gpus[0].smUtilPct, before.shard.compute.gpus[0].smUtilPct, 'and the SM figure');
  t.equal(after.etag, before.etag, 'the same ETag: a weak one names equivalent answers');
  t.same([before.gpu.utilizationPct, after.gpu.utilizationPct], [15, 95], "the GPU's utilization moved");
  t.equal(after.gpusEtag, before.gpusEtag, 'and /gpus keeps its ETag too');
});
