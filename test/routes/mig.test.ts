// MIG devices under NVML, on the node of the H100 MIG capture (its `nvidia-smi -L` and default table:
// four MIG devices, three processes on the first): per-device memory and processes in /gpus, foreign
// memory per MIG device, a shard placed on a MIG device by its UUID, the warning for memory on
// another one, metrics, the status page and the doctor; and what nvidia-smi, which lists none, says.
import t, { type Test } from 'tap';
import type { FakeMigDevice, FakeProcess, FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { readSample } from '../helpers/samples.js';

const LIST = readSample('nvsmi-capture_h100-mig_590.48.01_list-L.txt');
const TABLE = readSample('nvsmi-capture_h100-mig_590.48.01_load_default-table.txt');
const MIB = 1024 * 1024;

const [, gpuName, gpuUuid] = /^GPU 0: (.+) \(UUID: (GPU-[^)]+)\)$/m.exec(LIST)!;
const [, gpuUsed, gpuTotal] = /\|\s+(\d+)MiB \/\s+(\d+)MiB \|/.exec(TABLE)!;
const profiles = [...LIST.matchAll(/MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)/g)].map(([, profile, , uuid]) => ({ profile: profile!, uuid: uuid! }));
/** The MIG devices table: GPU, GI, CI, MIG device, then its memory used / total. */
const MIG_DEVICES: FakeMigDevice[] = [...TABLE.matchAll(/^\|\s+0\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+(\d+)MiB \/\s*(\d+)MiB/gm)].map(([, gi, ci, dev, used, total]) => ({
  ...profiles[Number(dev)]!,
  gpuInstanceId: Number(gi),
  computeInstanceId: Number(ci),
  usedMiB: Number(used),
  totalMiB: Number(total),
  freeMiB: Number(total) - Number(used),
}));
/** The processes table: GI, CI, PID, name and memory, each on GPU 0. */
const CAPTURED = [...TABLE.matchAll(/^\|\s+0\s+(\d+)\s+(\d+)\s+(\d+)\s+C\s+(\S+)\s+(\d+)MiB \|$/gm)].map(([, gi, ci, pid, name, used]) => ({
  gpuInstanceId: Number(gi),
  computeInstanceId: Number(ci),
  pid: Number(pid),
  name: name!,
  usedMiB: Number(used),
}));
const OTHER_GPU = 'GPU-11111111-0000-0000-0000-000000000000';

/**
 * The capture's node, plus a GPU 1 without MIG; the captured PIDs replaced by live ones, in order. As a
 * DaemonSet runs, unprivileged: NVML refuses the MIG GPU's aggregate process list.
 */
function migNode(pids: number[], changes: Partial<FakeProcess>[] = []): FakeScenario {
  return {
    gpus: [
      { index: 0, uuid: gpuUuid!, name: gpuName!, totalMiB: Number(gpuTotal), usedMiB: Number(gpuUsed), freeMiB: Number(gpuTotal) - Number(gpuUsed), migMode: 'Enabled', migDevices: MIG_DEVICES },
      { index: 1, uuid: OTHER_GPU, name: gpuName!, totalMiB: Number(gpuTotal), usedMiB: 0, freeMiB: Number(gpuTotal) },
    ],
    processes: CAPTURED.map((captured, i) => ({ ...captured, gpuUuid: gpuUuid!, pid: pids[i]!, ...changes[i] })),
    nvml: { unprivileged: true },
  };
}

async function setup(t: Test, backend: 'nvml' | 'nvidia-smi' = 'nvml') {
  const [shard, foreign] = await Promise.all([spawnShardProcess(t), spawnShardProcess(t, 0)]);
  const pids = [shard.members[0]!, shard.members[1]!, foreign.pid];
  const clock = manualClock();
  const built = await buildTestApp(t, { scenario: migNode(pids), backend, config: { cacheTtlMs: 0, maxStaleMs: 0, gpuGraceMs: 0 }, deps: { now: clock.now } });
  const get = async (url: string, accept?: string) => {
    clock.advance(1);
    const res = await built.app.inject({ method: 'GET', url, headers: accept === undefined ? {} : { accept } });
    return res.headers['content-type']?.toString().startsWith('application/json') ? res.json() : res.body;
  };
  const put = (id: string, payload: object) => built.app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid: shard.pid, ...payload } });
  return { ...built, shard, foreign, pids, get, put, clock };
}

t.test('the capture reads as four MIG devices with three processes on the first', async (t) => {
  t.same(
    MIG_DEVICES.map((mig) => [mig.profile, mig.gpuInstanceId, mig.usedMiB, mig.totalMiB]),
    [['3g.40gb', 2, 11091, 40448], ['2g.20gb', 3, 17, 20096], ['1g.10gb', 9, 9, 9984], ['1g.10gb', 10, 9, 9984]],
  );
  t.same(CAPTURED.map((process) => [process.gpuInstanceId, process.usedMiB]), [[2, 2296], [2, 1272], [2, 7484]]);
});

t.test('NVML: /gpus gives each MIG device with its memory, and the MIG device of each process', async (t) => {
  const { get, foreign } = await setup(t);
  const { gpus } = await get('/gpus');
  t.same(gpus[0].migDevices.map((mig: { profile: string; gpuInstanceId: number; computeInstanceId: number }) => [mig.profile, mig.gpuInstanceId, mig.computeInstanceId]), [['3g.40gb', 2, 0], ['2g.20gb', 3, 0], ['1g.10gb', 9, 0], ['1g.10gb', 10, 0]]);
  t.same(gpus[0].migDevices[0], { uuid: MIG_DEVICES[0]!.uuid, profile: '3g.40gb', gpuInstanceId: 2, computeInstanceId: 0, memory: { totalMiB: 40448, usedMiB: 11091, freeMiB: 29357 } });
  t.same(gpus[0].processes.map((process: { migUuid: string }) => process.migUuid), Array(3).fill(MIG_DEVICES[0]!.uuid));
  t.match(gpus[0].processes[2], { pid: foreign.pid, name: './gpu_burn', usedMiB: 7484, shard: null });
  t.equal(gpus[1].migDevices, null, 'MIG off: null');
  t.equal(gpus[0].memory.usedMiB, 11125, "the GPU's own figures stay the whole GPU's");
});

t.test('NVML with 32-byte process entries: the same MIG devices per process', async (t) => {
  const { get, fake } = await setup(t);
  fake.update((s) => ({ ...s, nvml: { ...s.nvml, processStruct: 32 } }));
  const { gpus } = await get('/gpus');
  t.same(gpus[0].processes.map((process: { migUuid: string }) => process.migUuid), Array(3).fill(MIG_DEVICES[0]!.uuid));
});

t.test('foreign memory per MIG device: the shard placed on it, its compute, metrics and status page', async (t) => {
  const { get, put, foreign } = await setup(t);
  const placed = await put('llama', { gpus: [0], migDevices: [MIG_DEVICES[0]!.uuid, MIG_DEVICES[1]!.uuid] });
  t.equal(placed.statusCode, 201);
  t.same(placed.json().migDevices, [MIG_DEVICES[0]!.uuid, MIG_DEVICES[1]!.uuid]);
  const { gpus } = await get('/gpus/foreign-memory');
  t.match(gpus[0].migDevices[0], { profile: '3g.40gb', usedMiB: 11091, shardMiB: 2296 + 1272, foreignMiB: 11091 - 3568, foreignProcesses: [{ pid: foreign.pid, usedMiB: 7484 }] });
  t.match(gpus[0].migDevices[1], { profile: '2g.20gb', shardMiB: 0, foreignMiB: 17, foreignProcesses: [] });
  t.equal(gpus[1].migDevices, null);
  const compute = await get('/shards/llama/compute');
  t.same(compute.gpus[0].migDevices, [
    { uuid: MIG_DEVICES[0]!.uuid, profile: '3g.40gb', usedMiB: 3568, foreignMiB: 7523 },
    { uuid: MIG_DEVICES[1]!.uuid, profile: '2g.20gb', usedMiB: 0, foreignMiB: 17 },
  ], 'its MIG devices: the one it uses, and the one it was placed on and does not');
  t.match(await get('/shards/llama/ready'), { state: 'ready', warnings: [] });
  const metrics = await get('/metrics');
  const labels = `gpu="0",uuid="${gpuUuid}",mig_uuid="${MIG_DEVICES[0]!.uuid}",profile="3g.40gb"`;
  t.match(metrics, `nodecompute_mig_device_memory_bytes{${labels},kind="foreign"} ${7523 * MIB}`);
  t.match(metrics, `nodecompute_mig_device_memory_bytes{${labels},kind="total"} ${40448 * MIB}`);
  const text = await get('/', 'text/plain');
  t.match(text, `(MIG) GPU 0: MIG 3g.40gb ${MIG_DEVICES[0]!.uuid}: 10.8 / 39.5 GiB, foreign 7.3 GiB (PID ${foreign.pid} ./gpu_burn)`);
  t.match(text, `(MIG) GPU 0: MIG 2g.20gb ${MIG_DEVICES[1]!.uuid}: 17 MiB / 19.6 GiB, foreign 17 MiB\n`);
  t.match(await get('/', 'text/html'), `<li class="mig">MIG 1g.10gb ${MIG_DEVICES[2]!.uuid}`);
  const doctor = await get('/doctor');
  t.match(doctor.checks.find((check: { name: string }) => check.name === 'mig'), { status: 'ok', detail: /GPU 0: 4 MIG device/ });
});

t.test('memory on another MIG device than it was placed on is a warning naming both', async (t) => {
  const { get, put, fake, pids } = await setup(t);
  t.equal((await put('llama', { gpus: [0], migDevices: [MIG_DEVICES[0]!.uuid] })).statusCode, 201);
  fake.setScenario(migNode(pids, [{}, { gpuInstanceId: 3, usedMiB: '[N/A]' }]));
  const ready = await get('/shards/llama/ready');
  t.match(ready, { state: 'ready', warnings: [new RegExp(`MIG device ${MIG_DEVICES[1]!.uuid} \\(2g.20gb, GPU 0: memory not reported\\), not on .*${MIG_DEVICES[0]!.uuid}.*NVIDIA_VISIBLE_DEVICES`)] });
  const compute = await get('/shards/llama/compute');
  t.match(compute.gpus[0].migDevices, [{ uuid: MIG_DEVICES[0]!.uuid, usedMiB: 2296 }, { uuid: MIG_DEVICES[1]!.uuid, usedMiB: null }]);
  fake.setScenario(migNode(pids, [{}, { gpuInstanceId: 99 }]));
  const { gpus } = await get('/gpus');
  t.same(gpus[0].processes.map((process: { pid: number }) => process.pid), [pids[0], pids[2]], 'on no MIG device listed: in no MIG device\'s list');
  t.match(await get('/shards/llama/ready'), { state: 'ready', warnings: [] });
});

t.test('a registration names MIG devices of its own GPUs, or is refused with 422', async (t) => {
  const { put } = await setup(t);
  const unknown = await put('a', { gpus: [0], migDevices: ['MIG-99999999-0000-0000-0000-000000000000'] });
  t.match(unknown.json(), { statusCode: 422, code: 'NODECOMPUTE_UNKNOWN_MIG_DEVICE', message: new RegExp(`does not exist.*${MIG_DEVICES[3]!.uuid} \\(1g.10gb, GPU 0\\)`) });
  const elsewhere = await put('a', { gpus: [1], migDevices: [MIG_DEVICES[0]!.uuid] });
  t.match(elsewhere.json(), { statusCode: 422, code: 'NODECOMPUTE_UNKNOWN_MIG_DEVICE', message: /is on GPU 0, which is not in "gpus"/ });
  const noGpus = await put('a', { gpus: [], migDevices: [MIG_DEVICES[0]!.uuid] });
  t.match(noGpus.json(), { statusCode: 422, code: 'NODECOMPUTE_UNKNOWN_MIG_DEVICE', message: /"gpus" is empty/ });
  const malformed = await put('a', { gpus: [0], migDevices: ['GPU-1'] });
  t.equal(malformed.statusCode, 400);
  t.match(malformed.json().message, /migDevices/);
  const repeat = await put('a', { gpus: [0], migDevices: [MIG_DEVICES[0]!.uuid] });
  t.equal(repeat.statusCode, 201);
  t.equal((await put('a', { gpus: [0], migDevices: [MIG_DEVICES[0]!.uuid] })).statusCode, 200, 'the same again: unchanged');
  t.equal((await put('a', { gpus: [0], migDevices: [MIG_DEVICES[1]!.uuid] })).statusCode, 200, 'another MIG device: replaced');
  t.same((await put('a', { gpus: [0] })).json().migDevices, null, 'without: whole GPUs');
});

t.test('NVML on a node without MIG devices refuses a MIG UUID, saying there are none', async (t) => {
  const { put, fake, pids } = await setup(t);
  fake.setScenario({ ...migNode(pids), gpus: migNode(pids).gpus.map((gpu) => ({ ...gpu, migMode: 'Disabled' })) });
  t.match((await put('a', { gpus: [0], migDevices: [MIG_DEVICES[0]!.uuid] })).json(), { statusCode: 422, message: /this node has no MIG device/ });
});

t.test('NVML listing no MIG device on a MIG GPU: the doctor warns that this container may not see them', async (t) => {
  const { get, fake, pids } = await setup(t);
  fake.setScenario({ ...migNode(pids), gpus: migNode(pids).gpus.map((gpu) => ({ ...gpu, migDevices: [] })) });
  const { gpus } = await get('/gpus');
  t.same([gpus[0].migDevices, gpus[0].processes], [[], []]);
  const doctor = await get('/doctor');
  t.match(doctor.checks.find((check: { name: string }) => check.name === 'mig'), { status: 'warn', detail: /GPU 0: 0 MIG device/, fix: /NVIDIA_MIG_MONITOR_DEVICES=all/ });
});

t.test('NVML refusals leave MIG devices out, never the GPU', async (t) => {
  const { get, fake, pids } = await setup(t);
  const refuse = (fn: string) => fake.setScenario({ ...migNode(pids), nvml: { errors: { [fn]: { code: 3 } } } });
  refuse('nvmlDeviceGetMaxMigDeviceCount');
  const counted = (await get('/gpus')).gpus[0];
  t.equal(counted.migDevices, null, 'no count: none known');
  t.same(counted.processes.map((process: { migUuid: string | null }) => process.migUuid), [null, null, null], "the GPU's own list, privileged here, still has every process");
  refuse('nvmlDeviceGetGpuInstanceId');
  t.same((await get('/gpus')).gpus[0].migDevices, [], 'no instance ids: none can be matched');
  refuse('nvmlDeviceGetMigDeviceHandleByIndex');
  t.same((await get('/gpus')).gpus[0].migDevices, []);
  refuse('nvmlDeviceGetName');
  t.same((await get('/gpus')).gpus[0].migDevices.map((mig: { profile: string }) => mig.profile), ['', '', '', ''], 'no name: no profile');
});

t.test('unprivileged, a MIG GPU whose MIG devices cannot be read fails the process query with NVML\'s words', async (t) => {
  const { app, fake, pids, clock } = await setup(t);
  const fails = async (errors: Record<string, { code: number; index?: number }>, words: RegExp) => {
    fake.setScenario({ ...migNode(pids), nvml: { unprivileged: true, errors } });
    // Past the back-off of the failure before.
    clock.advance(60_000);
    const body = (await app.inject({ method: 'GET', url: '/gpus' })).json();
    t.match(body, { statusCode: 503, code: 'NODECOMPUTE_NVML_FAILED', message: words });
  };
  await fails({ nvmlDeviceGetMaxMigDeviceCount: { code: 3 } }, /No permission|Insufficient Permissions/i);
  await fails({ nvmlDeviceGetComputeRunningProcesses_v3: { code: 3, index: 0 } }, /Not Supported/i);
});

t.test('nvidia-smi lists no MIG devices: null, a MIG UUID is taken on trust, and the doctor warns', async (t) => {
  const { get, put } = await setup(t, 'nvidia-smi');
  const { gpus } = await get('/gpus');
  t.equal(gpus[0].migDevices, null);
  t.equal(gpus[0].processes[0].migUuid, null);
  t.equal((await get('/gpus/foreign-memory')).gpus[0].migDevices, null);
  const placed = await put('llama', { gpus: [0], migDevices: ['MIG-99999999-0000-0000-0000-000000000000'] });
  t.equal(placed.statusCode, 201);
  t.equal((await get('/shards/llama/compute')).gpus[0].migDevices, null);
  const doctor = await get('/doctor');
  t.match(doctor.checks.find((check: { name: string }) => check.name === 'mig'), { status: 'warn', fix: /NVML backend/ });
});
