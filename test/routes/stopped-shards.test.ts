// A shard whose process is stopped, for real: a process group of this machine SIGSTOPped (what Ctrl-Z
// does to a terminal's job; SIGTSTP itself is discarded for a detached, orphaned group such as a
// test's) and SIGCONTed, judged through the app with the fake nvidia-smi listing its memory. It
// reads stopped (503) while it keeps its GPU memory, which stays its own, and ready again once it
// runs, with nvidia-smi answering or not; a pod is stopped once every process of it is, or one that
// holds its GPU memory is.
// Cgroup membership, which a test cannot arrange for real processes, is what the /proc reader's
// cgroup scan answers (as in test/shards/cgroup-restarts.test.ts).
import { readFileSync } from 'node:fs';
import t from 'tap';
import { pino } from 'pino';
import type { App } from '../../src/app.js';
import { createProcReader, type ProcReader } from '../../src/system/procfs.js';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { driverQueries, failDriver, UNREACHABLE_SAID } from '../helpers/backend.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';
import { twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';

/** Generous: a stop or a resume takes microseconds, but a loaded 2-core machine may not run the test for seconds. */
const SIGNAL_TAKES_MS = 60_000;

/** The state letter of /proc/PID/stat. */
function procState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0]!;
}

async function signal(pid: number, name: 'SIGSTOP' | 'SIGCONT'): Promise<void> {
  process.kill(pid, name);
  const stopped = name === 'SIGSTOP';
  await waitUntil(() => (procState(pid) === 'T') === stopped, { timeoutMs: SIGNAL_TAKES_MS, what: `process ${pid} to ${stopped ? 'stop' : 'run again'}` });
}

interface ReadyBody {
  ready: boolean;
  state: string;
  reason: string | null;
  warnings: string[];
  observedAt: string | null;
}

/** A probe of shard `id` a millisecond later each time (so each reads the newest snapshot), with its status and body. */
function prober(app: App, clock: ReturnType<typeof manualClock>, id: string) {
  return async () => {
    clock.advance(1);
    const res = await app.inject({ method: 'GET', url: `/shards/${id}/ready` });
    return { status: res.statusCode, body: res.json() as ReadyBody };
  };
}

t.test('a PID shard SIGSTOPped is stopped (503) and keeps its memory; SIGCONT makes it ready again; each change is logged once', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { lines, log: logger } = captureLog('info');
  const clock = manualClock();
  const scenario = twoGpuNode([{ gpuUuid: UUIDS[1]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 9000 }]);
  const { app } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now, logger } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/paused', payload: { pid: shard.pid, gpus: [1], engine: 'llama.cpp' } })).statusCode, 201);
  const probe = prober(app, clock, 'paused');
  t.match(await probe(), { status: 200, body: { state: 'ready' } });

  await signal(shard.pid, 'SIGSTOP');
  const stopped = await probe();
  t.equal(stopped.status, 503, 'out of traffic: it answers nothing');
  t.same({ ...stopped.body, observedAt: 'x' }, {
    shard: 'paused',
    ready: false,
    state: 'stopped',
    cause: 'process-stopped',
    reason: stopped.body.reason,
    warnings: [],
    observedAt: 'x',
  });
  t.match(stopped.body.reason, new RegExp(`^process ${shard.pid} \\(sh\\) is stopped \\(state T: .*SIGSTOP.*answers no request`));
  t.match(stopped.body.reason, `Resume it with \`kill -CONT ${shard.pid}\`, or \`fg\` in that terminal. The verdict changes by itself once it runs again.`);
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.match(gpus.gpus[1].processes, [{ pid: shard.members[0], shard: 'paused' }], 'its memory is still the shard\'s');
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.match(foreign.gpus[1], { shardMiB: 9000, foreignProcesses: [] }, 'and not foreign');
  const compute = (await app.inject({ method: 'GET', url: '/shards/paused/compute' })).json();
  t.match(compute, { backend: null, devices: ['GPU 1: 8.8 GiB'], gpus: [{ index: 1, usedMiB: 9000 }] }, 'computes nowhere while stopped; the GPU it keeps is listed');
  t.equal((await app.inject({ method: 'GET', url: '/shards/paused' })).json().status.state, 'stopped');
  const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(metrics, /^nodecompute_shard_state\{shard="paused",state="stopped"\} 1$/m);
  t.match(metrics, /^nodecompute_shard_state\{shard="paused",state="ready"\} 0$/m);
  t.match(await probe(), { status: 503, body: { state: 'stopped' } }, 'and again at the next probe');

  await signal(shard.pid, 'SIGCONT');
  t.match(await probe(), { status: 200, body: { state: 'ready', reason: null } }, 'ready again by itself');

  const verdicts = lines.filter((line) => line.shard === 'paused' && 'state' in line).map((line) => [line.level, line.state, line.previous, line.msg]);
  t.match(verdicts, [
    [30, 'ready', null, 'Shard "paused" is now ready'],
    [40, 'stopped', 'ready', new RegExp(`^Shard "paused" is now stopped: process ${shard.pid} \\(sh\\) is stopped \\(state T: `)],
    [30, 'ready', 'stopped', 'Shard "paused" is now ready'],
  ]);
  t.equal(verdicts.length, 3, 'a warning when it stops, nothing for the probes in between');
});

t.test('nvidia-smi failing: /proc still says stopped, and unverified (200) once it runs again', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const clock = manualClock();
  const scenario = twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 9000 }]);
  const { app, fake } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/blind', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  await settle(app);
  failDriver(fake, { kind: 'driver-unreachable' });
  await signal(shard.pid, 'SIGSTOP');
  // The first request starts the refresh that fails and reads /proc; the clock stands still after
  // it, so the next one answers from that refresh however long it took.
  clock.advance(1);
  await app.inject({ method: 'GET', url: '/shards/blind/ready' });
  await settle(app);
  const stopped = await app.inject({ method: 'GET', url: '/shards/blind/ready' });
  t.equal(stopped.statusCode, 503, 'not ready, whatever nvidia-smi says');
  t.match(stopped.json(), {
    state: 'stopped',
    reason: new RegExp(`^process ${shard.pid} \\(sh\\) is stopped \\(state T: .*\`kill -CONT ${shard.pid}\``),
    warnings: [new RegExp(`^the GPU driver cannot be asked, so which GPU memory it holds is unverified: .*${UNREACHABLE_SAID}`)],
    observedAt: null,
  });

  await signal(shard.pid, 'SIGCONT');
  // Past the failure window (30 s at most), so that the next request refreshes and reads /proc again.
  clock.advance(31_000);
  await app.inject({ method: 'GET', url: '/shards/blind/ready' });
  await settle(app);
  const resumed = await app.inject({ method: 'GET', url: '/shards/blind/ready' });
  t.equal(resumed.statusCode, 200);
  t.match(resumed.json(), { state: 'unverified', warnings: [/^the GPU driver cannot be asked, so where this shard computes is unverified/] });
});

const POD_UID = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';

/** The real /proc, but the pod's cgroup holds the processes the test says. */
function podProc(members: number[]): ProcReader {
  const real = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  const inPod = (needle: string) => (needle === POD_UID ? members : []);
  return {
    ...real,
    findPidsInCgroup: async (needle) => inPod(needle),
    findPidsInCgroups: async (needles) => new Map(needles.map((needle) => [needle, inPod(needle)])),
  };
}

t.test('a pod is stopped once every process of it is, or one that holds its GPU memory is: a stopped helper keeps it ready', async (t) => {
  const [server, worker] = await Promise.all([spawnShardProcess(t, 0), spawnShardProcess(t, 0)]);
  const clock = manualClock();
  const scenario = twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: worker.pid, name: 'python3', usedMiB: 20_000 }]);
  const proc = podProc([server.pid, worker.pid]);
  const { app } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now, proc } });
  const put = await app.inject({ method: 'PUT', url: '/shards/pod', payload: { cgroup: POD_UID, gpus: [0], engine: 'vllm' } });
  t.equal(put.statusCode, 201, put.body);
  const probe = prober(app, clock, 'pod');
  t.match(await probe(), { status: 200, body: { state: 'ready' } });

  await signal(server.pid, 'SIGSTOP');
  t.match(await probe(), { status: 200, body: { state: 'ready' } }, 'a process holding no GPU memory stopped, the worker running: alive, its memory held');
  await signal(worker.pid, 'SIGSTOP');
  const stopped = await probe();
  t.equal(stopped.status, 503);
  const [first, second] = [server.pid, worker.pid].sort((a, b) => a - b);
  t.equal(stopped.body.state, 'stopped');
  t.match(stopped.body.reason, `every process of cgroup "${POD_UID}" that has not exited, the pod's sandbox aside, is stopped: ${first} (sleep, state T), ${second} (sleep, state T). State T: `);
  t.match(stopped.body.reason, `Resume those in state T with \`kill -CONT ${first} ${second}\` on the node (host PIDs).`);
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.match(gpus.gpus[0].processes, [{ pid: worker.pid, shard: 'pod' }], 'the stopped pod keeps its memory');

  await signal(server.pid, 'SIGCONT');
  const workerStopped = await probe();
  t.equal(workerStopped.status, 503, 'the process holding its GPU memory still stopped: a stalled worker stalls the engine');
  t.match(workerStopped.body.reason, `a process holding its GPU memory is stopped while the rest runs: ${worker.pid} (sleep, state T, on GPU 0). `);
  await signal(worker.pid, 'SIGCONT');
  t.match(await probe(), { status: 200, body: { state: 'ready' } }, 'both running again: ready');
});

t.test('a probe answered from a snapshot past its TTL reads the shard process now: a stop or an exit since holds at once, not one probe period later', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const clock = manualClock();
  const scenario = twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: shard.members[0]!, name: 'llama-server', usedMiB: 9000 }]);
  const { app } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 2_000, maxStaleMs: 60_000 }, deps: { now: clock.now } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [0], graceMs: 0 } })).statusCode, 201);
  const probe = prober(app, clock, 's');
  t.match(await probe(), { status: 200, body: { state: 'ready' } });
  await settle(app);

  // Past the TTL, within max-stale: the probe is answered from the cached snapshot while a refresh
  // runs behind it. That snapshot saw the shard running; /proc says it is stopped now.
  await signal(shard.pid, 'SIGSTOP');
  clock.advance(5_000);
  const queries = await driverQueries(app, 'compute-apps');
  const stopped = await probe();
  t.match(stopped, { status: 503, body: { state: 'stopped', reason: new RegExp(`process ${shard.pid} .*is stopped`) } }, JSON.stringify(stopped.body));
  t.ok(Date.parse(stopped.body.observedAt!) < clock.now() - 4_000, 'from the cached snapshot, not a new one');
  await settle(app);
  t.ok((await driverQueries(app, 'compute-apps')) > queries, 'whose refresh ran behind the answer');
  // A process that runs keeps the snapshot's word: the one taken while it was stopped, until the next.
  await signal(shard.pid, 'SIGCONT');
  clock.advance(5_000);
  t.match(await probe(), { status: 503, body: { state: 'stopped' } }, 'a resume shows with the next snapshot');
  await settle(app);
  t.match(await probe(), { status: 200, body: { state: 'ready' } }, 'which saw it running');

  // The same for an exit.
  clock.advance(5_000);
  await shard.kill();
  const exited = await probe();
  t.match(exited, { status: 503, body: { state: 'exited', reason: new RegExp(`process ${shard.pid} (no longer exists|has exited)`) } }, JSON.stringify(exited.body));
  await settle(app);
});
