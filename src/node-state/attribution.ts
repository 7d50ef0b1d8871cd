// Owns which registered shard each GPU process belongs to, and whether each shard's process still
// runs, once per snapshot and registry version. A GPU process is the shard's it is (its PID or a
// cgroup member), else its nearest shard ancestor's, else that of the one shard process claiming its
// process group, if it started no earlier than that process. Shards go in id order and the first
// claim stands. What no shard owns reads as foreign: used memory that placement never hands out.
import { ranInAnotherBoot, type ShardRecord } from '../shards/shard.js';
import { hasExited, isReadable, type ProcStat, type StatAnswer, type UnreadableStat } from '../system/procfs.js';
import { ANCESTRY_DEPTH, statOf, type GpuProcess, type NodeSnapshot } from './node-snapshot.js';

/** `usedMiB`: the sum of its processes' memory there; null when one of them is [N/A]. */
export type ShardGpuHolding = { index: number; uuid: string; usedMiB: number | null; processes: GpuProcess[] };

/** The SM utilization (%) of a shard's processes on one GPU, summed; null unless NVML gave each a figure. */
export function smUtilOf(processes: ReadonlyArray<Pick<GpuProcess, 'smUtilPct'>>): number | null {
  const figures = processes.map((process) => process.smUtilPct ?? null);
  return figures.includes(null) ? null : (figures as number[]).reduce((sum, pct) => sum + pct, 0);
}

// Stopped (SIGSTOP, a tracer) and unreadable shards keep their claims and memory; unknown: registered
// after the snapshot was taken. `oldestStart` (cgroup shards, clock ticks): its oldest live member's
// start, when every member was read.
export type Liveness =
  | { state: 'alive'; oldestStart?: number }
  | { state: 'gone' | 'stopped' | 'unreadable'; why: string }
  | { state: 'unknown' };

export interface Attribution {
  /** The shard that owns a GPU process, by PID; absent when foreign. */
  ownerByPid: ReadonlyMap<number, string>;
  /** Per GPU index, an unreadable stat on the way from an unowned process to a shard: that memory may be a shard's. */
  uncertain: ReadonlyMap<number, UnreadableStat>;
  /** Per shard, per GPU index it holds memory on. */
  holdings: ReadonlyMap<string, ReadonlyMap<number, ShardGpuHolding>>;
  liveness: ReadonlyMap<string, Liveness>;
}

const unreadableWhy = (stat: UnreadableStat): string =>
  `the /proc stat of its process ${stat.pid} could not be read in this refresh: ${stat.unreadable}. It is unverified, so it keeps serving. ${stat.advice}`;

/** Stopped by a signal (T) or by a tracer (t). */
const isStopped = (stat: ProcStat): boolean => stat.state === 'T' || stat.state === 't';

/** The first five of a reason's processes, one by one; the rest are counted. */
const firstFive = (items: readonly string[]): string => `${items.slice(0, 5).join(', ')}${items.length > 5 ? `, and ${items.length - 5} more` : ''}`;

const STOP_MEANING = {
  T: 'state T: it was sent SIGSTOP, SIGTSTP (Ctrl-Z in its terminal) or SIGTTIN (reading its terminal in the background)',
  t: 'state t: a debugger such as gdb, or another tracer, halted it',
} as const;

const capitalised = (text: string): string => `${text.charAt(0).toUpperCase()}${text.slice(1)}`;

/** What is stopped: a PID shard's process, a whole cgroup, or the GPU holders of a shard that otherwise runs. */
type StoppedSubject = { kind: 'process' } | { kind: 'cgroup'; cgroup: string }
  | { kind: 'gpu-holders'; gpusOf: ReadonlyMap<number, ReadonlySet<number>> };

/** Which processes are stopped and what resumes each kind (SIGCONT does not resume a traced process). */
function stoppedWhy(stopped: readonly ProcStat[], subject: StoppedSubject): string {
  const byPid = [...stopped].sort((a, b) => a.pid - b.pid);
  const signalled = byPid.filter((stat) => stat.state === 'T').map((stat) => stat.pid);
  const traced = byPid.filter((stat) => stat.state === 't').map((stat) => stat.pid);
  const meaning = [signalled.length > 0 ? STOP_MEANING.T : null, traced.length > 0 ? STOP_MEANING.t : null].filter((line) => line !== null).join('; ');
  const listed = (describe: (stat: ProcStat) => string) => firstFive(byPid.map(describe));
  let what: string;
  if (subject.kind === 'process') {
    const [stat] = byPid as [ProcStat];
    what = `process ${stat.pid} (${stat.comm}) is stopped (${meaning})`;
  } else if (subject.kind === 'cgroup') {
    what = `every process of cgroup "${subject.cgroup}" that has not exited, the pod's sandbox aside, is stopped: ${listed((stat) => `${stat.pid} (${stat.comm}, state ${stat.state})`)}. ${capitalised(meaning)}`;
  } else {
    const gpus = (pid: number) => [...subject.gpusOf.get(pid)!].map((index) => `GPU ${index}`).join(', ');
    const workers = listed((stat) => `${stat.pid} (${stat.comm}, state ${stat.state}, on ${gpus(stat.pid)})`);
    what = `a process holding its GPU memory is stopped while the rest runs: ${workers}. A stopped worker stalls every request. ${capitalised(meaning)}`;
  }
  const toDo: string[] = [];
  if (signalled.length > 0) {
    const resume = `\`kill -CONT ${signalled.join(' ')}\``;
    toDo.push(subject.kind === 'process' ? `resume it with ${resume}, or \`fg\` in that terminal` : `resume those in state T with ${resume} on the node (host PIDs)`);
  }
  if (traced.length > 0) {
    const which = subject.kind === 'process' ? 'let it' : `let those in state t (${traced.join(' ')})`;
    toDo.push(`${which} continue in the debugger, or detach it (gdb: \`detach\`): \`kill -CONT\` does not resume a traced process`);
  }
  const hangs = 'It keeps its GPU memory but answers no request: traffic to it hangs.';
  return `${what}. ${hangs} ${capitalised(toDo.join('; '))}. The verdict changes by itself once it runs again`;
}

/** Stopped when a process holding the shard's GPU memory is, whatever the rest of it does; null when none is. */
function stoppedGpuHolders(holdings: ReadonlyMap<number, ShardGpuHolding>, statNow: (pid: number) => ProcStat | null | undefined): Liveness | null {
  const gpusOf = new Map<number, Set<number>>();
  const stopped = new Map<number, ProcStat>();
  for (const holding of holdings.values()) {
    for (const { pid } of holding.processes) {
      const stat = statNow(pid);
      if (!stat || !isStopped(stat)) continue;
      stopped.set(pid, stat);
      gpusOf.set(pid, (gpusOf.get(pid) ?? new Set()).add(holding.index));
    }
  }
  if (stopped.size === 0) return null;
  return { state: 'stopped', why: stoppedWhy([...stopped.values()], { kind: 'gpu-holders', gpusOf }) };
}

/** A process of `listed` in `procNow`: its stat while the same process runs; null once it has exited; undefined: not known. */
export function sameProcessNow(listed: NodeSnapshot, procNow: ReadonlyMap<number, StatAnswer>, pid: number): ProcStat | null | undefined {
  const now = procNow.get(pid);
  if (now === null) return null;
  const then = statOf(listed, pid);
  if (!isReadable(now) || then === undefined) return undefined;
  return now.startTime === then.startTime && !hasExited(now) ? now : null;
}

/** While nvidia-smi cannot be asked: stopped when a process holding its memory in `listed` (the last good listing) is now. */
export function stoppedSinceListing(
  listed: NodeSnapshot,
  holdings: ReadonlyMap<number, ShardGpuHolding> | undefined,
  procNow: ReadonlyMap<number, StatAnswer>,
): Liveness | null {
  return holdings === undefined ? null : stoppedGpuHolders(holdings, (pid) => sameProcessNow(listed, procNow, pid));
}

/** A PID shard's liveness by its own stat (undefined: not read) in boot `bootId`; also used by probes. */
export function pidLiveness(shard: ShardRecord, stat: StatAnswer | undefined, bootId: string | null): Liveness {
  const pid = shard.identity.pid;
  if (ranInAnotherBoot(shard.identity, bootId)) {
    const reboot = `the node has restarted since it was registered (boot ${shard.identity.bootId}, now ${bootId})`;
    const ended = `process ${pid} ended with that boot, and a process running as PID ${pid} now is another one, not this shard's`;
    const fix = `Register the engine's new process (PUT /shards/${shard.id}), or remove the shard (DELETE /shards/${shard.id})`;
    return { state: 'gone', why: `${reboot}: ${ended}. ${fix}` };
  }
  if (stat === undefined) return { state: 'unknown' };
  if (stat === null) return { state: 'gone', why: `process ${pid} no longer exists` };
  if ('unreadable' in stat) return { state: 'unreadable', why: unreadableWhy(stat) };
  if (hasExited(stat)) return { state: 'gone', why: `process ${pid} has exited (a zombie its parent has not reaped yet)` };
  if (stat.startTime !== shard.identity.startTime) {
    const other = `${stat.comm}, started at tick ${stat.startTime}, not ${shard.identity.startTime}`;
    return { state: 'gone', why: `PID ${pid} now belongs to another process (${other}): the registered process exited and its PID was reused` };
  }
  if (isStopped(stat)) return { state: 'stopped', why: stoppedWhy([stat], { kind: 'process' }) };
  return { state: 'alive' };
}

/** A pod's processes that never compute: the sandbox (`pause`) and CRI-O's monitor (`conmon`). */
export const SANDBOX_COMMS: ReadonlySet<string> = new Set(['pause', 'conmon']);

function sandboxWhy(cgroup: string, sandbox: ProcStat[]): string {
  const processes = sandbox.map((stat) => `${stat.comm}, PID ${stat.pid}`).join('; ');
  const left = `only the pod's sandbox ${sandbox.length === 1 ? 'process is' : 'processes are'} left in cgroup "${cgroup}" (${processes})`;
  const why = "See why with `kubectl describe pod` (Last State, exit code) and `kubectl logs --previous`; the verdict changes by itself once it runs again";
  return `${left}: the engine's container exited (CrashLoopBackOff?), so nothing computes. ${why}`;
}

/** Alive while a member other than the sandbox runs (or was not read); else unreadable, stopped, gone, in that order. */
function cgroupShardLiveness(snapshot: NodeSnapshot, cgroup: string): Liveness {
  if (snapshot.cgroupScanFailed !== undefined) {
    const unread = `which processes are in cgroup "${cgroup}" could not be read in this refresh: ${snapshot.cgroupScanFailed}`;
    return { state: 'unreadable', why: `${unread}. It is unverified, so it keeps serving. Run \`nodecompute doctor\` on this node.` };
  }
  const members = snapshot.cgroupPids.get(cgroup);
  if (!members) return { state: 'unknown' };
  const sandbox: ProcStat[] = [];
  const stopped: ProcStat[] = [];
  const zombies: number[] = [];
  let unreadable: UnreadableStat | undefined;
  let running = false;
  // Known only when every member's stat is; a stopped member counts.
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

/** A PID shard's process group: its process's current one while it is there, else the registered one. */
function groupOf(snapshot: NodeSnapshot, shard: ShardRecord): number {
  const stat = statOf(snapshot, shard.identity.pid);
  return stat !== undefined && stat.startTime === shard.identity.startTime ? stat.pgrp : shard.identity.pgid;
}

/** `strong`: every PID a shard is; `byGroup`: the one shard process claiming a group, null when contested. */
interface Claims {
  strong: Map<number, string>;
  byGroup: Map<number, { pid: number; shard: string; startTime: number } | null>;
}

function addClaims(claims: Claims, snapshot: NodeSnapshot, shard: ShardRecord, liveness: Liveness): void {
  if (shard.cgroup !== null) {
    if (liveness.state === 'gone') return;
    for (const pid of snapshot.cgroupPids.get(shard.cgroup) ?? []) if (!claims.strong.has(pid)) claims.strong.set(pid, shard.id);
    return;
  }
  // A process of an earlier boot claims nothing, and leaves its group number to this boot's processes.
  if (ranInAnotherBoot(shard.identity, snapshot.bootId)) return;
  const group = groupOf(snapshot, shard);
  // A gone shard claims nothing, but contests its group so its orphans do not pass to another shard
  // (unless the number names another group now).
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

/** The shard of the nearest of `pid`'s first ANCESTRY_DEPTH ancestors; or the unreadable stat that ends the walk first. */
function shardAncestor(pid: number, snapshot: NodeSnapshot, strong: ReadonlyMap<number, string>): { owner?: string; blocked?: UnreadableStat } {
  let answer = snapshot.proc.get(pid);
  for (let generation = 1; generation <= ANCESTRY_DEPTH && answer != null; generation += 1) {
    if (!isReadable(answer)) return { blocked: answer };
    const owner = strong.get(answer.ppid);
    if (owner !== undefined) return { owner };
    answer = snapshot.proc.get(answer.ppid);
  }
  return {};
}

/** Whether a gone shard's group number names a newer group now (its leader is younger than the shard). */
function groupNumberReused(snapshot: NodeSnapshot, group: number, shard: ShardRecord): boolean {
  const leader = statOf(snapshot, group);
  return leader !== undefined && leader.startTime > shard.identity.startTime;
}

/** The owner of a GPU process by the three rules of the header, in their order; else what blocked the ancestor walk. */
function ownerOf(pid: number, snapshot: NodeSnapshot, claims: Claims): { owner?: string; blocked?: UnreadableStat } {
  const strong = claims.strong.get(pid);
  if (strong !== undefined) return { owner: strong };
  const ancestor = shardAncestor(pid, snapshot, claims.strong);
  if (ancestor.owner !== undefined) return ancestor;
  const stat = statOf(snapshot, pid);
  const claim = stat === undefined ? undefined : claims.byGroup.get(stat.pgrp);
  return claim != null && stat!.startTime >= claim.startTime ? { owner: claim.shard } : ancestor;
}

function memoryOf(process: GpuProcess): string {
  const amount = process.usedMiB === null ? 'memory the GPU driver does not report ([N/A])' : `${process.usedMiB} MiB`;
  return `${amount} on GPU ${process.gpuIndex} (PID ${process.pid}, ${process.name})`;
}

/** A gone PID shard's reason, plus the GPU memory unowned processes of its group still hold (PIDs to kill). */
function withOrphans(why: string, shard: ShardRecord, snapshot: NodeSnapshot, ownerByPid: ReadonlyMap<number, string>): string {
  const group = groupOf(snapshot, shard);
  if (groupNumberReused(snapshot, group, shard)) return why;
  const orphanOf = (pid: number) => {
    const stat = statOf(snapshot, pid);
    // An older member of a shared group is not one of its children.
    return stat !== undefined && stat.pgrp === group && stat.startTime >= shard.identity.startTime;
  };
  const orphans = snapshot.gpus.flatMap((gpu) =>
    gpu.processes.filter((process) => process.pid !== shard.identity.pid && !ownerByPid.has(process.pid) && orphanOf(process.pid)),
  );
  if (orphans.length === 0) return why;
  const pids = [...new Set(orphans.map((process) => process.pid))].join(' ');
  const fix = `That memory reads as foreign and is not placed until it is released: if the shard is not coming back, kill ${pids}`;
  return `${why}, but its process group ${group} still holds GPU memory: ${firstFive(orphans.map(memoryOf))}. ${fix}`;
}

export function attribute(snapshot: NodeSnapshot, shards: readonly ShardRecord[]): Attribution {
  const ordered = [...shards].sort((a, b) => (a.id < b.id ? -1 : 1));
  const liveness = new Map<string, Liveness>();
  const claims: Claims = { strong: new Map(), byGroup: new Map() };
  for (const shard of ordered) {
    const own = snapshot.proc.get(shard.identity.pid);
    const state = shard.cgroup !== null ? cgroupShardLiveness(snapshot, shard.cgroup) : pidLiveness(shard, own, snapshot.bootId);
    liveness.set(shard.id, state);
    addClaims(claims, snapshot, shard, state);
  }
  const ownerByPid = new Map<number, string>();
  const uncertain = new Map<number, UnreadableStat>();
  const holdings = new Map<string, Map<number, ShardGpuHolding>>(ordered.map((shard) => [shard.id, new Map()]));
  for (const gpu of snapshot.gpus) {
    for (const process of gpu.processes) {
      const { owner, blocked } = ownerOf(process.pid, snapshot, claims);
      if (owner === undefined) {
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
    const stopped = state.state === 'alive' ? stoppedGpuHolders(holdings.get(shard.id)!, (pid) => statOf(snapshot, pid)) : null;
    if (stopped !== null) liveness.set(shard.id, stopped);
  }
  return { ownerByPid, uncertain, holdings, liveness };
}
