// Owns where a shard's given GPUs are in one listing: by UUID, so each keeps its shard when
// nvidia-smi renumbers the GPUs after a lost one (by index for a registration without UUIDs). Also
// which given GPUs nvidia-smi cannot reach, matched by bus id with the last listing that had them.
import type { GpuRecord, UnreachableGpu } from '../system/gpu-driver.js';
import type { ShardRecord } from '../shards/shard.js';

type ListedGpu = Pick<GpuRecord, 'index' | 'uuid' | 'name' | 'busId'>;

/** As registered; uuid undefined for a registration without UUIDs. */
export type UnlistedGpu = { index: number; uuid: string | undefined };

/** A given GPU listed under another index (`now`) than registered. */
export type Renumbered = { registered: number; now: number; uuid: string };

/** `indices`: the given GPUs listed, by their index now, in the registration's order. */
export function placementOf(shard: ShardRecord, gpus: readonly ListedGpu[]): { indices: number[]; unlisted: UnlistedGpu[]; renumbered: Renumbered[] } {
  const indices: number[] = [];
  const unlisted: UnlistedGpu[] = [];
  const renumbered: Renumbered[] = [];
  shard.gpus.forEach((registered, position) => {
    const uuid = shard.gpuUuids?.[position];
    const listed = uuid === undefined ? gpus.find((gpu) => gpu.index === registered) : gpus.find((gpu) => gpu.uuid === uuid);
    if (listed === undefined) {
      unlisted.push({ index: registered, uuid });
      return;
    }
    indices.push(listed.index);
    if (listed.index !== registered) renumbered.push({ registered, now: listed.index, uuid: listed.uuid });
  });
  return { indices, unlisted, renumbered };
}

/** As registered without a listing. */
export function placedIndices(shard: ShardRecord, gpus: readonly ListedGpu[] | null): number[] {
  return gpus === null ? shard.gpus : placementOf(shard, gpus).indices;
}

/** `listed`: what the last listing with its bus id said it was; null when none had it. */
export type UnreachableListedGpu = UnreachableGpu & { listed: Pick<GpuRecord, 'index' | 'uuid' | 'name'> | null };

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
  return shard.gpus.flatMap((registered, position) => {
    const uuid = shard.gpuUuids?.[position];
    const found = unreachable.find(
      (gpu): gpu is UnreachableKnownGpu => gpu.listed !== null && (uuid === undefined ? gpu.listed.index === registered : gpu.listed.uuid === uuid),
    );
    return found === undefined ? [] : [found];
  });
}
