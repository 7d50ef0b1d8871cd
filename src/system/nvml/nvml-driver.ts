// Answers the GPU and process queries from NVML, filling the records nvidia-smi's answers fill;
// how NVML is called (initialisation, deadlines, stuck calls) is nvml-session.ts's. What cannot
// change within one initialisation (handles, UUIDs, names, bus ids) is asked once, and a process's
// name while it stays listed, since each call costs a hop to libuv's pool.
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { NvmlFailedError } from '../../errors.js';
import type { ComputeAppRecord, GpuDriver, GpuListing, GpuRecord, NvidiaSmiVersion } from '../gpu-driver.js';
import type { QueryObservation, UnreachableGpu } from '../gpu-driver.js';
import { canonicalBusId } from '../nvidia-smi-parse.js';
import { cString, NVML, type DeviceHandle, type NvmlLibrary } from './nvml-library.js';
import { createEventCounter } from './nvml-events.js';
import { processLayout, readMigDevices, readMigProcesses, readProcesses, readUtilization } from './nvml-processes.js';
import { TEXT_BUFFER, textOf, type NvmlCall } from './nvml-processes.js';
import { createNvmlSession, Unreachable, type Run } from './nvml-session.js';

export type NvmlDriverOptions = { library: NvmlLibrary; timeoutMs: number; log: Logger; procRoot: string; onQuery?: (o: QueryObservation) => void };

/** sizeof(nvmlPciInfo_t), and where its char busId[32] starts. */
const PCI_INFO_SIZE = 68;
const PCI_BUS_ID_AT = 36;
/** sizeof(nvmlMemory_v2_t), and its version word (nvmlMemory_v2). */
const MEMORY_V2_SIZE = 40;
const MEMORY_V2_VERSION = MEMORY_V2_SIZE | (2 << 24);

const mib = (bytes: bigint): number => Number(bytes / (1024n * 1024n));

/** The driver's own list of GPUs by bus id (its /proc files), which NVML enumerates in the same order; [] where it is not there. */
function driverBusIds(procRoot: string): string[] {
  try {
    return readdirSync(join(procRoot, 'driver/nvidia/gpus')).sort();
  } catch {
    return [];
  }
}

export function createNvmlDriver(options: NvmlDriverOptions): GpuDriver {
  const { library, log, procRoot } = options;
  const layout = processLayout((fn) => library.has(fn));
  /** Each GPU's bus id by index, as last read (in this initialisation or an earlier one): names a GPU whose handle is lost. */
  const busIds = new Map<number, string>();
  /** What NVML gave of each GPU by index within this initialisation (a driver reload may renumber them). */
  const devices = new Map<number, { handle: DeviceHandle; uuid?: string; name?: string; busId?: string }>();
  /** The names of the processes the last process query listed, by PID. */
  let processNames = new Map<number, string>();
  /** Per GPU index, the newest utilization sample read (NVML's microseconds), to ask only for newer ones. */
  const lastSamples = new Map<number, bigint>();
  const events = createEventCounter(log);
  const session = createNvmlSession({
    ...options,
    onInitialised: () => {
      devices.clear();
      events.reset();
    },
  });
  const { call, deviceCall, failed } = session;

  async function count(run: Run): Promise<number> {
    const out = Buffer.alloc(4);
    const code = await call(run, 'count', out);
    if (code !== NVML.SUCCESS) throw failed(library.symbol('count'), code);
    const gpus = out.readUInt32LE(0);
    if (gpus === 0) throw new NvmlFailedError('NVML lists no GPU. Check that the GPUs are visible here (--gpus all, NVIDIA_VISIBLE_DEVICES) and bound to the driver.');
    return gpus;
  }

  /** A GPU's UUID, name or bus id: asked until NVML gives it, then kept. */
  async function text(run: Run, fn: 'uuid' | 'name' | 'busId', index: number, device: DeviceHandle) {
    const known = devices.get(index);
    if (known?.[fn] !== undefined) return known[fn];
    const value = fn === 'busId' ? await busIdOf(run, index, device) : await textOf(callsOf(run), fn, device);
    if (known && value !== null) known[fn] = value;
    return value;
  }

  async function handleOf(run: Run, index: number): Promise<DeviceHandle | { code: number }> {
    const known = devices.get(index);
    if (known) return known.handle;
    const out = Buffer.alloc(8);
    const code = await call(run, 'handleByIndex', index, out);
    if (code !== NVML.SUCCESS) return { code };
    const handle = out.readBigUInt64LE(0);
    devices.set(index, { handle });
    return handle;
  }

  function unreachable(index: number, code: number): UnreachableGpu {
    const busId = busIds.get(index) ?? canonicalBusId(driverBusIds(procRoot)[index] ?? '') ?? `unknown (NVML index ${index})`;
    return { busId, said: library.errorString(code) };
  }

  type Memory = Pick<GpuRecord, 'totalMiB' | 'usedMiB' | 'freeMiB' | 'reservedMiB'>;

  /** A GPU's memory through `calls` (a MIG device's through plain calls). */
  async function memoryOf(calls: NvmlCall, device: DeviceHandle): Promise<Memory> {
    const v2 = Buffer.alloc(MEMORY_V2_SIZE);
    v2.writeUInt32LE(MEMORY_V2_VERSION, 0);
    if ((await calls('memoryV2', device, v2)) === NVML.SUCCESS) {
      const at = (offset: number) => mib(v2.readBigUInt64LE(offset));
      return { totalMiB: at(8), reservedMiB: at(16), freeMiB: at(24), usedMiB: at(32) };
    }
    const v1 = Buffer.alloc(24);
    if ((await calls('memory', device, v1)) !== NVML.SUCCESS) return { totalMiB: null, usedMiB: null, freeMiB: null, reservedMiB: null };
    const at = (offset: number) => mib(v1.readBigUInt64LE(offset));
    return { totalMiB: at(0), freeMiB: at(8), usedMiB: at(16), reservedMiB: null };
  }

  async function migModeOf(run: Run, device: DeviceHandle): Promise<string | null> {
    const current = Buffer.alloc(4);
    if ((await deviceCall(run, 'migMode', device, current, Buffer.alloc(4))) !== NVML.SUCCESS) return null;
    return current.readUInt32LE(0) === 1 ? 'Enabled' : 'Disabled';
  }

  /** nvmlUtilization_t's gpu field; null where the GPU gives none (MIG, some vGPUs). */
  async function utilizationOf(run: Run, device: DeviceHandle): Promise<number | null> {
    const out = Buffer.alloc(8);
    return (await deviceCall(run, 'utilizationRates', device, out)) === NVML.SUCCESS ? out.readUInt32LE(0) : null;
  }

  async function gpuRecord(run: Run, index: number, device: DeviceHandle): Promise<GpuRecord | null> {
    const uuid = await text(run, 'uuid', index, device);
    if (uuid === null) return null;
    const busId = await text(run, 'busId', index, device);
    const name = (await text(run, 'name', index, device)) ?? '';
    const memory = await memoryOf(callsOf(run), device);
    const migMode = await migModeOf(run, device);
    const migDevices = migMode === 'Enabled' ? await readMigDevices(callsOf(run), plainOf(run), device, (mig) => memoryOf(plainOf(run), mig)) : null;
    return { index, uuid, name, ...memory, migMode, busId, utilizationPct: await utilizationOf(run, device), migDevices };
  }

  async function busIdOf(run: Run, index: number, device: DeviceHandle): Promise<string | null> {
    const pci = Buffer.alloc(PCI_INFO_SIZE);
    const busId = (await deviceCall(run, 'pciInfo', device, pci)) === NVML.SUCCESS ? canonicalBusId(cString(pci.subarray(PCI_BUS_ID_AT))) : null;
    if (busId !== null) busIds.set(index, busId);
    return busId;
  }

  /** Each GPU NVML lists: its handle, or the code its handle or a call on it failed with. */
  async function eachGpu<T>(run: Run, read: (index: number, device: DeviceHandle) => Promise<T>) {
    const found: Array<{ index: number; value: T } | { index: number; code: number }> = [];
    for (let index = 0, gpus = await count(run); index < gpus; index += 1) {
      const device = await handleOf(run, index);
      if (typeof device !== 'bigint') {
        found.push({ index, code: device.code });
        continue;
      }
      try {
        found.push({ index, value: await read(index, device) });
      } catch (err) {
        if (!(err instanceof Unreachable)) throw err;
        found.push({ index, code: err.code });
      }
    }
    return found;
  }

  /** `run`'s calls on a GPU, as the readers of processes make them: a lost GPU throws Unreachable. */
  const callsOf = (run: Run): NvmlCall => (fn, ...args) => deviceCall(run, fn, ...args);
  /** `run`'s plain calls, for what may fail without the GPU being lost (MIG devices, utilization, events). */
  const plainOf = (run: Run): NvmlCall => (fn, ...args) => call(run, fn, ...args);

  /** The listed GPU a handle in an event belongs to. */
  function gpuOfHandle(listing: GpuListing, handle: DeviceHandle): { uuid: string; where: string } | null {
    const index = [...devices].find(([, known]) => known.handle === handle)?.[0];
    const gpu = listing.gpus.find((listed) => listed.index === index);
    return gpu === undefined ? null : { uuid: gpu.uuid, where: `GPU ${gpu.index} (${gpu.uuid}, PCI ${gpu.busId})` };
  }

  async function listGpus(run: Run): Promise<GpuListing> {
    const listing: GpuListing = { gpus: [], unreachable: [] };
    for (const gpu of await eachGpu(run, (index, device) => gpuRecord(run, index, device))) {
      if ('code' in gpu) listing.unreachable.push(unreachable(gpu.index, gpu.code));
      else if (gpu.value !== null) listing.gpus.push(gpu.value);
    }
    // Plain calls: an event call that says a GPU is lost must not make the listing fail.
    const plain = plainOf(run);
    const listed = new Set(listing.gpus.map((gpu) => gpu.index));
    for (const [index, known] of devices) if (listed.has(index)) await events.register(plain, known.handle);
    await events.drain(plain, (handle) => gpuOfHandle(listing, handle));
    for (const gpu of listing.gpus) gpu.events = events.of(gpu.uuid);
    return listing;
  }

  /** A listed process's name; `named` collects those NVML gave, to keep for the next query. */
  async function processName(run: Run, pid: number, named: Map<number, string>): Promise<string> {
    let name = named.get(pid) ?? processNames.get(pid);
    if (name === undefined) {
      const out = Buffer.alloc(1024);
      const code = await call(run, 'processName', pid, out, out.length);
      // As nvidia-smi writes them, so both backends name a process alike.
      if (code === NVML.ERROR_NOT_FOUND) return '[Not Found]';
      if (code === NVML.ERROR_NO_PERMISSION) return '[Insufficient Permissions]';
      if (code !== NVML.SUCCESS) return `[${library.errorString(code)}]`;
      name = cString(out);
    }
    named.set(pid, name);
    return name;
  }

  async function listProcesses(run: Run, sampled: boolean): Promise<ComputeAppRecord[]> {
    const named = new Map<number, string>();
    const apps: ComputeAppRecord[] = [];
    const perGpu = await eachGpu(run, async (index, device) => {
      const uuid = await text(run, 'uuid', index, device);
      const onMig = (await migModeOf(run, device)) === 'Enabled' ? await readMigProcesses(callsOf(run), plainOf(run), layout, device) : null;
      const entries = onMig ?? (await readProcesses(callsOf(run), layout, device));
      if (!Array.isArray(entries)) throw failed(library.symbol(layout.fn), entries.code);
      if (!sampled) return { uuid, entries, utilization: undefined };
      // Optional: a refusal reads null, and never drops the processes just read.
      const utilization = await readUtilization(plainOf(run), device, lastSamples.get(index) ?? 0n);
      lastSamples.set(index, utilization.lastSeen);
      return { uuid, entries, utilization: utilization.byPid };
    });
    for (const gpu of perGpu) {
      if ('code' in gpu || gpu.value.uuid === null) continue;
      const { uuid, entries, utilization } = gpu.value;
      for (const { pid, usedBytes, migInstance } of entries) {
        const smUtilPct = utilization === undefined ? undefined : utilization === null ? null : (utilization.get(pid) ?? 0);
        const usedMiB = usedBytes === null ? null : mib(usedBytes);
        apps.push({ gpuUuid: uuid, pid, name: await processName(run, pid, named), usedMiB, smUtilPct, migInstance });
      }
    }
    processNames = named;
    return apps;
  }

  async function versions(run: Run): Promise<NvidiaSmiVersion> {
    const driver = Buffer.alloc(TEXT_BUFFER);
    const code = await call(run, 'driverVersion', driver, TEXT_BUFFER);
    if (code !== NVML.SUCCESS) throw failed(library.symbol('driverVersion'), code);
    const cuda = Buffer.alloc(4);
    const cudaCode = await call(run, 'cudaVersion', cuda);
    const version = cuda.readInt32LE(0);
    // 13010 is CUDA 13.1.
    const cudaVersion = cudaCode === NVML.SUCCESS ? `${Math.floor(version / 1000)}.${(version % 1000) / 10}` : null;
    return { smiVersion: null, driverVersion: cString(driver), cudaVersion };
  }

  return {
    backend: 'nvml',
    source: library.path,
    queryGpus: () => session.query('gpus', listGpus),
    queryComputeApps: ({ utilization = true } = {}) => session.query('compute-apps', (run) => listProcesses(run, utilization)),
    queryVersion: () => session.query('version', versions),
    killAll: () => session.stop(),
    get running() {
      return session.running;
    },
    get stopped() {
      return session.stopped;
    },
  };
}
