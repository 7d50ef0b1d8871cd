// Owns a shard's MIG devices: which MIG devices of a GPU its processes hold memory on, with each
// one's foreign memory (what a shard placed there competes with), and the warning for memory on a
// MIG device of its GPUs it was not placed on. Only NVML lists MIG devices; elsewhere: null, none.
import type { ShardGpuHolding } from '../node-state/attribution.js';
import { foreignMemory } from '../node-state/foreign-memory.js';
import type { NodeView } from '../node-state/node-view.js';
import { formatHeldMemory } from '../memory-size.js';
import type { ShardRecord } from './shard.js';

/** `usedMiB`: the shard's there (null when one of its processes' is [N/A]); `foreignMiB`: the MIG device's. */
export type MigUsage = { uuid: string; profile: string; usedMiB: number | null; foreignMiB: number | null };

function sumOf(processes: ShardGpuHolding['processes']): number | null {
  return processes.some((process) => process.usedMiB === null) ? null : processes.reduce((sum, process) => sum + process.usedMiB!, 0);
}

/** The MIG devices of a held GPU that the shard holds memory on or was placed on; null where its GPU lists none. */
export function migUsageOn(shard: ShardRecord, node: NodeView, holding: ShardGpuHolding): MigUsage[] | null {
  const foreign = foreignMemory(node).find((gpu) => gpu.uuid === holding.uuid)?.migDevices;
  if (foreign == null) return null;
  return foreign.flatMap((mig) => {
    const processes = holding.processes.filter((process) => process.migUuid === mig.uuid);
    if (processes.length === 0 && !shard.migDevices?.includes(mig.uuid)) return [];
    return [{ uuid: mig.uuid, profile: mig.profile, usedMiB: sumOf(processes), foreignMiB: mig.foreignMiB }];
  });
}

/** Memory on MIG devices of its GPUs other than those it was placed on; null when there is none, or it was placed on whole GPUs. */
export function otherMigWarning(shard: ShardRecord, node: NodeView): string | null {
  const placed = shard.migDevices;
  if (placed === undefined) return null;
  const owner = node.attribution.ownerByPid;
  const others = node.snapshot.gpus.flatMap((gpu) =>
    (gpu.migDevices ?? [])
      .filter((mig) => !placed.includes(mig.uuid))
      .flatMap((mig) => {
        const held = gpu.processes.filter((process) => process.migUuid === mig.uuid && owner.get(process.pid) === shard.id);
        return held.length === 0 ? [] : [`${mig.uuid} (${mig.profile}, GPU ${gpu.index}: ${formatHeldMemory(sumOf(held))})`];
      }),
  );
  if (others.length === 0) return null;
  const where = `holds memory on MIG device ${others.join(', ')}, not on the MIG device it was placed on (${placed.join(', ')})`;
  return `${where}: it takes memory from the work placed there. Check NVIDIA_VISIBLE_DEVICES (the MIG UUID) and the placement`;
}
