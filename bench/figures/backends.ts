// Figure 6: what one snapshot's GPU queries cost the agent under each backend, side by side on the
// same node (bench/fake-smi.ts's 8 GPUs and 256 GPU processes, one scenario.json for both fakes):
// nvidia-smi (createNvidiaSmi running the fake executable, a Node script) and NVML (createNvmlDriver
// on the fake libnvidia-ml.so.1, a C library that answers from the same scenario.json). In this
// process, as node-snapshot asks them: queryGpus() and queryComputeApps() together (Promise.all).
//
// Per refresh:
//   - wall: from the two calls to both answers;
//   - CPU: this process's own CPU time over it (process.cpuUsage: every thread, koffi's and the
//     fake library's included; the nvidia-smi children's not, as they are other processes);
//   - block: the longest event-loop iteration during it, seen by a setImmediate probe (a chain of
//     immediates, each noting the time since the one before: an iteration that runs spawn, parsing
//     or many callbacks back to back shows as one long gap). The probe keeps the loop spinning, so
//     it runs on refreshes of its own, alternating with the timed ones.
// The backends alternate round by round, so the machine's load falls on both alike. The fakes are
// not the real tools: the rows compare the agent's own cost of each path, not drivers' times.
import { mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import { installFakeNvml } from '../../scripts/fake-nvml.js';
import type { GpuDriver } from '../../src/system/gpu-driver.js';
import { createNvidiaSmi } from '../../src/system/nvidia-smi.js';
import { createNvmlDriver } from '../../src/system/nvml/nvml-driver.js';
import { loadNvmlLibrary } from '../../src/system/nvml/nvml-library.js';
import { createFakeSmi } from '../fake-smi.js';
import type { BenchContext } from '../node-setup.js';
import { median, percentile, round, sortedCopy } from '../stats.js';

export const BACKENDS = ['nvidia-smi', 'nvml'] as const;
export type BackendName = (typeof BACKENDS)[number];
const WARMUP = 3;
/** Timed and probed refreshes of each backend (each that many times): a refresh of the fake nvidia-smi takes a few hundred ms here. */
const REFRESHES: Record<BackendName, number> = { 'nvidia-smi': 40, nvml: 200 };
const IDLE_WINDOWS = 20;
/** A query past this fails the figure: the fakes answer at once. */
const TIMEOUT_MS = 10_000;

export interface Distribution {
  medianMs: number;
  p99Ms: number;
  maxMs: number;
}

export interface BackendCost {
  backend: BackendName;
  source: string;
  refreshes: number;
  wall: Distribution;
  cpu: Distribution;
  block: Distribution;
  /**
   * The probe's floor: its longest gap over windows as long as this backend's median refresh with
   * no refresh running (IDLE_WINDOWS of them; the machine's own noise, GC and preemption).
   */
  idleBlock: Distribution;
}

export interface BackendsResult {
  gpus: number;
  processes: number;
  /** Size of the scenario.json both fakes read, in bytes. */
  scenarioBytes: number;
  backends: BackendCost[];
}

function distribution(values: number[]): Distribution {
  const sorted = sortedCopy(values);
  return { medianMs: round(median(values), 3), p99Ms: round(percentile(sorted, 99), 3), maxMs: round(sorted[sorted.length - 1] ?? Number.NaN, 3) };
}

type Answer = { gpus: number; apps: Array<{ gpuUuid: string; pid: number }> };

async function refresh(driver: GpuDriver): Promise<Answer> {
  const [listing, apps] = await Promise.all([driver.queryGpus(), driver.queryComputeApps()]);
  return { gpus: listing.gpus.length, apps };
}

async function timed(driver: GpuDriver): Promise<{ wallMs: number; cpuMs: number; answer: Answer }> {
  const cpu = process.cpuUsage();
  const started = performance.now();
  const answer = await refresh(driver);
  const wallMs = performance.now() - started;
  const used = process.cpuUsage(cpu);
  return { wallMs, cpuMs: (used.user + used.system) / 1000, answer };
}

/**
 * The longest event-loop iteration while `work` runs (started from an immediate, so its synchronous
 * part counts in the iteration it runs in), or with `work` null, over `idleMs` of probing alone.
 */
function probed(work: (() => Promise<unknown>) | null, idleMs = 0): Promise<number> {
  return new Promise((resolve, reject) => {
    let last = performance.now();
    let longest = 0;
    let done = false;
    let started = false;
    const tick = () => {
      const now = performance.now();
      longest = Math.max(longest, now - last);
      last = now;
      if (done) {
        resolve(longest);
        return;
      }
      if (!started) {
        started = true;
        const finished = work === null ? new Promise((r) => setTimeout(r, idleMs)) : work();
        finished.then(
          () => {
            done = true;
          },
          (err: unknown) => {
            done = true;
            reject(err);
          },
        );
      }
      setImmediate(tick);
    };
    setImmediate(tick);
  });
}

/** The same node under both: 8 GPUs, every process listed once, on the same GPU. */
function sameNode(a: Answer, b: Answer): string | null {
  if (a.gpus !== b.gpus) return `${a.gpus} GPUs against ${b.gpus}`;
  const key = (apps: Answer['apps']) => apps.map((app) => `${app.gpuUuid}/${app.pid}`).sort().join(',');
  if (key(a.apps) !== key(b.apps)) return `${a.apps.length} GPU processes against ${b.apps.length}, or not the same`;
  return null;
}

export async function backendsFigure(ctx: BenchContext, log: (line: string) => void): Promise<BackendsResult> {
  const silent = pino({ level: 'silent' });
  const dir = join(ctx.dir, 'backends');
  mkdirSync(dir, { recursive: true });
  const fake = createFakeSmi(dir, { gpus: ctx.layout.gpus, processes: ctx.layout.processes });
  const library = installFakeNvml(dir);
  const drivers: Record<BackendName, GpuDriver> = {
    'nvidia-smi': createNvidiaSmi({ path: fake.path, timeoutMs: TIMEOUT_MS, log: silent }),
    nvml: createNvmlDriver({ library: loadNvmlLibrary(library), timeoutMs: TIMEOUT_MS, log: silent, procRoot: '/proc' }),
  };
  try {
    // Warm-up: NVML's initialisation and the stride probe, the JIT, the fakes' first reads.
    const first: Partial<Record<BackendName, Answer>> = {};
    for (const backend of BACKENDS) for (let i = 0; i < WARMUP; i += 1) first[backend] = await refresh(drivers[backend]);
    const mismatch = sameNode(first['nvidia-smi']!, first.nvml!);
    if (mismatch) throw new Error(`the two backends do not see the same node (nvidia-smi, then NVML): ${mismatch}`);
    if (first.nvml!.apps.length !== ctx.layout.processes.length) throw new Error(`NVML listed ${first.nvml!.apps.length} GPU processes, the scenario has ${ctx.layout.processes.length}`);

    const samples = Object.fromEntries(BACKENDS.map((b) => [b, { wall: [] as number[], cpu: [] as number[], block: [] as number[] }])) as Record<
      BackendName,
      { wall: number[]; cpu: number[]; block: number[] }
    >;
    const rounds = Math.max(...BACKENDS.map((b) => REFRESHES[b]));
    for (let r = 0; r < rounds; r += 1) {
      for (const backend of BACKENDS) {
        // Spread the fewer refreshes of one backend evenly over the rounds.
        const due = Math.floor(((r + 1) * REFRESHES[backend]) / rounds) - Math.floor((r * REFRESHES[backend]) / rounds);
        for (let k = 0; k < due; k += 1) {
          const run = await timed(drivers[backend]);
          samples[backend].wall.push(run.wallMs);
          samples[backend].cpu.push(run.cpuMs);
          samples[backend].block.push(await probed(() => refresh(drivers[backend])));
        }
      }
    }
    const backends: BackendCost[] = [];
    for (const backend of BACKENDS) {
      const wall = distribution(samples[backend].wall);
      const idle: number[] = [];
      for (let i = 0; i < IDLE_WINDOWS; i += 1) idle.push(await probed(null, wall.medianMs));
      backends.push({
        backend,
        source: drivers[backend].source,
        refreshes: samples[backend].wall.length,
        wall,
        cpu: distribution(samples[backend].cpu),
        block: distribution(samples[backend].block),
        idleBlock: distribution(idle),
      });
    }
    for (const cost of backends) {
      log(
        `  ${cost.backend}: wall ${cost.wall.medianMs} ms (p99 ${cost.wall.p99Ms}), CPU ${cost.cpu.medianMs} ms (p99 ${cost.cpu.p99Ms}), ` +
          `longest block ${cost.block.medianMs} ms (p99 ${cost.block.p99Ms}; idle ${cost.idleBlock.medianMs}); ${cost.refreshes} refreshes`,
      );
    }
    return { gpus: first.nvml!.gpus, processes: first.nvml!.apps.length, scenarioBytes: statSync(join(dir, 'scenario.json')).size, backends };
  } finally {
    for (const driver of Object.values(drivers)) driver.killAll();
  }
}
