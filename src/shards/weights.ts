// Owns where a shard's model weights are: the model files its processes loaded (NodeSnapshot.modelFiles),
// set against the memory they hold on the GPUs it was given. The rule, from llama.cpp's loader: once
// loaded, it unmaps the parts of the file it put on a GPU and keeps mapped what stays on the CPU (the
// input embeddings always, and every layer not offloaded). So a mapping shrunk to at most half the
// file is a full offload; a whole one, or a model in splits (a split wholly on a GPU is unmapped
// whole), is judged by GPU memory, less what a context and compute buffers take. No model file in
// view (vLLM, other engines): not seen, and nothing is judged.
// heldBy and sumOrNull, what a shard holds per GPU and a sum unknown if one part is, serve its peers too;
// weightsIn judges a process that is gone (an Ollama runner's last load) by the same rule.
import { formatBytes } from '../memory-size.js';
import type { ShardGpuHolding } from '../node-state/attribution.js';
import type { NodeView } from '../node-state/node-view.js';
import { statOf } from '../node-state/node-snapshot.js';
import { placedIndices } from '../node-state/placement.js';
import { splitsOf, type ModelFile, type ProcessModelFiles } from '../system/model-files.js';
import type { ShardRecord } from './shard.js';

export const OFFLOADS = ['full', 'partial', 'none', 'unknown', 'not-seen'] as const;
export type Offload = (typeof OFFLOADS)[number];

/** The GPU layers a command line asks for, as written, and those llama.cpp can offload of its model; null: not known. */
export type Asked = { gpuLayers: string | null; modelLayers: number | null };

export type ShardWeights = {
  offload: Offload;
  files: ModelFile[];
  /** The files' size; null when one's is not known (deleted, unreadable). */
  bytes: number | null;
  /** Bytes of them still mapped in host memory; null when none is mapped (--no-mmap). */
  hostBytes: number | null;
  /** Estimated bytes of weights on its GPUs, and their share of the weights (0 to 1). */
  gpuBytes: number | null;
  gpuShare: number | null;
  judgedBy: 'mapping' | 'gpu-memory' | null;
  /** How it was judged, for people. */
  note: string;
  /** The GPU layers its command line asks for (-ngl, or LLAMA_ARG_N_GPU_LAYERS), as written; null when unsaid. */
  gpuLayers: string | null;
  /** The layers llama.cpp can offload of its model (layersOf, of the process gpuLayers is read from); null when none says. */
  modelLayers: number | null;
};

const MiB = 1024 * 1024;
/** What a CUDA context, compute buffers and a small KV cache take on each GPU with no layer there (300 MiB to 2 GiB seen). */
export const CONTEXT_ALLOWANCE_BYTES = 1024 * MiB;
/** At or below this share on the GPU, no offload to speak of; at or above FULL_SHARE, all of it. */
export const NONE_SHARE = 0.1;
const FULL_SHARE = 0.9;
/**
 * Beyond the allowance, what a GPU may hold and still count as no offload (compute buffers grow with
 * the context and batch; without GPU layers the KV cache stays on the host). More is weights, however
 * small a share of a large model: MoE experts kept on the CPU (--cpu-moe, -ot exps=CPU) are a choice.
 */
const NONE_EXTRA_BYTES = 2048 * MiB;

/** What the shard's processes hold per GPU, in the listing's order; none before a snapshot includes it. */
export const heldBy = (shard: ShardRecord, node: NodeView): ShardGpuHolding[] =>
  [...(node.attribution.holdings.get(shard.id)?.values() ?? [])];

const round2 = (value: number): number => Math.round(value * 100) / 100;

/** The shard's processes worth looking at: its registered process (while it is that one) and the GPU processes attribution gave it. */
function shardPids(shard: ShardRecord, node: NodeView): number[] {
  const pids = new Set<number>();
  if (shard.pid !== null && statOf(node.snapshot, shard.pid)?.startTime === shard.identity.startTime) pids.add(shard.pid);
  for (const holding of heldBy(shard, node)) for (const process of holding.processes) pids.add(process.pid);
  return [...pids].sort((a, b) => a - b);
}

/** Each file once (by path): the largest mapping any process keeps of it, a mapping before a command line (mappedBytes null). */
function mergeFiles(lists: ModelFile[][]): ModelFile[] {
  const byPath = new Map<string, ModelFile>();
  const rank = (file: ModelFile): number => file.mappedBytes ?? -1;
  for (const file of lists.flat()) {
    const known = byPath.get(file.path);
    if (known === undefined || rank(file) > rank(known)) byPath.set(file.path, file);
  }
  return [...byPath.values()];
}

export const sumOrNull = (values: ReadonlyArray<number | null>): number | null => (values.some((value) => value === null) ? null : values.reduce<number>((sum, value) => sum + value!, 0));

/** Memory (MiB) its processes hold on the GPUs it was given, and on how many; null when one is not reported ([N/A]). */
function heldOnGiven(shard: ShardRecord, node: NodeView): { mib: number | null; gpus: number } {
  const given = new Set(placedIndices(shard, node.snapshot.gpus));
  const held = heldBy(shard, node).filter((holding) => given.has(holding.index));
  return { mib: sumOrNull(held.map((holding) => holding.usedMiB)), gpus: held.length };
}

function notSeen(unreadable: string | null): ShardWeights {
  const note =
    unreadable ??
    'no GGUF model file is mapped by its processes or named on their command line (-m/--model): vLLM and other engines load weights another way, so it is judged by GPU memory alone';
  return { offload: 'not-seen', files: [], bytes: null, hostBytes: null, gpuBytes: null, gpuShare: null, judgedBy: null, note, gpuLayers: null, modelLayers: null };
}

type ReadProcess = { pid: number; answer: ProcessModelFiles };

/**
 * The GPU layers asked by the process holding the most GPU memory among those with model files (the one whose weights
 * matter most, where an Ollama runs a model with num_gpu 0 beside another), against its own model's layers.
 */
function askedBy(shard: ShardRecord, node: NodeView, read: readonly ReadProcess[]): Asked {
  const held = new Map<number, number>();
  for (const holding of heldBy(shard, node)) for (const process of holding.processes) held.set(process.pid, (held.get(process.pid) ?? 0) + (process.usedMiB ?? 0));
  const mibOf = (pid: number): number => held.get(pid) ?? 0;
  const [first] = read.filter(({ answer }) => answer.files.length > 0).sort((a, b) => mibOf(b.pid) - mibOf(a.pid));
  return first === undefined ? { gpuLayers: null, modelLayers: null } : { gpuLayers: first.answer.gpuLayers ?? null, modelLayers: layersOf(first.answer.files) };
}

export function shardWeights(shard: ShardRecord, node: NodeView): ShardWeights {
  const read = shardPids(shard, node).flatMap((pid) => {
    const answer = node.snapshot.modelFiles.get(pid);
    return answer === undefined ? [] : [{ pid, answer }];
  });
  const answers = read.map(({ answer }) => answer);
  const files = mergeFiles(answers.map((answer) => answer.files));
  const asked = askedBy(shard, node, read);
  if (files.length === 0) return notSeen(answers.find((answer) => answer.unreadable !== null)?.unreadable ?? null);
  return weightsIn(files, heldOnGiven(shard, node), asked);
}

/** Where the weights of `files` are, `held` the memory (MiB; null: not reported) their processes hold on `gpus` GPUs. */
export function weightsIn(files: readonly ModelFile[], held: { mib: number | null; gpus: number }, asked: Asked): ShardWeights {
  if (files.length === 0) return notSeen(null);
  const bytes = sumOrNull(files.map((file) => file.bytes));
  const mapped = files.filter((file) => file.mappedBytes !== null);
  const hostBytes = mapped.length === 0 ? null : mapped.reduce((sum, file) => sum + file.mappedBytes!, 0);
  // A model in splits: a partial offload unmaps the splits left wholly on a GPU, so a small mapping is no full offload.
  const split = files.some((file) => splitsOf(file.path).length > 1);
  return { files: [...files], bytes, hostBytes, ...judge(bytes, hostBytes, held, split), ...asked };
}

/** The layers of the largest model whose header says, its splits counted together (the first may hold no tensors). */
export function layersOf(files: readonly ModelFile[]): number | null {
  const models = new Map<string, { bytes: number; layers: number | null }>();
  for (const file of files) {
    const key = splitsOf(file.path)[0] ?? file.path;
    const model = models.get(key) ?? { bytes: 0, layers: null };
    models.set(key, { bytes: model.bytes + (file.bytes ?? 0), layers: model.layers ?? file.layers });
  }
  const [largest] = [...models.values()].filter((model) => model.layers !== null).sort((a, b) => b.bytes - a.bytes);
  return largest?.layers ?? null;
}

/**
 * Whether at least `minimum` of the weights are on the GPUs. Judged by the mapping, the share is
 * the higher of the mapping's and the GPU memory's: what stays mapped after a full offload is what
 * the loader always keeps on the CPU (the input embeddings, a fifth of a small model), while a small
 * mapping left by tensors kept on the CPU (-ot) shows in the memory the GPUs hold too.
 */
export function meetsMinimum(shard: ShardRecord, node: NodeView, weights: ShardWeights, minimum: number): boolean {
  if (weights.gpuShare === null || weights.gpuShare >= minimum) return true;
  if (weights.judgedBy !== 'mapping') return false;
  const held = heldOnGiven(shard, node);
  // Memory not reported ([N/A]), or as much as the whole model (known: judged by its mapping): nothing contradicts the full offload the mapping shows.
  if (held.mib === null || held.mib * MiB >= weights.bytes!) return true;
  return judge(weights.bytes, null, held).gpuShare! >= minimum;
}

function judge(
  bytes: number | null,
  hostBytes: number | null,
  { mib, gpus }: { mib: number | null; gpus: number },
  split = false,
): Pick<ShardWeights, 'offload' | 'gpuBytes' | 'gpuShare' | 'judgedBy' | 'note'> {
  const held = { bytes: mib === null ? null : mib * MiB, gpus };
  if (!split && bytes !== null && hostBytes !== null && hostBytes <= bytes / 2) {
    const note = `the loader unmapped all but ${formatBytes(hostBytes)} of ${formatBytes(bytes)}: what stays mapped is what it keeps on the CPU (the input embeddings at least)`;
    return { offload: 'full', gpuBytes: bytes - hostBytes, gpuShare: round2(1 - hostBytes / bytes), judgedBy: 'mapping', note };
  }
  const unknown = (note: string) => ({ offload: 'unknown' as const, gpuBytes: null, gpuShare: null, judgedBy: null, note });
  if (held.bytes === null) return unknown('the GPU driver does not report the memory its processes hold ([N/A]), so the share on its GPUs is not known');
  // Neither opened nor mapped: no evidence of the weights' size, and a small model held whole would read as none.
  if (bytes === null && hostBytes === null) return unknown('its model file can neither be opened nor be seen mapped, so the size of its weights is not known');
  const onGpu = Math.max(0, held.bytes - CONTEXT_ALLOWANCE_BYTES * held.gpus);
  // A deleted file's size is not known: its weights are what stays mapped and what the GPUs hold.
  const total = bytes ?? hostBytes! + onGpu;
  const share = total === 0 ? 0 : round2(Math.min(1, onGpu / total));
  const none = share <= NONE_SHARE && onGpu <= NONE_EXTRA_BYTES * held.gpus;
  const offload: Offload = none ? 'none' : share >= FULL_SHARE ? 'full' : 'partial';
  // Without a whole mapping to say the loader kept it, a model no larger than what its GPUs hold may be all there.
  if (offload !== 'full' && bytes !== null && (hostBytes === null || (split && hostBytes < bytes)) && held.bytes >= bytes) {
    return unknown(`its GPUs hold ${formatBytes(held.bytes)}, as much as its whole model (${formatBytes(bytes)}): their memory cannot tell a CUDA context from the model`);
  }
  const mapping = hostBytes === null ? 'not mapped (loaded without mmap)' : `mapped in host memory (${formatBytes(hostBytes)})`;
  const gpuPart = `its GPUs hold ${formatBytes(held.bytes)}, about ${formatBytes(onGpu)} of it weights after ${formatBytes(CONTEXT_ALLOWANCE_BYTES)} a GPU for a context and buffers`;
  return { offload, gpuBytes: Math.min(onGpu, total), gpuShare: share, judgedBy: 'gpu-memory', note: `the model is ${mapping}; ${gpuPart}` };
}
