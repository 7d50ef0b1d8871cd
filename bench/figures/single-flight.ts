// Figure 2: nvidia-smi runs per TTL window under 1,000 concurrent requests. The real fake executable
// answers slowly (DELAY_MS) so that the burst overlaps the refresh, and its invocation log is the
// count. Three windows: a cold start (no snapshot: every request waits on the one refresh), then
// twice an expired snapshot (stale-while-revalidate: requests answer at once, one refresh runs in the
// background). The burst mixes the read endpoints; each request has its own connection. A window is
// TTL_MS long from the burst's start; runs are counted per query (GPU query, compute-apps query).
import { burst } from '../http-load.js';
import { queryKind, type FakeSmi } from '../fake-smi.js';
import { registerShards, startNodecompute, waitAllReady, type BenchContext } from '../node-setup.js';

const TTL_MS = 5_000;
const DELAY_MS = 500;
const CONCURRENT = 1_000;
const SWR_WINDOWS = 2;
/** Time after the burst's start by which its refresh must have finished (fake delay + start-up). */
const SETTLE_MS = 3_000;

export interface WindowResult {
  window: string;
  gpuRuns: number;
  computeAppsRuns: number;
  answered: number;
  failed: number;
  statuses: Record<number, number>;
}

export interface SingleFlightResult {
  windows: WindowResult[];
  /** The most runs of one query in one window. */
  maxRunsPerQuery: number;
  pass: boolean;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function countIn(fake: FakeSmi, from: number, to: number) {
  const runs = fake.invocations().filter((inv) => inv.at >= from && inv.at < to);
  return {
    gpuRuns: runs.filter((inv) => queryKind(inv) === 'gpu').length,
    computeAppsRuns: runs.filter((inv) => queryKind(inv) === 'compute-apps').length,
  };
}

async function window(name: string, fake: FakeSmi, urls: string[]): Promise<WindowResult> {
  const from = Date.now();
  const outcome = await burst(urls, 20_000);
  const settleFor = from + SETTLE_MS - Date.now();
  if (settleFor > 0) await sleep(settleFor);
  return { window: name, ...countIn(fake, from, from + TTL_MS), answered: outcome.ok, failed: outcome.failed, statuses: outcome.statuses };
}

export async function singleFlightFigure(ctx: BenchContext, log: (line: string) => void): Promise<SingleFlightResult> {
  const { server, fake } = await startNodecompute(ctx, 'single-flight', { cacheTtlMs: TTL_MS, maxStaleMs: 60_000 }, DELAY_MS);
  try {
    const paths = ['/gpus', '/gpus/foreign-memory', '/metrics', '/readyz', '/shards'];
    const coldUrls = Array.from({ length: CONCURRENT }, (_, i) => `${server.url}${paths[i % paths.length]}`);
    const windows = [await window('cold start', fake, coldUrls)];
    log(`  cold start: ${windows[0]!.gpuRuns} GPU + ${windows[0]!.computeAppsRuns} compute-apps runs`);

    await registerShards(ctx, server);
    await waitAllReady(ctx, server);
    const withProbes = [...paths, ...ctx.shardIds.slice(0, 5).map((id) => `/shards/${id}/ready`)];
    const urls = Array.from({ length: CONCURRENT }, (_, i) => `${server.url}${withProbes[i % withProbes.length]}`);
    for (let w = 1; w <= SWR_WINDOWS; w += 1) {
      // Let the snapshot expire: the last run is at most DELAY_MS + start-up old when waitAllReady returns.
      const last = Math.max(0, ...fake.invocations().map((inv) => inv.at));
      await sleep(Math.max(0, last + TTL_MS + DELAY_MS + 500 - Date.now()));
      const result = await window(`expired ${w}`, fake, urls);
      windows.push(result);
      log(`  expired snapshot ${w}: ${result.gpuRuns} GPU + ${result.computeAppsRuns} compute-apps runs`);
    }
    const maxRunsPerQuery = Math.max(...windows.flatMap((w) => [w.gpuRuns, w.computeAppsRuns]));
    const exactlyOne = windows.every((w) => w.gpuRuns === 1 && w.computeAppsRuns === 1);
    const allAnswered = windows.every((w) => w.failed === 0);
    return { windows, maxRunsPerQuery, pass: exactlyOne && allAnswered };
  } finally {
    await server.stop();
  }
}
