// Owns installing the fake nvidia-smi (test/fixtures/bin/nvidia-smi, plain JS) for anything that
// runs the service without a GPU: the tests, the demo node and the benchmarks. Each install lives
// in its own directory: a scenario file the fake reads at every call, an invocation log, and a
// /bin/sh wrapper named `nvidia-smi` that carries those two paths (the service spawns nvidia-smi
// with its own environment, and several fakes may exist in one process). `exec` keeps the wrapper's
// pid, so the fake leads the process group the runner creates and a group kill reaches it.
import { chmodSync, existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The UUIDs of the 8x H200 node in test/fixtures/samples/nvsmi-8xH200-container_query-gpu_and_compute-apps_not-found.txt. */
export const H200_UUIDS = [
  'GPU-a44622e3-2296-6285-0a86-84d0f6c67900',
  'GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb',
  'GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90',
  'GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092',
  'GPU-cb449822-5571-be90-8303-e7558da3ea66',
  'GPU-8e137fa6-c3d9-6980-7733-0d8df296756e',
  'GPU-d9337494-6060-1440-039f-4654245b5764',
  'GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72',
] as const;
/** Their PCI bus numbers, as `00000000:<bus>:00.0`. */
export const H200_BUS = ['18', '2A', '3A', '5D', '9A', 'AB', 'BA', 'DB'] as const;

/** The fake executable, from scripts/ (TypeScript run by tests) or dist/scripts/ (compiled). */
export function fakeNvidiaSmiBin(from: string = import.meta.url): string {
  for (const up of ['../', '../../']) {
    const path = fileURLToPath(new URL(`${up}test/fixtures/bin/nvidia-smi`, from));
    if (existsSync(path)) return path;
  }
  throw new Error(`The fake nvidia-smi (test/fixtures/bin/nvidia-smi) is not beside ${fileURLToPath(from)}: run this from a checkout of the repository.`);
}

export interface FakeLogEntry {
  type: string;
  [field: string]: unknown;
}

export interface InstalledFake<S> {
  /** The executable to pass as the nvidia-smi path. */
  path: string;
  dir: string;
  /** Replaces the scenario atomically (temp + rename): a fake reading concurrently never sees half a file. */
  setScenario(scenario: S): void;
  /** Every line of the fake's log: invocations, and grandchildren it spawned. */
  log(): FakeLogEntry[];
}

function shellQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

let tempCounter = 0;

/** Installs a fake nvidia-smi in `dir` (which must exist), answering from `scenario`. */
export function installFakeNvidiaSmi<S>(dir: string, scenario: S): InstalledFake<S> {
  const path = join(dir, 'nvidia-smi');
  const scenarioPath = join(dir, 'scenario.json');
  const logPath = join(dir, 'invocations.jsonl');
  const setScenario = (next: S) => {
    tempCounter += 1;
    const temp = `${scenarioPath}.${process.pid}.${tempCounter}.tmp`;
    writeFileSync(temp, JSON.stringify(next, null, 2));
    renameSync(temp, scenarioPath);
  };
  setScenario(scenario);
  writeFileSync(
    path,
    [
      '#!/bin/sh',
      '# Written by scripts/fake-nvidia-smi.ts. NODE_OPTIONS is dropped so a test runner does not load',
      '# its hooks (coverage, TypeScript) into every fake call.',
      'unset NODE_OPTIONS',
      `FAKE_NVIDIA_SMI_SCENARIO=${shellQuote(scenarioPath)}; export FAKE_NVIDIA_SMI_SCENARIO`,
      `FAKE_NVIDIA_SMI_LOG=${shellQuote(logPath)}; export FAKE_NVIDIA_SMI_LOG`,
      `exec ${shellQuote(process.execPath)} ${shellQuote(fakeNvidiaSmiBin())} "$@"`,
      '',
    ].join('\n'),
  );
  chmodSync(path, 0o755);
  return {
    path,
    dir,
    setScenario,
    log: () =>
      existsSync(logPath)
        ? readFileSync(logPath, 'utf8')
            .split('\n')
            .filter((line) => line !== '')
            .map((line) => JSON.parse(line) as FakeLogEntry)
        : [],
  };
}
