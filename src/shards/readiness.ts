// Owns a shard's readiness verdict, the answer a Kubernetes probe acts on. Precedence: exited, then
// stopped, then gpu-lost (no grace: waiting cannot bring a GPU back), then the engine's own CPU account,
// then memory held on the given GPUs against the grace. While nvidia-smi cannot be asked, /proc and the
// engine still decide exited, stopped and on-cpu, and its last good listing holds against a shard,
// never for it. Reasons are written for the operator reading `kubectl describe pod`.
import { formatDuration } from '../duration.js';
import { sameProcessNow, stoppedSinceListing, type Liveness } from '../node-state/attribution.js';
import { gpuNoLongerListed, gpuUnreachable, LOST_GPU_FIX, LOST_GPU_MEANING, saidOfBusId, UNREACHABLE_GPU_MEANING } from '../node-state/gpu-roster.js';
import type { NodeView } from '../node-state/node-view.js';
import { placementOf, unreachableGiven, type Renumbered, type UnlistedGpu, type UnreachableKnownGpu, type UnreachableListedGpu } from '../node-state/placement.js';
import type { StatAnswer } from '../system/procfs.js';
import { otherMigWarning } from './compute.js';
import type { EngineAccount } from './llama-account.js';
import { cpuBurnWarning, engineCpuVerdict, engineSaysCpu, heldVerdict, onCpuVerdict, strayGpus, type NoAccount } from './on-cpu-verdict.js';
import { ollamaVerdict } from './ollama-load.js';
import type { ShardRecord } from './shard.js';
import { gpuList, verdict, type Readiness, type ReadinessState } from './verdict.js';
import { heldBy } from './weights.js';

export interface ReadinessInput {
  shard: ShardRecord;
  /** Null when nvidia-smi cannot be asked; `unavailable` then says why. */
  node: NodeView | null;
  unavailable?: string;
  /** GPUs the latest failed refresh said it cannot reach; `node`, if given, is then the last good snapshot. */
  unreachable?: readonly UnreachableListedGpu[];
  /** Only when `node` is null: the shard's liveness from /proc, read without nvidia-smi. */
  liveness?: Liveness | undefined;
  /** Only when `node` is null: the last good snapshot, however old; null when none succeeded in this run. */
  lastGood?: { node: NodeView; startedAt: number; observedAt: number } | null;
  /** Only when `node` is null: when this run began judging; a shard registered before may have been seen ready. */
  judgingSince?: number;
  /** Only when `node` is null: the stats the failed refresh read, of the shards' and the last listing's processes. */
  procNow?: ReadonlyMap<number, StatAnswer>;
  /** With `node` given: /proc's liveness now, judged instead of the snapshot's (a last good snapshot past max-stale). */
  livenessNow?: Liveness;
  /** Why the snapshot is stale, when that is worth a warning. */
  staleReason: string | null;
  /** With `node` given: why refreshes fail, when that snapshot is served because they do (within max-stale); absent otherwise. */
  failing?: string | null;
  engine: EngineAccount | null;
  /** Whether engine output was posted (and is kept): with `engine` null, it says nothing about the backend. */
  enginePosted?: boolean;
  /** When the output behind `engine` was last posted, in clock ticks since boot; null: taken as current. */
  engineTicks?: number | null;
  now: number;
  /** When the snapshot behind `node` began (absent: now): a listing begun inside the grace decides nothing after it. */
  evidenceAt?: number;
}

/** One unlisted GPU, as the roster knows it (what it was, since when it is missing), or as not known to this run. */
function unlistedGpu({ index, uuid }: UnlistedGpu, node: NodeView): string {
  const lost = node.snapshot.lostGpus.find((gpu) => (uuid === undefined ? gpu.index === index : gpu.uuid === uuid));
  if (lost !== undefined) {
    const said = lost.said === undefined ? '' : `; ${saidOfBusId(lost.busId, lost.said)}`;
    return `${gpuNoLongerListed({ ...lost, index })} (missing since ${new Date(lost.lostAt).toISOString()}${said})`;
  }
  if (uuid !== undefined) return `GPU ${index} (${uuid}) is not listed by the GPU driver (it was already missing when nodecompute started)`;
  const why = 'already missing when nodecompute started, renumbered since a GPU went, or registered on trust while the GPU driver could not be asked';
  return `GPU ${index} is not listed by the GPU driver (${why})`;
}

function renumberedWarning({ registered, now, uuid }: Renumbered): string {
  const moved = `GPU ${registered} as registered (${uuid}) is GPU ${now} now: the GPU driver renumbered GPUs after one went; judged on GPU ${now}, the same device`;
  return `${moved}. An engine restarted with CUDA_VISIBLE_DEVICES=${registered} lands on another device: name GPUs by UUID, or PUT the shard with its new gpus`;
}

/** A given GPU not listed (`gone`) or unreachable: it rests on the GPU list alone; an engine saying CPU is a warning. */
function gpuLostVerdict(
  shard: ShardRecord,
  gone: readonly string[],
  unreachable: readonly UnreachableKnownGpu[],
  asRegistered: boolean,
  engine: EngineAccount | null,
  warnings: string[],
): Readiness {
  if (engineSaysCpu(engine)) warnings.push(onCpuLater(engine, 'has GPUs again'));
  const parts: string[] = [];
  if (gone.length > 0) parts.push(`${gone.join('; ')}: ${LOST_GPU_MEANING}`);
  if (unreachable.length > 0) parts.push(`${unreachable.map(gpuUnreachable).join('; ')}: ${UNREACHABLE_GPU_MEANING}`);
  const reason =
    // "As registered" where its other GPUs have new indices: the same numbers may name other GPUs now.
    `placed on ${gpuList(shard.gpus)}${asRegistered ? ' as registered' : ''}, but ${parts.join(' Also, ')} ` +
    `This shard cannot serve as placed. ${LOST_GPU_FIX} ` +
    `Meanwhile start its engine on ${gone.length > 0 ? 'GPUs that are listed' : 'other GPUs'} and PUT the shard with its new gpus.`;
  return verdict('gpu-lost', gone.length > 0 ? 'gpu-not-listed' : 'gpu-unreachable', reason, warnings);
}

function warningsFor(shard: ShardRecord, node: NodeView, engine: EngineAccount | null, staleReason: string | null): string[] {
  const warnings: string[] = [];
  if (staleReason !== null) warnings.push(`answered from an older snapshot: ${staleReason}`);
  const strays = strayGpus(shard, node);
  if (strays.length > 0) warnings.push(`holds memory on ${gpuList(strays)}, which it was not given: check CUDA_VISIBLE_DEVICES and the placement`);
  // An engine that says it computes on the CPU offloaded nothing, whatever "offloaded N/M" it printed.
  if (engine?.backend === 'CUDA' && engine.layersOffloaded !== null && engine.layersTotal !== null && engine.layersOffloaded < engine.layersTotal) {
    warnings.push(`the engine offloaded only ${engine.layersOffloaded} of ${engine.layersTotal} layers to the GPU; the rest runs on the CPU`);
  }
  for (const warning of [cpuBurnWarning(shard, node), otherMigWarning(shard, node)]) if (warning !== null) warnings.push(warning);
  return warnings;
}

/** Whether every process of a cgroup shard now, the sandbox aside, started after its engine output's tail began; false when unknown. */
export function restartedSince(liveness: Liveness | undefined, tailStartedAtTicks: number | null | undefined): boolean {
  return tailStartedAtTicks != null && liveness?.state === 'alive' && liveness.oldestStart !== undefined && liveness.oldestStart > tailStartedAtTicks;
}

/** The engine's account set aside, with why, when it cannot be about the processes running now. */
function earlierRun(shard: ShardRecord, liveness: Liveness, engine: EngineAccount | null, postedAtTicks: number | null | undefined): string | null {
  if (engine === null || !restartedSince(liveness, postedAtTicks)) return null;
  const post = `post the new run's output (llama.cpp -lv 4) to /shards/${shard.id}/engine-output, which starts a new tail`;
  const restarted = `every process in cgroup "${shard.cgroup}" started after it (the container restarted)`;
  return `the engine output posted (it says ${engine.backend}) came, at least in part, from an earlier run: ${restarted}; it decides nothing: ${post}`;
}

/** Given GPUs a stopped shard holds no memory on, as a warning; not while processes are hidden, nor where an owner is unknown. */
function unheldWhileStopped(shard: ShardRecord, node: NodeView): string[] {
  if (node.processesHidden !== null) return [];
  // A shard the attribution judged stopped has holdings there, if only an empty map.
  const held = node.attribution.holdings.get(shard.id)!;
  const missing = shard.gpus.filter((index) => !held.has(index) && !node.attribution.uncertain.has(index));
  if (missing.length === 0) return [];
  const then = 'once it runs again, that decides its verdict (starting within its grace, on-cpu after it)';
  return [`it holds no memory on ${gpuList(missing)} (the GPU driver lists none of its processes there): ${then}`];
}

const onCpuLater = (engine: EngineAccount, once: string): string =>
  `the engine output posted says it computes on the CPU (${engine.summary}): once it ${once}, it reads on-cpu`;

/** Stopped answers nothing, whatever nvidia-smi says; a lost GPU comes before the engine's word once it runs again. */
function stoppedVerdict(input: ReadinessInput, why: string, warnings: string[], gpuLost = false): Readiness {
  const { shard, engine } = input;
  if (shard.gpus.length > 0 && engineSaysCpu(engine)) warnings.push(onCpuLater(engine, gpuLost ? 'has GPUs again' : 'runs again'));
  return verdict('stopped', 'process-stopped', `${why}.`, warnings);
}

/** Without nvidia-smi: exited, stopped or on-cpu by /proc and the engine, gpu-lost by its failure, its last listing, else unverified. */
function withoutNvidiaSmi(input: ReadinessInput): Readiness {
  const { shard } = input;
  const why = input.unavailable ?? 'unknown reason';
  const liveness = livenessWithoutNvidiaSmi(input);
  const unreachable = unreachableGiven(shard, input.unreachable ?? []);
  if (liveness.state === 'gone') return verdict('exited', 'process-exited', `the shard's process exited: ${liveness.why}.`, []);
  if (liveness.state === 'stopped') {
    const lost = unreachable.map((gpu) => `${gpuUnreachable(gpu)}: once it runs again, it reads gpu-lost`);
    return stoppedVerdict(input, liveness.why, [`the GPU driver cannot be asked, so which GPU memory it holds is unverified: ${why}`, ...lost], lost.length > 0);
  }
  const setAside = earlierRun(shard, liveness, input.engine, input.engineTicks);
  const engine = setAside === null ? input.engine : null;
  const besides = [...(liveness.state === 'unreadable' ? [liveness.why] : []), ...(setAside === null ? [] : [setAside])];
  if (unreachable.length > 0) return gpuLostVerdict(shard, [], unreachable, false, engine, besides);
  // An unreadable stat comes before the engine's word, as it does with a snapshot.
  const judgedEngine = liveness.state === 'unreadable' ? null : engine;
  const last = lastListingVerdict(input, liveness, why, besides);
  // As with a snapshot, a GPU gone from the listing comes before what the engine says.
  if (last?.state === 'gpu-lost') return last;
  if (shard.gpus.length > 0 && engineSaysCpu(judgedEngine)) {
    return engineCpuVerdict(shard, judgedEngine, null, [`the GPU driver cannot be asked, so this verdict rests on the engine's own output: ${why}`]);
  }
  const unverified = `the GPU driver cannot be asked, so where this shard computes is unverified and it keeps serving: ${why}`;
  return last ?? verdict('unverified', 'nvidia-smi-unavailable', null, [unverified, ...besides]);
}

/** /proc's liveness, stopped all the same when a process that held its memory in the last good listing is stopped now. */
function livenessWithoutNvidiaSmi(input: ReadinessInput): Liveness {
  const liveness: Liveness = input.liveness ?? { state: 'unknown' };
  const { lastGood, procNow, shard } = input;
  if (liveness.state !== 'alive' || !describes(lastGood, shard) || procNow === undefined) return liveness;
  return stoppedSinceListing(lastGood.node.snapshot, lastGood.node.attribution.holdings.get(shard.id), procNow) ?? liveness;
}

/**
 * Past max-stale, the last good listing, judged with /proc's word now, holds against a shard (HELD_STATES), never for it:
 * one that served keeps serving (fail-open), one never seen on its GPUs is not admitted. A shard it does not describe, or
 * whose engine started again since, reads starting, unless registered before this run (which may have seen it ready).
 * Null: unverified. The engine's CPU account is left to the caller.
 */
function lastListingVerdict(input: ReadinessInput, liveness: Liveness, why: string, besides: string[]): Readiness | null {
  const { shard, lastGood, now } = input;
  if (shard.gpus.length === 0) return null;
  if (!describes(lastGood, shard)) {
    if (input.judgingSince === undefined || shard.registeredAt < input.judgingSince) return null;
    return unseenVerdict(shard, `registered ${formatDuration(now - shard.registeredAt)} ago, and no listing of the GPU driver since has included it`, [`the GPU driver cannot be asked: ${why}`, ...besides]);
  }
  const listing = `the GPU driver's last good listing (${new Date(lastGood.observedAt).toISOString()}, ${formatDuration(Math.max(0, now - lastGood.observedAt))} ago)`;
  if (liveness.state === 'alive') {
    if (lastGood.node.attribution.liveness.get(shard.id)?.state === 'gone') {
      return unseenVerdict(shard, `${listing} showed it exited, and its engine runs again since`, [`the GPU driver cannot be asked: ${why}`, ...besides]);
    }
    const exited = holdersGone(lastGood.node, shard, input.procNow);
    if (exited.length > 0) {
      return unseenVerdict(shard, `every process that held its memory on ${gpuList(exited)} in ${listing} has exited since (its engine restarted)`, [`the GPU driver cannot be asked: ${why}`, ...besides]);
    }
  }
  const prior = readiness({
    shard,
    node: lastGood.node,
    evidenceAt: lastGood.startedAt,
    staleReason: null,
    engine: input.engine,
    engineTicks: input.engineTicks ?? null,
    enginePosted: input.enginePosted === true,
    now,
    ...(liveness.state === 'unknown' ? {} : { livenessNow: liveness }),
  });
  if (!HELD_STATES.has(prior.state)) return null;
  return {
    ...prior,
    reason: `the GPU driver cannot be asked; ${listing} showed: ${prior.reason}`,
    warnings: [`the GPU driver cannot be asked, so this verdict holds until it answers: ${why}`, ...prior.warnings],
  };
}

/** Whether the last good listing describes the shard: its refresh began once the shard was registered. */
function describes(lastGood: ReadinessInput['lastGood'], shard: ShardRecord): lastGood is NonNullable<ReadinessInput['lastGood']> {
  return lastGood != null && shard.registeredAt <= lastGood.startedAt;
}

/** Verdicts of the last good listing that hold past max-stale: those against the shard that /proc cannot end. */
const HELD_STATES: ReadonlySet<ReadinessState> = new Set(['starting', 'on-cpu', 'gpu-lost', 'exited', 'stopped']);

/** Given GPUs (`listed`'s indices) where every process that held the shard's memory in `listed` has exited since. */
function holdersGone(listed: NodeView, shard: ShardRecord, procNow: ReadonlyMap<number, StatAnswer> | undefined): number[] {
  if (procNow === undefined) return [];
  // Not known to have exited (not read now, or unreadable either time) counts as running.
  const runs = (pid: number): boolean => sameProcessNow(listed.snapshot, procNow, pid) !== null;
  const given = placementOf(shard, listed.snapshot.gpus).indices;
  return heldBy(shard, listed)
    .filter((holding) => given.includes(holding.index) && !holding.processes.some((process) => runs(process.pid)))
    .map((holding) => holding.index);
}

/** Starting, for a shard no listing has shown on its GPUs while nvidia-smi cannot be asked: `since` says why none has. */
function unseenVerdict(shard: ShardRecord, since: string, warnings: string[]): Readiness {
  const unseen = `${since}, so it has not been seen holding memory on ${gpuList(shard.gpus)}: it reads starting until the GPU driver answers and lists it there`;
  const fix = "Fix the GPU driver's answers first (`nodecompute doctor`): an engine started while the driver fails most likely cannot use CUDA either.";
  return verdict('starting', 'awaiting-nvidia-smi', `${unseen}. ${fix}`, warnings);
}

export function readiness(input: ReadinessInput): Readiness {
  const { node, now } = input;
  if (node === null) return withoutNvidiaSmi(input);
  const placement = placementOf(input.shard, node.snapshot.gpus);
  // Judged on its GPUs' indices in this listing: the registered ones unless some went or were renumbered.
  const moved = placement.renumbered.length > 0 || placement.unlisted.length > 0;
  const shard = moved ? { ...input.shard, gpus: placement.indices } : input.shard;
  const renumbered = placement.renumbered.map(renumberedWarning);
  const gone = placement.unlisted.map((gpu) => unlistedGpu(gpu, node));
  // Only GPUs this listing has: one it no longer lists is said once, as not listed.
  const unreachable = unreachableGiven(
    input.shard,
    (input.unreachable ?? []).filter(({ listed }) => node.snapshot.gpus.some((gpu) => gpu.uuid === listed?.uuid)),
  );
  const liveness: Liveness = input.livenessNow ?? node.attribution.liveness.get(shard.id) ?? { state: 'unknown' };
  if (liveness.state === 'gone') return verdict('exited', 'process-exited', `the shard's process exited: ${liveness.why}.`, []);
  if (liveness.state === 'stopped') {
    const lost = [...gone, ...unreachable.map(gpuUnreachable)].map((gpu) => `${gpu}: once it runs again, it reads gpu-lost`);
    return stoppedVerdict(input, liveness.why, [...warningsFor(shard, node, input.engine, input.staleReason), ...renumbered, ...lost, ...unheldWhileStopped(shard, node)], lost.length > 0);
  }
  const setAside = earlierRun(shard, liveness, input.engine, input.engineTicks);
  const engine = setAside === null ? input.engine : null;
  const warnings = [...warningsFor(shard, node, engine, input.staleReason), ...renumbered, ...(setAside === null ? [] : [setAside])];
  if (gone.length > 0 || unreachable.length > 0) return gpuLostVerdict(input.shard, gone, unreachable, placement.renumbered.length > 0, engine, warnings);
  if (liveness.state === 'unreadable') return verdict('unverified', 'stat-unreadable', null, [...warnings, liveness.why]);
  const evidenceAt = Math.min(now, input.evidenceAt ?? now);
  if (shard.gpus.length > 0 && engineSaysCpu(engine)) return engineCpuVerdict(shard, engine, node, warnings);
  const noAccount: NoAccount = setAside !== null ? 'earlier-run' : input.enginePosted === true ? 'silent' : 'not-posted';
  const memory = memoryVerdict(input, { shard, node, liveness, evidenceAt, engine, noAccount, warnings });
  return shard.engine === 'ollama' ? ollamaVerdict(shard, node, memory, evidenceAt, now) : memory;
}

/** What memoryVerdict judges: `shard` with its GPUs as this listing numbers them, the engine's account unless set aside. */
type MemoryEvidence = {
  shard: ShardRecord;
  node: NodeView;
  liveness: Liveness;
  evidenceAt: number;
  engine: EngineAccount | null;
  noAccount: NoAccount;
  warnings: string[];
};

/** By the GPU memory the shard holds on its GPUs, against its grace. */
function memoryVerdict(input: ReadinessInput, { shard, node, liveness, evidenceAt, engine, noAccount, warnings }: MemoryEvidence): Readiness {
  const { now } = input;
  const held = node.attribution.holdings.get(shard.id);
  const missing = shard.gpus.filter((index) => !held?.has(index));
  if (missing.length === 0) return heldVerdict(shard, node, evidenceAt, now, warnings);
  const left = shard.registeredAt + shard.graceMs - now;
  if (liveness.state === 'unknown') {
    if (left > 0) {
      return verdict('starting', 'awaiting-snapshot', `registered ${formatDuration(now - shard.registeredAt)} ago; waiting for the first snapshot that includes it (${formatDuration(left)} of grace left).`, warnings);
    }
    // While refreshes fail, no listing will include it soon: as past max-stale, the last word never admits it.
    if (input.failing != null) {
      return unseenVerdict(shard, `registered ${formatDuration(now - shard.registeredAt)} ago, after the GPU driver's last good listing began`, warnings);
    }
    return verdict('unverified', 'not-in-snapshot', null, [...warnings, 'no snapshot taken since this shard was registered includes it yet (the next refresh will): until one does, where it computes is unverified']);
  }
  const waiting = `waiting for the shard to hold memory on ${gpuList(missing)} (the GPU driver lists none of its memory there yet)`;
  if (left > 0) return verdict('starting', 'awaiting-gpu-memory', `${waiting}; ${formatDuration(left)} of its ${formatDuration(shard.graceMs)} grace left.`, warnings);
  if (evidenceAt < shard.registeredAt + shard.graceMs) {
    // Routine right after the grace ends; a slow or failing nvidia-smi, which makes it last, is a warning of its own.
    const after = evidenceAt - shard.registeredAt;
    const begun = after < 0 ? 'before this shard was registered' : `${formatDuration(after)} after registration, before the grace ended`;
    const reason = `${waiting}. Its ${formatDuration(shard.graceMs)} grace is over, but the GPU driver's latest listing was begun ${begun}`;
    return verdict('starting', 'awaiting-listing', `${reason}: the verdict waits for a listing begun after the grace.`, warnings);
  }
  if (node.processesHidden !== null) return verdict('unverified', 'processes-hidden', null, [...warnings, node.processesHidden]);
  const uncertain = missing.flatMap((index) => {
    const stat = node.attribution.uncertain.get(index);
    if (stat === undefined) return [];
    const unread = `the /proc stat of process ${stat.pid} on its way to a shard could not be read in this refresh (${stat.unreadable})`;
    return [`GPU ${index} holds memory of a process whose owner is unknown: ${unread}, so it may be this shard's. ${stat.advice}`];
  });
  if (uncertain.length > 0) return verdict('unverified', 'gpu-owner-unknown', null, [...warnings, ...uncertain]);
  return onCpuVerdict(shard, missing, node, evidenceAt, engine, noAccount, warnings);
}
