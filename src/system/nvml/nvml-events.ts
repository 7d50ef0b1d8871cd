// Counts each GPU's Xid and ECC events from NVML's event set. The set is made and each GPU
// registered once per initialisation; it is drained without waiting at every GPU query, so no call
// blocks on it. Counts are by GPU UUID and last as long as nodecompute runs.
import type { Logger } from 'pino';
import type { GpuEvents } from '../gpu-driver.js';
import { NVML, type DeviceHandle } from './nvml-library.js';
import type { NvmlCall } from './nvml-processes.js';

/** nvmlEventType* bits (nvml.h). */
const SINGLE_BIT_ECC = 0x1n;
const DOUBLE_BIT_ECC = 0x2n;
const XID = 0x8n;
const WATCHED = SINGLE_BIT_ECC | DOUBLE_BIT_ECC | XID;
/** sizeof(nvmlEventData_t), and where its eventType and eventData are (the device handle is first). */
const EVENT_DATA_SIZE = 32;
const TYPE_AT = 8;
const DATA_AT = 16;

function noEvents(): GpuEvents {
  return { xid: {}, eccSingleBit: 0, eccDoubleBit: 0, lastXid: null };
}

export function createEventCounter(log: Logger, now: () => number = Date.now) {
  /** This initialisation's event set, made once even when two queries ask at once; null when NVML made none. */
  let set: Promise<bigint | null> | null = null;
  /** Handles registered with the set (or refused: not asked again) in this initialisation. */
  const asked = new Set<DeviceHandle>();
  const counts = new Map<string, GpuEvents>();

  async function create(call: NvmlCall): Promise<bigint | null> {
    const out = Buffer.alloc(8);
    const code = await call('eventSetCreate', out);
    if (code === NVML.SUCCESS) return out.readBigUInt64LE(0);
    log.info({ code }, 'NVML made no event set: Xid and ECC events are not counted');
    return null;
  }

  /** The set, made at the first ask; a making that failed (its query abandoned, say) is tried again at the next. */
  function eventSet(call: NvmlCall): Promise<bigint | null> {
    if (set !== null) return set;
    const making = create(call);
    set = making;
    making.catch(() => {
      if (set === making) set = null;
    });
    return making;
  }

  async function register(call: NvmlCall, device: DeviceHandle): Promise<void> {
    if (asked.has(device)) return;
    asked.add(device);
    try {
      const target = await eventSet(call);
      if (target === null) return;
      const supported = Buffer.alloc(8);
      if ((await call('supportedEvents', device, supported)) !== NVML.SUCCESS) return;
      const types = supported.readBigUInt64LE(0) & WATCHED;
      if (types !== 0n) await call('registerEvents', device, types, target);
    } catch (err) {
      asked.delete(device); // not registered: asked again at the next query
      throw err;
    }
  }

  function count(uuid: string, type: bigint, data: bigint, where: string): void {
    const events = counts.get(uuid) ?? noEvents();
    counts.set(uuid, events);
    if (type === SINGLE_BIT_ECC) events.eccSingleBit += 1;
    if (type === DOUBLE_BIT_ECC) events.eccDoubleBit += 1;
    if (type !== XID) return;
    const xid = Number(data);
    events.xid[xid] = (events.xid[xid] ?? 0) + 1;
    events.lastXid = { xid, at: now() };
    log.warn({ uuid, xid }, `${where} reported Xid ${xid} (an NVML event). Look it up in NVIDIA's Xid catalogue and check \`dmesg\` (NVRM); its shards may misbehave.`);
  }

  /** Reads the events waiting; `named` gives a handle's UUID and how to name its GPU (null: not a GPU listed now). */
  async function drain(call: NvmlCall, named: (device: DeviceHandle) => { uuid: string; where: string } | null): Promise<void> {
    const target = await eventSet(call);
    if (target === null) return;
    const data = Buffer.alloc(EVENT_DATA_SIZE);
    // Until the set is empty (TIMEOUT): a storm ends with the query's deadline at the latest.
    while ((await call('eventWait', target, data, 0)) === NVML.SUCCESS) {
      const gpu = named(data.readBigUInt64LE(0));
      if (gpu !== null) count(gpu.uuid, data.readBigUInt64LE(TYPE_AT), data.readBigUInt64LE(DATA_AT), gpu.where);
    }
  }

  return {
    register,
    drain,
    of: (uuid: string): GpuEvents => structuredClone(counts.get(uuid) ?? noEvents()),
    /** A new initialisation: its handles and set are new. */
    reset(): void {
      set = null;
      asked.clear();
    },
  };
}
