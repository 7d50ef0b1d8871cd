// Every verdict carries the machine-readable cause of its decision: one case per code, over
// hand-made views, and every code of VERDICT_CAUSES is reached by some case (a code no decision
// gives, or a decision given a code of another state, fails here). The prose of each reason is
// tested where its decision is (readiness, gpu-lost, stopped tests); here only the pairing.
import t from 'tap';
import type { NodeView } from '../../src/node-state/node-view.js';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import { readiness, type ReadinessInput } from '../../src/shards/readiness.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import { VERDICT_CAUSES, type ReadinessState, type VerdictCause } from '../../src/shards/verdict.js';
import type { ModelRunner } from '../../src/system/model-runners.js';
import type { UnreadableStat } from '../../src/system/procfs.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { handMadeView, NO_GPU_ENGINE, procStat, shardRecord } from '../helpers/hand-made-view.js';

const NOW = 1_000_000;
/** A PID above Linux's largest pid_max (2^22): listed by nvidia-smi, never present in /proc. */
const INVISIBLE_PID = 4_194_305;
const EMFILE = (pid: number): UnreadableStat => ({ pid, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: 'Raise nofile.' });

const engineSaysCpu = (gpuBackendLoaded: boolean | null): EngineAccount => ({ ...NO_GPU_ENGINE, gpuBackendLoaded });
const WEIGHTS_ON_CUDA0: EngineAccount = {
  backend: 'CUDA',
  devices: ['CUDA0'],
  layersOffloaded: 33,
  layersTotal: 33,
  gpuBackendLoaded: true,
  evidence: 'load_tensors: CUDA0 model buffer size = 4403.49 MiB',
  summary: 'llama.cpp put its model buffers on CUDA0',
};

const s = shardRecord(NOW);
const young = shardRecord(NOW, { registeredAt: NOW - 1000 });
const idle = (shards: ShardRecord[] = [s]): NodeView => handMadeView({ now: NOW, gpus: [gpu(0, []), gpu(1, [])], stats: [procStat(100)] }, shards);

interface Case {
  name: string;
  input: Partial<ReadinessInput> & { node: NodeView | null };
  state: ReadinessState;
  cause: VerdictCause | null;
}

/** Its GPU held with `mib`, its 4 GiB model mapped whole: 300 MiB is zero offload, 3 GiB half. */
const mapped = (mib: number, shard = s): NodeView =>
  handMadeView(
    {
      now: NOW,
      gpus: [gpu(0, [[100, mib]])],
      stats: [procStat(100)],
      modelFiles: [[100, { files: [{ path: '/m.gguf', deleted: false, bytes: 4 * 2 ** 30, mappedBytes: 4 * 2 ** 30, seenIn: 'mapping', layers: null }], unreadable: null }]],
    },
    [shard],
  );
const asksHalf = shardRecord(NOW, { minGpuWeightsShare: 0.6 });
const ollama = shardRecord(NOW, { engine: 'ollama' });
const ollamaRuns = (runners: ModelRunner[]): NodeView =>
  handMadeView({ now: NOW, gpus: [gpu(0, [])], stats: [procStat(100)], modelRunners: [[100, runners]] }, [ollama]);

const cases: Case[] = [
  { name: 'holds its GPU', input: { node: handMadeView({ now: NOW, gpus: [gpu(0, [[100, 9000]])], stats: [procStat(100)] }, [s]) }, state: 'ready', cause: null },
  { name: 'holds its GPU, half its weights there', input: { node: mapped(3072) }, state: 'ready', cause: 'partial-offload' },
  { name: 'Ollama runs no model and holds no GPU memory', input: { shard: ollama, node: ollamaRuns([]) }, state: 'ready', cause: 'no-model-loaded' },
  {
    name: "Ollama runs no model, its last runner past its grace without GPU memory",
    input: {
      shard: ollama,
      node: handMadeView(
        {
          now: NOW,
          gpus: [gpu(0, [])],
          stats: [procStat(100)],
          modelRunners: [[100, []]],
          lastLoads: [[100, { runner: { pid: 101, model: '/blobs/sha256-ab', startedAt: NOW - 60_000 }, seenAt: NOW - 30_000, onGpu: null, freeMiB: new Map([['GPU-0', 1]]), server: { pid: 100, startTime: 5 } }]],
        },
        [ollama],
      ),
    },
    state: 'on-cpu',
    cause: 'last-load-on-cpu',
  },
  {
    name: "Ollama's runner holds no GPU memory yet, within its grace",
    input: { shard: ollama, node: ollamaRuns([{ pid: 101, model: '/blobs/sha256-ab', startedAt: NOW - 1000 }]) },
    state: 'ready',
    cause: 'model-loading',
  },
  { name: 'holds its GPU, its weights in host memory, within its grace', input: { shard: young, node: mapped(300, young) }, state: 'starting', cause: 'awaiting-gpu-weights' },
  { name: 'holds its GPU, its weights in host memory, grace over', input: { node: mapped(300) }, state: 'on-cpu', cause: 'weights-in-host-memory' },
  { name: 'holds its GPU, less of its weights there than it asks', input: { shard: asksHalf, node: mapped(3072, asksHalf) }, state: 'on-cpu', cause: 'partial-offload-below-minimum' },
  { name: 'registered since the snapshot, within its grace', input: { shard: young, node: idle([]) }, state: 'starting', cause: 'awaiting-snapshot' },
  { name: 'registered since the snapshot, grace over', input: { node: idle([]) }, state: 'unverified', cause: 'not-in-snapshot' },
  { name: 'not holding its GPU yet, within its grace', input: { shard: young, node: idle([young]) }, state: 'starting', cause: 'awaiting-gpu-memory' },
  { name: 'grace over, the listing begun before it ended', input: { node: idle(), evidenceAt: s.registeredAt + 5000 }, state: 'starting', cause: 'awaiting-listing' },
  { name: 'the engine says CPU, its GPU backend failed', input: { node: idle(), engine: engineSaysCpu(false) }, state: 'on-cpu', cause: 'engine-gpu-backend-failed' },
  { name: 'the engine says CPU, its GPU backend loaded', input: { node: idle(), engine: engineSaysCpu(true) }, state: 'on-cpu', cause: 'engine-no-gpu-layers' },
  { name: 'the engine says CPU, not whether its backend loaded', input: { node: idle(), engine: engineSaysCpu(null) }, state: 'on-cpu', cause: 'engine-reports-cpu' },
  { name: 'the engine says CPU, nvidia-smi down', input: { node: null, liveness: { state: 'alive' }, engine: engineSaysCpu(false) }, state: 'on-cpu', cause: 'engine-gpu-backend-failed' },
  {
    name: 'memory on a GPU it was not given, none on its own',
    input: { node: handMadeView({ now: NOW, gpus: [gpu(0, []), gpu(1, [[100, 500]])], stats: [procStat(100)] }, [s]) },
    state: 'on-cpu',
    cause: 'memory-on-other-gpu',
  },
  { name: 'weights on CUDA0 by its output, none by nvidia-smi', input: { node: idle(), engine: WEIGHTS_ON_CUDA0, enginePosted: true }, state: 'on-cpu', cause: 'engine-output-conflicts' },
  { name: 'grace over, nothing held', input: { node: idle() }, state: 'on-cpu', cause: 'no-gpu-memory' },
  { name: 'its GPU no longer listed', input: { node: handMadeView({ now: NOW, gpus: [gpu(1, [])], stats: [procStat(100)] }, [s]) }, state: 'gpu-lost', cause: 'gpu-not-listed' },
  {
    name: 'nvidia-smi fails, saying it cannot reach its GPU',
    input: { node: null, liveness: { state: 'alive' }, unreachable: [{ busId: '00000000:01:00.0', said: 'GPU is lost', listed: { index: 0, uuid: 'GPU-0', name: 'NVIDIA H200' } }] },
    state: 'gpu-lost',
    cause: 'gpu-unreachable',
  },
  { name: 'its process stopped', input: { node: handMadeView({ now: NOW, gpus: [gpu(0, [])], stats: [procStat(100, 'T')] }, [s]) }, state: 'stopped', cause: 'process-stopped' },
  { name: 'its process stopped, nvidia-smi down', input: { node: null, liveness: { state: 'stopped', why: 'process 100 is stopped' } }, state: 'stopped', cause: 'process-stopped' },
  { name: 'its process gone', input: { node: handMadeView({ now: NOW, gpus: [gpu(0, [])], otherAnswers: [[100, null]] }, [s]) }, state: 'exited', cause: 'process-exited' },
  { name: 'its process gone, nvidia-smi down', input: { node: null, liveness: { state: 'gone', why: 'no process 100' } }, state: 'exited', cause: 'process-exited' },
  { name: 'nvidia-smi down', input: { node: null, liveness: { state: 'alive' } }, state: 'unverified', cause: 'nvidia-smi-unavailable' },
  {
    name: 'nvidia-smi down since before the registration, in this run',
    input: { node: null, liveness: { state: 'alive' }, lastGood: null, judgingSince: s.registeredAt },
    state: 'starting',
    cause: 'awaiting-nvidia-smi',
  },
  { name: 'nvidia-smi down, its stat unreadable too', input: { node: null, liveness: { state: 'unreadable', why: 'EMFILE' } }, state: 'unverified', cause: 'nvidia-smi-unavailable' },
  {
    name: "nvidia-smi's processes of another PID namespace",
    input: { node: handMadeView({ now: NOW, gpus: [gpu(0, [[INVISIBLE_PID, 9000]])], stats: [procStat(100)], otherAnswers: [[INVISIBLE_PID, null]] }, [s]) },
    state: 'unverified',
    cause: 'processes-hidden',
  },
  { name: 'its own stat unreadable', input: { node: handMadeView({ now: NOW, gpus: [gpu(0, [])], otherAnswers: [[100, EMFILE(100)]] }, [s]) }, state: 'unverified', cause: 'stat-unreadable' },
  {
    name: 'its GPU holds memory of a process whose stat is unreadable',
    input: { node: handMadeView({ now: NOW, gpus: [gpu(0, [[101, 500]])], stats: [procStat(100)], otherAnswers: [[101, EMFILE(101)]] }, [s]) },
    state: 'unverified',
    cause: 'gpu-owner-unknown',
  },
];

t.test('each decision gives its cause, and its state the one the cause belongs to', async (t) => {
  for (const { name, input, state, cause } of cases) {
    const verdict = readiness({ shard: s, engine: null, staleReason: null, now: NOW, unavailable: 'nvidia-smi timed out', ...input });
    t.same({ state: verdict.state, cause: verdict.cause }, { state, cause }, name);
    t.equal(verdict.reason === null, state === 'ready' || state === 'unverified', `${name}: a reason exactly where the probe fails`);
  }
});

t.test('every cause is given by some decision', async (t) => {
  const given = new Set(cases.map((c) => c.cause).filter((cause) => cause !== null));
  t.same([...VERDICT_CAUSES].filter((cause) => !given.has(cause)), [], 'no code without a case');
});
