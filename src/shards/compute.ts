// Owns the answer to "where does this shard compute, as nvidia-smi sees it": the assigned GPUs its
// processes hold memory on (devices), the GPUs it holds but was not given (strays), and the
// engine's own account when it posted its output. The backend is CUDA as soon as the shard holds
// memory on any GPU: a shard that computes on a GPU it was not given is still on a GPU, and
// strayGpus says which.
import type { NodeView } from '../node-state/node-view.js';
import type { EngineAccount } from './llama-log.js';
import type { ShardRecord } from './shard.js';

export interface GpuUsage {
  index: number;
  usedMiB: number;
}

export interface ShardCompute {
  backend: 'CUDA' | 'CPU';
  devices: string[];
  gpus: GpuUsage[];
  strayGpus: GpuUsage[];
  engine: EngineAccount | null;
}

/** The device label llama.cpp users know: `GPU 0: 12.3 GB` (MiB / 1024, one decimal). */
export function deviceLabel(usage: GpuUsage): string {
  return `GPU ${usage.index}: ${(usage.usedMiB / 1024).toFixed(1)} GB`;
}

export function shardCompute(shard: ShardRecord, node: NodeView, engine: EngineAccount | null): ShardCompute {
  const held = [...(node.attribution.holdings.get(shard.id)?.values() ?? [])].sort((a, b) => a.index - b.index);
  const assigned = new Set(shard.gpus);
  const gpus = held.filter((holding) => assigned.has(holding.index)).map(({ index, usedMiB }) => ({ index, usedMiB }));
  const strayGpus = held.filter((holding) => !assigned.has(holding.index)).map(({ index, usedMiB }) => ({ index, usedMiB }));
  return {
    backend: held.length > 0 ? 'CUDA' : 'CPU',
    devices: gpus.map(deviceLabel),
    gpus,
    strayGpus,
    engine,
  };
}
