// The fake NVML library (test/fixtures/nvml/fake-nvml.c) answers as nvml.h says the real one does,
// called through koffi as the NVML backend calls it, from the same scenario as the fake nvidia-smi:
// the 8x H200 node, the size and stride protocols, init state, the failures and the NVML-only knobs.
// Then scripts/fake-nvml.ts: the build cache, the missing compiler, the call log. Codes are nvml.h's.
import t, { type Test } from 'tap';
import koffi from 'koffi';
import { chmodSync, existsSync, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { installFakeNvidiaSmi, H200_UUIDS } from '../scripts/fake-nvidia-smi.js';
import { buildFakeNvml, fakeNvmlSource, installFakeNvml, nvmlCalls, type FakeNvmlVariant } from '../scripts/fake-nvml.js';
import { eightGpuNode, type FakeScenario } from './helpers/fake-nvidia-smi.js';

const ROOT = dirname(dirname(fileURLToPath(import.meta.url)));

const SUCCESS = 0;
const UNINITIALIZED = 1;
const INVALID_ARGUMENT = 2;
const NOT_SUPPORTED = 3;
const NOT_FOUND = 6;
const INSUFFICIENT_SIZE = 7;
const DRIVER_NOT_LOADED = 9;
const TIMEOUT = 10;
const FUNCTION_NOT_FOUND = 13;
const GPU_IS_LOST = 15;
const LIB_RM_VERSION_MISMATCH = 18;
const ARGUMENT_VERSION_MISMATCH = 25;
const UNKNOWN = 999;

const MIB = 1048576n;
const NOT_AVAILABLE = 0xffffffffffffffffn;
const NO_INSTANCE = 0xffffffff;
/** nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | (2 << 24). */
const MEMORY_V2 = 40 | (2 << 24);
const SENTINEL = 0xab;

koffi.pointer('nvmlDevice_t', koffi.opaque('nvmlDevice_st'));
koffi.pointer('nvmlEventSet_t', koffi.opaque('nvmlEventSet_st'));

/** nvmlEventType bits (nvml.h). */
const EVENT_SINGLE_BIT_ECC = 0x1;
const EVENT_DOUBLE_BIT_ECC = 0x2;
const EVENT_PSTATE = 0x4;
const EVENT_XID = 0x8;
/** sizeof(nvmlProcessUtilizationSample_t) and sizeof(nvmlEventData_t). */
const SAMPLE_SIZE = 32;
const EVENT_DATA_SIZE = 32;

type Fn = ReturnType<ReturnType<typeof koffi.load>['func']>;

/** The library's exports, bound with NVML's signatures; out-buffers are plain Buffers (`void *`). */
function bind(path: string) {
  const lib = koffi.load(path);
  const fn = (declaration: string): Fn => lib.func(declaration);
  return {
    lib,
    init: fn('int nvmlInit_v2()'),
    initV1: fn('int nvmlInit()'),
    shutdown: fn('int nvmlShutdown()'),
    errorString: fn('const char *nvmlErrorString(int)'),
    driverVersion: fn('int nvmlSystemGetDriverVersion(void *version, unsigned int length)'),
    nvmlVersion: fn('int nvmlSystemGetNVMLVersion(void *version, unsigned int length)'),
    cudaVersion: fn('int nvmlSystemGetCudaDriverVersion(_Out_ int *version)'),
    cudaVersionV2: fn('int nvmlSystemGetCudaDriverVersion_v2(_Out_ int *version)'),
    count: fn('int nvmlDeviceGetCount_v2(_Out_ unsigned int *count)'),
    countV1: fn('int nvmlDeviceGetCount(_Out_ unsigned int *count)'),
    handle: fn('int nvmlDeviceGetHandleByIndex_v2(unsigned int index, _Out_ nvmlDevice_t *device)'),
    handleV1: fn('int nvmlDeviceGetHandleByIndex(unsigned int index, _Out_ nvmlDevice_t *device)'),
    index: fn('int nvmlDeviceGetIndex(nvmlDevice_t device, _Out_ unsigned int *index)'),
    uuid: fn('int nvmlDeviceGetUUID(nvmlDevice_t device, void *uuid, unsigned int length)'),
    name: fn('int nvmlDeviceGetName(nvmlDevice_t device, void *name, unsigned int length)'),
    pci: fn('int nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, void *pci)'),
    memory: fn('int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, void *memory)'),
    migMode: fn('int nvmlDeviceGetMigMode(nvmlDevice_t device, _Out_ unsigned int *current, _Out_ unsigned int *pending)'),
    processesV1: fn('int nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, _Inout_ unsigned int *count, void *infos)'),
    processesV2: fn('int nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, _Inout_ unsigned int *count, void *infos)'),
    processName: fn('int nvmlSystemGetProcessName(unsigned int pid, void *name, unsigned int length)'),
    processUtilization: fn(
      'int nvmlDeviceGetProcessUtilization(nvmlDevice_t device, void *utilization, _Inout_ unsigned int *count, unsigned long long lastSeen)',
    ),
    eventSetCreate: fn('int nvmlEventSetCreate(_Out_ nvmlEventSet_t *set)'),
    eventSetFree: fn('int nvmlEventSetFree(nvmlEventSet_t set)'),
    supportedEvents: fn('int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, _Out_ unsigned long long *types)'),
    registerEvents: fn('int nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set)'),
    eventWait: fn('int nvmlEventSetWait_v2(nvmlEventSet_t set, void *data, unsigned int timeoutms)'),
    eventWaitV1: fn('int nvmlEventSetWait(nvmlEventSet_t set, void *data, unsigned int timeoutms)'),
    /** Absent from the `old` variant. */
    memoryV2: () => fn('int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, void *memory)'),
    processesV3: () => fn('int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, _Inout_ unsigned int *count, void *infos)'),
  };
}

type Nvml = ReturnType<typeof bind>;

function setup(t: Test, scenario: FakeScenario, variant: FakeNvmlVariant = 'current') {
  const dir = t.testdir();
  const fake = installFakeNvidiaSmi<FakeScenario>(dir, scenario);
  const nvml = bind(installFakeNvml(dir, variant));
  return { dir, nvml, setScenario: fake.setScenario };
}

const text = (buffer: Buffer) => buffer.subarray(0, buffer.indexOf(0)).toString('utf8');

function handleOf(nvml: Nvml, index: number): unknown {
  const out: unknown[] = [null];
  const rc = nvml.handle(index, out);
  if (rc !== SUCCESS) throw new Error(`nvmlDeviceGetHandleByIndex_v2(${index}) = ${rc}`);
  return out[0];
}

function stringOf(call: Fn, ...args: unknown[]): [number, string] {
  const buffer = Buffer.alloc(96);
  const rc = call(...args, buffer, buffer.length) as number;
  return [rc, text(buffer)];
}

interface ProcessEntry {
  pid: number;
  used: bigint;
  gpuInstanceId?: number;
  computeInstanceId?: number;
  ccProtected?: bigint;
}

function readEntries(buffer: Buffer, count: number, stride: number): ProcessEntry[] {
  return Array.from({ length: count }, (_, i) => {
    const at = i * stride;
    const entry: ProcessEntry = { pid: buffer.readUInt32LE(at), used: buffer.readBigUInt64LE(at + 8) };
    if (stride >= 24) {
      entry.gpuInstanceId = buffer.readUInt32LE(at + 16);
      entry.computeInstanceId = buffer.readUInt32LE(at + 20);
    }
    if (stride >= 32) entry.ccProtected = buffer.readBigUInt64LE(at + 24);
    return entry;
  });
}

/** Lists a device's processes the way NVML callers do: ask the count, then fetch into room for it. */
function processesOf(call: Fn, device: unknown, stride: number): { rc: number; entries: ProcessEntry[] } {
  const count = [0];
  const first = call(device, count, null) as number;
  if (first !== SUCCESS && first !== INSUFFICIENT_SIZE) return { rc: first, entries: [] };
  const buffer = Buffer.alloc(Math.max(1, count[0] as number) * stride, SENTINEL);
  const rc = call(device, count, buffer) as number;
  return { rc, entries: readEntries(buffer, count[0] as number, stride) };
}

function memoryV1(nvml: Nvml, device: unknown): [number, { total: bigint; free: bigint; used: bigint }] {
  const buffer = Buffer.alloc(24);
  const rc = nvml.memory(device, buffer) as number;
  return [rc, { total: buffer.readBigUInt64LE(0), free: buffer.readBigUInt64LE(8), used: buffer.readBigUInt64LE(16) }];
}

function memoryV2(nvml: Nvml, device: unknown, version = MEMORY_V2) {
  const buffer = Buffer.alloc(40);
  buffer.writeUInt32LE(version, 0);
  const rc = nvml.memoryV2()(device, buffer) as number;
  const memory = {
    total: buffer.readBigUInt64LE(8),
    reserved: buffer.readBigUInt64LE(16),
    free: buffer.readBigUInt64LE(24),
    used: buffer.readBigUInt64LE(32),
  };
  return [rc, memory] as const;
}

/** A small node: GPU 0 runs two processes, GPU 1 none. */
function twoGpuNode(): FakeScenario {
  return {
    gpus: [
      { index: 0, uuid: 'GPU-0000', name: 'NVIDIA A100-SXM4-80GB', totalMiB: 81920, usedMiB: 2048, freeMiB: 79360, reservedMiB: 512 },
      { index: 1, uuid: 'GPU-1111', name: 'NVIDIA A100-SXM4-80GB', totalMiB: 81920, usedMiB: 0, freeMiB: 81408 },
    ],
    processes: [
      { gpuUuid: 'GPU-0000', pid: 4242, name: 'python3', usedMiB: 1024 },
      { gpuUuid: 'GPU-0000', pid: 4343, name: 'trainer', usedMiB: '[N/A]' },
    ],
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

t.test('the 8x H200 node, as NVML reports it', async (t) => {
  const node = eightGpuNode();
  const { nvml } = setup(t, node);
  t.equal(nvml.init(), SUCCESS);
  t.same(stringOf(nvml.driverVersion), [SUCCESS, '590.48.01']);
  t.same(stringOf(nvml.nvmlVersion), [SUCCESS, '13.590.48.01']);
  const cuda = [0];
  t.equal(nvml.cudaVersion(cuda), SUCCESS);
  t.equal(cuda[0], 13010);
  t.equal(nvml.cudaVersionV2(cuda), SUCCESS);
  t.equal(cuda[0], 13010);

  const count = [0];
  t.equal(nvml.count(count), SUCCESS);
  t.equal(count[0], 8);
  t.equal(nvml.countV1(count), SUCCESS);
  t.equal(count[0], 8);

  const processesV3 = nvml.processesV3();
  const pidsByGpu: number[][] = [];
  for (let i = 0; i < 8; i += 1) {
    const device = handleOf(nvml, i);
    const index = [-1];
    t.equal(nvml.index(device, index), SUCCESS);
    t.equal(index[0], i);
    t.same(stringOf(nvml.uuid, device), [SUCCESS, H200_UUIDS[i]]);
    t.same(stringOf(nvml.name, device), [SUCCESS, 'NVIDIA H200']);

    const pci = Buffer.alloc(68, SENTINEL);
    t.equal(nvml.pci(device, pci), SUCCESS);
    const busId = node.gpus[i]?.busId as string;
    t.equal(text(pci.subarray(36, 68)), busId, 'busId: the 16-character form');
    t.equal(text(pci.subarray(0, 16)), busId.slice(4), 'busIdLegacy: the short form');
    t.equal(pci.readUInt32LE(16), 0, 'domain');
    t.equal(pci.readUInt32LE(20), parseInt(busId.slice(9, 11), 16), 'bus');
    t.equal(pci.readUInt32LE(24), 0, 'device');

    const gpu = node.gpus[i]!;
    const [rc1, v1] = memoryV1(nvml, device);
    t.equal(rc1, SUCCESS);
    t.same(v1, {
      total: BigInt(gpu.totalMiB) * MIB,
      free: BigInt(gpu.freeMiB) * MIB,
      used: (BigInt(gpu.usedMiB) + 614n) * MIB, // v1's used counts the reserved memory too
    });
    const [rc2, v2] = memoryV2(nvml, device);
    t.equal(rc2, SUCCESS);
    t.same(v2, {
      total: BigInt(gpu.totalMiB) * MIB,
      reserved: 614n * MIB,
      free: BigInt(gpu.freeMiB) * MIB,
      used: BigInt(gpu.usedMiB) * MIB,
    });

    const mig = [9];
    const pending = [9];
    t.equal(nvml.migMode(device, mig, pending), SUCCESS);
    t.same([mig[0], pending[0]], [0, 0]);

    const { rc, entries } = processesOf(processesV3, device, 24);
    t.equal(rc, SUCCESS);
    for (const entry of entries) {
      t.equal(entry.gpuInstanceId, NO_INSTANCE);
      t.equal(entry.computeInstanceId, NO_INSTANCE);
    }
    pidsByGpu.push(entries.map((entry) => entry.pid));
    if (i === 0) t.same(entries, [{ pid: 1328667, used: 130004n * MIB, gpuInstanceId: NO_INSTANCE, computeInstanceId: NO_INSTANCE }]);
    if (i === 6) t.equal(entries[0]?.used, NOT_AVAILABLE, "an '[N/A]' usedMiB is NVML_VALUE_NOT_AVAILABLE");
  }
  t.same(pidsByGpu, [[1328667], [1328668], [1425258], [1328669], [1425258], [1425260], [1425261], [1758887]]);
  t.same(
    pidsByGpu.flatMap((pids, gpu) => (pids.includes(1425258) ? [gpu] : [])),
    [2, 4],
    'pid 1425258 holds GPUs 2 and 4',
  );

  t.same(stringOf(nvml.processName, 1425260), [SUCCESS, '/srv/jobs/eval, run 2/bin/python3']);
  t.same(stringOf(nvml.processName, 1425258), [SUCCESS, 'python3']);
  t.equal(stringOf(nvml.processName, 1758887)[0], NOT_FOUND, "'[Not Found]' is NVML_ERROR_NOT_FOUND");
  t.equal(stringOf(nvml.processName, 77)[0], NOT_FOUND, 'a pid of no process');

  const handle: unknown[] = [null];
  t.equal(nvml.handle(8, handle), INVALID_ARGUMENT, 'no GPU 8');
  t.equal(nvml.handleV1(3, handle), SUCCESS);
  t.same(stringOf(nvml.uuid, handle[0]), [SUCCESS, H200_UUIDS[3]]);
  t.equal(nvml.shutdown(), SUCCESS);
});

t.test('nvmlErrorString has a text for every code, before init too', async (t) => {
  const { nvml } = setup(t, twoGpuNode());
  const codes = [SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE, DRIVER_NOT_LOADED, 10,
    FUNCTION_NOT_FOUND, GPU_IS_LOST, LIB_RM_VERSION_MISMATCH, ARGUMENT_VERSION_MISMATCH, UNKNOWN, 12345];
  const texts = codes.map((code) => nvml.errorString(code) as string);
  for (const text of texts) t.match(text, /\S/);
  t.equal(new Set(texts.slice(0, -1)).size, codes.length - 1, 'each known code has its own text');
  t.equal(texts.at(-1), texts.at(-2), 'an unknown code reads as NVML_ERROR_UNKNOWN');
});

t.test('sizes: INSUFFICIENT_SIZE with the count needed, and string buffers', async (t) => {
  const { nvml } = setup(t, twoGpuNode());
  nvml.init();
  const busy = handleOf(nvml, 0);
  const idle = handleOf(nvml, 1);
  for (const call of [nvml.processesV1, nvml.processesV2, nvml.processesV3()]) {
    const count = [0];
    t.equal(call(busy, count, null), INSUFFICIENT_SIZE);
    t.equal(count[0], 2, 'the count needed');
    const one = [1];
    const buffer = Buffer.alloc(64, SENTINEL);
    t.equal(call(busy, one, buffer), INSUFFICIENT_SIZE);
    t.equal(one[0], 2);
    t.ok(buffer.every((byte) => byte === SENTINEL), 'nothing written');
    const room = [5];
    t.equal(call(busy, room, Buffer.alloc(5 * 32)), SUCCESS);
    t.equal(room[0], 2, 'room for more: the count written');
    const none = [0];
    t.equal(call(idle, none, null), SUCCESS, 'no process: SUCCESS and a count of 0');
    t.equal(none[0], 0);
    t.equal(call(busy, [3], null), INVALID_ARGUMENT, 'room claimed, no buffer');
  }
  const device = handleOf(nvml, 0);
  const uuid = 'GPU-0000';
  const buffer = Buffer.alloc(uuid.length + 1);
  t.equal(nvml.uuid(device, buffer, uuid.length), INSUFFICIENT_SIZE, 'no room for the NUL');
  t.equal(nvml.uuid(device, buffer, uuid.length + 1), SUCCESS);
  t.equal(text(buffer), uuid);
  t.equal(nvml.uuid(device, null, 80), INVALID_ARGUMENT);
  t.equal(nvml.driverVersion(Buffer.alloc(4), 4), INSUFFICIENT_SIZE);
  t.equal(nvml.processName(4242, Buffer.alloc(4), 4), INSUFFICIENT_SIZE);
  t.equal(nvml.processName(4242, null, 0), INVALID_ARGUMENT);
});

t.test('each process-list version writes exactly its stride per entry', async (t) => {
  const cases: Array<[string, (nvml: Nvml) => Fn, number, FakeScenario['nvml']]> = [
    ['v1', (nvml) => nvml.processesV1, 16, undefined],
    ['v2', (nvml) => nvml.processesV2, 24, undefined],
    ['v3', (nvml) => nvml.processesV3(), 24, undefined],
    ['v3, processStruct 24', (nvml) => nvml.processesV3(), 24, { processStruct: 24 }],
    ['v3, the R535 struct', (nvml) => nvml.processesV3(), 32, { processStruct: 32 }],
  ];
  for (const [name, pick, stride, knobs] of cases) {
    await t.test(name, async (t) => {
      const { nvml } = setup(t, { ...twoGpuNode(), ...(knobs ? { nvml: knobs } : {}) });
      nvml.init();
      const buffer = Buffer.alloc(4 * 32, SENTINEL);
      const count = [4];
      t.equal(pick(nvml)(handleOf(nvml, 0), count, buffer), SUCCESS);
      t.equal(count[0], 2);
      const expected: ProcessEntry[] = [
        { pid: 4242, used: 1024n * MIB },
        { pid: 4343, used: NOT_AVAILABLE },
      ].map((entry) => ({
        ...entry,
        ...(stride >= 24 ? { gpuInstanceId: NO_INSTANCE, computeInstanceId: NO_INSTANCE } : {}),
        ...(stride >= 32 ? { ccProtected: 0n } : {}),
      }));
      t.same(readEntries(buffer, 2, stride), expected);
      t.ok(buffer.subarray(0, 2 * stride).some((byte) => byte !== SENTINEL));
      t.ok(buffer.subarray(stride - 4, stride).every((byte) => byte !== SENTINEL), 'the last 4 bytes of an entry are written');
      t.ok(buffer.subarray(2 * stride).every((byte) => byte === SENTINEL), `nothing past 2 x ${stride} bytes`);
    });
  }
});

t.test('the old variant lacks the _v3 process list and nvmlDeviceGetMemoryInfo_v2', async (t) => {
  const { nvml } = setup(t, twoGpuNode(), 'old');
  t.throws(() => nvml.processesV3());
  t.throws(() => nvml.memoryV2());
  t.equal(nvml.init(), SUCCESS);
  const device = handleOf(nvml, 0);
  t.equal(processesOf(nvml.processesV2, device, 24).entries.length, 2);
  t.equal(memoryV1(nvml, device)[0], SUCCESS);
  t.not(buildFakeNvml('old'), buildFakeNvml('current'));
});

t.test('memory and MIG mode: unsupported values and old drivers', async (t) => {
  const scenario = twoGpuNode();
  const { nvml, setScenario } = setup(t, scenario);
  nvml.init();
  const busy = handleOf(nvml, 0);
  const idle = handleOf(nvml, 1);
  t.same(memoryV2(nvml, idle)[1].reserved, 0n, 'no reservedMiB: 0');
  t.equal(memoryV2(nvml, busy, 40)[0], ARGUMENT_VERSION_MISMATCH, 'a version without its number');
  t.equal(memoryV2(nvml, busy, 32 | (2 << 24))[0], ARGUMENT_VERSION_MISMATCH, 'the size of another struct');

  const edit = (fn: (s: FakeScenario) => void) => {
    const next = structuredClone(scenario);
    fn(next);
    setScenario(next);
  };
  edit((s) => { s.gpus[0]!.usedMiB = '[N/A]'; });
  t.equal(memoryV1(nvml, busy)[0], NOT_SUPPORTED);
  t.equal(memoryV2(nvml, busy)[0], NOT_SUPPORTED);
  t.equal(memoryV1(nvml, idle)[0], SUCCESS, 'the other GPU is fine');
  edit((s) => { s.gpus[0]!.reservedMiB = '[N/A]'; });
  t.equal(memoryV2(nvml, busy)[0], NOT_SUPPORTED, 'reserved unknown: v2 cannot answer');
  t.same(memoryV1(nvml, busy), [SUCCESS, { total: 81920n * MIB, free: 79360n * MIB, used: 2048n * MIB }], 'v1 can');
  edit((s) => { s.supportsReserved = false; });
  t.equal(memoryV2(nvml, busy)[0], FUNCTION_NOT_FOUND);
  t.equal(memoryV1(nvml, busy)[0], SUCCESS);

  const mig = (device: unknown) => {
    const current = [9];
    const pending = [9];
    return [nvml.migMode(device, current, pending), current[0], pending[0]];
  };
  edit((s) => { s.gpus[0]!.migMode = 'Enabled'; s.gpus[1]!.migMode = 'Disabled'; });
  t.same(mig(busy), [SUCCESS, 1, 1]);
  t.same(mig(idle), [SUCCESS, 0, 0]);
  edit((s) => { s.gpus[0]!.migMode = '[N/A]'; });
  t.equal(mig(busy)[0], NOT_SUPPORTED);
  edit((s) => { s.supportsMigMode = false; });
  t.equal(mig(idle)[0], FUNCTION_NOT_FOUND);
});

t.test('uninitialized: before init, after the last shutdown, and after a driver reload', async (t) => {
  const scenario = twoGpuNode();
  const { nvml, setScenario } = setup(t, scenario);
  const count = [0];
  t.equal(nvml.count(count), UNINITIALIZED);
  t.equal(nvml.handle(0, [null]), UNINITIALIZED);
  t.equal(stringOf(nvml.driverVersion)[0], UNINITIALIZED);
  t.equal(nvml.shutdown(), UNINITIALIZED, 'nothing to shut down');

  t.equal(nvml.init(), SUCCESS);
  t.equal(nvml.initV1(), SUCCESS);
  const device = handleOf(nvml, 1);
  t.equal(nvml.shutdown(), SUCCESS);
  t.equal(nvml.count(count), SUCCESS, 'still one init');
  t.equal(nvml.shutdown(), SUCCESS);
  t.equal(nvml.count(count), UNINITIALIZED);
  t.equal(nvml.uuid(device, Buffer.alloc(80), 80), UNINITIALIZED, 'an old handle too');

  t.equal(nvml.init(), SUCCESS);
  setScenario({ ...scenario, nvml: { generation: 1 } });
  t.equal(nvml.count(count), UNINITIALIZED, 'the driver was reloaded');
  t.equal(nvml.uuid(device, Buffer.alloc(80), 80), UNINITIALIZED);
  t.equal(nvml.errorString(UNINITIALIZED).length > 0, true);
  t.equal(nvml.init(), SUCCESS);
  t.equal(nvml.count(count), SUCCESS, 'init again sees the new generation');
  t.equal(count[0], 2);
  t.same(stringOf(nvml.uuid, device), [SUCCESS, 'GPU-1111']);
});

t.test('unreachable GPUs: GPU_IS_LOST when the driver said lost, else UNKNOWN', async (t) => {
  const node = eightGpuNode();
  const { nvml, setScenario } = setup(t, node);
  nvml.init();
  const earlier = handleOf(nvml, 5);
  setScenario({ ...node, unreachable: [{ index: 1, said: 'GPU is lost' }, { index: 3 }, { index: 5, said: 'Unknown Error' }] });
  t.equal(nvml.handle(1, [null]), GPU_IS_LOST);
  t.equal(nvml.handleV1(1, [null]), GPU_IS_LOST);
  t.equal(nvml.handle(3, [null]), UNKNOWN);
  t.equal(nvml.handle(0, [null]), SUCCESS);
  t.equal(stringOf(nvml.uuid, earlier)[0], UNKNOWN, 'a handle taken before fails the same way');
  t.equal(memoryV1(nvml, earlier)[0], UNKNOWN);
  const count = [0];
  t.equal(nvml.count(count), SUCCESS);
  t.equal(count[0], 8, 'NVML still counts them');

  setScenario({ ...node, failures: { gpu: { kind: 'gpu-lost' } } });
  t.equal(nvml.handle(0, [null]), GPU_IS_LOST, 'gpu-lost without a bus id: the first GPU');
  t.equal(nvml.handle(1, [null]), SUCCESS);
  setScenario({ ...node, failures: { all: { kind: 'gpu-lost', busId: '0000:2A:00.0' } } });
  t.equal(nvml.handle(1, [null]), GPU_IS_LOST, 'the GPU on bus 2A');
  t.equal(nvml.handle(0, [null]), SUCCESS);
  setScenario({ ...node, failures: { all: { kind: 'gpu-lost', busId: '00000000:BA:00.0' } } });
  t.equal(nvml.handle(6, [null]), GPU_IS_LOST);
});

t.test('driver failures: not loaded, version mismatch, no devices', async (t) => {
  const node = eightGpuNode();
  await t.test('driver-unreachable', async (t) => {
    const { nvml } = setup(t, { ...node, failures: { all: { kind: 'driver-unreachable' } } });
    t.equal(nvml.init(), DRIVER_NOT_LOADED);
    t.equal(nvml.initV1(), DRIVER_NOT_LOADED);
    t.equal(nvml.count([0]), UNINITIALIZED, 'a failed init counts for nothing');
  });
  await t.test('library-mismatch', async (t) => {
    const { nvml } = setup(t, { ...node, failures: { gpu: { kind: 'library-mismatch' } } });
    t.equal(nvml.init(), LIB_RM_VERSION_MISMATCH);
  });
  await t.test('no-devices', async (t) => {
    const { nvml } = setup(t, { ...node, failures: { all: { kind: 'no-devices' } } });
    t.equal(nvml.init(), SUCCESS);
    const count = [9];
    t.equal(nvml.count(count), SUCCESS);
    t.equal(count[0], 0);
    t.equal(nvml.handle(0, [null]), INVALID_ARGUMENT);
  });
  await t.test('kinds about the nvidia-smi process only are ignored', async (t) => {
    const { nvml } = setup(t, { ...node, failures: { all: { kind: 'garbage' }, gpu: { kind: 'driver-unreachable' } } });
    t.equal(nvml.init(), SUCCESS, '`all` is found first');
  });
});

t.test('a missing or unparsable scenario: every call is NVML_ERROR_UNKNOWN; a change is read at the next call', async (t) => {
  const scenario = twoGpuNode();
  const { dir, nvml, setScenario } = setup(t, scenario);
  t.equal(nvml.init(), SUCCESS);
  const device = handleOf(nvml, 0);
  t.same(stringOf(nvml.name, device), [SUCCESS, 'NVIDIA A100-SXM4-80GB']);
  setScenario({ ...scenario, gpus: [{ ...scenario.gpus[0]!, name: 'NVIDIA H100 80GB HBM3', busId: '00000000:9A:00.0' }] });
  t.same(stringOf(nvml.name, device), [SUCCESS, 'NVIDIA H100 80GB HBM3']);
  const count = [0];
  nvml.count(count);
  t.equal(count[0], 1);
  t.equal(nvml.handle(1, [null]), INVALID_ARGUMENT, 'GPU 1 is gone');
  const pci = Buffer.alloc(68);
  nvml.pci(device, pci);
  t.equal(pci.readUInt32LE(20), 0x9a);

  rmSync(join(dir, 'scenario.json'));
  t.equal(nvml.count(count), UNKNOWN);
  t.equal(nvml.init(), UNKNOWN);
  t.equal(nvml.shutdown(), UNKNOWN);
  t.match(nvml.errorString(UNKNOWN), /\S/, 'nvmlErrorString still answers');
  writeFileSync(join(dir, 'scenario.json'), '{"gpus": [');
  t.equal(nvml.count(count), UNKNOWN);
  writeFileSync(join(dir, 'scenario.json'), '{"gpus": [], "processes": []} trailing');
  t.equal(nvml.count(count), UNKNOWN);
  setScenario(scenario);
  t.equal(nvml.count(count), SUCCESS, 'still initialized');
  t.equal(count[0], 2);
});

t.test('the scenario parser reads escapes, unicode and every JSON value', async (t) => {
  const dir = t.testdir();
  const nvml = bind(installFakeNvml(dir));
  writeFileSync(
    join(dir, 'scenario.json'),
    '{ "gpus": [ { "index": 0, "uuid": "GPU-\\u0041\\"\\\\\\/\\b\\f\\n\\r\\t", "name": "caf\\u00e9 \\u20ac \\ud83d\\ude80",' +
      ' "totalMiB": 1.5e3, "usedMiB": -0, "freeMiB": 1500, "serial": null, "extra": { "x": [true, false, null, [], {}] } } ],' +
      ' "processes": [], "nvml": { "logCalls": false } }\n',
  );
  t.equal(nvml.init(), SUCCESS);
  const device = handleOf(nvml, 0);
  t.same(stringOf(nvml.uuid, device), [SUCCESS, 'GPU-A"\\/\b\f\n\r\t']);
  t.same(stringOf(nvml.name, device), [SUCCESS, 'café € 🚀']);
  t.same(memoryV1(nvml, device), [SUCCESS, { total: 1500n * MIB, free: 1500n * MIB, used: 0n }]);
  for (const bad of ['{"a": tru}', '{"a": "\\q"}', '{"a": "\\u12"}', '{"a" 1}', '{1: 2}', '[1 2]', '{"a": "\u0001"}', '-', '{"a": 1e999}', '']) {
    writeFileSync(join(dir, 'scenario.json'), bad);
    t.equal(nvml.count([0]), UNKNOWN, `rejects ${JSON.stringify(bad)}`);
  }
});

t.test('the errors and delay knobs', async (t) => {
  const node = eightGpuNode();
  const { nvml, setScenario } = setup(t, {
    ...node,
    nvml: {
      errors: { nvmlDeviceGetUUID: { code: GPU_IS_LOST, index: 2 }, nvmlSystemGetDriverVersion: { code: UNKNOWN }, nvmlInit_v2: { code: 12 } },
    },
  });
  t.equal(nvml.init(), 12);
  t.equal(nvml.initV1(), SUCCESS);
  t.equal(stringOf(nvml.uuid, handleOf(nvml, 2))[0], GPU_IS_LOST);
  t.same(stringOf(nvml.uuid, handleOf(nvml, 1)), [SUCCESS, H200_UUIDS[1]]);
  t.equal(stringOf(nvml.driverVersion)[0], UNKNOWN);

  setScenario({ ...node, delayMs: 150, nvml: { delayMs: { nvmlDeviceGetName: 150 } } });
  let started = Date.now();
  t.equal(stringOf(nvml.name, handleOf(nvml, 0))[0], SUCCESS);
  t.ok(Date.now() - started >= 145, 'nvml.delayMs: that function waits');
  started = Date.now();
  t.equal(nvml.count([0]), SUCCESS);
  t.ok(Date.now() - started >= 145, 'a numeric delayMs: nvmlDeviceGetCount_v2 waits');
});

t.test('a hung call returns once the scenario lets it go, and holds no lock meanwhile', async (t) => {
  const node = eightGpuNode();
  const cases: Array<[string, FakeScenario]> = [
    ['nvml.hang', { ...node, nvml: { hang: ['nvmlDeviceGetCount_v2'] } }],
    ['a hang failure', { ...node, failures: { all: { kind: 'hang' } } }],
  ];
  for (const [name, hung] of cases) await t.test(name, async (t) => {
    const { nvml, setScenario } = setup(t, node);
    t.equal(nvml.init(), SUCCESS);
    setScenario(hung);
    const count = [0];
    let settled: number | null = null;
    const done = new Promise<void>((resolve, reject) => {
      nvml.count.async(count, (error: unknown, rc: number) => {
        if (error) reject(error as Error);
        settled = rc;
        resolve();
      });
    });
    await sleep(200);
    t.equal(settled, null, 'still hung');
    t.same(stringOf(nvml.uuid, handleOf(nvml, 7)), [SUCCESS, H200_UUIDS[7]], 'other calls go on');
    setScenario(node);
    await done;
    t.equal(settled, SUCCESS);
    t.equal(count[0], 8);
  });
});

t.test('logCalls: one line per call, with the device index and the caller pid', async (t) => {
  const node = eightGpuNode();
  const { dir, nvml } = setup(t, { ...node, nvml: { logCalls: true } });
  t.same(nvmlCalls(dir), []);
  nvml.init();
  nvml.count([0]);
  const device = handleOf(nvml, 3);
  stringOf(nvml.uuid, device);
  stringOf(nvml.processName, 1425258);
  t.same(nvmlCalls(dir), [
    { fn: 'nvmlInit_v2', index: null, pid: process.pid },
    { fn: 'nvmlDeviceGetCount_v2', index: null, pid: process.pid },
    { fn: 'nvmlDeviceGetHandleByIndex_v2', index: 3, pid: process.pid },
    { fn: 'nvmlDeviceGetUUID', index: 3, pid: process.pid },
    { fn: 'nvmlSystemGetProcessName', index: null, pid: process.pid },
  ]);
});

t.test('copies in two directories answer each from its own scenario', async (t) => {
  const first = setup(t, { ...twoGpuNode(), driverVersion: '535.54.03' });
  const dir = join(t.testdirName, 'second');
  mkdirSync(dir, { recursive: true });
  installFakeNvidiaSmi<FakeScenario>(dir, { ...eightGpuNode(), driverVersion: '570.86.15' });
  const second = bind(installFakeNvml(dir));
  t.equal(first.nvml.init(), SUCCESS);
  t.equal(second.init(), SUCCESS);
  t.same(stringOf(first.nvml.driverVersion), [SUCCESS, '535.54.03']);
  t.same(stringOf(second.driverVersion), [SUCCESS, '570.86.15']);
  t.equal(first.nvml.shutdown(), SUCCESS);
  t.equal(first.nvml.count([0]), UNINITIALIZED, 'init state is per copy');
  t.equal(second.count([0]), SUCCESS);
});

interface UtilizationSample {
  pid: number;
  timeStamp: bigint;
  smUtil: number;
  memUtil: number;
  encUtil: number;
  decUtil: number;
}

/** nvmlProcessUtilizationSample_t: pid at 0, timeStamp at 8 (after 4 bytes of padding), then four unsigned ints. */
function readSamples(buffer: Buffer, count: number): UtilizationSample[] {
  return Array.from({ length: count }, (_, i) => {
    const at = i * SAMPLE_SIZE;
    return {
      pid: buffer.readUInt32LE(at),
      timeStamp: buffer.readBigUInt64LE(at + 8),
      smUtil: buffer.readUInt32LE(at + 16),
      memUtil: buffer.readUInt32LE(at + 20),
      encUtil: buffer.readUInt32LE(at + 24),
      decUtil: buffer.readUInt32LE(at + 28),
    };
  });
}

/** The two-GPU node with utilization samples for both processes of GPU 0. */
function sampledNode(): FakeScenario {
  const node = twoGpuNode();
  node.processes[0]!.smUtilPct = 73;
  node.processes[0]!.memUtilPct = 12;
  node.processes[1]!.smUtilPct = 5;
  return node;
}

const nowUs = () => BigInt(Date.now()) * 1000n;

t.test('per-process utilization: a sample per process with smUtilPct, sized like the process lists', async (t) => {
  const scenario = sampledNode();
  const { nvml, setScenario } = setup(t, scenario);
  const util = nvml.processUtilization;
  t.equal(util(null, null, [0], 0n), UNINITIALIZED, 'before init');
  nvml.init();
  const busy = handleOf(nvml, 0);
  const idle = handleOf(nvml, 1);

  const count = [0];
  t.equal(util(busy, null, count, 0n), INSUFFICIENT_SIZE, 'no buffer: the count needed');
  t.equal(count[0], 2);
  const small = Buffer.alloc(4 * SAMPLE_SIZE, SENTINEL);
  const one = [1];
  t.equal(util(busy, small, one, 0n), INSUFFICIENT_SIZE, 'room for one');
  t.equal(one[0], 2);
  t.ok(small.every((byte) => byte === SENTINEL), 'nothing written');

  const buffer = Buffer.alloc(4 * SAMPLE_SIZE, SENTINEL);
  const room = [4];
  const before = nowUs();
  t.equal(util(busy, buffer, room, 0n), SUCCESS);
  const after = nowUs() + 1000n;
  t.equal(room[0], 2, 'the count written');
  const samples = readSamples(buffer, 2);
  t.same(
    samples.map(({ timeStamp: _, ...rest }) => rest),
    [
      { pid: 4242, smUtil: 73, memUtil: 12, encUtil: 0, decUtil: 0 },
      { pid: 4343, smUtil: 5, memUtil: 0, encUtil: 0, decUtil: 0 },
    ],
  );
  for (const sample of samples) {
    t.ok(sample.timeStamp >= before && sample.timeStamp <= after, 'timeStamp: CLOCK_REALTIME now, in microseconds');
  }
  t.equal(buffer.readUInt32LE(4), 0, 'the padding after pid is zeroed');
  t.ok(buffer.subarray(2 * SAMPLE_SIZE).every((byte) => byte === SENTINEL), 'nothing past 2 x 32 bytes');

  const stamp = samples[0]!.timeStamp;
  t.equal(util(busy, Buffer.alloc(4 * SAMPLE_SIZE), [4], stamp), SUCCESS, 'a later call samples anew, after lastSeenTimeStamp');
  const future = [4];
  t.equal(util(busy, Buffer.alloc(4 * SAMPLE_SIZE), future, nowUs() + 60_000_000n), NOT_FOUND, 'nothing newer than lastSeenTimeStamp');
  t.equal(future[0], 0);
  const none = [4];
  t.equal(util(idle, null, none, 0n), NOT_FOUND, 'a GPU with no process sampled');
  t.equal(none[0], 0);
  t.equal(util(busy, null, null, 0n), INVALID_ARGUMENT, 'no count');

  const edit = (fn: (s: FakeScenario) => void) => {
    const next = structuredClone(scenario);
    fn(next);
    setScenario(next);
  };
  edit((s) => {
    delete s.processes[1]!.smUtilPct;
    s.processes[0]!.smUtilPct = -3;
    s.processes.push({ gpuUuid: 'GPU-1111', pid: 5151, name: 'idle', usedMiB: 10 });
  });
  const left = [4];
  const rest = Buffer.alloc(4 * SAMPLE_SIZE);
  t.equal(util(busy, rest, left, 0n), SUCCESS);
  t.equal(left[0], 1, 'a process without smUtilPct gives no sample');
  t.same(readSamples(rest, 1).map((sample) => [sample.pid, sample.smUtil]), [[4242, 0]], 'a negative percentage reads 0');
  t.equal(util(idle, null, [0], 0n), NOT_FOUND, 'nor does a process of GPU 1 without one');

  edit((s) => { s.gpus[0]!.migMode = 'Enabled'; });
  t.equal(util(busy, null, [0], 0n), NOT_SUPPORTED, 'no per-process utilization under MIG');
  edit((s) => { s.gpus[0]!.migMode = 'Disabled'; });
  t.equal(util(busy, null, [0], 0n), INSUFFICIENT_SIZE, 'MIG disabled: sampled again');
});

t.test('per-process utilization: the unreachable, errors, delay, hang and logCalls knobs', async (t) => {
  const scenario = sampledNode();
  const { dir, nvml, setScenario } = setup(t, scenario);
  nvml.init();
  const busy = handleOf(nvml, 0);
  const util = (count = [0]) => nvml.processUtilization(busy, null, count, 0n) as number;
  setScenario({ ...scenario, unreachable: [{ index: 0, said: 'GPU is lost' }] });
  t.equal(util(), GPU_IS_LOST);
  setScenario({ ...scenario, unreachable: [{ index: 0 }] });
  t.equal(util(), UNKNOWN);
  setScenario({ ...scenario, nvml: { errors: { nvmlDeviceGetProcessUtilization: { code: NOT_SUPPORTED, index: 0 } } } });
  t.equal(util(), NOT_SUPPORTED);
  setScenario({ ...scenario, nvml: { delayMs: { nvmlDeviceGetProcessUtilization: 120 }, logCalls: true } });
  const started = Date.now();
  t.equal(util(), INSUFFICIENT_SIZE);
  t.ok(Date.now() - started >= 115, 'delayed');
  t.same(nvmlCalls(dir), [{ fn: 'nvmlDeviceGetProcessUtilization', index: 0, pid: process.pid }]);

  setScenario({ ...scenario, nvml: { hang: ['nvmlDeviceGetProcessUtilization'] } });
  let settled: number | null = null;
  const count = [0];
  const done = new Promise<void>((resolve, reject) => {
    nvml.processUtilization.async(busy, null, count, 0n, (error: unknown, rc: number) => {
      if (error) reject(error as Error);
      settled = rc;
      resolve();
    });
  });
  await sleep(150);
  t.equal(settled, null, 'hung');
  setScenario(scenario);
  await done;
  t.equal(settled, INSUFFICIENT_SIZE);
  t.equal(count[0], 2);
});

interface EventData {
  device: bigint;
  eventType: bigint;
  eventData: bigint;
  gpuInstanceId: number;
  computeInstanceId: number;
}

/** nvmlEventData_t: device (a pointer) at 0, eventType at 8, eventData at 16, the instance ids at 24 and 28. */
function readEvent(buffer: Buffer): EventData {
  return {
    device: buffer.readBigUInt64LE(0),
    eventType: buffer.readBigUInt64LE(8),
    eventData: buffer.readBigUInt64LE(16),
    gpuInstanceId: buffer.readUInt32LE(24),
    computeInstanceId: buffer.readUInt32LE(28),
  };
}

function createSet(nvml: Nvml): unknown {
  const out: unknown[] = [null];
  const rc = nvml.eventSetCreate(out);
  if (rc !== SUCCESS) throw new Error(`nvmlEventSetCreate = ${rc}`);
  return out[0];
}

/** One nvmlEventSetWait_v2 (or the call given): its code and, on SUCCESS, the event. */
function waitOnce(nvml: Nvml, set: unknown, timeoutMs = 0, call: Fn = nvml.eventWait): [number, EventData | null] {
  const buffer = Buffer.alloc(EVENT_DATA_SIZE + 8, SENTINEL);
  const rc = call(set, buffer, timeoutMs) as number;
  if (rc === SUCCESS) {
    if (!buffer.subarray(EVENT_DATA_SIZE).every((byte) => byte === SENTINEL)) throw new Error('written past 32 bytes');
    return [rc, readEvent(buffer)];
  }
  if (!buffer.every((byte) => byte === SENTINEL)) throw new Error(`written on ${rc}`);
  return [rc, null];
}

function waitAsync(nvml: Nvml, set: unknown, timeoutMs: number): { done: Promise<[number, EventData]>; settled: () => boolean } {
  let finished = false;
  const buffer = Buffer.alloc(EVENT_DATA_SIZE);
  const done = new Promise<[number, EventData]>((resolve, reject) => {
    nvml.eventWait.async(set, buffer, timeoutMs, (error: unknown, rc: number) => {
      finished = true;
      if (error) reject(error as Error);
      else resolve([rc, readEvent(buffer)]);
    });
  });
  return { done, settled: () => finished };
}

const addressOf = (handle: unknown) => BigInt(koffi.address(handle));

const xidEvent = (device: unknown, xid: number): EventData => ({
  device: addressOf(device),
  eventType: BigInt(EVENT_XID),
  eventData: BigInt(xid),
  gpuInstanceId: NO_INSTANCE,
  computeInstanceId: NO_INSTANCE,
});

t.test('events: each scenario event once per set registered for its GPU and type, in order', async (t) => {
  const node = eightGpuNode();
  const scenario: FakeScenario = {
    ...node,
    nvml: {
      events: [
        { index: 2, xid: 79, id: 'a' },
        { index: 3, type: 'ecc-double', id: 'b' },
        { index: 2, type: 'ecc-single', id: 'c' },
        { index: 9, xid: 48, id: 'no GPU 9' },
        { index: 2, type: 'parity' as 'xid', id: 'an unknown type' },
        { index: 2, type: 'xid', id: 'd' },
        { index: 3, xid: 31, id: 'e' },
      ],
    },
  };
  const { nvml, setScenario } = setup(t, scenario);
  t.equal(nvml.eventSetCreate([null]), UNINITIALIZED, 'before init');
  nvml.init();
  const gpu2 = handleOf(nvml, 2);
  const gpu3 = handleOf(nvml, 3);

  const types = [0];
  t.equal(nvml.supportedEvents(gpu2, types), SUCCESS);
  t.equal(types[0], EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC, 'Xid and both ECC kinds');
  t.equal(nvml.supportedEvents(gpu2, null), INVALID_ARGUMENT);

  const set = createSet(nvml);
  t.same(waitOnce(nvml, set), [TIMEOUT, null], 'nothing registered: nothing delivered');
  t.equal(nvml.registerEvents(gpu2, EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC, set), SUCCESS);
  t.equal(nvml.registerEvents(gpu3, EVENT_XID, set), SUCCESS);
  t.same(waitOnce(nvml, set), [SUCCESS, xidEvent(gpu2, 79)]);
  t.same(waitOnce(nvml, set), [SUCCESS, { ...xidEvent(gpu2, 0), eventType: BigInt(EVENT_SINGLE_BIT_ECC) }], 'ECC: eventData 0');
  t.same(waitOnce(nvml, set), [SUCCESS, xidEvent(gpu2, 999)], 'an Xid event without its number: 999, "unknown Xid"');
  t.same(waitOnce(nvml, set, 0, nvml.eventWaitV1), [SUCCESS, xidEvent(gpu3, 31)], 'nvmlEventSetWait answers the same');
  let started = Date.now();
  t.same(waitOnce(nvml, set), [TIMEOUT, null], 'all delivered; GPU 3 is not registered for double-bit ECC');
  t.ok(Date.now() - started < 1000, 'timeout 0: at once');
  started = Date.now();
  t.same(waitOnce(nvml, set, 150), [TIMEOUT, null]);
  t.ok(Date.now() - started >= 145, 'waited out the timeout');

  const other = createSet(nvml);
  t.not(addressOf(other), addressOf(set));
  t.equal(nvml.registerEvents(gpu3, EVENT_DOUBLE_BIT_ECC, other), SUCCESS);
  t.same(waitOnce(nvml, other), [SUCCESS, { ...xidEvent(gpu3, 0), eventType: BigInt(EVENT_DOUBLE_BIT_ECC) }], 'another set gets it');
  t.equal(nvml.registerEvents(gpu3, EVENT_XID, other), SUCCESS, 'registering adds types');
  t.same(waitOnce(nvml, other), [SUCCESS, xidEvent(gpu3, 31)]);
  t.same(waitOnce(nvml, other), [TIMEOUT, null]);

  await t.test('an event added later ends a wait in progress', async (t) => {
    const waiting = waitAsync(nvml, set, 5000);
    await sleep(120);
    t.equal(waiting.settled(), false, 'still waiting');
    setScenario({ ...scenario, nvml: { events: [...scenario.nvml!.events!, { index: 2, xid: 13, id: 'later' }] } });
    started = Date.now();
    t.same(await waiting.done, [SUCCESS, xidEvent(gpu2, 13)]);
    t.ok(Date.now() - started < 1000, 'within a poll or two');
    t.same(waitOnce(nvml, other), [TIMEOUT, null], 'GPU 2 is not in the other set');
  });

  t.equal(nvml.eventSetFree(other), SUCCESS);
  t.equal(nvml.eventSetFree(other), INVALID_ARGUMENT, 'freed already');
  t.equal(waitOnce(nvml, other)[0], INVALID_ARGUMENT);
  t.equal(nvml.registerEvents(gpu2, EVENT_XID, other), INVALID_ARGUMENT);
  const again = createSet(nvml);
  t.equal(nvml.registerEvents(gpu3, EVENT_DOUBLE_BIT_ECC, again), SUCCESS);
  t.equal(waitOnce(nvml, again)[1]?.eventType, BigInt(EVENT_DOUBLE_BIT_ECC), 'a new set starts with nothing delivered');
});

t.test('events: arguments, many sets, lost GPUs, driver reloads and the knobs', async (t) => {
  const node = eightGpuNode();
  const scenario: FakeScenario = { ...node, nvml: { events: [{ index: 1, xid: 94, id: 'x' }] } };
  const { dir, nvml, setScenario } = setup(t, scenario);
  nvml.init();
  const gpu1 = handleOf(nvml, 1);
  const set = createSet(nvml);

  t.equal(nvml.eventSetCreate(null), INVALID_ARGUMENT);
  t.equal(nvml.registerEvents(gpu1, EVENT_PSTATE, set), NOT_SUPPORTED, 'a type this fake does not support');
  t.equal(nvml.registerEvents(gpu1, EVENT_XID | EVENT_PSTATE, set), NOT_SUPPORTED);
  t.same(waitOnce(nvml, set), [TIMEOUT, null], 'NOT_SUPPORTED registered none of them');
  t.equal(nvml.registerEvents(gpu1, 2 ** 40, set), INVALID_ARGUMENT, 'a bit no nvmlEventType has');
  t.equal(nvml.registerEvents(gpu1, EVENT_XID, null), INVALID_ARGUMENT);
  t.equal(nvml.registerEvents(gpu1, EVENT_XID, gpu1), INVALID_ARGUMENT, 'a device handle is no set');
  t.equal(nvml.eventWait(set, null, 0), INVALID_ARGUMENT);
  t.equal(nvml.eventSetFree(null), INVALID_ARGUMENT);

  const sets = Array.from({ length: 63 }, () => createSet(nvml));
  t.equal(new Set([set, ...sets].map(addressOf)).size, 64, '64 sets at once');
  t.equal(nvml.eventSetCreate([null]), UNKNOWN, 'a 65th: none left');
  for (const each of sets) t.equal(nvml.eventSetFree(each), SUCCESS);

  t.equal(nvml.registerEvents(gpu1, EVENT_XID, set), SUCCESS);
  setScenario({ ...scenario, unreachable: [{ index: 1, said: 'GPU is lost' }] });
  t.equal(nvml.registerEvents(gpu1, EVENT_XID, set), GPU_IS_LOST, 'a device call on a lost GPU');
  t.same(waitOnce(nvml, set), [SUCCESS, xidEvent(gpu1, 94)], 'events of a lost GPU are still delivered');
  t.same(waitOnce(nvml, set, 60), [TIMEOUT, null], 'a lost GPU does not end the wait');
  setScenario({ ...scenario, nvml: { ...scenario.nvml, errors: { nvmlEventSetWait_v2: { code: GPU_IS_LOST } } } });
  t.same(waitOnce(nvml, set), [GPU_IS_LOST, null], 'the errors knob does');
  setScenario(scenario);

  await t.test('the last shutdown during a wait', async (t) => {
    const waiting = waitAsync(nvml, set, 5000);
    await sleep(40);
    t.equal(nvml.shutdown(), SUCCESS);
    t.equal((await waiting.done)[0], UNINITIALIZED);
    t.equal(nvml.init(), SUCCESS);
  });
  await t.test('a driver reload during a wait', async (t) => {
    setScenario(scenario);
    const waiting = waitAsync(nvml, set, 5000);
    await sleep(60);
    setScenario({ ...scenario, nvml: { ...scenario.nvml, generation: 2 } });
    t.equal((await waiting.done)[0], UNINITIALIZED);
    t.equal(nvml.init(), SUCCESS);
  });
  await t.test('the set freed during a wait', async (t) => {
    const doomed = createSet(nvml);
    const waiting = waitAsync(nvml, doomed, 5000);
    await sleep(60);
    t.equal(nvml.eventSetFree(doomed), SUCCESS, 'the lock is free while waiting');
    t.equal((await waiting.done)[0], INVALID_ARGUMENT);
  });
  await t.test('a missing scenario during a wait reads as no event', async (t) => {
    const waiting = waitAsync(nvml, set, 150);
    await sleep(40);
    rmSync(join(dir, 'scenario.json'));
    t.equal((await waiting.done)[0], TIMEOUT);
    setScenario({ ...scenario, nvml: { ...scenario.nvml, generation: 2 } });
  });

  setScenario({
    ...scenario,
    nvml: {
      ...scenario.nvml,
      generation: 2,
      logCalls: true,
      errors: { nvmlEventSetWait_v2: { code: UNKNOWN }, nvmlDeviceRegisterEvents: { code: NOT_SUPPORTED, index: 1 } },
      delayMs: { nvmlEventSetCreate: 120 },
    },
  });
  t.equal(waitOnce(nvml, set)[0], UNKNOWN, 'errors: the wait');
  t.equal(nvml.registerEvents(gpu1, EVENT_XID, set), NOT_SUPPORTED, 'errors: registering on GPU 1');
  t.equal(nvml.registerEvents(handleOf(nvml, 0), EVENT_XID, set), SUCCESS);
  const started = Date.now();
  const last = createSet(nvml);
  t.ok(Date.now() - started >= 115, 'delayMs');
  t.equal(nvml.eventSetFree(last), SUCCESS);
  t.equal(waitOnce(nvml, set, 0, nvml.eventWaitV1)[0], TIMEOUT);
  t.same(
    nvmlCalls(dir).map(({ fn, index }) => [fn, index]),
    [
      ['nvmlEventSetWait_v2', null],
      ['nvmlDeviceRegisterEvents', 1],
      ['nvmlDeviceGetHandleByIndex_v2', 0],
      ['nvmlDeviceRegisterEvents', 0],
      ['nvmlEventSetCreate', null],
      ['nvmlEventSetFree', null],
      ['nvmlEventSetWait', null],
    ],
  );
});

t.test('events: a hung wait, and sets belong to their library copy', async (t) => {
  const node = eightGpuNode();
  const scenario: FakeScenario = { ...node, nvml: { events: [{ index: 0, xid: 43, id: 'y' }] } };
  const first = setup(t, scenario);
  const dir = join(t.testdirName, 'second');
  mkdirSync(dir, { recursive: true });
  installFakeNvidiaSmi<FakeScenario>(dir, scenario);
  const second = bind(installFakeNvml(dir));
  first.nvml.init();
  second.init();
  const set = createSet(first.nvml);
  t.equal(second.eventSetFree(set), INVALID_ARGUMENT, "another copy's set");
  t.equal(second.eventWait(set, Buffer.alloc(EVENT_DATA_SIZE), 0), INVALID_ARGUMENT);
  const gpu0 = handleOf(first.nvml, 0);
  t.equal(first.nvml.registerEvents(gpu0, EVENT_XID, set), SUCCESS);

  first.setScenario({ ...scenario, nvml: { ...scenario.nvml, hang: ['nvmlEventSetWait_v2'] } });
  const waiting = waitAsync(first.nvml, set, 0);
  await sleep(150);
  t.equal(waiting.settled(), false, 'hung though the timeout is 0');
  first.setScenario(scenario);
  t.same(await waiting.done, [SUCCESS, xidEvent(gpu0, 43)]);
});

t.test('buildFakeNvml compiles once per source and variant, into the cache', async (t) => {
  const cacheDir = t.testdir();
  const built = buildFakeNvml('current', { cacheDir });
  t.equal(dirname(dirname(built)), cacheDir);
  t.match(built, /\/[0-9a-f]{16}\/libnvidia-ml\.so\.1$/);
  const mtime = statSync(built).mtimeMs;
  t.equal(buildFakeNvml('current', { cacheDir }), built, 'the same path');
  t.equal(statSync(built).mtimeMs, mtime, 'not rebuilt');
  const old = buildFakeNvml('old', { cacheDir });
  t.not(old, built);
  t.ok(existsSync(old));
  t.equal(dirname(dirname(buildFakeNvml())), join(tmpdir(), 'nodecompute-fake-nvml'), 'by default, in the system temp folder');
});

t.test('buildFakeNvml names cc and what to install when there is no compiler, and shows what cc said', async (t) => {
  const dir = t.testdir({ empty: {}, failing: { cc: '#!/bin/sh\necho "fake-nvml.c:1:1: error: no compiler here" >&2\nexit 1\n' } });
  t.throws(() => buildFakeNvml('current', { cacheDir: join(dir, 'cache'), env: { PATH: join(dir, 'empty') } }), {
    message: /`cc`.*apt-get install gcc.*build-essential/,
  });
  chmodSync(join(dir, 'failing', 'cc'), 0o755);
  t.throws(() => buildFakeNvml('old', { cacheDir: join(dir, 'cache'), env: { PATH: join(dir, 'failing') } }), {
    message: /`cc` could not build.*\nfake-nvml\.c:1:1: error: no compiler here$/s,
  });
});

t.test('fakeNvmlSource finds the source from scripts/ and dist/scripts/, and says where it looked', async (t) => {
  const source = join(ROOT, 'test', 'fixtures', 'nvml', 'fake-nvml.c');
  t.equal(fakeNvmlSource(), source);
  t.equal(fakeNvmlSource(pathToFileURL(join(ROOT, 'dist', 'scripts', 'fake-nvml.js')).href), source);
  const elsewhere = join(t.testdir(), 'a', 'b', 'fake-nvml.js');
  t.throws(() => fakeNvmlSource(pathToFileURL(elsewhere).href), { message: /test\/fixtures\/nvml\/fake-nvml\.c.*not beside/ });
});
