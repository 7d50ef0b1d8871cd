// Owns which registered shard each GPU process belongs to, computed once per snapshot and registry
// version. A GPU process belongs to a shard when it is the shard's PID, or is in the shard's process
// group (an engine computing in a child is still the shard), or, for a cgroup shard, its cgroup
// contains the shard's string. Shards are matched in id order, so a process claimed by two shards
// is attributed deterministically to the first.
import type { ShardRecord } from '../shards/shard.js';
import type { GpuProcess, NodeSnapshot } from './node-snapshot.js';

export interface ShardGpuHolding {
  index: number;
  uuid: string;
  /** Sum of the known per-process memory; processes with [N/A] memory count as present but 0 MiB. */
  usedMiB: number;
  processes: GpuProcess[];
}

export type Liveness =
  | { state: 'alive' }
  | { state: 'gone'; why: string }
  /** The snapshot was taken before this shard was registered: no /proc facts yet. */
  | { state: 'unknown' };

export interface Attribution {
  /** The shard that owns a GPU process, by PID; absent when foreign. */
  ownerByPid: ReadonlyMap<number, string>;
  /** Per shard, per GPU index it holds memory on. */
  holdings: ReadonlyMap<string, ReadonlyMap<number, ShardGpuHolding>>;
  liveness: ReadonlyMap<string, Liveness>;
}

function pidShardLiveness(snapshot: NodeSnapshot, shard: ShardRecord): Liveness {
  const pid = shard.identity.pid;
  if (!snapshot.proc.has(pid)) return { state: 'unknown' };
  const stat = snapshot.proc.get(pid);
  if (!stat) return { state: 'gone', why: `process ${pid} no longer exists` };
  if (stat.state === 'Z' || stat.state === 'X') {
    return { state: 'gone', why: `process ${pid} has exited (a zombie its parent has not reaped yet)` };
  }
  if (stat.startTime !== shard.identity.startTime) {
    return {
      state: 'gone',
      why: `PID ${pid} now belongs to another process (${stat.comm}, started at tick ${stat.startTime}, not ${shard.identity.startTime}): the registered process exited and its PID was reused`,
    };
  }
  return { state: 'alive' };
}

function cgroupShardLiveness(snapshot: NodeSnapshot, cgroup: string): Liveness {
  const members = snapshot.cgroupPids.get(cgroup);
  if (!members) return { state: 'unknown' };
  if (members.size === 0) return { state: 'gone', why: `no process is left in cgroup "${cgroup}"` };
  return { state: 'alive' };
}

/**
 * Who claims a GPU process, built once per attribution so that each process costs at most three map
 * lookups whatever the number of shards: `strong` holds every PID a shard *is* (its PID, or a member of its
 * cgroup), `byGroup` the current process group of each PID shard. Shards are added in id order and
 * the first claim stands, so among equals the first id wins.
 */
interface Claims {
  strong: Map<number, string>;
  byGroup: Map<number, string>;
}

function addClaims(claims: Claims, snapshot: NodeSnapshot, shard: ShardRecord, liveness: Liveness): void {
  // A shard that is gone claims nothing: its PID may now be someone else's, and memory its orphans
  // still hold is, for placement, as unavailable as anybody else's.
  if (liveness.state === 'gone') return;
  const claim = (map: Map<number, string>, key: number) => {
    if (!map.has(key)) map.set(key, shard.id);
  };
  if (shard.cgroup !== null) {
    for (const pid of snapshot.cgroupPids.get(shard.cgroup) ?? []) claim(claims.strong, pid);
    return;
  }
  const pid = shard.identity.pid;
  claim(claims.strong, pid);
  // Its current group is authoritative (it may have called setpgid since registration).
  claim(claims.byGroup, snapshot.proc.get(pid)?.pgrp ?? shard.identity.pgid);
}

/**
 * The owner of a GPU process: the shard it *is* wins over a shard whose group it is in, so two
 * shards started by one script (one process group) each keep their own process.
 */
function ownerOf(pid: number, snapshot: NodeSnapshot, claims: Claims): string | undefined {
  const strong = claims.strong.get(pid);
  if (strong !== undefined) return strong;
  const group = snapshot.proc.get(pid)?.pgrp;
  return group === undefined ? undefined : claims.byGroup.get(group);
}

export function attribute(snapshot: NodeSnapshot, shards: readonly ShardRecord[]): Attribution {
  // Ids are unique, so the order is total.
  const ordered = [...shards].sort((a, b) => (a.id < b.id ? -1 : 1));
  const liveness = new Map<string, Liveness>();
  const claims: Claims = { strong: new Map(), byGroup: new Map() };
  for (const shard of ordered) {
    const state = shard.cgroup !== null ? cgroupShardLiveness(snapshot, shard.cgroup) : pidShardLiveness(snapshot, shard);
    liveness.set(shard.id, state);
    addClaims(claims, snapshot, shard, state);
  }
  const ownerByPid = new Map<number, string>();
  const holdings = new Map<string, Map<number, ShardGpuHolding>>(ordered.map((shard) => [shard.id, new Map()]));
  for (const gpu of snapshot.gpus) {
    for (const process of gpu.processes) {
      const owner = ownerOf(process.pid, snapshot, claims);
      if (owner === undefined) continue;
      ownerByPid.set(process.pid, owner);
      const perGpu = holdings.get(owner)!;
      const holding = perGpu.get(gpu.index) ?? { index: gpu.index, uuid: gpu.uuid, usedMiB: 0, processes: [] };
      holding.usedMiB += process.usedMiB ?? 0;
      holding.processes.push(process);
      perGpu.set(gpu.index, holding);
    }
  }
  return { ownerByPid, holdings, liveness };
}
