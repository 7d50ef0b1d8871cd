// Sets up the fake nvidia-smi (test/fixtures/bin/nvidia-smi) for one test, on top of
// scripts/fake-nvidia-smi.ts (one install per directory: scenario, invocation log, wrapper): the
// scenario's types, scenario edits, counts of the fake's runs, and the 8x H200 node most tests use.
// Also holds the /proc helpers the process-lifetime tests need.
import { readdirSync, readFileSync } from 'node:fs';
import { fakeNvidiaSmiBin, H200_BUS, H200_UUIDS, installFakeNvidiaSmi } from '../../scripts/fake-nvidia-smi.js';
import { join } from 'node:path';

/** A memory value: a number prints as `N MiB`, a string verbatim (`[N/A]`, `[Insufficient Permissions]`). */
export type FakeMemory = number | string;

export interface FakeMigDevice {
  /** As `-L` prints it, e.g. `3g.40gb`. */
  profile: string;
  uuid: string;
  /** Fake NVML only: its GPU instance id (its position when absent) and compute instance id (0 when absent). */
  gpuInstanceId?: number;
  computeInstanceId?: number;
  /** Fake NVML only: its memory (NOT_SUPPORTED when absent). */
  totalMiB?: number;
  usedMiB?: number;
  freeMiB?: number;
}

export interface FakeGpu {
  index: number;
  uuid: string;
  name: string;
  totalMiB: FakeMemory;
  usedMiB: FakeMemory;
  freeMiB: FakeMemory;
  /** Printed for memory.reserved; 0 when absent. */
  reservedMiB?: FakeMemory;
  /** pci.bus_id; derived from the index when absent. */
  busId?: string;
  /** `[N/A]` when absent. */
  serial?: string;
  /** mig.mode.current; `Disabled` when absent. */
  migMode?: string;
  /** persistence_mode; `Enabled` when absent. */
  persistenceMode?: string;
  /** utilization.gpu (and NVML's nvmlDeviceGetUtilizationRates): a number prints as `N %`, a string verbatim (NVML: NOT_SUPPORTED); absent, 0, or [N/A] under MIG. */
  utilizationPct?: number | string;
  /** MIG devices listed by `-L` under this GPU. */
  migDevices?: FakeMigDevice[];
  /** Any other query-gpu field, keyed by its header as printed (`utilization.gpu [%]`), value as printed. */
  extra?: Record<string, string>;
}

export interface FakeProcess {
  /** The GPU's UUID; under MIG, the parent GPU's UUID, as the real tool reports it. */
  gpuUuid: string;
  pid: number;
  name: string;
  usedMiB: FakeMemory;
  /** Fake NVML only: the SM utilization (%) nvmlDeviceGetProcessUtilization samples for this
   *  process on its GPU (timeStamp: the call's time); no sample when absent. */
  smUtilPct?: number;
  /** Fake NVML only: that sample's memUtil (%); 0 when absent. */
  memUtilPct?: number;
  /** Fake NVML only: that sample's timeStamp (us), returned whatever timestamp the caller passes, as
   *  real drivers sometimes return stale or garbage samples (nvtop #110); the call's time when absent. */
  sampleStampUs?: number;
  /** Fake NVML only: the MIG instance it runs on (NVML's "no instance" when absent). */
  gpuInstanceId?: number;
  computeInstanceId?: number;
}

/**
 * An event the fake NVML library delivers through nvmlEventSetWait_v2 (and nvmlEventSetWait): once per
 * event set that has its GPU registered for its type, in the array's order, whenever it is in the
 * scenario (events added later are delivered by later waits).
 */
export interface FakeNvmlEvent {
  /** The GPU's NVML index; an event for no GPU is never delivered. */
  index: number;
  /** `xid` (nvmlEventTypeXidCriticalError, 0x8) when absent; `ecc-single` 0x1, `ecc-double` 0x2. */
  type?: 'xid' | 'ecc-single' | 'ecc-double';
  /** eventData of an Xid event; 999 (NVML's "unknown Xid") when absent. ECC events carry 0. */
  xid?: number;
  /** Unique: what each event set remembers having delivered. */
  id: string;
}

export type FakeQueryKind = 'gpu' | 'compute-apps' | 'version' | 'list';

export type FakeFailure =
  /** exit 9: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. ..." */
  | { kind: 'driver-unreachable' }
  /** exit 18: "Failed to initialize NVML: Driver/library version mismatch" + "NVML library version: X" */
  | { kind: 'library-mismatch'; nvmlVersion?: string }
  /** exit 6: "No devices were found" */
  | { kind: 'no-devices' }
  /** exit 15: "Unable to determine the device handle for GPU <busId>: GPU is lost. ..." */
  | { kind: 'gpu-lost'; busId?: string }
  /** exit 0 with output that is not what was asked */
  | { kind: 'garbage'; text?: string }
  /** the fake kills itself (default SIGKILL), as the OOM killer would */
  | { kind: 'killed-by-signal'; signal?: NodeJS.Signals }
  /** never exits; a grandchild `sleep` in its process group holds stdout open */
  | { kind: 'hang'; partialOutput?: string }
  /** exits 0 at once, leaving a `sleep` in a session of its own holding stdout open; kill it by its pid */
  | { kind: 'escaped-grandchild' }
  | { kind: 'custom'; stdout?: string; stderr?: string; exitCode: number };

export interface FakeScenario {
  gpus: FakeGpu[];
  /** Compute processes; printed per GPU in index order, then in this order. */
  processes: FakeProcess[];
  /** `590.48.01` when absent. */
  driverVersion?: string;
  /** `13.1` when absent. */
  cudaVersion?: string;
  /** false: an older driver that answers `Field "memory.reserved" is not a valid field to query.` */
  supportsReserved?: boolean;
  /** false: a driver older than R450, which answers `Field "mig.mode.current" is not a valid field to query.` */
  supportsMigMode?: boolean;
  /** `crlf`: line ends as on Windows. */
  lineEnding?: 'lf' | 'crlf';
  /** Wait this long before answering (or failing), for every query or per kind. */
  delayMs?: number | Partial<Record<FakeQueryKind, number>>;
  /** A failure for one kind of query, or for all; the specific kind wins. */
  failures?: Partial<Record<FakeQueryKind | 'all', FakeFailure>>;
  /** GPUs (by index) the driver cannot reach: left out of every listing, which says so on stderr; `said`: `Unknown Error` when absent. */
  unreachable?: Array<{ index: number; said?: string }>;
  /** Knobs only the fake NVML library reads (the fake nvidia-smi ignores them). */
  nvml?: FakeNvml;
}

/**
 * What only the fake NVML library (test/fixtures/nvml/fake-nvml.c, installed by scripts/fake-nvml.ts)
 * reads; function names are NVML's exported names, e.g. `nvmlDeviceGetCount_v2`.
 */
export interface FakeNvml {
  /** Bytes per entry nvmlDeviceGetComputeRunningProcesses_v3 writes: 24 (nvmlProcessInfo_v2_t, the
   *  default) or 32 (R535 drivers' struct with usedGpuCcProtectedMemory). */
  processStruct?: 24 | 32;
  /** A caller without privileges: a MIG-enabled GPU's own handle refuses its process list
   *  (NVML_ERROR_NO_PERMISSION, 4), which NVML gives in aggregate only to a privileged caller;
   *  each MIG device's handle still lists its own. */
  unprivileged?: boolean;
  /** A driver reload: when this differs from its value at the last successful init (default 0),
   *  every call but init, shutdown and nvmlErrorString answers NVML_ERROR_UNINITIALIZED (1)
   *  until the next nvmlInit_v2. */
  generation?: number;
  /** Milliseconds each call of that function sleeps first. */
  delayMs?: Record<string, number>;
  /** Functions whose calls block until their name leaves this list (polled every 20 ms); after
   *  120 s they give up with NVML_ERROR_TIMEOUT (10). A delay or hang also ends once the scenario
   *  lowers or lifts it, or once the scenario file is gone (its test has ended). */
  hang?: string[];
  /** That function answers `code` (an nvmlReturn_t), for the device of `index` only when given. */
  errors?: Record<string, { code: number; index?: number }>;
  /** Append `<function> <device index or -> <pid>` to nvml-calls.log beside the library at every call. */
  logCalls?: boolean;
  /** Events for event sets (nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2). A
   *  wait with none to deliver polls the scenario every 20 ms until its timeout (NVML_ERROR_TIMEOUT,
   *  10); unreachable GPUs do not end it (`errors: { nvmlEventSetWait_v2: { code: 15 } }` does). */
  events?: FakeNvmlEvent[];
}

export interface FakeInvocation {
  argv: string[];
  pid: number;
  at: number;
}

/** A grandchild the fake started (the `hang` failure). */
export interface FakeSpawn {
  pid: number;
  childPid: number;
  at: number;
}

export interface FakeNvidiaSmi {
  /** The executable to pass as the nvidia-smi path. */
  path: string;
  dir: string;
  setScenario(s: FakeScenario): void;
  update(fn: (s: FakeScenario) => FakeScenario | void): void;
  invocations(): FakeInvocation[];
  countQueries(kind: 'gpu' | 'compute-apps'): number;
  spawned(): FakeSpawn[];
}

export const FAKE_NVIDIA_SMI_BIN = fakeNvidiaSmiBin();

export function createFakeNvidiaSmi(dir: string, scenario: FakeScenario): FakeNvidiaSmi {
  const fake = installFakeNvidiaSmi<FakeScenario>(dir, scenario);
  let current = structuredClone(scenario);
  const setScenario = (s: FakeScenario) => {
    current = structuredClone(s);
    fake.setScenario(current);
  };
  const entries = (type: string) => fake.log().filter((entry) => entry.type === type);
  const invocations = () => entries('invocation').map(({ argv, pid, at }) => ({ argv, pid, at }) as FakeInvocation);
  return {
    path: fake.path,
    dir,
    setScenario,
    update(fn) {
      const draft = structuredClone(current);
      setScenario(fn(draft) ?? draft);
    },
    invocations,
    countQueries(kind) {
      const flag = kind === 'gpu' ? '--query-gpu' : '--query-compute-apps';
      return invocations().filter((i) => i.argv.some((arg) => arg.split('=')[0] === flag)).length;
    },
    spawned: () => entries('spawned').map(({ pid, childPid, at }) => ({ pid, childPid, at }) as FakeSpawn),
  };
}

// The UUIDs and sizes come from
// test/fixtures/samples/nvsmi-8xH200-container_query-gpu_and_compute-apps_not-found.txt; reserved
// 614 MiB and free = total - reserved - used + 1 (nvidia-smi rounds each) from the H200 capture.
const H200_USED_MIB = [130013, 130053, 105851, 129993, 106091, 105851, 106139, 58071] as const;

/**
 * An 8x H200 node. Processes: one per GPU as in the sample, plus the awkward cases the parser must
 * survive: pid 1425258 holds GPUs 2 and 4 (tensor parallel), pid 1425260's name contains ", ",
 * pid 1425261's memory is `[N/A]`, and pid 1758887 belongs to another PID namespace (`[Not Found]`).
 */
export function eightGpuNode(): FakeScenario {
  return {
    driverVersion: '590.48.01',
    cudaVersion: '13.1',
    gpus: H200_UUIDS.map((uuid, index) => ({
      index,
      uuid,
      name: 'NVIDIA H200',
      busId: `00000000:${H200_BUS[index]}:00.0`,
      totalMiB: 143771,
      usedMiB: H200_USED_MIB[index] as number,
      freeMiB: 143771 - 614 - (H200_USED_MIB[index] as number) + 1,
      reservedMiB: 614,
    })),
    processes: [
      { gpuUuid: H200_UUIDS[0], pid: 1328667, name: '/usr/local/bin/python3.10', usedMiB: 130004 },
      { gpuUuid: H200_UUIDS[1], pid: 1328668, name: '/usr/local/bin/python3.10', usedMiB: 130044 },
      { gpuUuid: H200_UUIDS[2], pid: 1425258, name: 'python3', usedMiB: 105842 },
      { gpuUuid: H200_UUIDS[3], pid: 1328669, name: '/usr/local/bin/python3.10', usedMiB: 129984 },
      { gpuUuid: H200_UUIDS[4], pid: 1425258, name: 'python3', usedMiB: 106082 },
      { gpuUuid: H200_UUIDS[5], pid: 1425260, name: '/srv/jobs/eval, run 2/bin/python3', usedMiB: 105842 },
      { gpuUuid: H200_UUIDS[6], pid: 1425261, name: 'python3', usedMiB: '[N/A]' },
      { gpuUuid: H200_UUIDS[7], pid: 1758887, name: '[Not Found]', usedMiB: 58060 },
    ],
  };
}

/**
 * The same node idle, as the real idle H200 capture shows it: no process, 0 MiB used, free being
 * total - reserved + 1. (Used memory with no process listed means hidden processes, not idle.)
 */
export function idleEightGpuNode(): FakeScenario {
  const node = eightGpuNode();
  return { ...node, processes: [], gpus: node.gpus.map((gpu) => ({ ...gpu, usedMiB: 0, freeMiB: 143771 - 614 + 1 })) };
}

/** Pids of the live (not zombie) processes whose process group is `pgid`, read from `procRoot`.
 *  Zombies are left out: a dead child may wait for a reaper that this container's PID 1 is not. */
export function livePidsInGroup(pgid: number, procRoot = '/proc'): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync(procRoot).filter((name) => /^\d+$/.test(name))) {
    let stat: string;
    try {
      stat = readFileSync(join(procRoot, entry, 'stat'), 'utf8');
    } catch {
      continue; // it exited during the scan
    }
    // The command name is in parentheses and may contain anything: the fields start after the last ')'.
    const [state, , group] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(group) === pgid && state !== 'Z') pids.push(Number(entry));
  }
  return pids;
}

/** Polls `check` every `intervalMs` until it returns true; rejects after `timeoutMs`. */
export async function waitUntil(
  check: () => boolean,
  { timeoutMs = 10_000, intervalMs = 20, what = 'condition' } = {},
): Promise<void> {
  const giveUpAt = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > giveUpAt) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}
