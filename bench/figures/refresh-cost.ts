// Figure 4: the cost of one snapshot refresh apart from nvidia-smi's own time, in this process. An
// GpuDriver that answers at once with prepared CSV (parsed on every call, as the real runner parses
// nvidia-smi's output) feeds createSnapshotTaker with the real /proc reader; the GPU processes are
// real PIDs (shard children and foreign pool processes), and the 64 shards' own PIDs are read too, as
// the registry asks. Each measurement is one take() plus attribute() for the 64 shards. Sizes are
// measured in rotating order, round after round, and the median of each size is reported.
//
// Linearity: every size also pays a fixed cost (the 64 shard PIDs are read and matched at every
// size), so ms per process falls with size even when the growth is linear. The criterion compares
// marginal costs instead: the time each added GPU process costs from 256 to 1,024 must be at most
// MAX_MARGINAL_GROWTH (1.5x) the time each added process costs from 64 to 256. Linear growth gives
// 1x, quadratic growth 5x; the 16 -> 64 step is left out because its difference is within the noise.
import { pino } from 'pino';
import { attribute } from '../../src/node-state/attribution.js';
import { createSnapshotTaker } from '../../src/node-state/node-snapshot.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import {
  GPU_QUERY_FIELDS,
  parseComputeAppsCsv,
  parseGpuCsv,
} from '../../src/system/nvidia-smi.js';
import type { GpuDriver } from '../../src/system/gpu-driver.js';
import { createProcReader, type ProcReader } from '../../src/system/procfs.js';
import { nodeCsv, nodeLayout } from '../fake-smi.js';
import type { BenchContext } from '../node-setup.js';
import { median, round } from '../stats.js';

export const SIZES = [16, 64, 256, 1024] as const;
const WARMUP_ROUNDS = 5;
const ROUNDS = 25;
/** Time bound: measuring stops after this long once MIN_ROUNDS rounds are in. */
const MAX_MS = 20_000;
const MIN_ROUNDS = 7;
export const TARGET_MS_AT_256 = 5;
export const MAX_MARGINAL_GROWTH = 1.5;

export interface SizeResult {
  processes: number;
  medianMs: number;
  /** Median of /proc reading time alone (timings.procMs of the snapshot). */
  procMs: number;
  attributeMs: number;
  usPerProcess: number;
}

export interface RefreshCostResult {
  sizes: SizeResult[];
  /** Time ratio of each step (16->64, 64->256, 256->1024), for reference. */
  stepGrowth: number[];
  /** us per added process from 64 to 256 and from 256 to 1,024. */
  marginalUs: { from64To256: number; from256To1024: number };
  /** marginalUs.from256To1024 / marginalUs.from64To256: the linearity figure. */
  marginalGrowth: number;
  linear: boolean;
  pass: boolean;
}

function preparedSmi(csv: { gpus: string; apps: string }): GpuDriver {
  return {
    backend: 'nvidia-smi',
    source: 'prepared CSV',
    queryGpus: async () => ({ gpus: parseGpuCsv(csv.gpus, GPU_QUERY_FIELDS), unreachable: [] }),
    queryComputeApps: async () => parseComputeAppsCsv(csv.apps),
    queryVersion: async () => ({ smiVersion: '590.48.01', driverVersion: '590.48.01', cudaVersion: '13.1' }),
    killAll: () => undefined,
    running: 0,
    stopped: false,
  };
}

export async function refreshCostFigure(ctx: BenchContext, log: (line: string) => void): Promise<RefreshCostResult> {
  const silent = pino({ level: 'silent' });
  const proc = createProcReader({ root: '/proc', log: silent });
  const now = Date.now();
  const shards: ShardRecord[] = [];
  for (const [i, group] of ctx.farm.shards.entries()) {
    const stat = await proc.readStat(group.leader);
    if (!stat) throw new Error(`shard process ${group.leader} is gone`);
    shards.push({
      id: ctx.shardIds[i]!,
      pid: group.leader,
      cgroup: null,
      gpus: [ctx.layout.shardGpu[i]!],
      engine: group.engine,
      graceMs: 15_000,
      registeredAt: now,
      identity: { pid: group.leader, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm },
    });
  }
  const runnerHosts = shards.filter((shard) => shard.engine === 'ollama').map((shard) => ({ pid: shard.identity.pid }));
  const interest = () => ({ pids: shards.map((shard) => shard.identity.pid), cgroups: [], runnerHosts });
  const readers: ProcReader[] = [];
  const takers = SIZES.map((size) => {
    const layout = nodeLayout(size, ctx.farm.shards, Math.min(ctx.farm.shards.length, size / 4), ctx.farm.foreign);
    // Each size is its own node, with its own reader: the reader keeps each process's /proc file open
    // from one refresh to the next, as the service does for a node whose processes live on.
    const reader = createProcReader({ root: '/proc', log: silent });
    readers.push(reader);
    return { size, take: createSnapshotTaker({ driver: preparedSmi(nodeCsv(layout)), proc: reader, log: silent, interest, now: Date.now }) };
  });
  const samples = new Map<number, Array<{ total: number; proc: number; attribute: number }>>(SIZES.map((size) => [size, []]));
  const started = performance.now();
  for (let r = 0; r < WARMUP_ROUNDS + ROUNDS; r += 1) {
    if (r >= WARMUP_ROUNDS + MIN_ROUNDS && performance.now() - started > MAX_MS) break;
    for (let k = 0; k < takers.length; k += 1) {
      const { size, take } = takers[(r + k) % takers.length]!;
      const before = performance.now();
      const snapshot = await take();
      const taken = performance.now();
      const attribution = attribute(snapshot, shards);
      const done = performance.now();
      if (attribution.ownerByPid.size !== Math.min(ctx.farm.shards.length, size / 4)) {
        throw new Error(`attribution found ${attribution.ownerByPid.size} shard processes among ${size}; the setup is wrong`);
      }
      if (r >= WARMUP_ROUNDS) samples.get(size)!.push({ total: done - before, proc: snapshot.timings.procMs, attribute: done - taken });
    }
  }
  for (const reader of readers) reader.release();
  const sizes = SIZES.map((size) => {
    const runs = samples.get(size)!;
    const medianMs = median(runs.map((run) => run.total));
    return {
      processes: size,
      medianMs: round(medianMs, 3),
      procMs: round(median(runs.map((run) => run.proc)), 3),
      attributeMs: round(median(runs.map((run) => run.attribute)), 3),
      usPerProcess: round((medianMs * 1000) / size, 1),
    };
  });
  const stepGrowth = sizes.slice(1).map((size, i) => round(size.medianMs / sizes[i]!.medianMs, 2));
  const ms = (n: number) => sizes.find((size) => size.processes === n)!.medianMs;
  const marginal = (from: number, to: number) => ((ms(to) - ms(from)) * 1000) / (to - from);
  const marginalUs = { from64To256: round(marginal(64, 256), 1), from256To1024: round(marginal(256, 1024), 1) };
  const marginalGrowth = round(marginal(256, 1024) / marginal(64, 256), 2);
  const linear = marginalGrowth <= MAX_MARGINAL_GROWTH;
  const at256 = sizes.find((size) => size.processes === 256)!;
  for (const size of sizes) log(`  ${size.processes} processes: ${size.medianMs} ms (proc ${size.procMs} ms, attribute ${size.attributeMs} ms)`);
  return { sizes, stepGrowth, marginalUs, marginalGrowth, linear, pass: linear && at256.medianMs < TARGET_MS_AT_256 };
}
