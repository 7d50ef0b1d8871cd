// The suite's GPU backend and what a test of the app expects that only one backend gives. `npm
// test` runs every test under nvidia-smi with coverage, then the tests of the app's answers again
// under the fake NVML (`test:nvml`: TEST_GPU_BACKEND=nvml; not NODECOMPUTE_*, which the service
// reads as its settings). A test states a backend-specific fact through here, so one test pins each
// backend's own answer; a test of one backend's own surface names that backend.
import type { App } from '../../src/app.js';
import type { QueryName } from '../../src/system/gpu-driver.js';
import type { FakeFailure, FakeNvidiaSmi, FakeNvml, FakeScenario } from './fake-nvidia-smi.js';

export type TestBackend = 'nvml' | 'nvidia-smi';

export const BACKEND: TestBackend = process.env.TEST_GPU_BACKEND === 'nvml' ? 'nvml' : 'nvidia-smi';
const nvml = BACKEND === 'nvml';

/** A listed process's smUtilPct where the scenario samples none: NVML samples it at 0; nvidia-smi has no such figure. */
export const UNSAMPLED_SM = nvml ? 0 : null;
/** /compute's xidErrors on a GPU with no Xid event: NVML counts them; nvidia-smi cannot. */
export const NO_XIDS = nvml ? 0 : null;
/** What the status page adds to a shard's memory on a GPU where it does no SM work: NVML measures it. */
export const IDLE_SM_NOTE = nvml ? ', SM 0% busy' : '';
/** A GPU's events where none came: NVML counts them; nvidia-smi cannot. */
export const NO_EVENTS = nvml ? { xid: {}, eccSingleBit: 0, eccDoubleBit: 0, lastXid: null } : null;

/** The doctor's row for the driver. */
export const DRIVER_CHECK = nvml ? 'nvml' : 'nvidia-smi';
/** The code of a query the driver answered with an error. */
export const DRIVER_FAILED = nvml ? 'NODECOMPUTE_NVML_FAILED' : 'NODECOMPUTE_NVIDIA_SMI_FAILED';
/** What the driver says when it cannot reach the kernel driver (the `driver-unreachable` failure). */
export const UNREACHABLE_SAID = nvml ? 'Driver Not Loaded' : "couldn't communicate with the NVIDIA driver";
/** What the driver says when it finds no GPU (the `no-devices` failure). */
export const NO_GPUS_SAID = nvml ? 'NVML lists no GPU' : 'No devices were found';
/** How the failure of a query that found no GPU starts. */
export const NO_GPUS_FAILED = nvml ? 'NVML lists no GPU' : 'nvidia-smi exited with code 6 and said: "No devices were found"';
/** The start of a stale snapshot's reason when a refresh failed with `driver-unreachable`. */
export const REFRESH_FAILED_SAID = nvml ? 'NVML initialisation' : 'nvidia-smi exited with code 9';

/** The NVML knobs after a driver reload: NVML enumerates the GPUs again only when initialised again; nvidia-smi does at each run. */
export const reloaded = (s: FakeScenario): FakeNvml => ({ ...s.nvml, generation: (s.nvml?.generation ?? 0) + 1 });

/**
 * The driver starts failing with `failure`. nvidia-smi fails each run with it. An initialised NVML
 * sees a driver reload (UNINITIALIZED on its next call), and initialising again fails with it.
 */
export function failDriver(fake: FakeNvidiaSmi, failure: FakeFailure): void {
  fake.update((s) => ({ ...s, failures: { all: failure }, nvml: reloaded(s) }));
}

/** Queries of `name` the app's driver has answered (a result or an error), read from its metrics. */
export async function driverQueries(app: App, name: QueryName): Promise<number> {
  const metric = app.services.metrics.registry.getSingleMetric('nodecompute_nvidia_smi_query_duration_seconds');
  const values = (await metric!.get()).values as Array<{ metricName?: string; labels: Record<string, unknown>; value: number }>;
  return values.find((value) => value.metricName?.endsWith('_count') && value.labels.query === name)?.value ?? 0;
}

/** Waits (up to 10 s) until the driver has answered `count` queries of `name`. */
export async function driverQueriesReach(app: App, name: QueryName, count: number): Promise<void> {
  const giveUpAt = Date.now() + 10_000;
  while ((await driverQueries(app, name)) < count) {
    if (Date.now() > giveUpAt) throw new Error(`timed out after 10000 ms waiting for ${count} ${name} queries of the driver`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
