// Owns which GPUs nvidia-smi has stopped listing: every GPU a snapshot of this process listed, by
// UUID, and those the latest snapshot no longer lists. A GPU that falls off the bus (Xid 79), is
// reset, or is detached from the node drops out of nvidia-smi's list without an error, and nothing
// else would say so: its memory figures simply vanish from /gpus and /metrics, and only a shard
// placed on it would notice. A GPU is lost from the first snapshot that does not list it until one
// lists it again; each change is logged once. The roster lives as long as the process: a GPU lost
// before nodecompute started was never listed, so it is not known here (the doctor's
// registered-gpus check finds those a stored registration names; its GPU count, compared with the
// node's hardware, the others). It also holds the words for a GPU nvidia-smi cannot reach: those of
// a failed query, and those a listing printed beside the GPUs it did list (a lost GPU then carries
// them, and one never listed is logged once with them while they last).
import type { Logger } from 'pino';
import { unreachableGpusIn, type GpuRecord, type UnreachableGpu } from '../system/nvidia-smi.js';
import type { UnreachableListedGpu } from './placement.js';

export interface LostGpu {
  /** Its index when it was last listed (indices can shift once a GPU is gone). */
  index: number;
  uuid: string;
  name: string;
  /** Its PCI bus id when it was last listed (GpuRecord.busId): nvidia-smi's errors name it by this. */
  busId: string | null;
  /** When a snapshot last listed it (ms since the epoch). */
  lastListedAt: number;
  /** When the first snapshot that did not list it was taken: it went between lastListedAt and this. */
  lostAt: number;
  /** What the latest listing said of its bus id, when it said it cannot reach it ("Unknown Error"). */
  said?: string;
}

export interface GpuRoster {
  /**
   * Records the GPUs one snapshot lists, taken at `at`, with those its listing said it cannot reach
   * (`unreachable`), and answers the GPUs it no longer lists, by index.
   */
  update(listed: readonly GpuRecord[], at: number, unreachable?: readonly UnreachableGpu[]): LostGpu[];
}

/** What a listing said of a lost GPU's bus id, in the log, the doctor and a shard's reason alike. */
export const saidOfBusId = (busId: string | null, said: string): string => `nvidia-smi says of its bus id ${busId}: ${JSON.stringify(said)}`;

/** The words for a lost GPU, in the log and in the doctor alike. */
export const gpuNoLongerListed = (gpu: Pick<LostGpu, 'index' | 'uuid' | 'name'>): string => `GPU ${gpu.index} (${gpu.uuid}, ${gpu.name}) is no longer listed by nvidia-smi`;
export const LOST_GPU_MEANING =
  'it fell off the bus, was reset or was detached. Its memory is no longer in /gpus or /metrics, and shards placed on it cannot hold it.';
/** nvidia-smi's words for a GPU it cannot reach (its failed query names it by bus id), with what the last listing that had it said it was. */
export const gpuUnreachable = ({ busId, said, listed }: { busId: string; said: string; listed: Pick<LostGpu, 'index' | 'uuid' | 'name'> | null }): string =>
  `nvidia-smi cannot reach ${listed === null ? `the GPU at PCI ${busId}` : `GPU ${listed.index} (${listed.uuid}, ${listed.name}, PCI ${busId})`}: it says ${JSON.stringify(said)}`;
/**
 * For an nvidia-smi failure `message`, which names GPUs it cannot reach by bus id alone: what
 * nodecompute last listed each as (`unreachable`, NodeService.unreachable(): a GPU of the latest
 * snapshot, or one it has lost since), as a sentence to append; '' when the message names none a
 * listing had. A bus id no listing had is left as nvidia-smi said it.
 */
export function unreachableListedIn(message: string, unreachable: readonly UnreachableListedGpu[]): string {
  const named = new Set(unreachableGpusIn(message).map((gpu) => gpu.busId));
  const known = unreachable.filter((gpu) => named.has(gpu.busId) && gpu.listed !== null);
  if (known.length === 0) return '';
  return ` nodecompute last listed ${known.map(({ busId, listed }) => `PCI ${busId} as GPU ${listed!.index} (${listed!.uuid}, ${listed!.name})`).join(', ')}.`;
}
export const UNREACHABLE_GPU_MEANING =
  "nvidia-smi cannot get a handle on that GPU (it has fallen off the bus, hung, or lost power), so nothing can compute on it; and while nvidia-smi's queries fail, this node's other shards cannot be verified either once the last good snapshot is older than max-stale.";
export const LOST_GPU_FIX =
  'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU.';

export function createGpuRoster(log: Logger): GpuRoster {
  const known = new Map<string, Omit<LostGpu, 'lostAt'>>();
  /** Lost GPUs by UUID, each with when it was first missed. */
  const lost = new Map<string, number>();
  /** Bus ids no listing had that a listing says it cannot reach, logged once while it says so. */
  let unknownSaid = new Set<string>();
  return {
    update(listed, at, unreachable = []) {
      const saidOf = new Map<string | null, string>(unreachable.map((gpu) => [gpu.busId, gpu.said]));
      const listedNow = new Set<string>();
      for (const gpu of listed) {
        listedNow.add(gpu.uuid);
        if (lost.delete(gpu.uuid)) {
          const was = known.get(gpu.uuid)!;
          log.info(
            { gpu: gpu.index, uuid: gpu.uuid, missingForMs: at - was.lastListedAt },
            `GPU ${gpu.index} (${gpu.uuid}) is listed by nvidia-smi again. Check dmesg for what happened to it while it was gone.`,
          );
        }
        known.set(gpu.uuid, { index: gpu.index, uuid: gpu.uuid, name: gpu.name, busId: gpu.busId, lastListedAt: at });
      }
      for (const [uuid, gpu] of known) {
        if (listedNow.has(uuid) || lost.has(uuid)) continue;
        lost.set(uuid, at);
        const said = saidOf.get(gpu.busId);
        log.warn(
          { gpu: gpu.index, uuid, lastListedAt: new Date(gpu.lastListedAt).toISOString() },
          `${gpuNoLongerListed(gpu)}${said === undefined ? '' : ` (${saidOfBusId(gpu.busId, said)})`}: ${LOST_GPU_MEANING} ${LOST_GPU_FIX}`,
        );
      }
      const knownBusIds = new Set([...known.values()].map((gpu) => gpu.busId));
      const unknown = unreachable.filter((gpu) => !knownBusIds.has(gpu.busId));
      for (const gpu of unknown) {
        if (unknownSaid.has(gpu.busId)) continue;
        log.warn(
          { busId: gpu.busId },
          `${gpuUnreachable({ ...gpu, listed: null })}, and lists the other GPUs. nodecompute never listed that GPU (it was lost before nodecompute started), ` +
            `so it is not in /gpus and no shard can be placed on it. ${LOST_GPU_FIX}`,
        );
      }
      unknownSaid = new Set(unknown.map((gpu) => gpu.busId));
      return [...lost]
        .map(([uuid, lostAt]) => {
          const gpu = known.get(uuid)!;
          const said = saidOf.get(gpu.busId);
          return said === undefined ? { ...gpu, lostAt } : { ...gpu, lostAt, said };
        })
        .sort((a, b) => a.index - b.index);
    },
  };
}
