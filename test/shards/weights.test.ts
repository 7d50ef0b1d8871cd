// Where a shard's weights are (shardWeights) and the verdict of a shard that holds its GPUs
// (heldVerdict), on hand-made views: which processes count, files merged across them, the estimate
// when memory is not reported or a file's size unknown, and the grace before a zero offload counts.
import t from 'tap';
import type { ProcessModelFiles, ModelFile } from '../../src/system/model-files.js';
import { readiness } from '../../src/shards/readiness.js';
import { heldVerdict } from '../../src/shards/on-cpu-verdict.js';
import { CONTEXT_ALLOWANCE_BYTES, shardWeights } from '../../src/shards/weights.js';
import { shardCompute } from '../../src/shards/compute.js';
import { gpuState } from '../helpers/gpu-state.js';
import { handMadeView, procStat, shardRecord } from '../helpers/hand-made-view.js';

const NOW = 1_700_000_000_000;
const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

const mapped = (path: string, bytes: number | null, mappedBytes: number): ModelFile => ({ path, deleted: false, bytes, mappedBytes, seenIn: 'mapping', layers: null });
const named = (path: string, bytes: number | null): ModelFile => ({ path, deleted: false, bytes, mappedBytes: null, seenIn: 'command-line', layers: null });
const files = (...list: ModelFile[]): ProcessModelFiles => ({ files: list, unreadable: null });

/** Shard s (PID 100) with GPU process 101 on GPU 0 holding `mib`, and each PID's model files. */
const view = (mib: number | null, modelFiles: Array<[number, ProcessModelFiles]>, shard = shardRecord(NOW)) =>
  handMadeView({ now: NOW, gpus: [gpuState(0, [[101, mib]]), gpuState(1, [])], stats: [procStat(100), procStat(101)], modelFiles }, [shard]);

t.test('the shard process and its GPU processes are read; each file once, the largest mapping kept', async (t) => {
  const shard = shardRecord(NOW);
  const node = view(4096, [
    [100, files(named('/m/a.gguf', 4 * GiB), mapped('/m/b.gguf', 2 * GiB, 2 * GiB))],
    [101, files(mapped('/m/a.gguf', 4 * GiB, 4 * GiB), mapped('/m/b.gguf', 2 * GiB, GiB), named('/m/a.gguf', 4 * GiB))],
    [300, files(mapped('/m/other.gguf', GiB, GiB))],
  ]);
  const weights = shardWeights(shard, node);
  t.same(
    weights.files.map((file) => [file.path, file.seenIn, file.mappedBytes]),
    [
      ['/m/a.gguf', 'mapping', 4 * GiB],
      ['/m/b.gguf', 'mapping', 2 * GiB],
    ],
  );
  t.match(weights, { bytes: 6 * GiB, hostBytes: 6 * GiB, judgedBy: 'gpu-memory', gpuBytes: 3 * GiB, gpuShare: 0.5, offload: 'partial' });

  const unknown = shardRecord(NOW, { id: 'new' });
  t.match(shardWeights(unknown, view(4096, [[100, files(mapped('/m/a.gguf', 4 * GiB, 4 * GiB))]])), { offload: 'none', gpuBytes: 0 }, 'a shard the view does not know yet holds nothing');
  const reused = shardRecord(NOW, { identity: { ...shard.identity, startTime: 77 } });
  t.same(shardWeights(reused, view(4096, [[100, files(mapped('/m/a.gguf', GiB, GiB))]], reused)).offload, 'not-seen', 'a PID now naming another process is not read');
});

t.test('the GPU layers asked: by the process with model files holding the most GPU memory', async (t) => {
  const shard = shardRecord(NOW);
  const asked = (gpuLayers: string, ...list: ModelFile[]): ProcessModelFiles => ({ ...files(...list), gpuLayers });
  // An Ollama running an embedding model with num_gpu 0 (101, a context) beside a chat model (102, on two GPUs).
  const node = handMadeView(
    {
      now: NOW,
      gpus: [gpuState(0, [[101, 300], [102, 3000]]), gpuState(1, [[102, null]])],
      stats: [procStat(100), procStat(101), procStat(102)],
      modelFiles: [
        [100, asked('9')],
        [101, asked('0', { ...named('/m/embed.gguf', 9 * GiB), layers: 13 })],
        [102, asked('20', { ...named('/m/chat.gguf', 8 * GiB), layers: 33 })],
      ],
    },
    [shard],
  );
  t.match(shardWeights(shard, node), { gpuLayers: '20', modelLayers: 33 }, "the layers of that process's own model, not the largest file's");
  t.equal(shardWeights(shard, view(300, [[100, asked('9')], [101, files()]])).gpuLayers, null, 'no process with a model: nothing it applies to');
  t.equal(shardWeights(shard, view(300, [[100, asked('9', named('/m/a.gguf', GiB))], [101, files()]])).gpuLayers, '9', 'the one with a model, holding no GPU memory');
  t.equal(shardWeights(shard, view(300, [[101, files(named('/m/a.gguf', GiB))]])).gpuLayers, null, 'unsaid');
});

t.test('what cannot be judged: memory not reported, maps not readable', async (t) => {
  const shard = shardRecord(NOW);
  t.match(shardWeights(shard, view(null, [[101, files(mapped('/m/a.gguf', 4 * GiB, 4 * GiB))]])), { offload: 'unknown', gpuShare: null, note: /\[N\/A\]/ });
  const denied = { files: [], unreadable: 'nodecompute may not read /proc/101/maps (EACCES)' };
  t.match(shardWeights(shard, view(400, [[101, denied]])), { offload: 'not-seen', note: /EACCES/ });
  const empty = mapped('/m/empty.gguf', 0, 0);
  t.match(shardWeights(shard, view(400, [[101, files({ ...empty, mappedBytes: null, seenIn: 'command-line', layers: null })]])), { offload: 'unknown', gpuShare: null, note: /as much as its whole model/ }, 'an empty file, not mapped: what the GPUs hold could be all of it');
  const small = mapped('/m/small.gguf', 400 * MiB, 400 * MiB);
  t.match(shardWeights(shard, view(900, [[101, files({ ...small, mappedBytes: null, seenIn: 'command-line', layers: null })]])), { offload: 'unknown', note: /900 MiB, as much as its whole model \(400 MiB\)/ }, 'a small model, not mapped');
  t.match(shardWeights(shard, view(900, [[101, files(small)]])), { offload: 'none' }, 'mapped whole: the loader kept it in host memory');
  t.match(shardWeights(shard, view(2000, [[101, files({ ...small, mappedBytes: null, seenIn: 'command-line', layers: null })]])), { offload: 'full' }, 'held beyond the allowance: all of it there');
});

t.test('a deleted file: its weights are what stays mapped and what the GPUs hold beyond a context', async (t) => {
  const deleted = { ...mapped('/m/a.gguf', null, 3 * GiB), deleted: true };
  const weights = shardWeights(shardRecord(NOW), view(1024 + 3072, [[101, files(deleted)]]));
  t.match(weights, { bytes: null, hostBytes: 3 * GiB, gpuBytes: 3 * GiB, gpuShare: 0.5, offload: 'partial' });
  const served = heldVerdict(shardRecord(NOW), view(1024 + 3072, [[101, files(deleted)]]), NOW, NOW, []);
  t.match(served, { state: 'ready', cause: 'partial-offload', warnings: [/about 50% of its model's weights \(3\.0 GiB\) are on its GPUs/] });
  t.equal(CONTEXT_ALLOWANCE_BYTES, GiB);
  const unopened = shardWeights(shardRecord(NOW), view(1024 + 3072, [[101, files(named('/m/a.gguf', null))]]));
  t.match(unopened, { bytes: null, hostBytes: null, gpuShare: null, offload: 'unknown', note: /size of its weights is not known/ }, 'named, not opened, not mapped: no size to judge by');
});

t.test('heldVerdict: zero offload waits out the grace and a listing begun after it; a shard given no GPU is ready', async (t) => {
  const zero: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/a.gguf', 4 * GiB, 4 * GiB))]];
  const shard = shardRecord(NOW, { registeredAt: NOW - 5_000, graceMs: 10_000 });
  t.match(heldVerdict(shard, view(400, zero, shard), NOW, NOW, []), { state: 'starting', cause: 'awaiting-gpu-weights' });
  const over = shardRecord(NOW, { registeredAt: NOW - 20_000, graceMs: 10_000 });
  t.match(heldVerdict(over, view(400, zero, over), NOW - 15_000, NOW, []), { state: 'starting', cause: 'awaiting-listing' });
  t.match(heldVerdict(over, view(400, zero, over), NOW, NOW, ['w']), { state: 'on-cpu', cause: 'weights-in-host-memory', warnings: ['w'] });
  const cpuOnly = shardRecord(NOW, { gpus: [] });
  t.match(heldVerdict(cpuOnly, view(400, zero, cpuOnly), NOW, NOW, []), { state: 'ready', cause: null });
  t.match(readiness({ shard: over, node: view(400, zero, over), staleReason: null, engine: null, now: NOW }), { state: 'on-cpu', cause: 'weights-in-host-memory' });
});

t.test('heldVerdict: a minimum share is met, or not; unknown shares ask nothing', async (t) => {
  const half: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/a.gguf', 4 * GiB, 4 * GiB))]];
  const asks = (share: number) => shardRecord(NOW, { minGpuWeightsShare: share });
  t.match(heldVerdict(asks(0.5), view(3072, half, asks(0.5)), NOW, NOW, []), { state: 'ready', cause: 'partial-offload' });
  t.match(heldVerdict(asks(0.6), view(3072, half, asks(0.6)), NOW, NOW, []), { state: 'on-cpu', cause: 'partial-offload-below-minimum' });
  t.match(heldVerdict(asks(0.6), view(null, half, asks(0.6)), NOW, NOW, []), { state: 'ready', cause: null }, 'memory not reported: no share to hold it to');
  const full: Array<[number, ProcessModelFiles]> = [[101, files(named('/m/a.gguf', 4 * GiB))]];
  t.match(heldVerdict(asks(0.6), view(6000, full, asks(0.6)), NOW, NOW, []), { state: 'ready', cause: null, warnings: [] });
});

t.test('zero offload is a share and a size: a GPU holding more than buffers holds weights, however large the model', async (t) => {
  const big: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/moe.gguf', 100 * GiB, 100 * GiB))]];
  const shard = shardRecord(NOW);
  t.match(shardWeights(shard, view(3 * 1024, big)), { offload: 'none', gpuShare: 0.02 }, '-ngl 0: a context and 2 GiB of buffers');
  t.match(shardWeights(shard, view(3 * 1024 + 100, big)), { offload: 'partial', gpuShare: 0.02 }, 'more: weights');
  // --cpu-moe: attention on the GPU, experts mapped on the host.
  const moe: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/moe.gguf', 380 * GiB, 380 * GiB))]];
  t.match(heldVerdict(shard, view(20 * 1024, moe), NOW, NOW, []), { state: 'ready', cause: 'partial-offload', warnings: [/about 5% /] });
});

t.test('/compute says CPU for every shard on the CPU, though it holds a CUDA context', async (t) => {
  const zero: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/a.gguf', 4 * GiB, 4 * GiB))]];
  const over = shardRecord(NOW, { registeredAt: NOW - 20_000, graceMs: 10_000 });
  const node = view(400, zero, over);
  t.match(readiness({ shard: over, node, staleReason: null, engine: null, now: NOW }), { state: 'on-cpu', cause: 'weights-in-host-memory' });
  t.equal(shardCompute(over, node, null, 'on-cpu').backend, 'CPU', 'weights in host memory');
  const below = shardRecord(NOW, { registeredAt: NOW - 20_000, graceMs: 10_000, minGpuWeightsShare: 0.9 });
  t.equal(shardCompute(below, view(3072, zero, below), null, 'on-cpu').backend, 'CUDA', 'a partial offload below its minimum computes on both: its weights share says how much');
});

t.test('a model in splits is judged by GPU memory against every split: one wholly on a GPU is unmapped whole', async (t) => {
  const splits = (name: (n: number) => string): Array<[number, ProcessModelFiles]> => [
    [101, files(mapped(name(1), 10 * GiB, 9.5 * GiB), mapped(name(3), 10 * GiB, 1.5 * GiB), mapped(name(2), 10 * GiB, 0))],
  ];
  const shard = shardRecord(NOW);
  t.match(shardWeights(shard, view(21 * 1024, splits((n) => `/m/big-0000${n}-of-00003.gguf`))), { offload: 'partial', judgedBy: 'gpu-memory', bytes: 30 * GiB, gpuShare: 0.67 });
  t.match(shardWeights(shard, view(21 * 1024, splits((n) => `/m/part${n}.gguf`))), { offload: 'full', judgedBy: 'mapping' }, 'whole files: a shrunk mapping is a full offload');
});

t.test('judged by the mapping, a minimum share is met by the mapping or the GPU memory: the embeddings always stay on the CPU', async (t) => {
  // The real 29/29-layer load of test/fixtures/samples/llamacpp-lv5_load_tensors_plus_nvsmi-compute-apps.txt:
  // CPU_Mapped 157.37 MiB (token embeddings) beside CUDA0's 603.87 MiB, 6010 MiB held on the GPU.
  const small: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/small.gguf', 761 * MiB, 157 * MiB))]];
  const asks = shardRecord(NOW, { minGpuWeightsShare: 0.8 });
  t.match(shardWeights(asks, view(6010, small, asks)), { offload: 'full', judgedBy: 'mapping', gpuShare: 0.79 });
  t.match(heldVerdict(asks, view(6010, small, asks), NOW, NOW, []), { state: 'ready', cause: null }, 'its GPU memory holds it all');
  // One split of one: a whole file, judged by its mapping.
  const single: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/small-00001-of-00001.gguf', 761 * MiB, 157 * MiB))]];
  t.match(shardWeights(asks, view(6010, single, asks)), { offload: 'full', judgedBy: 'mapping' });
  // -ot "blk\.[0-9]\.=CPU": the first layers stay on the CPU beside the embeddings, a small mapping too.
  const kept: Array<[number, ProcessModelFiles]> = [[101, files(mapped('/m/big.gguf', 10 * GiB, 4 * GiB))]];
  t.match(heldVerdict(asks, view(7 * 1024, kept, asks), NOW, NOW, []), { state: 'on-cpu', cause: 'partial-offload-below-minimum' }, 'nor does its GPU memory: below');
  t.match(heldVerdict(asks, view(null, kept, asks), NOW, NOW, []), { state: 'ready' }, 'memory not reported: nothing contradicts the mapping');
});

t.test("the model's layers: of the largest model whose header says, and in the reasons against the layers asked", async (t) => {
  const layered = (file: ModelFile, layers: number | null): ModelFile => ({ ...file, layers });
  const asked = (gpuLayers: string, ...list: ModelFile[]): ProcessModelFiles => ({ ...files(...list), gpuLayers });
  // A model in two splits (the header in the first) with a draft model beside it (-md) and a projector with no count.
  // The first split holds the header and no tensors (gguf-split --no-tensor-first-split): the model counts all its splits.
  const all = [
    layered(mapped('/m/big-00001-of-00002.gguf', 10 * MiB, 10 * MiB), 81),
    layered(mapped('/m/big-00002-of-00002.gguf', 6 * GiB, 6 * GiB), null),
    layered(mapped('/m/draft.gguf', 2 * GiB, 2 * GiB), 25),
    layered(mapped('/m/mmproj.gguf', 9 * GiB, 9 * GiB), null),
  ];
  const shard = shardRecord(NOW);
  t.match(shardWeights(shard, view(4096, [[101, asked('20', ...all)]])), { gpuLayers: '20', modelLayers: 81 });
  const unsized = layered(named('/m/x.gguf', null), 33);
  const sized = layered(named('/m/y.gguf', GiB), 12);
  for (const order of [[unsized, sized], [sized, unsized]]) t.match(shardWeights(shard, view(4096, [[101, files(...order)]])), { modelLayers: 12 }, 'a size unknown counts as none');
  t.match(shardWeights(shard, view(4096, [[101, files(mapped('/m/a.gguf', GiB, GiB))]])), { modelLayers: null }, 'no header says');
  t.match(shardWeights(shard, view(4096, [])), { offload: 'not-seen', modelLayers: null });

  const over = shardRecord(NOW, { registeredAt: NOW - 20_000, graceMs: 10_000 });
  const zero = view(400, [[101, asked('2', layered(mapped('/m/a.gguf', 4 * GiB, 4 * GiB), 33))]], over);
  t.match(heldVerdict(over, zero, NOW, NOW, []), { state: 'on-cpu', cause: 'weights-in-host-memory', reason: /-ngl 2 \(2 of the model's 33 layers\).*other 31 \(the output layer among them\) on the CPU.*-ngl 33/ });
  const partial = view(3072, [[101, asked('99', layered(mapped('/m/a.gguf', 4 * GiB, 4 * GiB), 33))]], over);
  t.match(heldVerdict(over, partial, NOW, NOW, []), { state: 'ready', cause: 'partial-offload', warnings: [/every layer \(-ngl 99; the model has 33\), so -ngl is not/] });
});
