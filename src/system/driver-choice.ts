// Picks the backend the snapshots come from (NODECOMPUTE_BACKEND): NVML when libnvidia-ml.so.1
// loads and initialises, else nvidia-smi (auto); or the one named. The choice is made once, at
// start, and its reason is kept for the log and /doctor.
import type { Logger } from 'pino';
import { NvmlNotFoundError } from '../errors.js';
import type { Backend, GpuDriver, QueryName, QueryObservation } from './gpu-driver.js';
import { createNvidiaSmi } from './nvidia-smi.js';
import { loadNvmlLibrary } from './nvml/nvml-library.js';
import { createNvmlDriver } from './nvml/nvml-driver.js';

export const BACKENDS = ['auto', 'nvml', 'nvidia-smi'] as const;
export type BackendSetting = (typeof BACKENDS)[number];

/** The library's soname: the dynamic loader finds it through LD_LIBRARY_PATH and the ld.so cache. */
export const NVML_SONAME = 'libnvidia-ml.so.1';

export type DriverSettings = { backend: BackendSetting; nvmlLibrary: string | null; nvidiaSmi: string; smiTimeoutMs: number; proc: string };
export type DriverChoice = { driver: GpuDriver; backend: Backend; why: string };

/** NVML named but not loadable: every query fails with why, as a missing nvidia-smi does. */
function unloadable(source: string, error: Error, onQuery?: (o: QueryObservation) => void): GpuDriver {
  const refuse = (query: QueryName) => () => {
    onQuery?.({ query, durationMs: null, outcome: 'NODECOMPUTE_NVML_NOT_FOUND' });
    return Promise.reject(error);
  };
  const driver = {
    backend: 'nvml' as const,
    source,
    queryGpus: refuse('gpus'),
    queryComputeApps: refuse('compute-apps'),
    queryVersion: refuse('version'),
    killAll: () => void (driver.stopped = true),
    stopped: false,
    running: 0,
  };
  return driver;
}

export async function chooseDriver(settings: DriverSettings, log: Logger, onQuery?: (o: QueryObservation) => void): Promise<DriverChoice> {
  const smi = (why: string): DriverChoice => ({
    driver: createNvidiaSmi({ path: settings.nvidiaSmi, timeoutMs: settings.smiTimeoutMs, log: log.child({ component: 'nvidia-smi' }), onQuery }),
    backend: 'nvidia-smi',
    why,
  });
  if (settings.backend === 'nvidia-smi') return smi('NODECOMPUTE_BACKEND is nvidia-smi');
  const source = settings.nvmlLibrary ?? NVML_SONAME;
  let library;
  try {
    library = loadNvmlLibrary(source);
  } catch (err) {
    const said = `${source} could not be loaded: ${(err as Error).message}`;
    if (settings.backend === 'auto') return smi(`auto: ${said}`);
    const fix = 'In a container, use the NVIDIA runtime with NVIDIA_DRIVER_CAPABILITIES=utility; or set NODECOMPUTE_NVML_LIBRARY to its path.';
    const error = new NvmlNotFoundError(`NODECOMPUTE_BACKEND is nvml, but ${said}. Without it nodecompute cannot see the GPUs. ${fix}`);
    return { driver: unloadable(source, error, onQuery), backend: 'nvml', why: error.message };
  }
  const driver = createNvmlDriver({ library, timeoutMs: settings.smiTimeoutMs, log: log.child({ component: 'nvml' }), procRoot: settings.proc, onQuery });
  if (settings.backend === 'nvml') return { driver, backend: 'nvml', why: 'NODECOMPUTE_BACKEND is nvml' };
  try {
    const version = await driver.queryVersion();
    return { driver, backend: 'nvml', why: `auto: ${source} loads and initialises (driver ${version.driverVersion})` };
  } catch (err) {
    return smi(`auto: ${source} loads but does not answer: ${(err as Error).message}`);
  }
}
