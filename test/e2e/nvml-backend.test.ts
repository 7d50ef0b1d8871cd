// The NVML backend in the real process (dist/src/main.js; `npm test` builds it first), against the
// fake libnvidia-ml.so.1 (test/fixtures/nvml/fake-nvml.c) beside the fake nvidia-smi's scenario:
// which backend auto picks and why (the start log, /doctor, /metrics), an NVML named but missing,
// and the ends that a call stuck in the driver must not block: SIGTERM, and `nodecompute doctor`.
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import koffi from 'koffi';
import t, { type Test } from 'tap';
import { installFakeNvml, nvmlCalls } from '../../scripts/fake-nvml.js';
import { createFakeNvidiaSmi, eightGpuNode, idleEightGpuNode, waitUntil, type FakeNvidiaSmi, type FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { runToEnd, startServer, within, type RunningServer } from '../helpers/server.js';

// Only what each test sets: an NVML setting in the runner's environment would change what auto picks.
delete process.env.NODECOMPUTE_NVML_LIBRARY;

const SONAME = 'libnvidia-ml.so.1';
/** The fake's driver version (eightGpuNode's). */
const DRIVER = '590.48.01';
/** What the service gets to end after SIGTERM before close-with-grace cuts it short (exit 1). */
const SHUTDOWN_GRACE_MS = 10_000;
/** NVML's deadline per query where a call hangs: short, yet far above what the fake takes on a loaded machine. */
const TIMEOUT_MS = 2000;

type Check = { name: string; status: string; detail: string; fix: string | null };
type ErrorBody = { statusCode: number; code: string; error: string; message: string };

/** A temp dir with `smi/` (the fake nvidia-smi, its scenario and, when asked, the fake NVML beside it) and `empty/`. */
function node(t: Test, scenario: FakeScenario, withNvml = true): { dir: string; fake: FakeNvidiaSmi; library: string; empty: string; base: Record<string, string> } {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-nvml-e2e-'));
  mkdirSync(join(dir, 'smi'));
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), { ...scenario, nvml: { logCalls: true, ...scenario.nvml } });
  // Whatever failed, no hung fake call lingers: released before its scenario goes.
  t.teardown(() => {
    releaseHangs(fake);
    rmSync(dir, { recursive: true, force: true });
  });
  const library = withNvml ? installFakeNvml(fake.dir) : join(fake.dir, SONAME);
  const empty = join(dir, 'empty');
  mkdirSync(empty);
  // auto unless a test names another: the helper's own default is nvidia-smi.
  const base = { NODECOMPUTE_BACKEND: 'auto', NODECOMPUTE_NVIDIA_SMI: fake.path, NODECOMPUTE_STATE_FILE: join(dir, 'state', 'shards.json') };
  return { dir, fake, library, empty, base };
}

/** Lets every hung fake NVML call return. */
function releaseHangs(fake: FakeNvidiaSmi): void {
  fake.update((s) => void (s.nvml = { ...s.nvml, hang: [] }));
}

/** The start-up line naming the backend. */
function backendLine(server: RunningServer): Record<string, unknown> | undefined {
  return server.logs().find((entry) => /^GPU figures come from /.test(String(entry.msg)));
}

async function doctorChecks(server: RunningServer): Promise<Check[]> {
  const res = await server.fetch('/doctor');
  const body = (await res.json()) as { checks?: Check[] };
  if (!Array.isArray(body.checks)) throw new Error(`GET /doctor answered ${res.status} without checks: ${JSON.stringify(body)}`);
  return body.checks;
}

/** Whether the dynamic loader finds a real libnvidia-ml.so.1 by its soname here (a GPU host). */
function systemHasNvml(): boolean {
  try {
    koffi.load(SONAME).unload();
    return true;
  } catch {
    return false;
  }
}

t.test('auto finds libnvidia-ml.so.1 by its soname (LD_LIBRARY_PATH): NVML serves, named in the log, /doctor and /metrics; nvidia-smi is never run', async (t) => {
  const { fake, base } = node(t, eightGpuNode());
  // No NODECOMPUTE_NVML_LIBRARY: the loader finds the soname through LD_LIBRARY_PATH (ahead of the ld.so cache).
  const server = await startServer(t, { ...base, LD_LIBRARY_PATH: fake.dir });

  const line = backendLine(server);
  t.match(line, { level: 30, backend: 'nvml', source: SONAME }, 'backend and source as fields');
  t.match(line?.msg, /^GPU figures come from nvml \(libnvidia-ml\.so\.1\): auto: .*loads and initialises/);
  t.match(line?.msg, DRIVER, 'the driver version it answered with');

  const res = await server.fetch('/gpus');
  t.equal(res.status, 200);
  const { gpus } = (await res.json()) as { gpus: Array<{ index: number; uuid: string; name: string }> };
  const expected = eightGpuNode().gpus;
  t.same(
    gpus.map(({ index, uuid, name }) => ({ index, uuid, name })),
    expected.map(({ index, uuid, name }) => ({ index, uuid, name })),
    'the 8 GPUs of the scenario, from NVML',
  );

  const checks = await doctorChecks(server);
  const at = checks.findIndex((c) => c.name === 'backend');
  t.ok(at >= 0, 'a backend row');
  t.match(checks[at], { status: 'ok', detail: /nvml/ });
  t.match(checks[at]?.detail, SONAME, 'names the source');
  t.match(checks[at]?.detail, 'loads and initialises', 'and why');
  t.match(checks[at + 1], { name: 'nvml', status: 'ok' }, "then the backend's own row");
  t.match(checks[at + 1]?.detail, DRIVER);
  t.notOk(checks.some((c) => c.name === 'nvidia-smi'), 'no nvidia-smi row');

  const metrics = await (await server.fetch('/metrics')).text();
  t.match(metrics, /^nodecompute_gpu_backend_info\{backend="nvml"\} 1$/m);
  t.notMatch(metrics, /^nodecompute_gpu_backend_info\{backend="nvidia-smi"\}/m);

  t.ok(nvmlCalls(fake.dir).some((call) => call.pid === server.child.pid && call.fn === 'nvmlDeviceGetMemoryInfo_v2'), 'the service called the fake NVML');
  t.same(fake.invocations(), [], 'the fake nvidia-smi was never run');

  server.child.kill('SIGTERM');
  t.equal(await within(server.exited, 30_000), 0);
});

t.test('auto without a loadable libnvidia-ml.so.1 falls back to nvidia-smi and says why', async (t) => {
  // Nothing at the path given, so this holds on a GPU host too.
  const { fake, base, empty } = node(t, eightGpuNode(), false);
  const missing = join(empty, SONAME);
  const server = await startServer(t, { ...base, LD_LIBRARY_PATH: empty, NODECOMPUTE_NVML_LIBRARY: missing });
  const line = backendLine(server);
  t.match(line, { backend: 'nvidia-smi', source: fake.path });
  t.match(line?.msg, /^GPU figures come from nvidia-smi /);
  t.match(line?.msg, `${missing} could not be loaded`);

  const res = await server.fetch('/gpus');
  t.equal(res.status, 200);
  t.equal(((await res.json()) as { gpus: unknown[] }).gpus.length, 8, 'answered from the fake nvidia-smi');
  t.ok(fake.countQueries('gpu') >= 1, 'nvidia-smi was run');
  const checks = await doctorChecks(server);
  t.match(checks.find((c) => c.name === 'backend'), { status: 'ok', detail: /could not be loaded/ });
  t.match(checks.find((c) => c.name === 'nvidia-smi'), { status: 'ok' });
  t.match(await (await server.fetch('/metrics')).text(), /^nodecompute_gpu_backend_info\{backend="nvidia-smi"\} 1$/m);
  server.child.kill('SIGTERM');
  t.equal(await within(server.exited, 30_000), 0);

  // The soname form (no NODECOMPUTE_NVML_LIBRARY), only where no real library is in the ld.so cache.
  t.test('by its soname, where the loader finds none', { skip: systemHasNvml() ? `a ${SONAME} is installed on this machine` : false }, async (t) => {
    const server = await startServer(t, { ...base, LD_LIBRARY_PATH: empty });
    const line = backendLine(server);
    t.match(line, { backend: 'nvidia-smi' });
    t.match(line?.msg, `${SONAME} could not be loaded`);
    t.equal((await server.fetch('/gpus')).status, 200);
  });
});

t.test('NODECOMPUTE_BACKEND=nvml with no library at NODECOMPUTE_NVML_LIBRARY: the service starts; GPU answers are a coded 503 naming the path and the fix', async (t) => {
  const { fake, base, empty } = node(t, eightGpuNode(), false);
  const missing = join(empty, 'nvidia', SONAME);
  const server = await startServer(t, { ...base, NODECOMPUTE_BACKEND: 'nvml', NODECOMPUTE_NVML_LIBRARY: missing });
  t.match(backendLine(server), { backend: 'nvml', source: missing });
  await waitUntil(() => server.logs().some((entry) => entry.code === 'NODECOMPUTE_NVML_NOT_FOUND'), { timeoutMs: 30_000, what: 'the warm-up to fail' });
  t.match(server.logs().find((entry) => entry.code === 'NODECOMPUTE_NVML_NOT_FOUND'), { level: 40, msg: missing }, 'the start-up log warns, naming the path');
  t.equal((await server.fetch('/livez')).status, 200, 'it runs');

  const res = await server.fetch('/gpus');
  t.equal(res.status, 503);
  const body = (await res.json()) as ErrorBody;
  t.match(body, { statusCode: 503, code: 'NODECOMPUTE_NVML_NOT_FOUND' });
  t.match(body.message, missing, 'names the path');
  t.match(body.message, 'NODECOMPUTE_NVML_LIBRARY', 'says what to set');
  t.match(body.message, 'NVIDIA runtime', 'and what to do in a container');

  const checks = await doctorChecks(server);
  t.match(checks.find((c) => c.name === 'nvml'), { status: 'fail', detail: missing });
  t.same(fake.invocations(), [], 'no fallback to nvidia-smi when nvml is named');
});

t.test('SIGTERM with an NVML call stuck in the driver: a coded 503 first, then exit 0 at once with a warning', async (t) => {
  const { fake, base } = node(t, eightGpuNode());
  const server = await startServer(t, {
    ...base,
    LD_LIBRARY_PATH: fake.dir,
    NODECOMPUTE_SMI_TIMEOUT_MS: String(TIMEOUT_MS),
    // Every request asks NVML afresh.
    NODECOMPUTE_CACHE_TTL_MS: '0',
    NODECOMPUTE_MAX_STALE_MS: '0',
  });
  t.match(backendLine(server), { backend: 'nvml' });
  t.equal((await server.fetch('/gpus')).status, 200, 'NVML answers before the hang');

  fake.update((s) => void (s.nvml = { ...s.nvml, hang: ['nvmlDeviceGetMemoryInfo_v2'] }));
  const res = await server.fetch('/gpus');
  t.equal(res.status, 503);
  const body = (await res.json()) as ErrorBody;
  t.equal(body.code, 'NODECOMPUTE_NVML_TIMEOUT');
  t.match(body.message, `${TIMEOUT_MS} ms`);
  const hung = nvmlCalls(fake.dir).filter((call) => call.pid === server.child.pid && call.fn === 'nvmlDeviceGetMemoryInfo_v2');
  t.ok(hung.length >= 1, 'the call that hangs was made');

  const signalledAt = Date.now();
  server.child.kill('SIGTERM');
  const end = await within(server.exited, 3 * SHUTDOWN_GRACE_MS);
  const tookMs = Date.now() - signalledAt;
  t.equal(end, 0, 'exit 0, not cut short (1) nor waiting on the stuck call', { stderr: server.stderr(), lastLines: server.lines().slice(-5) });
  t.ok(tookMs < SHUTDOWN_GRACE_MS - 2000, `ended well within the ${SHUTDOWN_GRACE_MS} ms grace (took ${tookMs} ms)`);
  const logs = server.logs();
  t.match(
    logs.find((entry) => /still stuck in the driver/.test(String(entry.msg))),
    { level: 40, msg: /NVML/ },
    'the warning says why it ends without waiting',
  );
  t.notOk(logs.some((entry) => /longer than its .* grace/.test(String(entry.msg))), 'not cut short by the grace');
  t.same(fake.invocations(), [], 'nvidia-smi was not run instead');
});

t.test('`nodecompute doctor` with NODECOMPUTE_BACKEND=nvml: the backend and nvml rows; with a stuck call it still ends, failing', async (t) => {
  const { fake, base, library } = node(t, idleEightGpuNode());
  const env = { ...base, NODECOMPUTE_BACKEND: 'nvml', NODECOMPUTE_NVML_LIBRARY: library, NODECOMPUTE_TOKEN: 'a-token-of-enough-length', NODECOMPUTE_SMI_TIMEOUT_MS: String(TIMEOUT_MS) };

  const good = await runToEnd(['doctor'], env, 60_000);
  t.equal(good.end, 0, 'exit 0', { stdout: good.stdout, stderr: good.stderr });
  t.match(good.stdout, new RegExp(`^OK +backend +GPU figures come from nvml \\(${library.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\): NODECOMPUTE_BACKEND is nvml`, 'm'));
  t.match(good.stdout, new RegExp(`^OK +nvml +.*driver ${DRIVER.replaceAll('.', '\\.')}`, 'm'));
  t.match(good.stdout, /^OK +gpus +8 GPU\(s\) visible/m);
  t.match(good.stdout, 'this node is fine');
  t.same(fake.invocations(), [], 'nvidia-smi was not run');

  // The version query is the first the doctor makes: its nvml row fails, and the call stays stuck.
  fake.update((s) => void (s.nvml = { ...s.nvml, hang: ['nvmlSystemGetDriverVersion'] }));
  const startedAt = Date.now();
  const stuck = await runToEnd(['doctor'], env, 60_000);
  const tookMs = Date.now() - startedAt;
  t.equal(stuck.end, 1, 'it ended, failing (not killed after 60 s)', { stdout: stuck.stdout, stderr: stuck.stderr });
  t.ok(tookMs < 30_000, `promptly (${tookMs} ms), not when the fake gives up (120 s)`);
  t.match(stuck.stdout, /^OK +backend +GPU figures come from nvml /m);
  t.match(stuck.stdout, new RegExp(`^FAIL +nvml +.*within ${TIMEOUT_MS} ms`, 'm'), 'the nvml row fails on the deadline');
  t.match(stuck.stdout, 'something is wrong', 'after the whole table');
  t.ok(nvmlCalls(fake.dir).some((call) => call.fn === 'nvmlSystemGetDriverVersion' && call.pid !== null), 'the stuck call was made');
});

// auto falls back to nvidia-smi when NVML loads but its first call does not answer in time: that
// call stays stuck in the driver, so neither end may wait for it though nvidia-smi serves.
t.test('auto with the first NVML call stuck: nvidia-smi serves, and SIGTERM and `nodecompute doctor` still end', async (t) => {
  // Idle: the doctor passes only where every PID it lists exists here.
  const hung = { ...idleEightGpuNode(), nvml: { hang: ['nvmlSystemGetDriverVersion'] } };
  const { fake, base } = node(t, hung);
  const env = { ...base, LD_LIBRARY_PATH: fake.dir, NODECOMPUTE_SMI_TIMEOUT_MS: String(TIMEOUT_MS) };
  const server = await startServer(t, env);
  t.match(backendLine(server), { backend: 'nvidia-smi', msg: /loads but does not answer/ });
  t.equal((await server.fetch('/gpus')).status, 200, 'nvidia-smi answers');
  server.child.kill('SIGTERM');
  // Past the grace, and then some: a process that waits on the stuck call never ends.
  t.equal(await within(server.exited, SHUTDOWN_GRACE_MS + 5000), 0, 'SIGTERM ends it, exit 0');

  const doctor = await runToEnd(['doctor'], { ...env, NODECOMPUTE_TOKEN: 'a-token-of-enough-length' }, 15_000);
  t.match(doctor.stdout, /^OK +backend +GPU figures come from nvidia-smi .*loads but does not answer/m);
  t.equal(doctor.end, 0, 'the doctor ends once its table is printed');
});
