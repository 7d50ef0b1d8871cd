// 500 concurrent requests on a cold cache: one snapshot serves them all, so the driver (nvidia-smi
// or NVML) answers each query exactly once. (A long TTL keeps a slow machine from legitimately refreshing mid-test.)
import t from 'tap';
import { buildTestApp, settle } from '../helpers/app.js';
import { BACKEND, driverQueries } from '../helpers/backend.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { killLeftovers } from '../helpers/process-scan.js';

t.test('500 concurrent requests on a cold cache ask the driver each query exactly once', async (t) => {
  const { app, fake } = await buildTestApp(t, {
    // A little delay so every request surely arrives while the one refresh is under way.
    scenario: { ...eightGpuNode(), delayMs: 300 },
    config: { cacheTtlMs: 600_000, maxStaleMs: 600_000, smiTimeoutMs: 60_000 },
  });
  t.teardown(() => killLeftovers(fake));
  const urls = ['/gpus', '/gpus/foreign-memory', '/shards', '/readyz?verbose', '/metrics'];
  const answers = await Promise.all(
    Array.from({ length: 500 }, (_, i) => app.inject({ method: 'GET', url: urls[i % urls.length]! })),
  );
  const byStatus = new Map<string, number>();
  for (const [i, res] of answers.entries()) {
    const key = `${urls[i % urls.length]} ${res.statusCode}`;
    byStatus.set(key, (byStatus.get(key) ?? 0) + 1);
  }
  const gpusAnswers = answers.filter((_, i) => i % urls.length === 0);
  t.ok(gpusAnswers.every((res) => res.statusCode === 200), `every GET /gpus answered 200: ${JSON.stringify([...byStatus])}`);
  t.ok(
    answers.every((res, i) => res.statusCode < 500 || urls[i % urls.length] === '/readyz?verbose'),
    'no 5xx (except /readyz, which reports that the fake PIDs are not in this /proc)',
  );
  const observed = new Set(gpusAnswers.map((res) => res.json().observedAt));
  t.equal(observed.size, 1, 'every answer comes from the same snapshot');
  await settle(app);
  t.equal(await driverQueries(app, 'gpus'), 1, 'the GPU query ran once');
  t.equal(await driverQueries(app, 'compute-apps'), 1, 'the process query ran once');
  if (BACKEND === 'nvidia-smi') t.equal(fake.countQueries('gpu') + fake.countQueries('compute-apps'), 2, 'as nvidia-smi counts its runs');
});
