// A GPU nvidia-smi cannot reach: every query fails naming it by PCI bus id ("Unable to determine the
// device handle for GPU 0000:02:00.0: GPU is lost", exit 15), as nvidia-smi does once a GPU has
// fallen off the bus. Through the real app, the fake nvidia-smi and real shard processes whose
// children hold the GPUs, on a clock the test moves: the shard placed on that GPU is gpu-lost at
// once (cause gpu-unreachable), while the last good snapshot is served and past max-stale too, when
// the node's other shard reads unverified; nodecompute_gpu_lost names the GPU; a stopped shard on it
// is warned; /gpus, /gpus/foreign-memory and the status page mark the GPU unreachable; once
// nvidia-smi answers again, both are ready. And when no listing ever had the GPU (nvidia-smi failing
// since nodecompute started), nothing maps its bus id to a shard's GPU. Those are nvidia-smi's own
// ways to fail; a GPU the driver loses while the others are listed is told alike by both backends.
import t, { type Test } from 'tap';
import type { App } from '../../src/app.js';
import type { Config } from '../../src/config.js';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import type { TestBackend } from '../helpers/backend.js';
import type { FakeGpu, FakeScenario } from '../helpers/fake-nvidia-smi.js';

const UUIDS = ['GPU-0a0a0a0a-0000-0000-0000-000000000000', 'GPU-1b1b1b1b-0000-0000-0000-000000000000'];
const LOST = 'GPU is lost. Reboot the system to recover this GPU';
/** The fake's bus id of GPU 1 (00000000:02:00.0), in the form nvidia-smi's error line gives it. */
const GPU1_BUS = '0000:02:00.0';

const gpuAt = (index: number): FakeGpu => ({ index, uuid: UUIDS[index]!, name: 'NVIDIA H200', totalMiB: 143771, usedMiB: 20000, freeMiB: 123157, reservedMiB: 614 });

async function probe(app: App, id: string) {
  const answer = await app.inject({ method: 'GET', url: `/shards/${id}/ready` });
  return { status: answer.statusCode, ...answer.json() };
}

/** The probes of both shards once any refresh a request starts has landed. */
async function verdicts(app: App) {
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  return Promise.all(['s0', 's1'].map((id) => probe(app, id)));
}

/** Shards s0 and s1, real processes whose children hold GPU 0 and GPU 1, registered and ready. */
async function twoReadyShards(t: Test, config: Partial<Config>, backend?: TestBackend) {
  const shards = await Promise.all([spawnShardProcess(t, 1), spawnShardProcess(t, 1)]);
  const scenario: FakeScenario = {
    gpus: [gpuAt(0), gpuAt(1)],
    processes: shards.map((shard, i) => ({ gpuUuid: UUIDS[i]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 19000 })),
  };
  const clock = manualClock(Date.parse('2026-12-02T12:00:00Z'));
  const built = await buildTestApp(t, { scenario, backend, deps: { now: clock.now }, config });
  for (const [i, shard] of shards.entries()) {
    t.equal((await built.app.inject({ method: 'PUT', url: `/shards/s${i}`, payload: { pid: shard.pid, gpus: [i], graceMs: 0 } })).statusCode, 201);
  }
  t.same((await verdicts(built.app)).map((v) => v.state), ['ready', 'ready']);
  // A probe of a snapshot older than the last registration starts a refresh: let it land before the
  // test changes the node, or its two queries could read the node before and after the change.
  await settle(built.app);
  return { ...built, clock, shards };
}

t.test('a GPU nvidia-smi cannot reach: its shard is gpu-lost, served stale and past max-stale, until nvidia-smi answers again', async (t) => {
  const { app, fake, clock, shards } = await twoReadyShards(t, { smiTimeoutMs: 60_000 }, 'nvidia-smi');
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json().gpus;
  t.same(gpus.map((gpu: { unreachable: string | null }) => gpu.unreachable), [null, null], 'both GPUs reachable');
  t.same(
    gpus.map((gpu: { busId: string }) => gpu.busId),
    ['00000000:01:00.0', '00000000:02:00.0'],
    "/gpus gives each GPU's bus id, as nvidia-smi's errors and dmesg name it",
  );

  // GPU 1 falls off the bus: every nvidia-smi query fails, naming it.
  fake.update((s) => ({ ...s, failures: { all: { kind: 'gpu-lost', busId: GPU1_BUS } } }));
  clock.advance(1500);
  const [s0, s1] = await verdicts(app);
  t.same([s1.status, s1.state, s1.cause], [503, 'gpu-lost', 'gpu-unreachable'], 'the shard on the GPU the GPU driver cannot reach fails its probe at once');
  t.match(
    s1.reason,
    `placed on GPU 1, but the GPU driver cannot reach GPU 1 (${UUIDS[1]}, NVIDIA H200, PCI 00000000:02:00.0): it says "${LOST}": ` +
      'the GPU driver cannot get a handle on that GPU (it has fallen off the bus, hung, or lost power)',
  );
  t.match(s1.reason, /This shard cannot serve as placed\. Check `dmesg` for NVIDIA Xid errors .* Meanwhile start its engine on other GPUs and PUT the shard with its new gpus\.$/);
  t.equal(app.services.node.unreachable(), app.services.node.unreachable(), 'the same answer while nothing changes: the probe cache keys on it');
  t.same([s0.status, s0.state], [200, 'ready'], 'the other shard is judged on the last good snapshot, within max-stale');
  const staleGpus = await app.inject({ method: 'GET', url: '/gpus' });
  t.same(
    staleGpus.json().gpus.map((gpu: { unreachable: string | null }) => gpu.unreachable),
    [null, LOST],
    '/gpus, served from the last good snapshot, marks the GPU the GPU driver cannot reach with what it said',
  );
  t.same(
    (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json().gpus.map((gpu: { unreachable: string | null }) => gpu.unreachable),
    [null, LOST],
    'and so does foreign memory: nothing is to be placed there',
  );
  const text = (await app.inject({ method: 'GET', url: '/?format=text' })).body;
  t.match(text, /^nodecompute .*: 1 GPU LOST · /, 'the status page counts it as lost');
  t.match(text, /^1 +NVIDIA H200 \(UNREACHABLE\) /m, 'and marks its row');
  t.notMatch(text, /^0 +NVIDIA H200 \(UNREACHABLE\)/m);
  t.match(text, /\(UNREACHABLE\) GPU 1: The GPU driver cannot reach this GPU.*It says: GPU is lost\./, 'with what the GPU driver says of it');
  const html = (await app.inject({ method: 'GET', url: '/?format=html' })).body;
  t.equal(html.match(/<div class="gpu unreachable">\n<div class="gpu-id"><span class="gpu-index">GPU (\d)/g)?.length, 1, 'one GPU row marked in HTML');
  const idLines = html.match(/<div class="gpu[ a-z]*">\n<div class="gpu-id">.*<\/div>/g) ?? [];
  t.same(
    idLines.map((line) => [line.includes('gpu unreachable'), line.includes('gpu-busy')]).filter(([unreachable]) => unreachable),
    [[true, false]],
    'no "busy" figure for the GPU it cannot reach: it is the last good snapshot\'s',
  );
  t.ok(idLines.some((line) => line.includes('gpu-busy')), 'the GPUs it reaches have theirs');
  t.match(html, /<span class="gpu-index">GPU 1<\/span><span class="gpu-name">NVIDIA H200<\/span><span class="badge gpu-lost">unreachable<\/span>/);
  t.match(html, `It says: ${LOST}</li>`);
  t.match(s0.warnings, [/^answered from an older snapshot: the last refresh failed: nvidia-smi exited with code 15/]);
  t.same(
    (await app.inject({ method: 'GET', url: '/shards' })).json().shards.map((shard: { id: string; status: { state: string } }) => [shard.id, shard.status.state]),
    [
      ['s0', 'ready'],
      ['s1', 'gpu-lost'],
    ],
  );
  const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(metrics, new RegExp(`^nodecompute_gpu_lost\\{gpu="1",uuid="${UUIDS[1]}"\\} 1$`, 'm'), 'the GPU is lost for the alert too');
  t.notMatch(metrics, /^nodecompute_gpu_lost\{gpu="0"/m);
  t.match(metrics, /^nodecompute_shard_state\{shard="s1",state="gpu-lost"\} 1$/m);

  // Past max-stale nothing of nvidia-smi's is served: the other shard is unverified, this one still gpu-lost.
  clock.advance(30_000);
  const [later0, later1] = await Promise.all(['s0', 's1'].map((id) => probe(app, id)));
  t.same([later1.status, later1.state, later1.cause], [503, 'gpu-lost', 'gpu-unreachable'], 'still gpu-lost, from the last listing that had the GPU');
  t.match(later1.reason, `the GPU driver cannot reach GPU 1 (${UUIDS[1]}, NVIDIA H200, PCI 00000000:02:00.0)`);
  t.same([later0.status, later0.state, later0.cause], [200, 'unverified', 'nvidia-smi-unavailable'], 'nothing is known of the GPU the other shard holds');
  const failed = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(failed.statusCode, 503);
  t.match(failed.json().message, `Unable to determine the device handle for GPU ${GPU1_BUS}: ${LOST}`);
  t.match(failed.json().message, new RegExp(`\\. nodecompute last listed PCI 00000000:02:00\\.0 as GPU 1 \\(${UUIDS[1]}, NVIDIA H200\\)\\.$`), 'and which GPU that bus id is');
  t.match((await app.inject({ method: 'GET', url: '/metrics' })).body, new RegExp(`^nodecompute_gpu_lost\\{gpu="1",uuid="${UUIDS[1]}"\\} 1$`, 'm'), 'and for the alert');
  const pastMaxStale = (await app.inject({ method: 'GET', url: '/?format=text' })).body;
  t.match(pastMaxStale, /^nodecompute .*: 1 GPU LOST · /, 'the status page still counts it, with no GPU rows to mark');
  t.match(pastMaxStale, `\n  (UNREACHABLE) the GPU driver cannot reach GPU 1 (${UUIDS[1]}, NVIDIA H200, PCI 00000000:02:00.0): it says "${LOST}"\n`);
  t.match((await app.inject({ method: 'GET', url: '/?format=html' })).body, `<p class="empty unreachable">the GPU driver cannot reach GPU 1 (${UUIDS[1]}, NVIDIA H200, PCI 00000000:02:00.0): it says &#34;${LOST}&#34;</p>`);

  // Stopped, it answers nothing: that comes first, with the lost GPU as a warning.
  process.kill(shards[1]!.pid, 'SIGSTOP');
  t.teardown(() => process.kill(shards[1]!.pid, 'SIGCONT'));
  clock.advance(60_000);
  const stopped = await probe(app, 's1');
  t.same([stopped.state, stopped.cause], ['stopped', 'process-stopped']);
  t.match(stopped.warnings, [/^the GPU driver cannot be asked/, `the GPU driver cannot reach GPU 1 (${UUIDS[1]}, NVIDIA H200, PCI 00000000:02:00.0): it says "${LOST}": once it runs again, it reads gpu-lost`]);
  process.kill(shards[1]!.pid, 'SIGCONT');

  // nvidia-smi fails otherwise now (the driver unreachable, a hang): nothing says the GPU is back.
  fake.update((s) => ({ ...s, failures: { all: { kind: 'driver-unreachable' } } }));
  clock.advance(60_000);
  const otherFailure = await probe(app, 's1');
  t.same([otherFailure.status, otherFailure.cause], [503, 'gpu-unreachable'], 'still gpu-lost: only a good listing brings a GPU back');
  t.match((await probe(app, 's0')).warnings, [/exited with code 9/], 'the other shard sees the new failure');
  t.match((await app.inject({ method: 'GET', url: '/metrics' })).body, new RegExp(`^nodecompute_gpu_lost\\{gpu="1",uuid="${UUIDS[1]}"\\} 1$`, 'm'));

  // The GPU is reset and nvidia-smi answers again.
  fake.update((s) => ({ ...s, failures: {} }));
  clock.advance(60_000);
  t.same((await verdicts(app)).map((v) => [v.state, v.warnings]), [
    ['ready', []],
    ['ready', []],
  ]);
  t.notMatch((await app.inject({ method: 'GET', url: '/metrics' })).body, /^nodecompute_gpu_lost\{/m);
  t.same(
    (await app.inject({ method: 'GET', url: '/gpus' })).json().gpus.map((gpu: { unreachable: string | null }) => gpu.unreachable),
    [null, null],
    'and /gpus no longer marks it',
  );
  t.notMatch((await app.inject({ method: 'GET', url: '/?format=text' })).body, /UNREACHABLE|LOST/, 'nor the status page');
});

t.test('nvidia-smi failing since start, naming a GPU: no listing maps its bus id, so the shard is not gpu-lost but starting (never seen on its GPU), and the failure says which GPU', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const scenario: FakeScenario = { gpus: [gpuAt(0), gpuAt(1)], processes: [], failures: { all: { kind: 'gpu-lost', busId: GPU1_BUS } } };
  const { app } = await buildTestApp(t, { scenario, backend: 'nvidia-smi' });
  const put = await app.inject({ method: 'PUT', url: '/shards/s1', payload: { pid: shard.pid, gpus: [1] } });
  t.same([put.statusCode, put.json().gpuUuids], [201, null], 'taken on trust');
  const verdict = await probe(app, 's1');
  t.same([verdict.status, verdict.state, verdict.cause], [503, 'starting', 'awaiting-nvidia-smi']);
  t.match(verdict.warnings, [`Unable to determine the device handle for GPU ${GPU1_BUS}: ${LOST}`]);
  const failed = await app.inject({ method: 'GET', url: '/gpus' });
  t.same([failed.statusCode, /last listed/.test(failed.json().message)], [503, false], "no listing to say which GPU that is: the 503 has nvidia-smi's words alone");
  t.notMatch((await app.inject({ method: 'GET', url: '/metrics' })).body, /^nodecompute_gpu_lost\{/m, 'no GPU known to be lost');
});

t.test('a GPU that drops out of the listing, then makes every query fail: gpu-lost past max-stale too', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const holder = { gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 19000 };
  const clock = manualClock(Date.parse('2026-12-02T12:00:00Z'));
  const { app, fake } = await buildTestApp(t, { scenario: { gpus: [gpuAt(0), gpuAt(1)], processes: [holder] }, backend: 'nvidia-smi', deps: { now: clock.now }, config: { smiTimeoutMs: 60_000 } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s1', payload: { pid: shard.pid, gpus: [1], graceMs: 0 } })).statusCode, 201);
  await settle(app);
  t.equal((await probe(app, 's1')).state, 'ready');
  fake.update((s) => ({ ...s, gpus: [gpuAt(0)], processes: [] }));
  clock.advance(1500);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  t.same((await probe(app, 's1')).cause, 'gpu-not-listed', 'first it drops out of the listing');
  fake.update((s) => ({ ...s, failures: { all: { kind: 'gpu-lost', busId: GPU1_BUS } } }));
  clock.advance(1500);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  const stale = await probe(app, 's1');
  t.same([stale.state, stale.cause], ['gpu-lost', 'gpu-not-listed'], 'within max-stale, as the last listing says');
  t.equal(stale.reason.split(UUIDS[1]).length - 1, 1, 'the GPU said once');
  clock.advance(30_000);
  const later = await probe(app, 's1');
  t.same([later.status, later.state, later.cause], [503, 'gpu-lost', 'gpu-unreachable'], 'past max-stale: the bus id is matched with the GPU the snapshot lost');
  t.match(later.reason, `the GPU driver cannot reach GPU 1 (${UUIDS[1]}, NVIDIA H200, PCI 00000000:02:00.0)`);
  const page = (await app.inject({ method: 'GET', url: '/?format=text' })).body;
  t.match(page, /^nodecompute .*: 1 GPU LOST · /, 'the status page counts the GPU once: its lost row says it');
  t.notMatch(page, /\(UNREACHABLE\)/);
});

t.test('a GPU the driver loses while nvidia-smi lists the others (exit 0): its shard is gpu-lost in nvidia-smi\'s words, the node goes on', async (t) => {
  const { app, fake, clock } = await twoReadyShards(t, { maxStaleMs: 0 });

  fake.update((s) => ({ ...s, unreachable: [{ index: 1 }] }));
  clock.advance(1500);
  const [s0, s1] = await verdicts(app);
  t.match(s0, { status: 200, state: 'ready', warnings: [] }, 'the shard on the GPU it still lists is judged on a fresh listing, past max-stale');
  t.match(s1, { status: 503, state: 'gpu-lost', cause: 'gpu-not-listed' });
  const facts = [`GPU 1 (${UUIDS[1]}, NVIDIA H200) is no longer listed`, '2026-12-02T12:00:01.500Z', '00000000:02:00.0: "Unknown Error"'];
  for (const fact of facts) t.match(s1.reason, fact);
  const listed = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.equal(listed.stale, false);
  t.same(listed.gpus.map((gpu: { index: number }) => gpu.index), [0]);
  t.match(listed.lostGpus, [{ index: 1, uuid: UUIDS[1], busId: '00000000:02:00.0', unreachable: 'Unknown Error' }]);
  const doctor = (await app.inject({ method: 'GET', url: '/doctor' })).json();
  const lostCheck = doctor.checks.find((check: { name: string }) => check.name === 'lost-gpus');
  t.match(lostCheck, { status: 'fail', detail: /^GPU 1 \(GPU-1b1b1b1b-[-0]+, NVIDIA H200\) is no longer listed.*02:00\.0: "Unknown Error"/ });

  fake.update((s) => ({ ...s, unreachable: [] }));
  clock.advance(1500);
  t.same((await verdicts(app)).map((v) => v.state), ['ready', 'ready'], 'listed again: both ready');
  t.same((await app.inject({ method: 'GET', url: '/gpus' })).json().lostGpus, []);
});
