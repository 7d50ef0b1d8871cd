// Owns the shape of a registered shard as the registry keeps it and persists it. A shard is either
// one process (and its process group) or every process of a cgroup (a container id or pod UID).
export const ENGINES = ['llama.cpp', 'ollama', 'vllm', 'other'] as const;
export type Engine = (typeof ENGINES)[number];

/** Who the shard's process was when it was registered: tells a live process from a reused PID. */
export interface ProcessIdentity {
  pid: number;
  pgid: number;
  startTime: number;
  name: string;
  /** The boot it ran in (ProcReader.bootId): a PID and start time name a process of that boot only. Absent: unknown. */
  bootId?: string;
}

/** Whether it ran in another boot than `bootId` (both known): it is gone, and its PID names another process now. */
export function ranInAnotherBoot(identity: ProcessIdentity, bootId: string | null | undefined): boolean {
  return identity.bootId !== undefined && bootId != null && identity.bootId !== bootId;
}

export interface ShardRecord {
  id: string;
  pid: number | null;
  cgroup: string | null;
  gpus: number[];
  /** The UUIDs of `gpus` at registration, in order: judged on these devices under later indices. Absent: unknown. */
  gpuUuids?: string[];
  /** MIG devices (MIG-... UUIDs) of those GPUs the shard was placed on; absent: whole GPUs. */
  migDevices?: string[];
  engine: Engine;
  /** How long after registration the shard may go without holding its GPUs before it is on-cpu. */
  graceMs: number;
  /** The least share of its weights (0 to 1) that must be on its GPUs for it to be ready; absent: any share serves, with a warning. */
  minGpuWeightsShare?: number;
  registeredAt: number;
  /** Its process at registration; for a cgroup, the oldest one not the pod's sandbox (the engine's run), else the sandbox. */
  identity: ProcessIdentity;
}

/** Whether two identities name the same process: PID and start time, in the same boot where both know it. */
export function sameProcess(a: ProcessIdentity, b: ProcessIdentity): boolean {
  return a.pid === b.pid && a.startTime === b.startTime && !ranInAnotherBoot(a, b.bootId);
}
