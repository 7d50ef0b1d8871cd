// Owns what a reason tells the operator to check, in the shard's engine's own terms: how it puts
// layers on the GPU, and how to see that its build found one. One entry per engine, so no reason
// tells an Ollama or vLLM operator about llama.cpp's -ngl.
import type { Engine } from './shard.js';

const RUNTIME = "CUDA_VISIBLE_DEVICES and the container's GPU runtime, or run `nodecompute doctor`";

interface Advice {
  /** How to get more of the model onto the GPU, as a sentence. */
  layers: string;
  /** How to see that the build found a GPU, as a sentence. */
  build: string;
}

const ADVICE: Record<Engine, Advice> = {
  'llama.cpp': {
    layers:
      "Start it with -ngl (LLAMA_ARG_N_GPU_LAYERS) at or above the model's layers, check that the model fits the GPU's free memory (GET /gpus), " +
      'and that the build has CUDA (its log\'s "offloaded N/M layers").',
    build: `Check the engine's build (ldd libggml-cuda.so), ${RUNTIME}.`,
  },
  // Ollama sets no -ngl: it offloads what the GPU's free memory holds, unless the model's num_gpu says fewer.
  ollama: {
    layers:
      "Ollama offloads as many layers as the GPU's free memory holds, unless num_gpu (a Modelfile PARAMETER or a request option) sets fewer: " +
      'check the free and foreign memory on its GPUs (GET /gpus), and num_gpu.',
    build: `Check Ollama's log at start ("inference compute" with library=cpu: it found no GPU), ${RUNTIME}.`,
  },
  // vLLM's CUDA build stops rather than fall back; weights stay on the host only as --cpu-offload-gb asks.
  vllm: {
    layers:
      'vLLM keeps weights in host memory only as --cpu-offload-gb asks (GiB per GPU): lower it if the GPU has free memory (GET /gpus).',
    build: `Check that it is vLLM's CUDA build (its log's "Automatically detected platform cuda.", not cpu), ${RUNTIME}.`,
  },
  other: {
    layers: "Check how many layers the engine put on the GPU, that the model fits the GPU's free memory (GET /gpus), and that its build has CUDA.",
    build: `Check that the engine's build has CUDA, ${RUNTIME}.`,
  },
};

/**
 * What the GPU layers its command line asks for (ShardWeights.gpuLayers) say of weights in host memory, as a
 * sentence; '' where nothing worth saying. Unsaid matters for llama.cpp with none on the GPU: its default was no
 * layers on a CUDA GPU (b4748, February 2025, and before) until it became auto. Ollama passes -ngl 0 to its runner
 * only when num_gpu 0 is asked (--n-gpu-layers to 0.11.4; -ngl since it runs llama-server).
 */
export function askedLayers(engine: Engine, gpuLayers: string | null, noneOnGpu: boolean): string {
  if (gpuLayers === null) {
    return engine === 'llama.cpp' && noneOnGpu
      ? 'Its command line sets no -ngl (nor LLAMA_ARG_N_GPU_LAYERS): llama.cpp builds up to early 2025 then put no layers on a CUDA GPU (current ones default to auto).'
      : '';
  }
  const none = /^0+$/.test(gpuLayers);
  if (engine === 'ollama') {
    return none
      ? "Ollama started its runner with -ngl 0: num_gpu 0 was asked, in the model's Modelfile or a request's options."
      : `Ollama started its runner with -ngl ${gpuLayers} (num_gpu, or what it estimated the GPU's free memory holds).`;
  }
  return none ? 'Its command line asks for no GPU layers (-ngl 0).' : `Its command line asks for -ngl ${gpuLayers}.`;
}

/** What to check when its weights stay in host memory, or it computes on the CPU with a GPU idle. */
export const layersAdvice = (engine: Engine): string => ADVICE[engine].layers;

/** What to check when its GPU backend did not load. */
export const buildAdvice = (engine: Engine): string => ADVICE[engine].build;
