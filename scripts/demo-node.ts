// Owns the demo node behind `npm run demo`: the real service on a simulated 8x H200 node. The GPUs
// come from the fake nvidia-smi (test/fixtures/bin/nvidia-smi, plain JS, found from the repo root at
// run time) reading a scenario file in a temp dir; the shards are REAL processes (detached process
// groups, each with a `sleep` child that the scenario lists on GPUs), so /proc, process groups,
// attribution and readiness all run for real. One shard per state, a stray GPU and foreign memory,
// so every part of the status page and the API shows something. Tests start it on port 0 and stop it.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { Logger } from 'pino';
import { buildApp, type App } from '../src/app.js';
import { defaultConfig } from '../src/config.js';
import type { ReadinessState } from '../src/shards/verdict.js';
import { H200_BUS, H200_UUIDS, installFakeNvidiaSmi } from './fake-nvidia-smi.js';

const TOTAL_MIB = 143771;
const RESERVED_MIB = 614;
/** What nvidia-smi's memory.used shows beyond the listed processes on an H100/H200 (DESIGN.md 5). */
const DRIVER_MIB = 9;
const HOUR_MS = 3_600_000;


/**
 * What llama-server b9692 printed when its CUDA build could not load cudart: device_info lists the
 * CPU alone. Copied from
 * test/fixtures/samples/llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt.
 */
export const CUDA_MISSING_LOG = `0.00.230.154 I device_info:
0.00.230.158 I   - CPU     : 13th Gen Intel(R) Core(TM) i9-13900HX (32487 MiB, 22489 MiB free)
0.00.230.204 I system_info: n_threads = 24 (n_threads_batch = 24) / 32 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | FMA = 1 | OPENMP = 1 |
0.00.235.799 I common_init_result: fitting params to device memory ...
0.00.755.448 I common_params_fit_impl: projected to use 3131 MiB of host memory vs. 32487 MiB of total host memory
`;

export interface DemoShard {
  id: string;
  /** The state the shard is built to show. */
  state: ReadinessState;
  /** One line for the operator: what was set up and why the state follows. */
  explanation: string;
}

export interface DemoNode {
  app: App;
  /** False when some shard did not reach its state within the wait (a very slow machine). */
  settled: boolean;
  /** http://HOST:PORT */
  url: string;
  /** The temp dir holding the state file, the scenario and the fake's wrapper. */
  dir: string;
  /** The fake nvidia-smi reads it at every call: edit it to change the node live. */
  scenarioPath: string;
  shards: DemoShard[];
  /** Process group ids of every process the demo started. */
  groups: number[];
  /** Kills every process group the demo started, synchronously (for process.on('exit')). */
  killProcesses(): void;
  /** Kills the processes, closes the server, removes the temp dir. */
  stop(): Promise<void>;
}

export interface DemoOptions {
  host: string;
  /** 0 picks a free port. */
  port: number;
  logger: Logger;
}

/** SIGKILLs a process group; false when it is already gone. */
export function killGroup(pgid: number): boolean {
  try {
    process.kill(-pgid, 'SIGKILL');
    return true;
  } catch {
    return false;
  }
}

interface Group {
  /** The leader: its pid is the group id, and the pid a shard registers. */
  pid: number;
  /** Its `sleep` children, the "engine" processes nvidia-smi lists. */
  members: number[];
}

/** A detached `sh` (its own process group) with `children` sleeping children; resolves with their pids. */
async function spawnGroup(children: number, track: number[]): Promise<Group> {
  const script = `${'sleep 86400 & echo $!; '.repeat(children)}wait`;
  const child = spawn('sh', ['-c', script], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  track.push(child.pid!);
  const members: number[] = [];
  for await (const line of createInterface({ input: child.stdout! })) {
    members.push(Number(line));
    if (members.length === children) break;
  }
  child.stdout!.destroy();
  return { pid: child.pid!, members };
}

interface ProcessRow {
  gpu: number;
  pid: number;
  name: string;
  usedMiB: number;
}

function scenario(processes: ProcessRow[]) {
  return {
    driverVersion: '590.48.01',
    cudaVersion: '13.1',
    gpus: H200_UUIDS.map((uuid, index) => {
      const used = processes.filter((row) => row.gpu === index).reduce((sum, row) => sum + row.usedMiB, 0);
      const usedMiB = used === 0 ? 0 : used + DRIVER_MIB;
      return {
        index,
        uuid,
        name: 'NVIDIA H200',
        busId: `00000000:${H200_BUS[index]}:00.0`,
        totalMiB: TOTAL_MIB,
        usedMiB,
        freeMiB: TOTAL_MIB - RESERVED_MIB - usedMiB,
        reservedMiB: RESERVED_MIB,
      };
    }),
    processes: processes.map((row) => ({ gpuUuid: H200_UUIDS[row.gpu], pid: row.pid, name: row.name, usedMiB: row.usedMiB })),
  };
}

/** Polls the shards until each shows its state (registration and the kill take a snapshot or two to show). */
async function settle(app: App, shards: DemoShard[], timeoutMs: number): Promise<boolean> {
  const wanted = JSON.stringify(shards.map((shard) => [shard.id, shard.state]));
  const giveUpAt = Date.now() + timeoutMs;
  let seen = '';
  while (seen !== wanted && Date.now() < giveUpAt) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    const { states } = await app.services.shards.states(app.services.probeBudgetMs);
    seen = JSON.stringify(states.map((state) => [state.shard.id, state.readiness.state]));
  }
  return seen === wanted;
}

export async function startDemoNode(options: DemoOptions): Promise<DemoNode> {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-demo-'));
  const fake = installFakeNvidiaSmi(dir, scenario([]));
  const scenarioPath = join(dir, 'scenario.json');
  const config = defaultConfig({
    host: options.host,
    port: options.port,
    // The simulated node, even on a machine whose driver NVML would find.
    backend: 'nvidia-smi',
    nvidiaSmi: fake.path,
    stateFile: join(dir, 'state', 'shards.json'),
    logLevel: 'warn',
  });
  const groups: number[] = [];
  const killProcesses = () => {
    for (const pgid of groups) killGroup(pgid);
  };
  const app = await buildApp(config, { logger: options.logger });
  const stop = async () => {
    killProcesses();
    await app.close();
    rmSync(dir, { recursive: true, force: true });
  };
  let url: string;
  try {
    url = await app.listen({ host: config.host, port: config.port });
  } catch (err) {
    await stop();
    throw err;
  }

  const [llama70b, qwen, mistral, phi, llama8b, gemma, granite, notebook] = await Promise.all(
    [2, 1, 1, 1, 1, 1, 1, 1].map((children) => spawnGroup(children, groups)),
  );
  fake.setScenario(
      scenario([
        { gpu: 0, pid: llama70b!.members[0]!, name: '/usr/bin/python3 -m vllm.entrypoints.openai.api_server', usedMiB: 128_422 },
        { gpu: 1, pid: llama70b!.members[1]!, name: 'ray::RayWorkerWrapper', usedMiB: 128_422 },
        { gpu: 2, pid: qwen!.members[0]!, name: '/opt/llama.cpp/build/bin/llama-server', usedMiB: 67_214 },
        { gpu: 3, pid: qwen!.members[0]!, name: '/opt/llama.cpp/build/bin/llama-server', usedMiB: 11_502 },
        { gpu: 4, pid: notebook!.members[0]!, name: '/opt/conda/bin/python3 -m ipykernel_launcher', usedMiB: 24_576 },
        { gpu: 7, pid: granite!.members[0]!, name: '/opt/llama.cpp/build/bin/llama-server', usedMiB: 9_126 },
        { gpu: 7, pid: 1_758_887, name: '[Not Found]', usedMiB: 58_060 },
      ]),
  );

  const shards: DemoShard[] = [
    {
      id: 'gemma-9b',
      state: 'exited',
      explanation: "registered on GPU 7, then its process group was killed: the shard's process is gone.",
    },
    {
      id: 'granite-8b',
      state: 'stopped',
      explanation: `llama.cpp on GPU 7, holding 8.9 GiB, then its process group sent SIGSTOP (what Ctrl-Z in its terminal does): it keeps its memory but answers nothing. \`kill -CONT -- -${granite!.pid}\` (the whole group) makes it ready.`,
    },
    {
      id: 'llama-70b',
      state: 'ready',
      explanation: 'vLLM, tensor parallel 2 on GPUs 0 and 1: two children of its process group hold 125 GiB on each.',
    },
    {
      id: 'llama-8b',
      state: 'on-cpu',
      explanation: "llama.cpp given GPU 6 (1 h grace); its log (b9692, cudart missing) lists only the CPU, so the engine's own account makes it on-cpu at once.",
    },
    {
      id: 'mistral-7b',
      state: 'starting',
      explanation: 'given GPU 4 with a 1 h grace and holding nothing there yet (a foreign notebook holds 24 GiB of it): on-cpu after an hour.',
    },
    {
      id: 'phi-3-mini',
      state: 'on-cpu',
      explanation: 'given GPU 5 with no grace (graceMs 0) and holding nothing on it: a shard that silently fell back to the CPU.',
    },
    {
      id: 'qwen-32b',
      state: 'ready',
      explanation: 'llama.cpp given GPU 2 and holding it, but also holding GPU 3, which it was not given: ready, with a stray-GPU warning.',
    },
  ];
  // Through the shard service, as PUT /shards/:id and POST /shards/:id/engine-output do: a refusal throws.
  const { shards: service } = app.services;
  await service.register('llama-70b', { pid: llama70b!.pid, gpus: [0, 1], engine: 'vllm' });
  await service.register('qwen-32b', { pid: qwen!.pid, gpus: [2], engine: 'llama.cpp' });
  await service.register('mistral-7b', { pid: mistral!.pid, gpus: [4], engine: 'vllm', graceMs: HOUR_MS });
  await service.register('phi-3-mini', { pid: phi!.pid, gpus: [5], graceMs: 0 });
  await service.register('llama-8b', { pid: llama8b!.pid, gpus: [6], engine: 'llama.cpp', graceMs: HOUR_MS });
  service.appendEngineOutput('llama-8b', CUDA_MISSING_LOG);
  await service.register('gemma-9b', { pid: gemma!.pid, gpus: [7] });
  killGroup(gemma!.pid);
  await service.register('granite-8b', { pid: granite!.pid, gpus: [7], engine: 'llama.cpp' });
  process.kill(-granite!.pid, 'SIGSTOP');
  const settled = await settle(app, shards, 30_000);

  return {
    app,
    settled,
    url,
    dir,
    scenarioPath,
    shards,
    groups,
    killProcesses,
    stop,
  };
}
