// Figure 1: what nodecompute's warm path costs over Fastify itself. For each endpoint, nodecompute
// (warm cache: a TTL far longer than the figure, so no refresh happens while it is measured) and a
// bare Fastify route answering a precomputed body of the same size are loaded by autocannon in
// short slices, for ROUNDS rounds. Each side is two servers (two processes): identical servers
// differ by up to 15% in CPU per request here (where V8 and the kernel happened to place each), so
// one server a side would measure that placement as much as the code. A round loads each of the
// four for one slice, in ABBA order (nodecompute, bare, bare, nodecompute, reversed the next
// round), and gives a paired ratio of requests/s, each side's requests over its seconds; the figure
// is the median ratio, so drift on a shared machine hits both sides of each pair alike.
//
// On a machine where other work takes CPU, a server may not get a whole core, and requests/s then
// says as much about the neighbours as about the server. The server's own CPU time per request
// (utime + stime of its process, from /proc) does not depend on that, so the figure also reports
// the CPU ratio (bare CPU per request / nodecompute CPU per request): on an idle machine with the
// server as the bottleneck both ratios agree.
import type { BareRoute } from '../server.js';
import { runAutocannon, request } from '../http-load.js';
import { startRegisteredNode, type BenchContext, type NodecomputeServer } from '../node-setup.js';
import { startServer, type ServerHandle } from '../server-handle.js';
import { median, percentile, round, sortedCopy } from '../stats.js';

export const ROUNDS = 7;
const SLICE_S = 1;
/** Servers a side. */
const SERVERS = 2;
const WARMUP_S = 1;
const CONNECTIONS = 10;
export const RATIO_TARGET = 0.85;
/** Clock ticks per second of utime/stime in /proc/PID/stat (USER_HZ; 100 on every Linux port that matters). */
const USER_HZ = 100;

interface Endpoint {
  name: string;
  /** The path loaded. */
  path: string;
  /** The route the bare server registers for it. */
  route: string;
}

export interface SideRun {
  requests: number;
  seconds: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  /** Server CPU time per request, in ms. */
  cpuMsPerRequest: number;
  /** CPU the server process got while loaded, in % of one core. */
  serverCpuPct: number;
  errors: number;
  non2xx: number;
}

export interface EndpointResult {
  endpoint: string;
  bodyBytes: number;
  rounds: Array<{ nodecompute: SideRun; bare: SideRun; ratio: number; cpuRatio: number }>;
  nodecompute: { rps: number; p50Ms: number; p99Ms: number; cpuMsPerRequest: number };
  bare: { rps: number; p50Ms: number; p99Ms: number; cpuMsPerRequest: number };
  /** Median over rounds of nodecompute req/s / bare req/s: the figure. */
  ratio: number;
  /** The lowest and highest round ratio: how far the machine moved the figure. */
  ratioRange: [number, number];
  /** Median over rounds of bare CPU per request / nodecompute CPU per request. */
  cpuRatio: number;
  pass: boolean;
  /** Why the figure cannot be trusted, when it cannot (errors, non-2xx answers). */
  invalid: string | null;
}

interface Accumulator {
  requests: number;
  seconds: number;
  ticks: number;
  errors: number;
  non2xx: number;
  latencies: number[];
}

const empty = (): Accumulator => ({ requests: 0, seconds: 0, ticks: 0, errors: 0, non2xx: 0, latencies: [] });

async function slice(server: ServerHandle, path: string, durationS: number, into: Accumulator): Promise<void> {
  const ticksBefore = server.cpuTicks();
  const result = await runAutocannon({ url: server.url, requests: [{ method: 'GET', path }], connections: CONNECTIONS, durationS }, into.latencies);
  into.ticks += server.cpuTicks() - ticksBefore;
  into.requests += result.requests;
  into.seconds += result.seconds;
  into.errors += result.errors;
  into.non2xx += result.non2xx;
}

function sideRun(acc: Accumulator): SideRun {
  const sorted = sortedCopy(acc.latencies);
  const cpuMs = (acc.ticks * 1000) / USER_HZ;
  return {
    requests: acc.requests,
    seconds: round(acc.seconds, 3),
    rps: round(acc.requests / acc.seconds, 1),
    p50Ms: round(percentile(sorted, 50), 3),
    p99Ms: round(percentile(sorted, 99), 3),
    cpuMsPerRequest: round(cpuMs / acc.requests, 4),
    serverCpuPct: round((cpuMs / 1000 / acc.seconds) * 100, 1),
    errors: acc.errors,
    non2xx: acc.non2xx,
  };
}

function summary(runs: SideRun[]) {
  return {
    rps: round(median(runs.map((r) => r.rps)), 0),
    p50Ms: round(median(runs.map((r) => r.p50Ms)), 3),
    p99Ms: round(median(runs.map((r) => r.p99Ms)), 3),
    cpuMsPerRequest: round(median(runs.map((r) => r.cpuMsPerRequest)), 4),
  };
}

export async function throughputFigure(ctx: BenchContext, log: (line: string) => void): Promise<EndpointResult[]> {
  const endpoints: Endpoint[] = [
    { name: '/gpus/foreign-memory', path: '/gpus/foreign-memory', route: '/gpus/foreign-memory' },
    { name: '/shards/:id/ready', path: `/shards/${ctx.shardIds[0]}/ready`, route: '/shards/:id/ready' },
    { name: '/metrics', path: '/metrics', route: '/metrics' },
  ];
  const nodes: NodecomputeServer[] = [];
  const bares: ServerHandle[] = [];
  try {
    for (let i = 0; i < SERVERS; i += 1) nodes.push(await startRegisteredNode(ctx, `throughput-${i + 1}`, { cacheTtlMs: 600_000, maxStaleMs: 600_000 }));
    const routes: BareRoute[] = [];
    for (const endpoint of endpoints) {
      const answer = await request(`${nodes[0]!.server.url}${endpoint.path}`);
      if (answer.status !== 200) throw new Error(`${endpoint.path} answered ${answer.status} before the figure: ${answer.body.slice(0, 300)}`);
      routes.push({ path: endpoint.route, contentType: answer.contentType, body: answer.body });
    }
    // Bare servers start last: a bare server started before nodecompute's had registered its shards
    // cost the most per request in every run that compared them.
    for (let i = 0; i < SERVERS; i += 1) bares.push(await startServer(`bare-${i + 1}`, { kind: 'bare', routes }));
    const pairs = nodes.map((node, i) => ({ nodecompute: node.server, bare: bares[i]! }));
    for (const endpoint of endpoints) {
      for (const pair of pairs) for (const server of Object.values(pair)) await slice(server, endpoint.path, WARMUP_S, empty());
    }
    const results = endpoints.map((endpoint, i) => ({ endpoint, bodyBytes: Buffer.byteLength(routes[i]!.body), rounds: [] as EndpointResult['rounds'] }));
    for (let r = 0; r < ROUNDS; r += 1) {
      for (const result of results) {
        const acc = { nodecompute: empty(), bare: empty() };
        for (const [p, pair] of pairs.entries()) {
          const order = (p + r) % 2 === 0 ? (['nodecompute', 'bare'] as const) : (['bare', 'nodecompute'] as const);
          for (const side of order) await slice(pair[side], result.endpoint.path, SLICE_S, acc[side]);
        }
        const pair = { nodecompute: sideRun(acc.nodecompute), bare: sideRun(acc.bare) };
        const ratio = round(pair.nodecompute.rps / pair.bare.rps, 3);
        const cpuRatio = round(pair.bare.cpuMsPerRequest / pair.nodecompute.cpuMsPerRequest, 3);
        result.rounds.push({ ...pair, ratio, cpuRatio });
        log(
          `  round ${r + 1} ${result.endpoint.name}: nodecompute ${round(pair.nodecompute.rps, 0)} req/s (${pair.nodecompute.serverCpuPct}% CPU), ` +
            `bare ${round(pair.bare.rps, 0)} req/s (${pair.bare.serverCpuPct}% CPU), ratio ${ratio}, CPU ratio ${cpuRatio}`,
        );
      }
    }
    return results.map(({ endpoint, bodyBytes, rounds }) => {
      const ratios = rounds.map((pair) => pair.ratio);
      const ratio = round(median(ratios), 3);
      const bad = rounds.flatMap((pair) => [pair.nodecompute, pair.bare]).filter((run) => run.errors > 0 || run.non2xx > 0);
      return {
        endpoint: endpoint.name,
        bodyBytes,
        rounds,
        nodecompute: summary(rounds.map((pair) => pair.nodecompute)),
        bare: summary(rounds.map((pair) => pair.bare)),
        ratio,
        ratioRange: [Math.min(...ratios), Math.max(...ratios)],
        cpuRatio: round(median(rounds.map((pair) => pair.cpuRatio)), 3),
        pass: ratio >= RATIO_TARGET && bad.length === 0,
        invalid: bad.length > 0 ? `${bad.length} round sides had errors or non-2xx answers` : null,
      };
    });
  } finally {
    for (const bare of bares) await bare.stop();
    for (const node of nodes) await node.server.stop();
  }
}
