// A shard whose process is stopped (state T: SIGSTOP, SIGTSTP; t: halted by a debugger or tracer),
// judged over hand-made snapshots: the cases a test machine cannot stop on demand (a traced
// process, a pod of many stopped processes, an unreadable member) and the precedence of stopped
// against the other verdicts. Stopped is not ready (it answers nothing), yet the process keeps its
// memory, so the memory stays the shard's; only an exit beats it, and what would still count
// against the shard once it runs again stays as a warning. Real stopped processes are in
// test/routes/stopped-shards.test.ts.
import t from 'tap';
import { attribute } from '../../src/node-state/attribution.js';
import { foreignMemory } from '../../src/node-state/foreign-memory.js';
import type { GpuState, NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import { createNodeView, procOnlyLiveness, type NodeView } from '../../src/node-state/node-view.js';
import { shardCompute } from '../../src/shards/compute.js';
import { readiness, type ReadinessInput } from '../../src/shards/readiness.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcStat, StatAnswer } from '../../src/system/procfs.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { NO_GPU_ENGINE, shardRecord } from '../helpers/hand-made-view.js';

const NOW = 1_000_000;
const POD = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';

function stat(pid: number, state: string, overrides: Partial<ProcStat> = {}): ProcStat {
  return { pid, comm: 'llama-server', state, ppid: 1, pgrp: 100, session: 100, startTime: 5, cpuTicks: 0, ...overrides };
}

function snapshot(gpus: GpuState[], stats: StatAnswer[], extra: { cgroups?: Record<string, number[]>; absent?: number[] } = {}): NodeSnapshot {
  const proc = new Map<number, StatAnswer>(stats.map((answer) => [answer!.pid, answer]));
  for (const pid of extra.absent ?? []) proc.set(pid, null);
  return {
    takenAt: NOW,
    gpus,
    proc,
    cgroupPids: new Map(Object.entries(extra.cgroups ?? {}).map(([cgroup, pids]) => [cgroup, new Set(pids)])),
    bootId: null,
    unmatchedProcesses: [],
    lostGpus: [],
    cpuCores: new Map(),
    modelFiles: new Map(),
    timings: { driverMs: 1, procMs: 1 },
  };
}

function shard(overrides: Partial<ShardRecord> = {}): ShardRecord {
  return shardRecord(NOW, overrides);
}

function podShard(gpus = [0]): ShardRecord {
  return shard({ id: 'pod', pid: null, cgroup: POD, gpus });
}

const view = (snap: NodeSnapshot, shards: ShardRecord[]): NodeView => createNodeView(snap, shards, 1);

function verdict(s: ShardRecord, node: NodeView | null, more: Partial<ReadinessInput> = {}) {
  return readiness({ shard: s, node, engine: null, staleReason: null, now: NOW, unavailable: 'nvidia-smi timed out', ...more });
}

const CPU_ENGINE = NO_GPU_ENGINE;

const KEEPS = /keeps its GPU memory but answers no request: traffic to it hangs/;
const SIGNALLED = /[Ss]tate T: .*SIGSTOP, SIGTSTP \(Ctrl-Z.*SIGTTIN/;
const BY_ITSELF = 'The verdict changes by itself once it runs again.';

t.test('a PID shard stopped by a signal (T): stopped, 503, the reason says what, why and what to do; its memory stays its own', async (t) => {
  const s = shard();
  const node = view(snapshot([gpu(0, [[100, 9000], [300, 500]])], [stat(100, 'T'), stat(300, 'S', { comm: 'python3', pgrp: 300, session: 300 })]), [s]);
  const v = verdict(s, node);
  t.match(v, { ready: false, state: 'stopped', cause: 'process-stopped', reason: /^process 100 \(llama-server\) is stopped \(state T: / });
  t.same(v.warnings, []);
  for (const fact of [SIGNALLED, KEEPS, 'Resume it with `kill -CONT 100`, or `fg` in that terminal.', BY_ITSELF]) t.match(v.reason, fact);
  t.equal(node.attribution.ownerByPid.get(100), 's', 'a stopped process still owns its GPU memory');
  t.match(foreignMemory(node)[0], { shardMiB: 9000, foreignMiB: 0, foreignProcesses: [{ pid: 300 }] }, 'none of it reads as foreign');
  const { weights, ...compute } = shardCompute(s, node, null, v.state);
  t.equal(weights.offload, 'not-seen');
  t.same(compute, { backend: null, devices: ['GPU 0: 8.8 GiB'], gpus: [{ index: 0, usedMiB: 9000, smUtilPct: null, xidErrors: null, utilizationPct: null, migDevices: null }], strayGpus: [], cpuCores: null, engine: null }, 'computes nowhere, holds GPU 0');
});

t.test('a PID shard halted by a debugger (t): stopped, and the advice is the debugger, not SIGCONT', async (t) => {
  const s = shard();
  const v = verdict(s, view(snapshot([gpu(0, [[100, 9000]])], [stat(100, 't')]), [s]));
  t.equal(v.state, 'stopped');
  t.equal(v.ready, false);
  t.match(v.reason, /^process 100 \(llama-server\) is stopped \(state t: a debugger such as gdb, or another tracer/);
  t.match(v.reason, KEEPS);
  t.match(v.reason, /Let it continue in the debugger, or detach it \(gdb: `detach`\): `kill -CONT` does not resume a traced process\. The verdict changes by itself/);
});

t.test('a stopped shard whose child still runs is stopped, and the child\'s memory stays the shard\'s', async (t) => {
  const s = shard();
  const child = stat(101, 'R', { ppid: 100, comm: 'worker' });
  const node = view(snapshot([gpu(0, [[101, 7000]])], [stat(100, 'T'), child]), [s]);
  t.equal(node.attribution.liveness.get('s')?.state, 'stopped');
  t.equal(node.attribution.ownerByPid.get(101), 's');
  t.equal(verdict(s, node).state, 'stopped', 'the registered process answers the requests: stopped, it answers none');
});

t.test('a running shard whose GPU worker is stopped (a tensor-parallel rank) is stopped: the worker stalls every request; a stopped process holding nothing does not count', async (t) => {
  const s = shard({ gpus: [0, 1] });
  const rank0 = stat(101, 'S', { ppid: 100, comm: 'worker-0' });
  const rank1 = stat(102, 'T', { ppid: 100, comm: 'worker-1' });
  const idle = stat(103, 'T', { ppid: 100, comm: 'tokenizer' });
  const snap = snapshot([gpu(0, [[101, 7000]]), gpu(1, [[102, 7000]])], [stat(100, 'S'), rank0, rank1, idle]);
  const node = view(snap, [s]);
  const v = verdict(s, node);
  t.match(v, { ready: false, state: 'stopped', cause: 'process-stopped', reason: /^a process holding its GPU memory is stopped while the rest runs: 102 \(worker-1, state T, on GPU 1\)\. / });
  t.same(v.warnings, []);
  for (const fact of ['stalls every request', SIGNALLED, KEEPS, 'Resume those in state T with `kill -CONT 102` on the node (host PIDs).', BY_ITSELF]) t.match(v.reason, fact);
  t.equal(node.attribution.ownerByPid.get(102), 's', 'its memory stays the shard\'s');

  const running = view(snapshot([gpu(0, [[101, 7000]]), gpu(1, [[102, 7000]])], [stat(100, 'S'), rank0, { ...rank1, state: 'R' }, idle]), [s]);
  t.equal(verdict(s, running).state, 'ready', 'a stopped process that holds no GPU memory (a helper) is not the engine stalling');
});

t.test('stopped GPU workers: one on two GPUs named once with both, a traced one told apart, more than five counted; a cgroup shard too', async (t) => {
  const s = shard({ gpus: [0, 1] });
  const wide = stat(101, 't', { ppid: 100, comm: 'worker' });
  const node = view(snapshot([gpu(0, [[101, 3000]]), gpu(1, [[101, 3000]])], [stat(100, 'S'), wide]), [s]);
  t.match(verdict(s, node).reason, /^a process holding its GPU memory is stopped while the rest runs: 101 \(worker, state t, on GPU 0, GPU 1\)\. .* Let those in state t \(101\) continue in the debugger/);

  const pod = podShard([0]);
  const ranks = [201, 202, 203, 204, 205, 206, 207].map((pid) => stat(pid, 'T', { comm: `rank-${pid}` }));
  const many = view(snapshot([gpu(0, ranks.map((r) => [r.pid, 100]))], [stat(200, 'S', { comm: 'api-server' }), ...ranks], { cgroups: { [POD]: [200, ...ranks.map((r) => r.pid)] } }), [pod]);
  const reason = verdict(pod, many).reason!;
  t.match(reason, '201 (rank-201, state T, on GPU 0), 202 (rank-202, state T, on GPU 0), 203 (rank-203, state T, on GPU 0), 204 (rank-204, state T, on GPU 0), 205 (rank-205, state T, on GPU 0), and 2 more.');
  t.match(reason, '`kill -CONT 201 202 203 204 205 206 207`');
  const fiveRanks = ranks.slice(0, 5);
  const five = view(snapshot([gpu(0, fiveRanks.map((r) => [r.pid, 100]))], [stat(200, 'S', { comm: 'api-server' }), ...fiveRanks], { cgroups: { [POD]: [200, ...fiveRanks.map((r) => r.pid)] } }), [pod]);
  t.match(verdict(pod, five).reason, '204 (rank-204, state T, on GPU 0), 205 (rank-205, state T, on GPU 0). A stopped worker', 'five: all listed, none counted');
});

t.test('an exit beats a stop: a zombie, or the PID reused by a stopped process, is exited', async (t) => {
  const s = shard();
  t.equal(verdict(s, view(snapshot([gpu(0, [])], [stat(100, 'Z')]), [s])).state, 'exited');
  const reused = verdict(s, view(snapshot([gpu(0, [])], [stat(100, 'T', { startTime: 9 })]), [s]));
  t.equal(reused.state, 'exited');
  t.match(reused.reason, 'PID 100 now belongs to another process');
  t.equal(verdict(s, view(snapshot([gpu(0, [])], [], { absent: [100] }), [s])).state, 'exited');
});

t.test('a stop beats starting, on-cpu and unverified; what would outlast the stop stays as a warning', async (t) => {
  const s = shard({ gpus: [0, 1] });
  const holdsGpu0 = snapshot([gpu(0, [[100, 9000]]), gpu(1, [])], [stat(100, 'T')]);
  const within = verdict({ ...s, registeredAt: NOW - 1000 }, view(holdsGpu0, [s]));
  t.equal(within.state, 'stopped', 'not starting: within its grace it still answers nothing');
  t.same(within.warnings, [
    'it holds no memory on GPU 1 (the GPU driver lists none of its processes there): once it runs again, that decides its verdict (starting within its grace, on-cpu after it)',
  ]);

  const late = verdict(s, view(holdsGpu0, [s]), { engine: CPU_ENGINE, staleReason: 'the last refresh failed: boom' });
  t.equal(late.state, 'stopped', 'not on-cpu, though its grace is over with GPU 1 not held and its engine says CPU');
  t.same(late.warnings, [
    'answered from an older snapshot: the last refresh failed: boom',
    'it holds no memory on GPU 1 (the GPU driver lists none of its processes there): once it runs again, that decides its verdict (starting within its grace, on-cpu after it)',
    `the engine output posted says it computes on the CPU (${CPU_ENGINE.summary}): once it runs again, it reads on-cpu`,
  ]);
  t.equal(shardCompute(s, view(holdsGpu0, [s]), CPU_ENGINE, late.state).backend, null, 'not CPU either: it computes nowhere');

  const stray = verdict(shard({ gpus: [1] }), view(snapshot([gpu(0, [[100, 9000]]), gpu(1, [[100, 100]])], [stat(100, 'T')]), [shard({ gpus: [1] })]));
  t.same(stray.warnings, ['holds memory on GPU 0, which it was not given: check CUDA_VISIBLE_DEVICES and the placement'], 'a stray GPU is still worth knowing');

  const cpuOnly = verdict(shard({ gpus: [] }), view(snapshot([gpu(0, [])], [stat(100, 'T')]), [shard({ gpus: [] })]), { engine: CPU_ENGINE });
  t.same([cpuOnly.state, cpuOnly.warnings], ['stopped', []], 'an engine on the CPU is no news for a shard given no GPU');
});

t.test('where nvidia-smi cannot show what a stopped shard holds, no "holds no memory" warning', async (t) => {
  const s = shard({ gpus: [0, 1] });
  // Processes hidden from nvidia-smi: GPUs busy, none listed.
  const hidden = view(snapshot([gpu(0, [], 130_000), gpu(1, [], 130_000)], [stat(100, 'T')]), [s]);
  t.ok(hidden.processesHidden);
  t.same([verdict(s, hidden).state, verdict(s, hidden).warnings], ['stopped', []], 'stopped all the same: /proc says so');
  // GPU 1 holds memory of a process whose stat could not be read: it may be this shard's.
  const unreadable: StatAnswer = { pid: 200, unreadable: 'reading it failed (EIO)', advice: 'see the log' };
  const uncertain = view(snapshot([gpu(0, []), gpu(1, [[200, 500]])], [stat(100, 'T'), unreadable]), [s]);
  t.ok(uncertain.attribution.uncertain.has(1));
  t.same(verdict(s, uncertain).warnings, [
    'it holds no memory on GPU 0 (the GPU driver lists none of its processes there): once it runs again, that decides its verdict (starting within its grace, on-cpu after it)',
  ]);
});

t.test('nvidia-smi failing: /proc still says stopped, with or without an engine saying CPU', async (t) => {
  const s = shard();
  const { liveness } = procOnlyLiveness({ ...snapshot([], [stat(100, 'T')]), startedAt: NOW - 10 }, [s]);
  t.equal(liveness.get('s')?.state, 'stopped', 'the failed refresh\'s /proc facts make it stopped');
  const v = verdict(s, null, { liveness: liveness.get('s') });
  t.same(v, {
    ready: false,
    state: 'stopped',
    cause: 'process-stopped',
    reason: v.reason,
    warnings: ['the GPU driver cannot be asked, so which GPU memory it holds is unverified: nvidia-smi timed out'],
  });
  t.match(v.reason, /^process 100 \(llama-server\) is stopped \(state T: /);
  const cpu = verdict(s, null, { liveness: liveness.get('s'), engine: CPU_ENGINE });
  t.equal(cpu.state, 'stopped', 'not on-cpu: it answers nothing at all');
  t.match(cpu.warnings, [/^the GPU driver cannot be asked/, /^the engine output posted says it computes on the CPU/]);
});

t.test('a cgroup shard is stopped when every member but the sandbox and zombies is; one running member keeps it alive', async (t) => {
  const pod = podShard();
  const members = [stat(10, 'S', { comm: 'pause', startTime: 1 }), stat(20, 'T', { startTime: 3 }), stat(21, 't', { comm: 'python3', startTime: 4 }), stat(22, 'Z', { comm: 'sh' })];
  const stopped = view(snapshot([gpu(0, [[20, 9000]])], members, { cgroups: { [POD]: [10, 20, 21, 22] } }), [pod]);
  const v = verdict(pod, stopped);
  t.equal(v.state, 'stopped');
  t.match(v.reason, `every process of cgroup "${POD}" that has not exited, the pod's sandbox aside, is stopped: 20 (llama-server, state T), 21 (python3, state t). State T: `);
  for (const fact of [SIGNALLED, /; state t: a debugger such as gdb/, KEEPS, 'Resume those in state T with `kill -CONT 20` on the node (host PIDs); ', BY_ITSELF]) t.match(v.reason, fact);
  t.match(v.reason, 'let those in state t (21) continue in the debugger, or detach it (gdb: `detach`): `kill -CONT` does not resume a traced process.');
  t.equal(stopped.attribution.ownerByPid.get(20), 'pod', 'its memory stays its own');

  const oneRuns = [...members, stat(23, 'R', { comm: 'worker', startTime: 6 })];
  // The running worker holds the memory (were it a stopped one, the shard would be stopped: see above).
  const alive = view(snapshot([gpu(0, [[23, 9000]])], oneRuns, { cgroups: { [POD]: [10, 20, 21, 22, 23] } }), [pod]);
  t.same(alive.attribution.liveness.get('pod'), { state: 'alive', oldestStart: 3 }, 'a stopped member is of the current run: the oldest start counts it');
  t.equal(verdict(pod, alive).state, 'ready');
  const holderStopped = view(snapshot([gpu(0, [[20, 9000]])], oneRuns, { cgroups: { [POD]: [10, 20, 21, 22, 23] } }), [pod]);
  t.match(verdict(pod, holderStopped).reason, /^a process holding its GPU memory is stopped while the rest runs: 20 \(llama-server, state T, on GPU 0\)/, 'one running member, but the GPU holder stopped: stopped');

  const unreadable: StatAnswer = { pid: 24, unreadable: 'reading it failed (EIO)', advice: 'see the log' };
  const unsure = view(snapshot([gpu(0, [[20, 9000]])], [...members, unreadable], { cgroups: { [POD]: [10, 20, 21, 22, 24] } }), [pod]);
  t.equal(verdict(pod, unsure).state, 'unverified', 'a member whose stat could not be read may be running: no evidence either way');

  const sandboxStopped = view(snapshot([gpu(0, [])], [stat(10, 'T', { comm: 'pause' })], { cgroups: { [POD]: [10] } }), [pod]);
  t.equal(verdict(pod, sandboxStopped).state, 'exited', 'a stopped sandbox alone is no engine: exited');
});

t.test('a pod of many stopped processes: five named, the rest counted, every one in the command', async (t) => {
  const pod = podShard();
  const pids = [31, 32, 33, 34, 35, 36, 37];
  const node = view(snapshot([gpu(0, [[31, 9000]])], pids.map((pid) => stat(pid, 'T', { comm: `w${pid}` })), { cgroups: { [POD]: pids } }), [pod]);
  const v = verdict(pod, node);
  t.match(v.reason, 'is stopped: 31 (w31, state T), 32 (w32, state T), 33 (w33, state T), 34 (w34, state T), 35 (w35, state T), and 2 more. State T:');
  t.match(v.reason, 'Resume those in state T with `kill -CONT 31 32 33 34 35 36 37` on the node');
  t.notMatch(v.reason, 'state t', 'no tracer advice where nothing is traced');
});

t.test('attribution alone: a stopped shard claims what a live one does, and a gone one still claims nothing', async (t) => {
  const stoppedShard = shard({ id: 'a' });
  const goneShard = shard({ id: 'b', pid: 200, identity: { pid: 200, pgid: 200, startTime: 5, name: 'llama-server' } });
  const snap = snapshot([gpu(0, [[100, 9000], [201, 400]])], [stat(100, 'T'), stat(201, 'S', { pgrp: 200, session: 200 })], { absent: [200] });
  const { ownerByPid, liveness } = attribute(snap, [stoppedShard, goneShard]);
  t.equal(liveness.get('a')?.state, 'stopped');
  t.equal(liveness.get('b')?.state, 'gone');
  t.same([...ownerByPid], [[100, 'a']], 'the orphan of the gone shard stays foreign; the stopped shard keeps its own');
});
