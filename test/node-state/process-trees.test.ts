// Attribution over real process trees, through the app: the fake nvidia-smi lists real PIDs and the
// real /proc is read. Two shards that one script started without job control (one process group),
// each computing in a grandchild; a shard in a script's group beside an older GPU program; a shard's
// process that exits while its engine child keeps the GPU;
// and a shard whose own stat stops parsing (a fixture /proc: a real one cannot be made to).
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import t, { type Test } from 'tap';
import { pino } from 'pino';
import { createProcReader, isReadable, type ProcStat } from '../../src/system/procfs.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { driverQueries } from '../helpers/backend.js';
import { eightGpuNode, livePidsInGroup, waitUntil, type FakeProcess, type FakeScenario } from '../helpers/fake-nvidia-smi.js';

const silent = pino({ level: 'silent' });
const uuids = eightGpuNode().gpus.map((gpu) => gpu.uuid);

function withProcesses(processes: FakeProcess[]): FakeScenario {
  return { ...eightGpuNode(), processes };
}

/** The live stats of a process group's members, by pid. */
async function groupStats(pgid: number): Promise<Map<number, ProcStat>> {
  const answers = await createProcReader({ root: '/proc', log: silent }).readStats(livePidsInGroup(pgid));
  return new Map([...answers].flatMap(([pid, stat]) => (isReadable(stat) ? [[pid, stat] as const] : [])));
}

function childOf(stats: Map<number, ProcStat>, parent: number): number {
  const found = [...stats.values()].find((stat) => stat.ppid === parent);
  if (found === undefined) throw new Error(`process ${parent} has no child in its group`);
  return found.pid;
}

interface ScriptedShards {
  /** The script's PID: the process group of everything it started. */
  script: number;
  /** Per shard: the PID it is registered with, its "EngineCore" child, and the grandchild that holds the GPU. */
  shards: Array<{ pid: number; engine: number; worker: number }>;
}

/**
 * `sh launch.sh`, detached: it starts two "vllm serve" shards with `&` and no job control, so both
 * are in the script's process group. Each shard starts an EngineCore (sh) whose child (sleep) is the
 * process that holds GPU memory: the shard's PID is its grandparent, and the EngineCore between them
 * is no GPU process, so the snapshot must read it to see the line.
 */
async function startScriptedShards(t: Test): Promise<ScriptedShards> {
  const dir = t.testdir({
    'launch.sh': ["serve() { sh -c 'sleep 600 & wait' & wait; }", 'serve & echo $!', 'serve & echo $!', 'wait', ''].join('\n'),
  });
  const child = spawn('sh', [join(dir, 'launch.sh')], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  const script = child.pid!;
  t.teardown(async () => {
    try {
      process.kill(-script, 'SIGKILL');
    } catch {
      // already gone
    }
    await waitUntil(() => livePidsInGroup(script).length === 0, { what: `process group ${script} to die` });
  });
  const printed: number[] = [];
  const lines = createInterface({ input: child.stdout! });
  lines.on('line', (line) => printed.push(Number(line)));
  // The script, two shards, two EngineCores, two workers.
  await waitUntil(() => printed.length === 2 && livePidsInGroup(script).length === 7, { what: `the script ${script} to start its shards` });
  lines.close();
  const stats = await groupStats(script);
  const shards = printed.map((pid) => {
    const engine = childOf(stats, pid);
    return { pid, engine, worker: childOf(stats, engine) };
  });
  return { script, shards };
}

t.test('two shards started by one script, each computing in a grandchild: each holds its own GPU', async (t) => {
  const { script, shards } = await startScriptedShards(t);
  const [a, b] = shards as [ScriptedShards['shards'][0], ScriptedShards['shards'][0]];
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: withProcesses([
      { gpuUuid: uuids[0]!, pid: a.worker, name: 'VLLM::Worker', usedMiB: 70_000 },
      { gpuUuid: uuids[1]!, pid: b.worker, name: 'VLLM::Worker', usedMiB: 71_000 },
    ]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now },
  });
  for (const [id, shard, gpu] of [['a', a, 0], ['b', b, 1]] as const) {
    const put = await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid: shard.pid, gpus: [gpu], engine: 'vllm', graceMs: 0 } });
    t.equal(put.statusCode, 201, put.body);
  }
  clock.advance(1);
  for (const id of ['a', 'b']) {
    const ready = await app.inject({ method: 'GET', url: `/shards/${id}/ready` });
    t.equal(ready.statusCode, 200, `${id}: ${ready.body}`);
    t.same(ready.json().warnings, [], `${id}: no stray GPU`);
  }
  const owners = (await app.inject({ method: 'GET', url: '/gpus' })).json().gpus.slice(0, 2).map((gpu: { processes: Array<{ pid: number; shard: string | null }> }) => gpu.processes.map((p) => [p.pid, p.shard]));
  t.same(owners, [[[a.worker, 'a']], [[b.worker, 'b']]], 'each worker attributed to the shard it descends from, not to the first of the group');

  // Shard a's own process dies; its EngineCore and worker live on, re-parented, in the script's group.
  process.kill(a.pid, 'SIGKILL');
  await waitUntil(() => !livePidsInGroup(script).includes(a.pid), { what: `shard process ${a.pid} to be reaped` });
  clock.advance(1);
  const exited = await app.inject({ method: 'GET', url: '/shards/a/ready' });
  t.equal(exited.statusCode, 503);
  t.equal(exited.json().state, 'exited');
  const reason = exited.json().reason;
  const facts = [`process ${a.pid} no longer exists`, `process group ${script}`, `70000 MiB on GPU 0 (PID ${a.worker}, VLLM::Worker)`];
  for (const fact of facts) t.match(reason, fact);
  t.match(reason, new RegExp(`kill ${a.worker}\\.$`), 'the orphan to kill');
  const b2 = (await app.inject({ method: 'GET', url: '/shards/b/ready' })).json();
  t.same([b2.state, b2.warnings], ['ready', []], "b is not handed a's orphan: the group is no longer b's alone to claim");
  const foreign = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json();
  t.same(foreign.gpus[0].foreignProcesses.map((p: { pid: number }) => p.pid), [a.worker], "the orphan's memory is foreign");
  t.ok((await driverQueries(app, 'compute-apps')) > 0);
});

t.test("a shard that does not lead its group: an older member's GPU memory is not its, so it does not read ready on it", async (t) => {
  // A script without job control starts a "warm-up" CUDA program, then the engine, in its own group.
  // The engine registered computes on the CPU (it holds nothing); the older program holds GPU 2,
  // the engine's GPU. Its memory must read as foreign, not make the engine ready.
  const dir = t.testdir({ 'launch.sh': ['sleep 600 & echo $!', 'sleep 0.2', 'sleep 600 & echo $!', 'wait', ''].join('\n') });
  const child = spawn('sh', [join(dir, 'launch.sh')], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  const script = child.pid!;
  t.teardown(async () => {
    process.kill(-script, 'SIGKILL');
    await waitUntil(() => livePidsInGroup(script).length === 0, { what: `process group ${script} to die` });
  });
  const printed: number[] = [];
  const lines = createInterface({ input: child.stdout! });
  lines.on('line', (line) => printed.push(Number(line)));
  await waitUntil(() => printed.length === 2, { what: `the script ${script} to start its programs` });
  lines.close();
  const [older, engine] = printed as [number, number];
  const stats = await groupStats(script);
  t.ok(stats.get(older)!.startTime < stats.get(engine)!.startTime, 'the warm-up program started clock ticks before the engine');
  t.equal(stats.get(engine)!.pgrp, script, "the engine is in the script's group, which it does not lead");

  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: withProcesses([{ gpuUuid: uuids[2]!, pid: older, name: 'python3', usedMiB: 3000 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: engine, gpus: [2], engine: 'llama.cpp', graceMs: 0 } })).statusCode, 201);
  clock.advance(1);
  const ready = await app.inject({ method: 'GET', url: '/shards/s/ready' });
  t.equal(ready.statusCode, 503, ready.body);
  t.same([ready.json().state, ready.json().cause], ['on-cpu', 'no-gpu-memory'], "the engine holds nothing on GPU 2: the older program's memory is no evidence for it");
  const gpu = (await app.inject({ method: 'GET', url: '/gpus/foreign-memory' })).json().gpus[2];
  t.same([gpu.shardMiB, gpu.foreignMiB, gpu.foreignProcesses.map((p: { pid: number }) => p.pid)], [0, gpu.usedMiB, [older]], 'that memory is foreign: placement must not hand it out');
});

t.test('a group leader that exits while its engine child holds the GPU: exited, and the reason names the child', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const engine = shard.members[0]!;
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: withProcesses([{ gpuUuid: uuids[3]!, pid: engine, name: 'llama-server', usedMiB: 9000 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: shard.pid, gpus: [3], graceMs: 0 } })).statusCode, 201);
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/s/ready' })).json().state, 'ready', 'its child holds GPU 3');

  process.kill(shard.pid, 'SIGKILL');
  await waitUntil(() => livePidsInGroup(shard.pid).join() === String(engine), { what: `leader ${shard.pid} to be reaped` });
  clock.advance(1);
  const res = await app.inject({ method: 'GET', url: '/shards/s/ready' });
  t.equal(res.statusCode, 503);
  t.equal(res.json().state, 'exited', 'the registered process is gone');
  t.match(res.json().reason, `process group ${shard.pid} still holds GPU memory: 9000 MiB on GPU 3 (PID ${engine}, llama-server)`);
  t.match(res.json().reason, new RegExp(`kill ${engine}\\.$`));
});

t.test('a shard whose stat stops parsing keeps serving, unverified, instead of reading as exited', async (t) => {
  const line = (pid: number, pgrp: number, startTime: number) => `${pid} (llama-server) S 1 ${pgrp} ${pgrp} 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 ${startTime} 1000000 100\n`;
  const root = t.testdir({ '4242': { stat: line(4242, 4242, 5000), cgroup: '0::/system.slice/llama.service\n' } });
  const clock = manualClock();
  const { app } = await buildTestApp(t, {
    scenario: withProcesses([{ gpuUuid: uuids[0]!, pid: 4242, name: 'llama-server', usedMiB: 9000 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock.now, proc: createProcReader({ root, log: silent }) },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/s', payload: { pid: 4242, gpus: [0], graceMs: 0 } })).statusCode, 201);
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/s/ready' })).json().state, 'ready');

  writeFileSync(join(root, '4242', 'stat'), '4242 (llama-server');
  clock.advance(1);
  const res = await app.inject({ method: 'GET', url: '/shards/s/ready' });
  t.equal(res.statusCode, 200, 'still serving');
  t.equal(res.json().state, 'unverified');
  t.match(res.json().warnings, [/process 4242 .*its stat does not parse.*keeps serving.*log quotes the line/]);
  const owners = (await app.inject({ method: 'GET', url: '/gpus' })).json().gpus[0].processes.map((p: { pid: number; shard: string | null }) => [p.pid, p.shard]);
  t.same(owners, [[4242, 's']], 'and it still owns its own process');

  writeFileSync(join(root, '4242', 'stat'), line(4242, 4242, 5000));
  clock.advance(1);
  t.equal((await app.inject({ method: 'GET', url: '/shards/s/ready' })).json().state, 'ready', 'readable again: ready again');
});
