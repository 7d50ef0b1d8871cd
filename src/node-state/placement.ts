// Owns where a shard's given GPUs are in one listing: by UUID, so each keeps its shard when
// nvidia-smi renumbers the GPUs after a lost one (by index for a registration without UUIDs). Also
// which given GPUs nvidia-smi cannot reach, matched by bus id with the last listing that had them.
import type { GpuRecord, UnreachableGpu } from '../system/nvidia-smi.js';
import type { ShardRecord } from '../shards/shard.js';

/** A GPU as a listing names it. */
type ListedGpu = Pick<GpuRecord, 'index' | 'uuid' | 'name' | 'busId'>;

export interface UnlistedGpu {
  /** As registered; uuid undefined for a registration without UUIDs. */
  index: number;
  uuid: string | undefined;
}

export interface Renumbered {
  registered: number;
  /** Its index in this listing. */
  now: number;
  uuid: string;
}

export interface Placement {
  /** The given GPUs listed, by their index now, in the registration's order. */
  indices: number[];
  unlisted: UnlistedGpu[];
  /** Given GPUs listed under another index than registered. */
  renumbered: Renumbered[];
}

export function placementOf(shard: ShardRecord, gpus: readonly ListedGpu[]): Placement {
  const placement: Placement = { indices: [], unlisted: [], renumbered: [] };
  shard.gpus.forEach((registered, position) => {
    const uuid = shard.gpuUuids?.[position];
    const listed = uuid === undefined ? gpus.find((gpu) => gpu.index === registered) : gpus.find((gpu) => gpu.uuid === uuid);
    if (listed === undefined) {
      placement.unlisted.push({ index: registered, uuid });
      return;
    }
    placement.indices.push(listed.index);
    if (listed.index !== registered) placement.renumbered.push({ registered, now: listed.index, uuid: listed.uuid });
  });
  return placement;
}

/** The indices `shard`'s listed GPUs have now; as registered without a listing. */
export function placedIndices(shard: ShardRecord, gpus: readonly ListedGpu[] | null): number[] {
  return gpus === null ? shard.gpus : placementOf(shard, gpus).indices;
}

export interface UnreachableListedGpu extends UnreachableGpu {
  /** What the last listing with its bus id said it was; null when none had it. */
  listed: Pick<GpuRecord, 'index' | 'uuid' | 'name'> | null;
}

/** `unreachable` (a failed query's) matched by bus id with `known` (the last good snapshot's GPUs, listed or lost). */
export function listedAs(unreachable: readonly UnreachableGpu[], known: { gpus: readonly ListedGpu[]; lostGpus: readonly ListedGpu[] } | null): UnreachableListedGpu[] {
  return unreachable.map((gpu) => {
    const listed = known?.gpus.find((record) => record.busId === gpu.busId) ?? known?.lostGpus.find((lost) => lost.busId === gpu.busId);
    return { ...gpu, listed: listed === undefined ? null : { index: listed.index, uuid: listed.uuid, name: listed.name } };
  });
}

export type UnreachableKnownGpu = UnreachableGpu & { listed: NonNullable<UnreachableListedGpu['listed']> };

/** `shard`'s given GPUs among `unreachable`, by UUID (by index without UUIDs). */
export function unreachableGiven(shard: ShardRecord, unreachable: readonly UnreachableListedGpu[]): UnreachableKnownGpu[] {
  if (unreachable.length === 0) return [];
  return shard.gpus.flatMap((registered, position) => {
    const uuid = shard.gpuUuids?.[position];
    const found = unreachable.find(
      (gpu): gpu is UnreachableKnownGpu => gpu.listed !== null && (uuid === undefined ? gpu.listed.index === registered : gpu.listed.uuid === uuid),
    );
    return found === undefined ? [] : [found];
  });
}
