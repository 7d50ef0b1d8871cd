// Owns the on-cpu verdict and its reason: the engine's own CPU account decides it with or without
// nvidia-smi; otherwise grace is over with a given GPU not held, and the reason follows what else is
// known (memory on a GPU it was not given, output showing weights on a GPU, output saying nothing).
// A shard holding every given GPU is judged by where its weights are (weights.ts): zero offload is
// on-cpu after the grace; a partial one serves with a warning and a cause, unless its registration
// asks for a larger share on the GPU. Also the warning for one that computes on the CPU under load.
import { formatDuration } from '../duration.js';
import { formatBytes } from '../memory-size.js';
import { smUtilOf, type ShardGpuHolding } from '../node-state/attribution.js';
import { shardCpuCores, type NodeView } from '../node-state/node-view.js';
import { deviceLabel } from './compute.js';
import { askedLayersAdvice, buildAdvice, layersAdvice } from './engine-advice.js';
import type { EngineAccount } from './llama-account.js';
import { showsGpuWeights } from './llama-log.js';
import type { ShardRecord } from './shard.js';
import { andList, gpuList, verdict, type Readiness } from './verdict.js';
import { heldBy, meetsMinimum, shardWeights, type ShardWeights } from './weights.js';

/** Cores a shard's processes burn above which, with no GPU work, they compute on the CPU (a GPU engine's host threads use about one). */
export const CPU_BURN_CORES = 2;
/** Utilization (%) at or below which there is no GPU work worth the name. */
const GPU_IDLE_PCT = 5;

/** How busy a held GPU is for the shard: its processes' SM utilization (NVML), else the whole GPU's utilization; null when neither is known. */
function gpuWork(holding: ShardGpuHolding, node: NodeView): { pct: number; label: string } | null {
  const sm = smUtilOf(holding.processes);
  if (sm !== null) return { pct: sm, label: `GPU ${holding.index} (${sm}% SM)` };
  const whole = node.snapshot.gpus.find((gpu) => gpu.index === holding.index)?.utilizationPct ?? null;
  return whole === null ? null : { pct: whole, label: `GPU ${holding.index} (${whole}% busy)` };
}

/** A warning when the shard burns CPU_BURN_CORES or more while no GPU it holds does work; null otherwise, and where that is not known. */
export function cpuBurnWarning(shard: ShardRecord, node: NodeView): string | null {
  const cores = shardCpuCores(shard, node);
  const held = heldBy(shard, node);
  if (cores === null || cores < CPU_BURN_CORES || held.length === 0) return null;
  const work = held.map((holding) => gpuWork(holding, node));
  if (work.some((gpu) => gpu === null || gpu.pct > GPU_IDLE_PCT)) return null;
  const idle = work.map((gpu) => gpu!.label).join(', ');
  return (
    // Whole cores: a figure that moved at every snapshot would make the verdict (and /shards's ETag) change with it.
    `its processes burn about ${Math.round(cores)} CPU cores while doing no work on ${idle}: it computes on the CPU, five to ten times slower. ` +
    layersAdvice(shard.engine)
  );
}

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

function engineCpuAdvice(loaded: boolean | null, shard: ShardRecord): string {
  if (loaded === true) return `Its GPU backend loaded but put no layers on the GPU. ${layersAdvice(shard.engine)}`;
  if (loaded === false) return `Its GPU backend did not load. ${buildAdvice(shard.engine)}`;
  return `Its GPU backend did not load, or it put no layers on the GPU. ${buildAdvice(shard.engine)} ${layersAdvice(shard.engine)}`;
}

/** The memory the shard's processes hold on the GPUs it was given, as device labels; empty without a node view. */
function heldOnGiven(shard: ShardRecord, node: NodeView | null): string[] {
  if (node === null) return [];
  return heldBy(shard, node)
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
  if (held.length === 0) return `${says} ${engineCpuAdvice(engine.gpuBackendLoaded, shard)}`;
  const holding = `the GPU driver lists its processes holding ${held.join(', ')}`;
  if (engine.gpuBackendLoaded === false) {
    const which = `Post this run's (llama.cpp -lv 4) to ${post}; GET /gpus shows which process holds it.`;
    return `${says} Yet ${holding}, which an engine that found no usable GPU cannot hold: the output is likely another run's. ${which}`;
  }
  const another = `If it is the size of the weights, the output is another run's: post this run's to ${post}.`;
  return `${says} ${holding}: a run without GPU layers holds its CUDA context and buffers there too. ${engineCpuAdvice(true, shard)} ${another}`;
}

/** GPUs the shard's processes hold memory on without having been given them, in index order. */
export function strayGpus(shard: ShardRecord, node: NodeView): number[] {
  const held = heldBy(shard, node).map((holding) => holding.index);
  return held.filter((index) => !shard.gpus.includes(index)).sort((a, b) => a - b);
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
  const placed = `placed on ${gpuList(shard.gpus)}; it holds memory on ${gpuList(strays)}, which it was not given, and ${held}`;
  const runtime = `CUDA_VISIBLE_DEVICES or the container's GPU runtime gives it ${gpuList(strays)}`;
  const order = 'CUDA counts fastest first; CUDA_DEVICE_ORDER=PCI_BUS_ID or UUIDs match the GPU driver';
  return `${placed} Its GPU backend loaded on the wrong GPU: ${runtime} (${order}). Check them, or register the shard with the GPUs it uses.`;
}

/** Engine output showing weights on a CUDA device, while nvidia-smi lists none of the shard's memory on its GPUs. */
function conflictReason(shard: ShardRecord, missing: number[], engine: EngineAccount, held: string): string {
  const devices = cudaNames(engine);
  const post = `/shards/${shard.id}/engine-output`;
  return (
    `placed on ${gpuList(shard.gpus)}, but ${held}, although the engine output posted to ${post} says ${engine.summary} (${engine.evidence}). ` +
    `So the weights are on a GPU but not in this shard's processes on ${gpuList(missing)}, or the output is another run's. Find that memory in GET /gpus: ` +
    `under no shard, the engine runs in a process this shard does not cover (${notCovered(shard)}); ` +
    `on another GPU, CUDA_VISIBLE_DEVICES maps ${devices} there, not to ${gpuList(missing)}; nowhere, post this run's output to ${post}.`
  );
}

/** What the engine output says, or why there is none, for a reason that found no memory of the shard on some GPU. */
function engineNote(shard: ShardRecord, engine: EngineAccount | null, noAccount: NoAccount): string {
  const post = `/shards/${shard.id}/engine-output`;
  if (engine !== null) {
    return (
      `The engine output posted says ${engine.summary}. Post its output through model loading (-lv 4 prints "CUDA<n> model buffer size") to ${post}, ` +
      `and find its memory in GET /gpus: under no shard or on another GPU, the engine runs in a process this shard does not cover (${notCovered(shard)}) ` +
      `or CUDA_VISIBLE_DEVICES maps ${cudaNames(engine)} to another GPU.`
    );
  }
  const backend = 'Its GPU backend probably did not load.';
  if (shard.engine !== 'llama.cpp') return `${backend} ${buildAdvice(shard.engine)}`;
  const postIt = {
    silent: `The output posted to ${post} says nothing about where llama.cpp computes: post its log at -lv 4 (b9829+ needs it).`,
    'earlier-run': `The engine output posted is an earlier run's (see the warnings): post this run's (llama.cpp -lv 4) to ${post}.`,
    'not-posted': `Post the engine's log (llama.cpp -lv 4) to ${post} to see what it saw.`,
  }[noAccount];
  return `${backend} ${postIt} ${buildAdvice(shard.engine)}`;
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

const percent = (share: number): string => `${Math.round(share * 100)}%`;

/** "/models/x.gguf (4.0 GiB)", each file; a deleted one says so. */
function modelLabel(weights: ShardWeights): string {
  return weights.files
    .map((file) => `${file.path} (${file.bytes === null ? 'size unknown' : formatBytes(file.bytes)}${file.deleted ? ', deleted since it was loaded' : ''})`)
    .join(', ');
}

/** The warning a partial offload serves with. */
function partialWarning(weights: ShardWeights, shard: ShardRecord): string {
  const of = weights.bytes === null ? '' : ` of ${formatBytes(weights.bytes)}`;
  return (
    `only about ${percent(weights.gpuShare!)} of its model's weights (${formatBytes(weights.gpuBytes!)}${of}) are on its GPUs: ${weights.note}. ` +
    `The layers left on the CPU run five to ten times slower. ${askedLayersAdvice(shard.engine, weights, false)} Or give the shard more GPUs.`
  );
}

function notReadyReason(shard: ShardRecord, node: NodeView, weights: ShardWeights, zero: boolean): string {
  const model = `its model ${modelLabel(weights)}`;
  if (zero) {
    const held = `its processes hold ${heldOnGiven(shard, node).join(', ')}, no more than a CUDA context and compute buffers`;
    const where = weights.hostBytes === null ? 'read without mmap' : `${formatBytes(weights.hostBytes)} of it mapped`;
    return `${placedOnCpu(shard)}: ${held}, while ${model} stays in host memory (${where}). ${askedLayersAdvice(shard.engine, weights, true)}`;
  }
  const asked = `below the ${percent(shard.minGpuWeightsShare!)} its registration asks (minGpuWeightsShare)`;
  return `placed on ${gpuList(shard.gpus)} with about ${percent(weights.gpuShare!)} of ${model} there (${weights.note}), ${asked}: the rest computes on the CPU. ${askedLayersAdvice(shard.engine, weights, false)}`;
}

/** Every given GPU held: ready, unless its weights stay in host memory (or below its minimum share) once the grace is over. */
export function heldVerdict(shard: ShardRecord, node: NodeView, evidenceAt: number, now: number, warnings: string[]): Readiness {
  if (shard.gpus.length === 0) return verdict('ready', null, null, warnings);
  const weights = shardWeights(shard, node);
  const zero = weights.offload === 'none';
  const below = shard.minGpuWeightsShare !== undefined && !meetsMinimum(shard, node, weights, shard.minGpuWeightsShare);
  if (!zero && !below) {
    if (weights.offload === 'partial') return verdict('ready', 'partial-offload', null, [...warnings, partialWarning(weights, shard)]);
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
