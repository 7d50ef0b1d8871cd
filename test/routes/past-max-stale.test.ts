// Verdicts once nvidia-smi has failed for longer than max-stale (0 here, so at once): its last good
// listing still holds against a shard, never for it. A shard it last saw ready keeps serving
// (unverified, 200); one it last saw starting, on the CPU or on a GPU no longer listed keeps that
// verdict (503); one it never saw, registered since, reads starting, unless an earlier run of
// nodecompute registered it (that run may have seen it ready). Real shard processes, the fake
// nvidia-smi, the real /proc.
import { existsSync } from 'node:fs';
import t from 'tap';
import { buildTestApp, manualClock, settle, spawnShardProcess, type ShardProcess } from '../helpers/app.js';
import { failDriver, REFRESH_FAILED_SAID } from '../helpers/backend.js';
import { waitUntil, type FakeProcess } from '../helpers/fake-nvidia-smi.js';
import { setup, twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';
import type { App } from '../../src/app.js';

const HELD = new RegExp(`^the GPU driver cannot be asked, so this verdict holds until it answers: ${REFRESH_FAILED_SAID}`);
/** How a held verdict's reason begins: what nvidia-smi's last good listing showed, and when it was taken. */
const SHOWED = "^the GPU driver cannot be asked; the GPU driver's last good listing \\(\\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z, [^)]+ ago\\) showed: ";

async function probe(app: App, id: string) {
  const res = await app.inject({ method: 'GET', url: `/shards/${id}/ready` });
  return { status: res.statusCode, ...res.json() };
}

const holding = (pid: number, gpu: number): FakeProcess => ({ gpuUuid: UUIDS[gpu]!, pid, name: 'llama-server', usedMiB: 4096 });

t.test("past max-stale, nvidia-smi's last word holds against a shard, never for it", async (t) => {
  const [served, loading, cpu, late, idle] = (await Promise.all([1, 1, 1, 0, 0].map((children) => spawnShardProcess(t, children)))) as [ShardProcess, ShardProcess, ShardProcess, ShardProcess, ShardProcess];
  const { app, fake, step, setProcesses } = await setup(t);
  setProcesses([holding(served.members[0]!, 0)]);
  const put = async (id: string, payload: object) => t.equal((await app.inject({ method: 'PUT', url: `/shards/${id}`, payload })).statusCode, 201, `${id} registered`);
  await put('served', { pid: served.pid, gpus: [0] });
  await put('loading', { pid: loading.pid, gpus: [1], graceMs: 60_000 });
  await put('cpu', { pid: cpu.pid, gpus: [1], graceMs: 0 });
  // A probe waits 800 ms at most for a snapshot that includes a registration (longer on a loaded
  // machine): probe again, after each refresh, until one does.
  let seen: Array<{ state: string; cause: string | null }> = [];
  for (let tries = 0; tries < 50; tries += 1) {
    step();
    await settle(app);
    seen = await Promise.all(['served', 'loading', 'cpu'].map((id) => probe(app, id)));
    if (!seen.some((v) => v.cause === 'awaiting-snapshot' || v.cause === 'not-in-snapshot')) break;
  }
  t.same(seen.map((v) => [v.state, v.cause]), [['ready', null], ['starting', 'awaiting-gpu-memory'], ['on-cpu', 'no-gpu-memory']], 'what the last good listing shows');

  failDriver(fake, { kind: 'driver-unreachable' });
  step();
  const ready = await probe(app, 'served');
  t.match(ready, { status: 200, state: 'unverified', cause: 'nvidia-smi-unavailable', warnings: [/^the GPU driver cannot be asked, so where this shard computes is unverified and it keeps serving: /] }, 'seen ready: keeps serving');
  const starting = await probe(app, 'loading');
  t.match(starting, { status: 503, state: 'starting', cause: 'awaiting-gpu-memory', reason: new RegExp(`${SHOWED}waiting for the shard to hold memory on GPU 1 .* grace left\\.$`), warnings: [HELD] }, 'seen starting: still starting');
  const onCpu = await probe(app, 'cpu');
  t.match(onCpu, { status: 503, state: 'on-cpu', cause: 'no-gpu-memory', reason: new RegExp(`${SHOWED}placed on GPU 1 but computing on the CPU: its processes hold no memory on GPU 1`), warnings: [HELD] }, 'seen on the CPU: still on-cpu');

  // Its grace ends while nvidia-smi fails: no listing begun after it can say where it computes.
  step(60_000);
  t.match(
    await probe(app, 'loading'),
    { status: 503, state: 'starting', cause: 'awaiting-listing', reason: /grace is over, but the GPU driver's latest listing was begun .* before the grace ended: the verdict waits for a listing begun after the grace\.$/ },
    'a grace ended since reads as waiting for a listing, not as on-cpu',
  );

  // Registered since the last good listing: never seen on its GPU, so starting, within its grace and after it.
  await put('late', { pid: late.pid, gpus: [0], graceMs: 1000 });
  await put('no-gpu', { pid: idle.pid, gpus: [] });
  for (const wait of [0, 5000]) {
    step(wait);
    t.match(
      await probe(app, 'late'),
      { status: 503, state: 'starting', cause: 'awaiting-nvidia-smi', reason: /^registered .* ago, and no listing of the GPU driver since has included it, so it has not been seen holding memory on GPU 0: it reads starting until the GPU driver answers/, warnings: [new RegExp(`^the GPU driver cannot be asked: ${REFRESH_FAILED_SAID}`)] },
      `never seen, ${wait} ms on`,
    );
  }
  t.match(await probe(app, 'no-gpu'), { status: 200, state: 'unverified' }, 'a shard given no GPU has nothing to be seen on: it keeps serving');

  const list = (await app.inject({ method: 'GET', url: '/shards' })).json();
  t.same(
    list.shards.map((s: { id: string; status: { state: string } }) => [s.id, s.status.state]),
    [['cpu', 'on-cpu'], ['late', 'starting'], ['loading', 'starting'], ['no-gpu', 'unverified'], ['served', 'unverified']],
    'the list says the same',
  );

  // nvidia-smi answers again: the loading shard now holds its GPU, the one on the CPU still does not.
  fake.setScenario({ ...twoGpuNode([holding(served.members[0]!, 0), holding(loading.members[0]!, 1), holding(late.pid, 0)]), delayMs: 300 });
  // The first probe after the back-off runs nvidia-smi again and waits for it; probes meanwhile get
  // the held verdicts at once.
  step(30_000);
  const retrying = probe(app, 'served');
  await waitUntil(() => app.services.node.snapshots.refreshing, { what: 'the retry to start' });
  t.match(await probe(app, 'cpu'), { status: 503, state: 'on-cpu', warnings: [HELD] }, 'a probe during the retry is not held up by it');
  await retrying;
  await settle(app);
  const after = await Promise.all(['served', 'loading', 'cpu', 'late'].map((id) => probe(app, id)));
  t.same(after.map((v) => v.state), ['ready', 'ready', 'on-cpu', 'ready'], 'a fresh listing decides again');
});

t.test('past max-stale, a GPU that left the listing still makes its shard gpu-lost when nvidia-smi then fails without naming it', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, fake, step, setProcesses } = await setup(t);
  setProcesses([holding(shard.members[0]!, 1)]);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s1', payload: { pid: shard.pid, gpus: [1], graceMs: 0 } })).statusCode, 201);
  step();
  t.equal((await probe(app, 's1')).state, 'ready');
  fake.update((s) => ({ ...s, gpus: s.gpus.slice(0, 1), processes: [] }));
  step();
  t.equal((await probe(app, 's1')).cause, 'gpu-not-listed', 'it drops out of the listing');
  failDriver(fake, { kind: 'driver-unreachable' });
  step();
  t.match(await probe(app, 's1'), { status: 503, state: 'gpu-lost', cause: 'gpu-not-listed', reason: new RegExp(`${SHOWED}placed on GPU 1, but GPU 1 \\(GPU-22222222`), warnings: [HELD] });
});

t.test('with no good listing in this run, a shard an earlier run registered keeps serving; one registered in this run reads starting', async (t) => {
  const [earlier, now] = await Promise.all([spawnShardProcess(t, 1), spawnShardProcess(t, 1)]);
  const clock = manualClock();
  const first = await buildTestApp(t, { scenario: twoGpuNode([holding(earlier.members[0]!, 0)]), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  t.equal((await first.app.inject({ method: 'PUT', url: '/shards/earlier', payload: { pid: earlier.pid, gpus: [0] } })).statusCode, 201);
  clock.advance(1);
  t.equal((await probe(first.app, 'earlier')).state, 'ready');
  await first.app.close();

  clock.advance(60_000);
  const scenario = { ...twoGpuNode([holding(earlier.members[0]!, 0)]), failures: { all: { kind: 'driver-unreachable' as const } } };
  const second = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0, stateFile: first.config.stateFile }, deps: { now: clock.now } });
  t.match(await probe(second.app, 'earlier'), { status: 200, state: 'unverified', cause: 'nvidia-smi-unavailable' }, 'restored from the state file: an earlier run may have seen it ready');
  t.equal((await second.app.inject({ method: 'PUT', url: '/shards/now', payload: { pid: now.pid, gpus: [1] } })).statusCode, 201);
  clock.advance(1);
  t.match(await probe(second.app, 'now'), { status: 503, state: 'starting', cause: 'awaiting-nvidia-smi' }, 'registered in this run, never seen on its GPU');
});

t.test('past max-stale, a shard whose process that held its GPU has exited since (its engine restarted) has not been seen on it', async (t) => {
  const shard = await spawnShardProcess(t, 2);
  const [holder, other] = shard.members as [number, number];
  const { app, fake, step, setProcesses } = await setup(t);
  setProcesses([holding(holder, 0)]);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0], graceMs: 0 } })).statusCode, 201);
  step();
  t.equal((await probe(app, 's')).state, 'ready');
  failDriver(fake, { kind: 'driver-unreachable' });
  step();
  t.equal((await probe(app, 's')).state, 'unverified', 'its holder still runs: it keeps serving');

  process.kill(holder, 'SIGKILL');
  await waitUntil(() => !existsSync(`/proc/${holder}`), { what: `process ${holder} to be reaped` });
  t.ok(existsSync(`/proc/${other}`) && existsSync(`/proc/${shard.pid}`), 'the shard itself still runs');
  step(30_000); // past the failure back-off: the next refresh fails again, and reads /proc again
  const verdict = await probe(app, 's');
  t.match(verdict, { status: 503, state: 'starting', cause: 'awaiting-nvidia-smi', reason: new RegExp(`^every process that held its memory on GPU 0 in the GPU driver's last good listing .* has exited since`) });
});

t.test('within max-stale, a shard registered while nvidia-smi fails is not admitted either', async (t) => {
  const [served, late] = (await Promise.all([1, 0].map((children) => spawnShardProcess(t, children)))) as [ShardProcess, ShardProcess];
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode([holding(served.members[0]!, 0)]), config: { cacheTtlMs: 0, maxStaleMs: 60_000 }, deps: { now: clock.now } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/served', payload: { pid: served.pid, gpus: [0] } })).statusCode, 201);
  clock.advance(1);
  t.equal((await probe(app, 'served')).state, 'ready');
  failDriver(fake, { kind: 'driver-unreachable' });
  clock.advance(1);
  await probe(app, 'served');
  await settle(app);
  t.match(await probe(app, 'served'), { status: 200, state: 'ready', warnings: [/older snapshot: the last refresh failed/] }, 'seen ready: served from the last good snapshot');
  t.equal((await app.inject({ method: 'PUT', url: '/shards/late', payload: { pid: late.pid, gpus: [1], graceMs: 0 } })).statusCode, 201);
  clock.advance(1);
  t.match(await probe(app, 'late'), { status: 503, state: 'starting', cause: 'awaiting-nvidia-smi', reason: /after the GPU driver's last good listing began/ }, 'never seen on its GPU: starting, not unverified');
});
