// /readyz in the words an operator reads: which ?verbose values give the checklist, the stale
// reason in the JSON, the nvidia-smi line while the last good snapshot is served over failing
// refreshes, and the host-pid-namespace line when only some listed PIDs are missing (in the
// doctor's words), and the state-file line when registrations cannot be stored. The basics (200,
// 503 and their codes) are in health.test.ts.
import { writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { pino } from 'pino';
import t, { type Test } from 'tap';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { failDriver, REFRESH_FAILED_SAID } from '../helpers/backend.js';
import { eightGpuNode, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';
import { createStateFile } from '../../src/system/state-file.js';

/** A PID no test machine has (above the default pid_max of 4194304). */
const GONE_PID = 4_194_400;

t.test('?verbose: present, empty, true or 1 is the checklist; false or 0 is JSON, as without it; anything else a 400', async (t) => {
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  for (const query of ['?verbose', '?verbose=', '?verbose=true', '?verbose=1']) {
    const res = await app.inject({ method: 'GET', url: `/readyz${query}` });
    t.equal(res.statusCode, 200, query);
    t.match(res.headers['content-type'], /^text\/plain/, `${query}: the checklist`);
    t.match(res.body, /readyz check passed\n$/, query);
  }
  for (const query of ['', '?verbose=false', '?verbose=0']) {
    const res = await app.inject({ method: 'GET', url: `/readyz${query}` });
    t.equal(res.statusCode, 200, query);
    t.match(res.headers['content-type'], /^application\/json/, `${query}: JSON`);
    t.match(res.json(), { status: 'ok', stale: false }, query);
  }
  for (const value of ['yes', 'TRUE', 'constructor']) {
    const res = await app.inject({ method: 'GET', url: `/readyz?verbose=${value}` });
    t.equal(res.statusCode, 400, value);
    t.same(Object.keys(res.json()), ['statusCode', 'code', 'error', 'message']);
    t.match(res.json(), { statusCode: 400, code: 'NODECOMPUTE_BAD_REQUEST', error: 'Bad Request', message: `Invalid request: querystring/verbose is "${value}"` });
    t.match(res.json().message, /none, true or 1: the checklist; false or 0: JSON/);
  }
});

/**
 * An app whose nvidia-smi answered once and then fails, `ageMs` later (past the 1 s TTL): `refreshing`
 * is the answer that started the failing refresh, which has landed when this returns.
 */
async function failingAfterGoodSnapshot(t: Test, maxStaleMs: number, ageMs: number) {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 1000, maxStaleMs }, deps: { now: clock.now } });
  t.equal((await app.inject({ method: 'GET', url: '/readyz' })).statusCode, 200);
  failDriver(fake, { kind: 'driver-unreachable' });
  clock.advance(ageMs);
  const refreshing = await app.inject({ method: 'GET', url: '/readyz' });
  await settle(app);
  return { app, clock, refreshing };
}

t.test('a failing nvidia-smi within max-stale: readiness holds on the last good snapshot, the JSON says why it is stale, the checklist says so plainly', async (t) => {
  const { app, clock, refreshing } = await failingAfterGoodSnapshot(t, 30_000, 12_000);
  // The TTL had passed: that answer started the refresh (which failed) and served the snapshot meanwhile.
  t.equal(refreshing.statusCode, 200);
  t.match(refreshing.json(), { status: 'ok', stale: true, staleReason: String });

  const json = await app.inject({ method: 'GET', url: '/readyz' });
  t.equal(json.statusCode, 200, 'still ready: the last good snapshot is 12 s old, under max-stale');
  t.match(json.json(), { status: 'ok', ageMs: 12_000, stale: true, staleReason: new RegExp(`^the last refresh failed: ${REFRESH_FAILED_SAID}`) });

  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(verbose.statusCode, 200);
  const [nvidiaSmi] = verbose.body.split('\n');
  t.match(
    nvidiaSmi,
    /^\[\+\]nvidia-smi ok: serving the last good snapshot \(12\.0 s old, 8 GPUs\) because refreshing it fails; it is served until it is 30\.0 s old \(NODECOMPUTE_MAX_STALE_MS\), then this check fails until the GPU driver answers again\. The last refresh failed: /,
  );
  t.match(nvidiaSmi, new RegExp(`The last refresh failed: ${REFRESH_FAILED_SAID}`));
  t.notMatch(nvidiaSmi, /\(stale: /, 'not tucked away as a parenthesis');
  t.match(verbose.body, /readyz check passed\n$/);

  clock.advance(18_001);
  const past = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(past.statusCode, 503, 'past max-stale it fails');
  t.match(past.body, new RegExp(`^\\[-\\]nvidia-smi failed: ${REFRESH_FAILED_SAID}`));
});

t.test('/readyz?verbose: the last good snapshot\'s age and max-stale read as every span does, in minutes and hours when that long', async (t) => {
  const { app } = await failingAfterGoodSnapshot(t, 86_400_000, 150_000);
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(verbose.statusCode, 200);
  t.match(verbose.body, /^\[\+\]nvidia-smi ok: serving the last good snapshot \(2\.5 min old, 8 GPUs\) because refreshing it fails; it is served until it is 24 h old \(NODECOMPUTE_MAX_STALE_MS\)/);
});

t.test('a snapshot that is stale only because its refresh is under way keeps the short line, with the reason', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), config: { cacheTtlMs: 1000, maxStaleMs: 30_000, smiTimeoutMs: 60_000 }, deps: { now: clock.now } });
  await app.inject({ method: 'GET', url: '/readyz' });
  fake.update((s) => ({ ...s, delayMs: 30_000 }));
  clock.advance(2000);
  // The first answer past the TTL starts the refresh; the second sees it running.
  await app.inject({ method: 'GET', url: '/readyz' });
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose=1' });
  // The reason is the snapshot cache's own words (snapshot.test.ts): only its place is checked here.
  t.match(verbose.body, /^\[\+\]nvidia-smi ok: snapshot 2\.0 s old, 8 GPUs \(stale: .+\)\n/);
  t.notMatch(verbose.body, /last good snapshot|refresh failed/, 'nothing failed');
  // Ends the refresh: a call waiting in NVML sees the delay lifted; nvidia-smi's run is killed.
  fake.update((s) => ({ ...s, delayMs: 0 }));
  app.services.driver.killAll();
  await settle(app);
});

t.test('host-pid-namespace: the line says how many listed PIDs exist, in the doctor\'s words, and never "all" when some are missing', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const scenario = eightGpuNode();
  const uuid = scenario.gpus[0]!.uuid;
  scenario.processes = [{ gpuUuid: uuid, pid: shard.pid, name: 'llama-server', usedMiB: 1000 }];
  const { app, fake } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0 } });
  const pidLine = async () => {
    const res = await app.inject({ method: 'GET', url: '/readyz?verbose' });
    return { status: res.statusCode, line: res.body.split('\n')[1] };
  };
  t.same(await pidLine(), { status: 200, line: '[+]host-pid-namespace ok: all 1 PID(s) the GPU driver lists exist in /proc' });

  fake.update((s) => ({ ...s, processes: [...s.processes, { gpuUuid: uuid, pid: GONE_PID, name: 'exited', usedMiB: 1000 }] }));
  const some = await pidLine();
  t.equal(some.status, 200, 'one PID missing of two: a process that just exited, not another namespace');
  t.equal(
    some.line,
    `[+]host-pid-namespace ok, with a warning: 1 of 2 PID(s) the GPU driver lists do not exist in /proc (${GONE_PID}); the other 1 do, so this is the host's PID namespace and the missing ones most likely exited since listed. ` +
      'PIDs that stay missing live in another PID namespace (a VM or nested container), and their memory reads as foreign. ' +
      'Readiness does not depend on it; what to do: Run the doctor again in a minute: a process that exited is no longer listed by then. ' +
      "PIDs that stay missing belong to processes nodecompute cannot see (another PID namespace): find them with `nvidia-smi` on the host, and run their work where nodecompute's /proc sees it.",
  );
  t.notMatch(some.line, /visible|all /);
  const doctor = (await app.inject({ method: 'GET', url: '/doctor' })).json() as { checks: Array<{ name: string; status: string; detail: string; fix: string }> };
  const check = doctor.checks.find((c) => c.name === 'host-pid-namespace')!;
  t.equal(check.status, 'warn', 'a warning in both');
  t.ok(some.line!.includes(`ok, with a warning: ${check.detail}. `), `the doctor says the same: ${check.detail}`);
  t.ok(some.line!.endsWith(check.fix), 'and advises the same');

  fake.update((s) => ({ ...s, gpus: s.gpus.map((gpu) => ({ ...gpu, usedMiB: 0 })), processes: [] }));
  t.same(await pidLine(), { status: 200, line: '[+]host-pid-namespace ok: no GPU process is running, so there is nothing to compare' }, 'idle GPUs');
});

t.test('host-pid-namespace: one refresh listing only a process that has exited is no namespace problem; still listed and missing at the next, it is, said once in the log', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { log: logger, lines } = captureLog('info');
  const clock = manualClock();
  const scenario = eightGpuNode();
  const uuid = scenario.gpus[0]!.uuid;
  const holding = [{ gpuUuid: uuid, pid: shard.pid, name: 'llama-server', usedMiB: 8000 }];
  scenario.processes = holding;
  const { app, fake } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 10_000, maxStaleMs: 0 }, deps: { now: clock.now, logger } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0], graceMs: 1000 } })).statusCode, 201);
  const answers = async () => {
    const readyz = await app.inject({ method: 'GET', url: '/readyz?verbose' });
    const probe = await app.inject({ method: 'GET', url: '/shards/s/ready' });
    const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
    // No refresh left running: one begun now would list what the test changes next.
    await settle(app);
    return {
      readyz: readyz.statusCode,
      pidLine: readyz.body.split('\n')[1],
      probe: probe.statusCode,
      state: probe.json().state as string,
      visible: /^nodecompute_gpu_processes_visible (\S+)$/m.exec(metrics)?.[1],
    };
  };
  /** One refresh past the TTL, landed before the next answers. */
  const nextRefresh = async () => {
    clock.advance(10_001);
    await app.inject({ method: 'GET', url: '/gpus' });
    await settle(app);
  };
  const namespaceLines = () => lines.filter((line) => /PID namespace|match this \/proc again/.test(String(line.msg)));
  t.match(await answers(), { readyz: 200, probe: 200, state: 'ready', visible: '1' });

  // The shard stops holding its GPU, and the one process nvidia-smi still lists has exited.
  fake.update((s) => ({ ...s, processes: [{ gpuUuid: uuid, pid: GONE_PID, name: 'python3', usedMiB: 500 }] }));
  await nextRefresh();
  const once = await answers();
  t.match(once, { readyz: 200, probe: 503, state: 'on-cpu', visible: '1' }, 'one refresh: the shard is judged, not unverified');
  t.equal(
    once.pidLine,
    `[+]host-pid-namespace ok, with a warning: 1 of 1 PID(s) the GPU driver lists do not exist in /proc (${GONE_PID}); none of them was missing from the previous snapshot, so they most likely exited since the GPU driver listed them. ` +
      'If they are still listed and missing at the next refresh, this check fails: nodecompute is then not in their PID namespace.',
  );
  t.same(namespaceLines(), [], 'nothing to say yet');

  await nextRefresh();
  const twice = await answers();
  t.match(twice, { readyz: 503, probe: 200, state: 'unverified', visible: '0' }, 'still listed and missing: another PID namespace');
  t.match(twice.pidLine, /^\[-\]host-pid-namespace failed: the GPU driver lists GPU processes whose PIDs do not exist in this \/proc/);
  await nextRefresh();
  await answers();
  t.match(namespaceLines(), [
    {
      level: 40,
      missingPids: [GONE_PID],
      msg: /^the GPU driver lists GPU processes whose PIDs do not exist in this \/proc: .* Until this is fixed, every shard reads unverified \(its probe answers 200: there is no evidence either way\), all GPU memory reads as foreign, and \/readyz fails\.$/,
    },
  ], 'said once, when it began');

  fake.update((s) => ({ ...s, processes: holding }));
  await nextRefresh();
  t.match(await answers(), { readyz: 200, probe: 200, state: 'ready', visible: '1' });
  t.match(namespaceLines().slice(1), [{ level: 30, msg: "The GPU driver's GPU processes match this /proc again: shard verdicts are verified again, and GPU memory is attributed to its shards." }], 'and once when it ended');
  t.equal(namespaceLines().length, 2);
});

t.test('state-file: readiness fails while registrations cannot be stored, naming the file, the reason and the fix; the registrations are refused alike', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app, config } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  // The state directory is not there yet (it is made at the first write): a file takes its name.
  writeFileSync(dirname(config.stateFile), 'not a directory\n');
  const res = await app.inject({ method: 'GET', url: '/readyz' });
  t.equal(res.statusCode, 503);
  const reason = `cannot write in ${dirname(config.stateFile)}: ${dirname(config.stateFile)} exists and is not a directory`;
  t.same(Object.keys(res.json()), ['statusCode', 'code', 'error', 'message']);
  t.match(res.json(), { statusCode: 503, code: 'NODECOMPUTE_STATE_WRITE_FAILED', error: 'Service Unavailable' });
  const { message } = res.json() as { message: string };
  t.match(message, `Registrations cannot be stored in ${config.stateFile}: ${reason}. Every registration and removal is refused (503) until they can; `);
  t.match(message, /the shards already stored are kept and served\. Make the directory writable .*full.*`dmesg`.*NODECOMPUTE_STATE_FILE/);
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(verbose.statusCode, 503);
  t.match(verbose.body, /^\[\+\]nvidia-smi ok: .*\n\[\+\]host-pid-namespace ok: .*\n\[-\]state-file failed: Registrations cannot be stored in .*\nreadyz check failed\n$/);
  const put = await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] } });
  t.equal(put.json().code, 'NODECOMPUTE_STATE_WRITE_FAILED', 'what readiness says is what a registration meets');
  t.equal(put.headers['retry-after'], '5', 'and it says to wait NODECOMPUTE_STATE_TIMEOUT_MS before retrying, not to spin');
  t.equal(res.headers['retry-after'], undefined, "/readyz's state-file 503 has no nvidia-smi back-off to tell");
});

t.test("nvidia-smi failing with no snapshot to serve: /readyz's 503 carries Retry-After while the failure is waited out, as /gpus's does", async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: { ...idleEightGpuNode(), failures: { all: { kind: 'driver-unreachable' } } }, deps: { now: clock.now } });
  const ask = async (url: string) => {
    const res = await app.inject({ method: 'GET', url });
    return { status: res.statusCode, retryAfter: res.headers['retry-after'], type: String(res.headers['content-type']).split(';')[0] };
  };
  t.same(await ask('/readyz'), { status: 503, retryAfter: '1', type: 'application/json' }, 'the first failure is waited out for one TTL (1 s)');
  await settle(app);
  clock.advance(400);
  t.same(await ask('/readyz?verbose'), { status: 503, retryAfter: '1', type: 'text/plain' }, 'the checklist too: 600 ms left, rounded up');
  t.same(await ask('/gpus'), { status: 503, retryAfter: '1', type: 'application/json' }, 'the same as /gpus says');
  clock.advance(600);
  t.same(await ask('/readyz'), { status: 503, retryAfter: '2', type: 'application/json' }, 'run again past it, failed again: the window doubles');
  await settle(app);
  clock.advance(2000);
  fake.update((s) => ({ ...s, failures: {} }));
  t.same(await ask('/readyz'), { status: 200, retryAfter: undefined, type: 'application/json' }, 'once nvidia-smi answers, nothing to wait out');
});

t.test('state-file: a directory that cannot be fsynced keeps readiness, and the checklist says what is at risk', async (t) => {
  const syncDirectory = async () => {
    throw Object.assign(new Error('EINVAL: invalid argument, fsync'), { code: 'EINVAL' });
  };
  const dir = t.testdir({});
  const stateFile = createStateFile(`${dir}/shards.json`, { log: pino({ level: 'silent' }), syncDirectory });
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode(), deps: { stateFile } });
  const verbose = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(verbose.statusCode, 200);
  t.match(
    verbose.body,
    `[+]state-file ok: registrations are stored in ${dir}/shards.json, but fsync of ${dir} failed (EINVAL: invalid argument, fsync): a change is stored and served, yet a power cut right after it could bring back the previous file. This filesystem cannot fsync a directory`,
  );
});
