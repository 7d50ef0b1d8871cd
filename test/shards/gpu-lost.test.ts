// A shard placed on a GPU nvidia-smi no longer lists (fallen off the bus, reset, detached), judged over
// hand-made snapshots: gpu-lost, 503, at once (no grace) and whatever the engine said, with the
// GPU's identity from the roster and the fix; an exit or a stop comes before it, and it comes before
// on-cpu, starting and unverified. Its backend is not CPU: nothing says where it computes. The real
// service with a GPU dropping out of the fake nvidia-smi is in test/routes/status-page-lost-gpu.test.ts
// and test/deploy/alerts.test.ts.
import t from 'tap';
import type { LostGpu } from '../../src/node-state/gpu-roster.js';
import type { GpuState } from '../../src/node-state/node-snapshot.js';
import type { Liveness } from '../../src/node-state/attribution.js';
import type { NodeView } from '../../src/node-state/node-view.js';
import type { UnreachableListedGpu } from '../../src/node-state/placement.js';
import { shardCompute } from '../../src/shards/compute.js';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import { readiness, type ReadinessInput } from '../../src/shards/readiness.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcStat, StatAnswer, UnreadableStat } from '../../src/system/procfs.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { handMadeView, NO_GPU_ENGINE, procStat, shardRecord } from '../helpers/hand-made-view.js';

const NOW = Date.parse('2026-12-02T12:00:00Z');
/** GPU 3 as the roster knows it: last listed a minute ago, missing since 55 s ago. */
const LOST_3: LostGpu = { index: 3, uuid: 'GPU-3', name: 'NVIDIA H200', busId: '00000000:04:00.0', lastListedAt: NOW - 60_000, lostAt: NOW - 55_000 };
const FIX =
  'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU. ' +
  'Meanwhile start its engine on GPUs that are listed and PUT the shard with its new gpus.';

/** `extra`: /proc answers other than a stat read (null: no such process; an unreadable stat). */
function view(gpus: GpuState[], stats: ProcStat[], shards: ShardRecord[], lostGpus: LostGpu[] = [LOST_3], extra: Array<[number, StatAnswer]> = []): NodeView {
  return handMadeView({ now: NOW, gpus, stats, otherAnswers: extra, lostGpus }, shards);
}

function shard(overrides: Partial<ShardRecord> = {}): ShardRecord {
  return shardRecord(NOW, { gpus: [3], registeredAt: NOW - 120_000, ...overrides });
}

const verdictOf = (s: ShardRecord, node: NodeView, engine: EngineAccount | null = null) => readiness({ shard: s, node, engine, enginePosted: engine !== null, staleReason: null, now: NOW });

const CPU_ENGINE = NO_GPU_ENGINE;
const CUDA_ENGINE: EngineAccount = { ...CPU_ENGINE, backend: 'CUDA', devices: ['CUDA0'], gpuBackendLoaded: true, summary: 'llama.cpp put its model buffers on CUDA0' };

t.test('a shard on a GPU nvidia-smi no longer lists: gpu-lost, naming the GPU, since when, and what to do', async (t) => {
  const s = shard();
  const node = view([gpu(0, []), gpu(1, [])], [procStat(100)], [s]);
  t.same(verdictOf(s, node), {
    ready: false,
    state: 'gpu-lost',
    cause: 'gpu-not-listed',
    reason:
      'placed on GPU 3, but GPU 3 (GPU-3, NVIDIA H200) is no longer listed by the GPU driver (missing since 2026-12-02T11:59:05.000Z): ' +
      'it fell off the bus, was reset or was detached. Its memory is no longer in /gpus or /metrics, and shards placed on it cannot hold it. ' +
      `This shard cannot serve as placed. ${FIX}`,
    warnings: [],
  });
  t.equal(shardCompute(s, node, null, 'gpu-lost').backend, null, 'holding nothing on a listed GPU: where it computes is not known, not CPU');
});

t.test('at once, within its grace too, and whatever the engine said: waiting cannot bring a GPU back', async (t) => {
  const young = shard({ registeredAt: NOW - 1000 });
  const node = view([gpu(0, [])], [procStat(100)], [young]);
  for (const [name, engine] of [['no output', null], ['weights on CUDA0', CUDA_ENGINE]] as const) {
    const v = verdictOf(young, node, engine);
    t.same([v.state, v.warnings], ['gpu-lost', []], name);
  }
  const saysCpu = verdictOf(young, node, CPU_ENGINE);
  t.equal(saysCpu.state, 'gpu-lost', 'the GPU is what to fix first, not the build');
  t.same(saysCpu.warnings, [`the engine output posted says it computes on the CPU (${CPU_ENGINE.summary}): once it has GPUs again, it reads on-cpu`]);
  t.equal(shardCompute(young, node, CPU_ENGINE, 'gpu-lost').backend, null, 'not the CPU of an on-cpu verdict');
});

t.test('one lost GPU of several: gpu-lost, even while the others are held (its tensor-parallel peer is gone)', async (t) => {
  const s = shard({ gpus: [1, 3] });
  const node = view([gpu(1, [[100, 70_000]])], [procStat(100)], [s]);
  const v = verdictOf(s, node);
  t.equal(v.state, 'gpu-lost');
  t.match(v.reason, /^placed on GPU 1 and GPU 3, but GPU 3 \(GPU-3, NVIDIA H200\) is no longer listed/);
  const compute = shardCompute(s, node, null, v.state);
  t.same([compute.backend, compute.devices], ['CUDA', ['GPU 1: 68.4 GiB']], 'what it holds is still shown');
});

t.test('a GPU the roster never saw (gone before nodecompute started) and two lost at once', async (t) => {
  const s = shard({ gpus: [3, 5] });
  const v = verdictOf(s, view([gpu(0, [])], [procStat(100)], [s]));
  t.equal(v.state, 'gpu-lost');
  t.match(
    v.reason,
    'placed on GPU 3 and GPU 5, but GPU 3 (GPU-3, NVIDIA H200) is no longer listed by the GPU driver (missing since 2026-12-02T11:59:05.000Z); ' +
      'GPU 5 is not listed by the GPU driver (already missing when nodecompute started, renumbered since a GPU went, or registered on trust while the GPU driver could not be asked): ' +
      'it fell off the bus',
  );
});

t.test('registered with its UUID: the roster is asked by UUID, whatever index the GPU had when it went', async (t) => {
  const s = shard({ gpuUuids: ['GPU-3'] });
  const renumberedFirst: LostGpu = { ...LOST_3, index: 2 };
  const known = verdictOf(s, view([gpu(0, [])], [procStat(100)], [s], [renumberedFirst]));
  t.match(known.reason, 'placed on GPU 3, but GPU 3 (GPU-3, NVIDIA H200) is no longer listed by the GPU driver (missing since 2026-12-02T11:59:05.000Z)', 'the index it was registered with');
  const unknown = verdictOf(s, view([gpu(0, [])], [procStat(100)], [s], []));
  t.match(unknown.reason, 'placed on GPU 3, but GPU 3 (GPU-3) is not listed by the GPU driver (it was already missing when nodecompute started):');
});

t.test('a lost GPU beside a renumbered one: "as registered", since its number may name another GPU now', async (t) => {
  const s = shard({ gpus: [1, 2], gpuUuids: ['GPU-1', 'GPU-2'] });
  const node = view([gpu(0, []), { ...gpu(1, [[100, 9000]]), uuid: 'GPU-2' }], [procStat(100)], [s], [{ ...LOST_3, index: 1, uuid: 'GPU-1' }]);
  const v = verdictOf(s, node);
  t.equal(v.state, 'gpu-lost');
  t.match(v.reason, /^placed on GPU 1 and GPU 2 as registered, but GPU 1 \(GPU-1, NVIDIA H200\) is no longer listed/);
  t.match(v.warnings, [/^GPU 2 as registered \(GPU-2\) is GPU 1 now/]);
});

t.test('precedence: exited and stopped come first; gpu-lost comes before unverified, whatever /proc or nvidia-smi hides', async (t) => {
  const s = shard();
  t.equal(verdictOf(s, view([gpu(0, [])], [], [s], [LOST_3], [[100, null]])).state, 'exited', 'its process is gone: nothing to move');
  const stopped = verdictOf(s, view([gpu(0, [])], [procStat(100, 'T')], [s]));
  t.equal(stopped.state, 'stopped', 'a stopped process: resume it first');
  t.same(
    stopped.warnings,
    ['GPU 3 (GPU-3, NVIDIA H200) is no longer listed by the GPU driver (missing since 2026-12-02T11:59:05.000Z): once it runs again, it reads gpu-lost'],
    'what still counts once it runs, and not "it holds no memory on GPU 3"',
  );
  const saysCpu = readiness({ shard: s, node: view([gpu(0, [])], [procStat(100, 'T')], [s]), engine: CPU_ENGINE, enginePosted: true, staleReason: null, now: NOW });
  t.match(saysCpu.warnings, [/reads gpu-lost$/, `the engine output posted says it computes on the CPU (${CPU_ENGINE.summary}): once it has GPUs again, it reads on-cpu`], 'the lost GPU first, then the engine');
  const unreadable: UnreadableStat = { pid: 100, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: 'Raise nofile.' };
  t.equal(verdictOf(s, view([gpu(0, [])], [], [s], [LOST_3], [[100, unreadable]])).state, 'gpu-lost', 'its own stat unreadable: the GPU list alone decides');
  const hiddenNode = view([gpu(0, [[4_194_305, 9000]])], [procStat(100)], [s], [LOST_3], [[4_194_305, null]]);
  t.not(hiddenNode.processesHidden, null, 'nvidia-smi PIDs of another namespace');
  t.equal(verdictOf(s, hiddenNode).state, 'gpu-lost');
});

t.test('a GPU listed again, or an index nvidia-smi gives another GPU now, is judged as listed', async (t) => {
  const s = shard({ gpus: [3], graceMs: 0 });
  const back = view([gpu(3, [[100, 9000]])], [procStat(100)], [s], []);
  t.equal(verdictOf(s, back).state, 'ready');
  const renumbered = view([gpu(3, [])], [procStat(100)], [s]);
  t.equal(verdictOf(s, renumbered).state, 'on-cpu', 'index 3 is listed (by another UUID): the shard is judged on that GPU, as the status page says');
});

// nvidia-smi fails, naming GPU 3 by bus id: the last good listing (the view, served stale; or, past
// max-stale, none) says which GPU that is (NodeService.unreachable). The real service is in
// test/routes/gpu-unreachable.test.ts.
const SAID = 'GPU is lost. Reboot the system to recover this GPU';
const UNREACHABLE_3: UnreachableListedGpu = { busId: '00000000:04:00.0', said: SAID, listed: { index: 3, uuid: 'GPU-3', name: 'NVIDIA H200' } };
const CANNOT_REACH_3 = `the GPU driver cannot reach GPU 3 (GPU-3, NVIDIA H200, PCI 00000000:04:00.0): it says "${SAID}"`;
const UNREACHABLE_MEANING =
  "the GPU driver cannot get a handle on that GPU (it has fallen off the bus, hung, or lost power), so nothing can compute on it; and while the driver's queries fail, this node's other shards cannot be verified either once the last good snapshot is older than max-stale.";
const FIX_ELSEWHERE = FIX.replace('on GPUs that are listed', 'on other GPUs');

t.test('a GPU nvidia-smi says it cannot reach: gpu-lost on the stale view, in its words, before starting and on-cpu', async (t) => {
  const s = shard({ gpuUuids: ['GPU-3'] });
  const stale = view([gpu(0, []), gpu(3, [[100, 9000]])], [procStat(100)], [s], []);
  const judge = (shard: ShardRecord, node: NodeView, engine: EngineAccount | null = null) =>
    readiness({ shard, node, engine, enginePosted: engine !== null, staleReason: null, now: NOW, unreachable: [UNREACHABLE_3] });
  t.same(judge(s, stale), {
    ready: false,
    state: 'gpu-lost',
    cause: 'gpu-unreachable',
    reason: `placed on GPU 3, but ${CANNOT_REACH_3}: ${UNREACHABLE_MEANING} This shard cannot serve as placed. ${FIX_ELSEWHERE}`,
    warnings: [],
  });
  t.equal(verdictOf(s, stale).state, 'ready', 'without the failure, the same view is ready');
  t.same(judge(s, stale, CPU_ENGINE).warnings, [`the engine output posted says it computes on the CPU (${CPU_ENGINE.summary}): once it has GPUs again, it reads on-cpu`]);
  const stopped = judge(s, view([gpu(0, []), gpu(3, [[100, 9000]])], [procStat(100, 'T')], [s], []));
  t.same([stopped.state, stopped.warnings], ['stopped', [`${CANNOT_REACH_3}: once it runs again, it reads gpu-lost`]]);

  const byIndex = shard();
  t.equal(judge(byIndex, stale).cause, 'gpu-unreachable', 'a registration without UUIDs is matched by the index the listing gave the GPU');
  const otherDevice = shard({ gpuUuids: ['GPU-9'] });
  t.equal(judge(otherDevice, view([gpu(3, [[100, 9000]])], [procStat(100)], [otherDevice], [])).state, 'gpu-lost', "GPU-9 is not listed: that decides, not GPU 3's failure");
  t.equal(judge(otherDevice, view([gpu(3, [[100, 9000]])], [procStat(100)], [otherDevice], [])).cause, 'gpu-not-listed');
  const onGpu4 = shard({ gpus: [4], gpuUuids: ['GPU-4'] });
  t.same(judge(onGpu4, view([gpu(3, []), gpu(4, [[100, 9000]])], [procStat(100)], [onGpu4], [])).state, 'ready', 'a shard on a GPU nvidia-smi can reach is judged as before');

  const both = shard({ gpus: [3, 5], gpuUuids: ['GPU-3', 'GPU-5'] });
  const lost5: LostGpu = { ...LOST_3, index: 5, uuid: 'GPU-5' };
  const mixed = judge(both, view([gpu(3, [[100, 9000]])], [procStat(100)], [both], [lost5]));
  t.equal(mixed.cause, 'gpu-not-listed', 'a GPU gone from the listing names the cause');
  t.equal(
    mixed.reason,
    'placed on GPU 3 and GPU 5, but GPU 5 (GPU-5, NVIDIA H200) is no longer listed by the GPU driver (missing since 2026-12-02T11:59:05.000Z): ' +
      'it fell off the bus, was reset or was detached. Its memory is no longer in /gpus or /metrics, and shards placed on it cannot hold it. ' +
      `Also, ${CANNOT_REACH_3}: ${UNREACHABLE_MEANING} This shard cannot serve as placed. ${FIX}`,
    'each GPU with what its own state means',
  );
  const lostThenUnreachable = shard({ gpuUuids: ['GPU-3'] });
  const once = judge(lostThenUnreachable, view([gpu(0, [])], [procStat(100)], [lostThenUnreachable], [LOST_3]));
  t.same([once.cause, once.reason!.split('GPU-3').length - 1], ['gpu-not-listed', 1], 'a GPU the listing lost and the GPU driver cannot reach is said once, as not listed');
  const byIndexOnce = judge(shard(), view([gpu(0, [])], [procStat(100)], [shard()], [LOST_3]));
  t.same([byIndexOnce.cause, byIndexOnce.reason!.split('GPU-3').length - 1], ['gpu-not-listed', 1], 'and so for a registration without UUIDs, by index');
});

t.test('past max-stale (no view): gpu-lost from /proc and the last listing, after an exit and a stop', async (t) => {
  const s = shard({ gpuUuids: ['GPU-3'] });
  const judge = (liveness: Liveness, extra: Partial<ReadinessInput> = {}) =>
    readiness({ shard: s, node: null, unavailable: `nvidia-smi exited with code 15 and said: "${SAID}"`, liveness, engine: null, staleReason: null, now: NOW, unreachable: [UNREACHABLE_3], ...extra });
  t.same(judge({ state: 'alive' }), { ready: false, state: 'gpu-lost', cause: 'gpu-unreachable', reason: `placed on GPU 3, but ${CANNOT_REACH_3}: ${UNREACHABLE_MEANING} This shard cannot serve as placed. ${FIX_ELSEWHERE}`, warnings: [] });
  t.equal(judge({ state: 'gone', why: 'no such process' }).state, 'exited');
  const stopped = judge({ state: 'stopped', why: 'process 100 is stopped' });
  t.same([stopped.state, stopped.warnings.slice(1)], ['stopped', [`${CANNOT_REACH_3}: once it runs again, it reads gpu-lost`]]);
  t.same(
    judge({ state: 'stopped', why: 'process 100 is stopped' }, { engine: CPU_ENGINE, enginePosted: true }).warnings.slice(1),
    [`${CANNOT_REACH_3}: once it runs again, it reads gpu-lost`, `the engine output posted says it computes on the CPU (${CPU_ENGINE.summary}): once it has GPUs again, it reads on-cpu`],
    'stopped on a GPU the GPU driver cannot reach: the engine counts once it has GPUs again, not once it runs',
  );
  t.same(judge({ state: 'unreadable', why: 'its stat could not be read' }).warnings, ['its stat could not be read'], 'whether it runs is unknown, and said');
  t.same(judge({ state: 'alive' }, { engine: CPU_ENGINE, enginePosted: true }).warnings, [`the engine output posted says it computes on the CPU (${CPU_ENGINE.summary}): once it has GPUs again, it reads on-cpu`]);
  const pod = shard({ gpuUuids: ['GPU-3'], cgroup: 'pod-a' });
  const earlier = readiness({ shard: pod, node: null, liveness: { state: 'alive', oldestStart: 50 }, engine: CPU_ENGINE, engineTicks: 10, enginePosted: true, staleReason: null, now: NOW, unreachable: [UNREACHABLE_3] });
  t.same([earlier.state, earlier.warnings.length], ['gpu-lost', 1], "an earlier run's output is set aside, and said");
  t.match(earlier.warnings[0], /came, at least in part, from an earlier run/);
  t.equal(judge({ state: 'alive' }, { unreachable: [{ ...UNREACHABLE_3, listed: null }] }).state, 'unverified', 'a bus id no listing had names no GPU of the shard');
});
