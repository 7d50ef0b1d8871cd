// Owns foreign memory: per GPU (and per MIG device where NVML lists them), used memory minus what registered shards' processes hold (never below
// zero), so it includes the driver's context and hidden processes. A shard process with [N/A] memory
// adds nothing to the shards' share: foreign is then an upper bound, safe for placement.
import type { Static } from '@sinclair/typebox';
import type { ForeignMemoryGpuComponent } from '../schemas/shards.js';
import type { GpuProcess } from './node-snapshot.js';
import type { NodeView } from './node-view.js';

/** A GPU of GET /gpus/foreign-memory, but for what nvidia-smi says when it cannot reach it. */
export type GpuForeignMemory = Omit<Static<typeof ForeignMemoryGpuComponent>, 'unreachable'>;
export type ForeignProcess = GpuForeignMemory['foreignProcesses'][number];

const computed = new WeakMap<NodeView, GpuForeignMemory[]>();

/** `usedMiB` of a GPU or MIG device between the shards' processes among `processes` and the rest. */
function split(usedMiB: number | null, processes: readonly GpuProcess[], ownerByPid: ReadonlyMap<number, string>) {
  let shardMiB = 0;
  let unreportedShardProcesses = 0;
  const foreignProcesses: ForeignProcess[] = [];
  for (const process of processes) {
    if (!ownerByPid.has(process.pid)) foreignProcesses.push({ pid: process.pid, name: process.name, usedMiB: process.usedMiB });
    else if (process.usedMiB === null) unreportedShardProcesses += 1;
    else shardMiB += process.usedMiB;
  }
  return { usedMiB, shardMiB, unreportedShardProcesses, foreignMiB: usedMiB === null ? null : Math.max(0, usedMiB - shardMiB), foreignProcesses };
}

/** Per GPU, in the snapshot's order; computed once per node view. */
export function foreignMemory(node: NodeView): GpuForeignMemory[] {
  const cached = computed.get(node);
  if (cached) return cached;
  const { ownerByPid } = node.attribution;
  const answer = node.snapshot.gpus.map((gpu) => ({
    index: gpu.index,
    uuid: gpu.uuid,
    ...split(gpu.usedMiB, gpu.processes, ownerByPid),
    migDevices:
      gpu.migDevices?.map((mig) => ({
        uuid: mig.uuid,
        profile: mig.profile,
        ...split(mig.usedMiB, gpu.processes.filter((process) => process.migUuid === mig.uuid), ownerByPid),
      })) ?? null,
  }));
  computed.set(node, answer);
  return answer;
}
