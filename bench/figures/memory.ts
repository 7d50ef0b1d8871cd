// Figure 5: resident memory of the server over 100,000 requests. A fresh nodecompute server (default
// 1 s TTL, so snapshots keep being replaced, the real fake executable, 64 shards) takes mixed
// requests (memoryMix) in chunks of CHUNK from autocannon; after each chunk the server's VmRSS is read from
// /proc/PID/status (the server is a child process: the load generator's memory does not count).
// Flat means RSS at 100k <= RSS at 50k x 1.10: the heap settles once the JIT, the snapshot and the
// metric series are warm, and growth past that point is what a leak looks like.
import { runAutocannon } from '../http-load.js';
import { startRegisteredNode, type BenchContext } from '../node-setup.js';
import { round } from '../stats.js';

const TOTAL = 100_000;
const CHUNK = 10_000;
const CONNECTIONS = 10;
/** Time bound per chunk; a chunk that needs longer is cut short and the figure says so. */
const CHUNK_MAX_S = 60;
export const RSS_TARGET_MB = 120;

/**
 * One cycle of the mix, weighted as a node sees it: mostly readiness probes (one per shard every few
 * seconds), some placement and control-plane reads, an occasional scrape.
 */
export function memoryMix(shardIds: string[]): string[] {
  const probes = [0, 9, 17, 26, 33, 42, 50, 63].map((i) => `/shards/${shardIds[i % shardIds.length]}/ready`);
  return [...probes, '/gpus/foreign-memory', '/gpus', '/shards', `/shards/${shardIds[5]}/compute`, '/readyz', '/metrics'];
}
export const FLAT_FACTOR = 1.1;

export interface MemorySample {
  requests: number;
  /** VmRSS of the server process. */
  rssMB: number;
  /** The server's own process.memoryUsage(), for telling heap growth from the rest. */
  heapTotalMB: number;
  heapUsedMB: number;
  externalMB: number;
}

export interface MemoryResult {
  samples: MemorySample[];
  rssAt100kMB: number;
  rssAt50kMB: number;
  flat: boolean;
  requestsPerSecond: number;
  pass: boolean;
  invalid: string | null;
}

const MB = 1024 * 1024;

export async function memoryFigure(ctx: BenchContext, log: (line: string) => void): Promise<MemoryResult> {
  const { server } = await startRegisteredNode(ctx, 'memory', { cacheTtlMs: 1_000 });
  try {
    const requests = memoryMix(ctx.shardIds).map((path) => ({ method: 'GET' as const, path }));
    const sample = async (done: number): Promise<MemorySample> => {
      const usage = await server.memoryUsage();
      return {
        requests: done,
        rssMB: round(server.rssBytes() / MB, 1),
        heapTotalMB: round(usage.heapTotal / MB, 1),
        heapUsedMB: round(usage.heapUsed / MB, 1),
        externalMB: round(usage.external / MB, 1),
      };
    };
    const samples = [await sample(0)];
    let done = 0;
    let seconds = 0;
    let problems = 0;
    while (done < TOTAL) {
      const result = await runAutocannon({ url: server.url, requests, connections: CONNECTIONS, durationS: CHUNK_MAX_S, amount: CHUNK });
      if (result.requests === 0) throw new Error('a chunk got no answers');
      done += result.requests;
      seconds += result.seconds;
      problems += result.errors + result.non2xx;
      samples.push(await sample(done));
      if (result.requests < CHUNK) break;
    }
    const at = (n: number) => samples.find((s) => s.requests >= n)?.rssMB ?? Number.NaN;
    const rssAt100kMB = at(TOTAL);
    const rssAt50kMB = at(TOTAL / 2);
    const flat = rssAt100kMB <= rssAt50kMB * FLAT_FACTOR;
    log(`  RSS ${samples.map((s) => `${s.requests / 1000}k:${s.rssMB}`).join(' ')} MB`);
    const invalid = done < TOTAL ? `only ${done} requests were sent within the time bound` : problems > 0 ? `${problems} errors or non-2xx answers` : null;
    return {
      samples,
      rssAt100kMB,
      rssAt50kMB,
      flat,
      requestsPerSecond: round(done / seconds, 0),
      pass: invalid === null && flat && rssAt100kMB < RSS_TARGET_MB,
      invalid,
    };
  } finally {
    await server.stop();
  }
}
