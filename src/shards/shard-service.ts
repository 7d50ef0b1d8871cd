// Owns the shard use cases behind the routes: registering (validated against this node's GPUs and
// /proc), removing, and answering each shard's compute and readiness from the current snapshot.
// The routes stay thin; readers arrive as dependencies so this module never touches the OS itself.
// A shard's verdict changing (starting, ready, on-cpu, exited) is logged once, when a request first
// sees the change, rather than at every probe.
import type { Logger } from 'pino';
import { BadRequestError, ProcessNotFoundError, ProcUnreadableError, ShardNotFoundError, UnknownGpuError, isCodedError } from '../errors.js';
import type { Current, NodeService } from '../node-state/node-service.js';
import type { NodeSnapshot } from '../node-state/node-snapshot.js';
import type { NodeView } from '../node-state/node-view.js';
import type { SnapshotView } from '../node-state/snapshot.js';
import type { RegisterShard, ShardRecordBody } from '../schemas/shards.js';
import type { ProcReader } from '../system/procfs.js';
import { shardCompute, type ShardCompute } from './compute.js';
import type { EngineAccount } from './llama-log.js';
import { readiness, type Readiness, type ReadinessState } from './readiness.js';
import type { EngineState, Registry } from './registry.js';
import type { ProcessIdentity, ShardRecord } from './shard.js';

export interface ShardServiceDeps {
  registry: Registry;
  node: NodeService;
  proc: ProcReader;
  defaultGraceMs: number;
  log: Logger;
  now: () => number;
}

export interface ShardState {
  shard: ShardRecord;
  readiness: Readiness;
  compute: ShardCompute | null;
  observedAt: number | null;
}

/**
 * A verdict warns about the snapshot's age only when it matters: the last refresh failed, or the
 * snapshot is this old. A routine stale-while-revalidate answer (one TTL old) is not news.
 */
export const STALE_WARNING_MS = 10_000;

function staleNote(view: SnapshotView<NodeSnapshot>): string | null {
  return view.failing || view.ageMs >= STALE_WARNING_MS ? view.staleReason : null;
}

/** kthreadd: every kernel thread is it or its child, in the host's PID namespace. */
const KTHREADD_PID = 2;

export function shardBody(shard: ShardRecord): ShardRecordBody {
  return { ...shard, registeredAt: new Date(shard.registeredAt).toISOString() };
}

export function createShardService(deps: ShardServiceDeps) {
  const { registry, node, proc, log, now } = deps;

  async function identityOfPid(pid: number): Promise<ProcessIdentity> {
    const stat = await proc.readStat(pid);
    if (!stat) {
      throw new ProcessNotFoundError(
        `No process with PID ${pid} exists in ${proc.root}. Register the shard's host PID while it runs; ` +
          "if the shard runs in a container, nodecompute needs the host's PID namespace (--pid=host / hostPID: true) to see it.",
      );
    }
    if (stat.state === 'Z' || stat.state === 'X') {
      throw new ProcessNotFoundError(
        `Process ${pid} (${stat.comm}) has already exited: it is a zombie its parent has not reaped. Register the shard once its engine runs.`,
      );
    }
    if (stat.pid === KTHREADD_PID || stat.ppid === KTHREADD_PID) {
      throw new ProcessNotFoundError(
        `PID ${pid} in ${proc.root} is the kernel thread ${stat.comm}, not a shard. This is probably the PID as a container sees it: ` +
          "register the host PID (for a container's main process: `docker inspect -f '{{.State.Pid}}' CONTAINER`), or register the shard by its cgroup.",
      );
    }
    return { pid, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm };
  }

  async function identityOfCgroup(cgroup: string): Promise<ProcessIdentity> {
    const pids = (await proc.findPidsInCgroup(cgroup)).sort((a, b) => a - b);
    for (const pid of pids) {
      const stat = await proc.readStat(pid);
      if (stat) return { pid, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm };
    }
    throw new ProcessNotFoundError(
      `No process in ${proc.root} has a cgroup containing "${cgroup}". Give the container id or pod UID as /proc/PID/cgroup shows it ` +
        '(for a pod: its UID with "-" or "_" as the cgroup driver writes it), and register once the container runs.',
    );
  }

  /** A /proc that cannot be read (permissions, a bad mount) is the node's problem, said as such: 503. */
  async function readable<T>(reading: Promise<T>): Promise<T> {
    try {
      return await reading;
    } catch (err) {
      if (isCodedError(err)) throw err;
      throw new ProcUnreadableError(
        `The registration was not stored: ${(err as Error).message} Run \`nodecompute doctor\` on this node.`,
        { cause: err },
      );
    }
  }

  /** GPU indices are checked against the node when nvidia-smi answers; otherwise they are taken on trust. */
  async function checkGpus(gpus: number[]): Promise<void> {
    if (gpus.length === 0) return;
    let known: number[];
    try {
      known = (await node.current()).view.snapshot.gpus.map((gpu) => gpu.index);
    } catch (err) {
      if (!isCodedError(err)) throw err;
      log.warn({ err, gpus }, 'Registering a shard without checking its GPUs: nvidia-smi cannot be asked');
      return;
    }
    const unknown = gpus.filter((index) => !known.includes(index));
    if (unknown.length > 0) {
      throw new UnknownGpuError(
        `GPU ${unknown.join(', ')} does not exist on this node; it has GPU ${known.join(', ')} (as nvidia-smi numbers them). Fix "gpus" in the registration.`,
      );
    }
  }

  function notFound(id: string): Error {
    return new ShardNotFoundError(`No shard "${id}" is registered on this node. Register it with PUT /shards/${id}, or list them with GET /shards.`);
  }

  function requireShard(id: string): ShardRecord {
    const shard = registry.get(id);
    if (!shard) throw notFound(id);
    return shard;
  }

  function engineAccount(id: string): EngineAccount | null {
    return registry.engine(id)?.account ?? null;
  }

  /** The last verified verdict logged for each registration (a new registration starts afresh). */
  const loggedVerdicts = new WeakMap<ShardRecord, ReadinessState>();

  function logVerdictChange(shard: ShardRecord, verdict: Readiness): void {
    // Unverified means nvidia-smi cannot be asked: the snapshot cache logs that once for the node.
    if (verdict.state === 'unverified') return;
    const previous = loggedVerdicts.get(shard) ?? null;
    if (previous === verdict.state) return;
    loggedVerdicts.set(shard, verdict.state);
    const level = verdict.state === 'on-cpu' || verdict.state === 'exited' ? 'warn' : 'info';
    log[level](
      { shard: shard.id, state: verdict.state, previous, shardPid: shard.pid, cgroup: shard.cgroup, gpus: shard.gpus },
      `Shard "${shard.id}" is now ${verdict.state}${verdict.reason === null ? '' : `: ${verdict.reason}`}`,
    );
  }

  /** The verdict (and, unless a probe only needs the verdict, the compute) of one shard. */
  function stateOf(shard: ShardRecord, current: Current | null, unavailable: string | null, withCompute = true): ShardState {
    const engine = engineAccount(shard.id);
    const nodeView = current?.node ?? null;
    const verdict = readiness({
      shard,
      node: nodeView,
      staleReason: current ? staleNote(current.view) : null,
      engine,
      now: now(),
      ...(current === null ? {} : { evidenceAt: current.view.startedAt }),
      ...(unavailable === null ? {} : { unavailable }),
    });
    logVerdictChange(shard, verdict);
    return {
      shard,
      readiness: verdict,
      compute: nodeView && withCompute ? shardCompute(shard, nodeView, engine) : null,
      observedAt: current ? current.view.observedAt : null,
    };
  }

  /**
   * Probes arrive every few seconds per pod and mostly get the same answer. A verdict whose text
   * does not depend on the clock (ready, exited) is kept per node view, shard record, engine output
   * version and staleness note, so a steady shard's probe computes nothing. Starting and on-cpu
   * verdicts say how long ago things happened and are made afresh.
   */
  const steadyProbes = new WeakMap<NodeView, Map<string, { shard: ShardRecord; engineVersion: number; staleNote: string | null; state: ShardState }>>();

  function probeState(shard: ShardRecord, current: Current): ShardState {
    const note = staleNote(current.view);
    const kept = steadyProbes.get(current.node)?.get(shard.id);
    if (kept && kept.shard === shard && kept.engineVersion === registry.engineVersion && kept.staleNote === note) return kept.state;
    const state = stateOf(shard, current, null, false);
    if (state.readiness.state === 'ready' || state.readiness.state === 'exited') {
      let perShard = steadyProbes.get(current.node);
      if (!perShard) steadyProbes.set(current.node, (perShard = new Map()));
      perShard.set(shard.id, { shard, engineVersion: registry.engineVersion, staleNote: note, state });
    }
    return state;
  }

  /** The current snapshot, or why there is none: nvidia-smi failures are an answer here, not an error. */
  async function currentOrWhy(maxWaitMs: number): Promise<{ current: Current | null; why: string | null }> {
    try {
      return { current: await node.current({ maxWaitMs }), why: null };
    } catch (err) {
      if (!isCodedError(err)) throw err;
      return { current: null, why: err.message };
    }
  }

  return {
    async register(id: string, body: RegisterShard): Promise<{ created: boolean; shard: ShardRecord }> {
      const hasPid = body.pid !== undefined;
      const hasCgroup = body.cgroup !== undefined;
      if (hasPid === hasCgroup) {
        throw new BadRequestError(
          hasPid
            ? 'Give either "pid" or "cgroup", not both: a shard is one process group or one cgroup.'
            : 'Give "pid" (the host PID of the shard\'s main process) or "cgroup" (its container id or pod UID).',
        );
      }
      const [identity] = await Promise.all([
        readable(body.pid !== undefined ? identityOfPid(body.pid) : identityOfCgroup(body.cgroup as string)),
        checkGpus(body.gpus),
      ]);
      const shard: ShardRecord = {
        id,
        pid: body.pid ?? null,
        cgroup: body.cgroup ?? null,
        gpus: [...body.gpus],
        engine: body.engine ?? 'other',
        graceMs: body.graceMs ?? deps.defaultGraceMs,
        registeredAt: now(),
        identity,
      };
      const { created } = await registry.put(shard);
      node.invalidate();
      log.info({ shard: id, shardPid: shard.pid, cgroup: shard.cgroup, gpus: shard.gpus, created }, created ? 'Shard registered' : 'Shard registration replaced');
      return { created, shard };
    },

    async remove(id: string): Promise<void> {
      if (!(await registry.remove(id))) throw notFound(id);
      node.invalidate();
      log.info({ shard: id }, 'Shard removed');
    },

    /** Where a shard computes; nvidia-smi failures propagate (503): no snapshot, no answer. */
    async compute(id: string): Promise<{ view: SnapshotView<NodeSnapshot>; compute: ShardCompute }> {
      const shard = requireShard(id);
      const { view, node: nodeView } = await node.current();
      return { view, compute: shardCompute(shard, nodeView, engineAccount(id)) };
    },

    appendEngineOutput(id: string, text: string): EngineState {
      const state = registry.appendEngineOutput(id, text, now());
      if (!state) throw notFound(id);
      return state;
    },

    /** One shard's state and compute from the current snapshot; nvidia-smi failures become `unverified`. */
    async state(id: string, maxWaitMs: number): Promise<ShardState> {
      requireShard(id);
      const { current, why } = await currentOrWhy(maxWaitMs);
      // Asked again after the wait: the shard may have been removed (404) or replaced meanwhile.
      return stateOf(requireShard(id), current, why);
    },

    /** A probe's verdict (no compute) when the cache can answer without waiting; null when it must wait. */
    probeNow(id: string): ShardState | null {
      const shard = requireShard(id);
      const current = node.available();
      return current ? probeState(shard, current) : null;
    },

    /** A probe's verdict (no compute), waiting at most `maxWaitMs` for a refresh; nvidia-smi failures become `unverified`. */
    async probe(id: string, maxWaitMs: number): Promise<ShardState> {
      requireShard(id);
      const { current, why } = await currentOrWhy(maxWaitMs);
      const shard = requireShard(id);
      return current ? probeState(shard, current) : stateOf(shard, null, why, false);
    },

    /** Every shard's state from one snapshot, with that snapshot; nvidia-smi failures become `unverified`. */
    async states(maxWaitMs: number): Promise<{
      states: ShardState[];
      view: SnapshotView<NodeSnapshot> | null;
      node: NodeView | null;
      error: string | null;
    }> {
      const shards = registry.list().sort((a, b) => (a.id < b.id ? -1 : 1));
      const { current, why } = await currentOrWhy(maxWaitMs);
      return { states: shards.map((shard) => stateOf(shard, current, why)), view: current?.view ?? null, node: current?.node ?? null, error: why };
    },
  };
}

export type ShardService = ReturnType<typeof createShardService>;
