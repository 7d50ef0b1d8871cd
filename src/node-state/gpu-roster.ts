// Owns which GPUs nvidia-smi has stopped listing: every GPU a snapshot of this process listed, by
// UUID, is lost from the first snapshot that omits it until one lists it again (fallen off the bus,
// reset or detached GPUs vanish without an error). Each change is logged once. Also the words for a
// lost GPU and for one nvidia-smi cannot reach.
import type { Logger } from 'pino';
import { unreachableOf, type GpuRecord, type UnreachableGpu } from '../system/nvidia-smi.js';
import type { UnreachableListedGpu } from './placement.js';

export interface LostGpu {
  /** Its index when last listed (indices shift once a GPU is gone). */
  index: number;
  uuid: string;
  name: string;
  /** Its PCI bus id when last listed: nvidia-smi's errors name it by this. */
  busId: string | null;
  lastListedAt: number;
  lostAt: number;
  /** What the latest listing said of its bus id when it cannot reach it ("Unknown Error"). */
  said?: string;
}

export const saidOfBusId = (busId: string | null, said: string): string => `the GPU driver says of its bus id ${busId}: ${JSON.stringify(said)}`;
export const gpuNoLongerListed = (gpu: Pick<LostGpu, 'index' | 'uuid' | 'name'>): string => `GPU ${gpu.index} (${gpu.uuid}, ${gpu.name}) is no longer listed by the GPU driver`;
export const LOST_GPU_MEANING =
  'it fell off the bus, was reset or was detached. Its memory is no longer in /gpus or /metrics, and shards placed on it cannot hold it.';
export const gpuUnreachable = ({ busId, said, listed }: { busId: string; said: string; listed: Pick<LostGpu, 'index' | 'uuid' | 'name'> | null }): string =>
  `the GPU driver cannot reach ${listed === null ? `the GPU at PCI ${busId}` : `GPU ${listed.index} (${listed.uuid}, ${listed.name}, PCI ${busId})`}: it says ${JSON.stringify(said)}`;
/** For an nvidia-smi failure, a sentence naming what each bus id it names was last listed as; '' when none. */
export function unreachableListedIn(err: Error, unreachable: readonly UnreachableListedGpu[]): string {
  const named = new Set(unreachableOf(err).map((gpu) => gpu.busId));
  const known = unreachable.filter((gpu) => named.has(gpu.busId) && gpu.listed !== null);
  if (known.length === 0) return '';
  return ` nodecompute last listed ${known.map(({ busId, listed }) => `PCI ${busId} as GPU ${listed!.index} (${listed!.uuid}, ${listed!.name})`).join(', ')}.`;
}
export const UNREACHABLE_GPU_MEANING =
  "the GPU driver cannot get a handle on that GPU (it has fallen off the bus, hung, or lost power), so nothing can compute on it; and while the driver's queries fail, this node's other shards cannot be verified either once the last good snapshot is older than max-stale.";
export const LOST_GPU_FIX =
  'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU.';

/** `update` records one listing taken at `at` and answers the GPUs no longer listed, by index. */
export function createGpuRoster(log: Logger) {
  const known = new Map<string, Omit<LostGpu, 'lostAt'>>();
  /** Lost GPUs by UUID, with when each was first missed. */
  const lost = new Map<string, number>();
  /** Unreachable bus ids no listing had, logged once while they last. */
  let unknownSaid = new Set<string>();
  return {
    update(listed: readonly GpuRecord[], at: number, unreachable: readonly UnreachableGpu[] = []): LostGpu[] {
      const saidOf = new Map<string | null, string>(unreachable.map((gpu) => [gpu.busId, gpu.said]));
      const listedNow = new Set(listed.map((gpu) => gpu.uuid));
      for (const gpu of listed) {
        if (lost.delete(gpu.uuid)) {
          const was = known.get(gpu.uuid)!;
          const back = `GPU ${gpu.index} (${gpu.uuid}) is listed by the GPU driver again. Check dmesg for what happened to it while it was gone.`;
          log.info({ gpu: gpu.index, uuid: gpu.uuid, missingForMs: at - was.lastListedAt }, back);
        }
        known.set(gpu.uuid, { index: gpu.index, uuid: gpu.uuid, name: gpu.name, busId: gpu.busId, lastListedAt: at });
      }
      for (const [uuid, gpu] of known) {
        if (listedNow.has(uuid) || lost.has(uuid)) continue;
        lost.set(uuid, at);
        const said = saidOf.get(gpu.busId);
        const gone = `${gpuNoLongerListed(gpu)}${said === undefined ? '' : ` (${saidOfBusId(gpu.busId, said)})`}: ${LOST_GPU_MEANING} ${LOST_GPU_FIX}`;
        log.warn({ gpu: gpu.index, uuid, lastListedAt: new Date(gpu.lastListedAt).toISOString() }, gone);
      }
      const knownBusIds = new Set([...known.values()].map((gpu) => gpu.busId));
      const unknown = unreachable.filter((gpu) => !knownBusIds.has(gpu.busId));
      for (const gpu of unknown) {
        if (unknownSaid.has(gpu.busId)) continue;
        const never = 'nodecompute never listed that GPU (lost before it started), so it is not in /gpus and no shard can be placed on it';
        log.warn({ busId: gpu.busId }, `${gpuUnreachable({ ...gpu, listed: null })}, and lists the other GPUs. ${never}. ${LOST_GPU_FIX}`);
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
