// Reads one GPU's compute processes from NVML, its MIG devices and their processes, and its
// processes' SM utilization. The entry size of nvmlDeviceGetComputeRunningProcesses_v3 is probed,
// never assumed: some R535 drivers write 32-byte entries where others write 24 under the same name
// (nvitop #79, #88); the probe fills the buffer with two sentinels and sees how far one call wrote
// (as nvitop #226 does). _v2 entries are 24 bytes, the unversioned ones 16. MIG devices are asked at
// every query and never kept: they are made and destroyed while the driver stays loaded.
import type { MemoryMiB, MigDeviceRecord, MigInstance } from '../gpu-driver.js';
import { cString, NVML, type DeviceHandle, type NvmlFunction } from './nvml-library.js';

/** usedGpuMemory: bytes, null where NVML says NVML_VALUE_NOT_AVAILABLE; migInstance: the MIG instance it runs on, null off MIG (and in 16-byte entries). */
export type ProcessEntry = { pid: number; usedBytes: bigint | null; migInstance: MigInstance | null };

export type NvmlCall = (fn: NvmlFunction, ...args: unknown[]) => Promise<number>;

/** What the process calls of this library are: the function and, once known, its entry size. */
export type ProcessLayout = { fn: NvmlFunction; stride: number | null };

const NOT_AVAILABLE = 0xffff_ffff_ffff_ffffn;
/** An instance id off MIG (0xFFFFFFFF: NVML's "no instance"). */
const NO_INSTANCE = 0xffff_ffff;
const WIDEST_ENTRY = 32;
/** Processes may start between the count and the read: room for a few more, and a few tries. */
const HEADROOM = 4;
const TRIES = 3;
const SENTINELS = [0x5a, 0xa5] as const;

export function processLayout(has: (fn: NvmlFunction) => boolean): ProcessLayout {
  if (has('processes')) return { fn: 'processes', stride: null };
  if (has('processesV2')) return { fn: 'processesV2', stride: 24 };
  return { fn: 'processesV1', stride: 16 };
}

/** How many entries the device has now; the code when the call fails otherwise. */
async function countEntries(call: NvmlCall, layout: ProcessLayout, device: DeviceHandle): Promise<number | { code: number }> {
  const count = Buffer.alloc(4);
  const code = await call(layout.fn, device, count, null);
  if (code === NVML.SUCCESS) return 0;
  return code === NVML.ERROR_INSUFFICIENT_SIZE ? count.readUInt32LE(0) : { code };
}

/** One read into a buffer filled with `sentinel`: the entries written, or the code. */
async function readInto(call: NvmlCall, layout: ProcessLayout, device: DeviceHandle, room: number, sentinel: number) {
  const count = Buffer.alloc(4);
  count.writeUInt32LE(room, 0);
  const buffer = Buffer.alloc(room * WIDEST_ENTRY, sentinel);
  const code = await call(layout.fn, device, count, buffer);
  return { code, written: count.readUInt32LE(0), buffer };
}

/** The last byte a read wrote, seen through two sentinels (a written byte equals at most one of them). */
function extentOf(a: Buffer, b: Buffer): number {
  let end = a.length;
  while (end > 0 && a[end - 1] === SENTINELS[0] && b[end - 1] === SENTINELS[1]) end -= 1;
  return end;
}

/** The instance ids after usedGpuMemory (in 24- and 32-byte entries); null when NVML says no instance. */
function instanceAt(buffer: Buffer, at: number, stride: number): MigInstance | null {
  if (stride < 24) return null;
  const gpuInstanceId = buffer.readUInt32LE(at + 16);
  const computeInstanceId = buffer.readUInt32LE(at + 20);
  return gpuInstanceId === NO_INSTANCE || computeInstanceId === NO_INSTANCE ? null : { gpuInstanceId, computeInstanceId };
}

function decode(buffer: Buffer, written: number, stride: number): ProcessEntry[] {
  const entries: ProcessEntry[] = [];
  for (let i = 0; i < written; i += 1) {
    const used = buffer.readBigUInt64LE(i * stride + 8);
    const migInstance = instanceAt(buffer, i * stride, stride);
    entries.push({ pid: buffer.readUInt32LE(i * stride), usedBytes: used === NOT_AVAILABLE ? null : used, migInstance });
  }
  return entries;
}

/** The device's compute processes, or the code NVML failed with; probes `layout.stride` when unknown (and sets it). */
export async function readProcesses(call: NvmlCall, layout: ProcessLayout, device: DeviceHandle): Promise<ProcessEntry[] | { code: number }> {
  for (let attempt = 0; attempt < TRIES; attempt += 1) {
    const counted = await countEntries(call, layout, device);
    if (typeof counted !== 'number') return counted;
    if (counted === 0) return [];
    const room = counted + HEADROOM;
    const read = await readInto(call, layout, device, room, SENTINELS[0]);
    if (read.code === NVML.ERROR_INSUFFICIENT_SIZE) continue;
    if (read.code !== NVML.SUCCESS) return { code: read.code };
    // They exited since the count: an empty read shows no entry's size, so the probe waits.
    if (read.written === 0) return [];
    if (layout.stride === null) {
      const again = await readInto(call, layout, device, room, SENTINELS[1]);
      // The list changed between the two reads: read again.
      if (again.code !== NVML.SUCCESS || again.written !== read.written) continue;
      layout.stride = extentOf(read.buffer, again.buffer) > read.written * 24 ? 32 : 24;
    }
    return decode(read.buffer, read.written, layout.stride);
  }
  return { code: NVML.ERROR_INSUFFICIENT_SIZE };
}

/** NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_DEVICE_NAME_V2_BUFFER_SIZE; enough for the version strings too. */
export const TEXT_BUFFER = 96;

/** "NVIDIA H100 80GB HBM3 MIG 3g.40gb" -> "3g.40gb"; a name without the mark is kept whole. */
function migProfile(name: string): string {
  return / MIG (\S+)$/.exec(name)?.[1] ?? name;
}

/** A device's UUID or name; null where NVML gives none. */
export async function textOf(call: NvmlCall, fn: 'uuid' | 'name', handle: DeviceHandle): Promise<string | null> {
  const out = Buffer.alloc(TEXT_BUFFER);
  return (await call(fn, handle, out, TEXT_BUFFER)) === NVML.SUCCESS ? cString(out) : null;
}

async function idOf(call: NvmlCall, fn: 'gpuInstanceId' | 'computeInstanceId', handle: DeviceHandle): Promise<number | null> {
  const out = Buffer.alloc(4);
  return (await call(fn, handle, out)) === NVML.SUCCESS ? out.readUInt32LE(0) : null;
}

async function migDevice(call: NvmlCall, handle: DeviceHandle, memoryOf: (handle: DeviceHandle) => Promise<MemoryMiB>): Promise<MigDeviceRecord | null> {
  const uuid = await textOf(call, 'uuid', handle);
  const gpuInstanceId = await idOf(call, 'gpuInstanceId', handle);
  const computeInstanceId = await idOf(call, 'computeInstanceId', handle);
  // Without its UUID or ids no process or shard can be matched to it.
  if (uuid === null || gpuInstanceId === null || computeInstanceId === null) return null;
  const profile = migProfile((await textOf(call, 'name', handle)) ?? '');
  return { uuid, profile, gpuInstanceId, computeInstanceId, ...(await memoryOf(handle)) };
}

// What is asked of a MIG device's own handle for its record and ids (`migCall`) is asked with plain
// calls: a refusal leaves that device (or id) out and never says the whole GPU is lost (a lost GPU
// fails its own calls first). Its process list is read through `call`, as the GPU's is.

/** The handles of the GPU's MIG devices in slot order; null where NVML gives no count (MIG off, an old driver, a refusal). */
async function migHandles(call: NvmlCall, device: DeviceHandle): Promise<DeviceHandle[] | null> {
  const count = Buffer.alloc(4);
  if ((await call('maxMigDevices', device, count)) !== NVML.SUCCESS) return null;
  const handles: DeviceHandle[] = [];
  for (let slot = 0; slot < count.readUInt32LE(0); slot += 1) {
    const out = Buffer.alloc(8);
    // NOT_FOUND: an empty slot; any other refusal leaves that slot out too.
    if ((await call('migHandle', device, slot, out)) === NVML.SUCCESS) handles.push(out.readBigUInt64LE(0));
  }
  return handles;
}

/** The GPU's MIG devices in slot order; null where NVML gives none (MIG off, an old driver, a refusal). */
export async function readMigDevices(
  call: NvmlCall,
  migCall: NvmlCall,
  device: DeviceHandle,
  memoryOf: (handle: DeviceHandle) => Promise<MemoryMiB>,
): Promise<MigDeviceRecord[] | null> {
  const handles = await migHandles(call, device);
  if (handles === null) return null;
  const found: MigDeviceRecord[] = [];
  for (const handle of handles) {
    const mig = await migDevice(migCall, handle, memoryOf);
    if (mig !== null) found.push(mig);
  }
  return found;
}

/**
 * The processes of each MIG device, read through its own handle, with its instance ids: NVML gives the
 * parent GPU's aggregate list only to a privileged caller (and fails as the GPU's would). Null where
 * NVML gives no count; the code a read failed with.
 */
export async function readMigProcesses(
  call: NvmlCall,
  migCall: NvmlCall,
  layout: ProcessLayout,
  device: DeviceHandle,
): Promise<ProcessEntry[] | { code: number } | null> {
  const handles = await migHandles(call, device);
  if (handles === null) return null;
  const entries: ProcessEntry[] = [];
  for (const handle of handles) {
    const read = await readProcesses(call, layout, handle);
    if (!Array.isArray(read)) return read;
    if (read.length === 0) continue;
    const gpuInstanceId = await idOf(migCall, 'gpuInstanceId', handle);
    const computeInstanceId = await idOf(migCall, 'computeInstanceId', handle);
    const migInstance = gpuInstanceId === null || computeInstanceId === null ? null : { gpuInstanceId, computeInstanceId };
    entries.push(...read.map((entry) => ({ ...entry, migInstance })));
  }
  return entries;
}

/** sizeof(nvmlProcessUtilizationSample_t), where its timeStamp is, and its four utilizations (sm, mem, enc, dec). */
const SAMPLE_SIZE = 32;
const TIMESTAMP_AT = 8;
const UTILS_AT = [16, 20, 24, 28] as const;
const SAMPLE_HEADROOM = 8;
const FUTURE_SLACK_US = 60_000_000n;

// NVML keeps samples of the last seconds and gives those newer than the timestamp passed back. A
// process it has no sample of did no work since `lastSeen` (0%); a GPU that gives none (MIG, old
// boards) reads null. Real drivers also return samples no newer than `lastSeen` and utilizations
// past 100 (nvtop #110): those are dropped, as are stamps ahead of the clock, so one bad stamp
// cannot hide every later sample.
/** Per PID, the highest SM utilization (%) sampled; null when the GPU gives none. `lastSeen`: the newest sample's time, to pass next. */
export type Utilization = { byPid: Map<number, number> | null; lastSeen: bigint };

export async function readUtilization(call: NvmlCall, device: DeviceHandle, lastSeen: bigint): Promise<Utilization> {
  const count = Buffer.alloc(4);
  const sized = await call('processUtilization', device, null, count, lastSeen);
  if (sized === NVML.ERROR_NOT_FOUND || sized === NVML.SUCCESS) return { byPid: new Map(), lastSeen };
  if (sized !== NVML.ERROR_INSUFFICIENT_SIZE) return { byPid: null, lastSeen };
  const room = count.readUInt32LE(0) + SAMPLE_HEADROOM;
  count.writeUInt32LE(room, 0);
  const samples = Buffer.alloc(room * SAMPLE_SIZE);
  const code = await call('processUtilization', device, samples, count, lastSeen);
  if (code === NVML.ERROR_NOT_FOUND) return { byPid: new Map(), lastSeen };
  if (code !== NVML.SUCCESS) return { byPid: null, lastSeen };
  const byPid = new Map<number, number>();
  let newest = lastSeen;
  // Stamps are the CPU's clock in microseconds: one a minute or more ahead of it is garbage too.
  const latest = BigInt(Date.now()) * 1000n + FUTURE_SLACK_US;
  for (let i = 0; i < count.readUInt32LE(0); i += 1) {
    const at = i * SAMPLE_SIZE;
    const pid = samples.readUInt32LE(at);
    const stamp = samples.readBigUInt64LE(at + TIMESTAMP_AT);
    if (stamp <= lastSeen || stamp > latest || UTILS_AT.some((offset) => samples.readUInt32LE(at + offset) > 100)) continue;
    const smUtil = samples.readUInt32LE(at + UTILS_AT[0]);
    if (stamp > newest) newest = stamp;
    byPid.set(pid, Math.max(byPid.get(pid) ?? 0, smUtil));
  }
  return { byPid, lastSeen: newest };
}
