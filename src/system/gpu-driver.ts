// Owns what a snapshot source of the GPUs answers, whichever backend serves it: nvidia-smi runs
// (nvidia-smi.ts) or NVML calls (nvml/nvml-driver.ts). Both fill the same records, so attribution,
// verdicts and every route are the same under either. observed() is how both run a query: refused
// once stopped, timed, logged at debug and reported to onQuery, alike, and failing only with a coded error.
import type { Logger } from 'pino';
import { isCodedError, NvidiaSmiFailedError, NvmlFailedError, type DriverFailure } from '../errors.js';

export type Backend = 'nvml' | 'nvidia-smi';

/** Memory figures in MiB; null where the driver gives none. */
export type MemoryMiB = { totalMiB: number | null; usedMiB: number | null; freeMiB: number | null };

export interface GpuRecord extends MemoryMiB {
  index: number;
  uuid: string;
  name: string;
  reservedMiB: number | null;
  /** mig.mode.current, "Enabled" or "Disabled"; null where the GPU has none or the driver does not know the field. */
  migMode: string | null;
  /** pci.bus_id (00000000:83:00.0), by which error lines and dmesg name a GPU; null where there is none. */
  busId: string | null;
  /** utilization.gpu: % of the last sample period in which a kernel ran on it; null where not reported ([N/A]: MIG, some vGPUs). */
  utilizationPct: number | null;
  /** Xid and ECC events counted since nodecompute started (NVML only; absent under nvidia-smi). */
  events?: GpuEvents;
  /** Its MIG devices (NVML only): [] with MIG on and none made, null with MIG off or where NVML refuses; absent under nvidia-smi. */
  migDevices?: MigDeviceRecord[] | null;
}

/** A MIG device (one compute instance of a GPU instance), as NVML gives it through its own handle. */
export interface MigDeviceRecord extends MigInstance, MemoryMiB {
  uuid: string;
  /** The profile, from its name ("3g.40gb", "1c.3g.71gb"). */
  profile: string;
}

export interface ComputeAppRecord {
  gpuUuid: string;
  pid: number;
  name: string;
  usedMiB: number | null;
  /** Highest SM utilization (%) NVML sampled since the last query; null where the GPU gives none; absent under nvidia-smi. */
  smUtilPct?: number | null;
  /** The MIG instance it runs on (NVML only): null off MIG; absent under nvidia-smi. */
  migInstance?: MigInstance | null;
}

/** A MIG device's place on its GPU: its GPU instance and compute instance ids. */
export type MigInstance = { gpuInstanceId: number; computeInstanceId: number };

export type NvidiaSmiVersion = { smiVersion: string | null; driverVersion: string | null; cudaVersion: string | null };

/** A GPU nvidia-smi could not reach (bus id in canonicalBusId's form), and what it said of it ("GPU is lost. ...", "Unknown Error"). */
export type UnreachableGpu = { busId: string; said: string };

/** xid: count per Xid number; lastXid: the latest, and when it was read (ms since the epoch). */
export type GpuEvents = { xid: Record<string, number>; eccSingleBit: number; eccDoubleBit: number; lastXid: { xid: number; at: number } | null };

export type QueryName = 'gpus' | 'compute-apps' | 'version';

/** durationMs: null when the driver was not asked at all; outcome: 'ok', or the code of the error the query failed with. */
export type QueryObservation = { query: QueryName; durationMs: number | null; outcome: 'ok' | string };

/** What the GPU query answered: the GPUs it listed, and those it said, beside them, it cannot reach. */
export type GpuListing = { gpus: GpuRecord[]; unreachable: UnreachableGpu[] };

export interface GpuDriver {
  readonly backend: Backend;
  /** What serves it, as an operator names it: nvidia-smi's path, or the NVML library's. */
  readonly source: string;
  queryGpus(): Promise<GpuListing>;
  /** utilization false: no sample is taken (NVML), so the next query's SM figures still span the time since the last one that took them. */
  queryComputeApps(options?: { utilization?: boolean }): Promise<ComputeAppRecord[]>;
  queryVersion(): Promise<NvidiaSmiVersion>;
  /** Stops every query under way and starts no other (used at shutdown). */
  killAll(): void;
  /** True once killAll has run: a query that fails from then on failed because of the shutdown. */
  readonly stopped: boolean;
  /** Runs or calls under way (a stuck one included). */
  readonly running: number;
}

/**
 * Runs one query of a driver and observes it: refused at once (durationMs null) with `refusal` when
 * there is one, else timed and logged at debug only (the snapshot cache logs each failure once, when
 * it starts; the doctor shows its own).
 */
type Observing = { query: QueryName; what: 'NVML' | 'nvidia-smi'; log: Logger; onQuery: ((o: QueryObservation) => void) | undefined };

const FAILED = { NVML: NvmlFailedError, 'nvidia-smi': NvidiaSmiFailedError };

/** A failure without a code (a bug, not the driver's word) as the backend's coded failure, so it is a 503 and never a bare 500. */
function asDriverFailure(err: unknown, what: Observing['what'], query: QueryName): unknown {
  if (isCodedError(err)) return err;
  const next = 'nodecompute asks again at the next refresh; if this persists, restart it and report the log lines around this one as a bug.';
  return new FAILED[what](`The ${what} ${query} query failed unexpectedly (${String(err)}). ${next}`, { cause: err });
}
export async function observed<T>(
  { query, what, log, onQuery }: Observing,
  refusal: Error | null,
  work: () => Promise<T>,
): Promise<T> {
  if (refusal) {
    onQuery?.({ query, durationMs: null, outcome: (refusal as DriverFailure).code });
    throw refusal;
  }
  const started = performance.now();
  const done = (err?: unknown) => {
    const durationMs = Math.round(performance.now() - started);
    if (err === undefined) log.debug({ query, durationMs }, `${what} answered`);
    else log.debug({ query, durationMs, err }, `${what} query failed`);
    onQuery?.({ query, durationMs, outcome: err === undefined ? 'ok' : (err as DriverFailure).code });
  };
  try {
    const value = await work();
    done();
    return value;
  } catch (err) {
    const failure = asDriverFailure(err, what, query);
    done(failure);
    throw failure;
  }
}
