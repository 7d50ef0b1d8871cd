// Owns which registered shard each GPU process belongs to, and whether each shard's process still
// runs (for a cgroup shard: a process of its cgroup other than the pod's sandbox, see SANDBOX_COMMS,
// and since when), computed once per snapshot and registry version. A GPU process belongs, by the
// first rule that names a shard:
//   1. to the shard it *is*: the shard's PID, or a member of the shard's cgroup;
//   2. to the shard its nearest ancestor is (by rule 1), following ppid through the snapshot's stats
//      for ANCESTRY_DEPTH generations: an engine computing in a child or grandchild (vLLM's
//      EngineCore and its workers) is still the shard, even when one script started several shards
//      in its own process group;
//   3. to the shard whose process group holds it, when exactly one shard's process claims that
//      group: a live PID shard by its current group, a gone one by its last known group (its orphans
//      may still be in it); and only when it started no earlier than the shard's process, as its
//      descendants and their orphans did: an older member (the leader of a group the shard does
//      not lead, a sibling its script started first) is not the shard's. A group claimed by several
//      processes, with no ancestry to tell, gives the process to no shard, so its memory reads as
//      foreign: still counted as used, which no placement decision can over-commit, where a guess
//      could call a shard ready on another shard's memory.
// Shards are taken in id order and the first claim stands, so a PID two shards claim (one process
// registered twice) goes deterministically to the first, with its children and its group.
// A shard that is gone claims nothing, but its exited reason names the GPU memory its process group
// still holds (an orphaned engine child), so the operator knows what to kill; except a PID shard
// registered in an earlier boot of the node (its identity's bootId), whose PID and group number
// name this boot's processes now: it claims, contests and names nothing. A shard whose own stat
// could not be read this refresh is 'unreadable', not gone: it keeps its claims (its PID most likely
// still is it) and its readiness says what failed. Likewise a GPU process that no rule could give
// to a shard because a stat on its way (its own, or an ancestor's) was unreadable is 'uncertain' on
// its GPU: a shard missing that GPU has no evidence against it. A shard whose process is stopped
// (state T: SIGSTOP or SIGTSTP; t: halted by a debugger or tracer; for a cgroup shard, every member
// that has not exited, the pod's sandbox aside; and, in a shard that otherwise runs, a process that
// holds its GPU memory, such as a tensor-parallel worker, which stalls every request) is 'stopped',
// not gone: it answers nothing, but it still holds its memory, so it keeps its claims and that
// memory stays its own, not foreign.
import { ranInAnotherBoot, type ShardRecord } from '../shards/shard.js';
import { hasExited, isReadable, type ProcStat, type StatAnswer, type UnreadableStat } from '../system/procfs.js';
import { ANCESTRY_DEPTH, statOf, type GpuProcess, type NodeSnapshot } from './node-snapshot.js';

export interface ShardGpuHolding {
  index: number;
  uuid: string;
  /**
   * Sum of its processes' memory there; null when nvidia-smi does not report the memory of one of
   * them ([N/A]): the process still holds the GPU, but how much is not known.
   */
  usedMiB: number | null;
  processes: GpuProcess[];
}

export type Liveness =
  /**
   * For a cgroup shard, `oldestStart` is the start time (clock ticks since boot) of the oldest of
   * its processes that have not exited (stopped ones too) other than the pod's sandbox, when the
   * snapshot read every member: engine output posted before it describes an earlier run.
   */
  | { state: 'alive'; oldestStart?: number }
  | { state: 'gone'; why: string }
  /** It exists but is stopped, and answers nothing until it runs again; `why` names its stopped processes and what resumes them. */
  | { state: 'stopped'; why: string }
  /** Its stat could not be read or parsed this refresh: whether it runs is unknown; `why` says what to do. */
  | { state: 'unreadable'; why: string }
  /** The snapshot was taken before this shard was registered: no /proc facts yet. */
  | { state: 'unknown' };

export interface Attribution {
  /** The shard that owns a GPU process, by PID; absent when foreign. */
  ownerByPid: ReadonlyMap<number, string>;
  /**
   * Per GPU index, a stat that could not be read on the way from one of its unowned processes to a
   * shard (the process's own, or an ancestor's): that memory may be a shard's, so a shard missing
   * that GPU has no evidence against it.
   */
  uncertain: ReadonlyMap<number, UnreadableStat>;
  /** Per shard, per GPU index it holds memory on. */
  holdings: ReadonlyMap<string, ReadonlyMap<number, ShardGpuHolding>>;
  liveness: ReadonlyMap<string, Liveness>;
}

function unreadableWhy(stat: UnreadableStat): string {
  return (
    `the /proc stat of its process ${stat.pid} could not be read in this refresh: ${stat.unreadable}. ` +
    `Whether it still runs is unverified, so it keeps serving. ${stat.advice}`
  );
}

/** A process stopped by a signal (T: SIGSTOP, SIGTSTP) or by a tracer (t); it resumes where it stopped. */
function isStopped(stat: ProcStat): boolean {
  return stat.state === 'T' || stat.state === 't';
}

// Stopped processes of a cgroup named one by one in a reason; the rest are counted (all are in its advice).
const STOPPED_LISTED = 5;

/** What a stop state means, in the words of its stat. */
const STOP_MEANING = {
  T: 'state T: it was sent SIGSTOP, or SIGTSTP by Ctrl-Z in the terminal that runs it, or SIGTTIN for reading from that terminal in the background',
  t: 'state t: a debugger such as gdb, or another tracer, attached to it and halted it',
} as const;

function capitalised(text: string): string {
  return `${text.charAt(0).toUpperCase()}${text.slice(1)}`;
}

/**
 * Which stopped processes make a shard stopped: its registered process (a PID shard), every member
 * of its cgroup that has not exited, or, in a shard that otherwise runs, the processes that hold its
 * GPU memory (each with the GPUs it holds).
 */
type StoppedSubject = { kind: 'process' } | { kind: 'cgroup'; cgroup: string } | { kind: 'gpu-holders'; gpusOf: ReadonlyMap<number, number[]> };

/**
 * Why a shard is stopped, for the operator: which processes, what their state means and what
 * resumes each kind (SIGCONT does not resume a traced process: only its tracer can).
 */
function stoppedWhy(stopped: readonly ProcStat[], subject: StoppedSubject): string {
  const byPid = [...stopped].sort((a, b) => a.pid - b.pid);
  const signalled = byPid.filter((stat) => stat.state === 'T').map((stat) => stat.pid);
  const traced = byPid.filter((stat) => stat.state === 't').map((stat) => stat.pid);
  const meaning = [signalled.length > 0 ? STOP_MEANING.T : null, traced.length > 0 ? STOP_MEANING.t : null].filter((line) => line !== null).join('; ');
  const listed = (describe: (stat: ProcStat) => string) => {
    const more = byPid.length > STOPPED_LISTED ? `, and ${byPid.length - STOPPED_LISTED} more` : '';
    return `${byPid.slice(0, STOPPED_LISTED).map(describe).join(', ')}${more}`;
  };
  let what: string;
  if (subject.kind === 'process') {
    const [stat] = byPid as [ProcStat];
    what = `process ${stat.pid} (${stat.comm}) is stopped (${meaning})`;
  } else if (subject.kind === 'cgroup') {
    what = `every process of cgroup "${subject.cgroup}" that has not exited, the pod's sandbox aside, is stopped: ${listed((stat) => `${stat.pid} (${stat.comm}, state ${stat.state})`)}. ${capitalised(meaning)}`;
  } else {
    const gpus = (pid: number) => subject.gpusOf.get(pid)!.map((index) => `GPU ${index}`).join(', ');
    what =
      `a process of it that holds its GPU memory is stopped while the rest of it runs: ${listed((stat) => `${stat.pid} (${stat.comm}, state ${stat.state}, on ${gpus(stat.pid)})`)}. ` +
      `A stopped worker (a tensor-parallel rank, say) stalls every request that needs it. ${capitalised(meaning)}`;
  }
  const toDo: string[] = [];
  if (signalled.length > 0) {
    const resume = `\`kill -CONT ${signalled.join(' ')}\``;
    toDo.push(subject.kind === 'process' ? `resume it with ${resume}, or \`fg\` in that terminal` : `resume those in state T with ${resume} on the node (these are host PIDs)`);
  }
  if (traced.length > 0) {
    const which = subject.kind === 'process' ? 'let it' : `let those in state t (${traced.join(' ')})`;
    toDo.push(`${which} continue in the debugger, or detach the debugger (gdb: \`detach\`): \`kill -CONT\` does not resume a traced process`);
  }
  return (
    `${what}. A stopped process keeps all its memory, GPU memory included, but answers no request, so traffic sent to it hangs. ` +
    `${capitalised(toDo.join('; '))}. The verdict changes by itself once it runs again`
  );
}

/**
 * A running shard's GPU-holding processes that are stopped, each with the GPUs it holds, by their
 * stats in `statNow` (undefined: not known); null when none is.
 */
function stoppedGpuHolders(
  holdings: ReadonlyMap<number, ShardGpuHolding>,
  statNow: (pid: number) => ProcStat | undefined,
): { stopped: ProcStat[]; gpusOf: Map<number, number[]> } | null {
  const gpusOf = new Map<number, number[]>();
  const stopped: ProcStat[] = [];
  for (const holding of holdings.values()) {
    for (const { pid } of holding.processes) {
      const stat = statNow(pid);
      if (stat === undefined || !isStopped(stat)) continue;
      const gpus = gpusOf.get(pid);
      if (gpus === undefined) {
        gpusOf.set(pid, [holding.index]);
        stopped.push(stat);
      } else if (!gpus.includes(holding.index)) gpus.push(holding.index);
    }
  }
  return stopped.length === 0 ? null : { stopped, gpusOf };
}

/**
 * A process `listed` read, as `procNow` reads it: its stat when it is the same process (PID and start
 * time) and has not exited; null when it has exited since (gone, a zombie, or its PID another
 * process's now); undefined when that is not known (not read, or unreadable either time).
 */
export function sameProcessNow(listed: NodeSnapshot, procNow: ReadonlyMap<number, StatAnswer>, pid: number): ProcStat | null | undefined {
  const now = procNow.get(pid);
  if (now === null) return null;
  const then = statOf(listed, pid);
  if (!isReadable(now) || then === undefined) return undefined;
  return now.startTime === then.startTime && !hasExited(now) ? now : null;
}

/**
 * While nvidia-smi cannot be asked: a shard /proc finds running is stopped all the same when a
 * process that held its GPU memory in `listed` (the last good listing, with its attribution's
 * `holdings` of the shard) is the same process now (PID and start time, in `procNow`) and stopped.
 * Null when none is.
 */
export function stoppedSinceListing(
  listed: NodeSnapshot,
  holdings: ReadonlyMap<number, ShardGpuHolding> | undefined,
  procNow: ReadonlyMap<number, StatAnswer>,
): Liveness | null {
  if (holdings === undefined) return null;
  const holders = stoppedGpuHolders(holdings, (pid) => sameProcessNow(listed, procNow, pid) ?? undefined);
  return holders === null ? null : { state: 'stopped', why: stoppedWhy(holders.stopped, { kind: 'gpu-holders', gpusOf: holders.gpusOf }) };
}

function pidShardLiveness(snapshot: NodeSnapshot, shard: ShardRecord): Liveness {
  const pid = shard.identity.pid;
  return pidLiveness(shard, snapshot.proc.has(pid) ? snapshot.proc.get(pid)! : undefined, snapshot.bootId);
}

/**
 * A PID shard's liveness by its own stat (undefined: not read), in the node's boot `bootId`: what a
 * snapshot says of it, and what a probe reads of it now (shard-service.ts), but for a stopped
 * process holding its GPU memory, which only a snapshot's GPU processes show.
 */
export function pidLiveness(shard: ShardRecord, stat: StatAnswer | undefined, bootId: string | null): Liveness {
  const pid = shard.identity.pid;
  if (ranInAnotherBoot(shard.identity, bootId)) {
    return {
      state: 'gone',
      why:
        `the node has restarted since it was registered (boot ${shard.identity.bootId}, now ${bootId}): process ${pid} ended with that boot, ` +
        `and a process running as PID ${pid} now is another one, not this shard's. ` +
        `Register the engine's new process (PUT /shards/${shard.id}), or remove the shard (DELETE /shards/${shard.id})`,
    };
  }
  if (stat === undefined) return { state: 'unknown' };
  if (stat === null) return { state: 'gone', why: `process ${pid} no longer exists` };
  if ('unreadable' in stat) return { state: 'unreadable', why: unreadableWhy(stat) };
  if (hasExited(stat)) {
    return { state: 'gone', why: `process ${pid} has exited (a zombie its parent has not reaped yet)` };
  }
  if (stat.startTime !== shard.identity.startTime) {
    return {
      state: 'gone',
      why: `PID ${pid} now belongs to another process (${stat.comm}, started at tick ${stat.startTime}, not ${shard.identity.startTime}): the registered process exited and its PID was reused`,
    };
  }
  if (isStopped(stat)) return { state: 'stopped', why: stoppedWhy([stat], { kind: 'process' }) };
  return { state: 'alive' };
}

/**
 * The processes that hold a pod together without being its workload: the sandbox (infra) process,
 * `/pause` of the pause image under containerd, CRI-O and cri-dockerd, which outlives every restart
 * of the pod's containers; and CRI-O's container monitor, conmon, which OpenShift places in the
 * pod's cgroup (conmon_cgroup = "pod"). Neither ever computes, so a pod cgroup that holds nothing
 * else has no engine running: its container exited or is waiting to be restarted.
 */
export const SANDBOX_COMMS: ReadonlySet<string> = new Set(['pause', 'conmon']);

function sandboxWhy(cgroup: string, sandbox: ProcStat[]): string {
  const processes = sandbox.map((stat) => `${stat.comm}, PID ${stat.pid}`).join('; ');
  return (
    `only the pod's sandbox ${sandbox.length === 1 ? 'process is' : 'processes are'} left in cgroup "${cgroup}" (${processes}): ` +
    "the engine's container exited and is not running now (crashing and waiting to be restarted: CrashLoopBackOff?), so nothing computes, on a GPU or on the CPU. " +
    "See why with `kubectl describe pod` (the container's Last State, exit code and restart count) and `kubectl logs --previous`; " +
    'the verdict changes by itself once the engine runs again'
  );
}

/**
 * A cgroup shard is alive while a process of its cgroup runs that is not the pod's sandbox. A member
 * the snapshot holds no answer for (a hand-made snapshot) counts as running. One whose stat could
 * not be read may be the engine: when nothing else runs, whether the shard does is unverified. When
 * every other member that has not exited is stopped, the shard is stopped; one running member, the
 * pod's sandbox aside, keeps it alive, since /proc cannot tell which process of a pod serves.
 */
function cgroupShardLiveness(snapshot: NodeSnapshot, cgroup: string): Liveness {
  if (snapshot.cgroupScanFailed !== undefined) {
    return {
      state: 'unreadable',
      why:
        `which processes are in cgroup "${cgroup}" could not be read in this refresh: ${snapshot.cgroupScanFailed}. ` +
        'Whether it still runs, and where it computes, is unverified, so it keeps serving. Run `nodecompute doctor` on this node; the next refresh reads them again.',
    };
  }
  const members = snapshot.cgroupPids.get(cgroup);
  if (!members) return { state: 'unknown' };
  if (members.size === 0) return { state: 'gone', why: `no process is left in cgroup "${cgroup}"` };
  const sandbox: ProcStat[] = [];
  const stopped: ProcStat[] = [];
  const zombies: number[] = [];
  let unreadable: UnreadableStat | undefined;
  let running = false;
  // Known only when every member's stat is. A stopped member is of the current run as much as a running one.
  let oldestStart: number | undefined = Infinity;
  for (const pid of members) {
    const answer = snapshot.proc.get(pid);
    if (answer === null) continue;
    if (answer === undefined) {
      running = true;
      oldestStart = undefined;
    } else if ('unreadable' in answer) {
      unreadable ??= answer;
      oldestStart = undefined;
    } else if (hasExited(answer)) zombies.push(pid);
    else if (SANDBOX_COMMS.has(answer.comm)) sandbox.push(answer);
    else {
      if (isStopped(answer)) stopped.push(answer);
      else running = true;
      if (oldestStart !== undefined) oldestStart = Math.min(oldestStart, answer.startTime);
    }
  }
  if (running) return oldestStart === undefined ? { state: 'alive' } : { state: 'alive', oldestStart };
  if (unreadable !== undefined) return { state: 'unreadable', why: unreadableWhy(unreadable) };
  if (stopped.length > 0) return { state: 'stopped', why: stoppedWhy(stopped, { kind: 'cgroup', cgroup }) };
  if (sandbox.length > 0) return { state: 'gone', why: sandboxWhy(cgroup, sandbox) };
  if (zombies.length > 0) {
    const what = zombies.length === 1 ? `its last process ${zombies[0]} has exited (a zombie` : `its last processes ${zombies.join(' ')} have exited (zombies`;
    return { state: 'gone', why: `no process is left running in cgroup "${cgroup}": ${what} not reaped yet)` };
  }
  return { state: 'gone', why: `no process is left in cgroup "${cgroup}"` };
}

/**
 * The process group a PID shard's processes are in: its current one while its process is there (it
 * may have called setpgid since registration; a zombie still says), else the one it registered with.
 */
function groupOf(snapshot: NodeSnapshot, shard: ShardRecord): number {
  const stat = statOf(snapshot, shard.identity.pid);
  return stat !== undefined && stat.startTime === shard.identity.startTime ? stat.pgrp : shard.identity.pgid;
}

/**
 * Who claims a GPU process, built once per attribution so that each process costs a few map lookups
 * whatever the number of shards: `strong` holds every PID a shard *is* (its PID, or a member of its
 * cgroup), first id first; `byGroup` the one live shard process a process group belongs to (with its
 * start time: members older than it are not its), or null when no single one does (two processes
 * claim it, or a gone shard does).
 */
interface Claims {
  strong: Map<number, string>;
  byGroup: Map<number, { pid: number; shard: string; startTime: number } | null>;
}

function addClaims(claims: Claims, snapshot: NodeSnapshot, shard: ShardRecord, liveness: Liveness): void {
  if (shard.cgroup !== null) {
    if (liveness.state === 'gone') return;
    for (const pid of snapshot.cgroupPids.get(shard.cgroup) ?? []) {
      if (!claims.strong.has(pid)) claims.strong.set(pid, shard.id);
    }
    return;
  }
  // A process of an earlier boot claims nothing, and leaves its group number to this boot's processes.
  if (ranInAnotherBoot(shard.identity, snapshot.bootId)) return;
  const group = groupOf(snapshot, shard);
  // A gone shard claims nothing: its PID may now be someone else's, and memory its orphans still
  // hold is, for placement, as unavailable as anybody else's. It still contests its group, so that
  // its orphans do not pass to another shard in the same group, unless the number names another
  // group now.
  if (liveness.state === 'gone') {
    if (!groupNumberReused(snapshot, group, shard)) claims.byGroup.set(group, null);
    return;
  }
  const pid = shard.identity.pid;
  if (!claims.strong.has(pid)) claims.strong.set(pid, shard.id);
  const held = claims.byGroup.get(group);
  if (held === undefined) claims.byGroup.set(group, { pid, shard: shard.id, startTime: shard.identity.startTime });
  else if (held !== null && held.pid !== pid) claims.byGroup.set(group, null);
}

/** The shard whose process is the nearest of `pid`'s first ANCESTRY_DEPTH ancestors the snapshot can name. */
function shardAncestor(pid: number, snapshot: NodeSnapshot, strong: ReadonlyMap<number, string>): string | undefined {
  let stat = statOf(snapshot, pid);
  for (let generation = 1; generation <= ANCESTRY_DEPTH && stat !== undefined; generation += 1) {
    const owner = strong.get(stat.ppid);
    if (owner !== undefined) return owner;
    stat = statOf(snapshot, stat.ppid);
  }
  return undefined;
}

/**
 * The first unreadable stat on `pid`'s way up, if one stopped the walk: its own and those of its
 * first ANCESTRY_DEPTH - 1 ancestors, whose ppids name the ancestors shardAncestor looks at (the
 * last one's stat names no one it looks at, and cannot change the owner).
 */
function unreadableOnTheWay(pid: number, snapshot: NodeSnapshot): UnreadableStat | undefined {
  let answer = snapshot.proc.get(pid);
  for (let generation = 0; generation < ANCESTRY_DEPTH && answer != null; generation += 1) {
    if (!isReadable(answer)) return answer;
    answer = snapshot.proc.get(answer.ppid);
  }
  return undefined;
}

/**
 * Whether the process group number a gone shard was in names another group now. Linux frees a
 * group's number only once no process is in it: a leader younger than the shard means the number
 * was given to a new group, whose processes are not this shard's orphans.
 */
function groupNumberReused(snapshot: NodeSnapshot, group: number, shard: ShardRecord): boolean {
  const leader = statOf(snapshot, group);
  return leader !== undefined && leader.startTime > shard.identity.startTime;
}

/** The owner of a GPU process by the three rules of the header, in their order. */
function ownerOf(pid: number, snapshot: NodeSnapshot, claims: Claims): string | undefined {
  const strong = claims.strong.get(pid);
  if (strong !== undefined) return strong;
  const ancestor = shardAncestor(pid, snapshot, claims.strong);
  if (ancestor !== undefined) return ancestor;
  const stat = statOf(snapshot, pid);
  if (stat === undefined) return undefined;
  const claim = claims.byGroup.get(stat.pgrp);
  return claim != null && stat.startTime >= claim.startTime ? claim.shard : undefined;
}

// Orphans listed one by one in a reason; the rest are counted.
const ORPHANS_LISTED = 5;

function memoryOf(process: GpuProcess): string {
  const amount = process.usedMiB === null ? 'memory nvidia-smi does not report ([N/A])' : `${process.usedMiB} MiB`;
  return `${amount} on GPU ${process.gpuIndex} (PID ${process.pid}, ${process.name})`;
}

/**
 * The reason of a gone PID shard, extended with the GPU memory its process group still holds: GPU
 * processes of its group that no shard owns (an engine child left behind by its leader). The advice
 * names PIDs, not the group: a script may have started other shards in the same group.
 */
function withOrphans(why: string, shard: ShardRecord, snapshot: NodeSnapshot, ownerByPid: ReadonlyMap<number, string>): string {
  const group = groupOf(snapshot, shard);
  if (groupNumberReused(snapshot, group, shard)) return why;
  const orphanOf = (pid: number) => {
    const stat = statOf(snapshot, pid);
    // Its children started after it; an older member of a shared group is not one of them.
    return stat !== undefined && stat.pgrp === group && stat.startTime >= shard.identity.startTime;
  };
  const orphans = snapshot.gpus.flatMap((gpu) =>
    gpu.processes.filter((process) => process.pid !== shard.identity.pid && !ownerByPid.has(process.pid) && orphanOf(process.pid)),
  );
  if (orphans.length === 0) return why;
  const listed = orphans.slice(0, ORPHANS_LISTED).map(memoryOf).join(', ');
  const more = orphans.length > ORPHANS_LISTED ? `, and ${orphans.length - ORPHANS_LISTED} more` : '';
  const pids = [...new Set(orphans.map((process) => process.pid))].join(' ');
  return (
    `${why}, but its process group ${group} still holds GPU memory: ${listed}${more}. ` +
    `That memory is not free for placement and reads as foreign until it is released: if the shard is not coming back, kill ${pids}`
  );
}

export function attribute(snapshot: NodeSnapshot, shards: readonly ShardRecord[]): Attribution {
  // Ids are unique, so the order is total.
  const ordered = [...shards].sort((a, b) => (a.id < b.id ? -1 : 1));
  const liveness = new Map<string, Liveness>();
  const claims: Claims = { strong: new Map(), byGroup: new Map() };
  for (const shard of ordered) {
    const state = shard.cgroup !== null ? cgroupShardLiveness(snapshot, shard.cgroup) : pidShardLiveness(snapshot, shard);
    liveness.set(shard.id, state);
    addClaims(claims, snapshot, shard, state);
  }
  const ownerByPid = new Map<number, string>();
  const uncertain = new Map<number, UnreadableStat>();
  const holdings = new Map<string, Map<number, ShardGpuHolding>>(ordered.map((shard) => [shard.id, new Map()]));
  for (const gpu of snapshot.gpus) {
    for (const process of gpu.processes) {
      const owner = ownerOf(process.pid, snapshot, claims);
      if (owner === undefined) {
        const blocked = unreadableOnTheWay(process.pid, snapshot);
        if (blocked !== undefined && !uncertain.has(gpu.index)) uncertain.set(gpu.index, blocked);
        continue;
      }
      ownerByPid.set(process.pid, owner);
      const perGpu = holdings.get(owner)!;
      const holding = perGpu.get(gpu.index) ?? { index: gpu.index, uuid: gpu.uuid, usedMiB: 0, processes: [] };
      holding.usedMiB = holding.usedMiB === null || process.usedMiB === null ? null : holding.usedMiB + process.usedMiB;
      holding.processes.push(process);
      perGpu.set(gpu.index, holding);
    }
  }
  for (const shard of ordered) {
    const state = liveness.get(shard.id)!;
    if (state.state === 'gone' && shard.cgroup === null && !ranInAnotherBoot(shard.identity, snapshot.bootId)) {
      liveness.set(shard.id, { state: 'gone', why: withOrphans(state.why, shard, snapshot, ownerByPid) });
    }
    if (state.state === 'alive') {
      const holders = stoppedGpuHolders(holdings.get(shard.id)!, (pid) => statOf(snapshot, pid));
      if (holders !== null) liveness.set(shard.id, { state: 'stopped', why: stoppedWhy(holders.stopped, { kind: 'gpu-holders', gpusOf: holders.gpusOf }) });
    }
  }
  return { ownerByPid, uncertain, holdings, liveness };
}
