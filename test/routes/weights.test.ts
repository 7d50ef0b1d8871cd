// Where a shard's weights are, read from the real /proc of a real process that loads a model as
// llama.cpp's loader does (test/fixtures/engines/model-loader.py maps the GGUF file and unmaps what a
// GPU took), with the fake nvidia-smi listing that process with each case's GPU memory. The model is a
// sparse GGUF file: 4 GiB that cost no disk. Cases: zero, partial and full offload, --no-mmap (the
// model named on the command line), a file deleted after loading, and a process with no model.
import { readFileSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { spawnShardProcess } from '../helpers/app.js';
import { MAPPING_LOADER, modelDir, shardHeldBy as shardOn, startLoader } from '../helpers/model-loaders.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const MODEL_BYTES = 4 * GiB;

/** A GGUF file of `bytes`: the magic and version 3, then a hole. */
function writeModel(t: Test, name = 'model-q4.gguf', bytes = MODEL_BYTES): string {
  const path = join(modelDir(t), name);
  writeFileSync(path, Buffer.from([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0]));
  truncateSync(path, bytes);
  return path;
}

/** The stand-in loader, mapping `model` as llama.cpp would. */
const load = (t: Test, model: string, ...flags: string[]) => startLoader(t, 'python3', [MAPPING_LOADER, '-m', model, ...flags]).then(({ pid }) => pid);

t.test('zero offload: a CUDA context on the GPU, the model mapped whole in host memory: on-cpu with a cause of its own', async (t) => {
  const model = writeModel(t);
  const pid = await load(t, model);
  const { get } = await shardOn(t, pid, 420);
  const ready = await get('/shards/s/ready');
  t.equal(ready.statusCode, 503);
  t.match(ready.json(), { state: 'on-cpu', cause: 'weights-in-host-memory' });
  t.match(ready.json().reason, model, 'the reason names the model file');
  t.match(ready.json().reason, /GPU 0: 420 MiB, no more than a CUDA context/);
  t.match(ready.json().reason, /\(4\.0 GiB\) stays in host memory \(4\.0 GiB of it mapped\)\. Its command line sets no -ngl.*Start it with -ngl/);
  const { weights } = (await get('/shards/s/compute')).json();
  t.match(weights, { offload: 'none', bytes: MODEL_BYTES, hostBytes: MODEL_BYTES, gpuBytes: 0, gpuShare: 0, judgedBy: 'gpu-memory', gpuLayers: null });
  t.same(weights.files, [{ path: model, deleted: false, bytes: MODEL_BYTES, mappedBytes: MODEL_BYTES, seenIn: 'mapping', layers: null }]);

  const metrics = (await get('/metrics')).body;
  t.match(metrics, /^nodecompute_shard_weights_bytes\{shard="s",where="host"\} 4294967296$/m);
  t.match(metrics, /^nodecompute_shard_weights_gpu_ratio\{shard="s"\} 0$/m);
  const text = (await get('/?format=text')).body;
  t.match(text, /WEIGHTS/);
  t.match(text, /4\.0 GiB, 0% on GPU, 4\.0 GiB in host memory/);
});

t.test('the GPU layers its command line asks for: in the reason and the answer', async (t) => {
  const model = writeModel(t);
  const none = await shardOn(t, await load(t, model, '-ngl', '0'), 420);
  t.match((await none.get('/shards/s/ready')).json(), { cause: 'weights-in-host-memory', reason: /asks for no GPU layers \(-ngl 0\)/ });
  t.equal((await none.get('/shards/s/compute')).json().weights.gpuLayers, '0');
  const some = await shardOn(t, await load(t, model, '--n-gpu-layers', '20'), 3072);
  t.match((await some.get('/shards/s/ready')).json(), { cause: 'partial-offload', warnings: [/asks for -ngl 20\./] });
  t.equal((await some.get('/shards/s/compute')).json().weights.gpuLayers, '20');
});

t.test('within its grace, the same shard is starting (awaiting-gpu-weights): a load may be under way', async (t) => {
  const pid = await load(t, writeModel(t));
  const { get } = await shardOn(t, pid, 420, { graceMs: 60_000 });
  const ready = (await get('/shards/s/ready')).json();
  t.match(ready, { state: 'starting', cause: 'awaiting-gpu-weights' });
  t.match(ready.reason, /grace left/);
});

t.test('partial offload: ready with a cause and a warning; below the share a registration asks, on-cpu', async (t) => {
  const model = writeModel(t);
  const pid = await load(t, model);
  // 1 GiB of context and buffers, 2 GiB of weights: half the model.
  const { get } = await shardOn(t, pid, 3072);
  const ready = await get('/shards/s/ready');
  t.equal(ready.statusCode, 200);
  t.match(ready.json(), { state: 'ready', cause: 'partial-offload' });
  t.match(ready.json().warnings.join(), /about 50% of its model's weights \(2\.0 GiB of 4\.0 GiB\)/);
  t.match((await get('/shards/s/compute')).json().weights, { offload: 'partial', gpuBytes: 2 * GiB, gpuShare: 0.5 });
  const html = (await get('/?format=html')).body;
  t.match(html, /· weights 4\.0 GiB, 50% on GPU/);

  const strict = await shardOn(t, pid, 3072, { minGpuWeightsShare: 0.8 });
  const refused = (await strict.get('/shards/s/ready')).json();
  t.match(refused, { state: 'on-cpu', cause: 'partial-offload-below-minimum' });
  t.match(refused.reason, /50%.*80%.*minGpuWeightsShare/);
  t.equal((await strict.get('/shards/s')).json().minGpuWeightsShare, 0.8);
  t.equal(JSON.parse(readFileSync(strict.config.stateFile, 'utf8')).shards[0].minGpuWeightsShare, 0.8, 'persisted with the registration');
});

t.test('full offload: the loader unmapped all but the input embeddings: ready, no alarm', async (t) => {
  const model = writeModel(t);
  // What stays on the CPU: the token embeddings, the file's first 80 MiB after its header.
  const pid = await load(t, model, '--keep', `${1 * MiB}:${81 * MiB}`);
  const { get } = await shardOn(t, pid, 5000);
  const ready = (await get('/shards/s/ready')).json();
  t.match(ready, { state: 'ready', cause: null, warnings: [] });
  const { weights } = (await get('/shards/s/compute')).json();
  t.match(weights, { offload: 'full', judgedBy: 'mapping', bytes: MODEL_BYTES, hostBytes: 80 * MiB, gpuShare: 0.98 });
  t.match(weights.note, /unmapped all but 80 MiB of 4\.0 GiB/);
  t.match((await get('/?format=text')).body, /4\.0 GiB, 98% on GPU, 80 MiB in host memory/);
});

t.test('--no-mmap: no mapping, the model named on the command line, judged by GPU memory', async (t) => {
  const model = writeModel(t);
  const pid = await load(t, model, '--no-mmap');
  const zero = await shardOn(t, pid, 420);
  const { weights } = (await zero.get('/shards/s/compute')).json();
  t.match(weights, { offload: 'none', hostBytes: null, bytes: MODEL_BYTES });
  t.same(weights.files.map((file: { seenIn: string }) => file.seenIn), ['command-line']);
  t.match(weights.note, /not mapped/);
  t.match((await zero.get('/shards/s/ready')).json(), { state: 'on-cpu', cause: 'weights-in-host-memory' });
  const text = (await zero.get('/?format=text')).body;
  t.match(text, /4\.0 GiB, 0% on GPU /, 'nothing mapped: no host-memory figure beside the share');
  t.notMatch(text, /on GPU, [\d.]+ [GM]iB in host memory/);

  const full = await shardOn(t, pid, 6000);
  t.match((await full.get('/shards/s/compute')).json().weights, { offload: 'full', judgedBy: 'gpu-memory', gpuShare: 1 });
  t.match((await full.get('/shards/s/ready')).json(), { state: 'ready', cause: null });
});

t.test('a model file deleted after loading: still seen by its name, its size unknown', async (t) => {
  const model = writeModel(t);
  const pid = await load(t, model, '--delete');
  const { get } = await shardOn(t, pid, 420);
  const { weights } = (await get('/shards/s/compute')).json();
  t.match(weights, { offload: 'none', bytes: null, hostBytes: MODEL_BYTES, gpuShare: 0 });
  t.match(weights.files, [{ path: model, deleted: true, bytes: null }]);
  const ready = (await get('/shards/s/ready')).json();
  t.match(ready, { state: 'on-cpu', cause: 'weights-in-host-memory' });
  t.match(ready.reason, /size unknown, deleted/);
  t.notMatch((await get('/metrics')).body, /where="total"/, 'no total where the size is not known');
  t.match((await get('/?format=text')).body, /size unknown, 0% on GPU/);
});

t.test("memory nvidia-smi does not report ([N/A]): the share is unknown, and no verdict rests on it", async (t) => {
  const pid = await load(t, writeModel(t));
  const { get } = await shardOn(t, pid, '[N/A]');
  t.match((await get('/shards/s/compute')).json().weights, { offload: 'unknown', gpuShare: null, gpuBytes: null });
  t.match((await get('/shards/s/ready')).json(), { state: 'ready', cause: null });
  t.match((await get('/?format=text')).body, /4\.0 GiB, share on GPU unknown/);
});

t.test('no model in view (a process with none, as vLLM): not seen, judged as before, no alarm', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { get } = await shardOn(t, shard.members[0]!, 420);
  // The fake lists the child, and the shard registers the child's PID: a process with no model mapped.
  const { weights } = (await get('/shards/s/compute')).json();
  t.match(weights, { offload: 'not-seen', files: [], gpuShare: null, judgedBy: null });
  t.match(weights.note, /no GGUF model file/);
  t.match((await get('/shards/s/ready')).json(), { state: 'ready', cause: null });
  t.notMatch((await get('/metrics')).body, /^nodecompute_shard_weights\w*\{/m);
});

t.test('a file mapped that is not GGUF, however large, is no model', async (t) => {
  const other = writeModel(t, 'data.bin');
  writeFileSync(other, Buffer.from('not a model'));
  truncateSync(other, 64 * MiB);
  const pid = await load(t, other);
  const { get } = await shardOn(t, pid, 420);
  t.match((await get('/shards/s/compute')).json().weights, { offload: 'not-seen' });
});
