// GET /doctor and the GPUs the running service has lost (gpu-roster.ts): the check the CLI cannot
// make, since it has listed no GPU before its own run.
import t from 'tap';
import type { DoctorReport } from '../../src/doctor/doctor.js';
import { REPORT_REUSE_MS } from '../../routes/doctor.js';
import { buildTestApp, manualClock } from '../helpers/app.js';
import { idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';

t.test('GET /doctor: a GPU the service has lost fails, in the roster\'s words, with when it was last listed, until nvidia-smi lists it again', async (t) => {
  const clock = manualClock(Date.parse('2026-11-29T12:00:00Z'));
  const scenario = idleEightGpuNode();
  const { app, fake } = await buildTestApp(t, { scenario, deps: { now: clock.now }, config: { cacheTtlMs: 0, maxStaleMs: 0 } });
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
      `GPU 3 (${gpu3.uuid}, ${gpu3.name}) is no longer listed by nvidia-smi (last listed 2026-11-29T12:00:05.000Z, ${ago} ago):\n` +
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
  t.match(await lostCheck(), { status: 503, check: expected('20.0 s') }, 'while nvidia-smi cannot be asked, the lost GPU is still said');

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
            `nvidia-smi cannot reach GPU 5 (${gpu5.uuid}, NVIDIA H200, PCI ${gpu5.busId}): it says "GPU is lost. Reboot the system to recover this GPU":\n` +
            "nvidia-smi cannot get a handle on that GPU (it has fallen off the bus, hung, or lost power), so nothing can compute on it; and while nvidia-smi's queries fail, this node's other shards read unverified once the last good snapshot is older than max-stale.",
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
  const { app } = await buildTestApp(t, { scenario: { ...idleEightGpuNode(), failures: { gpu: { kind: 'gpu-lost', busId: '0000:5D:00.0' } } } });
  const check = ((await app.inject({ method: 'GET', url: '/doctor' })).json() as DoctorReport).checks.find((c) => c.name === 'lost-gpus');
  t.match(check, { status: 'fail', detail: /^nvidia-smi cannot reach the GPU at PCI 00000000:5D:00\.0: it says "GPU is lost\. Reboot the system to recover this GPU":\nnvidia-smi cannot get a handle on that GPU/ });
});
