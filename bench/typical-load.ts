// Owns what "a typical load" on a GPU node is, in one place, and the schedule that sends it: every
// shard's readiness probe (a kubelet's httpGet probe: a new connection each time, as the kubelet
// disables keep-alive for probes, 1 s timeout), a control plane listing the shards, a Prometheus
// scrape and the status page open in a browser (it reloads itself every 5 s). Each client asks at a
// fixed period; the 64 probes are spread evenly over their period, as independent kubelet probe
// workers (each started at its own moment) spread them, not sent in bursts. Pure: the sending is in
// footprint.ts.

export interface Client {
  name: string;
  /** The path asked; `{id}` is replaced by each shard id (one client per shard). */
  path: string;
  periodMs: number;
  headers: Record<string, string>;
  /** true: one kept-alive connection for all its requests; false: a new connection per request. */
  keepAlive: boolean;
  timeoutMs: number;
}

export const TYPICAL_LOAD: readonly Client[] = [
  {
    name: 'readiness probe',
    path: '/shards/{id}/ready',
    periodMs: 5_000,
    headers: { 'user-agent': 'kube-probe/1.31', accept: '*/*' },
    keepAlive: false,
    timeoutMs: 1_000,
  },
  {
    name: 'control plane',
    path: '/shards',
    periodMs: 1_000,
    headers: { 'user-agent': 'control-plane/1.0', accept: 'application/json' },
    keepAlive: true,
    timeoutMs: 5_000,
  },
  {
    name: 'Prometheus scrape',
    path: '/metrics',
    periodMs: 15_000,
    headers: {
      'user-agent': 'Prometheus/2.53.0',
      // Prometheus 2's own headers.
      accept: 'application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1',
      'accept-encoding': 'gzip',
      'x-prometheus-scrape-timeout-seconds': '10',
    },
    keepAlive: true,
    timeoutMs: 10_000,
  },
  {
    name: 'status page',
    path: '/',
    periodMs: 5_000,
    headers: {
      'user-agent': 'Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0',
      accept: 'text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8',
    },
    keepAlive: true,
    timeoutMs: 5_000,
  },
];

export interface ScheduledRequest {
  /** ms from the start of the load. */
  at: number;
  client: string;
  path: string;
}

/**
 * Every request of `load` in [0, durationMs), in time order. A client with `{id}` in its path is one
 * client per shard, shard i starting at i x periodMs / shards (spread over the period); the others
 * start at 0.
 */
export function schedule(load: readonly Client[], shardIds: readonly string[], durationMs: number): ScheduledRequest[] {
  const requests: ScheduledRequest[] = [];
  for (const client of load) {
    const perShard = client.path.includes('{id}');
    const instances = perShard ? shardIds.map((id, i) => ({ path: client.path.replace('{id}', id), offset: (i * client.periodMs) / shardIds.length })) : [{ path: client.path, offset: 0 }];
    for (const instance of instances) {
      for (let at = instance.offset; at < durationMs; at += client.periodMs) requests.push({ at, client: client.name, path: instance.path });
    }
  }
  // Stable: requests due at the same moment keep the order of the load's clients.
  return requests.sort((a, b) => a.at - b.at);
}

/** Requests a second the load sends on average with `shards` shards. */
export function requestsPerSecond(load: readonly Client[], shards: number): number {
  return load.reduce((sum, client) => sum + ((client.path.includes('{id}') ? shards : 1) * 1000) / client.periodMs, 0);
}
