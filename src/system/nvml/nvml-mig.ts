// Reads a MIG-enabled GPU's MIG devices from NVML, each through its own handle: UUID, name (whose
// tail is the profile), instance ids, memory and processes. Asked at every query and never kept:
// MIG devices are made and destroyed while the driver stays loaded (nvidia-smi mig -cgi, -dgi).
import type { MigDeviceRecord } from '../gpu-driver.js';
import { cString, NVML, type DeviceHandle } from './nvml-library.js';
import { readProcesses, type NvmlCall, type ProcessEntry, type ProcessLayout } from './nvml-processes.js';

type Memory = Pick<MigDeviceRecord, 'totalMiB' | 'usedMiB' | 'freeMiB'>;

const TEXT_BUFFER = 96;

/** "NVIDIA H100 80GB HBM3 MIG 3g.40gb" -> "3g.40gb"; a name without the mark is kept whole. */
export function migProfile(name: string): string {
  return / MIG (\S+)$/.exec(name)?.[1] ?? name;
}

async function textOf(call: NvmlCall, fn: 'uuid' | 'name', handle: DeviceHandle): Promise<string | null> {
  const out = Buffer.alloc(TEXT_BUFFER);
  return (await call(fn, handle, out, TEXT_BUFFER)) === NVML.SUCCESS ? cString(out) : null;
}

async function idOf(call: NvmlCall, fn: 'gpuInstanceId' | 'computeInstanceId', handle: DeviceHandle): Promise<number | null> {
  const out = Buffer.alloc(4);
  return (await call(fn, handle, out)) === NVML.SUCCESS ? out.readUInt32LE(0) : null;
}

async function migDevice(call: NvmlCall, handle: DeviceHandle, memoryOf: (handle: DeviceHandle) => Promise<Memory>): Promise<MigDeviceRecord | null> {
  const uuid = await textOf(call, 'uuid', handle);
  const gpuInstanceId = await idOf(call, 'gpuInstanceId', handle);
  const computeInstanceId = await idOf(call, 'computeInstanceId', handle);
  // Without its UUID or ids no process or shard can be matched to it.
  if (uuid === null || gpuInstanceId === null || computeInstanceId === null) return null;
  const profile = migProfile((await textOf(call, 'name', handle)) ?? '');
  return { uuid, profile, gpuInstanceId, computeInstanceId, ...(await memoryOf(handle)) };
}

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
export async function readMigDevices(call: NvmlCall, device: DeviceHandle, memoryOf: (handle: DeviceHandle) => Promise<Memory>): Promise<MigDeviceRecord[] | null> {
  const handles = await migHandles(call, device);
  if (handles === null) return null;
  const found: MigDeviceRecord[] = [];
  for (const handle of handles) {
    const mig = await migDevice(call, handle, memoryOf);
    if (mig !== null) found.push(mig);
  }
  return found;
}

/**
 * The processes of each MIG device, read through its own handle, with its instance ids: NVML gives the
 * parent GPU's aggregate list only to a privileged caller. Null where NVML gives no count; the code a
 * read failed with.
 */
export async function readMigProcesses(call: NvmlCall, layout: ProcessLayout, device: DeviceHandle): Promise<ProcessEntry[] | { code: number } | null> {
  const handles = await migHandles(call, device);
  if (handles === null) return null;
  const entries: ProcessEntry[] = [];
  for (const handle of handles) {
    const read = await readProcesses(call, layout, handle);
    if (!Array.isArray(read)) return read;
    if (read.length === 0) continue;
    const gpuInstanceId = await idOf(call, 'gpuInstanceId', handle);
    const computeInstanceId = await idOf(call, 'computeInstanceId', handle);
    const migInstance = gpuInstanceId === null || computeInstanceId === null ? null : { gpuInstanceId, computeInstanceId };
    entries.push(...read.map((entry) => ({ ...entry, migInstance })));
  }
  return entries;
}
