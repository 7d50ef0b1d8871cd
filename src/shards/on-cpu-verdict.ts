// Owns the on-cpu verdict and its reason: the engine's own CPU account decides it with or without
// nvidia-smi; otherwise grace is over with a given GPU not held, and the reason follows what else is
// known (memory on a GPU it was not given, output showing weights on a GPU, output saying nothing).
import { formatDuration } from '../duration.js';
import type { NodeView } from '../node-state/node-view.js';
import { deviceLabel } from './compute.js';
import type { EngineAccount } from './llama-account.js';
import { showsGpuWeights } from './llama-log.js';
import type { ShardRecord } from './shard.js';
import { andList, gpuList, verdict, type Readiness } from './verdict.js';

const ON_CPU_ADVICE =
  "Check the engine's build and libraries (ldd on libggml-cuda.so for llama.cpp), CUDA_VISIBLE_DEVICES and the container's GPU runtime, or run `nodecompute doctor` on this node.";

const GPU_LAYERS_ADVICE =
  'start it with its model layers on the GPU (llama.cpp: -ngl / --n-gpu-layers, or LLAMA_ARG_N_GPU_LAYERS; a number at least the model\'s layer count puts them all there).';

/** Why there is no engine account to judge by: nothing posted, output that says nothing, or an earlier run's output set aside. */
export type NoAccount = 'not-posted' | 'silent' | 'earlier-run';

export function engineSaysCpu(engine: EngineAccount | null): engine is EngineAccount {
  return engine !== null && engine.backend === 'CPU';
}

/** The on-cpu verdict the engine's own account decides; `node` null while nvidia-smi cannot be asked. */
export function engineCpuVerdict(shard: ShardRecord, engine: EngineAccount, node: NodeView | null, warnings: string[]): Readiness {
  const loaded = engine.gpuBackendLoaded;
  const cause = loaded === true ? 'engine-no-gpu-layers' : loaded === false ? 'engine-gpu-backend-failed' : 'engine-reports-cpu';
  return verdict('on-cpu', cause, engineCpuReason(shard, engine, node), warnings);
}

function placedOnCpu(shard: ShardRecord): string {
  return `placed on ${gpuList(shard.gpus)} but computing on the CPU`;
}

function engineCpuAdvice(loaded: boolean | null): string {
  if (loaded === true) return `Its GPU backend loaded, but no model layers were put on the GPU: ${GPU_LAYERS_ADVICE}`;
  if (loaded === false) return `Its GPU backend did not load. ${ON_CPU_ADVICE}`;
  return `Either its GPU backend did not load or it was started without GPU layers (-ngl / --n-gpu-layers). ${ON_CPU_ADVICE}`;
}

/** The memory the shard's processes hold on the GPUs it was given, as device labels; empty without a node view. */
function heldOnGiven(shard: ShardRecord, node: NodeView | null): string[] {
  const holdings = node?.attribution.holdings.get(shard.id);
  if (holdings === undefined) return [];
  return [...holdings.values()]
    .filter((holding) => shard.gpus.includes(holding.index))
    .sort((a, b) => a.index - b.index)
    .map(deviceLabel);
}

/**
 * A run whose GPU backend loaded holds its CUDA context and buffers on the GPU with no layer there, so memory held is no proof
 * against a CPU account; but held by an engine that found no usable GPU, it makes the output another run's.
 */
function engineCpuReason(shard: ShardRecord, engine: EngineAccount, node: NodeView | null): string {
  const says = `${placedOnCpu(shard)}: the engine itself reports it. ${engine.summary}.`;
  const held = heldOnGiven(shard, node);
  const post = `/shards/${shard.id}/engine-output`;
  if (held.length === 0) return `${says} ${engineCpuAdvice(engine.gpuBackendLoaded)}`;
  const holding = `nvidia-smi lists its processes holding ${held.join(', ')}`;
  if (engine.gpuBackendLoaded === false) {
    return (
      `${says} Yet ${holding}, which an engine that found no usable GPU cannot hold: the output posted is most likely another run's (or another engine's). ` +
      `Post this run's output (llama.cpp at -lv 4) to ${post}: the verdict follows the latest run in it. GET /gpus shows which of the shard's processes hold that memory.`
    );
  }
  return (
    `${says} ${holding}: a run without GPU layers holds its CUDA context and compute buffers there too. ${engineCpuAdvice(true)} ` +
    `If that memory is more than those (the size of the weights), the output posted is another run's: post this run's to ${post}; the verdict follows the latest run in it.`
  );
}

/** GPUs the shard's processes hold memory on without having been given them, in index order. */
export function strayGpus(shard: ShardRecord, node: NodeView): number[] {
  const holdings = node.attribution.holdings.get(shard.id);
  return [...(holdings?.keys() ?? [])].filter((index) => !shard.gpus.includes(index)).sort((a, b) => a - b);
}

/** The engine's CUDA device names ("CUDA0"), as its account lists them. */
function cudaNames(engine: EngineAccount): string {
  const names = engine.devices.map((device) => device.split(':')[0] as string);
  return names.length === 0 ? 'its CUDA devices' : andList(names);
}

/** How the process computing can lie outside what the shard covers: its PID (and process group), or its cgroup. */
function notCovered(shard: ShardRecord): string {
  return shard.cgroup === null
    ? "a child started in another process group, or the wrong PID registered: register the engine's own PID, or the pod by its cgroup"
    : `a process outside cgroup "${shard.cgroup}": register the pod or container the engine runs in`;
}

function strayReason(shard: ShardRecord, strays: number[], held: string): string {
  return (
    `placed on ${gpuList(shard.gpus)}; it holds memory on ${gpuList(strays)}, which it was not given, and ${held} ` +
    `Its GPU backend loaded (a CUDA context at least) on a GPU it was not given: CUDA_VISIBLE_DEVICES or the container's GPU runtime gives it ${gpuList(strays)}. ` +
    'Check them (CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi by PCI bus; GPU UUIDs avoid the difference), ' +
    'or register the shard with the GPUs it uses.'
  );
}

/** Engine output showing weights on a CUDA device, while nvidia-smi lists none of the shard's memory on its GPUs. */
function conflictReason(shard: ShardRecord, missing: number[], engine: EngineAccount, held: string): string {
  const devices = cudaNames(engine);
  return (
    `placed on ${gpuList(shard.gpus)}, but ${held}, although the engine output posted to /shards/${shard.id}/engine-output says ${engine.summary} (${engine.evidence}). ` +
    `Both cannot be true of the same process: the engine did put its weights on a GPU, but not as a process of this shard on ${gpuList(missing)}, or that output is from another run. ` +
    `Find that memory in GET /gpus, which lists each GPU's processes and the shard each belongs to: under no shard, the engine runs in a process this shard does not cover (${notCovered(shard)}); ` +
    `on another GPU, CUDA_VISIBLE_DEVICES (or the container's GPU runtime) maps ${devices} to that GPU, not to ${gpuList(missing)}; ` +
    `nowhere, the output posted is another run's: post this run's to /shards/${shard.id}/engine-output.`
  );
}

/** What the engine output says, or why there is none, for a reason that found no memory of the shard on some GPU. */
function engineNote(shard: ShardRecord, engine: EngineAccount | null, noAccount: NoAccount): string {
  const post = `/shards/${shard.id}/engine-output`;
  if (engine !== null) {
    return (
      `The engine output posted says ${engine.summary}. ` +
      `Post its output through model loading (llama.cpp at -lv 4 prints its "CUDA<n> model buffer size" lines) to ${post}, ` +
      `and find the engine's memory in GET /gpus, which lists each GPU's processes and the shard each belongs to: under no shard, or on another GPU, ` +
      `the engine runs in a process this shard does not cover (${notCovered(shard)}) or CUDA_VISIBLE_DEVICES maps ${cudaNames(engine)} to another GPU.`
    );
  }
  const backend = 'Its GPU backend probably did not load.';
  if (shard.engine !== 'llama.cpp') return `${backend} ${ON_CPU_ADVICE}`;
  if (noAccount === 'silent') {
    return (
      `${backend} The output posted to ${post} says nothing about where llama.cpp computes: ` +
      `post its log at -lv 4 (llama.cpp b9829 and later names its devices and buffers only then). ${ON_CPU_ADVICE}`
    );
  }
  if (noAccount === 'earlier-run') {
    return `${backend} The engine output posted is an earlier run's (see the warnings): post this run's (llama.cpp at -lv 4) to ${post} to see what it saw. ${ON_CPU_ADVICE}`;
  }
  return `${backend} Post the engine's log (llama.cpp at -lv 4) to ${post} to see what it saw. ${ON_CPU_ADVICE}`;
}

/** Grace over with the `missing` given GPUs not held, as the listing begun at `evidenceAt` shows. */
export function onCpuVerdict(
  shard: ShardRecord,
  missing: number[],
  node: NodeView,
  evidenceAt: number,
  engine: EngineAccount | null,
  noAccount: NoAccount,
  warnings: string[],
): Readiness {
  // Dated by the listing that shows it, not by the request: with a slow nvidia-smi they differ.
  const held = `its processes hold no memory on ${gpuList(missing)}, ${formatDuration(evidenceAt - shard.registeredAt)} after registration (grace ${formatDuration(shard.graceMs)})`;
  const strays = strayGpus(shard, node);
  if (strays.length > 0) return verdict('on-cpu', 'memory-on-other-gpu', strayReason(shard, strays, `${held}.`), warnings);
  if (engine !== null && showsGpuWeights(engine)) return verdict('on-cpu', 'engine-output-conflicts', conflictReason(shard, missing, engine, held), warnings);
  return verdict('on-cpu', 'no-gpu-memory', `${placedOnCpu(shard)}: ${held}. ${engineNote(shard, engine, noAccount)}`, warnings);
}
