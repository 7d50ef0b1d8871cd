// Owns how much CPU a shard's processes burn: the cores its processes used between the last two
// snapshots (NodeSnapshot.cpuCores), summed over its registered process (while it is the process
// registered), its cgroup's members and the GPU processes attribution gave it. The rule: a process
// counts once, and only when both snapshots read it; none read twice reads null, not 0.
import type { ShardRecord } from '../shards/shard.js';
import { statOf } from './node-snapshot.js';
import type { NodeView } from './node-view.js';

/** Cores, to two decimals: the 10 ms clock tick makes finer figures noise. */
const round2 = (value: number): number => Math.round(value * 100) / 100;

export function shardCpuCores(shard: ShardRecord, node: NodeView): number | null {
  const { snapshot } = node;
  const pids = new Set<number>();
  if (shard.pid !== null && statOf(snapshot, shard.pid)?.startTime === shard.identity.startTime) pids.add(shard.pid);
  if (shard.cgroup !== null) for (const pid of snapshot.cgroupPids.get(shard.cgroup) ?? []) pids.add(pid);
  for (const holding of node.attribution.holdings.get(shard.id)?.values() ?? []) for (const process of holding.processes) pids.add(process.pid);
  let cores: number | null = null;
  for (const pid of pids) {
    const used = snapshot.cpuCores.get(pid);
    if (used !== undefined) cores = (cores ?? 0) + used;
  }
  return cores === null ? null : round2(cores);
}
