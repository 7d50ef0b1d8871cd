// The bench's typical load: each client asks at its period, the probes spread evenly over theirs.
import t from 'tap';
import { requestsPerSecond, schedule, TYPICAL_LOAD, type Client } from '../../bench/typical-load.js';

const client = (name: string, path: string, periodMs: number): Client => ({ name, path, periodMs, headers: {}, keepAlive: true, timeoutMs: 1_000 });

t.test('a per-shard client is one client per shard, spread over its period, and the rest start at 0', async (t) => {
  const load = [client('probe', '/shards/{id}/ready', 1_000), client('list', '/shards', 500)];
  const plan = schedule(load, ['a', 'b', 'c', 'd'], 2_000);
  t.same(
    plan.filter((r) => r.client === 'probe').map((r) => [r.at, r.path]),
    [
      [0, '/shards/a/ready'],
      [250, '/shards/b/ready'],
      [500, '/shards/c/ready'],
      [750, '/shards/d/ready'],
      [1_000, '/shards/a/ready'],
      [1_250, '/shards/b/ready'],
      [1_500, '/shards/c/ready'],
      [1_750, '/shards/d/ready'],
    ],
  );
  t.same(
    plan.filter((r) => r.client === 'list').map((r) => r.at),
    [0, 500, 1_000, 1_500],
  );
  t.same(plan.map((r) => r.at), [...plan.map((r) => r.at)].sort((a, b) => a - b), 'in time order');
  t.same(plan.slice(0, 2).map((r) => r.client), ['probe', 'list'], 'requests due together keep the order of the clients');
});

t.test('the typical load is every shard every 5 s, the list every second, a scrape every 15 s and the page every 5 s', async (t) => {
  const ids = Array.from({ length: 64 }, (_, i) => `shard-${i}`);
  const plan = schedule(TYPICAL_LOAD, ids, 15_000);
  const count = (path: string) => plan.filter((r) => r.path === path).length;
  t.equal(count('/shards/shard-7/ready'), 3);
  t.equal(count('/shards'), 15);
  t.equal(count('/metrics'), 1);
  t.equal(count('/'), 3);
  t.equal(plan.length, 64 * 3 + 15 + 1 + 3);
  t.equal(requestsPerSecond(TYPICAL_LOAD, 64), plan.length / 15);
  const probes = plan.filter((r) => r.client === 'readiness probe').map((r) => r.at);
  const gaps = probes.slice(1).map((at, i) => at - probes[i]!);
  t.ok(gaps.every((gap) => Math.abs(gap - 5_000 / 64) < 1e-9), 'probes are evenly spaced: no bursts');
  const probe = TYPICAL_LOAD.find((c) => c.path.includes('{id}'))!;
  t.equal(probe.keepAlive, false, 'a kubelet opens a new connection for every probe');
  t.match(TYPICAL_LOAD.find((c) => c.path === '/')!.headers.accept, /^text\/html/);
});
