// 100 hang-and-kill cycles: nvidia-smi hangs with a grandchild holding its stdout, the runner kills
// the process group at a 300 ms deadline, again and again. Afterwards no process of any group the
// fake logged is alive, no grandchild is, nothing carrying the fake's environment is, and the
// runner counts no running child. Cycles go through HTTP (the snapshot path, both queries at once)
// and straight through the runner, a few at a time, to keep the file well under a minute.
import t from 'tap';
import { isCodedError } from '../../src/errors.js';
import { buildTestApp, manualClock } from '../helpers/app.js';
import { eightGpuNode, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { isProcessAlive, killLeftovers, leftoversOf } from '../helpers/process-scan.js';

const HTTP_CYCLES = 20;
const DIRECT_CYCLES = 80;
const CONCURRENCY = 4;

t.test(`${HTTP_CYCLES + DIRECT_CYCLES} hang-and-kill cycles leave no process behind`, async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, {
    scenario: { ...eightGpuNode(), failures: { all: { kind: 'hang' } } },
    config: { smiTimeoutMs: 300, cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now },
  });
  t.teardown(() => killLeftovers(fake));
  const started = performance.now();
  const codes = new Map<string, number>();
  const count = (code: string) => codes.set(code, (codes.get(code) ?? 0) + 1);

  for (let i = 0; i < HTTP_CYCLES; i += 1) {
    clock.advance(30_000); // past the remembered failure's window (it backs off up to 30 s): every request runs nvidia-smi again
    const res = await app.inject({ method: 'GET', url: '/gpus' });
    count(`${res.statusCode} ${res.json().code}`);
  }

  const smi = app.services.driver;
  for (let i = 0; i < DIRECT_CYCLES; i += CONCURRENCY) {
    const round = Array.from({ length: Math.min(CONCURRENCY, DIRECT_CYCLES - i) }, (_, j) =>
      ((i + j) % 2 === 0 ? smi.queryGpus() : smi.queryComputeApps()).then(
        () => 'resolved',
        (err: unknown) => (isCodedError(err) ? err.code : String(err)),
      ),
    );
    for (const outcome of await Promise.all(round)) count(outcome);
  }
  const elapsed = performance.now() - started;

  t.same(
    [...codes],
    [
      ['503 NODECOMPUTE_NVIDIA_SMI_TIMEOUT', HTTP_CYCLES],
      ['NODECOMPUTE_NVIDIA_SMI_TIMEOUT', DIRECT_CYCLES],
    ],
    'every cycle ended in the timeout error',
  );
  // The fake logs its invocation once it has started; on a loaded machine most runs are killed at the
  // 300 ms deadline before that, so only some are logged. One proves the leftovers checked are real.
  t.ok(fake.invocations().length >= 1, `nvidia-smi started (${fake.invocations().length} logged invocations)`);
  t.ok(fake.spawned().length >= 1, `some hung runs got as far as starting their grandchild (${fake.spawned().length})`);

  await waitUntil(() => smi.running === 0, { timeoutMs: 20_000, what: 'the runner to see every child exit' });
  t.equal(smi.running, 0, 'app.services.driver.running === 0');
  await waitUntil(() => leftoversOf(fake).length === 0, { timeoutMs: 20_000, what: 'every nvidia-smi process to be gone' });
  t.same(leftoversOf(fake), [], 'no live process in any group the fake logged, nor with its environment');
  t.same(
    fake.spawned().filter((s) => isProcessAlive(s.childPid)).map((s) => s.childPid),
    [],
    'every grandchild that held stdout is dead',
  );
  t.ok(elapsed < 60_000, `the cycles took ${Math.round(elapsed / 1000)} s`);
});
