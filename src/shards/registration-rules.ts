// Owns how one registration relates to another: a replacement for the same run and GPUs keeps the
// registration time, and with it the grace clock (a control plane re-PUTting its shards must not put
// an on-cpu shard back into starting); a second id for a target, or for one covering the same
// processes, is a conflict (attribution would give its memory to one id and leave the other on-cpu).
import { ShardConflictError } from '../errors.js';
import { sameProcess, type ShardRecord } from './shard.js';

/** How `other` covers a process of the registration being made though their targets differ, mid-sentence ("runs in the cgroup \"pod-a\""). */
export type Overlaps = (other: ShardRecord) => string | null;

/** Whether a replacing registration names the same process or the same cgroup. */
function sameTarget(a: ShardRecord, b: ShardRecord): boolean {
  if (a.cgroup !== null || b.cgroup !== null) return a.cgroup === b.cgroup;
  return sameProcess(a.identity, b.identity);
}

/** The same process, or for a cgroup the same engine process (its identity): a restarted container is another run. */
export function sameRun(a: ShardRecord, b: ShardRecord): boolean {
  return sameTarget(a, b) && sameProcess(a.identity, b.identity);
}

function sameMembers<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((member) => b.includes(member));
}

/** The same devices where both know their UUIDs (nvidia-smi may renumber), else the same indices. */
function sameGpus(a: ShardRecord, b: ShardRecord): boolean {
  return a.gpuUuids !== undefined && b.gpuUuids !== undefined ? sameMembers(a.gpuUuids, b.gpuUuids) : sameMembers(a.gpus, b.gpus);
}

const FIELDS = ['id', 'pid', 'cgroup', 'engine', 'graceMs', 'minGpuWeightsShare'] as const;
const IDENTITY_FIELDS = ['pid', 'pgid', 'startTime', 'name', 'bootId'] as const;

/** Every field but the registration time. */
function sameRegistration(a: ShardRecord, b: ShardRecord): boolean {
  return (
    FIELDS.every((field) => a[field] === b[field]) &&
    sameMembers(a.gpus, b.gpus) &&
    a.gpuUuids?.join() === b.gpuUuids?.join() &&
    a.migDevices?.join() === b.migDevices?.join() &&
    IDENTITY_FIELDS.every((field) => a.identity[field] === b.identity[field])
  );
}

/** Another id registered for the same target as `record`, or covering the same processes; `relation`: how (Overlaps), null for the same target. */
export type Conflict = { other: ShardRecord; relation: string | null };

export function conflicting(shards: ReadonlyMap<string, ShardRecord>, record: ShardRecord, overlaps: Overlaps): Conflict | undefined {
  for (const shard of shards.values()) {
    if (shard.id === record.id) continue;
    if (sameTarget(shard, record)) return { other: shard, relation: null };
    const relation = overlaps(shard);
    if (relation !== null) return { other: shard, relation };
  }
  return undefined;
}

/** A registration's process, as a conflict names it: "PID (name, started at tick T)". */
export function processOf(record: Pick<ShardRecord, 'identity'>): string {
  return `${record.identity.pid} (${record.identity.name}, started at tick ${record.identity.startTime})`;
}

export function conflictError(record: ShardRecord, { other, relation }: Conflict): Error {
  const named = record.cgroup !== null ? `The cgroup "${record.cgroup}"` : `Process ${processOf(record)}`;
  const target = relation === null ? `${named} is` : `${named} ${relation}, which is`;
  const family = record.cgroup === null && other.cgroup === null && relation !== null ? " A PID shard's descendants and the process group it leads are part of it." : '';
  const split = 'Under two ids its GPU memory would go to one, and the other would read on-cpu while computing on the GPU';
  const fix = `To register it as "${record.id}", DELETE /shards/${other.id} first; to change its GPUs, grace or engine, PUT /shards/${other.id} instead.`;
  return new ShardConflictError(`${target} already registered as shard "${other.id}".${family} ${split}. ${fix}`);
}

/** What a replacement stores: the previous record if unchanged; for the same run and GPUs, the new one at the previous time; else the new one. */
export function replacement(previous: ShardRecord | undefined, record: ShardRecord): { stored: ShardRecord; graceKept: boolean; unchanged: boolean } {
  if (previous === undefined || !sameRun(previous, record) || !sameGpus(previous, record)) return { stored: record, graceKept: false, unchanged: false };
  if (sameRegistration(previous, record)) return { stored: previous, graceKept: true, unchanged: true };
  return { stored: { ...record, registeredAt: previous.registeredAt }, graceKept: true, unchanged: false };
}
