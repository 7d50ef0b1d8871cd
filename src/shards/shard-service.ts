// Owns the shard use cases behind the routes: registering (validated against this node's GPUs and
// /proc), removing, taking engine output (dated in /proc's clock; a restarted cgroup shard's output
// starts a new tail), and answering each shard's compute and readiness from the current snapshot.
// The routes stay thin; readers arrive as dependencies so this module never touches the OS itself.
// A shard's verdict changing (starting, ready, on-cpu, gpu-lost, stopped, exited) is logged once, when
// a request first sees the change, rather than at every probe. While nvidia-smi cannot be asked,
// verdicts still use what /proc said in the latest (failed) refresh (NodeService.procOnly): no read of
// its own per probe; and the last good snapshot, whose verdict holds against a shard, never for it.
// A probe answered from a snapshot past its TTL (at once, while the next refresh runs) reads a PID
// shard's own stat now: an exit or a stop since that snapshot holds against the shard at once, not
// one probe period later. A process that runs keeps the snapshot's word (a stop that snapshot saw
// ends with the next one), and a cgroup shard the snapshot's alone (its members take a scan).
import type { Logger } from 'pino';
import { BadRequestError, NotAShardProcessError, ProcessNotFoundError, ProcUnreadableError, ShardNotFoundError, UnknownGpuError, isCodedError } from '../errors.js';
import { pidLiveness, SANDBOX_COMMS, type Liveness } from '../node-state/attribution.js';
import { gpuNoLongerListed, LOST_GPU_MEANING, type LostGpu } from '../node-state/gpu-roster.js';
import type { Current, NodeService } from '../node-state/node-service.js';
import { ANCESTRY_DEPTH, type NodeSnapshot } from '../node-state/node-snapshot.js';
import type { NodeView } from '../node-state/node-view.js';
import type { UnreachableListedGpu } from '../node-state/placement.js';
import { staleNews, type SnapshotView } from '../node-state/snapshot.js';
import type { RegisterShard, ShardRecordBody } from '../schemas/shards.js';
import { cgroupMatcher, hasExited, type ProcReader, type ProcStat } from '../system/procfs.js';
import { shardCompute, type ShardCompute } from './compute.js';
import { ENGINE_TAIL_MAX_BYTES, type EngineState } from './engine-output.js';
import { readiness, restartedSince, type ReadinessInput } from './readiness.js';
import { processOf, type Overlaps } from './registration-rules.js';
import { NotARepeatError, type PutResult, type Registry } from './registry.js';
import { ranInAnotherBoot, sameProcess, type ProcessIdentity, type ShardRecord } from './shard.js';
import type { Readiness, ReadinessState } from './verdict.js';

/** What a registration names, as read from /proc: its identity, and which other registrations cover its processes (null: a repeat, not judged; Registry.repeats). */
interface Target {
  identity: ProcessIdentity;
  overlaps: Overlaps | null;
}

/** A process of this boot, as a map key. */
const processKey = (identity: ProcessIdentity): string => `${identity.pid}@${identity.startTime}`;

/** What attribution counts as a process's own besides itself: its nearest ancestors and its process group. */
interface Lineage {
  ancestors: ProcessIdentity[];
  pgid: number;
}

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
 * A verdict warns about the snapshot's age only when it matters: the last refresh failed, or the one
 * under way is slow (snapshot.ts). A routine stale-while-revalidate answer, one refresh period behind
 * however long nobody asked, is not news; nor is one taken just before a registration changed.
 */

/** Why posted output gave no account, for the one who posted it; null when it gave one. */
function engineOutputNote(shard: ShardRecord, state: EngineState): string | null {
  if (state.account !== null) return null;
  if (shard.engine !== 'llama.cpp') {
    return (
      `Shard "${shard.id}" is registered with engine "${shard.engine}", and only llama.cpp output is read for where the engine computes: ` +
      `this output is kept (the last ${ENGINE_TAIL_MAX_BYTES / 1024} KiB) but decides nothing, and nvidia-smi alone judges the shard. ` +
      `If it is llama.cpp, register it again with "engine": "llama.cpp" (PUT /shards/${shard.id}): the output kept is read then.`
    );
  }
  return (
    'Nothing in the output kept so far says where llama.cpp computes: recent llama.cpp (b9829 and later) names its devices and buffers only at -lv 4. ' +
    'Until it does, nvidia-smi alone judges the shard.'
  );
}

/** init: in the host's PID namespace the ancestor of every process; in a container's, its main process. */
const INIT_PID = 1;
/** kthreadd: every kernel thread is it or its child, in the host's PID namespace. */
const KTHREADD_PID = 2;

export function shardBody(shard: ShardRecord): ShardRecordBody {
  return { ...shard, gpuUuids: shard.gpuUuids ?? null, registeredAt: new Date(shard.registeredAt).toISOString() };
}

export function createShardService(deps: ShardServiceDeps) {
  const { registry, node, proc, log, now } = deps;
  /** Shards registered before this run may have been seen ready by an earlier one (readiness.ts, lastListingVerdict). */
  const judgingSince = now();

  /** The boot a process read now belongs to, for its identity (nothing when /proc cannot say). */
  function ofThisBoot(): { bootId?: string } {
    const bootId = proc.bootId();
    return bootId === null ? {} : { bootId };
  }

  /** The process to register as a PID shard, and its parent's PID. */
  async function identityOfPid(pid: number): Promise<{ identity: ProcessIdentity; ppid: number }> {
    const stat = await proc.readStat(pid);
    if (!stat) {
      throw new ProcessNotFoundError(
        `No process with PID ${pid} exists in ${proc.root}. Register the shard's host PID while it runs; ` +
          "if the shard runs in a container, nodecompute needs the host's PID namespace (--pid=host / hostPID: true) to see it.",
      );
    }
    if (hasExited(stat)) {
      throw new ProcessNotFoundError(
        `Process ${pid} (${stat.comm}) has already exited: it is a zombie its parent has not reaped. Register the shard once its engine runs.`,
      );
    }
    if (stat.pid === INIT_PID) {
      throw new NotAShardProcessError(
        `PID 1 in ${proc.root} is init (${stat.comm}), not a shard: every process on the node descends from it, so as a shard it would claim ` +
          "other workloads' GPU memory and none would read as foreign. This is probably a container's main process, PID 1 inside the container: " +
          "register its host PID (`docker inspect -f '{{.State.Pid}}' CONTAINER`; in Kubernetes `crictl inspect --output go-template --template '{{.info.pid}}' CONTAINER_ID` on the node), " +
          'or register the pod by its cgroup ("cgroup": its UID, `kubectl get pod POD -o jsonpath=\'{.metadata.uid}\'`).',
      );
    }
    if (stat.pid === KTHREADD_PID || stat.ppid === KTHREADD_PID) {
      throw new NotAShardProcessError(
        `PID ${pid} in ${proc.root} is the kernel thread ${stat.comm}, not a shard. This is probably the PID as a container sees it: ` +
          "register the host PID (for a container's main process: `docker inspect -f '{{.State.Pid}}' CONTAINER`), or register the shard by its cgroup.",
      );
    }
    return { identity: { pid, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm, ...ofThisBoot() }, ppid: stat.ppid };
  }

  /**
   * Which registrations cover one of `held` (a target's running processes, read now) though their
   * target differs: a PID shard of one of them, or a cgroup shard one of them runs in (as a pod UID
   * and a container id of the pod name the same processes). `ofCgroup`: whether they are a cgroup's.
   */
  async function overlapsWith(held: ProcessIdentity[], ofCgroup: boolean): Promise<Overlaps> {
    const cgroups = (await Promise.all(held.map((identity) => proc.readCgroup(identity.pid)))).map((paths) => paths ?? []);
    return (other) => {
      if (other.cgroup === null) {
        return held.some((identity) => sameProcess(other.identity, identity)) ? `holds process ${processOf(other)}` : null;
      }
      if (!cgroups.some(cgroupMatcher(other.cgroup))) return null;
      return `${ofCgroup ? 'shares processes with' : 'runs in'} the cgroup "${other.cgroup}"`;
    };
  }

  /**
   * A stat read for a conflict check: undefined when it cannot be read (unparsable, or denied): a
   * /proc entry of another process must not fail this registration, whose own reads fail it (503).
   */
  async function statIfReadable(pid: number): Promise<ProcStat | null | undefined> {
    try {
      return await proc.readStat(pid);
    } catch {
      return undefined;
    }
  }

  /** The nearest ANCESTRY_DEPTH ancestors of a process whose parent is `ppid`, read now, as attribution's rule 2 follows them. */
  async function ancestorsFrom(ppid: number): Promise<ProcessIdentity[]> {
    const ancestors: ProcessIdentity[] = [];
    for (let next = ppid; next > 0 && ancestors.length < ANCESTRY_DEPTH; ) {
      const parent = await statIfReadable(next);
      if (!parent) break;
      ancestors.push({ pid: parent.pid, pgid: parent.pgrp, startTime: parent.startTime, name: parent.comm, ...ofThisBoot() });
      next = parent.ppid;
    }
    return ancestors;
  }

  /**
   * A registered PID shard's ancestors and process group, read now: null when its process no longer
   * runs (exited, a zombie included, or its PID is another's now), as attribution counts it gone;
   * undefined when its stat cannot be read (it is then judged by its registration).
   */
  async function lineageOf(identity: ProcessIdentity): Promise<Lineage | null | undefined> {
    const stat = await statIfReadable(identity.pid);
    if (stat === undefined) return undefined;
    if (stat === null || stat.startTime !== identity.startTime || hasExited(stat)) return null;
    return { ancestors: await ancestorsFrom(stat.ppid), pgid: stat.pgrp };
  }

  /**
   * A process to register. Besides the same process, a registered PID shard covers it when one is
   * the other's descendant (within attribution's ANCESTRY_DEPTH), or a member of the process group
   * the other leads: attribution would give the memory of the one registered second to it, and the
   * first would read on-cpu while its engine computes on the GPU. Two shards that are siblings in one
   * group (one script started both) are not covered by each other. A PID shard stored while this one
   * is read (or whose stat cannot be read) is judged by what this registration shows (its ancestors
   * and group) and by the group it was registered in; a child stored at the same moment as its parent
   * that has left the parent's group is not caught. A registration that `repeats` (a control plane
   * reconciling it) is never a conflict: the other shards' /proc entries are not read for it.
   */
  async function targetOfPid(pid: number, repeats: (identity: ProcessIdentity) => boolean): Promise<Target> {
    const { identity, ppid } = await identityOfPid(pid);
    if (repeats(identity)) return { identity, overlaps: null };
    const others = registry.list().filter((shard) => shard.cgroup === null && !ranInAnotherBoot(shard.identity, proc.bootId()));
    const [ancestors, lineages] = await Promise.all([
      ancestorsFrom(ppid),
      Promise.all(others.map(async (shard) => [processKey(shard.identity), await lineageOf(shard.identity)] as const)),
    ]);
    const own: Lineage = { ancestors, pgid: identity.pgid };
    const lineageByProcess = new Map(lineages);
    const sameOrCgroup = await overlapsWith([identity], false);
    return {
      identity,
      overlaps: (other) => {
        const plain = sameOrCgroup(other);
        if (plain !== null || other.cgroup !== null || ranInAnotherBoot(other.identity, proc.bootId())) return plain;
        // Keyed by process, not id: an id replaced since by another process was not read.
        const theirs = lineageByProcess.get(processKey(other.identity));
        // Gone since it was registered: it claims nothing, and its PID and group number may be another's now.
        if (theirs === null) return null;
        const process = `process ${processOf(other)}`;
        if (own.ancestors.some((ancestor) => sameProcess(other.identity, ancestor))) return `descends from ${process}`;
        if (theirs?.ancestors.some((ancestor) => sameProcess(identity, ancestor))) return `is an ancestor of ${process}`;
        const theirGroup = theirs?.pgid ?? other.identity.pgid;
        if (theirGroup === other.identity.pid && own.pgid === theirGroup) return `is in the process group ${process} leads`;
        if (own.pgid === identity.pid && theirGroup === identity.pid) return `leads the process group ${process} is in`;
        return null;
      },
    };
  }

  /**
   * A cgroup to register: its identity is the cgroup's oldest running process that is not the pod's
   * sandbox (the engine's run, see ShardRecord.identity).
   */
  async function targetOfCgroup(cgroup: string): Promise<Target> {
    const pids = (await proc.findPidsInCgroup(cgroup)).sort((a, b) => a - b);
    const held: ProcessIdentity[] = [];
    let chosen: ProcessIdentity | null = null;
    let chosenIsEngine = false;
    for (const pid of pids) {
      const stat = await proc.readStat(pid);
      if (!stat || hasExited(stat)) continue;
      const identity = { pid, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm, ...ofThisBoot() };
      held.push(identity);
      const isEngine = !SANDBOX_COMMS.has(stat.comm);
      if (chosen === null || (isEngine && (!chosenIsEngine || identity.startTime < chosen.startTime))) {
        chosen = identity;
        chosenIsEngine = isEngine;
      }
    }
    if (chosen !== null) return { identity: chosen, overlaps: await overlapsWith(held, true) };
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

  /**
   * GPU indices are checked against the node when nvidia-smi answers, and each one's UUID kept
   * (placement.ts); otherwise they are taken on trust, and `unchecked` says why (nvidia-smi's failure).
   * `kept`: the devices a repeat of the registration's GPUs names, whatever their indices now; they
   * are not checked, but the registration waits for the snapshot as any other does.
   */
  async function checkGpus(gpus: number[], kept: string[] | undefined): Promise<{ unchecked: string | null; uuids?: string[] }> {
    if (gpus.length === 0) return { unchecked: null, uuids: [] };
    let snapshot: NodeSnapshot;
    try {
      snapshot = (await node.current()).view.snapshot;
    } catch (err) {
      if (!isCodedError(err)) throw err;
      return kept === undefined ? { unchecked: err.message } : { unchecked: null, uuids: kept };
    }
    if (kept !== undefined) return { unchecked: null, uuids: kept };
    const known = snapshot.gpus.map((gpu) => gpu.index);
    const unknown = gpus.filter((index) => !known.includes(index));
    if (unknown.length === 0) return { unchecked: null, uuids: gpus.map((index) => snapshot.gpus.find((gpu) => gpu.index === index)!.uuid) };
    const lostSince = (gpu: LostGpu) => ` ${gpuNoLongerListed(gpu)} since ${new Date(gpu.lostAt).toISOString()}`;
    const lostNote = snapshot.lostGpus
      .filter((gpu) => unknown.includes(gpu.index))
      .map((gpu) => `${lostSince(gpu)}: ${LOST_GPU_MEANING}`)
      .join('');
    // A lost GPU of another index renumbers those after it: the index asked for is most likely one of them.
    const renumberNote = snapshot.lostGpus
      .filter((gpu) => !unknown.includes(gpu.index))
      .map((gpu) => `${lostSince(gpu)}, and nvidia-smi numbers only the GPUs it lists: those after it usually moved down one index. GET /gpus gives each GPU's index and UUID now.`)
      .join('');
    throw new UnknownGpuError(
      `GPU ${unknown.join(', ')} does not exist on this node; it has GPU ${known.join(', ')} (as nvidia-smi numbers them).${lostNote}${renumberNote} Fix "gpus" in the registration.`,
    );
  }

  function notFound(id: string): Error {
    return new ShardNotFoundError(`No shard "${id}" is registered on this node. Register it with PUT /shards/${id}, or list them with GET /shards.`);
  }

  function requireShard(id: string): ShardRecord {
    const shard = registry.get(id);
    if (!shard) throw notFound(id);
    return shard;
  }

  /**
   * The last verified verdict logged for each shard id. A replacement for the same process and GPUs
   * (a new grace, say) carries on from it, so only a change of verdict is logged; one for another
   * process, cgroup or GPUs starts afresh (its first verdict names the new target); a removed one is
   * forgotten.
   */
  const loggedVerdicts = new Map<string, ReadinessState>();

  function logVerdictChange(shard: ShardRecord, verdict: Readiness): void {
    // Unverified means nvidia-smi cannot be asked: the snapshot cache logs that once for the node.
    if (verdict.state === 'unverified') return;
    // A verdict on a registration replaced or removed meanwhile (a list that waited on a refresh) is history.
    if (registry.get(shard.id) !== shard) return;
    const previous = loggedVerdicts.get(shard.id) ?? null;
    if (previous === verdict.state) return;
    loggedVerdicts.set(shard.id, verdict.state);
    const level = verdict.state === 'ready' || verdict.state === 'starting' ? 'info' : 'warn';
    log[level](
      { shard: shard.id, state: verdict.state, cause: verdict.cause, previous, shardPid: shard.pid, cgroup: shard.cgroup, gpus: shard.gpus },
      `Shard "${shard.id}" is now ${verdict.state}${verdict.reason === null ? '' : `: ${verdict.reason}`}`,
    );
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

  /** The verdict (and, unless a probe only needs the verdict, the compute) of one shard; `livenessNow` is /proc's word now (see the header). */
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

  /**
   * Probes arrive every few seconds per pod and mostly get the same answer. A verdict whose text
   * does not depend on the clock (ready, gpu-lost, stopped, exited) is kept per node view, shard record,
   * engine output version, staleness note and unreachable GPUs, so a steady shard's probe computes nothing. Starting and on-cpu
   * verdicts say how long ago things happened and are made afresh.
   */
  const CLOCK_FREE_STATES: ReadonlySet<ReadinessState> = new Set(['ready', 'gpu-lost', 'stopped', 'exited']);
  type SteadyProbe = { shard: ShardRecord; engineVersion: number; staleNote: string | null; unreachable: readonly UnreachableListedGpu[]; state: ShardState };
  const steadyProbes = new WeakMap<NodeView, Map<string, SteadyProbe>>();

  function probeState(shard: ShardRecord, current: Current): ShardState {
    const note = staleNews(current.view);
    const unreachable = node.unreachable();
    const kept = steadyProbes.get(current.node)?.get(shard.id);
    if (kept && kept.shard === shard && kept.engineVersion === registry.engineVersion && kept.staleNote === note && kept.unreachable === unreachable) return kept.state;
    const state = stateOf(shard, current, null, false);
    if (CLOCK_FREE_STATES.has(state.readiness.state)) {
      let perShard = steadyProbes.get(current.node);
      if (!perShard) steadyProbes.set(current.node, (perShard = new Map()));
      perShard.set(shard.id, { shard, engineVersion: registry.engineVersion, staleNote: note, unreachable, state });
    }
    return state;
  }

  /** Whether a probe from `current` reads the shard's own stat first: a PID shard, and a snapshot past its TTL. */
  const readsStatNow = (shard: ShardRecord, current: Current): boolean => shard.pid !== null && current.view.stale;

  /** A PID shard's own process, read now, where it has exited or is stopped: what a stale snapshot cannot say yet. */
  function exitOrStopNow(shard: ShardRecord, current: Current): Liveness | undefined {
    const now = pidLiveness(shard, proc.statNow(shard.identity.pid), current.node.snapshot.bootId);
    return now.state === 'gone' || now.state === 'stopped' ? now : undefined;
  }

  /** A probe's verdict from `current`, by /proc's word now where the snapshot is past its TTL. */
  function probeFrom(shard: ShardRecord, current: Current): ShardState {
    const livenessNow = readsStatNow(shard, current) ? exitOrStopNow(shard, current) : undefined;
    return livenessNow === undefined ? probeState(shard, current) : stateOf(shard, current, null, false, livenessNow);
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

  /** What follows a stored registration, whether or not its PUT still waits (its write may have landed after a 503 pending). */
  function registered(id: string, { created, shard, graceKept, unchanged }: PutResult): void {
    if (!graceKept) loggedVerdicts.delete(id);
    const fields = { shard: id, shardPid: shard.pid, cgroup: shard.cgroup, gpus: shard.gpus, created, registeredAt: new Date(shard.registeredAt).toISOString() };
    if (unchanged) {
      // A control plane reconciling its shards re-PUTs them periodically: nothing to say, nothing to refresh.
      log.debug(fields, 'Shard registration repeated unchanged; its grace clock goes on');
      return;
    }
    node.invalidate();
    if (created) log.info(fields, 'Shard registered');
    else if (graceKept) log.info(fields, 'Shard registration replaced for the same process and GPUs; its grace clock goes on from its first registration');
    else log.info(fields, 'Shard registration replaced with another process or other GPUs; its grace starts again');
  }

  /** What follows a stored removal, as registered(). */
  function removed(id: string): void {
    loggedVerdicts.delete(id);
    node.invalidate();
    log.info({ shard: id }, 'Shard removed');
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
      const recordOf = (identity: ProcessIdentity, gpuUuids: string[] | undefined): ShardRecord => ({
        id,
        pid: body.pid ?? null,
        cgroup: body.cgroup ?? null,
        gpus: [...body.gpus],
        ...(gpuUuids === undefined ? {} : { gpuUuids }),
        engine: body.engine ?? 'other',
        graceMs: body.graceMs ?? deps.defaultGraceMs,
        registeredAt: now(),
        identity,
      });
      // A PUT that repeats this id's GPUs (a controller re-PUTting its spec) means the devices the
      // registration kept, whatever indices nvidia-smi gives them now: a lost one stays lost, a
      // renumbered one stays the shard's. Their UUIDs, in the body's order; undefined otherwise.
      const repeatedUuids = (): string[] | undefined => {
        const before = registry.get(id);
        if (before?.gpuUuids === undefined || before.gpus.length !== body.gpus.length || !body.gpus.every((index) => before.gpus.includes(index))) return undefined;
        return body.gpus.map((index) => before.gpuUuids![before.gpus.indexOf(index)]!);
      };
      const kept = repeatedUuids();
      const target = (repeats: (identity: ProcessIdentity) => boolean) =>
        readable(body.pid !== undefined ? targetOfPid(body.pid, repeats) : targetOfCgroup(body.cgroup as string));
      const [read, { unchecked, uuids }] = await Promise.all([
        target((identity) => registry.repeats(recordOf(identity, kept))),
        checkGpus(body.gpus, kept),
      ]);
      const put = ({ identity, overlaps }: Target) => registry.put(recordOf(identity, uuids), overlaps, (stored) => registered(id, stored));
      const { created, shard, unchanged } = await put(read).catch(async (err: unknown) => {
        if (!(err instanceof NotARepeatError)) throw err;
        // Read as a repeat, the id was removed or changed before it was decided: judged in full now.
        return put(await target(() => false));
      });
      if (unchecked !== null && !unchanged) {
        log.warn(
          { shard: id, gpus: shard.gpus, nvidiaSmi: unchecked },
          `Shard "${id}" was stored with GPU ${shard.gpus.join(', ')} unchecked: nvidia-smi cannot be asked, so they were taken on trust. ` +
            "Once it answers, check that they are this node's (GET /gpus lists them).",
        );
      }
      return { created, shard };
    },

    async remove(id: string): Promise<void> {
      if (!(await registry.remove(id, () => removed(id)))) {
        throw new ShardNotFoundError(`No shard "${id}" is registered on this node, so there is nothing to remove: if this DELETE repeats an earlier one, that one removed it. GET /shards lists those registered.`);
      }
    },

    /** Where a shard computes; nvidia-smi failures propagate (503): no snapshot, no answer. */
    async compute(id: string): Promise<{ view: SnapshotView<NodeSnapshot>; compute: ShardCompute }> {
      requireShard(id);
      const current = await node.current();
      // The backend says CPU only on a verdict's evidence, so the verdict is judged too.
      const state = stateOf(requireShard(id), current, null);
      return { view: current.view, compute: state.compute! };
    },

    /**
     * Output posted after a cgroup shard's container restarted starts a new tail: the old one is (at
     * least in part) the previous run's, and a run that died at CUDA init cannot be told apart from
     * the next run's own lines by the text alone (llama-log.ts). Judged by the snapshot at hand,
     * without waiting. One taken before the restart shows the old processes, and the output is
     * appended; but the tail is dated from its first post, so once a snapshot shows the new run the
     * verdict sets the mixed tail aside and the next post begins a new one.
     */
    appendEngineOutput(id: string, text: string): EngineState & { note: string | null } {
      const restarted = restartedSince(node.peek()?.node.attribution.liveness.get(id), registry.engine(id)?.tailStartedAtTicks);
      // Dated in the clock of /proc start times too, so that a run started after it can be told.
      const state = registry.appendEngineOutput(id, text, now(), proc.ticksNow(), restarted);
      if (!state) throw notFound(id);
      return { ...state, note: engineOutputNote(requireShard(id), state) };
    },

    /**
     * One shard's state and compute from the current snapshot, with that snapshot; on an nvidia-smi
     * failure, the verdict without a snapshot (readiness.ts), no snapshot, and why.
     */
    async state(id: string, maxWaitMs: number): Promise<{ state: ShardState; view: SnapshotView<NodeSnapshot> | null; error: string | null }> {
      requireShard(id);
      const { current, why } = await currentOrWhy(maxWaitMs);
      // Asked again after the wait: the shard may have been removed (404) or replaced meanwhile.
      return { state: stateOf(requireShard(id), current, why), view: current?.view ?? null, error: why };
    },

    /** A probe's verdict (no compute) when the cache can answer without waiting; null when it must wait. */
    probeNow(id: string): ShardState | null {
      const shard = requireShard(id);
      const current = node.available();
      return current ? probeFrom(shard, current) : null;
    },

    /** A probe's verdict (no compute), waiting at most `maxWaitMs` for a refresh; nvidia-smi failures give the verdict without a snapshot. */
    async probe(id: string, maxWaitMs: number): Promise<ShardState> {
      requireShard(id);
      const { current, why } = await currentOrWhy(maxWaitMs);
      const shard = requireShard(id);
      return current ? probeFrom(shard, current) : stateOf(shard, null, why, false);
    },

    /** Every shard's state from one snapshot, with that snapshot; nvidia-smi failures give verdicts without a snapshot. */
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
