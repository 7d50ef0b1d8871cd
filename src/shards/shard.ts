// Owns the shape of a registered shard as the registry keeps it and persists it. A shard is either
// one process (and its process group) or every process of a cgroup (a container id or pod UID).
export const ENGINES = ['llama.cpp', 'vllm', 'other'] as const;
export type Engine = (typeof ENGINES)[number];

/** Who the shard's process was when it was registered: tells a live process from a reused PID. */
export interface ProcessIdentity {
  pid: number;
  pgid: number;
  startTime: number;
  name: string;
  /**
   * The node's boot it ran in (ProcReader.bootId): a PID and a start time name a process of that
   * boot only. Absent when /proc could not say, or in a registration stored before it was recorded.
   */
  bootId?: string;
}

/**
 * Whether the process ran in another boot of the node than `bootId` (the one /proc names now, or
 * another identity's): only when both are known. It is gone then, and its PID and process group
 * number name that boot's processes, not this one's.
 */
export function ranInAnotherBoot(identity: ProcessIdentity, bootId: string | null | undefined): boolean {
  return identity.bootId !== undefined && bootId != null && identity.bootId !== bootId;
}

export interface ShardRecord {
  id: string;
  pid: number | null;
  cgroup: string | null;
  gpus: number[];
  /**
   * The UUIDs of `gpus` at registration, in the same order: the shard is judged on these devices
   * under whatever index nvidia-smi gives them later (node-state/placement.ts). Absent when
   * nvidia-smi could not be asked at registration, or in a registration stored before they were kept.
   */
  gpuUuids?: string[];
  engine: Engine;
  /** How long after registration the shard may go without holding its GPUs before it is on-cpu. */
  graceMs: number;
  registeredAt: number;
  /**
   * The shard's process at registration; for a cgroup shard, its oldest process then that is not the
   * pod's sandbox (the engine's run: a restarted container has another), or the sandbox when only it runs.
   */
  identity: ProcessIdentity;
}

/** Whether two identities name the same process: PID and start time, in the same boot where both know it. */
export function sameProcess(a: ProcessIdentity, b: ProcessIdentity): boolean {
  return a.pid === b.pid && a.startTime === b.startTime && !ranInAnotherBoot(a, b.bootId);
}
