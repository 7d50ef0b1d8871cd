// Owns what follows a shard's change for the operator: a verdict is logged once, when a request first
// sees it change (never "unverified": the snapshot cache logs nvidia-smi's failure once for the node),
// and each stored registration change is logged and makes every snapshot taken before it stale.
import type { Logger } from 'pino';
import type { NodeService } from '../node-state/node-view.js';
import type { PutResult, Registry } from './registry.js';
import type { ShardRecord } from './shard.js';
import type { Readiness, ReadinessState } from './verdict.js';

export type StoredChange = { put: PutResult } | { removed: true };

export function createShardLog({ registry, node, log }: { registry: Registry; node: NodeService; log: Logger }) {
  /** The last verdict logged per shard id: only a change is logged. */
  const loggedVerdicts = new Map<string, ReadinessState>();

  function verdictSeen(shard: ShardRecord, verdict: Readiness): void {
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

  /** Told after a change is stored, whether or not its request still waits (a write may land after a 503 pending). */
  function stored(id: string, change: StoredChange): void {
    if ('removed' in change) {
      loggedVerdicts.delete(id);
      node.invalidate();
      log.info({ shard: id }, 'Shard removed');
      return;
    }
    const { created, shard, graceKept, unchanged } = change.put;
    if (!graceKept) loggedVerdicts.delete(id);
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

  return { verdictSeen, stored };
}
