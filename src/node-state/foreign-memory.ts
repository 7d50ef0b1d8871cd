// Owns foreign memory: per GPU, the memory held by anything that is not a registered shard, which
// placement must not hand out. It is the GPU's used memory minus what the shards' processes hold,
// so it includes unlisted holders (the driver's own context memory, processes of other PID
// namespaces), never below zero. A shard process whose memory nvidia-smi reports as [N/A] adds
// nothing to the shards' share, so foreign then includes it: wrong on the safe side for placement,
// which hands out less, never more. The answer counts those processes, so a reader knows shardMiB is
// then a lower bound and foreignMiB an upper one.
import type { NodeView } from './node-view.js';

export interface ForeignProcess {
  pid: number;
  name: string;
  usedMiB: number | null;
}

export interface GpuForeignMemory {
  index: number;
  uuid: string;
  usedMiB: number | null;
  /** The shards' known share: their processes with [N/A] memory add nothing. */
  shardMiB: number;
  /** Shard processes on this GPU whose memory nvidia-smi does not report ([N/A]). */
  unreportedShardProcesses: number;
  foreignMiB: number | null;
  foreignProcesses: ForeignProcess[];
}

const computed = new WeakMap<NodeView, GpuForeignMemory[]>();

/** Per GPU; computed once per node view (one snapshot and registry version), however often asked. */
export function foreignMemory(node: NodeView): GpuForeignMemory[] {
  let answer = computed.get(node);
  if (!answer) {
    answer = computeForeignMemory(node);
    computed.set(node, answer);
  }
  return answer;
}

function computeForeignMemory(node: NodeView): GpuForeignMemory[] {
  const { ownerByPid } = node.attribution;
  return node.snapshot.gpus.map((gpu) => {
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
}
