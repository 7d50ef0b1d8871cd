// Past max-stale, nvidia-smi's last good listing holds against a shard, never for it: each decision
// of readiness.ts's lastListingVerdict over hand-made views of that listing, with /proc's word now
// (liveness) and the engine's. The route-level walk through a failure is test/routes/past-max-stale.
import t from 'tap';
import type { Liveness } from '../../src/node-state/attribution.js';
import type { NodeView } from '../../src/node-state/node-view.js';
import { readiness, type ReadinessInput } from '../../src/shards/readiness.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { handMadeView, NO_GPU_ENGINE, procStat, shardRecord } from '../helpers/hand-made-view.js';

const NOW = 1_000_000;
/** The last good listing: its refresh began 30 s ago and landed 29 s ago. */
const STARTED = NOW - 30_000;
const OBSERVED = NOW - 29_000;
const LISTING = `the GPU driver's last good listing (${new Date(OBSERVED).toISOString()}, 29.0 s ago)`;
const ALIVE: Liveness = { state: 'alive' };

const s = shardRecord(NOW);

function listing(node: Parameters<typeof handMadeView>[0], shards: ShardRecord[]): NonNullable<ReadinessInput['lastGood']> {
  return { node: handMadeView(node, shards), startedAt: STARTED, observedAt: OBSERVED };
}

/** The verdict past max-stale: no snapshot, /proc's `liveness` now, the listing given, this run judging since long before. */
function judge(shard: ShardRecord, lastGood: ReadinessInput['lastGood'], extra: Partial<ReadinessInput> = {}) {
  return readiness({ shard, node: null, unavailable: 'boom', liveness: ALIVE, lastGood, judgingSince: NOW - 3_600_000, staleReason: null, engine: null, now: NOW, ...extra });
}

const holding = (shards: ShardRecord[], stat = procStat(100)): NodeView => handMadeView({ now: STARTED, gpus: [gpu(0, [[100, 9000]])], stats: [stat] }, shards);
const idle = (shard: ShardRecord, stat = procStat(100)) => listing({ now: STARTED, gpus: [gpu(0, [])], stats: [stat] }, [shard]);

t.test('seen ready: unverified, it keeps serving', async (t) => {
  const verdict = judge(s, { node: holding([s]), startedAt: STARTED, observedAt: OBSERVED });
  t.match(verdict, { ready: true, state: 'unverified', cause: 'nvidia-smi-unavailable', warnings: ['the GPU driver cannot be asked, so where this shard computes is unverified and it keeps serving: boom'] });
});

t.test('seen on the CPU: on-cpu still, the reason dating the listing, the warning saying it holds until nvidia-smi answers', async (t) => {
  const verdict = judge(s, idle(s));
  t.match(verdict, { ready: false, state: 'on-cpu', cause: 'no-gpu-memory', warnings: ['the GPU driver cannot be asked, so this verdict holds until it answers: boom'] });
  t.match(verdict.reason, `the GPU driver cannot be asked; ${LISTING} showed: placed on GPU 0 but computing on the CPU: its processes hold no memory on GPU 0, 30.0 s after registration`);
  const landedLater = judge(s, { ...idle(s), observedAt: NOW + 500 });
  t.match(landedLater.reason, `the GPU driver cannot be asked; the GPU driver's last good listing (${new Date(NOW + 500).toISOString()}, 0 ms ago) showed:`, 'a listing that landed after the request began is dated 0 ms ago, never a negative time');
});

t.test('seen starting: starting still, and a grace that ended since waits for a listing begun after it', async (t) => {
  const young = shardRecord(NOW, { registeredAt: STARTED - 5000, graceMs: 10_000 });
  const within = judge(young, idle(young), { now: STARTED + 2000 });
  t.match(within, { state: 'starting', cause: 'awaiting-gpu-memory' });
  t.match(within.reason, /^the GPU driver cannot be asked; .* showed: waiting for the shard to hold memory on GPU 0 .*; 3.0 s of its 10.0 s grace left\.$/);
  const after = judge(young, idle(young));
  t.match(after, { state: 'starting', cause: 'awaiting-listing' });
  t.match(after.reason, /the GPU driver's latest listing was begun 5.0 s after registration, before the grace ended: the verdict waits for a listing begun after the grace\.$/);
});

t.test('seen on a GPU no longer listed: gpu-lost, before what the engine says now', async (t) => {
  const lost = { index: 0, uuid: 'GPU-0', name: 'NVIDIA H200', busId: '00000000:01:00.0', lastListedAt: STARTED - 60_000, lostAt: STARTED - 50_000 };
  const lastGood = listing({ now: STARTED, gpus: [gpu(1, [])], stats: [procStat(100)], lostGpus: [lost] }, [s]);
  const verdict = judge(s, lastGood, { engine: NO_GPU_ENGINE });
  t.match(verdict, { state: 'gpu-lost', cause: 'gpu-not-listed', reason: /showed: placed on GPU 0, but GPU 0 \(GPU-0, NVIDIA H200\) is no longer listed/ });
  t.match(verdict.warnings, [/holds until it answers: boom$/, /^the engine output posted says it computes on the CPU .*: once it has GPUs again, it reads on-cpu$/]);
  t.match(judge(s, idle(s), { engine: NO_GPU_ENGINE }), { state: 'on-cpu', cause: 'engine-gpu-backend-failed' }, 'on a listed GPU, the engine decides');
});

t.test('a shard the listing does not describe: starting in this run, unverified if an earlier run registered it', async (t) => {
  const late = shardRecord(NOW, { registeredAt: STARTED + 1 });
  const unseen = judge(late, idle(late));
  t.match(unseen, { ready: false, state: 'starting', cause: 'awaiting-nvidia-smi', warnings: ['the GPU driver cannot be asked: boom'] });
  t.match(unseen.reason, /^registered 30.0 s ago, and no listing of the GPU driver since has included it, so it has not been seen holding memory on GPU 0: it reads starting until the GPU driver answers/);
  t.match(judge(shardRecord(NOW, { registeredAt: STARTED }), idle(s)), { state: 'starting', cause: 'awaiting-listing' }, 'registered as the refresh began: described');
  t.match(judge(s, null, { judgingSince: s.registeredAt }), { state: 'starting', cause: 'awaiting-nvidia-smi' }, 'no listing in this run, registered as it began');
  t.match(judge(s, null, { judgingSince: s.registeredAt + 1 }), { state: 'unverified' }, 'registered before this run: it may have been seen ready');
  t.match(judge(s, null, { judgingSince: undefined }), { state: 'unverified' }, 'a caller that does not say when this run began: every shard counts as earlier');
  t.match(judge({ ...late, gpus: [] }, idle(late)), { state: 'unverified' }, 'given no GPU: nothing to be seen on');
});

t.test('exited or stopped in the listing: held while /proc cannot say otherwise; running again, judged afresh', async (t) => {
  const gone = listing({ now: STARTED, gpus: [gpu(0, [])], otherAnswers: [[100, null]] }, [s]);
  t.match(judge(s, gone, { liveness: { state: 'unknown' } }), { state: 'exited', cause: 'process-exited', reason: /showed: the shard's process exited/ });
  const stoppedHolding = { node: holding([s], procStat(100, 'T')), startedAt: STARTED, observedAt: OBSERVED };
  t.match(judge(s, stoppedHolding, { liveness: { state: 'unknown' } }), { state: 'stopped' }, 'stopped, and nothing says it runs again');
  t.match(judge(s, stoppedHolding), { state: 'unverified' }, 'stopped holding its GPU, running now: it was on its GPU');
  const stoppedIdle = judge(s, idle(s, procStat(100, 'T')));
  t.match(stoppedIdle, { state: 'on-cpu', cause: 'no-gpu-memory' }, 'stopped holding nothing, running now: what it held decides, as once a stop ends with a snapshot');
  t.match(stoppedIdle.reason, `the GPU driver cannot be asked; ${LISTING} showed: placed on GPU 0 but computing on the CPU`);
  t.match(judge(s, stoppedHolding, { liveness: { state: 'unreadable', why: 'EMFILE' } }), { state: 'unverified', warnings: [/keeps serving: boom$/, 'EMFILE'] }, 'its stat unreadable now: no evidence either way');
});

t.test('an engine that started again after the listing has not been seen on its GPU: by the processes that held its memory', async (t) => {
  const pod = shardRecord(NOW, { id: 'pod', pid: null, cgroup: 'c0ffee0c0ffee', identity: { pid: 200, pgid: 200, startTime: 50, name: 'llama-server' } });
  const engine = { ...procStat(200), pgrp: 200, startTime: 50 };
  const sidecar = { ...procStat(300), pgrp: 300, startTime: 10, comm: 'envoy' };
  const then = (members: number[]) => ({
    node: handMadeView({ now: STARTED, gpus: [gpu(0, [[200, 9000]])], stats: [engine, sidecar], cgroupPids: [['c0ffee0c0ffee', members]] }, [pod]),
    startedAt: STARTED,
    observedAt: OBSERVED,
  });
  const alive: Liveness = { state: 'alive', oldestStart: 10 };
  const runs = new Map([[200, engine], [300, sidecar]]);
  t.match(judge(pod, then([200, 300]), { liveness: alive, procNow: runs }), { state: 'unverified' }, 'the process that held its GPU still runs');
  t.match(judge(pod, then([200, 300]), { liveness: alive, procNow: new Map([[200, engine], [300, { ...sidecar, startTime: 900 }]]) }), { state: 'unverified' }, 'a sidecar restarted: the engine still runs');
  t.match(judge(pod, then([200, 300]), { liveness: alive, procNow: new Map([[300, sidecar]]) }), { state: 'unverified' }, 'a holder not read now is not known to have exited');
  for (const [what, now] of [['gone', null], ['its PID now another process', { ...engine, startTime: 900 }], ['a zombie', { ...engine, state: 'Z' }]] as const) {
    const restarted = judge(pod, then([200, 300]), { liveness: alive, procNow: new Map([[200, now], [300, sidecar]]) });
    t.match(restarted, { state: 'starting', cause: 'awaiting-nvidia-smi' }, `the engine that held its GPU ${what}`);
    t.match(restarted.reason, `every process that held its memory on GPU 0 in ${LISTING} has exited since (its engine restarted), so it has not been seen holding memory on GPU 0`);
  }
  t.match(judge(pod, then([200, 300]), { liveness: alive }), { state: 'unverified' }, 'no stats read now: nothing known to have exited');
  const worker = { ...engine, pid: 201, ppid: 200 };
  const twoHolders = { node: handMadeView({ now: STARTED, gpus: [gpu(0, [[200, 9000], [201, 500]])], stats: [engine, worker], cgroupPids: [['c0ffee0c0ffee', [200, 201]]] }, [pod]), startedAt: STARTED, observedAt: OBSERVED };
  t.match(judge(pod, twoHolders, { liveness: alive, procNow: new Map([[200, engine], [201, null]]) }), { state: 'unverified' }, 'one of two processes that held its GPU exited, the other runs: not restarted');
  const unattributed = { node: handMadeView({ now: STARTED, gpus: [gpu(0, [[200, 9000]])], stats: [engine] }, []), startedAt: STARTED, observedAt: OBSERVED };
  t.match(judge(pod, unattributed, { liveness: alive, procNow: new Map([[200, null]]) }), { state: 'on-cpu' }, 'a listing that gave the shard no memory: no holder to have exited, judged on the listing');
  const exitedThen = judge(pod, then([]), { liveness: alive, procNow: runs });
  t.match(exitedThen, { state: 'starting', cause: 'awaiting-nvidia-smi' }, 'exited then, running now');
  t.match(exitedThen.reason, `${LISTING} showed it exited, and its engine runs again since`);
});

t.test("output set aside as an earlier run's leaves the engine's word out of the listing's verdict", async (t) => {
  const pod = shardRecord(NOW, { id: 'pod', pid: null, cgroup: 'c0ffee0c0ffee', identity: { pid: 200, pgid: 200, startTime: 900, name: 'llama-server' } });
  const lastGood = {
    node: handMadeView({ now: STARTED, gpus: [gpu(0, [])], stats: [{ ...procStat(200), pgrp: 200, startTime: 900 }], cgroupPids: [['c0ffee0c0ffee', [200]]] }, [pod]),
    startedAt: STARTED,
    observedAt: OBSERVED,
  };
  const setAside = judge(pod, lastGood, { liveness: { state: 'alive', oldestStart: 900 }, engine: NO_GPU_ENGINE, engineTicks: 100, enginePosted: true });
  t.match(setAside, { state: 'on-cpu', cause: 'no-gpu-memory', reason: /The engine output posted is an earlier run's/ }, 'nvidia-smi decided it, not the output of an earlier run');
  t.match(setAside.warnings, [/holds until it answers: boom$/, /came, at least in part, from an earlier run/]);
  t.equal(setAside.warnings.length, 2, 'said once');
});

t.test('a process that held its memory in the listing and is stopped now: stopped, as with a snapshot, while the shard itself runs', async (t) => {
  const leader = { ...procStat(100), startTime: 5 };
  const worker = { ...procStat(101), ppid: 100, pgrp: 100, startTime: 5 };
  const lastGood = { node: handMadeView({ now: STARTED, gpus: [gpu(0, [[101, 9000]])], stats: [leader, worker] }, [s]), startedAt: STARTED, observedAt: OBSERVED };
  t.match(judge(s, lastGood, { procNow: new Map([[100, leader], [101, worker]]) }), { state: 'unverified' }, 'its worker runs: it keeps serving');
  const stopped = judge(s, lastGood, { procNow: new Map([[100, leader], [101, { ...worker, state: 'T' }]]) });
  t.match(stopped, { ready: false, state: 'stopped', cause: 'process-stopped', warnings: [/^the GPU driver cannot be asked, so which GPU memory it holds is unverified: boom$/] }, 'its worker stopped since the listing');
  t.match(stopped.reason, /a process holding its GPU memory is stopped while the rest runs: 101 \(llama-server, state T, on GPU 0\)/);
  const stoppedThen = { node: handMadeView({ now: STARTED, gpus: [gpu(0, [[101, 9000]])], stats: [leader, { ...worker, state: 'T' }] }, [s]), startedAt: STARTED, observedAt: OBSERVED };
  t.match(judge(s, stoppedThen, { procNow: new Map([[100, leader], [101, { ...worker, state: 'T' }]]) }), { state: 'stopped' }, 'stopped then and still stopped');
  t.match(judge(s, stoppedThen, { procNow: new Map([[100, leader], [101, worker]]) }), { state: 'unverified' }, 'stopped then, running again now: it was on its GPU');
  t.match(judge(s, lastGood, { procNow: new Map([[100, leader], [101, { ...worker, state: 'T', startTime: 900 }]]) }), { state: 'starting', cause: 'awaiting-nvidia-smi' }, 'a stopped process that took its PID since is not its worker: the worker has exited');
  const late = shardRecord(NOW, { registeredAt: STARTED + 1 });
  t.match(judge(late, lastGood, { procNow: new Map([[100, leader], [101, { ...worker, state: 'T' }]]) }), { state: 'starting', cause: 'awaiting-nvidia-smi' }, 'a shard the listing does not describe has no holders in it');
  const gone: Liveness = { state: 'gone', why: 'process 100 no longer exists' };
  t.match(judge(s, lastGood, { liveness: gone, procNow: new Map([[100, null], [101, { ...worker, state: 'T' }]]) }), { state: 'exited', cause: 'process-exited' }, 'its process gone: exited, though the worker it left is stopped');
});
