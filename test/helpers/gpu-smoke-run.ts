// Owns running scripts/gpu-smoke.sh in tests (gpu-smoke.test.ts, pack-smoke.test.ts): the fake
// node it checks, the stand-in CUDA process, the run itself, and reading its PASS/FAIL table. The
// script's NVML run loads the library beside the fake's scenario.json (NVML_LIBRARY): there only
// when the test put the fake NVML there (scripts/fake-nvml.ts), so that a machine's real
// libnvidia-ml.so.1 never answers for the fake node.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import { waitUntil, type FakeNvidiaSmi, type FakeScenario } from './fake-nvidia-smi.js';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const SCRIPT = join(ROOT, 'scripts', 'gpu-smoke.sh');
export const GPU0 = 'GPU-a44622e3-2296-6285-0a86-84d0f6c67900';
/** Stands in for the CUDA process: writes its pid (temp file, then rename), then sleeps. */
export const STAND_IN =
  'sleep 1; echo $$ > "$SMOKE_CUDA_PID_FILE.tmp"; mv "$SMOKE_CUDA_PID_FILE.tmp" "$SMOKE_CUDA_PID_FILE"; exec sleep 600';

/** One H200, idle: the node the script checks. */
export function node(): FakeScenario {
  return {
    driverVersion: '590.48.01',
    gpus: [{ index: 0, uuid: GPU0, name: 'NVIDIA H200', totalMiB: 143771, usedMiB: 0, freeMiB: 143157, reservedMiB: 614 }],
    processes: [],
  };
}

export interface SmokeRun {
  code: number | null;
  stdout: string;
  stderr: string;
  cudaPid: number;
}

/** Runs the script (the checkout's, or `script`); once the stand-in reports its pid, `onCuda` may make the fake list it. */
export async function runSmoke(
  t: Test,
  fake: FakeNvidiaSmi,
  args: string[],
  extraEnv: Record<string, string>,
  onCuda: (pid: number) => void,
  script = SCRIPT,
): Promise<SmokeRun> {
  const pidFile = join(fake.dir, 'cuda.pid');
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    NVIDIA_SMI: fake.path,
    NVML_LIBRARY: join(fake.dir, 'libnvidia-ml.so.1'),
    SMOKE_CUDA_CMD: STAND_IN,
    SMOKE_CUDA_PID_FILE: pidFile,
    SMOKE_CUDA_TIMEOUT_S: '60',
    // A loaded 2-core machine can take longer than the real run's 20 s to start the service.
    SMOKE_START_TIMEOUT_S: '120',
    ...extraEnv,
  };
  if (env.SMOKE_CUDA_CMD === '') delete env.SMOKE_CUDA_CMD;
  // The runner's loader hooks would slow every node the script starts, and coverage of the built
  // service would be mapped onto sources that may have changed since the build.
  delete env.NODE_OPTIONS;
  delete env.NODE_V8_COVERAGE;
  const child = spawn('bash', [script, ...args], { cwd: join(script, '..', '..'), env, stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  let done = false;
  void exited.then(() => (done = true));
  await waitUntil(() => done || /^\d+\n?$/.test(existsSync(pidFile) ? readFileSync(pidFile, 'utf8') : ''), {
    timeoutMs: 120_000,
    what: 'the stand-in CUDA process to write its pid',
  });
  const cudaPid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8')) : 0;
  if (cudaPid > 0) onCuda(cudaPid);
  const code = await exited;
  return { code, stdout, stderr, cudaPid };
}

/** The PASS/FAIL/SKIP table the script prints, by check name; with `results`, the rows of those results
 *  (INFO: a row that is no check, such as NVML not being there to compare). */
export function rows(stdout: string, results: readonly string[] = ['PASS', 'FAIL', 'SKIP']): Map<string, { result: string; detail: string }> {
  const table = new Map<string, { result: string; detail: string }>();
  const row = new RegExp(`^(${results.join('|')})\\s+(.+?)\\s{2,}(.*)$`);
  for (const line of stdout.split('\n')) {
    const match = row.exec(line);
    if (match) table.set(match[2] as string, { result: match[1] as string, detail: match[3] as string });
  }
  return table;
}

/** Every check, in the order the script runs them (with --record, and a CUDA process that reports its pid). */
export const CHECKS = [
  'service starts',
  '/readyz',
  '/gpus lists GPU 0',
  'register smoke-gpu',
  'record nvidia-smi outputs',
  'host PID namespace',
  'smoke-gpu starting -> ready',
  '/gpus: CUDA pid on GPU 0',
  '/shards/smoke-gpu/compute',
  '/gpus/foreign-memory',
  'smoke-cpu starting -> on-cpu',
  'DELETE shards',
  'service stops on SIGTERM',
];

/** The checks of the NVML run, after CHECKS, when NVML loads (else one INFO row, `nvml backend`). */
export const NVML_CHECKS = ['nvml backend', 'nvml: smoke-gpu ready', 'nvml: /gpus same GPUs', 'nvml: CUDA pid on GPU 0', 'nvml: service stops on SIGTERM'];
