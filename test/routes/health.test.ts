// /readyz (JSON and the Kubernetes-style checklist), conditional GETs for pollers, and errors for
// routes that do not exist.
import t from 'tap';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { DRIVER_FAILED, failDriver, REFRESH_FAILED_SAID } from '../helpers/backend.js';
import { eightGpuNode, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';

t.test('/readyz: 200 from the cache when nvidia-smi answers; ?verbose gives the checklist', async (t) => {
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/readyz' });
  t.equal(res.statusCode, 200);
  t.match(res.json(), { status: 'ok', stale: false, ageMs: Number });
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(verbose.statusCode, 200);
  t.match(verbose.headers['content-type'], /^text\/plain/);
  t.match(verbose.body, /^\[\+\]nvidia-smi ok: snapshot (\d+ ms|\d+\.\d s) old, 8 GPUs\n\[\+\]host-pid-namespace ok: .*\n\[\+\]state-file ok: registrations are stored in .*\/state\/shards\.json\nreadyz check passed\n$/);
});

t.test('/readyz: 503 when nvidia-smi PIDs are not in this /proc (no host PID namespace)', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/readyz' });
  t.equal(res.statusCode, 503);
  t.equal(res.json().code, 'NODECOMPUTE_PID_NAMESPACE');
  t.match(res.json().message, 'hostPID: true');
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose=1' });
  t.equal(verbose.statusCode, 503);
  t.match(verbose.body, /\[-\]host-pid-namespace failed: .*--pid=host[^]*readyz check failed\n$/);
});

t.test('/readyz: 503 when nvidia-smi lists no process while GPUs hold memory (processes hidden), and a shard stays unverified past its grace', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: { ...eightGpuNode(), processes: [] }, config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  const res = await app.inject({ method: 'GET', url: '/readyz' });
  t.equal(res.statusCode, 503);
  t.equal(res.json().code, 'NODECOMPUTE_PID_NAMESPACE');
  t.match(res.json().message, /the GPU driver lists no GPU process, yet GPU 0, GPU 1, .*GPU 7 have memory in use: the processes are hidden from it/);
  await app.inject({ method: 'PUT', url: '/shards/h', payload: { pid: shard.pid, gpus: [0], graceMs: 1000 } });
  clock.advance(1001);
  const probe = await app.inject({ method: 'GET', url: '/shards/h/ready' });
  t.equal(probe.statusCode, 200, 'no evidence either way: it keeps serving');
  t.equal(probe.json().state, 'unverified');
  t.match(probe.json().warnings, [/the processes are hidden from it/]);
});

t.test('/readyz: 503 with the driver error when there is no snapshot', async (t) => {
  const { app } = await buildTestApp(t, { scenario: { ...eightGpuNode(), failures: { all: { kind: 'driver-unreachable' } } } });
  const res = await app.inject({ method: 'GET', url: '/readyz' });
  t.equal(res.statusCode, 503);
  t.equal(res.json().code, DRIVER_FAILED);
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.match(verbose.body, new RegExp(`^\\[-\\]nvidia-smi failed: ${REFRESH_FAILED_SAID}`));
});

t.test('pollers: ETag and Cache-Control; If-None-Match gets 304 until what the answer says changes', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 10_000 }, deps: { now: clock.now } });
  const first = await app.inject({ method: 'GET', url: '/shards' });
  const etag = first.headers.etag as string;
  t.match(etag, /^W\/"[\w-]{16}"$/, 'weak: the ageMs in the body moves while what it says does not');
  t.equal(first.headers['cache-control'], 'max-age=10');
  clock.advance(4200);
  const again = await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': etag } });
  t.equal(again.statusCode, 304);
  t.equal(again.body, '');
  t.equal(again.headers['cache-control'], 'max-age=5', 'the remaining TTL, rounded down');
  const strong = etag.slice(2);
  t.equal((await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': `"other", ${strong}` } })).statusCode, 304, 'strong and listed tags match');
  t.equal((await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': '*' } })).statusCode, 304);

  await app.inject({ method: 'PUT', url: '/shards/p', payload: { pid: shard.pid, gpus: [] } });
  const changed = await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': etag } });
  t.equal(changed.statusCode, 200, 'a registry change changes the ETag');
  t.equal(changed.json().shards.length, 1);
  const etag2 = changed.headers.etag as string;
  t.not(etag2, etag);
  const one = await app.inject({ method: 'GET', url: '/shards/p' });
  const oneTag = one.headers.etag as string;
  t.match([one.statusCode, oneTag], [200, /^W\/"[\w-]{16}"$/], 'one shard has its own ETag');
  t.equal((await app.inject({ method: 'GET', url: '/shards/p', headers: { 'if-none-match': oneTag } })).statusCode, 304);
  await app.inject({ method: 'PUT', url: '/shards/p', payload: { pid: shard.pid, gpus: [], engine: 'vllm' } });
  const engineChanged = await app.inject({ method: 'GET', url: '/shards/p', headers: { 'if-none-match': oneTag } });
  t.same([engineChanged.statusCode, engineChanged.json().engine], [200, 'vllm'], 'its registration changed: a new answer');
  await app.inject({ method: 'PUT', url: '/shards/p', payload: { pid: shard.pid, gpus: [] } });

  const gpus = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal((await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': gpus.headers.etag as string } })).statusCode, 304);
  const foreign = await app.inject({ method: 'GET', url: '/gpus/foreign-memory' });
  t.equal((await app.inject({ method: 'GET', url: '/gpus/foreign-memory', headers: { 'if-none-match': foreign.headers.etag as string } })).statusCode, 304);

  // Let the refresh the registration asked for finish before the node changes.
  await settle(app);
  fake.update((s) => ({ ...s, gpus: s.gpus.map((gpu) => ({ ...gpu, usedMiB: 1 })) }));
  clock.advance(10_001);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  const refreshed = await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': gpus.headers.etag as string } });
  t.equal(refreshed.statusCode, 200, 'a snapshot saying something new changes the ETag');
  t.equal(refreshed.json().gpus[0].memory.usedMiB, 1);
});

t.test('pollers slower than the cache TTL get 304 while the node says the same, across new snapshots', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 1_000 }, deps: { now: clock.now } });
  await app.inject({ method: 'PUT', url: '/shards/p', payload: { pid: shard.pid, gpus: [] } });
  await app.inject({ method: 'GET', url: '/shards' });
  await settle(app);
  const urls = ['/gpus', '/gpus/foreign-memory', '/shards'];
  const tags = new Map<string, string>();
  for (const url of urls) tags.set(url, (await app.inject({ method: 'GET', url })).headers.etag as string);
  const observed = new Set<string>();
  for (let poll = 0; poll < 3; poll += 1) {
    // A poll every 3 s: each one finds the snapshot expired and is answered while a new one is taken.
    clock.advance(3_000);
    for (const url of urls) {
      const res = await app.inject({ method: 'GET', url, headers: { 'if-none-match': tags.get(url)! } });
      t.equal(res.statusCode, 304, `${url}, poll ${poll + 1}: nothing changed`);
      t.equal(res.headers.etag, tags.get(url));
    }
    observed.add(app.services.node.peek()!.view.observedAt.toString());
    await settle(app);
  }
  t.equal(observed.size, 3, 'each poll saw another snapshot');
  fake.update((s) => ({ ...s, gpus: s.gpus.map((gpu, i) => (i === 3 ? { ...gpu, usedMiB: 2048 } : gpu)) }));
  clock.advance(3_000);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  for (const url of ['/gpus', '/gpus/foreign-memory']) {
    t.equal((await app.inject({ method: 'GET', url, headers: { 'if-none-match': tags.get(url)! } })).statusCode, 200, `${url}: memory in use changed`);
  }
});


t.test('pollers: a verdict whose reason says something new gets a new /shards ETag, in the same state and cause; one whose reason only counts time does not', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 1_000 }, deps: { now: clock.now } });
  await app.inject({ method: 'PUT', url: '/shards/p', payload: { pid: shard.pid, gpus: [3], graceMs: 0, engine: 'llama.cpp' } });
  await app.inject({ method: 'GET', url: '/shards' });
  await settle(app);
  const first = await app.inject({ method: 'GET', url: '/shards' });
  const before = first.json().shards[0].status.reason as string;
  t.match(before, /hold no memory on GPU 3, [\d.]+ (ms|s) after registration/, 'on-cpu, the reason counting time');
  clock.advance(3_000);
  await app.inject({ method: 'GET', url: '/shards' });
  await settle(app);
  const later = await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': first.headers.etag as string } });
  t.equal(later.statusCode, 304, 'the same cause, only later');
  t.not((await app.inject({ method: 'GET', url: '/shards' })).json().shards[0].status.reason, before, 'though its words moved with the time');

  // Engine output that says nothing about where it computes: the advice changes, nothing else does.
  const posted = await app.inject({ method: 'POST', url: '/shards/p/engine-output', payload: 'main: server is listening on http://127.0.0.1:8080\n', headers: { 'content-type': 'text/plain' } });
  t.equal(posted.statusCode, 200, posted.body);
  const told = await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': first.headers.etag as string } });
  t.equal(told.statusCode, 200, 'the reason now says what the output lacks: a change a poller must see');
  t.match(told.json().shards[0], { status: { state: 'on-cpu', cause: 'no-gpu-memory', reason: /says nothing about where llama\.cpp computes/ }, compute: { engine: null } });
  t.match(first.json().shards[0], { status: { state: 'on-cpu', cause: 'no-gpu-memory' }, compute: { engine: null } });
});

t.test('pollers: the ETag changes when the driver fails, so a 304 never hides it; a routine refresh is no change', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 10_000, maxStaleMs: 60_000 }, deps: { now: clock.now } });
  for (const url of ['/gpus', '/gpus/foreign-memory', '/shards']) {
    const fresh = await app.inject({ method: 'GET', url });
    t.equal(fresh.json().stale, false, url);
    t.equal((await app.inject({ method: 'GET', url, headers: { 'if-none-match': fresh.headers.etag as string } })).statusCode, 304, `${url}: fresh, unchanged`);
  }
  const fresh = await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  failDriver(fake, { kind: 'driver-unreachable' });
  clock.advance(10_001);
  // The TTL has passed: the answer is stale while its refresh runs (and fails); the node said the same.
  const expired = await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': fresh.headers.etag as string } });
  t.equal(expired.statusCode, 304, 'stale while refreshing is no change');
  t.equal(expired.headers['cache-control'], 'max-age=0');
  await settle(app);
  for (const url of ['/gpus', '/gpus/foreign-memory']) {
    const failing = await app.inject({ method: 'GET', url, headers: { 'if-none-match': fresh.headers.etag as string } });
    t.equal(failing.statusCode, 200, `${url}: failing is a change`);
    t.match(failing.json(), { stale: true, staleReason: /failed/ });
    t.not(failing.headers.etag, expired.headers.etag);
    t.equal((await app.inject({ method: 'GET', url, headers: { 'if-none-match': failing.headers.etag as string } })).statusCode, 304, `${url}: still failing, unchanged`);
  }
});

t.test('pollers: a refresh far slower than usual changes the ETag too, so a hang shows before it fails', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 1_000, maxStaleMs: 600_000, smiTimeoutMs: 600_000 }, deps: { now: clock.now } });
  const fresh = await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  fake.update((s) => ({ ...s, delayMs: 600_000 }));
  clock.advance(1_001);
  const routine = await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': fresh.headers.etag as string } });
  t.equal(routine.statusCode, 304, 'a refresh just begun is routine');
  clock.advance(1_500);
  const slow = await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': fresh.headers.etag as string } });
  t.equal(slow.statusCode, 200, 'the refresh has run 1.5 s, far longer than usual');
  t.match(slow.json().staleReason, /^the GPU driver is slow/);
  t.equal(slow.headers.etag, `${(fresh.headers.etag as string).slice(0, -1)}-s"`);
  t.equal((await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': slow.headers.etag as string } })).statusCode, 304, 'still slow, unchanged');
});

t.test('unknown routes are a coded 404 pointing at the docs', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/gpu?x=1' });
  t.equal(res.statusCode, 404);
  t.same(res.json(), { statusCode: 404, code: 'NODECOMPUTE_NOT_FOUND', error: 'Not Found', message: 'No route GET /gpu. The API is listed at /docs and /openapi.json.' });
});

t.test("engine output that changes the engine's account changes the /shards ETag, not the GPU views", async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 60_000 } });
  await app.inject({ method: 'PUT', url: '/shards/e', payload: { pid: shard.pid, gpus: [], engine: 'llama.cpp' } });
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).headers.etag as string;
  const shards = (await app.inject({ method: 'GET', url: '/shards' })).headers.etag as string;
  const post = (text: string) => app.inject({ method: 'POST', url: '/shards/e/engine-output', payload: text, headers: { 'content-type': 'text/plain' } });
  t.equal((await post('main: loading model\n')).json().account, null);
  t.equal((await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': shards } })).statusCode, 304, 'output that says nothing yet is no change');
  const posted = await post('ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n');
  t.equal(posted.statusCode, 200);
  t.not(posted.json().account, null);
  t.equal((await app.inject({ method: 'GET', url: '/gpus', headers: { 'if-none-match': gpus } })).statusCode, 304);
  t.equal((await app.inject({ method: 'GET', url: '/shards', headers: { 'if-none-match': shards } })).statusCode, 200);
});
