// Owns an Ollama shard's readiness as Ollama places and loads models. It puts a model on one GPU where
// it fits: a shard is judged on the given GPUs it holds, when it holds some. It loads a model on the
// first request and unloads it after OLLAMA_KEEP_ALIVE idle (5 minutes), when its runner exits: a
// server that runs no runner and holds no GPU memory is ready (no-model-loaded), or its probe would
// keep away the request that loads one, unless its last load ran past the grace without its weights on
// a GPU, no GPU memory or a CUDA context alone (last-load-on-cpu): then the next would run on the CPU
// too, until Ollama restarts or its GPUs gain room. A runner is judged from its own start: within the
// shard's grace it is loading (ready, model-loading); after it, its GPU memory decides as any engine's.
import { formatDuration } from '../duration.js';
import { formatMemory } from '../memory-size.js';
import type { LastLoad } from '../node-state/ollama-loads.js';
import type { NodeView } from '../node-state/node-view.js';
import { placedIndices } from '../node-state/placement.js';
import type { ModelRunner } from '../system/model-runners.js';
import { askedLayersAdvice, buildAdvice, layersAdvice } from './engine-advice.js';
import { heldVerdict } from './on-cpu-verdict.js';
import type { ShardRecord } from './shard.js';
import { gpuList, verdict, type Readiness, type VerdictCause } from './verdict.js';
import { layersOf, sumOrNull, weightsIn, type ShardWeights } from './weights.js';

/** Verdicts of GPU memory not held (yet), which an idle server or a load under way gives too; not the engine's word, nor a lost GPU. */
const MEMORY_CAUSES: ReadonlySet<VerdictCause | null> = new Set<VerdictCause>([
  'awaiting-gpu-memory',
  'awaiting-listing',
  'awaiting-gpu-weights',
  'no-gpu-memory',
  'engine-output-conflicts',
  'memory-on-other-gpu',
  'weights-in-host-memory',
  'partial-offload-below-minimum',
]);

const IDLE =
  'Ollama runs no model (none of its processes names one with --model) and holds no GPU memory: it loads one on the next request, ' +
  'and where that computes is judged once it runs. Ollama unloads a model after OLLAMA_KEEP_ALIVE (5 minutes) idle; -1 keeps it loaded';

/** How the snapshot names the shard's server among runner hosts: its cgroup, or its process. */
const hostOf = (shard: ShardRecord): number | string => shard.cgroup ?? shard.identity.pid;

/** The shard's model runners in the view's snapshot; null when they are not known there. */
function runnersOf(shard: ShardRecord, node: NodeView): readonly ModelRunner[] | null {
  return node.snapshot.modelRunners?.get(hostOf(shard)) ?? null;
}

/** Free memory its GPUs gained since a load ran (ROOM_MIB or more, Ollama may place the next one there). */
const ROOM_MIB = 1024;

/** The shard's given GPUs as the view's listing has them (by UUID where registered with them). */
function givenGpus(shard: ShardRecord, node: NodeView) {
  const given = new Set(placedIndices(shard, node.snapshot.gpus));
  return node.snapshot.gpus.filter((gpu) => given.has(gpu.index));
}

/** MiB of free memory the shard's GPUs have above the least they had while `load` ran; null when a figure is unknown. */
function roomGained(shard: ShardRecord, node: NodeView, load: LastLoad): number | null {
  let gained = 0;
  for (const gpu of givenGpus(shard, node)) {
    const then = load.freeMiB.get(gpu.uuid);
    if (then == null || gpu.freeMiB === null) return null;
    gained += gpu.freeMiB - then;
  }
  return gained;
}

/**
 * Where the last load's weights were on the shard's GPUs, as the last listing that saw its runner on a GPU shows (a
 * CUDA context alone, no layers: offload 'none'); null when no listing saw it on a GPU; undefined when it held memory
 * on other GPUs only (it computed on a GPU, if not the shard's: the live verdict says so while it runs).
 */
function weightsOfLoad(shard: ShardRecord, node: NodeView, load: LastLoad): ShardWeights | null | undefined {
  if (load.onGpu === null) return null;
  const uuids = givenGpus(shard, node).map((gpu) => gpu.uuid);
  const used = load.onGpu.usedMiB;
  const held = uuids.filter((uuid) => used.has(uuid)).map((uuid) => used.get(uuid) ?? null);
  return held.length === 0 ? undefined : weightsIn(load.onGpu.files, { mib: sumOrNull(held), gpus: held.length }, { gpuLayers: load.runner.gpuLayers ?? null, modelLayers: layersOf(load.onGpu.files) });
}

/** An idle server's verdict: ready, unless its last load ran past the grace without its weights on a GPU and no room came since. */
function idleVerdict(shard: ShardRecord, node: NodeView, warnings: string[]): Readiness {
  const idle = verdict('ready', 'no-model-loaded', null, [...warnings, IDLE]);
  const load = node.snapshot.lastLoads?.get(hostOf(shard));
  const started = load?.runner.startedAt ?? null;
  if (load === undefined || started === null || load.seenAt < started + shard.graceMs) return idle;
  const weights = weightsOfLoad(shard, node, load);
  if (weights === undefined || (weights !== null && weights.offload !== 'none')) return idle;
  const held = weights === null ? 'without holding GPU memory' : `with no more than a CUDA context and buffers on its GPUs (${weights.note})`;
  const ran = `Ollama's last model runner ${load.runner.pid} (--model ${load.runner.model}) ran ${formatDuration(load.seenAt - started)}, past the shard's grace of ${formatDuration(shard.graceMs)}, ${held}, and has exited`;
  const gained = roomGained(shard, node, load);
  if (gained === null) return idle;
  if (gained >= ROOM_MIB) {
    return { ...idle, warnings: [...idle.warnings, `${ran}; its GPUs have ${formatMemory(gained)} more free memory since, so the next load may reach them`] };
  }
  const stays = `Until Ollama restarts, a load puts weights on its GPUs, or they gain ${formatMemory(ROOM_MIB)} of free memory, the shard stays on-cpu while idle, as the next load would run there too`;
  // Unsaid (Ollama's own runners after 0.11.4 take the layers another way), a reminder that one request can ask for none.
  const check =
    load.runner.gpuLayers === undefined
      ? `${buildAdvice('ollama')} ${layersAdvice('ollama')} (num_gpu 0, in a Modelfile or one request's options, runs a load on the CPU too.)`
      : `${askedLayersAdvice('ollama', { gpuLayers: load.runner.gpuLayers, modelLayers: weights?.modelLayers ?? null }, true)} ${buildAdvice('ollama')}`;
  return verdict('on-cpu', 'last-load-on-cpu', `placed on ${gpuList(shard.gpus)}, but its last model load computed on the CPU: ${ran}. ${stays}. ${check}`, warnings);
}

/**
 * Ready on the given GPUs it holds, when it holds some but not all, with its whole model there: Ollama puts a model on
 * one GPU where it fits (and on all of them where it does not, so a partial offload on some is not that).
 */
function onHeldGpus(shard: ShardRecord, node: NodeView, memory: Readiness, evidenceAt: number, now: number): Readiness {
  const held = node.attribution.holdings.get(shard.id)!;
  const holding = shard.gpus.filter((index) => held.has(index));
  if (holding.length === 0 || holding.length === shard.gpus.length) return memory;
  const idle = shard.gpus.filter((index) => !held.has(index));
  const why = `Ollama holds memory on ${gpuList(holding)}, none on ${gpuList(idle)}: it puts a model on one GPU where it fits (OLLAMA_SCHED_SPREAD=1 spreads it over all)`;
  const there = heldVerdict({ ...shard, gpus: holding }, node, evidenceAt, now, [...memory.warnings, why]);
  return there.state === 'ready' && there.cause === null ? there : memory;
}

/** `given`, the verdict of the memory the shard holds on its given GPUs, as Ollama's placement and load cycle read it. */
export function ollamaVerdict(shard: ShardRecord, node: NodeView, given: Readiness, evidenceAt: number, now: number): Readiness {
  if (!MEMORY_CAUSES.has(given.cause)) return given;
  const memory = onHeldGpus(shard, node, given, evidenceAt, now);
  const runners = runnersOf(shard, node);
  if (runners === null || !MEMORY_CAUSES.has(memory.cause)) return memory;
  if (runners.length === 0) {
    // A shard judged by its memory has holdings in the view, if only an empty map.
    return node.attribution.holdings.get(shard.id)!.size > 0 ? memory : idleVerdict(shard, node, memory.warnings);
  }
  const starts = runners.map((runner) => runner.startedAt);
  if (starts.includes(null)) return memory;
  const start = Math.min(...(starts as number[]));
  const graceEnd = start + shard.graceMs;
  const label = runners.map((runner) => `${runner.pid} (--model ${runner.model})`).join(', ');
  const runs = `Ollama's model runner ${label} started ${formatDuration(Math.max(0, now - start))} ago`;
  if (evidenceAt < graceEnd) {
    const loading = `${runs}, within its ${formatDuration(shard.graceMs)} grace: it is loading (${memory.cause})`;
    return verdict('ready', 'model-loading', null, [...memory.warnings, `${loading}; if its GPUs do not hold the model once the grace is over, the shard reads on-cpu`]);
  }
  return memory.state === 'on-cpu' ? { ...memory, reason: `${memory.reason} ${runs} (its grace of ${formatDuration(shard.graceMs)} counts from there).` } : memory;
}
