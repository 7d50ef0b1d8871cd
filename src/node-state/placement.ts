// Owns where a shard's given GPUs are in one snapshot. A registration names GPUs by index, as
// nvidia-smi numbered them then, and keeps each one's UUID. nvidia-smi numbers the GPUs the driver
// has, in bus order, so when one drops out (fallen off the bus, reset or detached) those after it
// move down one index. Judged by index, the shard on the lost GPU would be judged on its neighbour,
// and every shard after it would seem to hold a GPU it was not given. Judged by UUID, each shard
// keeps its own GPU under the index nvidia-smi gives it now, and a lost GPU is lost for its shard
// only. A registration without UUIDs (stored unchecked while nvidia-smi could not be asked, or by
// an older version) is judged by index.
import type { GpuState } from './node-snapshot.js';
import type { ShardRecord } from '../shards/shard.js';

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
export function placementOf(shard: ShardRecord, gpus: readonly GpuState[]): Placement {
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
export function placedIndices(shard: ShardRecord, gpus: readonly GpuState[] | null): number[] {
  return gpus === null ? shard.gpus : placementOf(shard, gpus).indices;
}
