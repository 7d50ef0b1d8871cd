// The readiness verdict and compute over hand-made node views: the branches a live node rarely
// shows on demand (several missing GPUs, partial offload, a snapshot
// older than the registration, hidden PIDs, zombies).
import t from 'tap';
import { foreignMemory } from '../../src/node-state/foreign-memory.js';
import type { GpuState, NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { createNodeView, type NodeView } from '../../src/node-state/node-view.js';
import { shardCompute } from '../../src/shards/compute.js';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import { parseLlamaLog } from '../../src/shards/llama-log.js';
import { readiness } from '../../src/shards/readiness.js';
import type { Liveness } from '../../src/node-state/attribution.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcStat, StatAnswer, UnreadableStat } from '../../src/system/procfs.js';
import { readSample } from '../helpers/samples.js';

const NOW = 1_000_000;

function stat(pid: number, pgrp: number, startTime: number, state = 'S'): ProcStat {
  return { pid, comm: `p${pid}`, state, ppid: 1, pgrp, session: pgrp, startTime, cpuTicks: 0 };
}

function view(gpus: GpuState[], stats: ProcStat[], shards: ShardRecord[], extra: Array<[number, StatAnswer]> = []): NodeView {
  const snapshot: NodeSnapshot = {
    takenAt: NOW,
    gpus,
    proc: new Map<number, StatAnswer>([...stats.map((s): [number, StatAnswer] => [s.pid, s]), ...extra]),
    cgroupPids: new Map(),
    bootId: null,
    unmatchedProcesses: [],
    lostGpus: [],
    cpuCores: new Map(),
    modelFiles: new Map(),
    timings: { driverMs: 1, procMs: 1 },
  };
  return createNodeView(snapshot, shards, 1);
}

function shard(overrides: Partial<ShardRecord> = {}): ShardRecord {
  return {
    id: 's',
    pid: 100,
    cgroup: null,
    gpus: [0, 1, 2],
    engine: 'llama.cpp',
    graceMs: 10_000,
    registeredAt: NOW - 60_000,
    identity: { pid: 100, pgid: 100, startTime: 5, name: 'llama-server' },
    ...overrides,
  };
}

const verdictOf = (s: ShardRecord, node: NodeView | null, engine: EngineAccount | null = null, staleReason: string | null = null) =>
  readiness({ shard: s, node, engine, staleReason, now: NOW, unavailable: 'nvidia-smi timed out' });

t.test('several missing GPUs are listed in prose', async (t) => {
  const s = shard({ gpus: [0, 1, 3], engine: 'vllm' });
  const v = verdictOf(s, view([gpu(0, [[101, 500]]), gpu(1, []), gpu(3, [])], [stat(100, 100, 5), stat(101, 100, 6)], [s]));
  t.equal(v.state, 'on-cpu');
  t.match(v.reason, 'placed on GPU 0, GPU 1 and GPU 3 but computing on the CPU: its processes hold no memory on GPU 1 and GPU 3, 60.0 s after registration');
  t.notMatch(v.reason, 'engine-output', 'an engine other than llama.cpp gets no llama.cpp advice');
});

t.test('a partial offload and an old snapshot are warnings on a ready shard', async (t) => {
  const s = shard({ gpus: [0] });
  const engine: EngineAccount = { backend: 'CUDA', devices: ['CUDA0'], layersOffloaded: 20, layersTotal: 33, gpuBackendLoaded: true, evidence: 'x', summary: 'llama.cpp put ...' };
  const v = verdictOf(s, view([gpu(0, [[100, null]])], [stat(100, 100, 5)], [s]), engine, 'the last refresh failed: boom');
  t.equal(v.state, 'ready', 'a process listed with [N/A] memory still holds the GPU');
  t.same(v.warnings, [
    'answered from an older snapshot: the last refresh failed: boom',
    'the engine offloaded only 20 of 33 layers to the GPU; the rest runs on the CPU',
  ]);
});

t.test('a snapshot older than the registration: starting within grace, unverified after', async (t) => {
  const s = shard({ gpus: [0], registeredAt: NOW - 2000 });
  const node = view([gpu(0, [])], [], [s]);
  const starting = verdictOf(s, node);
  t.equal(starting.state, 'starting');
  t.match(starting.reason, 'waiting for the first snapshot that includes it (8.0 s of grace left)');
  const late = verdictOf({ ...s, registeredAt: NOW - 20_000 }, node);
  t.equal(late.state, 'unverified');
  t.equal(late.ready, true);
  t.match(late.warnings, [/no snapshot taken since this shard was registered includes it yet/]);
});

t.test('nvidia-smi PIDs invisible in this /proc: unverified, not on-cpu', async (t) => {
  const s = shard({ gpus: [0] });
  const node = view([gpu(0, [[90_000, 500]])], [stat(100, 100, 5)], [s], [[90_000, null]]);
  t.match(node.processesHidden, /whose PIDs do not exist in this \/proc/);
  const v = verdictOf(s, node);
  t.equal(v.state, 'unverified');
  t.match(v.warnings, [/does not share the host's PID namespace/]);
});

t.test('no GPU process listed anywhere: hidden when a GPU holds a model-sized amount, idle otherwise', async (t) => {
  const s = shard({ gpus: [0] });
  // Real idle GPUs show 0 to 4 MiB, just-released ones up to 292 MiB (samples): nothing hidden.
  t.equal(view([gpu(0, [], 292), gpu(1, [], 1023), gpu(2, [], null)], [stat(100, 100, 5)], [s]).processesHidden, null);
  t.equal(verdictOf(s, view([gpu(0, [], 4)], [stat(100, 100, 5)], [s])).state, 'on-cpu', 'an idle GPU with no process: the shard is not on it');
  // A header-only process query while GPUs hold 130 GiB (HAMi, or no host PID namespace).
  const hidden = view([gpu(0, [], 130013), gpu(1, [], 2), gpu(2, [], 58071)], [stat(100, 100, 5)], [s]);
  t.match(hidden.processesHidden, /^the GPU driver lists no GPU process, yet GPU 0, GPU 2 have memory in use: the processes are hidden from it\. /);
  t.match(hidden.processesHidden, /does not share the host's PID namespace \(--pid=host \/ hostPID: true\) or a GPU-sharing layer \(HAMi, vGPU\)/);
  const v = verdictOf(s, hidden);
  t.equal(v.state, 'unverified', 'not on-cpu: there is no evidence either way');
  t.equal(v.ready, true);
  t.match(v.warnings, [/the GPU driver lists no GPU process, yet GPU 0, GPU 2 have memory in use/]);
  t.match(view([gpu(3, [], 1024)], [], [s]).processesHidden, /yet GPU 3 has memory in use/);
});

t.test('a zombie shard process has exited and claims no memory', async (t) => {
  const s = shard({ gpus: [0] });
  const node = view([gpu(0, [[100, 500]])], [stat(100, 100, 5, 'Z')], [s]);
  const v = verdictOf(s, node);
  t.equal(v.state, 'exited');
  t.match(v.reason, 'has exited (a zombie its parent has not reaped yet)');
  t.equal(node.attribution.ownerByPid.get(100), undefined);
});

t.test('without a node view the shard is unverified with the reason', async (t) => {
  const v = verdictOf(shard(), null);
  t.same(v, { ready: true, state: 'unverified', cause: 'nvidia-smi-unavailable', reason: null, warnings: ['the GPU driver cannot be asked, so where this shard computes is unverified and it keeps serving: nvidia-smi timed out'] });
  const bare = readiness({ shard: shard(), node: null, engine: null, staleReason: null, now: NOW });
  t.match(bare.warnings, [/unknown reason/]);
});

t.test('a shard the view does not know yet (registered since), and a cgroup shard before its first scan', async (t) => {
  const s = shard({ gpus: [0], registeredAt: NOW - 1000 });
  t.equal(verdictOf(s, view([gpu(0, [])], [], [])).state, 'starting', 'absent from the attribution: no evidence yet');
  const pod = shard({ id: 'pod', pid: null, cgroup: 'pod-uid-1234', gpus: [0], registeredAt: NOW - 1000 });
  const node = view([gpu(0, [[100, 10]])], [stat(100, 100, 5)], [pod]);
  t.equal(node.attribution.liveness.get('pod')?.state, 'unknown', 'no scan for its cgroup in this snapshot');
  t.equal(node.attribution.ownerByPid.get(100), undefined, 'and it claims nothing');
  t.equal(verdictOf(pod, node).state, 'starting');
});

t.test('memory of a shard process nvidia-smi reports as [N/A] holds the GPU, and how much is not known anywhere', async (t) => {
  const s = shard({ gpus: [0, 1] });
  // Process 101 is the shard's child with 400 MiB on GPU 0, beside the shard's own [N/A]; 200 is foreign.
  const node = view(
    [gpu(0, [[100, null], [101, 400], [200, 300]], 5000), gpu(1, [[101, 700]], 2000)],
    [stat(100, 100, 5), { ...stat(101, 100, 6), ppid: 100 }, stat(200, 200, 9)],
    [s],
  );
  t.equal(verdictOf(s, node).state, 'ready', 'listed on both GPUs it was given');
  const [gpu0, gpu1] = foreignMemory(node);
  t.same(
    { shardMiB: gpu0!.shardMiB, unreportedShardProcesses: gpu0!.unreportedShardProcesses, foreignMiB: gpu0!.foreignMiB },
    { shardMiB: 400, unreportedShardProcesses: 1, foreignMiB: 4600 },
    'the known share only: foreign is an upper bound, and the count says so',
  );
  t.same({ shardMiB: gpu1!.shardMiB, unreportedShardProcesses: gpu1!.unreportedShardProcesses, foreignMiB: gpu1!.foreignMiB }, { shardMiB: 700, unreportedShardProcesses: 0, foreignMiB: 1300 });
  t.equal(foreignMemory(node), foreignMemory(node), 'computed once per view');
  // The two queries run at once: a process that grew in between can hold more than memory.used said.
  const grew = view([gpu(0, [[100, 1500]], 1000)], [stat(100, 100, 5)], [s]);
  t.match(foreignMemory(grew)[0], { usedMiB: 1000, shardMiB: 1500, foreignMiB: 0 }, 'foreign memory is never below zero');
  const compute = shardCompute(s, node, null, 'ready');
  t.same(compute.gpus, [{ index: 0, usedMiB: null, smUtilPct: null, xidErrors: null, utilizationPct: null, migDevices: null }, { index: 1, usedMiB: 700, smUtilPct: null, xidErrors: null, utilizationPct: null, migDevices: null }], 'a sum with an unknown part is unknown, not the known part');
  t.same(compute.devices, ['GPU 0: memory not reported', 'GPU 1: 700 MiB']);
  t.equal(compute.backend, 'CUDA');
});

t.test('a foreign process whose memory nvidia-smi reports as [N/A] is still foreign, with its memory not known', async (t) => {
  const s = shard({ gpus: [0] });
  const node = view([gpu(0, [[100, 500], [300, null]], 2000)], [stat(100, 100, 5), stat(300, 300, 9)], [s]);
  t.same(foreignMemory(node)[0], {
    index: 0,
    uuid: 'GPU-0',
    usedMiB: 2000,
    shardMiB: 500,
    unreportedShardProcesses: 0,
    foreignMiB: 1500,
    foreignProcesses: [{ pid: 300, name: 'p', usedMiB: null }],
    migDevices: null,
  });
});

t.test('compute: memory on a GPU the shard was not given is stray, never one of its devices', async (t) => {
  const s = shard({ gpus: [0] });
  // The shard's process on GPU 0 and GPU 1, its child on GPU 2 with [N/A] memory.
  const node = view(
    [gpu(0, [[100, 4000]]), gpu(1, [[100, 100]]), gpu(2, [[101, null]])],
    [stat(100, 100, 5), { ...stat(101, 100, 6), ppid: 100 }],
    [s],
  );
  const v = verdictOf(s, node);
  t.equal(v.state, 'ready');
  const { weights, ...compute } = shardCompute(s, node, null, v.state);
  t.equal(weights.offload, 'not-seen', 'no model file in view');
  t.same(compute, {
    backend: 'CUDA',
    devices: ['GPU 0: 3.9 GiB'],
    gpus: [{ index: 0, usedMiB: 4000, smUtilPct: null, xidErrors: null, utilizationPct: null, migDevices: null }],
    strayGpus: [
      { index: 1, usedMiB: 100, smUtilPct: null, xidErrors: null, utilizationPct: null, migDevices: null },
      { index: 2, usedMiB: null, smUtilPct: null, xidErrors: null, utilizationPct: null, migDevices: null },
    ],
    cpuCores: null,
    engine: null,
  });
});

t.test('compute: a shard absent from the attribution holds nothing, and its backend is not known', async (t) => {
  const s = shard({ gpus: [0] });
  const node = view([gpu(0, [])], [stat(100, 100, 5)], []);
  const { weights, ...compute } = shardCompute(s, node, null, 'starting');
  t.same(compute, { backend: null, devices: [], gpus: [], strayGpus: [], cpuCores: null, engine: null });
  t.equal(weights.offload, 'not-seen');
});

t.test('compute: the backend says CUDA when a GPU is held, CPU only on the evidence of a verdict, else null', async (t) => {
  const cpu: EngineAccount = { backend: 'CPU', devices: [], layersOffloaded: 0, layersTotal: 33, gpuBackendLoaded: false, evidence: 'x', summary: 'llama.cpp lists only the CPU' };
  const cuda: EngineAccount = { ...cpu, backend: 'CUDA', devices: ['CUDA0'], summary: 'llama.cpp put its weights on CUDA0' };
  const placed = shard({ gpus: [0] });
  const none = shard({ gpus: [] });
  const holding = view([gpu(0, [[100, 4000]])], [stat(100, 100, 5)], [placed]);
  const idle = view([gpu(0, [])], [stat(100, 100, 5)], [placed, none]);
  const gone = view([gpu(0, [])], [], [placed], [[100, null]]);
  const cases: Array<[name: string, s: ShardRecord, node: NodeView, engine: EngineAccount | null, backend: 'CUDA' | 'CPU' | null]> = [
    ['holds its GPU', placed, holding, null, 'CUDA'],
    ['holds memory on its GPU (a CUDA context) while its engine says CPU: on-cpu, as the verdict says', placed, holding, cpu, 'CPU'],
    ['grace over, holding nothing', placed, idle, null, 'CPU'],
    ['grace over, holding memory only on a GPU it was not given: CUDA there, though on-cpu', placed, view([gpu(0, []), gpu(1, [[100, 500]])], [stat(100, 100, 5)], [placed]), null, 'CUDA'],
    ['the engine says CPU, within grace', { ...placed, registeredAt: NOW - 1000 }, idle, cpu, 'CPU'],
    ['starting: not known yet', { ...placed, registeredAt: NOW - 1000 }, idle, null, null],
    ['freshly registered, before any snapshot includes it', { ...placed, registeredAt: NOW - 1000 }, view([gpu(0, [])], [], []), null, null],
    ['exited: not running', placed, gone, null, null],
    ['exited, although its output said CPU', placed, gone, cpu, null],
    ['given no GPU, exited: not running, not a CPU shard', none, view([gpu(0, [])], [], [none], [[100, null]]), null, null],
    ['given no GPU, alive, holding none: a CPU shard', none, idle, null, 'CPU'],
    ['given no GPU, and its engine says CPU', none, idle, cpu, 'CPU'],
    ['given no GPU, holding none, yet its engine says CUDA', none, idle, cuda, null],
  ];
  for (const [name, s, node, engine, backend] of cases) {
    const verdict = verdictOf(s, node, engine);
    t.equal(shardCompute(s, node, engine, verdict.state).backend, backend, `${name} (${verdict.state})`);
  }
  t.same(verdictOf(none, idle, cpu), { ready: true, state: 'ready', cause: null, reason: null, warnings: [] }, 'given no GPU, computing on the CPU as its engine says: ready, not on-cpu');
  const hidden = view([gpu(0, [[90_000, 500]])], [stat(100, 100, 5)], [placed], [[90_000, null]]);
  t.equal(verdictOf(placed, hidden).state, 'unverified');
  t.equal(shardCompute(placed, hidden, null, 'unverified').backend, null, 'unverified: no evidence either way');
});

t.test('two shards started by one script share its process group: each engine child goes to the shard it descends from', async (t) => {
  // sh -c 'vllm serve A & vllm serve B & wait', no job control: A (100) and B (101) are in the
  // script's group 99, and each one's GPU memory sits in its own EngineCore child (102, 103).
  const a = shard({ id: 'a', pid: 100, gpus: [0], engine: 'vllm', identity: { pid: 100, pgid: 99, startTime: 5, name: 'vllm' } });
  const b = shard({ id: 'b', pid: 101, gpus: [1], engine: 'vllm', identity: { pid: 101, pgid: 99, startTime: 6, name: 'vllm' } });
  const child = (pid: number, ppid: number, startTime: number): ProcStat => ({ ...stat(pid, 99, startTime), ppid });
  const scripted = [child(100, 99, 5), child(101, 99, 6), child(102, 100, 7), child(103, 101, 8)];
  const node = view([gpu(0, [[102, 70_000]]), gpu(1, [[103, 70_000]])], scripted, [b, a]);
  t.same([...node.attribution.ownerByPid].sort(), [[102, 'a'], [103, 'b']]);
  t.same(verdictOf(a, node), { ready: true, state: 'ready', cause: null, reason: null, warnings: [] }, 'a holds GPU 0 and no stray GPU');
  t.same(verdictOf(b, node), { ready: true, state: 'ready', cause: null, reason: null, warnings: [] }, 'b holds GPU 1, not on-cpu');

  // A process of the group that descends from neither (a helper the script started, or an orphan):
  // either shard could own it, so neither does, and its memory reads as foreign.
  const stranger = view([gpu(0, [[102, 70_000], [104, 900]]), gpu(1, [[103, 70_000]])], [...scripted, child(104, 99, 9)], [a, b]);
  t.equal(stranger.attribution.ownerByPid.get(104), undefined, 'an ambiguous group gives it to nobody');
  t.same(foreignMemory(stranger)[0]!.foreignProcesses.map((p) => p.pid), [104], 'its memory is foreign: still counted as used');
  t.equal(verdictOf(a, stranger).state, 'ready');

  // With one shard in the group, its group still claims a process that is not its descendant.
  const alone = view([gpu(0, [[102, 70_000], [104, 900]])], [child(100, 99, 5), child(102, 100, 7), child(104, 99, 9)], [a]);
  t.equal(alone.attribution.ownerByPid.get(104), 'a', 'an unambiguous group: the group rule applies');
});

t.test('a shard whose own stat cannot be read this refresh keeps serving, unverified, and says what to do', async (t) => {
  const s = shard({ gpus: [0, 1] });
  const unreadable: UnreadableStat = {
    pid: 100,
    unreadable: 'nodecompute is out of file descriptors (EMFILE)',
    advice: "Raise the container's open-file limit (nofile, for example 65536).",
  };
  const node = view([gpu(0, [[100, 500]]), gpu(1, [[101, 500]])], [stat(101, 100, 6)], [s], [[100, unreadable]]);
  const why = (node.attribution.liveness.get('s') as { why: string }).why;
  t.match(node.attribution.liveness.get('s'), { state: 'unreadable', why: /^the \/proc stat of its process 100 could not be read in this refresh: .*\(EMFILE\)\. / });
  t.match(why, /unverified, so it keeps serving\. Raise the container's open-file limit \(nofile, for example 65536\)\.$/);
  const v = verdictOf(s, node, null, 'the last refresh failed: boom');
  t.same(v, { ready: true, state: 'unverified', cause: 'stat-unreadable', reason: null, warnings: ['answered from an older snapshot: the last refresh failed: boom', why] }, 'not exited: no evidence that it is gone');
  t.same([...node.attribution.ownerByPid].sort(), [[100, 's'], [101, 's']], 'it keeps its PID and its registered group');
  t.equal(node.processesHidden, null, 'an unreadable stat is not a PID of another namespace');
});

t.test('an exited shard names no orphans from a group number reused since, nor older members of a shared group', async (t) => {
  const s = shard({ gpus: [0] });
  // PID 100 (the shard, started at tick 5, leader of group 100) exited; the number went to a new
  // process (tick 50) that leads a new group 100 with a GPU child of its own.
  const reused = view([gpu(0, [[101, 9000]])], [stat(100, 100, 50), stat(101, 100, 51)], [s]);
  t.equal(verdictOf(s, reused).reason, "the shard's process exited: PID 100 now belongs to another process (p100, started at tick 50, not 5): the registered process exited and its PID was reused.");
  // The shard was started by a script (tick 2) in group 90; the script's own GPU process is older than the shard.
  const scripted = shard({ gpus: [0], identity: { pid: 100, pgid: 90, startTime: 5, name: 'x' } });
  const older = view([gpu(0, [[91, 700], [101, 800]])], [stat(91, 90, 3), stat(101, 90, 6)], [scripted], [[100, null]]);
  const reason = verdictOf(scripted, older).reason!;
  t.match(reason, 'still holds GPU memory: 800 MiB on GPU 0 (PID 101, p). ');
  t.notMatch(reason, 'PID 91', 'the older member is not an orphan of the shard');
});

t.test('a GPU process whose own stat, or an ancestor\'s, cannot be read: the shard missing that GPU is unverified, not on-cpu', async (t) => {
  const s = shard({ gpus: [0, 1] });
  const emfile = (pid: number): UnreadableStat => ({ pid, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: 'Raise nofile.' });
  // GPU 0: the engine child 101's own stat is unreadable. GPU 1: 103's parent 102 (a wrapper in
  // another group) is unreadable, so the walk up to the shard stops there.
  const node = view(
    [gpu(0, [[101, 500]]), gpu(1, [[103, 500]]), gpu(2, [[300, 1]])],
    [stat(100, 100, 5), { ...stat(103, 103, 8), ppid: 102 }, stat(300, 300, 9)],
    [s],
    [[101, emfile(101)], [102, emfile(102)]],
  );
  t.same([...node.attribution.uncertain.keys()], [0, 1], 'GPU 2 holds a readable foreign process: not uncertain');
  const v = verdictOf(s, node);
  t.equal(v.state, 'unverified');
  t.equal(v.ready, true, 'it keeps serving');
  t.same(v.warnings, [
    'GPU 0 holds memory of a process whose owner is unknown: the /proc stat of process 101 on its way to a shard could not be read in this refresh (nodecompute is out of file descriptors (EMFILE)), so it may be this shard\'s. Raise nofile.',
    'GPU 1 holds memory of a process whose owner is unknown: the /proc stat of process 102 on its way to a shard could not be read in this refresh (nodecompute is out of file descriptors (EMFILE)), so it may be this shard\'s. Raise nofile.',
  ]);
  const other = shard({ id: 'o', pid: 400, gpus: [2], identity: { pid: 400, pgid: 400, startTime: 5, name: 'x' } });
  const alone = view([gpu(0, [[101, 500]]), gpu(2, [])], [stat(400, 400, 5)], [other], [[101, emfile(101)]]);
  t.equal(verdictOf(other, alone).state, 'on-cpu', 'an unreadable process on another GPU is no excuse');
  // GPU 3: 500's parents 501, 502 and 503 are readable, and 503's parent is 504, a GPU process on GPU
  // 2 whose own stat is unreadable. Ancestry stops at 504's PID (503's ppid): its stat cannot change
  // whose 500 is, so GPU 3 is not uncertain.
  const chain = [500, 501, 502, 503].map((pid) => ({ ...stat(pid, pid, 8), ppid: pid + 1 }));
  const deep = shard({ id: 'd', pid: 600, gpus: [3], identity: { pid: 600, pgid: 600, startTime: 5, name: 'x' } });
  const far = view([gpu(2, [[504, 1]]), gpu(3, [[500, 500]])], [stat(600, 600, 5), ...chain], [deep], [[504, emfile(504)]]);
  t.same([...far.attribution.uncertain.keys()], [2], 'only the GPU of the process whose own stat is unreadable');
  t.equal(verdictOf(deep, far).state, 'on-cpu', 'an unreadable stat beyond the ancestry the rules read is no excuse');
});

t.test('a group leader that exits while its child holds the GPU: exited, naming the memory its group still holds', async (t) => {
  const s = shard({ gpus: [0] });
  const orphan: ProcStat = { ...stat(101, 100, 6), comm: 'llama-worker' };
  const node = view([gpu(0, [[101, 9000]]), gpu(1, [[102, null], [200, 300]])], [orphan, stat(102, 100, 7), stat(200, 200, 9)], [s], [[100, null]]);
  const v = verdictOf(s, node);
  t.equal(v.state, 'exited', 'the registered process is gone');
  t.match(
    v.reason,
    "the shard's process exited: process 100 no longer exists, but its process group 100 still holds GPU memory: 9000 MiB on GPU 0 (PID 101, p), " +
      'memory the GPU driver does not report ([N/A]) on GPU 1 (PID 102, p). ',
  );
  t.match(v.reason, /reads as foreign .*if the shard is not coming back, kill 101 102\.$/);
  t.same(foreignMemory(node)[0]!.foreignProcesses.map((p) => p.pid), [101], 'the orphan is nobody\'s');

  const many = view(
    [gpu(0, Array.from({ length: 7 }, (_, i): [number, number] => [110 + i, 10]))],
    Array.from({ length: 7 }, (_, i) => stat(110 + i, 100, 20 + i)),
    [s],
    [[100, null]],
  );
  t.match(verdictOf(s, many).reason, /\(PID 114, p\), and 2 more\. .*kill 110 111 112 113 114 115 116\.$/, 'five listed, the rest counted, every PID to kill');
  const five = view(
    [gpu(0, Array.from({ length: 5 }, (_, i): [number, number] => [110 + i, 10]))],
    Array.from({ length: 5 }, (_, i) => stat(110 + i, 100, 20 + i)),
    [s],
    [[100, null]],
  );
  t.match(verdictOf(s, five).reason, /\(PID 114, p\)\. That memory .*kill 110 111 112 113 114\.$/, 'five: all listed, none counted');

  const zombie = view([gpu(0, [[100, 500], [101, 400]])], [stat(100, 100, 5, 'Z'), stat(101, 100, 6)], [s]);
  t.match(verdictOf(s, zombie).reason, /a zombie its parent has not reaped yet\), but its process group 100 still holds GPU memory: 400 MiB on GPU 0 \(PID 101, p\)\..*kill 101\.$/, 'the zombie itself is not an orphan to kill');
  t.notMatch(verdictOf(s, view([gpu(0, [[200, 300]])], [stat(200, 200, 9)], [s], [[100, null]])).reason, /still holds/, 'no GPU process of its group: nothing to add');
});

t.test('a shard that exits in a group shared with another: its orphan goes to neither, and its reason names it', async (t) => {
  const a = shard({ id: 'a', pid: 100, gpus: [0], identity: { pid: 100, pgid: 99, startTime: 5, name: 'vllm' } });
  const b = shard({ id: 'b', pid: 101, gpus: [1], identity: { pid: 101, pgid: 99, startTime: 6, name: 'vllm' } });
  // a (100) is gone; its EngineCore 102 was re-parented to PID 1 and is still in the script's group 99.
  const stats = [{ ...stat(101, 99, 6), ppid: 99 }, { ...stat(102, 99, 7), ppid: 1 }, { ...stat(103, 99, 8), ppid: 101 }];
  const node = view([gpu(0, [[102, 70_000]]), gpu(1, [[103, 70_000]])], stats, [a, b], [[100, null]]);
  t.same([...node.attribution.ownerByPid], [[103, 'b']], 'b keeps its own child and is not handed a');
  t.same(verdictOf(b, node).warnings, [], 'so b has no stray GPU');
  t.match(verdictOf(a, node).reason, /process 100 no longer exists, but its process group 99 still holds GPU memory: 70000 MiB on GPU 0 \(PID 102, p\)\..*kill 102\.$/);
});

/** A view with cgroup members: `members` maps each cgroup to its PIDs (their stats among `stats`/`extra`). */
function podView(gpus: GpuState[], stats: ProcStat[], shards: ShardRecord[], members: Record<string, number[]>, extra: Array<[number, StatAnswer]> = []): NodeView {
  const snapshot: NodeSnapshot = {
    takenAt: NOW,
    gpus,
    proc: new Map<number, StatAnswer>([...stats.map((s): [number, StatAnswer] => [s.pid, s]), ...extra]),
    cgroupPids: new Map(Object.entries(members).map(([cgroup, pids]) => [cgroup, new Set(pids)])),
    bootId: null,
    unmatchedProcesses: [],
    lostGpus: [],
    cpuCores: new Map(),
    modelFiles: new Map(),
    timings: { driverMs: 1, procMs: 1 },
  };
  return createNodeView(snapshot, shards, 1);
}

const POD_UID = '7d5b1f2c-1111-4c3e-9e0a-3f7c2b9d8e11';
const named = (comm: string, pid: number, startTime: number, state = 'S'): ProcStat => ({ ...stat(pid, pid, startTime, state), comm });

t.test('a pod cgroup left with only its sandbox: exited, not on-cpu, saying what to look at', async (t) => {
  const pod = shard({ id: 'pod', pid: null, cgroup: POD_UID, gpus: [0], identity: { pid: 10, pgid: 10, startTime: 5, name: 'pause' } });
  const pause = named('pause', 10, 5);
  // The engine container crash-loops: between two starts only the sandbox is in the pod's cgroup.
  const node = podView([gpu(0, [])], [pause], [pod], { [POD_UID]: [10] });
  const v = verdictOf(pod, node);
  t.equal(v.state, 'exited');
  t.equal(v.ready, false);
  t.match(v.reason, `the shard's process exited: only the pod's sandbox process is left in cgroup "${POD_UID}" (pause, PID 10): the engine's container exited`);
  t.match(v.reason, /CrashLoopBackOff.*`kubectl describe pod`.*`kubectl logs --previous`.*changes by itself/);
  t.same(v.warnings, []);

  // CRI-O (OpenShift: conmon_cgroup = "pod") leaves the sandbox's monitor too, and the dead engine may linger as a zombie.
  const crio = podView([gpu(0, [])], [pause, named('conmon', 9, 4), named('llama-server', 11, 6, 'Z')], [pod], { [POD_UID]: [9, 10, 11] });
  t.equal(verdictOf(pod, crio).state, 'exited');
  t.match(verdictOf(pod, crio).reason, `only the pod's sandbox processes are left in cgroup "${POD_UID}" (conmon, PID 9; pause, PID 10): `);

  // The engine back (or still there): alive as before, and the sandbox is not what holds the GPU.
  const back = podView([gpu(0, [[12, 4000]])], [pause, named('llama-server', 12, 700)], [pod], { [POD_UID]: [10, 12] });
  t.same(back.attribution.liveness.get('pod'), { state: 'alive', oldestStart: 700 }, 'its run started at tick 700: the sandbox (tick 5) does not count');
  t.equal(verdictOf(pod, back).state, 'ready');
});

t.test('a cgroup whose processes are zombies, gone or unreadable', async (t) => {
  const pod = shard({ id: 'pod', pid: null, cgroup: POD_UID, gpus: [0] });
  const zombie = podView([gpu(0, [])], [named('llama-server', 11, 6, 'Z')], [pod], { [POD_UID]: [11] });
  t.equal(verdictOf(pod, zombie).reason, `the shard's process exited: no process is left running in cgroup "${POD_UID}": its last process 11 has exited (a zombie not reaped yet).`);
  const zombies = podView([gpu(0, [])], [named('a', 11, 6, 'Z'), named('b', 12, 6, 'X')], [pod], { [POD_UID]: [11, 12] });
  t.match(verdictOf(pod, zombies).reason, 'its last processes 11 12 have exited (zombies not reaped yet)');
  const vanished = podView([gpu(0, [])], [], [pod], { [POD_UID]: [11] }, [[11, null]]);
  t.equal(verdictOf(pod, vanished).reason, `the shard's process exited: no process is left in cgroup "${POD_UID}".`, 'gone between the scan and the read');

  const emfile: UnreadableStat = { pid: 11, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: 'Raise nofile.' };
  const unreadable = podView([gpu(0, [])], [named('pause', 10, 5)], [pod], { [POD_UID]: [10, 11] }, [[11, emfile]]);
  const v = verdictOf(pod, unreadable);
  t.same([v.state, v.ready], ['unverified', true], 'the unreadable one may be the engine: no evidence either way');
  t.match(v.warnings, [/the \/proc stat of its process 11 could not be read in this refresh/]);
  const withEngine = podView([gpu(0, [[12, 10]])], [named('pause', 10, 5), named('vllm', 12, 40)], [pod], { [POD_UID]: [10, 11, 12] }, [[11, emfile]]);
  t.same(withEngine.attribution.liveness.get('pod'), { state: 'alive' }, 'something else runs: alive, but since when is unknown');
  t.same(podView([gpu(0, [])], [], [pod], { [POD_UID]: [11] }).attribution.liveness.get('pod'), { state: 'alive' }, 'a member the snapshot did not read counts as running');
});

t.test('a cgroup shard whose engine output predates every process it runs now: the account is set aside, with a warning', async (t) => {
  const pod = shard({ id: 'pod', pid: null, cgroup: POD_UID, gpus: [0], registeredAt: NOW - 60_000 });
  const cpu: EngineAccount = { backend: 'CPU', devices: [], layersOffloaded: 0, layersTotal: 33, gpuBackendLoaded: false, evidence: 'ggml_cuda_init: failed to initialize CUDA', summary: 'llama.cpp failed to initialize CUDA' };
  // The sandbox since tick 5; the restarted engine since tick 700, on GPU 0.
  const node = podView([gpu(0, [[12, 4000]])], [named('pause', 10, 5), named('llama-server', 12, 700)], [pod], { [POD_UID]: [10, 12] });
  const judged = (engineTicks: number | null | undefined) => readiness({ shard: pod, node, engine: cpu, staleReason: null, now: NOW, ...(engineTicks === undefined ? {} : { engineTicks }) });

  const earlier = judged(699);
  t.equal(earlier.state, 'ready', 'nvidia-smi decides: the restarted engine holds GPU 0');
  t.equal(earlier.warnings.length, 1, 'and neither does its partial offload');
  t.match(earlier.warnings[0], `the engine output posted (it says CPU) came, at least in part, from an earlier run: every process in cgroup "${POD_UID}" started after it`);
  t.match(earlier.warnings[0], /decides nothing: post the new run's output \(llama\.cpp -lv 4\) to \/shards\/pod\/engine-output, which starts a new tail$/);
  t.equal(judged(700).state, 'on-cpu', 'posted in the tick the engine started: it may be this run\'s');
  t.equal(judged(800).state, 'on-cpu', 'posted while this run went on: it is this run\'s');
  t.equal(judged(null).state, 'on-cpu', 'not dated: taken as current');
  t.equal(judged(undefined).state, 'on-cpu');

  const missing = podView([gpu(0, [])], [named('pause', 10, 5), named('llama-server', 12, 700)], [pod], { [POD_UID]: [10, 12] });
  const v = readiness({ shard: pod, node: missing, engine: cpu, engineTicks: 600, staleReason: null, now: NOW });
  t.equal(v.state, 'on-cpu', 'grace over and GPU 0 not held: on-cpu by nvidia-smi');
  t.match(v.reason, 'its processes hold no memory on GPU 0');
  t.notMatch(v.reason, 'the engine itself reports it');
  t.match(v.reason, /probably did not load\. .*an earlier run's .*-lv 4\) to \/shards\/pod\/engine-output/);
  const starting = readiness({ shard: { ...pod, registeredAt: NOW - 1000 }, node: missing, engine: cpu, engineTicks: 600, staleReason: null, now: NOW });
  t.equal(starting.state, 'starting', 'within grace, the old run\'s CPU no longer makes it on-cpu at once');

  const pidShard = shard({ gpus: [0] });
  const single = view([gpu(0, [[100, 4000]])], [stat(100, 100, 5)], [pidShard]);
  t.equal(readiness({ shard: pidShard, node: single, engine: cpu, engineTicks: 1, staleReason: null, now: NOW }).state, 'on-cpu', 'a PID shard\'s output is its process\'s: a restart is a new registration');

  // A process that joined the container after the engine (a `kubectl exec` shell) is no restart: the
  // run is dated by its oldest process.
  const withShell = podView([gpu(0, [[12, 4000]])], [named('pause', 10, 5), named('llama-server', 12, 700), named('bash', 13, 900)], [pod], { [POD_UID]: [10, 12, 13] });
  t.same(withShell.attribution.liveness.get('pod'), { state: 'alive', oldestStart: 700 });
  const current = readiness({ shard: pod, node: withShell, engine: cpu, engineTicks: 800, staleReason: null, now: NOW });
  t.equal(current.state, 'on-cpu', 'posted while the engine ran: its CPU account decides');
  t.match(current.reason, 'the engine itself reports it');
  t.notMatch(current.warnings.join(' '), 'earlier run');
});

t.test('the starting reason after the grace: no blame on nvidia-smi, and never a negative time', async (t) => {
  const s = shard({ gpus: [0], graceMs: 3000, registeredAt: NOW - 3500 });
  const node = view([gpu(0, [])], [stat(100, 100, 5)], [s]);
  const judged = (evidenceAt: number, graceMs = 3000) => readiness({ shard: { ...s, graceMs }, node, engine: null, staleReason: null, now: NOW, evidenceAt });
  const inside = judged(NOW - 2500);
  t.equal(inside.state, 'starting');
  t.equal(
    inside.reason,
    "waiting for the shard to hold memory on GPU 0 (the GPU driver lists none of its memory there yet). Its 3.0 s grace is over, but the GPU driver's latest listing was begun 1.0 s after registration, before the grace ended: " +
      'the verdict waits for a listing begun after the grace.',
  );
  t.notMatch(inside.reason, 'slow', 'a routine refresh is not nvidia-smi being slow');
  const before = judged(NOW - 3600, 0);
  t.equal(before.state, 'starting');
  t.equal(
    before.reason,
    "waiting for the shard to hold memory on GPU 0 (the GPU driver lists none of its memory there yet). Its 0 ms grace is over, but the GPU driver's latest listing was begun before this shard was registered: " +
      'the verdict waits for a listing begun after the grace.',
  );
  t.notMatch(before.reason, /-\d/, 'no negative time');
  t.equal(judged(NOW - 400).state, 'on-cpu', 'a listing begun after the grace decides');
});

t.test('the grace ends at registeredAt + graceMs exactly: a listing begun then decides, and the judgement is dated no later than now', async (t) => {
  const s = shard({ gpus: [0], graceMs: 3000, registeredAt: NOW - 3000 });
  const node = view([gpu(0, [])], [stat(100, 100, 5)], [s]);
  const judged = (shard: ShardRecord, evidenceAt: number) => readiness({ shard, node, engine: null, staleReason: null, now: NOW, evidenceAt });
  t.equal(judged({ ...s, registeredAt: NOW - 2999 }, NOW).state, 'starting', 'one millisecond before the end: still within its grace');
  const atEnd = judged(s, NOW);
  t.equal(atEnd.state, 'on-cpu', 'no grace left, and the listing was begun as it ended');
  t.match(atEnd.reason, 'hold no memory on GPU 0, 3.0 s after registration (grace 3.0 s)');
  t.equal(judged(s, NOW - 1).cause, 'awaiting-listing', 'a listing begun a millisecond before the end still waits');
  // A refresh that began after the request took its time: the judgement is dated now, not in the future.
  t.match(judged(s, NOW + 500).reason, 'hold no memory on GPU 0, 3.0 s after registration');
  const unseen = view([gpu(0, [])], [], [s]);
  t.equal(verdictOf(s, unseen).cause, 'not-in-snapshot', 'not in any snapshot when the grace ends: unverified, no longer starting');
  const failing = readiness({ shard: s, node: unseen, engine: null, staleReason: 'the last refresh failed: no devices', failing: 'the last refresh failed: no devices', now: NOW });
  t.match(failing, { state: 'starting', cause: 'awaiting-nvidia-smi', ready: false }, 'while refreshes fail, one no listing has shown is not admitted');
  t.match(failing.reason, 'not been seen holding memory on GPU 0');
  t.match(failing.warnings, [/older snapshot: the last refresh failed: no devices/]);
});

t.test('reasons: spans from milliseconds to hours, long graces in minutes, and sentences that start with a capital', async (t) => {
  const s = shard({ gpus: [0], graceMs: 3_600_000, registeredAt: NOW - 10_200 });
  const node = view([gpu(0, [])], [stat(100, 100, 5)], [s]);
  t.equal(verdictOf(s, node).reason, 'waiting for the shard to hold memory on GPU 0 (the GPU driver lists none of its memory there yet); 59.8 min of its 60 min grace left.');
  const unknown = verdictOf(s, view([gpu(0, [])], [], []));
  t.equal(unknown.reason, 'registered 10.2 s ago; waiting for the first snapshot that includes it (59.8 min of grace left).');
  const late = shard({ gpus: [0], graceMs: 150_000, registeredAt: NOW - 600_000 });
  const onCpu = verdictOf(late, view([gpu(0, [])], [stat(100, 100, 5)], [late])).reason!;
  t.match(onCpu, /its processes hold no memory on GPU 0, 10 min after registration \(grace 2\.5 min\)\. Its GPU backend probably did not load\. Post the engine's log/);
  const dayOld = shard({ gpus: [0], graceMs: 15_000, registeredAt: NOW - 26 * 3_600_000 });
  t.match(verdictOf(dayOld, view([gpu(0, [])], [stat(100, 100, 5)], [dayOld])).reason, 'its processes hold no memory on GPU 0, 26 h after registration (grace 15.0 s).');
  const justNow = shard({ gpus: [0], graceMs: 15_000, registeredAt: NOW - 400 });
  t.equal(verdictOf(justNow, view([gpu(0, [])], [], [])).reason, 'registered 400 ms ago; waiting for the first snapshot that includes it (14.6 s of grace left).');
  const noSnapshot = verdictOf({ ...s, graceMs: 0 }, view([gpu(0, [])], [], []));
  t.same([noSnapshot.state, noSnapshot.warnings], [
    'unverified',
    ['no snapshot taken since this shard was registered includes it yet (the next refresh will): until one does, where it computes is unverified'],
  ], 'no blame on nvidia-smi for a refresh that is merely under way');
});

t.test('without nvidia-smi: /proc liveness and the engine\'s account still decide exited and on-cpu', async (t) => {
  const s = shard({ gpus: [0] });
  const cpu: EngineAccount = { backend: 'CPU', devices: [], layersOffloaded: 0, layersTotal: 33, gpuBackendLoaded: false, evidence: 'x', summary: 'llama.cpp failed to initialize CUDA' };
  const judged = (input: { shard?: ShardRecord; liveness?: Liveness; engine?: EngineAccount | null; engineTicks?: number }) =>
    readiness({ shard: input.shard ?? s, node: null, engine: input.engine ?? null, staleReason: null, now: NOW, unavailable: 'nvidia-smi timed out', ...input });
  const unverified = 'the GPU driver cannot be asked, so where this shard computes is unverified and it keeps serving: nvidia-smi timed out';
  t.same(judged({ liveness: { state: 'gone', why: 'process 100 no longer exists' } }), { ready: false, state: 'exited', cause: 'process-exited', reason: "the shard's process exited: process 100 no longer exists.", warnings: [] });
  t.same(judged({ liveness: { state: 'gone', why: 'x' }, engine: cpu }).state, 'exited', 'gone outranks what the engine said');
  t.match(judged({ liveness: { state: 'alive' }, engine: cpu }), {
    ready: false,
    state: 'on-cpu',
    cause: 'engine-gpu-backend-failed',
    reason: /^placed on GPU 0 but computing on the CPU: the engine itself reports it\. llama\.cpp failed to initialize CUDA\. Its GPU backend did not load\. /,
    warnings: ["the GPU driver cannot be asked, so this verdict rests on the engine's own output: nvidia-smi timed out"],
  });
  t.match(judged({ liveness: { state: 'alive' }, engine: cpu }).reason, /ldd libggml-cuda\.so.*CUDA_VISIBLE_DEVICES.*GPU runtime.*`nodecompute doctor`/);
  t.equal(judged({ engine: cpu }).state, 'on-cpu', 'no /proc facts: the engine\'s word still holds');
  t.same(judged({ liveness: { state: 'alive' } }), { ready: true, state: 'unverified', cause: 'nvidia-smi-unavailable', reason: null, warnings: [unverified] });
  t.same(judged({ shard: { ...s, gpus: [] }, liveness: { state: 'alive' }, engine: cpu }).state, 'unverified', 'a shard given no GPU is not on-cpu for computing on the CPU');
  t.same(judged({ liveness: { state: 'unreadable', why: 'EMFILE' }, engine: cpu }), { ready: true, state: 'unverified', cause: 'nvidia-smi-unavailable', reason: null, warnings: [unverified, 'EMFILE'] });
  const pod = shard({ id: 'pod', pid: null, cgroup: POD_UID, gpus: [0] });
  const restarted = judged({ shard: pod, liveness: { state: 'alive', oldestStart: 700 }, engine: cpu, engineTicks: 600 });
  t.equal(restarted.state, 'unverified', "an earlier run's CPU decides nothing");
  t.match(restarted.warnings, [unverified, /came, at least in part, from an earlier run/]);
});

/** What llama.cpp printed in a real sample, as the registry reads it. */
const accountOf = (file: string): EngineAccount | null => parseLlamaLog(readSample(file));

t.test('on-cpu while the engine output shows weights on a CUDA device: the reason says they conflict and what to check, not to post the log again', async (t) => {
  // llamacpp-log_2025_load_tensors_cuda0_cpu_48of48.txt: "CUDA0 model buffer size = 63980.86 MiB", 48/48 layers.
  const engine = accountOf('llamacpp-log_2025_load_tensors_cuda0_cpu_48of48.txt');
  const d = shard({ id: 'd', gpus: [3] });
  // GPU 3 holds 62 GiB of a process no shard covers (PID 200, its own process group).
  const node = view([gpu(3, [[200, 64400]])], [stat(100, 100, 5), stat(200, 200, 6)], [d]);
  const v = readiness({ shard: d, node, engine, enginePosted: true, staleReason: null, now: NOW });
  t.equal(v.state, 'on-cpu', 'nvidia-smi decides: none of its processes holds GPU 3');
  t.match(
    v.reason,
    'placed on GPU 3, but its processes hold no memory on GPU 3, 60.0 s after registration (grace 10.0 s), although the engine output posted to /shards/d/engine-output ' +
      'says llama.cpp put its model buffers on CUDA0 and offloaded 48/48 layers (load_tensors: CUDA0 model buffer size = 63980.86 MiB).',
  );
  t.match(v.reason, /not in this shard's processes on GPU 3, or the output is another run's\. .*GET \/gpus/);
  t.match(v.reason, /under no shard, .*another process group, or the wrong PID registered: register the engine's own PID, or the pod by its cgroup/);
  t.match(v.reason, /on another GPU, CUDA_VISIBLE_DEVICES maps CUDA0 there, not to GPU 3; nowhere, post this run's output to \/shards\/d\/engine-output\.$/);
  t.notMatch(v.reason, 'probably did not load', 'the engine says its backend loaded');
  t.notMatch(v.reason, "Post the engine's log", 'the log is not asked for again');
  t.same(v.warnings, [], '48 of 48 layers: no partial offload');
  t.same(shardCompute(d, node, engine, v.state).engine, engine, 'compute.engine still shows what the engine said');

  // llamacpp-log_2024-01_ollama2266_journald_llm_load_tensors_multi-cuda.txt: buffers on CUDA0 and CUDA1, for a pod registered by its cgroup.
  const multi = accountOf('llamacpp-log_2024-01_ollama2266_journald_llm_load_tensors_multi-cuda.txt');
  const pod = shard({ id: 'pod', pid: null, cgroup: POD_UID, gpus: [0, 1] });
  const podNode = podView([gpu(0, []), gpu(1, [])], [named('llama-server', 12, 700)], [pod], { [POD_UID]: [12] });
  const fromPod = readiness({ shard: pod, node: podNode, engine: multi, enginePosted: true, staleReason: null, now: NOW }).reason;
  t.match(fromPod, 'says llama.cpp put its model buffers on CUDA0 and CUDA1 and offloaded 33/33 layers (llm_load_tensors: CUDA0 buffer size = 4695.56 MiB | llm_load_tensors: CUDA1 buffer size = 3912.97 MiB).');
  t.match(fromPod, `a process this shard does not cover (a process outside cgroup "${POD_UID}": register the pod or container the engine runs in)`);
  t.match(fromPod, 'maps CUDA0 and CUDA1 there, not to GPU 0 and GPU 1;');

  // The 2023 "VRAM used" proof, cut from llamacpp-log_2023-12_ollama1341_ggml_init_cublas_2gpu_vram-used.txt without its device lines.
  const vram = parseLlamaLog('llm_load_tensors: using CUDA for GPU acceleration\nllm_load_tensors: VRAM used: 6936.01 MiB\n');
  t.same(vram?.devices, [], 'no device named');
  const elsewhere = readiness({ shard: d, node: view([gpu(3, [])], [stat(100, 100, 5)], [d]), engine: vram, staleReason: null, now: NOW }).reason;
  t.match(elsewhere, 'says llama.cpp reported 6936.01 MiB of VRAM used on its CUDA devices (llm_load_tensors: VRAM used: 6936.01 MiB). So the weights');
  t.match(elsewhere, 'maps its CUDA devices there, not to GPU 3;');
});

t.test('the engine says CPU: the advice follows whether its GPU backend loaded, and memory its processes hold is weighed against it', async (t) => {
  const ON_CPU_ADVICE = /Check the engine's build \(ldd libggml-cuda\.so\)/;
  // llamacpp-log_2023-10_llava_ggml_init_cublas_offloaded-0of35_issue3616.txt: 2 CUDA devices found, then 0/35 layers offloaded.
  const noLayers = accountOf('llamacpp-log_2023-10_llava_ggml_init_cublas_offloaded-0of35_issue3616.txt')!;
  // llamacpp-log_2024-03_issue6184_no-cuda-devices-found_quoted.txt: no CUDA device found.
  const noGpu = accountOf('llamacpp-log_2024-03_issue6184_no-cuda-devices-found_quoted.txt')!;
  t.same([noLayers.gpuBackendLoaded, noGpu.gpuBackendLoaded], [true, false]);
  const s = shard({ gpus: [2, 4] });
  const idle = view([gpu(2, []), gpu(4, [])], [stat(100, 100, 5)], [s]);
  // 103.4 GiB on each GPU it was given, in the engine's own process.
  const loaded = view([gpu(2, [[100, 105842]]), gpu(4, [[100, 105842]])], [stat(100, 100, 5)], [s]);
  const judged = (engine: EngineAccount, node: NodeView) => readiness({ shard: s, node, engine, enginePosted: true, staleReason: null, now: NOW });

  const zero = judged(noLayers, idle);
  t.equal(zero.state, 'on-cpu');
  t.match(
    zero.reason,
    /^placed on GPU 2 and GPU 4 but computing on the CPU: the engine itself reports it\. llama\.cpp offloaded no layers to the GPU \(llm_load_tensors: offloaded 0\/35 layers to GPU\)\. /,
  );
  t.match(zero.reason, /backend loaded but put no layers on the GPU\. Start it with -ngl \(LLAMA_ARG_N_GPU_LAYERS\) at or above the model's layers/);
  t.notMatch(zero.reason, 'ldd', 'the backend loaded: no advice to check libraries');

  const failed = judged(noGpu, idle);
  t.match(failed.reason, /Its GPU backend did not load\. .*ldd/, 'no GPU found and none held: the build and the runtime');

  const conflict = judged(noGpu, loaded);
  t.equal(conflict.state, 'on-cpu', "the engine's own account still decides");
  t.match(
    conflict.reason,
    "placed on GPU 2 and GPU 4 but computing on the CPU: the engine itself reports it. llama.cpp found no usable GPU (ggml_cuda_init: no CUDA devices found, CUDA will be disabled). " +
      'Yet the GPU driver lists its processes holding GPU 2: 103.4 GiB, GPU 4: 103.4 GiB, which an engine that found no usable GPU cannot hold',
  );
  t.match(conflict.reason, /another run's\. Post this run's \(llama\.cpp -lv 4\) to \/shards\/s\/engine-output; GET \/gpus shows which process/);
  t.notMatch(conflict.reason, 'ldd', 'not the build: the output contradicts nvidia-smi');
  t.same(shardCompute(s, loaded, noGpu, conflict.state).devices, ['GPU 2: 103.4 GiB', 'GPU 4: 103.4 GiB'], 'devices say what nvidia-smi lists');

  const context = judged(noLayers, view([gpu(2, [[100, 520]]), gpu(4, [])], [stat(100, 100, 5)], [s]));
  t.match(context.reason, /holding GPU 2: 520 MiB: a run without GPU layers holds its CUDA context .*Its GPU backend loaded but put no layers/);
  t.match(context.reason, /size of the weights, the output is another run's: post this run's to \/shards\/s\/engine-output/);

  // Only the GPUs it was given are weighed: memory on another one is a warning of its own.
  const elsewhere = judged(noGpu, view([gpu(2, []), gpu(3, [[100, 520]]), gpu(4, [])], [stat(100, 100, 5)], [s]));
  t.match(elsewhere.reason, /Its GPU backend did not load\. .*ldd/, 'as when it holds nothing on its GPUs');
  t.notMatch(elsewhere.reason, 'the GPU driver lists its processes holding');
  t.match(elsewhere.warnings, ['holds memory on GPU 3, which it was not given: check CUDA_VISIBLE_DEVICES and the placement']);

  const unsaid = { ...noLayers, gpuBackendLoaded: null };
  t.match(judged(unsaid, idle).reason, /GPU backend did not load, or it put no layers on the GPU\. .*ldd.*-ngl/);
  t.match(judged(unsaid, idle).reason, ON_CPU_ADVICE);
  t.match(judged(unsaid, loaded).reason, /holds its CUDA context .*Its GPU backend loaded/, 'the memory held shows the backend loaded');
});

t.test('on-cpu while the engine output finds CUDA but shows no weights: the reason asks for its output through model loading', async (t) => {
  // llamacpp-server-log_2026-05-17_b9151-b9828-era_default-lv3_device_info.txt: device_info lists CUDA0, no buffer line at -lv 3.
  const engine = accountOf('llamacpp-server-log_2026-05-17_b9151-b9828-era_default-lv3_device_info.txt');
  const s = shard({ gpus: [0] });
  const v = readiness({ shard: s, node: view([gpu(0, [])], [stat(100, 100, 5)], [s]), engine, enginePosted: true, staleReason: null, now: NOW });
  t.equal(v.state, 'on-cpu');
  t.match(
    v.reason,
    'placed on GPU 0 but computing on the CPU: its processes hold no memory on GPU 0, 60.0 s after registration (grace 10.0 s). ' +
      'The engine output posted says llama.cpp found CUDA0 but printed no model buffer line, so weights on the GPU are not confirmed. ',
  );
  t.match(v.reason, /through model loading \(-lv 4 prints "CUDA<n> model buffer size"\) to \/shards\/s\/engine-output, .*GET \/gpus/);
  t.match(v.reason, /does not cover \(.*another process group, or the wrong PID registered: register the engine's own PID, or the pod by its cgroup\)/);
  t.match(v.reason, /CUDA_VISIBLE_DEVICES maps CUDA0 to another GPU\.$/);
  t.notMatch(v.reason, 'probably did not load');
});

t.test('on-cpu with engine output that says nothing: the reason says so instead of asking for a log already posted', async (t) => {
  // llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt: b9829+ at its default verbosity names no device.
  t.equal(accountOf('llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt'), null);
  const s = shard({ gpus: [0] });
  const node = view([gpu(0, [])], [stat(100, 100, 5)], [s]);
  const judged = (enginePosted: boolean | undefined, engine: ShardRecord['engine'] = 'llama.cpp') =>
    readiness({ shard: { ...s, engine }, node, engine: null, staleReason: null, now: NOW, ...(enginePosted === undefined ? {} : { enginePosted }) }).reason;
  t.match(
    judged(true),
    'GPU 0, 60.0 s after registration (grace 10.0 s). Its GPU backend probably did not load. The output posted to /shards/s/engine-output says nothing about where llama.cpp computes: ' +
      'post its log at -lv 4 (b9829+',
  );
  t.notMatch(judged(true), "Post the engine's log");
  const notPosted = /probably did not load\. Post the engine's log \(llama\.cpp -lv 4\) to \/shards\/s\/engine-output .*Check the engine/;
  t.match(judged(false), notPosted);
  t.match(judged(undefined), notPosted, 'absent: none posted');
  t.notMatch(judged(true, 'vllm'), 'engine-output', 'only llama.cpp output is read: no advice about it for vLLM');
});

t.test('on-cpu while holding memory on a GPU it was not given (and none on the one it was): the backend loaded, on the wrong GPU', async (t) => {
  const s = shard({ gpus: [3] });
  const node = view([gpu(3, []), gpu(5, [[100, 64400]])], [stat(100, 100, 5)], [s]);
  const engine = accountOf('llamacpp-log_2025_load_tensors_cuda0_cpu_48of48.txt');
  for (const [name, account] of [['no engine output', null], ['weights on CUDA0', engine]] as const) {
    const v = readiness({ shard: s, node, engine: account, staleReason: null, now: NOW });
    t.equal(v.state, 'on-cpu', name);
    t.match(
      v.reason,
      'placed on GPU 3; it holds memory on GPU 5, which it was not given, and its processes hold no memory on GPU 3, 60.0 s after registration (grace 10.0 s). ',
      name,
    );
    t.match(v.reason, /CUDA_VISIBLE_DEVICES or the container's GPU runtime gives it GPU 5 .*CUDA_DEVICE_ORDER=PCI_BUS_ID.*register the shard with the GPUs it uses/, name);
    t.same(v.warnings, ['holds memory on GPU 5, which it was not given: check CUDA_VISIBLE_DEVICES and the placement'], name);
  }
});

t.test('an engine that says CPU gets no partial-offload warning, whatever "offloaded N/M" it printed', async (t) => {
  // llamacpp-log_2024-10_cortex1470_cuda-init-failed_claims-offload_cpu-only-buffer.txt: CUDA init failed, "offloaded 13/33" claimed, one CPU buffer.
  const engine = accountOf('llamacpp-log_2024-10_cortex1470_cuda-init-failed_claims-offload_cpu-only-buffer.txt');
  t.match(engine, { backend: 'CPU', layersOffloaded: 13, layersTotal: 33 });
  const s = shard({ gpus: [0] });
  for (const [name, node] of [
    ['holding GPU 0 (a CUDA context of a build that fell back)', view([gpu(0, [[100, 300]])], [stat(100, 100, 5)], [s])],
    ['holding nothing', view([gpu(0, [])], [stat(100, 100, 5)], [s])],
  ] as const) {
    const v = readiness({ shard: s, node, engine, enginePosted: true, staleReason: null, now: NOW });
    t.equal(v.state, 'on-cpu', name);
    t.match(v.reason, 'llama.cpp found no usable GPU (ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected) although it reported 13/33 layers offloaded', name);
    t.same(v.warnings, [], name);
  }
});
