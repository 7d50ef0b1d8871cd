// /proc entries vanishing under the service: between a registration and the next snapshot, in the
// middle of a snapshot's reads, and real processes exiting while nvidia-smi answers. A vanished
// process is an ordinary answer (gone: the shard exited, the GPU process is nobody's), never an
// exception and never a 5xx.
import { spawn } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { READINESS_STATES } from '../../src/shards/verdict.js';
import { createProcReader, type ProcReader } from '../../src/system/procfs.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode, livePidsInGroup, waitUntil, type FakeProcess, type FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { killLeftovers } from '../helpers/process-scan.js';
import { captureLog } from '../helpers/log-capture.js';

const silent = pino({ level: 'silent' });

/** A /proc/PID/stat line; field 22 is the start time. */
function statLine(pid: number, comm: string, pgrp: number, startTime: number): string {
  return `${pid} (${comm}) S 1 ${pgrp} ${pgrp} 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 ${startTime} 1000000 100\n`;
}

function withProcesses(processes: FakeProcess[]): FakeScenario {
  return { ...eightGpuNode(), processes };
}

t.test('fixture /proc: entries deleted between registration and the next snapshot, and during its reads', async (t) => {
  const root = t.testdir({
    '4242': { stat: statLine(4242, 'llama-server', 4242, 5000), cgroup: '0::/system.slice/llama.service\n' },
    '4243': { stat: statLine(4243, 'llama-worker', 4242, 5001), cgroup: '0::/system.slice/llama.service\n' },
    '5000': { stat: statLine(5000, 'python3', 5000, 6000), cgroup: '0::/user.slice/user-0.slice\n' },
    '6000': {
      stat: statLine(6000, 'vllm', 6000, 7000),
      cgroup: '0::/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-1.scope\n',
    },
  });
  const base = createProcReader({ root, log: silent });
  // Deletes a PID's entry right before reading it: the process exits between the listing and the read.
  const vanishOnRead = new Set<number>();
  const proc: ProcReader = {
    ...base,
    root: base.root,
    readStat: async (pid) => {
      if (vanishOnRead.has(pid)) rmSync(join(root, String(pid)), { recursive: true, force: true });
      return base.readStat(pid);
    },
    // The snapshot reads every PID in one call: the entry vanishes just before that read.
    readStats: async (pids) => {
      for (const pid of pids) if (vanishOnRead.has(pid)) rmSync(join(root, String(pid)), { recursive: true, force: true });
      return base.readStats(pids);
    },
  };
  const clock = manualClock();
  const scenario = eightGpuNode();
  const uuid = (i: number) => scenario.gpus[i]!.uuid;
  const listed: FakeProcess[] = [
    { gpuUuid: uuid(0), pid: 4243, name: 'llama-worker', usedMiB: 9000 },
    { gpuUuid: uuid(1), pid: 5000, name: 'python3', usedMiB: 1000 },
    { gpuUuid: uuid(2), pid: 6000, name: 'vllm', usedMiB: 3000 },
  ];
  const { app, fake } = await buildTestApp(t, {
    scenario: withProcesses(listed),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now, proc },
  });
  const step = () => clock.advance(1);
  const get = async (url: string) => {
    step();
    const res = await app.inject({ method: 'GET', url });
    t.ok(res.statusCode < 500 || (url.endsWith('/ready') && res.statusCode === 503 && 'state' in res.json()), `${url}: no 5xx error (${res.statusCode}: ${res.body.slice(0, 160)})`);
    return res;
  };

  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: 4242, gpus: [0], graceMs: 0 } })).statusCode, 201);
  t.equal(
    (await app.inject({ method: 'PUT', url: '/shards/pod', payload: { cgroup: '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0', gpus: [2], graceMs: 0 } })).statusCode,
    201,
  );
  t.equal((await get('/shards/s/ready')).json().state, 'ready', 'ready while its worker holds GPU 0');
  t.equal((await get('/shards/pod/ready')).json().state, 'ready');

  // The GPU process's entry goes (another namespace now, or it exited): its memory is nobody's.
  rmSync(join(root, '4243'), { recursive: true });
  const gpus = (await get('/gpus')).json();
  t.same(gpus.gpus[0].processes.map((p: { pid: number; shard: string | null }) => [p.pid, p.shard]), [[4243, null]]);
  const afterWorker = (await get('/shards/s/ready')).json();
  t.ok((READINESS_STATES as readonly string[]).includes(afterWorker.state), `a verdict, not an exception: ${afterWorker.state}`);
  t.not(afterWorker.state, 'ready', 'no process of the shard holds GPU 0 any more');

  // The shard's own process goes: exited, saying which process.
  rmSync(join(root, '4242'), { recursive: true });
  const exited = await get('/shards/s/ready');
  t.equal(exited.statusCode, 503);
  t.equal(exited.json().state, 'exited');
  t.match(exited.json().reason, /4242/);
  t.equal((await get('/shards/s/compute')).statusCode, 200);

  // Its PID is reused by an unrelated process (another start time, another group) that takes GPU
  // memory: the shard stays exited, and that memory is foreign, not the dead shard's.
  mkdirSync(join(root, '4242'));
  writeFileSync(join(root, '4242', 'stat'), statLine(4242, 'python3', 9999, 99_999));
  fake.setScenario(withProcesses([...listed, { gpuUuid: uuid(1), pid: 4242, name: 'python3', usedMiB: 2000 }]));
  const reused = await get('/shards/s/ready');
  t.equal(reused.json().state, 'exited');
  t.match(reused.json().reason, /reused/);
  const reusedGpus = (await get('/gpus')).json();
  t.same(
    reusedGpus.gpus[1].processes.map((p: { pid: number; shard: string | null }) => [p.pid, p.shard]),
    [[5000, null], [4242, null]],
    'the new process behind a reused PID belongs to no shard',
  );
  const reusedForeign = (await get('/gpus/foreign-memory')).json();
  t.same(reusedForeign.gpus[1].foreignProcesses.map((p: { pid: number }) => p.pid), [5000, 4242], 'and its memory counts as foreign');
  t.same((await get('/shards/s/compute')).json().strayGpus, [], 'the exited shard is not said to hold GPU 1');
  rmSync(join(root, '4242'), { recursive: true });
  fake.setScenario(withProcesses(listed));

  // A foreign GPU process vanishes during the snapshot's own reads.
  vanishOnRead.add(5000);
  const foreign = (await get('/gpus/foreign-memory')).json();
  t.same(
    foreign.gpus[1].foreignProcesses.map((p: { pid: number }) => p.pid),
    [5000],
    'still listed as nvidia-smi reported it, as foreign memory',
  );

  // The cgroup shard's only process loses its cgroup file mid-scan, then its whole entry.
  rmSync(join(root, '6000', 'cgroup'));
  const list = await get('/shards');
  t.equal(list.statusCode, 200);
  t.same(list.json().shards.map((s: { id: string }) => s.id), ['pod', 's']);
  const podState = (await get('/shards/pod/ready')).json().state;
  t.ok((READINESS_STATES as readonly string[]).includes(podState), `the cgroup shard has a verdict: ${podState}`);
  rmSync(join(root, '6000'), { recursive: true });
  t.equal((await get('/shards/pod/ready')).json().state, 'exited', 'no process left in its cgroup: exited');
  t.equal((await get('/gpus')).statusCode, 200);
  t.equal((await get('/metrics')).statusCode, 200);
});

t.test("fixture /proc: one process's cgroup file that cannot be read fails the cgroup scan, not the snapshot", async (t) => {
  const podCgroup = '0::/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-1.scope\n';
  const root = t.testdir({
    '4242': { stat: statLine(4242, 'llama-server', 4242, 5000), cgroup: '0::/system.slice/llama.service\n' },
    '6000': { stat: statLine(6000, 'vllm', 6000, 7000), cgroup: podCgroup },
    '7000': { stat: statLine(7000, 'bash', 7000, 8000), cgroup: '0::/user.slice/user-0.slice\n' },
  });
  const { log, lines } = captureLog('warn');
  const clock = manualClock();
  const scenario = eightGpuNode();
  scenario.processes = [
    { gpuUuid: scenario.gpus[0]!.uuid, pid: 4242, name: 'llama-server', usedMiB: 9000 },
    { gpuUuid: scenario.gpus[2]!.uuid, pid: 6000, name: 'vllm', usedMiB: 3000 },
  ];
  const { app } = await buildTestApp(t, {
    scenario,
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now, proc: createProcReader({ root, log: silent }), logger: log },
  });
  const get = async (url: string) => {
    clock.advance(1);
    return app.inject({ method: 'GET', url });
  };
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: 4242, gpus: [0], graceMs: 0 } })).statusCode, 201);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/pod', payload: { cgroup: '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0', gpus: [2], graceMs: 0 } })).statusCode, 201);
  t.equal((await get('/shards/pod/ready')).json().state, 'ready');

  // Another process's cgroup file turns unreadable (a directory here: EISDIR; on a node, EMFILE or EIO).
  rmSync(join(root, '7000', 'cgroup'));
  mkdirSync(join(root, '7000', 'cgroup'));
  const pid = await get('/shards/s/ready');
  t.match({ status: pid.statusCode, ...pid.json() }, { status: 200, state: 'ready', warnings: [] }, 'a PID shard is judged as ever');
  const pod = await get('/shards/pod/ready');
  t.match(
    { status: pod.statusCode, ...pod.json() },
    {
      status: 200,
      state: 'unverified',
      cause: 'stat-unreadable',
      warnings: [/^which processes are in cgroup "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0" could not be read in this refresh: cannot read .*\/7000\/cgroup: EISDIR.* keeps serving\. Run `nodecompute doctor`/],
    },
    'the cgroup shard keeps serving, saying why its verdict is unverified',
  );
  const foreign = (await get('/gpus/foreign-memory')).json();
  t.same(foreign.gpus[2].foreignProcesses.map((p: { pid: number }) => p.pid), [6000], "the pod's memory counts as foreign meanwhile: placement errs on the safe side");
  t.equal((await get('/metrics')).statusCode, 200);
  const warned = lines.filter((line) => /^Could not find the processes of the cgroup shards in \/proc/.test(line.msg));
  t.equal(warned.length, 1, 'one warning for the same failure in refresh after refresh');
  t.match(warned[0], { cgroupShards: 1, msg: /PID shards and the GPUs are not affected/ });

  rmSync(join(root, '7000', 'cgroup'), { recursive: true });
  writeFileSync(join(root, '7000', 'cgroup'), '0::/user.slice/user-0.slice\n');
  t.equal((await get('/shards/pod/ready')).json().state, 'ready', 'readable again: judged again');
});

t.test('real processes listed by nvidia-smi exit while the snapshot is being taken', async (t) => {
  const clock = manualClock();
  const leaders = await Promise.all(Array.from({ length: 4 }, () => spawnShardProcess(t, 0)));
  // Short-lived processes that end on their own during the snapshot.
  const shortLived = Array.from({ length: 8 }, (_, i) => spawn('sleep', [`0.${i + 2}`], { detached: true, stdio: 'ignore' }));
  t.teardown(() => {
    for (const child of shortLived) child.kill('SIGKILL');
  });
  const scenario = eightGpuNode();
  const processes: FakeProcess[] = [
    ...leaders.map((l, i) => ({ gpuUuid: scenario.gpus[i]!.uuid, pid: l.pid, name: 'llama-server', usedMiB: 8000 + i })),
    ...shortLived.map((c, i) => ({ gpuUuid: scenario.gpus[4 + (i % 4)]!.uuid, pid: c.pid!, name: 'sleep', usedMiB: 100 + i })),
  ];
  const { app, fake } = await buildTestApp(t, {
    scenario: withProcesses(processes),
    config: { cacheTtlMs: 0, maxStaleMs: 0, smiTimeoutMs: 60_000 },
    deps: { now: clock.now },
  });
  t.teardown(() => killLeftovers(fake));
  t.equal((await app.inject({ method: 'PUT', url: '/shards/real', payload: { pid: leaders[0]!.pid, gpus: [0], graceMs: 0 } })).statusCode, 201);
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/real/ready' })).json().state, 'ready');

  // nvidia-smi now takes 4 s; while it runs, the shard and the others exit.
  fake.update((s) => ({ ...s, delayMs: 4000 }));
  const before = fake.countQueries('compute-apps');
  clock.advance(1);
  const pending = Promise.all([
    app.inject({ method: 'GET', url: '/shards/real/ready' }),
    app.inject({ method: 'GET', url: '/gpus' }),
    app.inject({ method: 'GET', url: '/gpus/foreign-memory' }),
    app.inject({ method: 'GET', url: '/shards' }),
  ]);
  await waitUntil(() => fake.countQueries('compute-apps') > before, { timeoutMs: 20_000, what: 'the snapshot to ask nvidia-smi' });
  await Promise.all(leaders.map((l) => l.kill()));
  const [ready, gpus, foreign, list] = await pending;
  t.ok(leaders.every((l) => livePidsInGroup(l.pid).length === 0), 'they are gone');

  t.equal(ready.statusCode, 503, ready.body.slice(0, 200));
  t.equal(ready.json().state, 'exited', 'the shard exited during the snapshot: exited');
  for (const [name, res] of [['/gpus', gpus], ['/gpus/foreign-memory', foreign], ['/shards', list]] as const) {
    t.equal(res.statusCode, 200, `${name} answered 200: ${res.body.slice(0, 160)}`);
  }
  const listed = gpus.json().gpus.flatMap((g: { processes: Array<{ pid: number; shard: string | null }> }) => g.processes);
  t.equal(listed.length, processes.length, 'every process nvidia-smi listed is still reported');
  t.ok(listed.every((p: { shard: string | null }) => p.shard === null), 'none is attributed to the exited shard');
});
