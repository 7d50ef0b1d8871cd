// The NVML backend against the fake libnvidia-ml.so.1 (test/fixtures/nvml), driven by the same
// scenario as the fake nvidia-smi in the same directory: both backends must give the same records;
// then what only NVML does (the entry-size probe, old symbols, re-initialisation, a stuck call).
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { createNvmlDriver } from '../../src/system/nvml/nvml-driver.js';
import { cString, loadNvmlLibrary, nvmlCallsUnderWay } from '../../src/system/nvml/nvml-library.js';
import { installFakeNvml, nvmlCalls } from '../../scripts/fake-nvml.js';
import { createFakeNvidiaSmi, eightGpuNode, waitUntil, type FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';
import { rig, sameAsSmi, silent } from '../helpers/nvml-rig.js';

t.test('on the 8x H200 node NVML and nvidia-smi give the same GPUs, processes and versions', async (t) => {
  // Utilization: a busy GPU, an idle one (absent: 0) and one that gives none.
  const node = eightGpuNode();
  node.gpus[2]!.utilizationPct = 87;
  node.gpus[3]!.utilizationPct = '[N/A]';
  const { nvml, smi, observations } = rig(t, node);
  t.equal(nvml.backend, 'nvml');
  t.match(nvml.source, /libnvidia-ml\.so\.1$/);
  const gpus = await nvml.queryGpus();
  t.same(sameAsSmi(gpus), await smi.queryGpus());
  t.equal(gpus.gpus.length, 8);
  t.same(sameAsSmi(gpus.gpus[2]), { index: 2, uuid: gpus.gpus[2]!.uuid, name: 'NVIDIA H200', totalMiB: 143771, usedMiB: 105851, freeMiB: 37307, reservedMiB: 614, migMode: 'Disabled', busId: '00000000:3A:00.0', utilizationPct: 87 });
  t.same(gpus.gpus.map((gpu) => gpu.utilizationPct), [0, 0, 87, null, 0, 0, 0, 0], 'nvmlDeviceGetUtilizationRates, NOT_SUPPORTED as null');
  const apps = await nvml.queryComputeApps();
  t.same(sameAsSmi(apps), await smi.queryComputeApps());
  t.same(
    apps.filter((app) => app.pid === 1425258).map((app) => app.usedMiB),
    [105842, 106082],
    'a process on two GPUs is listed on each',
  );
  t.equal(apps.find((app) => app.pid === 1425261)?.usedMiB, null, 'memory NVML cannot give reads as null');
  t.equal(apps.find((app) => app.pid === 1758887)?.name, '[Not Found]', 'a process in another PID namespace is named as nvidia-smi names it');
  t.same(await nvml.queryVersion(), { smiVersion: null, driverVersion: '590.48.01', cudaVersion: '13.1' });
  t.same(
    observations.map((o) => [o.query, o.outcome]),
    [
      ['gpus', 'ok'],
      ['compute-apps', 'ok'],
      ['version', 'ok'],
    ],
  );
  t.equal(nvml.running, 0);
});

t.test('GPUs without processes: none listed, by either backend', async (t) => {
  const { nvml, smi } = rig(t, { ...eightGpuNode(), processes: eightGpuNode().processes.slice(0, 2) });
  const apps = await nvml.queryComputeApps();
  t.same(sameAsSmi(apps), await smi.queryComputeApps());
  t.equal(apps.length, 2);
});

t.test('MIG mode, missing memory figures and process names NVML refuses read as nvidia-smi reads them', async (t) => {
  const scenario = eightGpuNode();
  scenario.gpus[0]!.migMode = 'Enabled';
  scenario.gpus[1]!.migMode = '[N/A]';
  for (const gpu of scenario.gpus.slice(3)) Object.assign(gpu, { totalMiB: '[N/A]', usedMiB: '[N/A]', freeMiB: '[N/A]', reservedMiB: '[N/A]' });
  scenario.nvml = { errors: { nvmlSystemGetProcessName: { code: 4 } } };
  const { nvml, smi } = rig(t, scenario);
  const [fromNvml, fromSmi] = [await nvml.queryGpus(), await smi.queryGpus()];
  t.same(sameAsSmi(fromNvml), fromSmi);
  t.same(fromNvml.gpus.map((gpu) => gpu.migMode).slice(0, 3), ['Enabled', null, 'Disabled']);
  t.equal(fromNvml.gpus[5]!.totalMiB, null);
  t.equal((await nvml.queryComputeApps())[0]!.name, '[Insufficient Permissions]');
  scenario.nvml = { errors: { nvmlSystemGetProcessName: { code: 999 } } };
  const other = rig(t, scenario);
  t.equal((await other.nvml.queryComputeApps())[0]!.name, '[Unknown Error]', 'another refusal is named by NVML');
});

t.test('the R535 32-byte process entries are found by probing, not assumed', async (t) => {
  for (const stride of [24, 32] as const) {
    const { nvml, smi } = rig(t, { ...eightGpuNode(), nvml: { processStruct: stride } });
    t.same(sameAsSmi(await nvml.queryComputeApps()), await smi.queryComputeApps(), `${stride}-byte entries`);
    t.same(sameAsSmi(await nvml.queryComputeApps()), await smi.queryComputeApps(), `${stride}-byte entries, once the size is known`);
  }
});

t.test('an old driver without the _v3 and _v2 symbols: the older calls serve, and reserved memory reads as null', async (t) => {
  const { nvml, smi, fake } = rig(t, eightGpuNode(), { variant: 'old' });
  fake.update((s) => ({ ...s, supportsReserved: false }));
  const gpus = await nvml.queryGpus();
  const fromSmi = await smi.queryGpus();
  // nvml.h: the v1 figure of used memory counts the reserved memory in (v2 tells them apart).
  t.same(gpus.gpus.map((gpu) => gpu.usedMiB), fromSmi.gpus.map((gpu) => gpu.usedMiB! + 614));
  t.same(sameAsSmi(gpus.gpus.map((gpu) => ({ ...gpu, usedMiB: 0 }))), fromSmi.gpus.map((gpu) => ({ ...gpu, usedMiB: 0 })));
  t.equal(gpus.gpus[0]!.reservedMiB, null);
  t.same(sameAsSmi(await nvml.queryComputeApps()), await smi.queryComputeApps());
});

t.test('the unversioned process call (16-byte entries) serves where it alone exists', async (t) => {
  const dir = t.testdir();
  createFakeNvidiaSmi(dir, eightGpuNode());
  const library = loadNvmlLibrary(installFakeNvml(dir));
  const only = { ...library, has: (fn: Parameters<typeof library.has>[0]) => fn !== 'processes' && fn !== 'processesV2' && library.has(fn) };
  const call: typeof library.call = (fn, ...args) => library.call(fn === 'processes' || fn === 'processesV2' ? 'processesV1' : fn, ...args);
  const nvml = createNvmlDriver({ library: { ...only, call }, timeoutMs: 20_000, log: silent, procRoot: '/proc' });
  const apps = await nvml.queryComputeApps();
  t.equal(apps.length, 8);
  t.same(sameAsSmi(apps[0]), { gpuUuid: eightGpuNode().gpus[0]!.uuid, pid: 1328667, name: '/usr/local/bin/python3.10', usedMiB: 130004 });
});

t.test('a GPU NVML cannot reach is left out and named by its bus id, as nvidia-smi does', async (t) => {
  const { nvml, smi, fake } = rig(t, eightGpuNode());
  await nvml.queryGpus();
  fake.update((s) => ({ ...s, unreachable: [{ index: 1, said: 'GPU is lost' }, { index: 6 }] }));
  const [fromNvml, fromSmi] = [await nvml.queryGpus(), await smi.queryGpus()];
  t.same(sameAsSmi(fromNvml.gpus), fromSmi.gpus);
  t.same(fromNvml.unreachable, fromSmi.unreachable, 'the same bus ids, in NVML words');
  t.same(fromNvml.unreachable.map((gpu) => gpu.said), ['GPU is lost', 'Unknown Error']);
  t.same(sameAsSmi(await nvml.queryComputeApps()), await smi.queryComputeApps());
});

t.test('a GPU lost before NVML ever listed it is named from the driver\'s /proc files, else by its NVML index', async (t) => {
  const procRoot = t.testdir({ driver: { nvidia: { gpus: { '0000:18:00.0': {}, '0000:2a:00.0': {} } } } });
  const scenario = { ...eightGpuNode(), unreachable: [{ index: 1, said: 'GPU is lost' }] };
  const { nvml } = rig(t, scenario, { procRoot });
  t.same((await nvml.queryGpus()).unreachable, [{ busId: '00000000:2A:00.0', said: 'GPU is lost' }]);
  const bare = rig(t, scenario);
  t.same((await bare.nvml.queryGpus()).unreachable, [{ busId: 'unknown (NVML index 1)', said: 'GPU is lost' }]);
});

t.test('a GPU lost between the listing and a device call is said unreachable, not failed', async (t) => {
  const { nvml } = rig(t, { ...eightGpuNode(), nvml: { errors: { nvmlDeviceGetMemoryInfo_v2: { code: 15, index: 3 } } } });
  const listing = await nvml.queryGpus();
  t.equal(listing.gpus.length, 7);
  t.same(listing.unreachable, [{ busId: '00000000:5D:00.0', said: 'GPU is lost' }]);
});

t.test('a GPU whose UUID NVML does not give is left out of the listing', async (t) => {
  const { nvml } = rig(t, { ...eightGpuNode(), nvml: { errors: { nvmlDeviceGetUUID: { code: 3, index: 0 } } } });
  t.same((await nvml.queryGpus()).gpus.map((gpu) => gpu.index), [1, 2, 3, 4, 5, 6, 7]);
  t.notOk((await nvml.queryComputeApps()).some((app) => app.pid === 1328667));
});

t.test('the driver failing: coded 503 errors with NVML\'s words and what to do', async (t) => {
  const cases: Array<[FakeScenario['failures'], RegExp]> = [
    [{ all: { kind: 'driver-unreachable' } }, /Driver Not Loaded.*modprobe nvidia/],
    [{ all: { kind: 'library-mismatch' } }, /NVML code 18.*Reboot the node/],
    [{ all: { kind: 'no-devices' } }, /NVML lists no GPU/],
  ];
  for (const [failures, said] of cases) {
    const { nvml, observations } = rig(t, { ...eightGpuNode(), failures });
    await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED', statusCode: 503, message: said });
    t.equal(observations[0]?.outcome, 'NODECOMPUTE_NVML_FAILED');
  }
  const { nvml } = rig(t, { ...eightGpuNode(), nvml: { errors: { nvmlDeviceGetComputeRunningProcesses_v3: { code: 4 } } } });
  await t.rejects(nvml.queryComputeApps(), { code: 'NODECOMPUTE_NVML_FAILED', message: /nvmlDeviceGetComputeRunningProcesses.*may not access the GPUs/ });
  const count = rig(t, { ...eightGpuNode(), nvml: { errors: { nvmlDeviceGetCount_v2: { code: 3 } } } });
  await t.rejects(count.nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED', message: /nvmlDeviceGetCount_v2 failed/ });
  const version = rig(t, { ...eightGpuNode(), nvml: { errors: { nvmlSystemGetDriverVersion: { code: 3 } } } });
  await t.rejects(version.nvml.queryVersion(), { code: 'NODECOMPUTE_NVML_FAILED', message: /nvmlSystemGetDriverVersion/ });
  const cuda = rig(t, { ...eightGpuNode(), nvml: { errors: { nvmlSystemGetCudaDriverVersion_v2: { code: 3 } } } });
  t.equal((await cuda.nvml.queryVersion()).cudaVersion, null);
});

t.test('a driver reload (UNINITIALIZED): NVML is initialised again, the query answered, and it is logged', async (t) => {
  const { log, lines } = captureLog('warn');
  const { nvml, smi, fake } = rig(t, eightGpuNode(), { log });
  await nvml.queryGpus();
  // A reload may renumber the GPUs: what was kept of index 0 goes with the old initialisation.
  fake.update((s) => ({ ...s, gpus: [{ ...s.gpus[1]!, index: 0 }, { ...s.gpus[0]!, index: 1 }, ...s.gpus.slice(2)], nvml: { generation: 1 } }));
  const renumbered = await nvml.queryGpus();
  t.same(sameAsSmi(renumbered), await smi.queryGpus());
  t.same(renumbered.gpus.slice(0, 2).map((gpu) => gpu.busId), ['00000000:2A:00.0', '00000000:18:00.0']);
  t.match(lines, [{ level: 40, msg: /initialising it again/ }]);
  fake.update((s) => ({ ...s, nvml: { generation: 2, errors: { nvmlInit_v2: { code: 1 } } } }));
  await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED', message: /NVML code 1\).*being reloaded/ });
  fake.update((s) => ({ ...s, nvml: { errors: { nvmlDeviceGetCount_v2: { code: 1 } } } }));
  await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED', message: /right after initialising again/ }, 'still uninitialised: a coded error');
  fake.update((s) => ({ ...s, nvml: { generation: 3, errors: { nvmlDeviceGetCount_v2: { code: 3 } } } }));
  await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED', message: /nvmlDeviceGetCount_v2 failed/ }, 'another failure after initialising again is its own');
});

t.test('a process list that keeps changing between reads: read again, then a coded error', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-nvml-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  createFakeNvidiaSmi(dir, eightGpuNode());
  const library = loadNvmlLibrary(installFakeNvml(dir));
  const reads = { count: 0 };
  /** `change(n)`: what the n-th read of a list (infos given) answers instead, or null for the real answer. */
  const driverWith = (change: (n: number, count: Buffer) => number | null) => {
    reads.count = 0;
    const call: typeof library.call = async (fn, ...args) => {
      const code = await library.call(fn, ...args);
      if (fn !== 'processes' || args[2] === null) return code;
      reads.count += 1;
      return change(reads.count, args[1] as Buffer) ?? code;
    };
    return createNvmlDriver({ library: { ...library, call }, timeoutMs: 20_000, log: silent, procRoot: '/proc' });
  };
  const growing = driverWith(() => 7);
  await t.rejects(growing.queryComputeApps(), { code: 'NODECOMPUTE_NVML_FAILED', message: /nvmlDeviceGetComputeRunningProcesses_v3 failed.*code 7/ });
  t.equal(reads.count, 3, 'three tries on the first GPU');
  // The size probe's second read lists one process fewer than the first: it is read again.
  const shrinking = driverWith((n, count) => (n === 2 ? (count.writeUInt32LE(0, 0), 0) : null));
  t.equal((await shrinking.queryComputeApps()).length, 8);
  t.equal(reads.count, 11, 'the first GPU read four times (twice with its probe), the seven others once');
  const failing = driverWith((n) => (n === 2 ? 3 : null));
  t.equal((await failing.queryComputeApps()).length, 8, 'a failed probe read is read again too');
  const refused = driverWith((n) => (n === 1 ? 4 : null));
  await t.rejects(refused.queryComputeApps(), { code: 'NODECOMPUTE_NVML_FAILED', message: /code 4/ });
});

t.test('a hung call: answered at the deadline, no other call while it is stuck, calls again once it returns', async (t) => {
  const { log, lines } = captureLog('info');
  const { nvml, fake, observations, smi } = rig(t, { ...eightGpuNode(), nvml: { hang: ['nvmlDeviceGetMemoryInfo_v2'] } }, { timeoutMs: 300, log });
  const started = Date.now();
  await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_TIMEOUT', statusCode: 503, message: /within 300 ms.*dmesg/ });
  t.ok(Date.now() - started < 5000, 'answered at its deadline');
  t.equal(nvml.running, 1, 'the stuck call counts as running');
  t.equal(nvmlCallsUnderWay(), 1, 'and in the process: it could not end the usual way');
  await t.rejects(nvml.queryComputeApps(), { code: 'NODECOMPUTE_NVML_TIMEOUT', message: /nvmlDeviceGetMemoryInfo_v2 has not returned since/ });
  t.same(observations.at(-1), { query: 'compute-apps', durationMs: null, outcome: 'NODECOMPUTE_NVML_TIMEOUT' });
  fake.update((s) => ({ ...s, nvml: {} }));
  await waitUntil(() => nvml.running === 0, { what: 'the stuck call to return' });
  t.equal(nvmlCallsUnderWay(), 0);
  t.match(lines, [{ msg: /past its deadline has returned/ }]);
  t.same(sameAsSmi(await nvml.queryGpus()), await smi.queryGpus());
});

t.test('a query abandoned as the event set was to be made: the next query makes it', async (t) => {
  // One GPU whose last call answers past the deadline: the next call, the event set's, is the abandoned run's.
  const node = eightGpuNode();
  const oneGpu = { ...node, gpus: node.gpus.slice(0, 1), processes: node.processes.filter((process) => process.gpuUuid === node.gpus[0]!.uuid) };
  const { nvml, fake, smi, dir } = rig(t, { ...oneGpu, nvml: { logCalls: true, delayMs: { nvmlDeviceGetUtilizationRates: 600 } } }, { timeoutMs: 300 });
  await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_TIMEOUT' });
  await waitUntil(() => nvml.running === 0, { what: 'the late calls to return' });
  fake.update((s) => ({ ...s, nvml: { logCalls: true } }));
  t.same(sameAsSmi(await nvml.queryGpus()), await smi.queryGpus(), 'answered, not failed for good');
  t.equal(nvmlCalls(dir).filter((call) => call.fn === 'nvmlEventSetCreate').length, 1, 'the set is made once, by the query that went on');
});

t.test('a failure without a code is still a coded 503', async (t) => {
  const { nvml } = rig(t, eightGpuNode());
  // A koffi argument error stands for a bug: a rejection no NVML code explains.
  const driver = createNvmlDriver({ library: { ...loadNvmlLibrary(nvml.source), call: () => Promise.reject(new TypeError('bad argument')) }, timeoutMs: 1000, log: silent, procRoot: '/proc' });
  await t.rejects(driver.queryVersion(), { code: 'NODECOMPUTE_NVML_FAILED', statusCode: 503, message: /version query failed unexpectedly \(TypeError: bad argument\)/ });
});

t.test('the GPU and process queries of a first snapshot, together: NVML is initialised once', async (t) => {
  const { nvml, smi, dir } = rig(t, { ...eightGpuNode(), nvml: { logCalls: true } });
  const [gpus, apps] = await Promise.all([nvml.queryGpus(), nvml.queryComputeApps()]);
  t.same(sameAsSmi(gpus), await smi.queryGpus());
  t.same(sameAsSmi(apps), await smi.queryComputeApps());
  t.equal(nvmlCalls(dir).filter((call) => call.fn === 'nvmlInit_v2').length, 1);
  // The doctor's GPU query may run beside a refresh's: one event set, with every GPU in it.
  const pair = rig(t, { ...eightGpuNode(), nvml: { logCalls: true } });
  await Promise.all([pair.nvml.queryGpus(), pair.nvml.queryGpus()]);
  t.equal(nvmlCalls(pair.dir).filter((call) => call.fn === 'nvmlEventSetCreate').length, 1);
});

t.test('after killAll no NVML call is made', async (t) => {
  const { nvml, dir } = rig(t, { ...eightGpuNode(), nvml: { logCalls: true } });
  await nvml.queryVersion();
  const before = nvmlCalls(dir).length;
  t.ok(before > 0, 'the version query called NVML');
  nvml.killAll();
  t.ok(nvml.stopped);
  await t.rejects(nvml.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED', message: /shutting down/ });
  t.equal(nvmlCalls(dir).length, before);
});

t.test('a GPU whose bus id or name NVML does not give is still listed, without them', async (t) => {
  const errors = { nvmlDeviceGetPciInfo_v3: { code: 3, index: 0 }, nvmlDeviceGetName: { code: 3, index: 0 } };
  const { nvml } = rig(t, { ...eightGpuNode(), nvml: { errors } });
  t.match((await nvml.queryGpus()).gpus[0], { index: 0, name: '', busId: null });
});

t.test('the library binding: newest symbol first, a missing one answers FUNCTION_NOT_FOUND uncalled', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-nvml-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  createFakeNvidiaSmi(dir, eightGpuNode());
  const current = loadNvmlLibrary(installFakeNvml(dir));
  t.equal(current.symbol('count'), 'nvmlDeviceGetCount_v2');
  // Another directory: the loader hands back a library already loaded from the same path.
  mkdirSync(join(dir, 'old'));
  const old = loadNvmlLibrary(installFakeNvml(join(dir, 'old'), 'old'));
  t.notOk(old.has('processes'));
  t.equal(old.symbol('processes'), 'nvmlDeviceGetComputeRunningProcesses_v3', 'named as the newest name when missing');
  t.equal(await old.call('processes', 0n, Buffer.alloc(4), null), 13);
  await t.rejects(current.call('count', { not: 'a buffer' }), TypeError, 'an argument koffi cannot pass is a rejection');
  t.equal(current.errorString(15), 'GPU is lost');
  t.equal(cString(Buffer.from('no terminator')), 'no terminator');
});

t.test('per-process SM utilization: sampled figures, 0 for an idle process, null where the GPU gives none', async (t) => {
  const scenario = eightGpuNode();
  scenario.processes[0]!.smUtilPct = 87;
  // One MIG device taking the whole GPU, with the GPU's process on it.
  Object.assign(scenario.gpus[1]!, { migMode: 'Enabled', migDevices: [{ profile: '7g.141gb', uuid: 'MIG-11111111-0000-0000-0000-000000000000', gpuInstanceId: 0, computeInstanceId: 0 }] });
  Object.assign(scenario.processes.find((process) => process.pid === 1328668)!, { gpuInstanceId: 0, computeInstanceId: 0 });
  const { nvml, smi, fake } = rig(t, scenario);
  const apps = await nvml.queryComputeApps();
  const of = (pid: number, gpu = 0) => apps.find((app) => app.pid === pid && app.gpuUuid === scenario.gpus[gpu]!.uuid)?.smUtilPct;
  t.equal(of(1328667), 87, 'sampled');
  t.equal(of(1328669, 3), 0, 'no sample: no work since the last query');
  t.equal(of(1328668, 1), null, 'MIG: NVML gives no per-process figures');
  t.equal((await smi.queryComputeApps())[0]!.smUtilPct, undefined, 'nvidia-smi gives none');
  fake.update((s) => void (s.processes[0]!.smUtilPct = 12));
  t.equal((await nvml.queryComputeApps())[0]!.smUtilPct, 12, 'the newer samples only');
  fake.update((s) => ({ ...s, nvml: { errors: { nvmlDeviceGetProcessUtilization: { code: 3 } } } }));
  t.equal((await nvml.queryComputeApps())[0]!.smUtilPct, null, 'a GPU that refuses the question reads null');
});

t.test('a process query without utilization takes no sample, so the next query still gets it', async (t) => {
  const scenario = eightGpuNode();
  scenario.processes[0]!.smUtilPct = 87;
  const { nvml, dir } = rig(t, { ...scenario, nvml: { logCalls: true } });
  const apps = await nvml.queryComputeApps({ utilization: false });
  t.equal(apps.length, scenario.processes.length, 'every process listed');
  t.equal(apps[0]!.smUtilPct, undefined, 'no figure');
  t.equal(nvmlCalls(dir).filter((call) => call.fn === 'nvmlDeviceGetProcessUtilization').length, 0, 'no sample taken');
  t.equal((await nvml.queryComputeApps())[0]!.smUtilPct, 87);
});

t.test('utilization samples that vanish or are refused between the size and the read', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-nvml-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const scenario = eightGpuNode();
  scenario.processes[0]!.smUtilPct = 50;
  createFakeNvidiaSmi(dir, scenario);
  const library = loadNvmlLibrary(installFakeNvml(dir));
  for (const [answer, expected] of [[6, 0], [3, null]] as const) {
    const call: typeof library.call = async (fn, ...args) => (fn === 'processUtilization' && args[1] !== null ? answer : library.call(fn, ...args));
    const nvml = createNvmlDriver({ library: { ...library, call }, timeoutMs: 20_000, log: silent, procRoot: '/proc' });
    t.equal((await nvml.queryComputeApps())[0]!.smUtilPct, expected, `the read answers ${answer}`);
  }
});

t.test('Xid and ECC events are counted per GPU, once each, and logged', async (t) => {
  const { log, lines } = captureLog('warn');
  const { nvml, fake } = rig(t, eightGpuNode(), { log });
  const first = await nvml.queryGpus();
  t.same(first.gpus[0]!.events, { xid: {}, eccSingleBit: 0, eccDoubleBit: 0, lastXid: null }, 'none yet');
  fake.update((s) => ({
    ...s,
    nvml: {
      events: [
        { id: 'a', index: 2, type: 'xid', xid: 79 },
        { id: 'b', index: 2, type: 'xid', xid: 79 },
        { id: 'c', index: 2, type: 'xid', xid: 13 },
        { id: 'd', index: 5, type: 'ecc-double' },
        { id: 'e', index: 5, type: 'ecc-single' },
      ],
    },
  }));
  const gpus = (await nvml.queryGpus()).gpus;
  t.match(gpus[2]!.events, { xid: { 79: 2, 13: 1 }, eccSingleBit: 0, lastXid: { xid: 13 } });
  t.match(gpus[5]!.events, { xid: {}, eccSingleBit: 1, eccDoubleBit: 1, lastXid: null });
  t.match(lines, [{ xid: 79, msg: /GPU 2 .*Xid 79/ }, { xid: 79 }, { xid: 13 }]);
  t.same((await nvml.queryGpus()).gpus[2]!.events!.xid, { 79: 2, 13: 1 }, 'each event counted once');
  fake.update((s) => ({ ...s, unreachable: [{ index: 4, said: 'GPU is lost' }], nvml: { events: [{ id: 'f', index: 4, type: 'xid', xid: 79 }] } }));
  t.notOk((await nvml.queryGpus()).gpus.some((gpu) => gpu.index === 4), 'an event of a GPU no longer listed is not counted against another');
});

t.test('events: a driver that makes no event set, supports none, or says a GPU is lost while waiting counts nothing and fails nothing', async (t) => {
  const refusals: Array<Record<string, { code: number }>> = [
    { nvmlEventSetCreate: { code: 3 } },
    { nvmlDeviceGetSupportedEventTypes: { code: 3 } },
    { nvmlEventSetWait_v2: { code: 15 } },
  ];
  for (const errors of refusals) {
    const { nvml } = rig(t, { ...eightGpuNode(), nvml: { errors, events: [{ id: 'a', index: 0, type: 'xid', xid: 79 }] } });
    t.same((await nvml.queryGpus()).gpus[0]!.events, { xid: {}, eccSingleBit: 0, eccDoubleBit: 0, lastXid: null });
  }
});
