// Figure 1's reference: what any Node HTTP server costs on this machine under the same typical load.
// The answers a nodecompute server gives to every path of the load (each shard's probe, /shards,
// /metrics, the status page) are captured once, byte for byte with their status and content type;
// then a bare Fastify (bench/server.ts, shipped Node options and malloc arenas) replays them under
// the same schedule while its CPU and RSS are read as figure 1 reads nodecompute's. The difference
// between the two is what nodecompute's own work costs; the floor is what the load itself costs.
import { request, sendSchedule, type ScheduleClient } from '../http-load.js';
import { startRegisteredNode, type BenchContext } from '../node-setup.js';
import { startServer, USER_HZ } from '../server-handle.js';
import type { FloorAnswer } from '../server.js';
import { round } from '../stats.js';
import { schedule, TYPICAL_LOAD } from '../typical-load.js';
import { footprintSeconds } from './footprint.js';

const WARMUP_MS = 15_000;
/** The floor is steady: a minute measured is enough even when figure 1 runs longer. */
const MAX_MEASURED_MS = 60_000;
const MB = 1024 * 1024;

export interface FloorResult {
  durationS: number;
  requests: number;
  cpuPct: number;
  rssMaxMB: number;
  /** Bytes of each captured answer kind (one probe, the list, the scrape, the page). */
  answerBytes: Record<string, number>;
  failed: number;
}

/** One answer per distinct path of the load, asked with its client's headers. */
async function captureAnswers(url: string, shardIds: readonly string[]): Promise<FloorAnswer[]> {
  const answers: FloorAnswer[] = [];
  for (const client of TYPICAL_LOAD) {
    const paths = client.path.includes('{id}') ? shardIds.map((id) => client.path.replace('{id}', id)) : [client.path];
    for (const path of paths) {
      const answer = await request(`${url}${path}`, { headers: client.headers });
      answers.push({ path, status: answer.status, contentType: answer.contentType, body: answer.body });
    }
  }
  return answers;
}

export async function floorFigure(ctx: BenchContext, log: (line: string) => void): Promise<FloorResult> {
  const source = await startRegisteredNode(ctx, 'floor-source', { logLevel: 'info' });
  let answers: FloorAnswer[];
  try {
    answers = await captureAnswers(source.server.url, ctx.shardIds);
  } finally {
    await source.server.stop();
  }
  const server = await startServer('floor', { config: {}, floor: answers });
  try {
    const measuredMs = Math.min(footprintSeconds() * 1000, MAX_MEASURED_MS);
    const plan = schedule(TYPICAL_LOAD, ctx.shardIds, WARMUP_MS + measuredMs);
    const clients = new Map<string, ScheduleClient>(TYPICAL_LOAD.map((client) => [client.name, client]));
    let from: { at: number; ticks: number } | undefined;
    let rssMaxMB = 0;
    let sampler: NodeJS.Timeout | undefined;
    let warmup: NodeJS.Timeout | undefined;
    const sent = await sendSchedule(server.url, plan, clients, () => {
      warmup = setTimeout(() => {
        from = { at: Date.now(), ticks: server.cpuTicks().self };
        sampler = setInterval(() => (rssMaxMB = Math.max(rssMaxMB, server.rssBytes() / MB)), 1_000);
      }, WARMUP_MS);
    }).finally(() => {
      clearTimeout(warmup);
      clearInterval(sampler);
    });
    if (from === undefined) throw new Error('the load ended before the measurement began');
    const spanS = (Date.now() - from.at) / 1000;
    const cpuPct = round(((server.cpuTicks().self - from.ticks) / USER_HZ / spanS) * 100, 2);
    const bytesOf = (path: string) => answers.find((answer) => answer.path === path)?.body.length ?? 0;
    const result: FloorResult = {
      durationS: round(spanS, 1),
      requests: sent.length,
      cpuPct,
      rssMaxMB: round(rssMaxMB, 1),
      answerBytes: { probe: bytesOf(`/shards/${ctx.shardIds[0]}/ready`), shards: bytesOf('/shards'), metrics: bytesOf('/metrics'), page: bytesOf('/') },
      failed: sent.filter((answer) => answer.status === 0).length,
    };
    log(`  floor: CPU ${cpuPct}% of a core, RSS max ${result.rssMaxMB} MB (${JSON.stringify(result.answerBytes)} bytes)`);
    return result;
  } finally {
    await server.stop();
  }
}
