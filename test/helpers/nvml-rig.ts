// The NVML backend over the fake libnvidia-ml.so.1 (test/fixtures/nvml), beside the nvidia-smi
// backend over the fake nvidia-smi, both driven by one scenario in a fresh directory.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import { pino, type Logger } from 'pino';
import type { GpuDriver, QueryObservation } from '../../src/system/gpu-driver.js';
import { createNvidiaSmi } from '../../src/system/nvidia-smi.js';
import { createNvmlDriver } from '../../src/system/nvml/nvml-driver.js';
import { loadNvmlLibrary, type NvmlLibrary } from '../../src/system/nvml/nvml-library.js';
import { installFakeNvml, type FakeNvmlVariant } from '../../scripts/fake-nvml.js';
import { createFakeNvidiaSmi, type FakeNvidiaSmi, type FakeScenario } from './fake-nvidia-smi.js';

export const silent = pino({ level: 'silent' });

/** What nvidia-smi cannot give: the fields only NVML fills, left out to compare both backends. */
export function sameAsSmi<T>(records: T): T {
  return JSON.parse(JSON.stringify(records, (key, value) => (key === 'events' || key === 'smUtilPct' || key === 'migDevices' || key === 'migInstance' ? undefined : value))) as T;
}

export type Rig = { fake: FakeNvidiaSmi; nvml: GpuDriver; smi: GpuDriver; observations: QueryObservation[]; dir: string };

export type RigOptions = {
  variant?: FakeNvmlVariant;
  timeoutMs?: number;
  log?: Logger;
  procRoot?: string;
  /** The calls the driver makes, given the fake's: to step in between two calls of one query. */
  calls?: (library: NvmlLibrary, fake: FakeNvidiaSmi) => NvmlLibrary['call'];
};

export function rig(t: Test, scenario: FakeScenario, options: RigOptions = {}): Rig {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-nvml-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const fake = createFakeNvidiaSmi(dir, scenario);
  const loaded = loadNvmlLibrary(installFakeNvml(dir, options.variant ?? 'current'));
  const library = options.calls === undefined ? loaded : { ...loaded, call: options.calls(loaded, fake) };
  const observations: QueryObservation[] = [];
  const timeoutMs = options.timeoutMs ?? 20_000;
  const nvml = createNvmlDriver({ library, timeoutMs, log: options.log ?? silent, procRoot: options.procRoot ?? '/proc', onQuery: (o) => observations.push(o) });
  return { fake, nvml, smi: createNvidiaSmi({ path: fake.path, timeoutMs, log: silent }), observations, dir };
}
