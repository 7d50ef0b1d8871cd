// A two-H200 node for the shards route tests: the fake's scenario with chosen processes on it, and
// the app built on it with TTL 0 and max-stale 0 and a clock the test moves, so every request after
// a clock step takes a fresh snapshot and each step of a timeline is deterministic.
import type { Test } from 'tap';
import { buildTestApp, manualClock } from './app.js';
import type { FakeProcess, FakeScenario } from './fake-nvidia-smi.js';

export const UUIDS = ['GPU-11111111-0000-0000-0000-000000000000', 'GPU-22222222-0000-0000-0000-000000000000'];

export function twoGpuNode(processes: FakeProcess[] = []): FakeScenario {
  return {
    gpus: UUIDS.map((uuid, index) => ({
      index,
      uuid,
      name: 'NVIDIA H200',
      totalMiB: 143771,
      usedMiB: 18 + processes.filter((p) => p.gpuUuid === uuid).reduce((sum, p) => sum + (typeof p.usedMiB === 'number' ? p.usedMiB : 0), 0),
      freeMiB: 100000,
      reservedMiB: 614,
    })),
    processes,
  };
}

export async function setup(t: Test, scenario = twoGpuNode()) {
  const clock = manualClock();
  const built = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  const step = (ms = 1) => clock.advance(ms);
  const setProcesses = (processes: FakeProcess[]) => built.fake.setScenario(twoGpuNode(processes));
  return { ...built, clock, step, setProcesses };
}
