// A bug behind a route (here: an nvidia-smi reader that throws a plain TypeError) is answered with a
// coded 500 that says what to do, logged with its stack, and never turned into a verdict.
import t from 'tap';
import { pino } from 'pino';
import type { GpuDriver } from '../../src/system/gpu-driver.js';
import { buildTestApp, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';

function brokenNvidiaSmi(): GpuDriver {
  const bug = () => Promise.reject(new TypeError("Cannot read properties of undefined (reading 'split')"));
  return { backend: 'nvidia-smi', source: 'broken', queryGpus: bug, queryComputeApps: bug, queryVersion: bug, killAll: () => undefined, running: 0, stopped: false };
}

t.test('a bug is a coded 500 on every snapshot-backed route, and is logged', async (t) => {
  const { log: logger, lines } = captureLog('error');
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { driver: brokenNvidiaSmi(), logger } });
  const put = await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [] } });
  t.equal(put.statusCode, 201, 'a registration that checks no GPU does not need nvidia-smi');
  for (const url of ['/gpus', '/gpus/foreign-memory', '/readyz', '/shards', '/shards/s', '/shards/s/ready', '/shards/s/compute', '/metrics', '/']) {
    const res = await app.inject({ method: 'GET', url });
    t.equal(res.statusCode, 500, url);
    t.same(res.json(), {
      statusCode: 500,
      code: 'NODECOMPUTE_INTERNAL',
      error: 'Internal Server Error',
      message: 'nodecompute hit an unexpected error while answering; the details are in its log. Retry; if it persists, report it with the log lines.',
    });
  }
  const bugs = lines.filter((line) => line.msg.includes('this is a bug in nodecompute') && JSON.stringify(line.err).includes('TypeError'));
  t.equal(bugs.length, 9, 'each logged with the error');
  t.equal(new Set(bugs.map((line) => line.reqId)).size, 9, 'each with its own request id');
  t.same(
    bugs.map((line) => `${line.method} ${line.url}`),
    ['/gpus', '/gpus/foreign-memory', '/readyz', '/shards', '/shards/s', '/shards/s/ready', '/shards/s/compute', '/metrics', '/'].map((url) => `GET ${url}`),
    'and the request it answered',
  );
  const checked = await app.inject({ method: 'PUT', url: '/shards/t', payload: { pid: shard.pid, gpus: [0] } });
  t.equal(checked.statusCode, 500, 'a registration whose GPU check hits the bug is refused, not taken on trust');
  t.equal((await app.inject({ method: 'GET', url: '/shards/t' })).statusCode, 404);
});

t.test('a /proc nodecompute cannot read refuses a registration with a coded 503 naming the problem', async (t) => {
  const { createProcReader } = await import('../../src/system/procfs.js');
  const base = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  const denied = new Error('cannot read /proc/4242/stat: permission denied (EACCES). Point NODECOMPUTE_PROC at the host\'s /proc.');
  const proc = { ...base, root: base.root, readStat: () => Promise.reject(denied), findPidsInCgroup: () => Promise.reject(denied) };
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { proc } });
  for (const payload of [{ pid: 4242, gpus: [] }, { cgroup: 'abcdef123456', gpus: [] }]) {
    const res = await app.inject({ method: 'PUT', url: '/shards/p', payload });
    t.equal(res.statusCode, 503);
    t.equal(res.json().code, 'NODECOMPUTE_PROC_UNREADABLE');
    t.match(res.json().message, /^The registration was not stored: cannot read \/proc\/4242\/stat: permission denied .*nodecompute doctor/);
  }
  t.equal((await app.inject({ method: 'GET', url: '/shards/p' })).statusCode, 404);
});
