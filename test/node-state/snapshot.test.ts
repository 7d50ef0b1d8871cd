// The snapshot cache's contract, with a controllable take() and clock: TTL, single-flight,
// stale-while-revalidate, failure memory and the per-call wait budget.
import t from 'tap';
import { pino } from 'pino';
import { createSnapshotSource, slowAfterMs, staleNews } from '../../src/node-state/snapshot.js';
import { NvidiaSmiFailedError } from '../../src/errors.js';

const log = pino({ level: 'silent' });

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (err: Error) => void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (err: Error) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** A take() whose every call is a deferred the test settles, and a clock the test moves. */
function harness(options: { ttlMs?: number; maxStaleMs?: number } = {}) {
  let clock = 1_000_000;
  const calls: Deferred<{ n: number }>[] = [];
  const source = createSnapshotSource<{ n: number }>({
    take: () => {
      const d = deferred<{ n: number }>();
      calls.push(d);
      return d.promise;
    },
    ttlMs: options.ttlMs ?? 1000,
    maxStaleMs: options.maxStaleMs ?? 30_000,
    log,
    now: () => clock,
  });
  return {
    source,
    calls,
    advance: (ms: number) => {
      clock += ms;
    },
  };
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

/** A harness whose first snapshot ({ n: 1 }) has been taken. */
async function warmed(options: Parameters<typeof harness>[0] = {}) {
  const h = harness(options);
  const first = h.source.get();
  h.calls[0]!.resolve({ n: 1 });
  await first;
  return h;
}

t.test('the first request waits; concurrent requests share one take()', async (t) => {
  const h = harness();
  const answers = Array.from({ length: 500 }, () => h.source.get());
  t.equal(h.calls.length, 1, 'one take for 500 concurrent cold requests');
  t.equal(h.source.refreshing, true);
  h.calls[0]!.resolve({ n: 1 });
  const views = await Promise.all(answers);
  t.ok(views.every((view) => view.snapshot.n === 1 && view.stale === false && view.staleReason === null));
  t.equal(h.source.generation, 1);
  t.equal(h.source.refreshing, false);
});

t.test('within the TTL the cache answers without taking', async (t) => {
  const h = await warmed();
  h.advance(999);
  const view = await h.source.get();
  t.equal(h.calls.length, 1);
  t.equal(view.ageMs, 999);
  t.equal(view.stale, false);
});

t.test('past the TTL: answered at once from the cache (stale) while one background refresh runs', async (t) => {
  const h = await warmed();
  h.advance(1500);
  const views = await Promise.all([h.source.get(), h.source.get(), h.source.get()]);
  t.equal(h.calls.length, 2, 'one background refresh for three requests');
  t.ok(views.every((view) => view.snapshot.n === 1 && view.stale));
  t.match(views[0]!.staleReason, /^refreshing: .*1\.5 s old/, 'routine: nothing against nvidia-smi');
  t.same([views[0]!.failing, views[0]!.slow], [false, false]);
  h.calls[1]!.resolve({ n: 2 });
  await flush();
  const fresh = await h.source.get();
  t.equal(fresh.snapshot.n, 2);
  t.equal(fresh.stale, false);
});

t.test('a failed refresh is served stale with its reason, and not retried within the TTL', async (t) => {
  const h = await warmed();
  h.advance(1500);
  await h.source.get();
  h.calls[1]!.reject(new NvidiaSmiFailedError('driver gone'));
  await flush();
  const view = await h.source.get();
  t.equal(view.stale, true);
  t.match(view.staleReason, /failed: driver gone$/);
  t.equal(h.calls.length, 2, 'no retry storm right after a failure');
  h.advance(1001);
  await h.source.get();
  t.equal(h.calls.length, 3, 'retried once the TTL window passed');
});

t.test('beyond max-stale callers wait, and get the error when the refresh fails', async (t) => {
  const h = await warmed({ ttlMs: 1000, maxStaleMs: 5000 });
  h.advance(6000);
  const waiting = h.source.get();
  t.equal(h.calls.length, 2);
  h.calls[1]!.reject(new NvidiaSmiFailedError('no devices'));
  await t.rejects(waiting, { code: 'NODECOMPUTE_NVIDIA_SMI_FAILED', message: 'no devices' });
  await t.rejects(h.source.get(), { message: 'no devices' }, 'the remembered failure answers at once');
  t.equal(h.calls.length, 2);
  t.equal(h.source.peek()?.snapshot.n, 1, 'peek still shows the last good snapshot');
});

t.test('a cold failure is remembered for one TTL window, then retried', async (t) => {
  const h = harness();
  const first = h.source.get();
  h.calls[0]!.reject(new NvidiaSmiFailedError('nope'));
  await t.rejects(first);
  t.equal(h.source.peek(), null);
  await t.rejects(h.source.get());
  t.equal(h.calls.length, 1);
  h.advance(1000);
  const retry = h.source.get();
  t.equal(h.calls.length, 2);
  h.calls[1]!.resolve({ n: 7 });
  t.equal((await retry).snapshot.n, 7);
});

t.test('while the retry after a failure runs, only its caller waits: the others get the failure at once', async (t) => {
  const h = harness();
  const first = h.source.get();
  h.calls[0]!.reject(new NvidiaSmiFailedError('driver gone'));
  await t.rejects(first);
  h.advance(1000);
  const retrying = h.source.get();
  t.equal(h.calls.length, 2, 'the window passed: this caller started the retry');
  await t.rejects(h.source.get({ maxWaitMs: 1000 }), { message: 'driver gone' }, 'a probe during the retry is answered the failure, not held');
  await t.rejects(h.source.get(), { message: 'driver gone' });
  t.equal(h.calls.length, 2, 'nobody started a second retry');
  t.equal(h.source.backOffMs, null, 'no back-off to tell while the retry runs');
  h.calls[1]!.resolve({ n: 2 });
  t.equal((await retrying).snapshot.n, 2, 'the caller that started the retry sees nvidia-smi answer again');
  t.equal((await h.source.get()).snapshot.n, 2);
});

t.test('with no failure on record, callers join the refresh under way (a cold start, or past max-stale)', async (t) => {
  const h = await warmed({ ttlMs: 1000, maxStaleMs: 5000 });
  h.advance(6000);
  const waiting = [h.source.get(), h.source.get()];
  t.equal(h.calls.length, 2, 'one refresh for both');
  h.calls[1]!.resolve({ n: 3 });
  t.same((await Promise.all(waiting)).map((view) => view.snapshot.n), [3, 3]);
});

t.test('failures in a row back off: one TTL, then twice, four times... up to 30 s; backOffMs says what is left', async (t) => {
  const h = harness({ ttlMs: 1000 });
  t.equal(h.source.backOffMs, null, 'nothing to wait out before any failure');
  const fail = async (n: number) => {
    const pending = h.source.get();
    t.equal(h.calls.length, n, `attempt ${n} ran`);
    t.equal(h.source.backOffMs, null, 'none while a refresh runs: its answer is the next news');
    h.calls[n - 1]!.reject(new NvidiaSmiFailedError(`failure ${n}`));
    await t.rejects(pending);
  };
  await fail(1);
  t.equal(h.source.backOffMs, 1000, 'the first window is one TTL');
  h.advance(1000);
  t.equal(h.source.backOffMs, null, 'past it, a request runs nvidia-smi again');
  await fail(2);
  h.advance(1999);
  t.equal(h.source.backOffMs, 1);
  await t.rejects(h.source.get(), { message: 'failure 2' }, 'still inside the doubled window');
  t.equal(h.calls.length, 2);
  h.advance(1);
  await fail(3);
  t.equal(h.source.backOffMs, 4000);
  for (let n = 4; n <= 7; n += 1) {
    h.advance(30_000);
    await fail(n);
  }
  t.equal(h.source.backOffMs, 30_000, 'the window stops growing at 30 s');
  h.advance(29_999);
  await t.rejects(h.source.get(), { message: 'failure 7' }, 'the window stops growing at 30 s');
  h.advance(1);
  const recovered = h.source.get();
  h.calls[7]!.resolve({ n: 1 });
  t.equal((await recovered).snapshot.n, 1);
  t.equal(h.source.backOffMs, null, 'a success ends the back-off');
});

t.test('maxWaitMs bounds how long a caller waits; the refresh goes on', async (t) => {
  const h = harness();
  const started = Date.now();
  await t.rejects(h.source.get({ maxWaitMs: 50 }), { code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT', message: /within this request's 50 ms/ });
  t.ok(Date.now() - started < 5000);
  t.equal(h.source.refreshing, true);
  h.calls[0]!.resolve({ n: 3 });
  t.equal((await h.source.get({ maxWaitMs: 50 })).snapshot.n, 3);
});

t.test('invalidate() makes the next request refresh in the background', async (t) => {
  const h = await warmed();
  h.source.invalidate();
  const view = await h.source.get();
  t.equal(view.snapshot.n, 1, 'answered at once from the cache');
  t.equal(view.stale, true, 'marked stale: it predates the registry change');
  t.match(view.staleReason, /registry changed/);
  t.equal(h.calls.length, 2, 'and a refresh started');
  t.equal((await h.source.get()).stale, true, 'still stale while that refresh runs');
  t.equal(h.calls.length, 2, 'which the next request shares');
  h.calls[1]!.resolve({ n: 2 });
  await flush();
  const after = await h.source.get();
  t.same([after.snapshot.n, after.stale, after.staleReason], [2, false, null]);
});

t.test('a registry change during a refresh: that refresh lands stale, and one more runs', async (t) => {
  const h = await warmed();
  h.advance(1500);
  await h.source.get();
  t.equal(h.calls.length, 2, 'a background refresh runs');
  h.source.invalidate();
  h.calls[1]!.resolve({ n: 2 });
  await flush();
  const landed = await h.source.get();
  t.same([landed.snapshot.n, landed.stale], [2, true], 'its snapshot is served, but marked stale: it started before the change');
  t.equal(h.calls.length, 3, 'and a refresh that includes the change started');
  h.calls[2]!.resolve({ n: 3 });
  await flush();
  const after = await h.source.get();
  t.same([after.snapshot.n, after.stale], [3, false]);
});

t.test('a failure right after invalidate() does not block the refresh it asked for', async (t) => {
  const h = harness();
  const first = h.source.get();
  h.calls[0]!.reject(new NvidiaSmiFailedError('first'));
  await t.rejects(first);
  h.source.invalidate();
  t.equal(h.source.backOffMs, null, 'nothing to wait out: the next request runs nvidia-smi');
  const next = h.source.get();
  t.equal(h.calls.length, 2);
  h.calls[1]!.resolve({ n: 9 });
  t.equal((await next).snapshot.n, 9);
});

t.test('with a TTL of 0, failures still back off: 1 ms, then 2 ms, so a wedged driver is not asked once per request', async (t) => {
  const h = harness({ ttlMs: 0, maxStaleMs: 0 });
  const first = h.source.get();
  h.calls[0]!.reject(new NvidiaSmiFailedError('x'));
  await t.rejects(first, { message: 'x' });
  await t.rejects(h.source.get(), { message: 'x' }, 'answered with the failure');
  t.equal(h.calls.length, 1, 'no new run inside the 1 ms window');
  h.advance(1);
  const second = h.source.get();
  t.equal(h.calls.length, 2, 'past it, a new run');
  h.calls[1]!.reject(new NvidiaSmiFailedError('x'));
  await t.rejects(second);
  h.advance(1);
  await t.rejects(h.source.get(), { message: 'x' });
  t.equal(h.calls.length, 2, 'the second window is 2 ms');
  h.advance(1);
  void h.source.get().catch(() => undefined);
  t.equal(h.calls.length, 3);
  h.calls[2]!.resolve({ n: 1 });
});

t.test('a recovery after failures resets the failure state', async (t) => {
  const h = harness({ ttlMs: 0, maxStaleMs: 0 });
  const a = h.source.get();
  h.calls[0]!.reject(new NvidiaSmiFailedError('same'));
  await t.rejects(a);
  h.advance(1);
  const b = h.source.get();
  h.calls[1]!.reject(new NvidiaSmiFailedError('same'));
  await t.rejects(b);
  h.advance(2);
  const c = h.source.get();
  h.calls[2]!.resolve({ n: 4 });
  const view = await c;
  t.equal(view.snapshot.n, 4);
  t.equal(view.staleReason, null);
});

t.test('staleReason says a refresh is due when none runs and none failed', async (t) => {
  const h = await warmed();
  h.advance(2000);
  const peeked = h.source.peek();
  t.equal(peeked?.stale, true);
  t.equal(peeked?.staleReason, 'a refresh is due');
});

t.test('a refresh is slow only past 3 times the last one\'s duration, and never below 1 s: only then does a stale answer blame nvidia-smi', async (t) => {
  t.equal(slowAfterMs(0), 1000, 'a fast node: the 1 s floor');
  t.equal(slowAfterMs(2000), 6000, 'a slow node: three times its usual time');
  const h = harness();
  const first = h.source.get();
  h.advance(500);
  h.calls[0]!.resolve({ n: 1 });
  await first;
  t.equal(staleNews(await h.source.get()), null, 'fresh: nothing to say');
  h.advance(1500);
  await h.source.get();
  t.equal(h.calls.length, 2, 'a refresh runs');
  h.advance(1499);
  const routine = await h.source.get();
  t.same([routine.stale, routine.slow, routine.failing], [true, false, false]);
  t.match(routine.staleReason, /^refreshing: .*3\.0 s old/);
  t.equal(staleNews(routine), null, 'routine: no warning');
  h.advance(2);
  const slow = await h.source.get();
  t.equal(slow.slow, true, 'past 3 x 500 ms');
  t.match(slow.staleReason, /^the GPU driver is slow: .*running for 1\.5 s .*took 500 ms.* 3\.0 s old.*dmesg.*nodecompute doctor/);
  t.equal(staleNews(slow), slow.staleReason, 'worth a warning');
  h.source.invalidate();
  t.match((await h.source.get()).staleReason, /^the GPU driver is slow: /, 'slowness outranks a registry change');
  h.calls[1]!.reject(new NvidiaSmiFailedError('driver gone'));
  await flush();
  const failed = h.source.peek()!;
  t.same([failed.failing, failed.slow, staleNews(failed)], [true, false, 'the last refresh failed: driver gone']);
});

t.test('ages past two minutes read in minutes, as every span does (formatDuration)', async (t) => {
  const h = await warmed({ maxStaleMs: 600_000 });
  h.advance(150_000);
  t.match((await h.source.get()).staleReason, /^refreshing: .*2\.5 min old/);
});

t.test('a snapshot behind a registry change, and one whose refresh is merely due, are not news', async (t) => {
  const h = await warmed();
  h.source.invalidate();
  t.equal(staleNews(await h.source.get()), null);
  h.calls[1]!.resolve({ n: 2 });
  await flush();
  h.advance(2000);
  const due = h.source.peek()!;
  t.same([due.staleReason, staleNews(due)], ['a refresh is due', null]);
});

t.test('lastError: the latest refresh\'s error until one succeeds', async (t) => {
  const h = harness();
  t.equal(h.source.lastError, null);
  const first = h.source.get();
  const error = new NvidiaSmiFailedError('nope');
  h.calls[0]!.reject(error);
  await t.rejects(first);
  t.equal(h.source.lastError, error);
  h.advance(1000);
  const retry = h.source.get();
  h.calls[1]!.resolve({ n: 1 });
  await retry;
  t.equal(h.source.lastError, null);
});
