// Reads the SM utilization of one GPU's processes (nvmlDeviceGetProcessUtilization): NVML keeps
// samples of the last seconds, and gives those newer than the timestamp passed back. A process it
// has no sample of did no work since then (0%); a GPU that gives none (MIG, old boards) reads null.
import { NVML, type DeviceHandle } from './nvml-library.js';
import type { NvmlCall } from './nvml-processes.js';

/** sizeof(nvmlProcessUtilizationSample_t), and where its timeStamp and smUtil are. */
const SAMPLE_SIZE = 32;
const TIMESTAMP_AT = 8;
const SM_UTIL_AT = 16;
const HEADROOM = 8;

/** Per PID, the highest SM utilization (%) sampled; null when the GPU gives none. `lastSeen`: the newest sample's time, to pass next. */
export type Utilization = { byPid: Map<number, number> | null; lastSeen: bigint };

export async function readUtilization(call: NvmlCall, device: DeviceHandle, lastSeen: bigint): Promise<Utilization> {
  const count = Buffer.alloc(4);
  const sized = await call('processUtilization', device, null, count, lastSeen);
  if (sized === NVML.ERROR_NOT_FOUND || sized === NVML.SUCCESS) return { byPid: new Map(), lastSeen };
  if (sized !== NVML.ERROR_INSUFFICIENT_SIZE) return { byPid: null, lastSeen };
  const room = count.readUInt32LE(0) + HEADROOM;
  count.writeUInt32LE(room, 0);
  const samples = Buffer.alloc(room * SAMPLE_SIZE);
  const code = await call('processUtilization', device, samples, count, lastSeen);
  if (code === NVML.ERROR_NOT_FOUND) return { byPid: new Map(), lastSeen };
  if (code !== NVML.SUCCESS) return { byPid: null, lastSeen };
  const byPid = new Map<number, number>();
  let newest = lastSeen;
  for (let i = 0; i < count.readUInt32LE(0); i += 1) {
    const at = i * SAMPLE_SIZE;
    const pid = samples.readUInt32LE(at);
    const stamp = samples.readBigUInt64LE(at + TIMESTAMP_AT);
    if (stamp > newest) newest = stamp;
    byPid.set(pid, Math.max(byPid.get(pid) ?? 0, samples.readUInt32LE(at + SM_UTIL_AT)));
  }
  return { byPid, lastSeen: newest };
}
