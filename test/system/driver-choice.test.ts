// Which backend serves, and why it says so: NODECOMPUTE_BACKEND's three values against a library
// that loads and answers (the fake NVML), one that loads and fails, and one that is not there.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { pino } from 'pino';
import { chooseDriver, NVML_SONAME, type DriverSettings } from '../../src/system/driver-choice.js';
import type { QueryObservation } from '../../src/system/gpu-driver.js';
import { installFakeNvml } from '../../scripts/fake-nvml.js';
import { createFakeNvidiaSmi, eightGpuNode, type FakeScenario } from '../helpers/fake-nvidia-smi.js';

const log = pino({ level: 'silent' });

function node(t: Test, scenario: FakeScenario = eightGpuNode()): Omit<DriverSettings, 'backend'> & { missing: string } {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-choice-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const fake = createFakeNvidiaSmi(dir, scenario);
  return { nvmlLibrary: installFakeNvml(dir), nvidiaSmi: fake.path, smiTimeoutMs: 20_000, proc: '/proc', missing: join(dir, 'absent', NVML_SONAME) };
}

t.test('auto without a path asks the dynamic loader for the soname', async (t) => {
  // First in this file: once a fake is loaded, the loader answers the soname with it. This machine
  // has no NVIDIA driver, so the loader finds none (a GPU node would).
  const chosen = await chooseDriver({ ...node(t), backend: 'auto', nvmlLibrary: null }, log);
  t.match(chosen, { backend: 'nvidia-smi', why: /auto: libnvidia-ml\.so\.1 could not be loaded/ });
});

t.test('auto: NVML when the library loads and initialises, and says so', async (t) => {
  const settings = node(t);
  const chosen = await chooseDriver({ ...settings, backend: 'auto' }, log);
  t.equal(chosen.backend, 'nvml');
  t.equal(chosen.driver.source, settings.nvmlLibrary);
  t.match(chosen.why, /^auto: .*libnvidia-ml\.so\.1 loads and initialises \(driver 590\.48\.01\)$/);
  t.equal((await chosen.driver.queryGpus()).gpus.length, 8);
});

t.test('auto: nvidia-smi when the library is not there, or loads but does not answer; the reason names it', async (t) => {
  const settings = node(t);
  const missing = await chooseDriver({ ...settings, backend: 'auto', nvmlLibrary: settings.missing }, log);
  t.equal(missing.backend, 'nvidia-smi');
  t.equal(missing.driver.source, settings.nvidiaSmi);
  t.match(missing.why, /^auto: .*absent\/libnvidia-ml\.so\.1 could not be loaded: /);
  const unloaded = node(t, { ...eightGpuNode(), failures: { all: { kind: 'driver-unreachable' } } });
  const failing = await chooseDriver({ ...unloaded, backend: 'auto' }, log);
  t.equal(failing.backend, 'nvidia-smi');
  t.match(failing.why, /loads but does not answer: .*Driver Not Loaded/);
});

t.test('nvidia-smi named: nvidia-smi, without trying NVML', async (t) => {
  const chosen = await chooseDriver({ ...node(t), backend: 'nvidia-smi' }, log);
  t.same([chosen.backend, chosen.why], ['nvidia-smi', 'NODECOMPUTE_BACKEND is nvidia-smi']);
});

t.test('nvml named: NVML even when it fails; a library that cannot load makes every query a coded 503', async (t) => {
  const settings = node(t, { ...eightGpuNode(), failures: { all: { kind: 'driver-unreachable' } } });
  const failing = await chooseDriver({ ...settings, backend: 'nvml' }, log);
  t.same([failing.backend, failing.why], ['nvml', 'NODECOMPUTE_BACKEND is nvml']);
  await t.rejects(failing.driver.queryGpus(), { code: 'NODECOMPUTE_NVML_FAILED' });
  const observations: QueryObservation[] = [];
  const missing = await chooseDriver({ ...settings, backend: 'nvml', nvmlLibrary: settings.missing }, log, (o) => observations.push(o));
  t.equal(missing.backend, 'nvml');
  t.match(missing.why, /NODECOMPUTE_BACKEND is nvml, but .*could not be loaded.*NODECOMPUTE_NVML_LIBRARY/);
  const refused = { code: 'NODECOMPUTE_NVML_NOT_FOUND', statusCode: 503 };
  await t.rejects(missing.driver.queryGpus(), refused);
  await t.rejects(missing.driver.queryComputeApps(), refused);
  await t.rejects(missing.driver.queryVersion(), refused);
  t.same(
    observations.map((o) => [o.query, o.durationMs, o.outcome]),
    ['gpus', 'compute-apps', 'version'].map((query) => [query, null, 'NODECOMPUTE_NVML_NOT_FOUND']),
  );
  t.same([missing.driver.running, missing.driver.stopped], [0, false]);
  missing.driver.killAll();
  t.equal(missing.driver.stopped, true);
});
