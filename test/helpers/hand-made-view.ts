// Builds hand-made node views, shard records and an engine account, for tests that judge verdicts without nvidia-smi
// or /proc: a snapshot of the given GPUs, /proc answers and lost GPUs, taken at `now`.
import type { LostGpu } from '../../src/node-state/gpu-roster.js';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import type { GpuState, NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import type { LastLoad } from '../../src/node-state/ollama-loads.js';
import { createNodeView, type NodeView } from '../../src/node-state/node-view.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcessModelFiles } from '../../src/system/model-files.js';
import type { ModelRunner } from '../../src/system/model-runners.js';
import type { ProcStat, StatAnswer } from '../../src/system/procfs.js';

/** A running (or, with `state`, stopped: T) process of process group 100, as /proc/PID/stat reads. */
export function procStat(pid: number, state = 'S'): ProcStat {
  return { pid, comm: 'llama-server', state, ppid: 1, pgrp: 100, session: 100, startTime: 5, cpuTicks: 0 };
}

export interface HandMadeNode {
  now: number;
  gpus: GpuState[];
  stats?: ProcStat[];
  /** /proc answers other than a stat read: null for no such process, or an unreadable stat. */
  otherAnswers?: Array<[number, StatAnswer]>;
  lostGpus?: LostGpu[];
  /** The PIDs found in each cgroup a shard names. */
  cgroupPids?: Array<[string, number[]]>;
  /** Cores each PID used since the snapshot before. */
  cpuCores?: Array<[number, number]>;
  /** The model files each PID loaded. */
  modelFiles?: Array<[number, ProcessModelFiles]>;
  /** Per Ollama shard (its PID or cgroup), the model runners it runs; left out, none is known. */
  modelRunners?: Array<[number | string, ModelRunner[]]>;
  /** Per Ollama shard, its latest runner, kept after it exits. */
  lastLoads?: Array<[number | string, LastLoad]>;
}

/** The view of such a snapshot with `shards` registered. */
export function handMadeView(node: HandMadeNode, shards: ShardRecord[]): NodeView {
  const snapshot: NodeSnapshot = {
    takenAt: node.now,
    gpus: node.gpus,
    proc: new Map<number, StatAnswer>([...(node.stats ?? []).map((stat): [number, StatAnswer] => [stat.pid, stat]), ...(node.otherAnswers ?? [])]),
    cgroupPids: new Map((node.cgroupPids ?? []).map(([cgroup, pids]) => [cgroup, new Set(pids)])),
    bootId: null,
    unmatchedProcesses: [],
    lostGpus: node.lostGpus ?? [],
    cpuCores: new Map(node.cpuCores ?? []),
    modelFiles: new Map(node.modelFiles ?? []),
    ...(node.modelRunners === undefined ? {} : { modelRunners: new Map(node.modelRunners) }),
    ...(node.lastLoads === undefined ? {} : { lastLoads: new Map(node.lastLoads) }),
    timings: { driverMs: 1, procMs: 1 },
  };
  return createNodeView(snapshot, shards, 1);
}

/** Shard "s": llama.cpp, PID 100 (leading group 100, started at tick 5), given GPU 0, grace 10 s, registered a minute before `now`. */
export function shardRecord(now: number, overrides: Partial<ShardRecord> = {}): ShardRecord {
  return {
    id: 's',
    pid: 100,
    cgroup: null,
    gpus: [0],
    engine: 'llama.cpp',
    graceMs: 10_000,
    registeredAt: now - 60_000,
    identity: { pid: 100, pgid: 100, startTime: 5, name: 'llama-server' },
    ...overrides,
  };
}

/** What llama.cpp's account says when its CUDA backend found no usable device: CPU, the backend not loaded. */
export const NO_GPU_ENGINE: EngineAccount = {
  backend: 'CPU',
  devices: [],
  layersOffloaded: null,
  layersTotal: null,
  gpuBackendLoaded: false,
  evidence: 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected',
  summary: 'llama.cpp found no usable GPU (ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected)',
};
