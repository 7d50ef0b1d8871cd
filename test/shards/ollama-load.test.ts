// An Ollama shard's verdict through its load cycle, over hand-made views: idle only while it holds no
// GPU memory, loading only within the grace from its runner's start, the GPU memory's verdict where
// the runners are unknown, and the engine's own word first. Real processes: test/routes/ollama.test.ts.
import t from 'tap';
import { readiness } from '../../src/shards/readiness.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { LastLoad } from '../../src/node-state/ollama-loads.js';
import type { ModelFile } from '../../src/system/model-files.js';
import type { ModelRunner } from '../../src/system/model-runners.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { handMadeView, NO_GPU_ENGINE, procStat, shardRecord, type HandMadeNode } from '../helpers/hand-made-view.js';

const NOW = 1_000_000;
/** Given GPU 0, grace 10 s, registered a minute ago. */
const ollama = shardRecord(NOW, { engine: 'ollama' });
const runner = (startedAt: number | null): ModelRunner => ({ pid: 101, model: '/root/.ollama/models/blobs/sha256-ab', startedAt });

/** The verdict of `shard` on a node of GPUs 0 and 1 where `shard`'s runners are `runners` (left out: unknown). */
function judge(runners: ModelRunner[] | undefined, node: Partial<HandMadeNode> = {}, shard: ShardRecord = ollama, evidenceAt = NOW) {
  const key = shard.cgroup ?? shard.identity.pid;
  const view = handMadeView(
    { now: NOW, gpus: [gpu(0, []), gpu(1, [])], stats: [procStat(100)], ...(runners === undefined ? {} : { modelRunners: [[key, runners]] }), ...node },
    [shard],
  );
  return readiness({ shard, node: view, engine: null, staleReason: null, now: NOW, evidenceAt });
}

t.test('no runner: ready while it holds no GPU memory, whatever the grace', async (t) => {
  t.match(judge([]), { ready: true, state: 'ready', cause: 'no-model-loaded', reason: null });
  const young = shardRecord(NOW, { engine: 'ollama', registeredAt: NOW - 1000 });
  t.match(judge([], {}, young), { state: 'ready', cause: 'no-model-loaded' }, 'within the grace too');
  const cgroup = shardRecord(NOW, { engine: 'ollama', pid: null, cgroup: 'pod-1' });
  t.match(judge([], { cgroupPids: [['pod-1', [100]]] }, cgroup), { cause: 'no-model-loaded' }, 'a cgroup shard by its cgroup');
  t.match(judge([], { gpus: [gpu(0, []), gpu(1, [[100, 500]])] }), { state: 'on-cpu', cause: 'memory-on-other-gpu' }, 'memory elsewhere is not idle');
});

t.test('runners unknown: the GPU memory decides, as for any engine', async (t) => {
  t.match(judge(undefined), { state: 'on-cpu', cause: 'no-gpu-memory' }, 'no children files');
  t.match(judge([runner(null)]), { state: 'on-cpu', cause: 'no-gpu-memory' }, 'a runner not dated');
});

t.test("a runner: loading within the grace from its own start, then judged", async (t) => {
  const loading = judge([runner(NOW - 2000)]);
  t.match(loading, { ready: true, state: 'ready', cause: 'model-loading', reason: null });
  t.match(loading.warnings.at(-1), /runner 101 .*2\.0 s ago, within its 10\.0 s grace.*\(no-gpu-memory\)/);
  t.match(judge([runner(NOW - 20_000)], {}, ollama, NOW - 15_000), { cause: 'model-loading' }, 'a listing begun within the grace decides nothing after it');
  const weightsInHost = judge([runner(NOW - 2000)], {
    gpus: [gpu(0, [[101, 300]]), gpu(1, [])],
    stats: [procStat(100), procStat(101)],
    modelFiles: [[101, { files: [{ path: '/m.gguf', deleted: false, bytes: 4 * 2 ** 30, mappedBytes: 4 * 2 ** 30, seenIn: 'mapping', layers: null }], unreadable: null }]],
  });
  t.match(weightsInHost, { cause: 'model-loading' }, 'its weights on the way to the GPU');
  t.match(weightsInHost.warnings.at(-1), /\(weights-in-host-memory\)/);

  const late = judge([runner(NOW - 20_000), { ...runner(NOW - 1000), pid: 102 }]);
  t.match(late, { ready: false, state: 'on-cpu', cause: 'no-gpu-memory' }, 'the oldest runner past its grace');
  t.match(late.reason, /runner 101 \(--model \/root\/\.ollama\/models\/blobs\/sha256-ab\), 102 .* started 20\.0 s ago \(its grace of 10\.0 s counts from there\)\.$/);
  const young = shardRecord(NOW, { engine: 'ollama', registeredAt: NOW - 1000 });
  t.match(judge([runner(NOW - 20_000)], {}, young), { state: 'starting', cause: 'awaiting-gpu-memory' }, "the shard's own grace still runs");
});

t.test("the engine's own word comes first", async (t) => {
  const view = handMadeView({ now: NOW, gpus: [gpu(0, [])], stats: [procStat(100)], modelRunners: [[100, []]] }, [ollama]);
  const verdict = readiness({ shard: ollama, node: view, engine: NO_GPU_ENGINE, staleReason: null, now: NOW });
  t.match(verdict, { state: 'on-cpu', cause: 'engine-gpu-backend-failed' }, 'its last load said CPU: idle or not, it is on the CPU');
});

t.test('a model on one of its GPUs: judged there, as Ollama places a model that fits one', async (t) => {
  const both = shardRecord(NOW, { engine: 'ollama', gpus: [0, 1] });
  const onGpu0 = (mib: number, files: HandMadeNode['modelFiles'] = []): Partial<HandMadeNode> => ({
    gpus: [gpu(0, [[101, mib]]), gpu(1, [])],
    stats: [procStat(100), procStat(101)],
    modelFiles: files,
  });
  const served = judge([runner(NOW - 60_000)], onGpu0(9000), both);
  t.match(served, { ready: true, state: 'ready', cause: null });
  t.match(served.warnings.at(-1), /holds memory on GPU 0, none on GPU 1.*OLLAMA_SCHED_SPREAD=1/);
  t.match(judge(undefined, onGpu0(9000), both), { state: 'ready', cause: null }, 'with its runners unknown too');
  const model = (mib: number) => onGpu0(mib, [[101, { files: [{ path: '/m.gguf', deleted: false, bytes: 4 * 2 ** 30, mappedBytes: 4 * 2 ** 30, seenIn: 'mapping', layers: null }], unreadable: null }]]);
  // Ollama spreads a model that does not fit one GPU over all of them: a partial offload on one is not that placement.
  for (const [mib, what] of [[300, 'its weights in host memory'], [3072, 'half its weights there']] as const) {
    const cpu = judge([runner(NOW - 60_000)], model(mib), both);
    t.match(cpu, { state: 'on-cpu', cause: 'no-gpu-memory' }, `${what}: judged on both GPUs`);
    t.match(cpu.reason, /no memory on GPU 1.*runner 101 .*started 60\.0 s ago/);
  }
  t.match(judge([runner(NOW - 1000)], model(300), both), { state: 'ready', cause: 'model-loading' }, 'or loading still');
});

t.test("advice in Ollama's terms: num_gpu and free GPU memory, not -ngl", async (t) => {
  const modelOf = (mib: number): Partial<HandMadeNode> => ({
    gpus: [gpu(0, [[101, mib]]), gpu(1, [])],
    stats: [procStat(100), procStat(101)],
    modelFiles: [[101, { files: [{ path: '/m.gguf', deleted: false, bytes: 4 * 2 ** 30, mappedBytes: 4 * 2 ** 30, seenIn: 'mapping', layers: null }], unreadable: null }]],
  });
  const zero = judge([runner(NOW - 60_000)], modelOf(300));
  t.match(zero, { state: 'on-cpu', cause: 'weights-in-host-memory' });
  t.match(zero.reason, /num_gpu/);
  t.notMatch(zero.reason, /-ngl/);
  const partial = judge([runner(NOW - 60_000)], modelOf(3072));
  t.match(partial, { state: 'ready', cause: 'partial-offload' });
  t.match(partial.warnings.at(-1), /num_gpu.*more GPUs/);
  const asks = shardRecord(NOW, { engine: 'ollama', minGpuWeightsShare: 0.9 });
  t.match(judge([runner(NOW - 60_000)], modelOf(3072), asks).reason, /minGpuWeightsShare.*num_gpu/);

  const noLayers = { ...NO_GPU_ENGINE, gpuBackendLoaded: true };
  for (const mib of [null, 300]) {
    const node = handMadeView({ now: NOW, gpus: [gpu(0, mib === null ? [] : [[100, mib]])], stats: [procStat(100)] }, [ollama]);
    const verdict = readiness({ shard: ollama, node, engine: noLayers, staleReason: null, now: NOW });
    t.match(verdict, { state: 'on-cpu', cause: 'engine-no-gpu-layers' });
    t.match(verdict.reason, /put no layers on the GPU\. Ollama offloads .*num_gpu/, mib === null ? 'holding nothing' : 'holding a context');
  }
});

t.test('idle after a load that ran past the grace without GPU memory: on-cpu, until room or a GPU load', async (t) => {
  const cpuLoad = (over: Partial<LastLoad> = {}): LastLoad => ({
    runner: runner(NOW - 120_000),
    seenAt: NOW - 100_000,
    onGpu: null,
    freeMiB: new Map([['GPU-0', 5000]]),
    server: { pid: 100, startTime: 5 },
    ...over,
  });
  /** GPU 0 with `free` MiB free now; no runner and no GPU memory; `load` the last one. */
  const idle = (load: LastLoad | undefined, free: number | null = 5000, shard = ollama) =>
    judge(
      [],
      {
        gpus: [{ ...gpu(0, []), freeMiB: free }, gpu(1, [])],
        ...(shard.cgroup === null ? {} : { cgroupPids: [[shard.cgroup, [100]]] }),
        ...(load === undefined ? {} : { lastLoads: [[shard.cgroup ?? shard.identity.pid, load]] }),
      },
      shard,
    );

  const stuck = idle(cpuLoad());
  t.match(stuck, { ready: false, state: 'on-cpu', cause: 'last-load-on-cpu' });
  t.match(stuck.reason, /last model runner 101 \(--model \/root\/\.ollama\/models\/blobs\/sha256-ab\) ran 20\.0 s, past the shard's grace of 10\.0 s, without holding GPU memory/);
  t.match(stuck.reason, /Ollama restarts.*1\.0 GiB.*"inference compute" with library=cpu.*num_gpu/);
  t.match(idle(cpuLoad(), 6023), { cause: 'last-load-on-cpu' }, 'less than 1 GiB more free: no room for a model');
  t.match(idle(cpuLoad(), 6024), { state: 'ready', cause: 'no-model-loaded' }, '1 GiB more free: room');

  t.match(idle(undefined), { state: 'ready', cause: 'no-model-loaded' }, 'no load seen yet');
  const mapped: ModelFile = { path: '/m.gguf', deleted: false, bytes: 4 * 2 ** 30, mappedBytes: 4 * 2 ** 30, seenIn: 'mapping', layers: null };
  const freeBoth = new Map([['GPU-0', 5000], ['GPU-1', gpu(1, []).freeMiB]]);
  const held = (usedMiB: Array<[string, number | null]>, files = [mapped]) => cpuLoad({ onGpu: { usedMiB: new Map(usedMiB), files }, freeMiB: freeBoth });
  t.match(idle(held([['GPU-0', 4400]])), { state: 'ready', cause: 'no-model-loaded' }, 'the last load put its weights on the GPU');
  const both = shardRecord(NOW, { engine: 'ollama', gpus: [0, 1] });
  t.match(idle(held([['GPU-0', 300], ['GPU-1', 2800]]), 5000, both), { state: 'ready', cause: 'no-model-loaded' }, 'some of them on the second of its GPUs');
  t.match(idle(held([['GPU-0', 300], ['GPU-1', 300]]), 5000, both), { state: 'on-cpu', cause: 'last-load-on-cpu' }, 'a context on each of its GPUs');
  t.match(idle(held([['GPU-0', 300], ['GPU-1', 2800]])), { cause: 'last-load-on-cpu' }, 'weights on a GPU not its own count for none of its');
  t.match(idle(held([['GPU-1', 4400]])), { state: 'ready', cause: 'no-model-loaded' }, 'on another GPU only: computed on a GPU, if not its own');
  t.match(idle(held([['GPU-0', 300]], [])), { state: 'ready', cause: 'no-model-loaded' }, 'GPU memory, its model files not seen: nothing says host memory');
  t.match(idle(held([['GPU-0', null]])), { state: 'ready', cause: 'no-model-loaded' }, 'GPU memory not reported');
  const small: ModelFile = { path: '/s.gguf', deleted: false, bytes: 400 * 2 ** 20, mappedBytes: null, seenIn: 'command-line', layers: null };
  t.match(idle(held([['GPU-0', 900]], [small])), { state: 'ready', cause: 'no-model-loaded' }, 'a model no larger than the memory held, not mapped: may be all there');
  t.match(idle(held([['GPU-0', 900]], [{ ...small, mappedBytes: small.bytes, seenIn: 'mapping', layers: null }])), { cause: 'last-load-on-cpu' }, 'mapped whole: the loader kept it in host memory');
  const asked = idle(cpuLoad({ runner: { ...runner(NOW - 120_000), gpuLayers: '0' } }));
  t.match(asked, { cause: 'last-load-on-cpu', reason: /started its runner with no GPU layers: num_gpu 0 was asked/ }, 'its runner asked for no GPU layers');
  t.notMatch(asked.reason, /one request's options, runs a load/, 'said once');
  const fewer = cpuLoad({ runner: { ...runner(NOW - 120_000), gpuLayers: '3' }, onGpu: { usedMiB: new Map([['GPU-0', 300]]), files: [{ ...mapped, layers: 33 }] } });
  t.match(idle(fewer), { cause: 'last-load-on-cpu', reason: /started its runner with 3 of the model's 33 layers on the GPU/ }, "the layers asked against the model's");
  const context = idle(held([['GPU-0', 300]]));
  t.match(context, { state: 'on-cpu', cause: 'last-load-on-cpu' }, 'a CUDA context alone, its model in host memory');
  t.match(context.reason, /ran 20\.0 s, past .* with no more than a CUDA context and buffers on its GPUs \(.*hold 300 MiB/);
  t.match(idle(cpuLoad({ seenAt: NOW - 115_000 })), { state: 'ready', cause: 'no-model-loaded' }, 'it exited within the grace: not seen computing on the CPU');
  t.match(idle(cpuLoad({ runner: { ...runner(null) } })), { cause: 'no-model-loaded' }, 'its start unknown');
  t.match(idle(cpuLoad(), null), { cause: 'no-model-loaded' }, 'free memory now unknown: as before');
  t.match(idle(cpuLoad({ freeMiB: new Map([['GPU-9', 5000]]) })), { cause: 'no-model-loaded' }, 'its GPU not in the listings that saw the load');
  const room = idle(cpuLoad(), 7048);
  t.match(room, { state: 'ready', cause: 'no-model-loaded' }, '2 GiB more free since: Ollama may place the next load on the GPU');
  t.match(room.warnings.at(-1), /without holding GPU memory, and has exited; its GPUs have 2\.0 GiB more free memory since/);
  const cgroup = shardRecord(NOW, { engine: 'ollama', pid: null, cgroup: 'pod-1' });
  t.match(idle(cpuLoad(), 5000, cgroup), { cause: 'last-load-on-cpu' }, 'a cgroup shard, by its cgroup');
});
