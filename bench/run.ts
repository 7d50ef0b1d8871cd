// `npm run bench`: measures nodecompute's performance figures in one run and prints them as a table
// (figure, measured, target, pass/fail; `info` for a row without a target); writes every number to
// bench/results/latest.json. The figures run one after another, never overlapping, against servers
// in child processes on 127.0.0.1 (or in this process, for the refresh cost). Pass figure names as
// arguments to run only those (footprint, footprint-nvml, floor, single-flight, slow-probe, refresh-cost,
// memory, backends); BENCH_FOOTPRINT_S shortens both footprints' measured duration. Exits 1 when a figure could not be
// measured at all; a figure that misses its target is reported, not an error.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nodeLayout } from './fake-smi.js';
import { backendsFigure, type BackendCost, type BackendsResult } from './figures/backends.js';
import { CPU_TARGET_PCT, FLAT_FACTOR as FOOTPRINT_FLAT_FACTOR, footprintFigure, footprintSeconds, RSS_TARGET_MB as FOOTPRINT_RSS_MB, type FootprintResult } from './figures/footprint.js';
import { floorFigure, type FloorResult } from './figures/floor.js';
import { memoryFigure, FLAT_FACTOR, RSS_TARGET_MB, type MemoryResult } from './figures/memory.js';
import { MAX_MARGINAL_GROWTH, refreshCostFigure, TARGET_MS_AT_256, type RefreshCostResult } from './figures/refresh-cost.js';
import { singleFlightFigure, type SingleFlightResult } from './figures/single-flight.js';
import { P99_TARGET_MS, slowProbeFigure, type SlowProbeResult } from './figures/slow-probe.js';
import { shardId, type BenchContext } from './node-setup.js';
import { startProcessFarm } from './processes.js';
import { formatTable, loadAverage, machine, type Row } from './report.js';
import { round } from './stats.js';

const SHARDS = 64;
/** Enough foreign processes for the largest refresh-cost size (1,024 GPU processes, 64 of them shards'). */
const FOREIGN = 960;
const RESULTS = fileURLToPath(new URL('../../bench/results/latest.json', import.meta.url));

const verdict = (pass: boolean): Row['result'] => (pass ? 'pass' : 'FAIL');

function footprintRows(r: FootprintResult): Row[] {
  const invalid = r.invalid ? ` INVALID: ${r.invalid}` : '';
  const windows = r.cpuWindowsPct.length > 0 ? `${Math.min(...r.cpuWindowsPct)}-${Math.max(...r.cpuWindowsPct)}% per 15 s; ` : '';
  // The nvidia-smi rows keep their names; the NVML rows say so.
  const nvml = r.backend === 'nvml';
  const name = (what: string) => (nvml ? `1. NVML: ${what}` : `1. ${what}`);
  const queries = r.driverQueries === null ? '' : `${r.driverQueries} GPU queries`;
  return [
    {
      figure: name('agent CPU at typical load (server process)'),
      measured: `${r.cpuPct}% of one core (${windows}${r.durationS} s, ${r.requestsPerSecond} req/s; load average ${r.loadAverage.join(' / ')})${invalid}`,
      target: `< ${CPU_TARGET_PCT}%`,
      result: verdict(r.cpuPass),
    },
    nvml
      ? {
          figure: name('its GPU queries (the fake library, in-process)'),
          measured: `${queries || 'count not in /metrics'}, counted in the CPU above; children ${r.childCpuPct}% of one core (${r.smiRuns} nvidia-smi runs)`,
          target: '-',
          result: 'info',
        }
      : {
          figure: name('its nvidia-smi children (the fake: a Node script)'),
          measured: `${r.childCpuPct}% of one core (${r.smiRuns} runs, ${r.childMsPerRun ?? '-'} ms each)`,
          target: '-',
          result: 'info',
        },
    {
      figure: name('agent RSS at typical load (largest sample)'),
      measured: `${r.rssMaxMB} MB${invalid}`,
      target: `< ${FOOTPRINT_RSS_MB} MB`,
      result: verdict(r.rssPass),
    },
    {
      figure: name('agent RSS flat (last vs first quarter, medians)'),
      measured: `${r.rssFirstQuarterMB} -> ${r.rssLastQuarterMB} MB (${r.rssGrowthPct >= 0 ? '+' : ''}${r.rssGrowthPct}%; V8 heap used ${r.heapUsedMB.join(' -> ')} MB)${invalid}`,
      target: `<= +${Math.round((FOOTPRINT_FLAT_FACTOR - 1) * 100)}%`,
      result: verdict(r.flat),
    },
    {
      figure: name('probe answers at typical load'),
      measured:
        `latency p50 ${r.probe.p50Ms}, p99 ${r.probe.p99Ms}, max ${r.probe.maxMs} ms; ` +
        `age (arrival - observedAt) p50 ${r.probe.ageP50Ms}, p99 ${r.probe.ageP99Ms}, max ${r.probe.ageMaxMs} ms`,
      target: '-',
      result: 'info',
    },
  ];
}

/** Milliseconds to two significant decimals below 10 ms, one above. */
const ms = (value: number) => round(value, value < 10 ? 2 : 1);

const BACKEND_LABEL: Record<BackendCost['backend'], string> = { 'nvidia-smi': 'nvidia-smi', nvml: 'NVML' };

function backendsRows(r: BackendsResult): Row[] {
  const side = (pick: (cost: BackendCost) => { medianMs: number; p99Ms: number }) =>
    r.backends.map((cost) => `${BACKEND_LABEL[cost.backend]} ${ms(pick(cost).medianMs)} (p99 ${ms(pick(cost).p99Ms)})`).join('; ');
  const counts = r.backends.map((cost) => `${cost.refreshes} ${BACKEND_LABEL[cost.backend]}`).join(', ');
  return [
    {
      figure: '6. GPU queries per refresh, wall (nvidia-smi; NVML)',
      measured: `${side((cost) => cost.wall)} ms; ${counts} refreshes, ${r.gpus} GPUs, ${r.processes} GPU procs`,
      target: '-',
      result: 'info',
    },
    {
      figure: '6. agent CPU per refresh (its own, all threads)',
      measured: `${side((cost) => cost.cpu)} ms`,
      target: '-',
      result: 'info',
    },
    {
      figure: '6. longest event-loop block per refresh',
      measured: `${side((cost) => cost.block)} ms (no refresh, as long: ${r.backends.map((cost) => ms(cost.idleBlock.medianMs)).join(' / ')} ms)`,
      target: '-',
      result: 'info',
    },
  ];
}

function singleFlightRows(r: SingleFlightResult): Row[] {
  const perWindow = r.windows.map((w) => `${w.gpuRuns}+${w.computeAppsRuns}`).join(', ');
  const failed = r.windows.reduce((sum, w) => sum + w.failed, 0);
  return [
    {
      figure: '2. nvidia-smi runs per TTL window, 1,000 concurrent requests',
      measured: `max ${r.maxRunsPerQuery} per query (GPU+apps per window: ${perWindow}; cold, expired, expired)${failed ? `; ${failed} requests failed` : ''}`,
      target: 'exactly 1 per query',
      result: verdict(r.pass),
    },
  ];
}

function slowProbeRows(r: SlowProbeResult): Row[] {
  return [
    {
      figure: '3. /shards/:id/ready p99 while nvidia-smi takes 3 s',
      measured:
        `${r.staleP99Ms} ms (max ${r.staleMaxMs}; ${r.staleAnswers} probes during the refresh, which landed at ` +
        `${r.refreshLandedAtMs ?? '-'} ms; all ${r.requests} probes: p50 ${r.p50Ms}, p99 ${r.p99Ms}, max ${r.maxMs} ms` +
        `${r.non200 ? `; ${r.non200} not 200` : ''})${r.invalid ? ` INVALID: ${r.invalid}` : ''}`,
      target: `p99 < ${P99_TARGET_MS} ms`,
      result: verdict(r.pass),
    },
  ];
}

function refreshCostRows(r: RefreshCostResult): Row[] {
  const at256 = r.sizes.find((s) => s.processes === 256)!;
  return [
    {
      figure: '4. snapshot refresh + attribution, 16/64/256/1024 GPU procs',
      measured: `${r.sizes.map((s) => s.medianMs).join(' / ')} ms (${r.sizes.map((s) => s.usPerProcess).join(' / ')} us per process)`,
      target: `< ${TARGET_MS_AT_256} ms at 256`,
      result: verdict(at256.medianMs < TARGET_MS_AT_256),
    },
    {
      figure: '4. refresh cost linearity (cost per added process)',
      measured: `${r.marginalGrowth}x (${r.marginalUs.from256To1024} us from 256 to 1024 vs ${r.marginalUs.from64To256} us from 64 to 256)`,
      target: `<= ${MAX_MARGINAL_GROWTH}x`,
      result: verdict(r.linear),
    },
  ];
}

function floorRows(r: FloorResult): Row[] {
  const bytes = r.answerBytes;
  const failed = r.failed > 0 ? ` INVALID: ${r.failed} requests failed` : '';
  return [
    {
      figure: '1. floor: a bare Fastify replaying the same answers',
      measured: `${r.cpuPct}% of one core, RSS ${r.rssMaxMB} MB at most (${r.durationS} s; bytes: probe ${bytes.probe}, /shards ${bytes.shards}, /metrics ${bytes.metrics}, page ${bytes.page})${failed}`,
      target: '-',
      result: 'info',
    },
  ];
}

function memoryRows(r: MemoryResult): Row[] {
  return [
    {
      figure: '5. server RSS after 100,000 mixed requests',
      measured: `${r.rssAt100kMB} MB (${r.rssAt50kMB} MB at 50k; ${r.requestsPerSecond} req/s)${r.invalid ? ` INVALID: ${r.invalid}` : ''}`,
      target: `< ${RSS_TARGET_MB} MB, <= ${FLAT_FACTOR} x RSS at 50k`,
      result: verdict(r.pass),
    },
  ];
}

type Log = (line: string) => void;

interface Figure {
  name: string;
  title: string;
  measure: (ctx: BenchContext, log: Log) => Promise<{ result: unknown; rows: Row[] }>;
}

function figure<T>(name: string, title: string, run: (ctx: BenchContext, log: Log) => Promise<T>, rows: (result: T) => Row[]): Figure {
  return {
    name,
    title,
    async measure(ctx, log) {
      const result = await run(ctx, log);
      return { result, rows: rows(result) };
    },
  };
}

const FIGURES: Figure[] = [
  figure('footprint', `1. footprint at a typical load, nvidia-smi (${footprintSeconds()} s measured)`, footprintFigure, footprintRows),
  figure('footprint-nvml', `1. footprint at a typical load, NVML (${footprintSeconds()} s measured)`, (ctx, log) => footprintFigure(ctx, log, 'nvml'), footprintRows),
  figure('floor', '1. floor: the same load and answers from a bare Fastify', floorFigure, floorRows),
  figure('single-flight', '2. nvidia-smi runs per TTL window', singleFlightFigure, singleFlightRows),
  figure('slow-probe', '3. probe latency during a 3 s nvidia-smi', slowProbeFigure, slowProbeRows),
  figure('refresh-cost', '4. snapshot refresh cost', refreshCostFigure, refreshCostRows),
  figure('memory', '5. resident memory over 100k requests', memoryFigure, memoryRows),
  figure('backends', '6. GPU query cost per refresh, nvidia-smi and NVML', backendsFigure, backendsRows),
];

async function main(argv: string[]): Promise<number> {
  const unknown = argv.filter((name) => !FIGURES.some((entry) => entry.name === name));
  if (unknown.length > 0) {
    process.stderr.write(`bench: unknown figure ${unknown.join(', ')}; the figures are ${FIGURES.map((entry) => entry.name).join(', ')}\n`);
    return 2;
  }
  const selected = argv.length > 0 ? FIGURES.filter((entry) => argv.includes(entry.name)) : FIGURES;
  const log: Log = (line) => process.stdout.write(`${line}\n`);
  const started = Date.now();
  const loadAtStart = loadAverage();
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-bench-'));
  log(`Starting ${SHARDS} shard process groups and ${FOREIGN} foreign processes...`);
  const farm = await startProcessFarm(SHARDS, FOREIGN);
  const ctx: BenchContext = {
    dir,
    farm,
    layout: nodeLayout(256, farm.shards, SHARDS, farm.foreign),
    shardIds: farm.shards.map((_, i) => shardId(i)),
  };
  const rows: Row[] = [];
  const figures: Record<string, unknown> = {};
  let errors = 0;
  try {
    for (const entry of selected) {
      log(`${entry.title}...`);
      const figureStarted = Date.now();
      try {
        const measured = await entry.measure(ctx, log);
        figures[entry.name] = measured.result;
        rows.push(...measured.rows);
      } catch (err) {
        errors += 1;
        const message = (err as Error).message;
        figures[entry.name] = { error: (err as Error).stack ?? message };
        rows.push({ figure: entry.title, measured: `could not be measured: ${message.split('\n')[0]}`, target: '-', result: 'ERROR' });
      }
      log(`  (${Math.round((Date.now() - figureStarted) / 1000)} s)`);
    }
  } finally {
    await farm.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  const table = formatTable(rows);
  const host = { ...machine(), loadAverage: [loadAtStart, loadAverage()] };
  const durationS = Math.round((Date.now() - started) / 1000);
  log('');
  log(table);
  log(`\nMachine: ${host.nproc} CPUs (${host.cpu}), Node ${host.node}, Linux ${host.kernel}; load average ${host.loadAverage.join(' at start, ')} at end; bench took ${durationS} s.`);
  mkdirSync(join(RESULTS, '..'), { recursive: true });
  writeFileSync(RESULTS, `${JSON.stringify({ startedAt: new Date(started).toISOString(), durationS, machine: host, rows, figures }, null, 2)}\n`);
  log(`Results: ${RESULTS}`);
  return errors > 0 ? 1 : 0;
}

// Ctrl-C still runs the 'exit' handlers that kill the spawned processes.
process.once('SIGINT', () => process.exit(130));
process.once('SIGTERM', () => process.exit(143));
process.exitCode = await main(process.argv.slice(2));
