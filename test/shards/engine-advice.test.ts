// What the reasons tell an operator to check, per engine: llama.cpp's flags and libraries for
// llama.cpp only; Ollama's num_gpu and start-up log, vLLM's --cpu-offload-gb and platform line.
import t from 'tap';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import { askedLayersAdvice } from '../../src/shards/engine-advice.js';
import { ENGINES, type Engine } from '../../src/shards/shard.js';
import { readiness } from '../../src/shards/readiness.js';
import { gpuState as gpu } from '../helpers/gpu-state.js';
import { handMadeView, NO_GPU_ENGINE, procStat, shardRecord } from '../helpers/hand-made-view.js';

const NOW = 1_000_000;
const LLAMA_CPP_TERMS = /-ngl|ldd|libggml|LLAMA_ARG/;

/** A shard of `engine`, past its grace, holding nothing on its GPU 0; the engine's own account as given. */
function holdingNothing(engine: Engine, account: EngineAccount | null = null) {
  const shard = shardRecord(NOW, { engine });
  const node = handMadeView({ now: NOW, gpus: [gpu(0, [])], stats: [procStat(100)] }, [shard]);
  return readiness({ shard, node, engine: account, enginePosted: account !== null, staleReason: null, now: NOW });
}

t.test('no GPU memory and nothing posted: how to see that the build found a GPU, in its own terms', async (t) => {
  const reasons = Object.fromEntries(ENGINES.filter((e) => e !== 'ollama').map((e) => [e, holdingNothing(e).reason ?? '']));
  t.match(reasons['llama.cpp'], /ldd libggml-cuda\.so/);
  t.match(reasons.vllm, /Automatically detected platform cuda/);
  t.match(reasons.other, /build has CUDA, CUDA_VISIBLE_DEVICES/);
  for (const engine of ['vllm', 'other']) t.notMatch(reasons[engine], LLAMA_CPP_TERMS, engine);
  for (const engine of Object.keys(reasons)) t.match(holdingNothing(engine as Engine).cause, 'no-gpu-memory');
});

t.test("Ollama's own account: its start-up log and num_gpu, never -ngl", async (t) => {
  // As parseLlamaLog reads ollama-log_2025-12_0.13.5_inference-compute-cpu.txt.
  const line = 'time=2025-12-29T16:48:22.901+08:00 level=INFO source=types.go:60 msg="inference compute" id=cpu library=cpu';
  const noGpu: EngineAccount = { ...NO_GPU_ENGINE, evidence: line, summary: `Ollama found no usable GPU (${line})` };
  const failed = holdingNothing('ollama', noGpu);
  t.match(failed, { state: 'on-cpu', cause: 'engine-gpu-backend-failed' });
  t.match(failed.reason, /"inference compute" with library=cpu/);
  const unsaid = holdingNothing('ollama', { ...noGpu, gpuBackendLoaded: null });
  t.match(unsaid, { cause: 'engine-reports-cpu' });
  t.match(unsaid.reason, /did not load, or it put no layers on the GPU\. .*library=cpu.*num_gpu/);
  for (const verdict of [failed, unsaid]) t.notMatch(verdict.reason, LLAMA_CPP_TERMS);
});

t.test("the GPU layers a command line asks for, in its engine's terms", async (t) => {
  const advice = (engine: Engine, gpuLayers: string | null, noneOnGpu = true, modelLayers: number | null = null) =>
    askedLayersAdvice(engine, { gpuLayers, modelLayers }, noneOnGpu);
  t.match(advice('llama.cpp', null), /^Its command line sets no -ngl .*b4748.*Start it with -ngl/, 'llama.cpp unsaid, none on the GPU: its old default');
  t.match(advice('llama.cpp', null, false), /^Start it with -ngl/, 'unsaid with some on the GPU: the default was not none');
  t.match(advice('llama.cpp', '0'), /^Its command line asks for no GPU layers \(-ngl 0\)\. Start it with -ngl/);
  const all = advice('llama.cpp', 'all');
  t.match(all, /asks for every layer \(-ngl all\), so -ngl is not what kept them off: .*free memory.*-ot/, 'every layer asked: the rest of the advice');
  t.notMatch(all, /Start it with -ngl/, 'not told to ask for what it asks for');
  t.match(advice('llama.cpp', 'all', false), /so -ngl is not what kept them off/, 'every layer, some on the CPU');
  t.match(advice('llama.cpp', '2'), /^Its command line asks for -ngl 2\. Start it with -ngl .* at or above/, "a count: maybe below its layers (2 of 32 reads as none)");
  t.match(advice('llama.cpp', 'auto'), /^Its command line asks for -ngl auto\. Start it with -ngl/);
  t.equal(advice('vllm', null), advice('vllm', null, false), 'unsaid for another engine: its own advice alone');
  t.match(advice('other', '24'), /^Its command line asks for -ngl 24\. Check how many layers/);
  t.match(advice('ollama', '0'), /^Ollama started its runner with no GPU layers: num_gpu 0 was asked/);
  t.match(advice('ollama', '20'), /^Ollama started its runner with 20 layers on the GPU \(num_gpu, or what it estimated/);
  t.match(advice('ollama', null), /^Ollama offloads as many layers/);
});

t.test("the layers asked against the model's own (its GGUF header's block_count and the output layer)", async (t) => {
  const advice = (engine: Engine, gpuLayers: string | null, modelLayers: number | null, noneOnGpu = false) =>
    askedLayersAdvice(engine, { gpuLayers, modelLayers }, noneOnGpu);
  const fewer = advice('llama.cpp', '20', 33);
  t.match(fewer, /^Its command line asks for -ngl 20 \(20 of the model's 33 layers\): llama\.cpp keeps the other 13 \(the output layer among them\) on the CPU, as asked\./, 'a count below them: -ngl is the cause');
  t.match(fewer, /Start it with -ngl 33 \(or all\)/, 'told the count that puts every layer on the GPU');
  const few = advice('llama.cpp', '2', 33, true);
  t.match(few, /-ngl 2 \(2 of the model's 33 layers\).*other 31/, 'a few layers read as none on the GPU: the count says why');
  t.match(few, /\(2 of 33 layers hold too little to tell from a CUDA context/, 'too few to show: not the build');
  t.notMatch(few, /the build has CUDA/);
  t.match(advice('llama.cpp', '10', 33, true), /With none of the 10 asked for on its GPUs, check too that the build has CUDA/, 'a share that should show: the build too');
  t.notMatch(fewer, /With none/, 'some on the GPU: the count alone');
  for (const every of ['33', '99']) {
    const said = advice('llama.cpp', every, 33);
    t.match(said, new RegExp(`asks for every layer \\(-ngl ${every}; the model has 33\\), so -ngl is not what kept them off`), `-ngl ${every}: every layer`);
    t.notMatch(said, /Start it with -ngl/);
  }
  t.match(advice('llama.cpp', '32', 33), /keeps the output layer on the CPU, as asked/, 'one below: the output layer stays on the CPU');
  t.match(advice('llama.cpp', '0', 33), /^Its command line asks for no GPU layers \(-ngl 0\)\. Start it with -ngl 33 \(or all; /, '-ngl 0: told the count');
  t.match(advice('llama.cpp', 'auto', 33), /^Its command line asks for -ngl auto\. Start it with -ngl 33 /, 'auto: said as is, with the count');
  t.match(advice('llama.cpp', null, 33, true), /b4748.*Start it with -ngl 33 /, 'unsaid: the count too');
  t.match(advice('llama.cpp', 'all', 33), /every layer \(-ngl all; the model has 33\)/);
  t.match(advice('other', '24', 33), /^Its command line asks for -ngl 24 \(24 of the model's 33 layers\)\. Check how many layers/);
  t.match(advice('ollama', '20', 33), /^Ollama started its runner with 20 of the model's 33 layers on the GPU \(num_gpu, or what it estimated/);
  t.match(advice('ollama', '33', 33), /^Ollama started its runner with every one of the model's 33 layers on the GPU, so num_gpu is not what kept them off: check the free and foreign memory/);
  t.notMatch(advice('ollama', '20', 33), LLAMA_CPP_TERMS, "in Ollama's terms still");
});
