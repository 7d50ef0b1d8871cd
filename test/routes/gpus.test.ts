// GET /gpus against the fake driver (nvidia-smi or NVML, helpers/backend.ts) replaying an 8x H200
// node, through the real app.
import t from 'tap';
import { GpusResponseSchema } from '../../src/schemas/gpus.js';
import { ForeignMemoryResponseSchema } from '../../src/schemas/shards.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { buildTestApp, manualClock, settle } from '../helpers/app.js';
import { BACKEND, DRIVER_FAILED, failDriver, driverQueries, driverQueriesReach, NO_EVENTS, NO_GPUS_SAID, reloaded, UNREACHABLE_SAID, UNSAMPLED_SM } from '../helpers/backend.js';
import { schemaErrors } from '../helpers/schema.js';

t.test('an 8-GPU node with processes is reported exactly', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(res.statusCode, 200);
  const body = res.json();
  t.equal(body.stale, false);
  t.notOk('staleReason' in body);
  t.match(body.observedAt, /^\d{4}-\d\d-\d\dT/);
  t.equal(body.gpus.length, 8);
  t.same(schemaErrors(GpusResponseSchema, body), [], 'the pre-serialised body is exactly what the schema describes');
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.same(schemaErrors(ForeignMemoryResponseSchema, foreign), [], 'and so is foreign memory');
  t.same(body.gpus[0], {
    index: 0,
    uuid: 'GPU-a44622e3-2296-6285-0a86-84d0f6c67900',
    name: 'NVIDIA H200',
    busId: '00000000:18:00.0',
    memory: { totalMiB: 143771, usedMiB: 130013, freeMiB: 13145, reservedMiB: 614 },
    migMode: 'Disabled',
    migDevices: null,
    utilizationPct: 0,
    processes: [{ pid: 1328667, name: '/usr/local/bin/python3.10', usedMiB: 130004, shard: null, smUtilPct: UNSAMPLED_SM, migUuid: null }],
    unreachable: null,
    events: NO_EVENTS,
  });
  t.same(body.gpus.map((gpu: { index: number }) => gpu.index), [0, 1, 2, 3, 4, 5, 6, 7]);
  t.same(body.gpus[5].processes, [{ pid: 1425260, name: '/srv/jobs/eval, run 2/bin/python3', usedMiB: 105842, shard: null, smUtilPct: UNSAMPLED_SM, migUuid: null }], 'a name with ", " survives');
  t.same(body.gpus[6].processes, [{ pid: 1425261, name: 'python3', usedMiB: null, shard: null, smUtilPct: UNSAMPLED_SM, migUuid: null }], '[N/A] memory is null');
  t.same(body.gpus[7].processes, [{ pid: 1758887, name: '[Not Found]', usedMiB: 58060, shard: null, smUtilPct: UNSAMPLED_SM, migUuid: null }]);
  const onTwo = body.gpus.filter((gpu: { processes: { pid: number }[] }) => gpu.processes.some((p) => p.pid === 1425258));
  t.same(onTwo.map((gpu: { index: number }) => gpu.index), [2, 4], 'one process listed on two GPUs appears on both');
  t.same(onTwo.map((gpu: { processes: { usedMiB: number }[] }) => gpu.processes[0]!.usedMiB), [105842, 106082]);
});

t.test('memory the driver cannot read is null, and so is the foreign memory derived from it', async (t) => {
  const scenario = eightGpuNode();
  scenario.gpus = scenario.gpus.slice(0, 1).map((gpu) => ({ ...gpu, usedMiB: '[Insufficient Permissions]', freeMiB: '[Insufficient Permissions]', totalMiB: '[Insufficient Permissions]', reservedMiB: '[Insufficient Permissions]' }));
  scenario.processes = [];
  const { app } = await buildTestApp(t, { scenario });
  const gpu = (await app.inject({ method: 'GET', url: '/gpus' })).json().gpus[0];
  t.same(gpu.memory, { totalMiB: null, usedMiB: null, freeMiB: null, reservedMiB: null });
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json().gpus[0];
  t.same({ usedMiB: foreign.usedMiB, shardMiB: foreign.shardMiB, foreignMiB: foreign.foreignMiB }, { usedMiB: null, shardMiB: 0, foreignMiB: null });
});

t.test('without the driver (nvidia-smi or libnvidia-ml), /gpus and /gpus/foreign-memory are 503 naming the path tried; /livez stays 200', async (t) => {
  const missing = BACKEND === 'nvml' ? { nvmlLibrary: '/nonexistent/lib/libnvidia-ml.so.1' } : { nvidiaSmi: '/nonexistent/bin/nvidia-smi' };
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: missing });
  for (const url of ['/gpus', '/gpus/foreign-memory']) {
    const res = await app.inject({ method: 'GET', url });
    t.equal(res.statusCode, 503, url);
    const body = res.json();
    t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode']);
    t.equal(body.code, BACKEND === 'nvml' ? 'NODECOMPUTE_NVML_NOT_FOUND' : 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND');
    t.match(body.message, Object.values(missing)[0]);
  }
  t.equal((await app.inject({ method: 'GET', url: '/livez' })).statusCode, 200);
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).json().status, 'ok');
});

t.test("each failure of the driver becomes its coded 503 with the driver's own words", async (t) => {
  // Both drivers fail alike at these; NVML has no output to garble, and a lost GPU fails only the
  // calls on it (nvml-agreement.test.ts).
  const both = [
    { failure: { kind: 'driver-unreachable' as const }, code: DRIVER_FAILED, words: UNREACHABLE_SAID },
    { failure: { kind: 'no-devices' as const }, code: DRIVER_FAILED, words: NO_GPUS_SAID },
  ];
  const smiOnly = [
    { failure: { kind: 'library-mismatch' as const }, code: DRIVER_FAILED, words: 'Driver/library version mismatch' },
    { failure: { kind: 'gpu-lost' as const }, code: DRIVER_FAILED, words: 'GPU is lost' },
    { failure: { kind: 'garbage' as const, text: 'Segmentation fault? \u0000 !!' }, code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE', words: 'Segmentation fault' },
  ];
  const nvmlOnly = [{ failure: { kind: 'library-mismatch' as const }, code: DRIVER_FAILED, words: 'different versions' }];
  for (const c of [...both, ...(BACKEND === 'nvml' ? nvmlOnly : smiOnly)]) {
    const scenario = { ...eightGpuNode(), failures: { all: c.failure } };
    const { app } = await buildTestApp(t, { scenario });
    const res = await app.inject({ method: 'GET', url: '/gpus' });
    t.equal(res.statusCode, 503, c.failure.kind);
    t.equal(res.json().code, c.code, c.failure.kind);
    t.match(res.json().message, c.words, c.failure.kind);
  }
});

t.test('while a failure is waited out, its 503 says when the driver is asked again (Retry-After), and asking sooner asks nothing', async (t) => {
  const clock = manualClock(Date.parse('2026-12-02T12:00:00Z'));
  const { app, fake } = await buildTestApp(t, { scenario: { ...eightGpuNode(), failures: { all: { kind: 'driver-unreachable' } } }, deps: { now: clock.now } });
  const ask = async (url: string) => {
    const res = await app.inject({ method: 'GET', url });
    return { status: res.statusCode, retryAfter: res.headers['retry-after'] };
  };
  t.same(await ask('/gpus'), { status: 503, retryAfter: '1' }, 'the first failure is waited out for one TTL (1 s)');
  /** Each refresh runs both queries; the second may still run when the first one's failure is answered. */
  await driverQueriesReach(app, 'gpus', 1);
  await driverQueriesReach(app, 'compute-apps', 1);
  clock.advance(400);
  t.same(await ask('/gpus/foreign-memory'), { status: 503, retryAfter: '1' }, '600 ms left, rounded up to a whole second');
  t.same(await ask('/shards/nobody/compute'), { status: 404, retryAfter: undefined }, 'only a driver failure says it');
  clock.advance(600);
  t.same(await ask('/gpus'), { status: 503, retryAfter: '2' }, 'run again past it, failed again: the window doubles');
  await driverQueriesReach(app, 'gpus', 2);
  await driverQueriesReach(app, 'compute-apps', 2);
  clock.advance(2000);
  fake.update((s) => ({ ...s, failures: {} }));
  t.same(await ask('/gpus'), { status: 200, retryAfter: undefined }, 'once the driver answers, nothing to wait out');
  t.equal(await driverQueries(app, 'gpus'), 3, 'two refreshes failed, the third answered: none ran inside a window');
});

t.test('a GPU that drops out of the driver\'s list is named in /gpus, the status page and the metrics until it is listed again', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: eightGpuNode(), config: { cacheTtlMs: 0 }, deps: { now: clock.now } });
  const first = await app.inject({ method: 'GET', url: '/gpus' });
  clock.advance(1000);
  t.same(first.json().lostGpus, []);
  const { uuid: lostUuid, busId: lostBusId } = first.json().gpus[6];
  // nvidia-smi renumbers the GPUs after it at its next run; NVML at its next initialisation (a reload).
  fake.update((s) => ({ ...s, gpus: s.gpus.filter((gpu) => gpu.index !== 6).map((gpu, index) => ({ ...gpu, index })), nvml: reloaded(s) }));
  // The first answer may be the snapshot of before, while the refresh that sees it runs behind.
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);

  const res = await app.inject({ method: 'GET', url: '/gpus' });
  const body = res.json();
  t.same(schemaErrors(GpusResponseSchema, body), []);
  t.same(body.gpus.map((gpu: { index: number }) => gpu.index), [0, 1, 2, 3, 4, 5, 6]);
  t.notOk(body.gpus.some((gpu: { uuid: string }) => gpu.uuid === lostUuid));
  t.same(body.lostGpus, [{ index: 6, uuid: lostUuid, name: 'NVIDIA H200', busId: lostBusId, lastListedAt: first.json().observedAt, lostAt: body.observedAt, unreachable: null }], 'last listed by the first snapshot, missed by this one; nvidia-smi said nothing of it');
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.same(schemaErrors(ForeignMemoryResponseSchema, foreign), []);
  t.same(foreign.lostGpus, body.lostGpus, 'placement, which reads foreign memory, is told too: GPU 6 is gone, not free');
  t.not(res.headers.etag, first.headers.etag, 'a new ETag: the node changed');
  const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(metrics, `nodecompute_gpu_lost{gpu="6",uuid="${lostUuid}"} 1`);
  const text = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/plain' } })).body;
  t.match(text, `!! The GPU driver no longer lists GPUs it listed earlier. They fell off the bus, were reset or were detached`);
  t.match(text, `!!   GPU 6 (${lostUuid}, NVIDIA H200), last listed `);
  const html = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } })).body;
  t.match(html, '<strong>The GPU driver no longer lists GPUs it listed earlier.</strong>');

  // Then every query fails, past max-stale (30 s): nvidia-smi, as it often does on a node with a
  // lost GPU; NVML, whose handles fail one by one, once its driver cannot be reached.
  failDriver(fake, BACKEND === 'nvml' ? { kind: 'driver-unreachable' } : { kind: 'gpu-lost' });
  clock.advance(31_000);
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 503);
  await settle(app);
  const failing = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(failing, 'nodecompute_nvidia_smi_up 0');
  t.match(failing, `nodecompute_gpu_lost{gpu="6",uuid="${lostUuid}"} 1`, 'the last good listing\'s lost GPU stays, so its alert does not resolve');

  fake.update((s) => ({ ...s, gpus: eightGpuNode().gpus, failures: {} }));
  // Past the back-off after the failures.
  clock.advance(31_000);
  await app.inject({ method: 'GET', url: '/gpus' });
  await settle(app);
  t.same((await app.inject({ method: 'GET', url: '/gpus' })).json().lostGpus, [], 'listed again: no longer lost');
  t.notMatch((await app.inject({ method: 'GET', url: '/metrics' })).body, 'nodecompute_gpu_lost{');
});

t.test('a GPU with MIG enabled says so in /gpus and on the status page; one without MIG mode is null', async (t) => {
  const scenario = eightGpuNode();
  scenario.gpus[1]!.migMode = 'Enabled';
  scenario.gpus[7]!.migMode = '[N/A]';
  const { app } = await buildTestApp(t, { scenario });
  const body = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.same(schemaErrors(GpusResponseSchema, body), []);
  t.same(body.gpus.map((gpu: { migMode: string | null }) => gpu.migMode), ['Disabled', 'Enabled', 'Disabled', 'Disabled', 'Disabled', 'Disabled', 'Disabled', null]);
  const text = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/plain' } })).body;
  t.match(text, /\n1 +NVIDIA H200 \(MIG\) +\[/, 'the GPU row is marked');
  t.match(text, /\n {2}\(MIG\) MIG is enabled: .*whole GPU.*NVML/);
  t.equal(text.split('(MIG)').length - 1, 2, 'one GPU marked, and the note');
  const html = (await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } })).body;
  t.equal(html.split('class="gpu-mig"').length - 1, 1);
  t.match(html, /<span class="gpu-mig" title="MIG is enabled: [^"]*whole GPU[^"]*">MIG<\/span>/);
  const migDevices = BACKEND === 'nvml' ? [null, [], null, null, null, null, null, null] : Array(8).fill(null);
  t.same(body.gpus.map((gpu: { migDevices: unknown }) => gpu.migDevices), migDevices, 'NVML lists the MIG devices of a MIG GPU (none made yet); nvidia-smi none');
});
