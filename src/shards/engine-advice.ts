// Owns what a reason tells the operator to check, in the shard's engine's own terms: how it puts
// layers on the GPU, what the GPU layers its command line asks for say, and how to see that its build
// found one. One entry per engine, so no reason tells an Ollama or vLLM operator about llama.cpp's
// -ngl, nor tells one who asked for every layer to ask for them.
import type { Engine } from './shard.js';

const RUNTIME = "CUDA_VISIBLE_DEVICES and the container's GPU runtime, or run `nodecompute doctor`";

interface Advice {
  /** How to get more of the model onto the GPU, as a sentence. */
  layers: string;
  /** How to see that the build found a GPU, as a sentence. */
  build: string;
  /**
   * With weights in host memory, what the GPU layers its command line asks for say, then what to check (`layers`
   * where nothing else); `noneOnGpu`: zero offload. `gpuLayers`: as written; null when unsaid.
   */
  asked(gpuLayers: string | null, noneOnGpu: boolean, layers: string): string;
}

const asksNone = (gpuLayers: string): boolean => /^0+$/.test(gpuLayers);

/** Any engine that takes -ngl: the value said, then the advice. */
const saidAsIs = (gpuLayers: string | null, _noneOnGpu: boolean, layers: string): string =>
  gpuLayers === null ? layers : `Its command line asks for ${asksNone(gpuLayers) ? 'no GPU layers (-ngl 0)' : `-ngl ${gpuLayers}`}. ${layers}`;

const ADVICE: Record<Engine, Advice> = {
  'llama.cpp': {
    layers:
      "Start it with -ngl (LLAMA_ARG_N_GPU_LAYERS) at or above the model's layers, check that the model fits the GPU's free memory (GET /gpus), " +
      'and that the build has CUDA (its log\'s "offloaded N/M layers").',
    build: `Check the engine's build (ldd libggml-cuda.so), ${RUNTIME}.`,
    // No -ngl before llama.cpp's auto default put no layers on a CUDA GPU (b4748, February 2025: 0, 999 on Metal only).
    asked: (gpuLayers, noneOnGpu, layers) => {
      if (gpuLayers === null) {
        const before = 'Its command line sets no -ngl (nor LLAMA_ARG_N_GPU_LAYERS): llama.cpp builds before its auto default (b4748, February 2025, for one) then put no layers on a CUDA GPU.';
        return noneOnGpu ? `${before} ${layers}` : layers;
      }
      // Only `all` says -ngl kept nothing off: a count may be below the model's layers, which are not known here.
      if (gpuLayers !== 'all') return saidAsIs(gpuLayers, noneOnGpu, layers);
      return (
        "Its command line asks for every layer (-ngl all), so -ngl is not what kept them off: check the GPU's free memory (GET /gpus), " +
        'tensors kept on the CPU (-ot, --cpu-moe), and that the build has CUDA (its log\'s "offloaded N/M layers").'
      );
    },
  },
  // Ollama offloads what the GPU's free memory holds, unless the model's num_gpu says fewer; no -ngl of its own to set.
  ollama: {
    layers:
      "Ollama offloads as many layers as the GPU's free memory holds, unless num_gpu (a Modelfile PARAMETER or a request option) sets fewer: " +
      'check the free and foreign memory on its GPUs (GET /gpus), and num_gpu.',
    build: `Check Ollama's log at start ("inference compute" with library=cpu: it found no GPU), ${RUNTIME}.`,
    // Ollama passes its runner the layers only for num_gpu 0 or a count (--n-gpu-layers to 0.11.4, -ngl to its llama-server).
    asked: (gpuLayers, _noneOnGpu, layers) => {
      if (gpuLayers === null) return layers;
      if (asksNone(gpuLayers)) return `Ollama started its runner with no GPU layers: num_gpu 0 was asked, in the model's Modelfile or a request's options. ${layers}`;
      return `Ollama started its runner with ${gpuLayers} GPU layers (num_gpu, or what it estimated the GPU's free memory holds). ${layers}`;
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

/** layersAdvice, with what the GPU layers its command line asks for (null: unsaid) say first; `noneOnGpu`: zero offload. */
export const askedLayersAdvice = (engine: Engine, gpuLayers: string | null, noneOnGpu: boolean): string => ADVICE[engine].asked(gpuLayers, noneOnGpu, ADVICE[engine].layers);

/** What to check when its GPU backend did not load. */
export const buildAdvice = (engine: Engine): string => ADVICE[engine].build;
