// GET /doctor and the GPUs the running service has lost (gpu-roster.ts): the check the CLI cannot
// make, since it has listed no GPU before its own run; and, after a restart, the GPUs only the stored
// registrations remember (registered-gpus). nvidia-smi only: a listing that skips a GPU's index and
// a failure naming a GPU's bus id are its shapes (both backends' lost GPUs: routes/gpus.test.ts).
import t from 'tap';
import type { DoctorReport } from '../../src/doctor/doctor.js';
import { REPORT_REUSE_MS } from '../../routes/doctor.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';

t.test('GET /doctor: a GPU the service has lost fails, in the roster\'s words, with when it was last listed, until nvidia-smi lists it again', async (t) => {
  const clock = manualClock(Date.parse('2026-11-29T12:00:00Z'));
  const scenario = idleEightGpuNode();
  const { app, fake } = await buildTestApp(t, { backend: 'nvidia-smi', scenario, deps: { now: clock.now }, config: { cacheTtlMs: 0, maxStaleMs: 0 } });
  const lostCheck = async () => {
    clock.advance(REPORT_REUSE_MS);
    const res = await app.inject({ method: 'GET', url: '/doctor' });
    return { status: res.statusCode, check: (res.json() as DoctorReport).checks.find((check) => check.name === 'lost-gpus') };
  };
  t.match(await lostCheck(), { status: 200, check: { status: 'ok', detail: 'nodecompute has no snapshot of the GPUs yet, so it knows of no GPU to miss' } });
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200, 'a snapshot lists 8 GPUs');
  const listedAt = clock.now();
  t.match(await lostCheck(), { status: 200, check: { status: 'ok', detail: 'every GPU nodecompute has listed since it started is still listed', fix: null } });

  const gpu3 = scenario.gpus[3]!;
  fake.update((s) => ({ ...s, gpus: s.gpus.filter((gpu) => gpu.index !== 3) }));
  const expected = (ago: string) => ({
    status: 'fail',
    detail:
      `GPU 3 (${gpu3.uuid}, ${gpu3.name}) is no longer listed by the GPU driver (last listed 2026-11-29T12:00:05.000Z, ${ago} ago):\n` +
      'it fell off the bus, was reset or was detached. Its memory is no longer in /gpus or /metrics, and shards placed on it cannot hold it.',
    fix:
      'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU. ' +
      'If it was detached on purpose, restart nodecompute to forget it.',
  });
  t.equal(new Date(listedAt).toISOString(), '2026-11-29T12:00:05.000Z');
  t.match(await lostCheck(), { status: 503, check: expected('10.0 s') }, 'missing from the doctor\'s own GPU query: lost now, before a snapshot says so');

  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.match(gpus.lostGpus, [{ index: 3, uuid: gpu3.uuid, lastListedAt: '2026-11-29T12:00:05.000Z' }], '/gpus has it too');
  t.match(await lostCheck(), { status: 503, check: expected('15.0 s') }, 'the roster\'s lost GPU, the same words');

  fake.update((s) => ({ ...s, failures: { all: { kind: 'driver-unreachable' } } }));
  t.match(await lostCheck(), { status: 503, check: expected('20.0 s') }, 'while the GPU driver cannot be asked, the lost GPU is still said');

  fake.update((s) => ({ ...s, failures: {}, gpus: [...s.gpus.slice(0, 3), gpu3, ...s.gpus.slice(3)] }));
  t.match(await lostCheck(), { status: 200, check: { status: 'ok' } }, 'listed again: no longer lost, even before a snapshot says so');

  // GPU 5 falls off the bus: nvidia-smi's GPU query fails, naming it by bus id ("GPU is lost", exit 15).
  const gpu5 = scenario.gpus[5]!;
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200, 'a snapshot lists GPU 5 with its bus id');
  const gpu5Named = async (message: string) =>
    t.match(
      await lostCheck(),
      {
        status: 503,
        check: {
          status: 'fail',
          detail:
            `the GPU driver cannot reach GPU 5 (${gpu5.uuid}, NVIDIA H200, PCI ${gpu5.busId}): it says "GPU is lost. Reboot the system to recover this GPU":\n` +
            "the GPU driver cannot get a handle on that GPU (it has fallen off the bus, hung, or lost power), so nothing can compute on it; and while the driver's queries fail, this node's other shards cannot be verified either once the last good snapshot is older than max-stale.",
          fix: 'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU.',
        },
      },
      message,
    );
  fake.update((s) => ({ ...s, failures: { gpu: { kind: 'gpu-lost', busId: gpu5.busId!.slice(4) } } }));
  await gpu5Named('named as the last snapshot listed it');
  fake.update((s) => ({ ...s, failures: { all: { kind: 'gpu-lost', busId: gpu5.busId!.slice(4) } } }));
  await gpu5Named('and so when even nvidia-smi --version fails naming it');
});

t.test('GET /doctor with nvidia-smi failing since start, naming a GPU it cannot reach: no listing says which GPU that is, so its bus id alone', async (t) => {
  const { app } = await buildTestApp(t, { backend: 'nvidia-smi', scenario: { ...idleEightGpuNode(), failures: { gpu: { kind: 'gpu-lost', busId: '0000:5D:00.0' } } } });
  const check = ((await app.inject({ method: 'GET', url: '/doctor' })).json() as DoctorReport).checks.find((c) => c.name === 'lost-gpus');
  t.match(check, { status: 'fail', detail: /^the GPU driver cannot reach the GPU at PCI 00000000:5D:00\.0: it says "GPU is lost\. Reboot the system to recover this GPU":\nthe GPU driver cannot get a handle on that GPU/ });
});

t.test('GET /doctor after a restart: a GPU gone before it started is remembered by the registrations alone, and said once', async (t) => {
  const shards = await Promise.all([spawnShardProcess(t, 0), spawnShardProcess(t, 0)]);
  const scenario = idleEightGpuNode();
  const [gpu1, gpu3] = [scenario.gpus[1]!, scenario.gpus[3]!];
  const first = await buildTestApp(t, { backend: 'nvidia-smi', scenario });
  for (const [i, gpus] of [[1], [3]].entries()) {
    t.equal((await first.app.inject({ method: 'PUT', url: `/shards/s${i}`, payload: { pid: shards[i]!.pid, gpus } })).statusCode, 201);
  }
  await first.app.close();

  // GPU 1 falls off the bus while nodecompute is down; it starts again on the same state file.
  const clock = manualClock(Date.parse('2026-11-29T12:00:00Z'));
  const { app, fake } = await buildTestApp(t, {
    backend: 'nvidia-smi',
    scenario: { ...scenario, gpus: scenario.gpus.filter((gpu) => gpu !== gpu1) },
    deps: { now: clock.now },
    config: { stateFile: first.config.stateFile, cacheTtlMs: 0, maxStaleMs: 0 },
  });
  const report = async () => {
    clock.advance(REPORT_REUSE_MS);
    const res = await app.inject({ method: 'GET', url: '/doctor' });
    return { status: res.statusCode, checks: Object.fromEntries((res.json() as DoctorReport).checks.map((check) => [check.name, check])) };
  };
  const restarted = await report();
  t.equal(restarted.status, 503);
  t.match(restarted.checks['lost-gpus'], { status: 'ok' }, 'the roster never listed it');
  t.same(restarted.checks['registered-gpus'], {
    name: 'registered-gpus',
    status: 'fail',
    detail:
      `shard "s0" was given ${gpu1.uuid} (GPU 1 when it was registered):\n` +
      'the GPU driver does not list it, and this service has not listed it since it started: it fell off the bus, was reset or was detached (or the state file came from another node). Such a shard reads gpu-lost.',
    fix:
      'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU. ' +
      "Start such a shard's engine on GPUs the GPU driver lists and PUT it with them, or DELETE a shard that is gone.",
  });
  t.equal((await app.inject({ method: 'GET', url: '/shards/s0/ready' })).json().state, 'gpu-lost', 'as the shard itself says');

  // GPU 3 goes while the service runs: the roster's lost GPU, said by lost-gpus alone.
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200);
  fake.update((s) => ({ ...s, gpus: s.gpus.filter((gpu) => gpu.uuid !== gpu3.uuid) }));
  clock.advance(1000);
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).json().lostGpus[0].uuid, gpu3.uuid);
  const later = await report();
  t.match(later.checks['lost-gpus'], { status: 'fail', detail: new RegExp(`^GPU 3 \\(${gpu3.uuid}, `) });
  t.notMatch(later.checks['registered-gpus']!.detail, gpu3.uuid, 'not said twice');
  t.match(later.checks['registered-gpus']!.detail, gpu1.uuid);

  await app.inject({ method: 'DELETE', url: '/shards/s0' });
  t.match((await report()).checks['registered-gpus'], { status: 'ok', detail: 'the GPU driver lists every GPU the 1 shard registration(s) naming GPUs by UUID name' }, 'once its shard is removed');
});
