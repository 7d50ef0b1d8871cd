// Figure 4: the cost of one snapshot refresh apart from nvidia-smi's own time, in this process. An
// NvidiaSmi that answers at once with prepared CSV (parsed on every call, as the real runner parses
// nvidia-smi's output) feeds createSnapshotTaker with the real /proc reader; the GPU processes are
// real PIDs (shard children and foreign pool processes), and the 64 shards' own PIDs are read too, as
// the registry asks. Each measurement is one take() plus attribute() for the 64 shards. Sizes are
// measured in rotating order, round after round, and the median of each size is reported.
//
// Linearity: going from one size to the next (4x the GPU processes each time) may cost at most
// 6x the time (1.5x the process ratio). Linear growth costs at most 4x (less, with the fixed cost of
// the 64 shard PIDs), quadratic growth 16x, so the criterion tells them apart with room for noise.
import { pino } from 'pino';
import { attribute } from '../../src/node-state/attribution.js';
import { createSnapshotTaker } from '../../src/node-state/node-snapshot.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import {
  COMPUTE_APPS_FIELDS,
  GPU_QUERY_FIELDS,
  parseComputeAppsCsv,
  parseGpuCsv,
  type NvidiaSmi,
} from '../../src/system/nvidia-smi.js';
import { createProcReader } from '../../src/system/procfs.js';
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
export const MAX_STEP_GROWTH = 6;

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
  /** Time ratio of each step (16->64, 64->256, 256->1024). */
  stepGrowth: number[];
  linear: boolean;
  pass: boolean;
}

function preparedSmi(csv: { gpus: string; apps: string }): NvidiaSmi {
  return {
    queryGpus: async () => parseGpuCsv(csv.gpus, GPU_QUERY_FIELDS),
    queryComputeApps: async () => parseComputeAppsCsv(csv.apps),
    queryVersion: async () => ({ smiVersion: '590.48.01', driverVersion: '590.48.01', cudaVersion: '13.1' }),
    killAll: () => undefined,
    running: 0,
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
      engine: 'other',
      graceMs: 15_000,
      registeredAt: now,
      identity: { pid: group.leader, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm },
    });
  }
  const interest = () => ({ pids: shards.map((shard) => shard.identity.pid), cgroups: [] });
  const takers = SIZES.map((size) => {
    const layout = nodeLayout(size, ctx.farm.shards, Math.min(ctx.farm.shards.length, size / 4), ctx.farm.foreign);
    return { size, take: createSnapshotTaker({ nvidiaSmi: preparedSmi(nodeCsv(layout)), proc, log: silent, interest }) };
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
  const linear = stepGrowth.every((growth) => growth <= MAX_STEP_GROWTH);
  const at256 = sizes.find((size) => size.processes === 256)!;
  for (const size of sizes) log(`  ${size.processes} processes: ${size.medianMs} ms (proc ${size.procMs} ms, attribute ${size.attributeMs} ms)`);
  return { sizes, stepGrowth, linear, pass: linear && at256.medianMs < TARGET_MS_AT_256 };
}
