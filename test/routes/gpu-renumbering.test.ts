// A GPU drops out of nvidia-smi's list and nvidia-smi renumbers those after it, as it does for a GPU
// the driver no longer has (fallen off the bus, detached); NVML does once initialised again after a
// driver reload. Through the real app, the fake driver (helpers/backend.ts) and real shard
// processes whose children hold the GPUs. Each shard is judged on the device it was
// registered with (its UUID), not on whatever GPU holds its index now: the shard of the lost GPU
// alone is gpu-lost, the shard of the GPU after it stays ready, warned that its GPU has a new index,
// and its memory is not stray (not in compute, metrics or the alert's join). When the GPU is back
// under its old index, each shard is on its own device again. While nvidia-smi cannot be asked, a
// re-PUT of the same GPUs keeps their UUIDs.
import t from 'tap';
import { buildTestApp, settle, spawnShardProcess } from '../helpers/app.js';
import { failDriver, NO_XIDS, reloaded, UNSAMPLED_SM } from '../helpers/backend.js';
import type { FakeGpu, FakeScenario } from '../helpers/fake-nvidia-smi.js';

const UUIDS = ['GPU-0a0a0a0a-0000-0000-0000-000000000000', 'GPU-1b1b1b1b-0000-0000-0000-000000000000', 'GPU-2c2c2c2c-0000-0000-0000-000000000000'];

const gpuAt = (index: number, uuid: string): FakeGpu => ({ index, uuid, name: 'NVIDIA H200', totalMiB: 143771, usedMiB: 20000, freeMiB: 123157, reservedMiB: 614 });

t.test('renumbered after a GPU drops out: each shard is judged on its own device, under its new index', async (t) => {
  const shards = await Promise.all(UUIDS.map(() => spawnShardProcess(t, 1)));
  const holders = shards.map((shard, i) => ({ gpuUuid: UUIDS[i]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 19000 }));
  const all: FakeScenario = { gpus: UUIDS.map((uuid, index) => gpuAt(index, uuid)), processes: holders };
  const { app, fake } = await buildTestApp(t, { scenario: all, config: { cacheTtlMs: 0, maxStaleMs: 0 } });
  for (const [i, shard] of shards.entries()) {
    const put = await app.inject({ method: 'PUT', url: `/shards/s${i}`, payload: { pid: shard.pid, gpus: [i], graceMs: 0 } });
    t.equal(put.statusCode, 201);
    t.same(put.json().gpuUuids, [UUIDS[i]], 'the registration keeps the UUID of the GPU it names');
  }
  const probe = async (id: string) => (await app.inject({ method: 'GET', url: `/shards/${id}/ready` })).json();
  /** The verdicts once a refresh begun after `what` has landed. */
  const settled = async () => {
    await app.inject({ method: 'GET', url: '/gpus' });
    await settle(app);
    return Promise.all(['s0', 's1', 's2'].map(probe));
  };
  t.same((await settled()).map((v) => v.state), ['ready', 'ready', 'ready']);

  // GPU 1 goes: nvidia-smi lists GPU 0 and, as GPU 1, the device that was GPU 2; NVML too, once
  // initialised again after a driver reload (until then its indices stand).
  fake.update((s) => ({ gpus: [gpuAt(0, UUIDS[0]!), gpuAt(1, UUIDS[2]!)], processes: [holders[0]!, holders[2]!], nvml: reloaded(s) }));
  const [s0, s1, s2] = await settled();
  t.same([s0.state, s0.warnings], ['ready', []], 'GPU 0 kept its index');
  t.same([s1.state, s1.cause], ['gpu-lost', 'gpu-not-listed'], 'the shard of the lost GPU, not of the GPU now under its index');
  t.match(s1.reason, `placed on GPU 1, but GPU 1 (${UUIDS[1]}, NVIDIA H200) is no longer listed by the GPU driver`);
  t.same([s2.state, s2.cause], ['ready', null], 'its device is listed and holds its memory: under another index');
  t.match(s2.warnings, [new RegExp(`^GPU 2 as registered \\(${UUIDS[2]}\\) is GPU 1 now: the GPU driver renumbered GPUs after one went; judged on GPU 1, the same device\\. An engine restarted with CUDA_VISIBLE_DEVICES=2 `)]);
  t.match(s2.warnings[0], /lands on another device: name GPUs by UUID, or PUT the shard with its new gpus$/);

  const compute = (await app.inject({ method: 'GET', url: '/shards/s2/compute' })).json();
  t.same([compute.backend, compute.gpus, compute.strayGpus], ['CUDA', [{ index: 1, usedMiB: 19000, smUtilPct: UNSAMPLED_SM, xidErrors: NO_XIDS, utilizationPct: 0, migDevices: null }], []], 'its memory is on its own GPU, not stray');
  const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(metrics, /^nodecompute_shard_gpu_placed\{shard="s2",gpu="1"\} 1$/m, 'placed under the new index, as its memory series are');
  t.notMatch(metrics, /^nodecompute_shard_gpu_placed\{shard="s1",/m, 'the lost GPU has no index to be placed under');
  t.match(metrics, new RegExp(`^nodecompute_shard_gpu_memory_bytes\\{shard="s2",gpu="1",uuid="${UUIDS[2]}"\\} `, 'm'));

  const page = (await app.inject({ method: 'GET', url: '/', headers: { accept: '*/*' } })).body;
  t.match(page, /^1\s+NVIDIA H200 \(LOST\)\s.*the GPU driver lists GPU-2c2c2c2c-0000-0000-0000-000000000000 as GPU 1 now; placed on it: s1 \(gpu-lost\)$/m, 'the lost row lists its own shard');
  t.notMatch(page, /s\d holds nothing/, 'no shard is idle on its GPU');
  t.match(page, /^s1\s+gpu-lost\s+1 lost\s/m, 'the shards table: s1 given GPU 1, which is lost');
  t.match(page, /^s2\s+ready\s+2→1\s+GPU 1: /m, 's2 given GPU 2, listed as GPU 1 now, which it holds');
  t.match((await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } })).body, '<td class="given" data-label="Given">GPU 2→1</td>');

  // A controller re-PUTs each shard's spec unchanged: the same devices, whatever index nvidia-smi gives them now.
  const before = (await app.inject({ method: 'GET', url: '/shards/s2' })).json().registeredAt;
  for (const [i, shard] of shards.entries()) {
    const repeat = await app.inject({ method: 'PUT', url: `/shards/s${i}`, payload: { pid: shard.pid, gpus: [i], graceMs: 0 } });
    t.same([repeat.statusCode, repeat.json().gpuUuids], [200, [UUIDS[i]]], `s${i}: its own device, not the one under index ${i} now`);
  }
  t.same((await Promise.all(['s0', 's1', 's2'].map(probe))).map((v) => v.state), ['ready', 'gpu-lost', 'ready'], 'the verdicts stand');
  t.equal((await app.inject({ method: 'GET', url: '/shards/s2' })).json().registeredAt, before, 'and the grace clock');

  // A re-PUT of s2 with its new index names the same device: the same run goes on.
  const moved = await app.inject({ method: 'PUT', url: '/shards/s2', payload: { pid: shards[2]!.pid, gpus: [1], graceMs: 0 } });
  t.same([moved.statusCode, moved.json().gpus, moved.json().gpuUuids, moved.json().registeredAt], [200, [1], [UUIDS[2]], before], 'same device: the same run goes on');
  t.same((await probe('s2')).warnings, [], 'registered under its index now: nothing renumbered');

  // GPU 1 is back (a reset), and the numbering with it: s2's device is GPU 2 again.
  fake.update((s) => ({ ...all, nvml: reloaded(s) }));
  const back = await settled();
  t.same(back.map((v) => v.state), ['ready', 'ready', 'ready'], 'each on its own device');
  t.match(back[2].warnings, [/^GPU 1 as registered \(GPU-2c2c2c2c-0000-0000-0000-000000000000\) is GPU 2 now/], 'the device s2 was registered with, under the index it has now');

  // nvidia-smi cannot be asked: a re-PUT naming the same GPUs keeps the devices known for them; one
  // naming others takes them on trust, without UUIDs (judged by index).
  failDriver(fake, { kind: 'driver-unreachable' });
  await settled();
  const same = await app.inject({ method: 'PUT', url: '/shards/s0', payload: { pid: shards[0]!.pid, gpus: [0], graceMs: 5000 } });
  t.same([same.statusCode, same.json().gpuUuids], [200, [UUIDS[0]]]);
  const other = await app.inject({ method: 'PUT', url: '/shards/s0', payload: { pid: shards[0]!.pid, gpus: [1], graceMs: 5000 } });
  t.same([other.statusCode, other.json().gpuUuids], [200, null]);
});
