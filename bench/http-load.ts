// Owns the load the HTTP figures send, every loop bounded in both count and time:
//   - autocannon runs (library API, in this process) with each response's own latency kept, so
//     p50/p99 are exact rather than autocannon's whole-millisecond histogram;
//   - a burst of N requests at once, each on its own connection (the single-flight figure);
//   - a closed loop of a few keep-alive workers that read every answer (the slow-refresh figure);
//   - an open loop that sends each request at its scheduled moment, whatever the answers (the
//     footprint figure's typical load).
import http from 'node:http';
import autocannon from 'autocannon';
import { percentile, sortedCopy } from './stats.js';

export interface LoadResult {
  requests: number;
  seconds: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  non2xx: number;
}

export interface AutocannonRun {
  url: string;
  requests: autocannon.Request[];
  connections: number;
  /** Time bound: autocannon stops after this many seconds (or at `amount`). */
  durationS: number;
  /** Count bound: stop after this many responses. */
  amount?: number;
}

const MAX_SAMPLES = 2_000_000;

export async function runAutocannon(run: AutocannonRun): Promise<LoadResult> {
  const latencies: number[] = [];
  const started = performance.now();
  let instance: autocannon.Instance | undefined;
  const done = new Promise<autocannon.Result>((resolve, reject) => {
    // The callback form returns the instance (events, stop()); without it the types give only a promise.
    instance = autocannon(
      {
        url: run.url,
        connections: run.connections,
        requests: run.requests,
        ...(run.amount !== undefined ? { amount: run.amount } : { duration: run.durationS, maxOverallRequests: MAX_SAMPLES }),
      },
      (err: unknown, result) => (err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve(result)),
    );
  });
  instance!.on('response', (_client, _status, _bytes, ms) => {
    if (latencies.length < MAX_SAMPLES) latencies.push(ms);
  });
  // With `amount` autocannon has no timer of its own: this is the time bound.
  const guard = setTimeout(() => instance!.stop(), run.durationS * 1000);
  const result = await done.finally(() => clearTimeout(guard));
  const seconds = (performance.now() - started) / 1000;
  const sorted = sortedCopy(latencies);
  return {
    requests: latencies.length,
    seconds,
    rps: latencies.length / seconds,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    errors: result.errors + result.timeouts,
    non2xx: result.non2xx,
  };
}

export interface Answer {
  status: number;
  body: string;
  contentType: string;
}

export interface RequestOptions {
  method?: string;
  body?: unknown;
  headers?: Record<string, string>;
  /** false (the default): a new connection, closed after the answer. */
  agent?: http.Agent | false;
  timeoutMs?: number;
}

export function request(url: string, options: RequestOptions = {}): Promise<Answer> {
  const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      {
        method: options.method ?? 'GET',
        agent: options.agent ?? false,
        headers: { ...options.headers, ...(payload === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) }) },
        timeout: options.timeoutMs ?? 30_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8'), contentType: String(res.headers['content-type'] ?? '') }),
        );
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${url}: no answer within ${options.timeoutMs ?? 30_000} ms`)));
    req.on('error', reject);
    req.end(payload);
  });
}

/** Sends every request at once, each on a fresh connection; resolves when all have settled. */
export async function burst(urls: string[], timeoutMs: number): Promise<{ ok: number; failed: number; statuses: Record<number, number> }> {
  const settled = await Promise.allSettled(urls.map((url) => request(url, { timeoutMs })));
  const statuses: Record<number, number> = {};
  let failed = 0;
  for (const outcome of settled) {
    if (outcome.status === 'rejected') failed += 1;
    else statuses[outcome.value.status] = (statuses[outcome.value.status] ?? 0) + 1;
  }
  return { ok: settled.length - failed, failed, statuses };
}

export interface ProbeSample {
  /** ms since the loop started. */
  at: number;
  ms: number;
  status: number;
  body: string;
}

/** `workers` keep-alive clients asking `paths` in turn until `durationMs` or `maxRequests`. */
export async function closedLoop(base: string, paths: string[], workers: number, durationMs: number, maxRequests: number): Promise<ProbeSample[]> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: workers });
  const samples: ProbeSample[] = [];
  const started = performance.now();
  let next = 0;
  const worker = async () => {
    while (performance.now() - started < durationMs && next < maxRequests) {
      const path = paths[next % paths.length]!;
      next += 1;
      const sent = performance.now();
      const answer = await request(`${base}${path}`, { agent, timeoutMs: 10_000 });
      samples.push({ at: sent - started, ms: performance.now() - sent, status: answer.status, body: answer.body });
    }
  };
  try {
    await Promise.all(Array.from({ length: workers }, worker));
  } finally {
    agent.destroy();
  }
  return samples;
}

export interface Scheduled {
  /** ms from the start of the loop. */
  at: number;
  /** Which client sends it: its requests share that client's agent. */
  client: string;
  path: string;
}

export interface ScheduledSample {
  /** ms from the start of the loop: when it was due, and how late it was sent. */
  at: number;
  lateMs: number;
  client: string;
  path: string;
  ms: number;
  /** 0 when the request failed (timeout, connection error). */
  status: number;
  body: string;
  /** Date.now() when the answer was complete. */
  receivedAt: number;
}

export interface ScheduleClient {
  headers: Record<string, string>;
  keepAlive: boolean;
  timeoutMs: number;
}

/**
 * Sends each request of `plan` (sorted by `at`) at its moment, without waiting for earlier answers
 * (an open loop, as independent clients send); bounded by the plan's length and, after its last
 * request, by the clients' timeouts. `onStart` is called with the loop's start (Date.now()).
 */
export async function sendSchedule(base: string, plan: readonly Scheduled[], clients: ReadonlyMap<string, ScheduleClient>, onStart?: (startedAt: number) => void): Promise<ScheduledSample[]> {
  const agents = new Map([...clients].map(([name, client]) => [name, client.keepAlive ? new http.Agent({ keepAlive: true, maxSockets: 1 }) : (false as const)]));
  const samples: ScheduledSample[] = [];
  const inFlight: Array<Promise<void>> = [];
  const started = performance.now();
  onStart?.(Date.now());
  try {
    for (const item of plan) {
      const wait = item.at - (performance.now() - started);
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      const client = clients.get(item.client);
      if (!client) throw new Error(`no client named ${item.client}`);
      const sent = performance.now();
      const sample = { at: item.at, lateMs: sent - started - item.at, client: item.client, path: item.path };
      inFlight.push(
        request(`${base}${item.path}`, { headers: client.headers, agent: agents.get(item.client)!, timeoutMs: client.timeoutMs }).then(
          (answer) => {
            samples.push({ ...sample, ms: performance.now() - sent, status: answer.status, body: answer.body, receivedAt: Date.now() });
          },
          () => {
            samples.push({ ...sample, ms: performance.now() - sent, status: 0, body: '', receivedAt: Date.now() });
          },
        ),
      );
    }
    await Promise.all(inFlight);
  } finally {
    for (const agent of agents.values()) if (agent) agent.destroy();
  }
  return samples.sort((a, b) => a.at - b.at);
}
