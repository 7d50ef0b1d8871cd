// Owns where a shard's given GPUs are in one snapshot. A registration names GPUs by index, as
// nvidia-smi numbered them then, and keeps each one's UUID. nvidia-smi numbers the GPUs the driver
// has, in bus order, so when one drops out (fallen off the bus, reset or detached) those after it
// move down one index. Judged by index, the shard on the lost GPU would be judged on its neighbour,
// and every shard after it would seem to hold a GPU it was not given. Judged by UUID, each shard
// keeps its own GPU under the index nvidia-smi gives it now, and a lost GPU is lost for its shard
// only. A registration without UUIDs (stored unchecked while nvidia-smi could not be asked, or by
// an older version) is judged by index.
// Also which given GPUs nvidia-smi says it cannot reach: it then fails the whole query and names the
// GPU by PCI bus id only, which the last snapshot that knew it (listed, or lost since) turns into its
// index and UUID.
import type { GpuRecord, UnreachableGpu } from '../system/nvidia-smi.js';
import type { ShardRecord } from '../shards/shard.js';

/** A GPU as a listing names it: enough to place a shard's GPUs and to match a bus id. */
type ListedGpu = Pick<GpuRecord, 'index' | 'uuid' | 'name' | 'busId'>;

export interface UnlistedGpu {
  /** Its index as registered. */
  index: number;
  /** Its UUID as registered; undefined for a registration without UUIDs. */
  uuid: string | undefined;
}

export interface Renumbered {
  /** Its index as registered. */
  registered: number;
  /** Its index in this snapshot. */
  now: number;
  uuid: string;
}

export interface Placement {
  /** The given GPUs this snapshot lists, by their index in it, in the registration's order. */
  indices: number[];
  /** The given GPUs this snapshot does not list. */
  unlisted: UnlistedGpu[];
  /** The given GPUs listed under another index than they were registered with. */
  renumbered: Renumbered[];
}

/** Where `shard`'s GPUs are among `gpus` (one snapshot's). */
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

/** The indices `shard`'s given GPUs have among `gpus` (those still listed); as registered without a listing. */
export function placedIndices(shard: ShardRecord, gpus: readonly ListedGpu[] | null): number[] {
  return gpus === null ? shard.gpus : placementOf(shard, gpus).indices;
}

/** A GPU nvidia-smi says it cannot reach, and what the last listing that had its bus id said it was. */
export interface UnreachableListedGpu extends UnreachableGpu {
  /** null when no listing of this process had its bus id (it went before nodecompute started). */
  listed: Pick<GpuRecord, 'index' | 'uuid' | 'name'> | null;
}

/**
 * `unreachable` (from a failed query), each matched by bus id with `known` (the last good snapshot):
 * a GPU it lists, or one it has lost (a GPU may drop out of the listing before nvidia-smi fails on it).
 */
export function listedAs(unreachable: readonly UnreachableGpu[], known: { gpus: readonly ListedGpu[]; lostGpus: readonly ListedGpu[] } | null): UnreachableListedGpu[] {
  return unreachable.map((gpu) => {
    const listed = known?.gpus.find((record) => record.busId === gpu.busId) ?? known?.lostGpus.find((lost) => lost.busId === gpu.busId);
    return { ...gpu, listed: listed === undefined ? null : { index: listed.index, uuid: listed.uuid, name: listed.name } };
  });
}

/** An unreachable GPU a listing had, so a shard's GPU can be matched with it. */
export type UnreachableKnownGpu = UnreachableGpu & { listed: NonNullable<UnreachableListedGpu['listed']> };

/**
 * The given GPUs of `shard` among `unreachable`: by UUID, or by index for a registration without
 * UUIDs. One no listing had cannot be matched with a shard's GPU.
 */
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
