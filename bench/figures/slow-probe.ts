// Figure 3: readiness-probe latency while nvidia-smi takes 3 s and a snapshot is in hand. After the
// shards are ready, the fake is switched to answer after SLOW_MS, the snapshot is let expire, and a
// closed loop of WORKERS keep-alive clients asks /shards/:id/ready (cycling over the 64 shards) for
// LOAD_MS. The first request starts the slow refresh in the background; every probe is answered from
// the expired snapshot until the new one replaces it (after nvidia-smi, the refresh's /proc reads
// run on the event loop the probes share). The answers' observedAt tells which snapshot each came
// from; the figure is the p99 of the probes answered while the refresh ran. The window also covers
// the landing and the first answers after it, reported alongside.
import { closedLoop, type ProbeSample } from '../http-load.js';
import { startRegisteredNode, type BenchContext } from '../node-setup.js';
import { percentile, round, sortedCopy } from '../stats.js';

const TTL_MS = 1_000;
const SLOW_MS = 3_000;
const LOAD_MS = 4_500;
const WORKERS = 8;
const MAX_REQUESTS = 200_000;
export const P99_TARGET_MS = 20;

export interface SlowProbeResult {
  /** Every probe of the window, the refresh's landing included. */
  requests: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Probes answered from the expired snapshot, i.e. while the slow refresh ran. */
  staleAnswers: number;
  /** p99 of those: the figure. */
  staleP99Ms: number;
  staleMaxMs: number;
  /** Answers that were not 200 (a ready shard must stay ready). */
  non200: number;
  /** ms into the loop when the first answer from the new snapshot came: the slow refresh landed. */
  refreshLandedAtMs: number | null;
  pass: boolean;
  invalid: string | null;
}

function observedAt(sample: ProbeSample): string | null {
  try {
    return (JSON.parse(sample.body) as { observedAt: string | null }).observedAt;
  } catch {
    return null;
  }
}

export async function slowProbeFigure(ctx: BenchContext, log: (line: string) => void): Promise<SlowProbeResult> {
  const { server, fake } = await startRegisteredNode(ctx, 'slow-probe', { cacheTtlMs: TTL_MS, maxStaleMs: 60_000 });
  try {
    const paths = ctx.shardIds.map((id) => `/shards/${id}/ready`);
    await closedLoop(server.url, paths, WORKERS, 500, MAX_REQUESTS);
    fake.setScenario({ gpus: ctx.layout.gpus, processes: ctx.layout.processes, delayMs: SLOW_MS });
    await new Promise((resolve) => setTimeout(resolve, TTL_MS + 300));
    const loopStarted = Date.now();
    const samples = await closedLoop(server.url, paths, WORKERS, LOAD_MS, MAX_REQUESTS);
    const sorted = sortedCopy(samples.map((s) => s.ms));
    // Answers from the snapshot taken before the switch, which had expired when the loop began,
    // were served while the slow refresh ran; the first answer from another snapshot is its landing.
    const old = observedAt(samples[0]!);
    const oldExpired = old !== null && loopStarted - Date.parse(old) > TTL_MS;
    const stale = oldExpired ? samples.filter((s) => observedAt(s) === old) : [];
    const landed = samples.find((s) => observedAt(s) !== old);
    const staleAnswers = stale.length;
    const staleSorted = sortedCopy(stale.map((s) => s.ms));
    const non200 = samples.filter((s) => s.status !== 200).length;
    const result = {
      requests: samples.length,
      p50Ms: round(percentile(sorted, 50), 3),
      p99Ms: round(percentile(sorted, 99), 3),
      maxMs: round(sorted[sorted.length - 1] ?? Number.NaN, 3),
      staleAnswers,
      staleP99Ms: round(percentile(staleSorted, 99), 3),
      staleMaxMs: round(staleSorted[staleSorted.length - 1] ?? Number.NaN, 3),
      non200,
      refreshLandedAtMs: landed ? round(landed.at, 0) : null,
    };
    // The figure means something only if probes really ran while the slow refresh was under way.
    const invalid =
      staleAnswers === 0
        ? 'no answer came from the expired snapshot: the slow refresh did not overlap the probes'
        : landed === undefined
          ? null
          : landed.at < SLOW_MS * 0.8
            ? `the refresh landed after ${round(landed.at, 0)} ms: nvidia-smi was not slow`
            : null;
    log(
      `  ${staleAnswers} probes during the refresh: p99 ${result.staleP99Ms} ms; all ${result.requests}: p99 ${result.p99Ms} ms; ` +
        `refresh landed at ${result.refreshLandedAtMs ?? 'never'} ms`,
    );
    return { ...result, pass: invalid === null && non200 === 0 && result.staleP99Ms < P99_TARGET_MS, invalid };
  } finally {
    await server.stop();
  }
}
