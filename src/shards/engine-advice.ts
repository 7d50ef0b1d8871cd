// Owns what a reason tells the operator to check, in the shard's engine's own terms: how it puts
// layers on the GPU, what the GPU layers its command line asks for say against the model's layers,
// and how to see that its build found one. One entry per engine, so no reason tells an Ollama or
// vLLM operator about llama.cpp's -ngl, nor tells one who asked for every layer to ask for them.
import type { Engine } from './shard.js';
import { NONE_SHARE, type Asked } from './weights.js';

const RUNTIME = "CUDA_VISIBLE_DEVICES and the container's GPU runtime, or run `nodecompute doctor`";

interface Advice {
  /** How to get more of the model onto the GPU, as a sentence. */
  layers: string;
  /** How to see that the build found a GPU, as a sentence. */
  build: string;
  /** With weights in host memory, what the layers asked say, then what to check (`layers` where nothing else); `noneOnGpu`: zero offload. */
  asked(asked: Asked, noneOnGpu: boolean, layers: string): string;
}

const asksNone = (gpuLayers: string): boolean => /^0+$/.test(gpuLayers);
const countOf = (gpuLayers: string): number | null => (/^\d+$/.test(gpuLayers) ? Number(gpuLayers) : null);

/** Whether the layers asked are all of the model's: `all`, or a count at or above them. */
function asksEvery(gpuLayers: string, modelLayers: number | null): boolean {
  const count = countOf(gpuLayers);
  return gpuLayers === 'all' || (count !== null && modelLayers !== null && count >= modelLayers);
}

/** "20 of the model's 33", "every one of the model's 33", or the value alone when either is not a number. */
function ofModel(gpuLayers: string, modelLayers: number | null): string {
  const count = countOf(gpuLayers);
  if (count === null || modelLayers === null) return gpuLayers;
  return `${count >= modelLayers ? 'every one' : count} of the model's ${modelLayers}`;
}

/** "-ngl 20 (20 of the model's 33 layers)", or "-ngl 20" where the model's layers are not known. */
function ngl(gpuLayers: string, modelLayers: number | null): string {
  const of = ofModel(gpuLayers, modelLayers);
  return of === gpuLayers ? `-ngl ${gpuLayers}` : `-ngl ${gpuLayers} (${of} layers)`;
}

/** Any engine that takes -ngl: the value said, then the advice. */
const saidAsIs = ({ gpuLayers, modelLayers }: Asked, _noneOnGpu: boolean, layers: string): string =>
  gpuLayers === null ? layers : `Its command line asks for ${asksNone(gpuLayers) ? 'no GPU layers (-ngl 0)' : ngl(gpuLayers, modelLayers)}. ${layers}`;

/** llama.cpp's advice on layers, with the count that puts every one on the GPU where the model's layers are known. */
const llamaLayers = (modelLayers: number | null): string =>
  `Start it with -ngl ${modelLayers === null ? "(LLAMA_ARG_N_GPU_LAYERS) at or above the model's layers" : `${modelLayers} (or all; LLAMA_ARG_N_GPU_LAYERS)`}, ` +
  'check that the model fits the GPU\'s free memory (GET /gpus), and that the build has CUDA (its log\'s "offloaded N/M layers").';

/**
 * A count below the model's layers: the cause itself. With none on the GPU, a share of layers that should show there
 * says the build may have found no GPU too; a few layers may not show beside a CUDA context (weights.ts's zero rule).
 */
function fewerLayers(gpuLayers: string, count: number, modelLayers: number, noneOnGpu: boolean): string {
  const kept = modelLayers - count === 1 ? 'the output layer' : `the other ${modelLayers - count} (the output layer among them)`;
  const fewer =
    `Its command line asks for ${ngl(gpuLayers, modelLayers)}: llama.cpp keeps ${kept} on the CPU, as asked. ` +
    `Start it with -ngl ${modelLayers} (or all) if the model fits its GPUs' free memory (GET /gpus).`;
  if (!noneOnGpu) return fewer;
  if (count / modelLayers <= NONE_SHARE) return `${fewer} (${count} of ${modelLayers} layers hold too little to tell from a CUDA context on its GPUs.)`;
  return `${fewer} With none of the ${count} asked for on its GPUs, check too that the build has CUDA (its log's "offloaded N/M layers").`;
}

const ADVICE: Record<Engine, Advice> = {
  'llama.cpp': {
    layers: llamaLayers(null),
    build: `Check the engine's build (ldd libggml-cuda.so), ${RUNTIME}.`,
    // No -ngl before llama.cpp's auto default put no layers on a CUDA GPU (b4748, February 2025: 0, 999 on Metal only).
    // Its layers advice names the model's count where known, so the generic one passed in is not used.
    asked: (asked, noneOnGpu) => {
      const { gpuLayers, modelLayers } = asked;
      const layers = llamaLayers(modelLayers);
      if (gpuLayers === null) {
        const before = 'Its command line sets no -ngl (nor LLAMA_ARG_N_GPU_LAYERS): llama.cpp builds before its auto default (b4748, February 2025, for one) then put no layers on a CUDA GPU.';
        return noneOnGpu ? `${before} ${layers}` : layers;
      }
      if (asksEvery(gpuLayers, modelLayers)) {
        return (
          `Its command line asks for every layer (-ngl ${gpuLayers}${modelLayers === null ? '' : `; the model has ${modelLayers}`}), so -ngl is not what kept them off: ` +
          "check the GPU's free memory (GET /gpus), " +
          'tensors kept on the CPU (-ot, --cpu-moe), and that the build has CUDA (its log\'s "offloaded N/M layers").'
        );
      }
      const count = countOf(gpuLayers);
      if (count === null || count === 0 || modelLayers === null) return saidAsIs(asked, noneOnGpu, layers);
      return fewerLayers(gpuLayers, count, modelLayers, noneOnGpu);
    },
  },
  // Ollama offloads what the GPU's free memory holds, unless the model's num_gpu says fewer; no -ngl of its own to set.
  ollama: {
    layers:
      "Ollama offloads as many layers as the GPU's free memory holds, unless num_gpu (a Modelfile PARAMETER or a request option) sets fewer: " +
      'check the free and foreign memory on its GPUs (GET /gpus), and num_gpu.',
    build: `Check Ollama's log at start ("inference compute" with library=cpu: it found no GPU), ${RUNTIME}.`,
    // Ollama passes its runner the layers only for num_gpu 0 or a count (--n-gpu-layers to 0.11.4, -ngl to its llama-server).
    asked: (asked, _noneOnGpu, layers) => {
      const { gpuLayers, modelLayers } = asked;
      if (gpuLayers === null) return layers;
      if (asksNone(gpuLayers)) return `Ollama started its runner with no GPU layers: num_gpu 0 was asked, in the model's Modelfile or a request's options. ${layers}`;
      const started = `Ollama started its runner with ${ofModel(gpuLayers, modelLayers)} layers on the GPU`;
      if (asksEvery(gpuLayers, modelLayers)) return `${started}, so num_gpu is not what kept them off: check the free and foreign memory on its GPUs (GET /gpus) and its log's "offloaded N/M layers".`;
      return `${started} (num_gpu, or what it estimated the GPU's free memory holds). ${layers}`;
    },
  },
  // vLLM's CUDA build stops rather than fall back; weights stay on the host only as --cpu-offload-gb asks.
  vllm: {
    layers:
      'vLLM keeps weights in host memory only as --cpu-offload-gb asks (GiB per GPU): lower it if the GPU has free memory (GET /gpus).',
    build: `Check that it is vLLM's CUDA build (its log's "Automatically detected platform cuda.", not cpu), ${RUNTIME}.`,
    asked: saidAsIs,
  },
  other: {
    layers: "Check how many layers the engine put on the GPU, that the model fits the GPU's free memory (GET /gpus), and that its build has CUDA.",
    build: `Check that the engine's build has CUDA, ${RUNTIME}.`,
    asked: saidAsIs,
  },
};

/** What to check when its weights stay in host memory, or it computes on the CPU with a GPU idle. */
export const layersAdvice = (engine: Engine): string => ADVICE[engine].layers;

/** layersAdvice, with what the GPU layers its command line asks for say first; `noneOnGpu`: zero offload. */
export const askedLayersAdvice = (engine: Engine, asked: Asked, noneOnGpu: boolean): string => ADVICE[engine].asked(asked, noneOnGpu, ADVICE[engine].layers);

/** What to check when its GPU backend did not load. */
export const buildAdvice = (engine: Engine): string => ADVICE[engine].build;
