// Owns the shard use cases behind the routes, composed from registration.ts (register, remove),
// verdicts.ts (verdicts and compute from the current snapshot) and the engine's posted output. The
// routes stay thin; readers arrive as dependencies, so nothing here touches the OS itself.
import { ShardNotFoundError } from '../errors.js';
import type { ShardRecordBody } from '../schemas/shards.js';
import { ENGINE_TAIL_MAX_BYTES, READ_ENGINES, type EngineState } from './engine-output.js';
import { restartedSince } from './readiness.js';
import { createRegistration } from './registration.js';
import type { PutResult } from './registry.js';
import type { ShardRecord } from './shard.js';
import { createVerdicts, type VerdictDeps } from './verdicts.js';

export type { ShardState } from './verdicts.js';

export type ShardServiceDeps = VerdictDeps & { defaultGraceMs: number };

export function shardBody(shard: ShardRecord): ShardRecordBody {
  return { ...shard, gpuUuids: shard.gpuUuids ?? null, migDevices: shard.migDevices ?? null, minGpuWeightsShare: shard.minGpuWeightsShare ?? null, registeredAt: new Date(shard.registeredAt).toISOString() };
}

/** Why posted output gave no account, for the one who posted it; null when it gave one. */
function engineOutputNote(shard: ShardRecord, state: EngineState): string | null {
  if (state.account !== null) return null;
  if (READ_ENGINES[shard.engine] === undefined) {
    const kept = `kept (the last ${ENGINE_TAIL_MAX_BYTES / 1024} KiB) but decides nothing: nvidia-smi alone judges the shard`;
    const fix = `If it is llama.cpp or Ollama, PUT /shards/${shard.id} again with "engine": "llama.cpp" or "ollama" to have it read.`;
    return `Shard "${shard.id}" is registered with engine "${shard.engine}" and only llama.cpp and Ollama output is read: this output is ${kept}. ${fix}`;
  }
  return 'Nothing in the output kept so far says where llama.cpp computes: b9829+ names devices only at -lv 4. Until then, nvidia-smi alone judges the shard.';
}

export function createShardService(deps: ShardServiceDeps) {
  const { registry, node, proc, log, now } = deps;
  const verdicts = createVerdicts(deps);

  /** What follows a stored change, whether or not its request still waits (a write may land after a 503 pending). */
  function stored(id: string, change: { put: PutResult } | { removed: true }): void {
    if ('removed' in change) {
      verdicts.forget(id);
      node.invalidate();
      log.info({ shard: id }, 'Shard removed');
      return;
    }
    const { created, shard, graceKept, unchanged } = change.put;
    if (!graceKept) verdicts.forget(id);
    const fields = { shard: id, shardPid: shard.pid, cgroup: shard.cgroup, gpus: shard.gpus, created, registeredAt: new Date(shard.registeredAt).toISOString() };
    if (unchanged) {
      // A control plane reconciling its shards re-PUTs them periodically: nothing to say or refresh.
      log.debug(fields, 'Shard registration repeated unchanged; its grace clock goes on');
      return;
    }
    node.invalidate();
    if (created) log.info(fields, 'Shard registered');
    else if (graceKept) log.info(fields, 'Shard registration replaced for the same process and GPUs; its grace clock goes on from its first registration');
    else log.info(fields, 'Shard registration replaced with another process or other GPUs; its grace starts again');
  }

  const registration = createRegistration({ ...deps, onStored: stored });

  const notFound = (id: string): Error =>
    new ShardNotFoundError(`No shard "${id}" is registered on this node. Register it with PUT /shards/${id}, or list them with GET /shards.`);

  /** The shard as registered now; asked again after a wait, as it may have been removed or replaced meanwhile. */
  function requireShard(id: string): () => ShardRecord {
    const get = () => {
      const shard = registry.get(id);
      if (!shard) throw notFound(id);
      return shard;
    };
    get();
    return get;
  }

  return {
    register: registration.register,
    remove: registration.remove,
    compute: (id: string) => verdicts.compute(requireShard(id)),
    state: (id: string, maxWaitMs: number) => verdicts.state(requireShard(id), maxWaitMs),
    probe: (id: string, maxWaitMs: number) => verdicts.probe(requireShard(id), maxWaitMs),
    states: verdicts.states,

    /** Output posted after a cgroup shard's container restarted starts a new tail; dated in /proc's clock to tell later runs. */
    appendEngineOutput(id: string, text: string): EngineState & { note: string | null } {
      const restarted = restartedSince(node.peek()?.node.attribution.liveness.get(id), registry.engine(id)?.tailStartedAtTicks);
      const state = registry.appendEngineOutput(id, text, now(), proc.ticksNow(), restarted);
      if (!state) throw notFound(id);
      return { ...state, note: engineOutputNote(requireShard(id)(), state) };
    },
  };
}

export type ShardService = ReturnType<typeof createShardService>;
