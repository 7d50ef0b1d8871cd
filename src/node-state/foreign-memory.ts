// Owns foreign memory: per GPU, used memory minus what registered shards' processes hold (never below
// zero), so it includes the driver's context and hidden processes. A shard process with [N/A] memory
// adds nothing to the shards' share: foreign is then an upper bound, safe for placement.
import type { Static } from '@sinclair/typebox';
import type { ForeignMemoryGpuComponent } from '../schemas/shards.js';
import type { NodeView } from './node-view.js';

/** A GPU of GET /gpus/foreign-memory, but for what nvidia-smi says when it cannot reach it. */
export type GpuForeignMemory = Omit<Static<typeof ForeignMemoryGpuComponent>, 'unreachable'>;
export type ForeignProcess = GpuForeignMemory['foreignProcesses'][number];

const computed = new WeakMap<NodeView, GpuForeignMemory[]>();

/** Per GPU, in the snapshot's order; computed once per node view. */
export function foreignMemory(node: NodeView): GpuForeignMemory[] {
  const cached = computed.get(node);
  if (cached) return cached;
  const { ownerByPid } = node.attribution;
  const answer = node.snapshot.gpus.map((gpu) => {
    let shardMiB = 0;
    let unreportedShardProcesses = 0;
    const foreignProcesses: ForeignProcess[] = [];
    for (const process of gpu.processes) {
      if (!ownerByPid.has(process.pid)) foreignProcesses.push({ pid: process.pid, name: process.name, usedMiB: process.usedMiB });
      else if (process.usedMiB === null) unreportedShardProcesses += 1;
      else shardMiB += process.usedMiB;
    }
    return {
      index: gpu.index,
      uuid: gpu.uuid,
      usedMiB: gpu.usedMiB,
      shardMiB,
      unreportedShardProcesses,
      foreignMiB: gpu.usedMiB === null ? null : Math.max(0, gpu.usedMiB - shardMiB),
      foreignProcesses,
    };
  });
  computed.set(node, answer);
  return answer;
}
