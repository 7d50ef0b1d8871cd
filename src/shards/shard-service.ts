// Owns the shard use cases behind the routes: registering and removing (registration.ts), each
// shard's verdict and compute from the current snapshot, and the engine's posted output. While
// nvidia-smi cannot be asked, verdicts use what /proc said in the latest failed refresh and the last
// good snapshot's word, never a read of their own. A probe from a snapshot past its TTL reads a PID
// shard's own stat now, so an exit or a stop since holds against the shard at once. What is logged
// is shard-log.ts's. Readers arrive as dependencies.
import { isCodedError, ShardNotFoundError } from '../errors.js';
import { pidLiveness, type Liveness } from '../node-state/attribution.js';
import type { Current } from '../node-state/node-view.js';
import { staleNews } from '../node-state/snapshot.js';
import type { ShardRecordBody } from '../schemas/shards.js';
import { shardCompute, type ShardCompute } from './compute.js';
import { ENGINE_TAIL_MAX_BYTES, READ_ENGINES, type EngineState } from './engine-output.js';
import { readiness, restartedSince, type ReadinessInput } from './readiness.js';
import { createRegistration, type RegistrationDeps } from './registration.js';
import { createShardLog } from './shard-log.js';
import type { ShardRecord } from './shard.js';
import type { Readiness } from './verdict.js';

export type ShardState = { shard: ShardRecord; readiness: Readiness; compute: ShardCompute | null; observedAt: number | null };

export function shardBody(shard: ShardRecord): ShardRecordBody {
  return { ...shard, gpuUuids: shard.gpuUuids ?? null, migDevices: shard.migDevices ?? null, minGpuWeightsShare: shard.minGpuWeightsShare ?? null, registeredAt: new Date(shard.registeredAt).toISOString() };
}

/** Why posted output gave no account, for the one who posted it; null when it gave one. */
function engineOutputNote(shard: ShardRecord, state: EngineState): string | null {
  if (state.account !== null) return null;
  if (READ_ENGINES[shard.engine] === undefined) {
    const kept = `kept (the last ${ENGINE_TAIL_MAX_BYTES / 1024} KiB) but decides nothing: the GPU driver alone judges the shard`;
    const fix = `If it is llama.cpp or Ollama, PUT /shards/${shard.id} again with "engine": "llama.cpp" or "ollama" to have it read.`;
    return `Shard "${shard.id}" is registered with engine "${shard.engine}" and only llama.cpp and Ollama output is read: this output is ${kept}. ${fix}`;
  }
  return 'Nothing in the output kept so far says where llama.cpp computes: b9829+ names devices only at -lv 4. Until then, the GPU driver alone judges the shard.';
}

export function createShardService(deps: Omit<RegistrationDeps, 'onStored'>) {
  const { registry, node, proc, log, now } = deps;
  /** Shards registered before this run may have been seen ready by an earlier one (readiness.ts). */
  const judgingSince = now();
  const shardLog = createShardLog({ registry, node, log });

  /** What judges a shard when there is no snapshot to serve: /proc as the failed refresh read it, and nvidia-smi's last word. */
  function withoutSnapshot(shard: ShardRecord): Pick<ReadinessInput, 'liveness' | 'lastGood' | 'judgingSince' | 'procNow'> {
    const last = node.peek();
    const procOnly = node.procOnly();
    return {
      ...(procOnly === null ? {} : { liveness: procOnly.liveness.get(shard.id), procNow: procOnly.proc }),
      lastGood: last === null ? null : { node: last.node, startedAt: last.view.startedAt, observedAt: last.view.observedAt },
      judgingSince,
    };
  }

  /** One shard's verdict, and its compute unless only the verdict is needed; `livenessNow` is /proc's word now. */
  function stateOf(shard: ShardRecord, current: Current | null, unavailable: string | null, withCompute = true, livenessNow?: Liveness): ShardState {
    const posted = registry.engine(shard.id);
    const engine = posted?.account ?? null;
    const nodeView = current?.node ?? null;
    const verdict = readiness({
      shard,
      node: nodeView,
      staleReason: current ? staleNews(current.view) : null,
      failing: current?.view.failing ? current.view.staleReason : null,
      engine,
      engineTicks: posted?.tailStartedAtTicks ?? null,
      enginePosted: posted !== undefined && posted.tail !== '',
      now: now(),
      ...(current === null ? withoutSnapshot(shard) : { evidenceAt: current.view.startedAt }),
      ...(livenessNow === undefined ? {} : { livenessNow }),
      ...(unavailable === null ? {} : { unavailable }),
      unreachable: node.unreachable(),
    });
    shardLog.verdictSeen(shard, verdict);
    return {
      shard,
      readiness: verdict,
      compute: nodeView && withCompute ? shardCompute(shard, nodeView, engine, verdict.state) : null,
      observedAt: current ? current.view.observedAt : null,
    };
  }

  /** A PID shard's own process read now, where the snapshot is past its TTL and the process has exited or stopped since. */
  function livenessNow(shard: ShardRecord, current: Current): Liveness | undefined {
    if (shard.pid === null || !current.view.stale) return undefined;
    const liveness = pidLiveness(shard, proc.statNow(shard.identity.pid), current.node.snapshot.bootId);
    return liveness.state === 'gone' || liveness.state === 'stopped' ? liveness : undefined;
  }

  /** The current snapshot, or why there is none: nvidia-smi's failures are an answer here, not an error. */
  async function currentOrWhy(maxWaitMs: number): Promise<{ current: Current | null; why: string | null }> {
    try {
      return { current: await node.current({ maxWaitMs }), why: null };
    } catch (err) {
      if (!isCodedError(err)) throw err;
      return { current: null, why: err.message };
    }
  }

  const registration = createRegistration({ ...deps, onStored: shardLog.stored });

  /** The shard as registered now; asked again after a wait, as it may have been removed or replaced meanwhile. */
  function requireShard(id: string): ShardRecord {
    const shard = registry.get(id);
    if (shard) return shard;
    throw new ShardNotFoundError(`No shard "${id}" is registered on this node. Register it with PUT /shards/${id}, or list them with GET /shards.`);
  }

  return {
    register: registration.register,
    remove: registration.remove,

    /** Where a shard computes (judged with its verdict); nvidia-smi failures propagate (503). */
    async compute(id: string) {
      requireShard(id);
      const current = await node.current();
      return { view: current.view, compute: stateOf(requireShard(id), current, null).compute! };
    },

    /** One shard's state; on an nvidia-smi failure, the verdict without a snapshot and why. */
    async state(id: string, maxWaitMs: number) {
      requireShard(id);
      const { current, why } = await currentOrWhy(maxWaitMs);
      return { state: stateOf(requireShard(id), current, why), view: current?.view ?? null, error: why };
    },

    /** A probe's verdict (no compute), waiting at most `maxWaitMs` for a refresh. */
    async probe(id: string, maxWaitMs: number): Promise<ShardState> {
      requireShard(id);
      const { current, why } = await currentOrWhy(maxWaitMs);
      const record = requireShard(id);
      return current ? stateOf(record, current, null, false, livenessNow(record, current)) : stateOf(record, null, why, false);
    },

    /** Every shard's state from one snapshot. */
    async states(maxWaitMs: number) {
      const shards = registry.list().sort((a, b) => (a.id < b.id ? -1 : 1));
      const { current, why } = await currentOrWhy(maxWaitMs);
      return { states: shards.map((shard) => stateOf(shard, current, why)), view: current?.view ?? null, node: current?.node ?? null, error: why };
    },

    /** Output posted after a cgroup shard's container restarted starts a new tail; dated in /proc's clock to tell later runs. */
    appendEngineOutput(id: string, output: Buffer | string): EngineState & { note: string | null } {
      const shard = requireShard(id);
      const restarted = restartedSince(node.peek()?.node.attribution.liveness.get(id), registry.engine(id)?.tailStartedAtTicks);
      // Defined: requireShard found it just now, and nothing ran in between.
      const state = registry.appendEngineOutput(id, output, proc.ticksNow(), restarted)!;
      return { ...state, note: engineOutputNote(shard, state) };
    },
  };
}
