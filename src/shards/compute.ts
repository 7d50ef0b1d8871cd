// Owns the answer to "where does this shard compute, as nvidia-smi sees it": the assigned GPUs its
// processes hold memory on (devices, by their index in the listing: see placement.ts), the GPUs it
// holds but was not given (strays), and the engine's own account when it posted its output. The
// backend says only what is known, since a control plane acts on CPU as a fallback to fix:
//   CUDA  the shard holds memory on some GPU (one it was not given still counts: strayGpus says which),
//         unless its verdict is on-cpu because the engine itself says CPU (a CUDA build that fell
//         back still holds a CUDA context on the GPU), or it is stopped;
//   CPU   its verdict is on-cpu (grace over with a GPU still not held, or the engine itself says CPU),
//         or it was given no GPU and runs (ready) holding none, without its engine claiming CUDA;
//   null  not known: starting, exited, unverified, or the snapshot does not include it yet; a
//         gpu-lost shard holding no memory on a GPU still listed; and stopped, which computes
//         nowhere until it runs again (the GPUs it holds are still listed: a stopped process keeps
//         its memory).
import { formatHeldMemory } from '../memory-size.js';
import type { NodeView } from '../node-state/node-view.js';
import { placedIndices } from '../node-state/placement.js';
import type { EngineAccount } from './llama-account.js';
import type { ReadinessState } from './readiness.js';
import type { ShardRecord } from './shard.js';

export interface GpuUsage {
  index: number;
  /** null when nvidia-smi does not report the memory of one of the shard's processes there ([N/A]). */
  usedMiB: number | null;
}

export type Backend = 'CUDA' | 'CPU';

export interface ShardCompute {
  backend: Backend | null;
  devices: string[];
  gpus: GpuUsage[];
  strayGpus: GpuUsage[];
  engine: EngineAccount | null;
}

/**
 * A GPU and the memory the shard holds there: `GPU 0: 9.8 GiB` for 10000 MiB, `GPU 0: 512 MiB` below
 * 1 GiB, `GPU 0: memory not reported` when nvidia-smi reports [N/A].
 */
export function deviceLabel(usage: GpuUsage): string {
  return `GPU ${usage.index}: ${formatHeldMemory(usage.usedMiB)}`;
}

function backendOf(holdsGpu: boolean, shard: ShardRecord, engine: EngineAccount | null, state: ReadinessState): Backend | null {
  if (state === 'stopped') return null;
  // As the verdict judges: a CUDA build that fell back still holds a CUDA context on the GPU.
  if (state === 'on-cpu' && engine?.backend === 'CPU') return 'CPU';
  if (holdsGpu) return 'CUDA';
  if (state === 'on-cpu') return 'CPU';
  if (state === 'ready' && shard.gpus.length === 0 && engine?.backend !== 'CUDA') return 'CPU';
  return null;
}

/** `state`: the shard's readiness verdict on the same view, which says whether CPU is known. */
export function shardCompute(shard: ShardRecord, node: NodeView, engine: EngineAccount | null, state: ReadinessState): ShardCompute {
  const held = [...(node.attribution.holdings.get(shard.id)?.values() ?? [])].sort((a, b) => a.index - b.index);
  const assigned = new Set(placedIndices(shard, node.snapshot.gpus));
  const gpus = held.filter((holding) => assigned.has(holding.index)).map(({ index, usedMiB }) => ({ index, usedMiB }));
  const strayGpus = held.filter((holding) => !assigned.has(holding.index)).map(({ index, usedMiB }) => ({ index, usedMiB }));
  return {
    backend: backendOf(held.length > 0, shard, engine, state),
    devices: gpus.map(deviceLabel),
    gpus,
    strayGpus,
    engine,
  };
}
