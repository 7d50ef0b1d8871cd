// Where a shard's weights are, with a real llama.cpp: node-llama-cpp's prebuilt CPU build (pinned
// 3.21.1, from the npm registry) loads, in a child process, a llama model the test writes (test/helpers/gguf.ts:
// 2 GiB of zeros in a sparse file, loaded in seconds). The fake nvidia-smi lists that child with each
// case's GPU memory, as a CUDA build with no layers on the GPU would be listed; the service reads the
// child's real /proc/PID/maps and cmdline. What real llama.cpp shows: it maps the file, unmaps the
// header before the first tensor, and keeps every CPU tensor mapped.
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { writeLlamaModel } from '../helpers/gguf.js';
import { LLAMA_CPP_LOADER, modelDir, shardHeldBy, startLoader } from '../helpers/model-loaders.js';

const BIG = { embedding: 2048, feedForward: 8192, layers: 8, heads: 16 };
const SMALL = { embedding: 512, feedForward: 1024, layers: 4, heads: 8 };

t.test('llama.cpp on the CPU with a CUDA context held: its model mapped in host memory, on-cpu', async (t) => {
  const model = join(modelDir(t), 'llama-2g.gguf');
  const bytes = writeLlamaModel(model, BIG);
  t.ok(bytes > 2 * 2 ** 30, 'a 2 GiB model');
  const { pid, said } = await startLoader(t, process.execPath, [LLAMA_CPP_LOADER, '-m', model, '-ngl', '3']);

  const zero = await shardHeldBy(t, pid, 310);
  const { weights } = (await zero.get('/shards/s/compute')).json();
  t.match(weights, { offload: 'none', bytes, judgedBy: 'gpu-memory', gpuShare: 0, gpuLayers: '3', modelLayers: BIG.layers + 1 });
  t.match(said, `layers=${BIG.layers + 1}`, "the layers node-llama-cpp's own GGUF reader counts");
  t.match(weights.files, [{ layers: BIG.layers + 1 }]);
  t.same(weights.files.map((file: { path: string; seenIn: string }) => [file.path, file.seenIn]), [[model, 'mapping']]);
  t.ok(weights.hostBytes < bytes && weights.hostBytes > bytes * 0.99, `all but its header stays mapped (${weights.hostBytes} of ${bytes})`);
  const ready = (await zero.get('/shards/s/ready')).json();
  t.match(ready, { state: 'on-cpu', cause: 'weights-in-host-memory' });
  t.match(ready.reason, 'llama-2g.gguf (2.0 GiB)');
  t.match(ready.reason, /-ngl 3 \(3 of the model's 9 layers\): llama\.cpp keeps the other 6 \(the output layer among them\) on the CPU/);

  // About half the weights' size beyond a context: a partial offload serves, with a warning.
  const partial = await shardHeldBy(t, pid, 2048);
  const served = (await partial.get('/shards/s/ready')).json();
  t.match(served, { state: 'ready', cause: 'partial-offload' });
  t.match(served.warnings.join(), /about 50% of its model's weights/);

  // The same mapping with the weights' size on the GPU: an engine that kept its mapping, no alarm.
  const held = await shardHeldBy(t, pid, 3200);
  t.match((await held.get('/shards/s/ready')).json(), { state: 'ready', cause: null });
  t.match((await held.get('/shards/s/compute')).json().weights, { offload: 'full', judgedBy: 'gpu-memory' });

  // Deleted after loading: still mapped, "(deleted)" in maps, its size no longer known.
  rmSync(model);
  const deleted = await shardHeldBy(t, pid, 310);
  t.match((await deleted.get('/shards/s/compute')).json().weights, { offload: 'none', bytes: null, files: [{ path: model, deleted: true }] });
  t.match((await deleted.get('/shards/s/ready')).json(), { state: 'on-cpu', cause: 'weights-in-host-memory' });
});

t.test('llama.cpp with --no-mmap: nothing mapped, the model named by -m on its command line', async (t) => {
  const model = join(modelDir(t), 'llama-small.gguf');
  const bytes = writeLlamaModel(model, SMALL);
  const { pid } = await startLoader(t, process.execPath, [LLAMA_CPP_LOADER, '-m', model, '--no-mmap']);
  t.ok(bytes < 310 * 2 ** 20, 'a model smaller than a CUDA context');
  const { get } = await shardHeldBy(t, pid, 310);
  const { weights } = (await get('/shards/s/compute')).json();
  t.match(weights, { bytes, hostBytes: null, files: [{ path: model, seenIn: 'command-line', mappedBytes: null, layers: SMALL.layers + 1 }], modelLayers: SMALL.layers + 1 });
  // Nothing mapped and no more than a context held: the memory could be a context, or the whole model.
  t.match(weights, { offload: 'unknown', note: /as much as its whole model/ });
  t.match((await get('/shards/s/ready')).json(), { state: 'ready', cause: null }, 'no alarm on what cannot be told');
});
