// nvidia-smi failing in each way the real one does (its exit codes and words, from
// test/fixtures/samples/nvsmi-err_*), printing garbage, dying by a signal, and its binary vanishing
// while the service runs. Every answer is a coded 503 that quotes what nvidia-smi said and what to do;
// a shard registered meanwhile reads `starting` (a verdict, not an error); nothing is left running; and the service
// recovers by itself once nvidia-smi works again.
import { chmodSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import t from 'tap';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode, waitUntil, type FakeFailure } from '../helpers/fake-nvidia-smi.js';
import { killLeftovers, leftoversOf } from '../helpers/process-scan.js';

interface FailureCase {
  name: string;
  failure: FakeFailure;
  code: string;
  /** Fragments the message must hold: what nvidia-smi said, and what it means. */
  message: RegExp[];
}

const cases: FailureCase[] = [
  {
    name: 'driver unreachable (exit 9)',
    failure: { kind: 'driver-unreachable' },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/exited with code 9/, /couldn't communicate with the NVIDIA driver/, /driver is not loaded/],
  },
  {
    name: 'driver/library version mismatch (exit 18)',
    failure: { kind: 'library-mismatch', nvmlVersion: '535.161' },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/exited with code 18/, /Driver\/library version mismatch/, /Reboot the node/],
  },
  {
    name: 'no devices (exit 6)',
    failure: { kind: 'no-devices' },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/exited with code 6/, /No devices were found/, /no GPU was found/],
  },
  {
    name: 'a GPU lost (exit 15)',
    failure: { kind: 'gpu-lost', busId: '0000:5D:00.0' },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/exited with code 15/, /Unable to determine the device handle for GPU 0000:5D:00.0: GPU is lost/, /fallen off the bus/],
  },
  {
    name: 'killed by a signal (the OOM killer)',
    failure: { kind: 'killed-by-signal' },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/did not finish normally/, /SIGKILL/, /OOM killer/],
  },
  {
    name: 'an unknown field (message on stdout, exit 2)',
    failure: { kind: 'custom', stdout: 'Field "memory.total" is not a valid field to query.\n\n', exitCode: 2 },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/exited with code 2/, /Field "memory.total" is not a valid field to query/, /driver is probably older/],
  },
  {
    name: 'an exit code nodecompute has no advice for',
    failure: { kind: 'custom', stderr: 'Segmentation fault\n', exitCode: 139 },
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: [/exited with code 139/, /Segmentation fault/, /RETURN VALUE/],
  },
  {
    name: 'garbage with exit 0 (an HTML error page)',
    failure: { kind: 'garbage' },
    code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE',
    message: [/cannot read/, /502 Bad Gateway/, /Run `nvidia-smi --query/],
  },
  {
    name: 'garbage with exit 0 (the wrong columns)',
    failure: { kind: 'garbage', text: 'index, name\n0, NVIDIA H200\n' },
    code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE',
    message: [/cannot read/, /index, name|0, NVIDIA H200/],
  },
  {
    name: 'nothing at all with exit 0 (not even the CSV header)',
    failure: { kind: 'custom', stdout: '', exitCode: 0 },
    code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE',
    message: [/printed nothing, not even the CSV header/, /does not read that as "no GPUs"/, /check which nvidia-smi is on PATH/],
  },
  {
    name: 'garbage with exit 0 (binary noise)',
    failure: { kind: 'garbage', text: '\u0000\u0001\u0002\ufffd\ufffd, \u0007\n\u001b[31m' },
    code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE',
    message: [/cannot read/],
  },
];

// One shard process for every case: each case registers it in an app of its own.
const shard = await spawnShardProcess(t, 0);

for (const c of cases) {
  t.test(`nvidia-smi fails: ${c.name}`, async (t) => {
    const { app, fake } = await buildTestApp(t, { scenario: { ...eightGpuNode(), failures: { all: c.failure } } });
    t.teardown(() => killLeftovers(fake));

    const gpus = await app.inject({ method: 'GET', url: '/gpus' });
    t.equal(gpus.statusCode, 503, gpus.body.slice(0, 300));
    const body = gpus.json();
    t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode'], 'the one error shape');
    t.equal(body.code, c.code);
    t.equal(body.error, 'Service Unavailable');
    for (const fragment of c.message) t.match(body.message, fragment);
    t.notMatch(body.message, /\n\s+at /, 'no stack trace');

    const readyz = await app.inject({ method: 'GET', url: '/readyz' });
    t.equal(readyz.statusCode, 503);
    t.equal(readyz.json().code, c.code, '/readyz gives the same code');

    // A registration is still taken (GPUs on trust); nvidia-smi never saw it on its GPU, so its probe
    // says starting (a verdict with the failure as a warning), not an error.
    const put = await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0] } });
    t.equal(put.statusCode, 201, 'registering does not need nvidia-smi');
    const ready = await app.inject({ method: 'GET', url: '/shards/s/ready' });
    t.equal(ready.statusCode, 503, 'the probe fails: nothing has shown the shard on its GPU');
    t.match(ready.json(), { ready: false, state: 'starting', cause: 'awaiting-nvidia-smi', reason: /no listing of the GPU driver since has included it/ });
    const warnings = ready.json().warnings as string[];
    t.ok(warnings.some((w) => c.message[0]!.test(w)), `a warning quotes nvidia-smi's failure: ${JSON.stringify(warnings)}`);
    const list = await app.inject({ method: 'GET', url: '/shards' });
    t.equal(list.statusCode, 200);
    t.equal(list.json().stale, true);
    t.match(list.json().staleReason, /^no snapshot: /);

    await waitUntil(() => app.services.driver.running === 0 && leftoversOf(fake).length === 0, { what: 'no nvidia-smi left running' });
    t.pass('nothing left running');
  });
}

t.test('the nvidia-smi binary deleted while the service runs: 503 NOT_FOUND naming it; restored: recovers', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: eightGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  t.teardown(() => killLeftovers(fake));
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200, 'works at first');

  const wrapper = readFileSync(fake.path, 'utf8');
  rmSync(fake.path);
  clock.advance(10);
  const gone = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(gone.statusCode, 503);
  t.equal(gone.json().code, 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND');
  t.match(gone.json().message, `nvidia-smi could not be run from ${JSON.stringify(fake.path)}`);
  t.match(gone.json().message, /no such file/);
  t.match(gone.json().message, /NODECOMPUTE_NVIDIA_SMI/);
  const readyz = await app.inject({ method: 'GET', url: '/readyz?verbose' });
  t.equal(readyz.statusCode, 503);
  t.match(readyz.body, /\[-\]nvidia-smi failed: nvidia-smi could not be run/);

  // Not executable is told apart from missing.
  writeFileSync(fake.path, wrapper, { mode: 0o644 });
  chmodSync(fake.path, 0o644);
  clock.advance(10);
  const notExecutable = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(notExecutable.statusCode, 503);
  // Root may execute any file with an x bit; with none, even root gets EACCES.
  t.equal(notExecutable.json().code, 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND');
  t.match(notExecutable.json().message, /may not execute it/);

  chmodSync(fake.path, 0o755);
  clock.advance(10);
  const back = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(back.statusCode, 200, back.body.slice(0, 200));
  t.equal(back.json().gpus.length, 8);
  t.equal(back.json().stale, false);
  // (/readyz as a whole stays 503 here: the fake's PIDs are not in this /proc, which it rightly reports.)
  t.match((await app.inject({ method: 'GET', url: '/readyz?verbose' })).body, /\[\+\]nvidia-smi ok/, "/readyz's nvidia-smi check recovers too");
});

t.test('a failure that clears: the same app answers again, without a restart', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, {
    scenario: { ...eightGpuNode(), failures: { 'compute-apps': { kind: 'library-mismatch' } } },
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now },
  });
  t.teardown(() => killLeftovers(fake));
  const failing = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(failing.statusCode, 503, 'one failing query fails the snapshot');
  t.match(failing.json().message, /code 18/);
  fake.update((s) => ({ ...s, failures: undefined }));
  clock.advance(10);
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200);
});
