// Reads one GPU's compute processes from NVML. The entry size of nvmlDeviceGetComputeRunningProcesses_v3
// is probed, never assumed: some R535 drivers write 32-byte entries where others write 24 under the
// same name (nvitop #79, #88); the probe fills the buffer with two sentinels and sees how far one
// call wrote (as nvitop #226 does). _v2 entries are 24 bytes, the unversioned ones 16.
import type { MigInstance } from '../gpu-driver.js';
import { NVML, type DeviceHandle, type NvmlFunction } from './nvml-library.js';

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
