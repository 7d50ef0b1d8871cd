// Owns the answers derived from one snapshot and one registry version, computed once and shared by
// every request that sees the same pair (attribution walks every GPU process, so it must not run
// per request). Also owns the GPU view of GET /gpus.
import type { GpusResponse } from '../schemas/gpus.js';
import type { ShardRecord } from '../shards/shard.js';
import { attribute, type Attribution } from './attribution.js';
import type { NodeSnapshot } from './node-snapshot.js';
import type { SnapshotView } from './snapshot.js';

export interface NodeView {
  snapshot: NodeSnapshot;
  attribution: Attribution;
  registryVersion: number;
  /** nvidia-smi lists GPU processes but none of their PIDs exists in this /proc (no host PID namespace). */
  pidsInvisible: boolean;
}

function pidsInvisible(snapshot: NodeSnapshot): boolean {
  const listed = snapshot.gpus.flatMap((gpu) => gpu.processes.map((process) => process.pid));
  return listed.length > 0 && listed.every((pid) => snapshot.proc.get(pid) == null);
}

/** The view of one snapshot for one registry version: attribution and the facts every answer shares. */
export function createNodeView(snapshot: NodeSnapshot, shards: readonly ShardRecord[], registryVersion: number): NodeView {
  return { snapshot, attribution: attribute(snapshot, shards), registryVersion, pidsInvisible: pidsInvisible(snapshot) };
}

export interface SnapshotMeta {
  observedAt: string;
  ageMs: number;
  stale: boolean;
  staleReason?: string;
}

export function snapshotMeta(view: SnapshotView<unknown>): SnapshotMeta {
  const meta: SnapshotMeta = {
    observedAt: new Date(view.observedAt).toISOString(),
    ageMs: Math.round(view.ageMs),
    stale: view.stale,
  };
  if (view.staleReason !== null) meta.staleReason = view.staleReason;
  return meta;
}

/** Memoises the derived view per snapshot object and registry version. */
export function createNodeViewCache(): (
  snapshot: NodeSnapshot,
  registryVersion: number,
  shards: () => readonly ShardRecord[],
) => NodeView {
  let last: NodeView | null = null;
  return (snapshot, registryVersion, shards) => {
    if (last && last.snapshot === snapshot && last.registryVersion === registryVersion) return last;
    last = createNodeView(snapshot, shards(), registryVersion);
    return last;
  };
}

/** The `gpus` of GET /gpus: every GPU with its processes, each attributed to its shard. */
export function gpusResponse(node: NodeView): GpusResponse['gpus'] {
  const owner = node.attribution.ownerByPid;
  return node.snapshot.gpus.map((gpu) => ({
      index: gpu.index,
      uuid: gpu.uuid,
      name: gpu.name,
      memory: { totalMiB: gpu.totalMiB, usedMiB: gpu.usedMiB, freeMiB: gpu.freeMiB, reservedMiB: gpu.reservedMiB },
      processes: gpu.processes.map((process) => ({
        pid: process.pid,
        name: process.name,
        usedMiB: process.usedMiB,
        shard: owner.get(process.pid) ?? null,
      })),
    }));
}
