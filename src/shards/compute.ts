// Owns where a shard computes as nvidia-smi sees it: the given GPUs its processes hold memory on (by
// their index in the listing), those it holds but was not given (strays), and the engine's own
// account. The backend says only what is known, else null. Also its MIG devices, with each one's
// foreign memory (what a shard placed there competes with); only NVML lists them, elsewhere: null.
// And the warning for memory held on a MIG device of its GPUs it was not placed on.
import { formatHeldMemory } from '../memory-size.js';
import { smUtilOf, type ShardGpuHolding } from '../node-state/attribution.js';
import { foreignMemory } from '../node-state/foreign-memory.js';
import { shardCpuCores, type NodeView } from '../node-state/node-view.js';
import { placedIndices } from '../node-state/placement.js';
import type { EngineAccount, EngineBackend } from './llama-account.js';
import type { ShardRecord } from './shard.js';
import type { ReadinessState } from './verdict.js';
import { heldBy, shardWeights, sumOrNull, type Offload, type ShardWeights } from './weights.js';

/** `usedMiB`: the shard's there (null when one of its processes' is [N/A]); `foreignMiB`: the MIG device's. */
export type MigUsage = { uuid: string; profile: string; usedMiB: number | null; foreignMiB: number | null };

/** `usedMiB`: null when nvidia-smi reports [N/A] for one of the shard's processes there; `utilizationPct`: the whole GPU's. */
export type GpuUsage = { index: number; usedMiB: number | null; smUtilPct: number | null; xidErrors: number | null; utilizationPct: number | null; migDevices: MigUsage[] | null };

/** `cpuCores`: what its processes burn (node-view.ts); null until two snapshots have read them. */
export type ShardCompute = {
  backend: EngineBackend | null;
  devices: string[];
  gpus: GpuUsage[];
  strayGpus: GpuUsage[];
  cpuCores: number | null;
  weights: ShardWeights;
  engine: EngineAccount | null;
};

/** `GPU 0: 9.8 GiB`, `GPU 0: 512 MiB`, or `GPU 0: memory not reported` when nvidia-smi says [N/A]. */
export function deviceLabel(usage: Pick<GpuUsage, 'index' | 'usedMiB'>): string {
  return `GPU ${usage.index}: ${formatHeldMemory(usage.usedMiB)}`;
}

function backendOf(holdsGpu: boolean, shard: ShardRecord, engine: EngineAccount | null, state: ReadinessState, offload: Offload): EngineBackend | null {
  if (state === 'stopped') return null;
  // As the verdict judges: a CUDA build that fell back, or one whose weights stay in host memory, still holds a CUDA context on the GPU.
  if (state === 'on-cpu' && (engine?.backend === 'CPU' || offload === 'none')) return 'CPU';
  if (holdsGpu) return 'CUDA';
  if (state === 'on-cpu') return 'CPU';
  if (state === 'ready' && shard.gpus.length === 0 && engine?.backend !== 'CUDA') return 'CPU';
  return null;
}

/** SM utilization of `processes` on GPU `index` (null unless each has a figure), the GPU's Xid count (null without events) and its utilization. */
function activityOn(node: NodeView, index: number, processes: ShardGpuHolding['processes']): Pick<GpuUsage, 'smUtilPct' | 'xidErrors' | 'utilizationPct'> {
  const gpu = node.snapshot.gpus.find((listed) => listed.index === index);
  const events = gpu?.events;
  return {
    smUtilPct: smUtilOf(processes),
    xidErrors: events === undefined ? null : Object.values(events.xid).reduce((sum, count) => sum + count, 0),
    utilizationPct: gpu?.utilizationPct ?? null,
  };
}

/** `state`: the shard's verdict on the same view, which says whether CPU is known. */
export function shardCompute(shard: ShardRecord, node: NodeView, engine: EngineAccount | null, state: ReadinessState): ShardCompute {
  const held = heldBy(shard, node).sort((a, b) => a.index - b.index);
  const assigned = new Set(placedIndices(shard, node.snapshot.gpus));
  const usage = (given: boolean): GpuUsage[] =>
    held
      .filter((holding) => assigned.has(holding.index) === given)
      .map((holding) => ({ index: holding.index, usedMiB: holding.usedMiB, ...activityOn(node, holding.index, holding.processes), migDevices: migUsageOn(shard, node, holding) }));
  const gpus = usage(true);
  const weights = shardWeights(shard, node);
  const backend = backendOf(held.length > 0, shard, engine, state, weights.offload);
  return { backend, devices: gpus.map(deviceLabel), gpus, strayGpus: usage(false), cpuCores: shardCpuCores(shard, node), weights, engine };
}

/** The MIG devices of a held GPU that the shard holds memory on or was placed on; null where its GPU lists none. */
function migUsageOn(shard: ShardRecord, node: NodeView, holding: ShardGpuHolding): MigUsage[] | null {
  const foreign = foreignMemory(node).find((gpu) => gpu.uuid === holding.uuid)?.migDevices;
  if (foreign == null) return null;
  return foreign.flatMap((mig) => {
    const processes = holding.processes.filter((process) => process.migUuid === mig.uuid);
    if (processes.length === 0 && !shard.migDevices?.includes(mig.uuid)) return [];
    const usedMiB = sumOrNull(processes.map((process) => process.usedMiB));
    return [{ uuid: mig.uuid, profile: mig.profile, usedMiB, foreignMiB: mig.foreignMiB }];
  });
}

/** Memory on MIG devices of its GPUs other than those it was placed on; null when there is none, or it was placed on whole GPUs. */
export function otherMigWarning(shard: ShardRecord, node: NodeView): string | null {
  const placed = shard.migDevices;
  if (placed === undefined) return null;
  // A MIG device it was not placed on is listed only where its processes hold memory there.
  const others = heldBy(shard, node).flatMap((holding) =>
    (migUsageOn(shard, node, holding) ?? [])
      .filter((mig) => !placed.includes(mig.uuid))
      .map((mig) => `${mig.uuid} (${mig.profile}, GPU ${holding.index}: ${formatHeldMemory(mig.usedMiB)})`),
  );
  if (others.length === 0) return null;
  const where = `holds memory on MIG device ${others.join(', ')}, not on the MIG device it was placed on (${placed.join(', ')})`;
  return `${where}: it takes memory from the work placed there. Check NVIDIA_VISIBLE_DEVICES (the MIG UUID) and the placement`;
}
