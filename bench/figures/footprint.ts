// Figure 1: what the agent costs on a node at a typical load, and how fresh its answers are. A
// nodecompute server as it ships (default settings: 1 s TTL, log level info; the shipped Node
// options and malloc arenas, see server-handle.ts) with the 64 shards registered is sent the typical
// load (typical-load.ts: every shard probed every 5 s, spread over the period; GET /shards every
// second; a scrape every 15 s; the status page every 5 s) from this process, an open loop at fixed
// moments, for WARMUP_MS and then the measured duration (BENCH_FOOTPRINT_S, default 240 s).
//
// Over the measured part, once a second, the server's /proc/PID/stat and /proc/PID/status are read
// (the server is a child process: the load generator's CPU and memory are not in them):
//   - CPU: utime + stime, the server process's own, as % of one core over the duration (and per
//     15 s window, to show the spread); cutime + cstime, its children's (the nvidia-smi runs it has
//     waited for), apart: here those are the fake, a Node script, so they say what the fake costs,
//     not the real nvidia-smi;
//   - RSS: VmRSS; the largest sample, and flatness as the median of the last quarter of the samples
//     against the median of the first quarter (medians, so one GC's sawtooth does not decide it).
// Freshness: each probe answer's age, its arrival time minus its observedAt (when the snapshot
// behind it was taken).
//
// Under either backend (named, never auto): nvidia-smi, the fake executable; or NVML, the fake
// libnvidia-ml.so.1 on the same scenario.json. The NVML fake runs inside the server process, so
// its own (small) cost counts in the server's CPU; the nvidia-smi fake's counts in its children's.
import { sendSchedule, type ScheduleClient, type ScheduledSample } from '../http-load.js';
import { driverQueries, startRegisteredNode, type BenchContext } from '../node-setup.js';
import { loadAverage } from '../report.js';
import { USER_HZ, type ServerHandle } from '../server-handle.js';
import { median, percentile, round, sortedCopy } from '../stats.js';
import { requestsPerSecond, schedule, TYPICAL_LOAD } from '../typical-load.js';

/** The measured duration in seconds: BENCH_FOOTPRINT_S, or a few minutes so that a slow leak shows. */
export function footprintSeconds(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.BENCH_FOOTPRINT_S;
  if (raw === undefined || raw === '') return 240;
  const seconds = Number(raw);
  if (!Number.isInteger(seconds) || seconds < 5 || seconds > 3_600) throw new Error(`BENCH_FOOTPRINT_S must be an integer from 5 to 3600 (seconds), not ${JSON.stringify(raw)}`);
  return seconds;
}

/** One whole cycle of the load (the scrape's period) before measuring: every client has asked, the JIT has seen every route. */
const WARMUP_MS = 15_000;
const SAMPLE_MS = 1_000;
/** CPU is also given per window of this length, to show how steady it is. */
const WINDOW_MS = 15_000;
/** A request sent later than this after its moment means the load was not sent as specified. */
const MAX_LATE_MS = 250;
export const CPU_TARGET_PCT = 1;
export const RSS_TARGET_MB = 80;
/** Flat: the last quarter's median RSS is at most this factor of the first quarter's. */
export const FLAT_FACTOR = 1.05;
const PROBE_CLIENT = 'readiness probe';
const MB = 1024 * 1024;

export interface FootprintSample {
  /** ms since the measurement began. */
  t: number;
  cpuTicks: number;
  childTicks: number;
  rssMB: number;
}

export type FootprintBackend = 'nvidia-smi' | 'nvml';

export interface FootprintResult {
  backend: FootprintBackend;
  durationS: number;
  warmupS: number;
  requests: number;
  requestsPerSecond: number;
  /** Server process (utime + stime), % of one core over the duration. */
  cpuPct: number;
  /** The same per WINDOW_MS window. */
  cpuWindowsPct: number[];
  /** Children (cutime + cstime), % of one core; the nvidia-smi runs (the fake here). */
  childCpuPct: number;
  smiRuns: number;
  childMsPerRun: number | null;
  /** GPU queries (gpus + compute-apps) over the measurement, from /metrics; two per refresh. Null where /metrics has no count. */
  driverQueries: number | null;
  rssMaxMB: number;
  rssFirstQuarterMB: number;
  rssLastQuarterMB: number;
  rssGrowthPct: number;
  /** Least-squares slope of RSS over the duration, MB per hour (informational: minutes extrapolated). */
  rssSlopeMBPerHour: number;
  probe: { answers: number; p50Ms: number; p99Ms: number; maxMs: number; ageP50Ms: number; ageP99Ms: number; ageMaxMs: number };
  failed: number;
  non200: number;
  lateP99Ms: number;
  lateMaxMs: number;
  /** The server's own V8 heap in use at the start and end of the measurement (after no forced GC): a leak in JS shows here first. */
  heapUsedMB: [number, number];
  /** The machine's 1-minute load average when the measurement began and ended. */
  loadAverage: [number, number];
  samples: FootprintSample[];
  cpuPass: boolean;
  rssPass: boolean;
  flat: boolean;
  invalid: string | null;
}

function sampleOf(server: ServerHandle, t: number): FootprintSample {
  const ticks = server.cpuTicks();
  return { t, cpuTicks: ticks.self, childTicks: ticks.children, rssMB: round(server.rssBytes() / MB, 1) };
}

/** % of one core that `ticks` clock ticks are over `ms`. */
const pctOfCore = (ticks: number, ms: number) => (ticks / USER_HZ / (ms / 1000)) * 100;

/** Least-squares slope of y over x. */
export function slope(xs: readonly number[], ys: readonly number[]): number {
  const n = xs.length;
  if (n < 2) return Number.NaN;
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i += 1) {
    num += (xs[i]! - mx) * (ys[i]! - my);
    den += (xs[i]! - mx) ** 2;
  }
  return den === 0 ? Number.NaN : num / den;
}

/** The first and last quarter of `values` (at least one value each). */
export function quarters<T>(values: readonly T[]): { first: T[]; last: T[] } {
  const size = Math.max(1, Math.floor(values.length / 4));
  return { first: values.slice(0, size), last: values.slice(values.length - size) };
}

function observedAt(sample: ScheduledSample): number | null {
  try {
    const at = (JSON.parse(sample.body) as { observedAt?: string | null }).observedAt;
    return typeof at === 'string' ? Date.parse(at) : null;
  } catch {
    return null;
  }
}

export async function footprintFigure(ctx: BenchContext, log: (line: string) => void, backend: FootprintBackend = 'nvidia-smi'): Promise<FootprintResult> {
  const durationMs = footprintSeconds() * 1000;
  // As it ships: only what the bench must set (its backend and fake, its state file, loopback) differs.
  const { server, fake } = await startRegisteredNode(ctx, backend === 'nvml' ? 'footprint-nvml' : 'footprint', { logLevel: 'info', backend });
  try {
    const plan = schedule(TYPICAL_LOAD, ctx.shardIds, WARMUP_MS + durationMs);
    const clients = new Map<string, ScheduleClient>(TYPICAL_LOAD.map((client) => [client.name, client]));
    const samples: FootprintSample[] = [];
    let measureFrom = 0;
    let loadAtStart = 0;
    let heapAtStart: Promise<NodeJS.MemoryUsage> | undefined;
    let queriesAtStart: Promise<number | null> | undefined;
    let sampler: NodeJS.Timeout | undefined;
    let warmup: NodeJS.Timeout | undefined;
    log(`  ${plan.length} requests over ${(WARMUP_MS + durationMs) / 1000} s (${round(requestsPerSecond(TYPICAL_LOAD, ctx.shardIds.length), 1)}/s), measured after ${WARMUP_MS / 1000} s`);
    const answers = await sendSchedule(server.url, plan, clients, () => {
      warmup = setTimeout(() => {
        measureFrom = Date.now();
        loadAtStart = loadAverage();
        heapAtStart = server.memoryUsage();
        queriesAtStart = driverQueries(server).catch(() => null);
        samples.push(sampleOf(server, 0));
        sampler = setInterval(() => {
          const t = Date.now() - measureFrom;
          if (t <= durationMs + SAMPLE_MS / 2) samples.push(sampleOf(server, t));
        }, SAMPLE_MS);
      }, WARMUP_MS);
    }).finally(() => {
      clearTimeout(warmup);
      clearInterval(sampler);
    });
    if (measureFrom === 0) throw new Error('the load ended before the measurement began');
    // The load's last request was due just before the duration's end; its answer may come before the last tick.
    const closing = Date.now() - measureFrom;
    if (closing - samples[samples.length - 1]!.t > SAMPLE_MS / 2) samples.push(sampleOf(server, closing));
    const heapUsedMB: [number, number] = [round((await heapAtStart!).heapUsed / MB, 1), round((await server.memoryUsage()).heapUsed / MB, 1)];
    const [queriesFrom, queriesTo] = [await queriesAtStart!, await driverQueries(server)];
    const first = samples[0]!;
    const end = samples[samples.length - 1]!;
    const spanMs = end.t - first.t;

    const cpuWindowsPct: number[] = [];
    for (let from = 0; from + WINDOW_MS <= spanMs + SAMPLE_MS / 2; from += WINDOW_MS) {
      const a = samples.find((s) => s.t >= from - SAMPLE_MS / 2)!;
      const b = samples.find((s) => s.t >= from + WINDOW_MS - SAMPLE_MS / 2) ?? end;
      if (b.t > a.t) cpuWindowsPct.push(round(pctOfCore(b.cpuTicks - a.cpuTicks, b.t - a.t), 2));
    }
    const smiRuns = fake.invocations().filter((inv) => inv.at >= measureFrom + first.t && inv.at < measureFrom + end.t).length;
    const childTicks = end.childTicks - first.childTicks;

    const rss = samples.map((s) => s.rssMB);
    const { first: q1, last: q4 } = quarters(rss);
    const rssFirstQuarterMB = round(median(q1), 1);
    const rssLastQuarterMB = round(median(q4), 1);

    const measured = answers.filter((a) => a.at >= WARMUP_MS);
    const probes = measured.filter((a) => a.client === PROBE_CLIENT && a.status === 200);
    const ages: number[] = [];
    for (const probe of probes) {
      const at = observedAt(probe);
      if (at !== null) ages.push(probe.receivedAt - at);
    }
    const latency = sortedCopy(probes.map((p) => p.ms));
    const age = sortedCopy(ages);
    const late = sortedCopy(answers.map((a) => a.lateMs));
    const failed = answers.filter((a) => a.status === 0).length;
    const non200 = answers.filter((a) => a.status !== 0 && a.status !== 200).length;
    const lateP99Ms = round(percentile(late, 99), 1);

    const cpuPct = round(pctOfCore(end.cpuTicks - first.cpuTicks, spanMs), 2);
    const rssMaxMB = Math.max(...rss);
    const flat = rssLastQuarterMB <= rssFirstQuarterMB * FLAT_FACTOR;
    const invalid =
      failed + non200 > 0
        ? `${failed} requests failed and ${non200} were not answered 200`
        : lateP99Ms > MAX_LATE_MS
          ? `the load generator fell behind (p99 ${lateP99Ms} ms late)`
          : ages.length < probes.length
            ? `${probes.length - ages.length} probe answers had no observedAt`
            : null;
    const result: FootprintResult = {
      backend,
      durationS: round(spanMs / 1000, 1),
      warmupS: WARMUP_MS / 1000,
      requests: answers.length,
      requestsPerSecond: round(measured.length / (spanMs / 1000), 1),
      cpuPct,
      cpuWindowsPct,
      childCpuPct: round(pctOfCore(childTicks, spanMs), 2),
      smiRuns,
      childMsPerRun: smiRuns > 0 ? round((childTicks * 1000) / USER_HZ / smiRuns, 1) : null,
      driverQueries: queriesFrom === null || queriesTo === null ? null : queriesTo - queriesFrom,
      rssMaxMB,
      rssFirstQuarterMB,
      rssLastQuarterMB,
      rssGrowthPct: round((rssLastQuarterMB / rssFirstQuarterMB - 1) * 100, 1),
      rssSlopeMBPerHour: round(slope(samples.map((s) => s.t / 3_600_000), rss), 1),
      probe: {
        answers: probes.length,
        p50Ms: round(percentile(latency, 50), 2),
        p99Ms: round(percentile(latency, 99), 2),
        maxMs: round(latency[latency.length - 1] ?? Number.NaN, 2),
        ageP50Ms: round(percentile(age, 50), 0),
        ageP99Ms: round(percentile(age, 99), 0),
        ageMaxMs: round(age[age.length - 1] ?? Number.NaN, 0),
      },
      failed,
      non200,
      lateP99Ms,
      lateMaxMs: round(late[late.length - 1] ?? Number.NaN, 1),
      heapUsedMB,
      loadAverage: [loadAtStart, loadAverage()],
      samples,
      cpuPass: invalid === null && cpuPct < CPU_TARGET_PCT,
      rssPass: invalid === null && rssMaxMB < RSS_TARGET_MB,
      flat: invalid === null && flat,
      invalid,
    };
    log(
      `  ${backend}: CPU ${cpuPct}% of a core (windows ${cpuWindowsPct.join(' ')}), children ${result.childCpuPct}% (${smiRuns} nvidia-smi runs, ${result.driverQueries ?? '-'} GPU queries); ` +
        `RSS max ${rssMaxMB} MB, quarters ${rssFirstQuarterMB} -> ${rssLastQuarterMB} MB; probe p99 ${result.probe.p99Ms} ms, age p99 ${result.probe.ageP99Ms} ms`,
    );
    return result;
  } finally {
    await server.stop();
  }
}
