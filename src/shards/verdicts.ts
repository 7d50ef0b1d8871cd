// Owns answering each shard's verdict and compute from the current snapshot. While nvidia-smi cannot
// be asked, verdicts use what /proc said in the latest failed refresh and the last good snapshot's
// word, never a read of their own. A probe from a snapshot past its TTL reads a PID shard's own stat
// now, so an exit or a stop since holds against the shard at once. A change of verdict is logged
// once, when a request first sees it.
import type { Logger } from 'pino';
import { isCodedError } from '../errors.js';
import { pidLiveness, type Liveness } from '../node-state/attribution.js';
import type { Current, NodeService } from '../node-state/node-service.js';
import type { NodeSnapshot } from '../node-state/node-snapshot.js';
import type { NodeView } from '../node-state/node-view.js';
import { staleNews, type SnapshotView } from '../node-state/snapshot.js';
import type { ProcReader } from '../system/procfs.js';
import { shardCompute, type ShardCompute } from './compute.js';
import { readiness, type ReadinessInput } from './readiness.js';
import type { Readiness, ReadinessState } from './verdict.js';
import type { Registry } from './registry.js';
import type { ShardRecord } from './shard.js';

export type ShardState = { shard: ShardRecord; readiness: Readiness; compute: ShardCompute | null; observedAt: number | null };

export type VerdictDeps = { registry: Registry; node: NodeService; proc: ProcReader; log: Logger; now: () => number };

export function createVerdicts({ registry, node, proc, log, now }: VerdictDeps) {
  /** Shards registered before this run may have been seen ready by an earlier one (readiness.ts). */
  const judgingSince = now();
  /** The last verdict logged per shard id: only a change is logged. */
  const loggedVerdicts = new Map<string, ReadinessState>();

  function logVerdictChange(shard: ShardRecord, verdict: Readiness): void {
    // Unverified means nvidia-smi cannot be asked: the snapshot cache logs that once for the node.
    if (verdict.state === 'unverified') return;
    // A verdict on a registration replaced or removed meanwhile is history.
    if (registry.get(shard.id) !== shard) return;
    const previous = loggedVerdicts.get(shard.id) ?? null;
    if (previous === verdict.state) return;
    loggedVerdicts.set(shard.id, verdict.state);
    const level = verdict.state === 'ready' || verdict.state === 'starting' ? 'info' : 'warn';
    const fields = { shard: shard.id, state: verdict.state, cause: verdict.cause, previous, shardPid: shard.pid, cgroup: shard.cgroup, gpus: shard.gpus };
    log[level](fields, `Shard "${shard.id}" is now ${verdict.state}${verdict.reason === null ? '' : `: ${verdict.reason}`}`);
  }

  /** What judges a shard when there is no snapshot to serve: /proc as the failed refresh read it, and nvidia-smi's last word. */
  function withoutSnapshot(shard: ShardRecord): Pick<ReadinessInput, 'liveness' | 'lastGood' | 'judgingSince' | 'procNow'> {
    const last = node.peek();
    const procOnly = node.procOnly();
    return {
      liveness: procOnly?.liveness.get(shard.id),
      ...(procOnly === null ? {} : { procNow: procOnly.proc }),
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
      engine,
      engineTicks: posted?.tailStartedAtTicks ?? null,
      enginePosted: posted !== undefined && posted.tail !== '',
      now: now(),
      ...(current === null ? withoutSnapshot(shard) : { evidenceAt: current.view.startedAt }),
      ...(livenessNow === undefined ? {} : { livenessNow }),
      ...(unavailable === null ? {} : { unavailable }),
      unreachable: node.unreachable(),
    });
    logVerdictChange(shard, verdict);
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

  return {
    /** Forgets the verdict logged for a shard whose registration changed target or was removed. */
    forget: (id: string) => loggedVerdicts.delete(id),

    /** Where a shard computes (judged with its verdict); nvidia-smi failures propagate (503). */
    async compute(shard: () => ShardRecord): Promise<{ view: SnapshotView<NodeSnapshot>; compute: ShardCompute }> {
      const current = await node.current();
      return { view: current.view, compute: stateOf(shard(), current, null).compute! };
    },

    /** One shard's state; on an nvidia-smi failure, the verdict without a snapshot and why. */
    async state(shard: () => ShardRecord, maxWaitMs: number): Promise<{ state: ShardState; view: SnapshotView<NodeSnapshot> | null; error: string | null }> {
      const { current, why } = await currentOrWhy(maxWaitMs);
      return { state: stateOf(shard(), current, why), view: current?.view ?? null, error: why };
    },

    /** A probe's verdict (no compute), waiting at most `maxWaitMs` for a refresh. */
    async probe(shard: () => ShardRecord, maxWaitMs: number): Promise<ShardState> {
      const { current, why } = await currentOrWhy(maxWaitMs);
      const record = shard();
      return current ? stateOf(record, current, null, false, livenessNow(record, current)) : stateOf(record, null, why, false);
    },

    /** Every shard's state from one snapshot. */
    async states(maxWaitMs: number): Promise<{ states: ShardState[]; view: SnapshotView<NodeSnapshot> | null; node: NodeView | null; error: string | null }> {
      const shards = registry.list().sort((a, b) => (a.id < b.id ? -1 : 1));
      const { current, why } = await currentOrWhy(maxWaitMs);
      return { states: shards.map((shard) => stateOf(shard, current, why)), view: current?.view ?? null, node: current?.node ?? null, error: why };
    },
  };
}
