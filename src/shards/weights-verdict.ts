// Owns the verdict of a shard that holds every GPU it was given, by where its weights are (weights.ts):
// zero offload (little beyond a context on its GPUs, the model in host memory) is on-cpu after the
// grace; a partial one serves with a warning and a cause, unless its registration asks for a larger
// share on the GPU; a full one, or weights not seen, is ready as before.
import { formatDuration } from '../duration.js';
import { formatBytes } from '../memory-size.js';
import type { NodeView } from '../node-state/node-view.js';
import { heldOnGiven } from './on-cpu-verdict.js';
import type { ShardRecord } from './shard.js';
import { gpuList, verdict, type Readiness } from './verdict.js';
import { shardWeights, type ShardWeights } from './weights.js';

const NGL_ADVICE =
  "Start it with -ngl (LLAMA_ARG_N_GPU_LAYERS) at or above the model's layers, check that the model fits the GPU's free memory (GET /gpus), " +
  "and that the build has CUDA (its log's \"offloaded N/M layers\").";

const percent = (share: number): string => `${Math.round(share * 100)}%`;

/** "/models/x.gguf (4.0 GiB)", each file; a deleted one says so. */
function modelLabel(weights: ShardWeights): string {
  return weights.files
    .map((file) => `${file.path} (${file.bytes === null ? 'size unknown' : formatBytes(file.bytes)}${file.deleted ? ', deleted since it was loaded' : ''})`)
    .join(', ');
}

/** The warning a partial offload serves with. */
export function partialWarning(weights: ShardWeights): string {
  const of = weights.bytes === null ? '' : ` of ${formatBytes(weights.bytes)}`;
  return (
    `only about ${percent(weights.gpuShare!)} of its model's weights (${formatBytes(weights.gpuBytes!)}${of}) are on its GPUs: ${weights.note}. ` +
    'The layers left on the CPU run five to ten times slower: raise -ngl if the GPU has free memory (GET /gpus), or give the shard more GPUs.'
  );
}

function notReadyReason(shard: ShardRecord, node: NodeView, weights: ShardWeights, zero: boolean): string {
  const model = `its model ${modelLabel(weights)}`;
  if (zero) {
    const held = `its processes hold ${heldOnGiven(shard, node).join(', ')}, no more than a CUDA context and compute buffers`;
    const where = weights.hostBytes === null ? 'read without mmap' : `${formatBytes(weights.hostBytes)} of it mapped`;
    return `placed on ${gpuList(shard.gpus)} but computing on the CPU: ${held}, while ${model} stays in host memory (${where}). ${NGL_ADVICE}`;
  }
  const asked = `below the ${percent(shard.minGpuWeightsShare!)} its registration asks (minGpuWeightsShare)`;
  return `placed on ${gpuList(shard.gpus)} with about ${percent(weights.gpuShare!)} of ${model} there (${weights.note}), ${asked}: the rest computes on the CPU. ${NGL_ADVICE}`;
}

/** Every given GPU held: ready, unless its weights stay in host memory (or below its minimum share) once the grace is over. */
export function heldVerdict(shard: ShardRecord, node: NodeView, evidenceAt: number, now: number, warnings: string[]): Readiness {
  if (shard.gpus.length === 0) return verdict('ready', null, null, warnings);
  const weights = shardWeights(shard, node);
  const zero = weights.offload === 'none';
  const below = shard.minGpuWeightsShare !== undefined && weights.gpuShare !== null && weights.gpuShare < shard.minGpuWeightsShare;
  if (!zero && !below) {
    if (weights.offload === 'partial') return verdict('ready', 'partial-offload', null, [...warnings, partialWarning(weights)]);
    return verdict('ready', null, null, warnings);
  }
  const graceEnd = shard.registeredAt + shard.graceMs;
  const inHost = `it holds its GPUs, but ${zero ? 'its weights stay' : 'too much of its weights stays'} in host memory (${weights.note})`;
  if (now < graceEnd) return verdict('starting', 'awaiting-gpu-weights', `${inHost}: still loading, or started with too few GPU layers; ${formatDuration(graceEnd - now)} of its grace left.`, warnings);
  if (evidenceAt < graceEnd) {
    return verdict('starting', 'awaiting-listing', `${inHost}, as the latest listing shows, begun before its grace ended: the verdict waits for a listing begun after it.`, warnings);
  }
  return verdict('on-cpu', zero ? 'weights-in-host-memory' : 'partial-offload-below-minimum', notReadyReason(shard, node, weights, zero), warnings);
}
