// Owns the readiness verdict of a shard, the answer a Kubernetes probe acts on:
//   ready      alive and holding memory on every GPU it was given (or given none);
//   starting   alive, some GPU not held yet, still within its grace window (nvidia-smi lags
//              behind a process that just created its CUDA context);
//   on-cpu     grace over and some GPU still not held, or the engine itself says it runs on the CPU;
//   exited     its process is gone or its PID was reused (for a cgroup shard: no process is left);
//   unverified nvidia-smi cannot be asked, its processes are hidden from it or their PIDs are not
//              visible in this /proc, or the shard's own /proc stat could not be read this
//              refresh: no evidence either way, so the shard keeps serving and the answer carries
//              a warning.
// Reasons are written for the operator who reads the probe's failure in `kubectl describe pod`.
import type { NodeView } from '../node-state/node-view.js';
import type { EngineAccount } from './llama-log.js';
import type { UnreadableStat } from '../system/procfs.js';
import type { ShardRecord } from './shard.js';

export const READINESS_STATES = ['ready', 'starting', 'on-cpu', 'exited', 'unverified'] as const;
export type ReadinessState = (typeof READINESS_STATES)[number];

export interface Readiness {
  ready: boolean;
  state: ReadinessState;
  reason: string | null;
  warnings: string[];
}

export interface ReadinessInput {
  shard: ShardRecord;
  /** Null when nvidia-smi cannot be asked; `unavailable` then says why. */
  node: NodeView | null;
  unavailable?: string;
  /** Why the snapshot is older than the TTL, when it is. */
  staleReason: string | null;
  engine: EngineAccount | null;
  now: number;
  /**
   * When the snapshot behind `node` began to be read (SnapshotView.startedAt); absent, the evidence
   * counts as taken now. The grace window is judged by it: a listing nvidia-smi began inside the
   * grace cannot show that the shard failed to take its GPU after it.
   */
  evidenceAt?: number;
}

function gpuList(indices: number[]): string {
  const names = indices.map((index) => `GPU ${index}`);
  if (names.length <= 1) return names.join('');
  return `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}

const ON_CPU_ADVICE =
  "Check the engine's build and libraries (ldd on libggml-cuda.so for llama.cpp), CUDA_VISIBLE_DEVICES and the container's GPU runtime, or run `nodecompute doctor` on this node.";

function verdict(state: ReadinessState, reason: string | null, warnings: string[]): Readiness {
  return { ready: state === 'ready' || state === 'unverified', state, reason, warnings };
}

function engineSaysCpu(engine: EngineAccount | null): engine is EngineAccount {
  return engine !== null && engine.backend === 'CPU';
}

function onCpuReason(shard: ShardRecord, missing: number[], engine: EngineAccount | null, node: NodeView, evidenceAt: number): string {
  const gone = missing.filter((index) => !node.snapshot.gpus.some((gpu) => gpu.index === index));
  const placed = `placed on ${gpuList(shard.gpus)} but computing on the CPU`;
  if (engineSaysCpu(engine)) {
    return `${placed}: the engine itself reports it. ${engine.summary}. Its GPU backend did not load. ${ON_CPU_ADVICE}`;
  }
  // Dated by the listing that shows it, not by the request: with a slow nvidia-smi they differ.
  const held = `its processes hold no memory on ${gpuList(missing)}, ${seconds(evidenceAt - shard.registeredAt)} after registration (grace ${seconds(shard.graceMs)})`;
  const vanished = gone.length > 0 ? ` ${gpuList(gone)} is not visible to nvidia-smi at all any more (fallen off the bus? see dmesg).` : '';
  return `${placed}: ${held}.${vanished} Its GPU backend probably did not load. ${
    shard.engine === 'llama.cpp' ? "post the engine's log (llama.cpp at -lv 4) to /shards/" + shard.id + "/engine-output to see what it saw. " : ''
  }${ON_CPU_ADVICE}`;
}

function warningsFor(shard: ShardRecord, node: NodeView, engine: EngineAccount | null, staleReason: string | null): string[] {
  const warnings: string[] = [];
  if (staleReason !== null) warnings.push(`answered from an older snapshot: ${staleReason}`);
  const holdings = node.attribution.holdings.get(shard.id);
  const strays = [...(holdings?.keys() ?? [])].filter((index) => !shard.gpus.includes(index)).sort((a, b) => a - b);
  if (strays.length > 0) {
    warnings.push(`holds memory on ${gpuList(strays)}, which it was not given: check CUDA_VISIBLE_DEVICES and the placement`);
  }
  if (engine && engine.layersOffloaded !== null && engine.layersTotal !== null && engine.layersOffloaded < engine.layersTotal) {
    warnings.push(`the engine offloaded only ${engine.layersOffloaded} of ${engine.layersTotal} layers to the GPU; the rest runs on the CPU`);
  }
  return warnings;
}

function uncertainWhy(stat: UnreadableStat): string {
  return `the /proc stat of process ${stat.pid} on its way to a shard could not be read in this refresh (${stat.unreadable}), so it may be this shard's. ${stat.advice}`;
}

export function readiness(input: ReadinessInput): Readiness {
  const { shard, node, engine, now } = input;
  if (node === null) {
    return verdict('unverified', null, [
      `nvidia-smi cannot be asked, so where this shard computes is unverified and it keeps serving: ${input.unavailable ?? 'unknown reason'}`,
    ]);
  }
  const liveness = node.attribution.liveness.get(shard.id) ?? { state: 'unknown' };
  if (liveness.state === 'gone') return verdict('exited', `the shard's process exited: ${liveness.why}.`, []);
  const warnings = warningsFor(shard, node, engine, input.staleReason);
  if (liveness.state === 'unreadable') return verdict('unverified', null, [...warnings, liveness.why]);
  const evidenceAt = Math.min(now, input.evidenceAt ?? now);
  if (shard.gpus.length > 0 && engineSaysCpu(engine)) {
    return verdict('on-cpu', onCpuReason(shard, shard.gpus, engine, node, evidenceAt), warnings);
  }
  const held = node.attribution.holdings.get(shard.id);
  const missing = shard.gpus.filter((index) => !held?.has(index));
  if (missing.length === 0) return verdict('ready', null, warnings);
  const left = shard.registeredAt + shard.graceMs - now;
  if (liveness.state === 'unknown') {
    if (left > 0) {
      return verdict('starting', `registered ${seconds(now - shard.registeredAt)} ago; waiting for the first snapshot that includes it (${seconds(left)} of grace left).`, warnings);
    }
    return verdict('unverified', null, [...warnings, 'no snapshot taken since this shard was registered includes it yet; nvidia-smi may be slow']);
  }
  const waiting = `waiting for the shard to hold memory on ${gpuList(missing)} (nvidia-smi lists none of its memory there yet)`;
  if (left > 0) return verdict('starting', `${waiting}; ${seconds(left)} of its ${seconds(shard.graceMs)} grace left.`, warnings);
  if (evidenceAt < shard.registeredAt + shard.graceMs) {
    return verdict(
      'starting',
      `${waiting}. Its ${seconds(shard.graceMs)} grace is over, but the latest listing was begun ${seconds(evidenceAt - shard.registeredAt)} after registration, ` +
        'inside it (nvidia-smi is slow or failing): the verdict waits for one begun after the grace.',
      warnings,
    );
  }
  if (node.processesHidden !== null) return verdict('unverified', null, [...warnings, node.processesHidden]);
  const uncertain = missing.flatMap((index) => {
    const blocked = node.attribution.uncertain.get(index);
    return blocked === undefined ? [] : [`GPU ${index} holds memory of a process whose owner is unknown: ${uncertainWhy(blocked)}`];
  });
  if (uncertain.length > 0) return verdict('unverified', null, [...warnings, ...uncertain]);
  return verdict('on-cpu', onCpuReason(shard, missing, engine, node, evidenceAt), warnings);
}
