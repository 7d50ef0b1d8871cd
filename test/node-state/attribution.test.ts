// attribute() against its rule, stated plainly: a GPU process belongs to the first shard (in id
// order) that *is* it (its PID, or its cgroup holds it); failing that, to the first shard that is its
// nearest ancestor (ppid after ppid through the stats the snapshot has, ANCESTRY_DEPTH generations);
// failing that, to the first shard whose process group holds it when no other process claims the
// group (live shards by their current group, gone ones by their last known group, whatever their
// PID, while no process younger than them leads it: the number was reused) and it started no
// earlier than that shard's process. A shard that is gone claims nothing, and its reason names the memory its group still holds;
// a cgroup shard is gone once no member runs but the pod's sandbox (`pause`). A shard whose process
// is stopped (T or t; for a cgroup, every member but the sandbox and zombies), or that runs but for a
// stopped process holding its GPU memory, is stopped, and claims as a live one does: a stopped
// process keeps its memory. A PID shard registered
// in an earlier boot of the node is gone and claims, contests and orphans nothing: its PID and group
// number are this boot's now.
// The rule is written below as the obvious loop over every shard for every process; attribute() must
// agree with it on thousands of generated nodes where PIDs, parents, groups and cgroups collide far
// more often than on a real node.
import fc from 'fast-check';
import t from 'tap';
import { attribute, type Liveness } from '../../src/node-state/attribution.js';
import { ANCESTRY_DEPTH, type GpuState, type NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcStat, StatAnswer } from '../../src/system/procfs.js';
import { gpuState } from '../helpers/gpu-state.js';
import { handMadeView, shardRecord } from '../helpers/hand-made-view.js';

const SEED = 20_261_130;
// A small PID space, so that shard PIDs, parents, groups, GPU processes and cgroup members overlap;
// most processes exist and are alive, so that most shards are too.
const pid = fc.integer({ min: 1, max: 12 });
const group = fc.integer({ min: 1, max: 4 });
const mostly = (value: boolean) => fc.oneof({ weight: 9, arbitrary: fc.constant(value) }, { weight: 1, arbitrary: fc.constant(!value) });
// Shards' processes start at tick 1: a process at 2 is younger than them (a PID reused, or a child), one at 0 older.
const startTime = fc.oneof({ weight: 8, arbitrary: fc.constant(1) }, { weight: 1, arbitrary: fc.constant(2) }, { weight: 1, arbitrary: fc.constant(0) });
const state = fc.oneof(
  { weight: 14, arbitrary: fc.constant('S') },
  { weight: 2, arbitrary: fc.constant('Z') },
  { weight: 1, arbitrary: fc.constant('T') },
  { weight: 1, arbitrary: fc.constant('t') },
);
// A third of the processes have no parent in the snapshot's PID space (0), so that chains end and the group rule gets its turn.
const parent = fc.oneof({ weight: 1, arbitrary: fc.constant(0) }, { weight: 2, arbitrary: pid });

/** A stat the snapshot read; undefined when absent, gone or unreadable. */
function readable(snapshot: NodeSnapshot, of: number): ProcStat | undefined {
  const answer = snapshot.proc.get(of);
  return answer === null || answer === undefined || 'unreadable' in answer ? undefined : answer;
}

function byId(shards: readonly ShardRecord[]): ShardRecord[] {
  return [...shards].sort((a, b) => (a.id < b.id ? -1 : 1));
}

/** Whether a PID shard's process ran in an earlier boot than the snapshot's (both known, and not the same). */
function earlierBoot(snapshot: NodeSnapshot, shard: ShardRecord): boolean {
  return shard.cgroup === null && shard.identity.bootId !== undefined && snapshot.bootId !== null && shard.identity.bootId !== snapshot.bootId;
}

/** Whether a PID shard's group number is led by a process younger than the shard: another group has it now. */
function groupReused(snapshot: NodeSnapshot, shard: ShardRecord): boolean {
  const leader = readable(snapshot, lastGroup(snapshot, shard));
  return leader !== undefined && leader.startTime > shard.identity.startTime;
}

/** A PID shard's group: its process's current one while that is still its process, else the registered one. */
function lastGroup(snapshot: NodeSnapshot, shard: ShardRecord): number {
  const stat = readable(snapshot, shard.identity.pid);
  return stat !== undefined && stat.startTime === shard.identity.startTime ? stat.pgrp : shard.identity.pgid;
}

/**
 * The rule's claimants of a process, each list in id order: the live shards it is; per ancestor
 * (nearest first), the live shards that ancestor is; and every PID shard whose group holds it: a gone
 * one only while its group's number is not led by a process younger than it (see groupReused).
 */
function ruleClaimants(snapshot: NodeSnapshot, shards: readonly ShardRecord[], liveness: ReadonlyMap<string, Liveness>, candidate: number) {
  const ordered = byId(shards);
  const live = ordered.filter((shard) => liveness.get(shard.id)?.state !== 'gone');
  const isIt = (shard: ShardRecord, process: number) =>
    shard.cgroup !== null ? (snapshot.cgroupPids.get(shard.cgroup)?.has(process) ?? false) : process === shard.identity.pid;
  const ancestors: number[] = [];
  for (let stat = readable(snapshot, candidate); stat !== undefined && ancestors.length < ANCESTRY_DEPTH; stat = readable(snapshot, stat.ppid)) {
    ancestors.push(stat.ppid);
  }
  const group = readable(snapshot, candidate)?.pgrp;
  return {
    isIt: live.filter((shard) => isIt(shard, candidate)),
    byAncestor: ancestors.map((ancestor) => live.filter((shard) => isIt(shard, ancestor))),
    inGroup: ordered.filter(
      (shard) =>
        shard.cgroup === null &&
        !earlierBoot(snapshot, shard) &&
        group !== undefined &&
        lastGroup(snapshot, shard) === group &&
        !(liveness.get(shard.id)?.state === 'gone' && groupReused(snapshot, shard)),
    ),
  };
}

/** Whether the group is claimed by one live process alone (several shards may be that one process). */
function soleGroupClaimant(inGroup: ShardRecord[], liveness: ReadonlyMap<string, Liveness>): boolean {
  const live = inGroup.filter((shard) => liveness.get(shard.id)?.state !== 'gone');
  return live.length === inGroup.length && new Set(live.map((shard) => shard.identity.pid)).size === 1;
}

/** Whether a group member started no earlier than the claimant's process, as its descendants and their orphans did. */
function startedSince(snapshot: NodeSnapshot, candidate: number, claimant: ShardRecord): boolean {
  return readable(snapshot, candidate)!.startTime >= claimant.identity.startTime;
}

/**
 * The rule: the first shard it is, else the first its nearest shard ancestor is, else the first of
 * its group's sole claimant, when it started no earlier than that claimant's process.
 */
function ruleOwner(snapshot: NodeSnapshot, shards: readonly ShardRecord[], liveness: ReadonlyMap<string, Liveness>, candidate: number): string | undefined {
  const { isIt, byAncestor, inGroup } = ruleClaimants(snapshot, shards, liveness, candidate);
  const nearest = byAncestor.find((claimants) => claimants.length > 0);
  if (isIt[0] ?? nearest?.[0]) return (isIt[0] ?? nearest![0]!).id;
  return soleGroupClaimant(inGroup, liveness) && startedSince(snapshot, candidate, inGroup[0]!) ? inGroup[0]!.id : undefined;
}

const isStopped = (state: string) => state === 'T' || state === 't';

/** A PID shard's liveness state from its stat: not read yet, gone (absent, zombie, reused), unreadable, stopped, or alive. */
function ruleLiveness(snapshot: NodeSnapshot, shard: ShardRecord): Liveness['state'] {
  if (earlierBoot(snapshot, shard)) return 'gone';
  if (!snapshot.proc.has(shard.identity.pid)) return 'unknown';
  const answer = snapshot.proc.get(shard.identity.pid)!;
  if (answer === null) return 'gone';
  if ('unreadable' in answer) return 'unreadable';
  if (answer.state === 'Z' || answer.state === 'X' || answer.startTime !== shard.identity.startTime) return 'gone';
  return isStopped(answer.state) ? 'stopped' : 'alive';
}

/**
 * A cgroup shard's liveness state: not scanned yet; alive while a member runs (is not stopped) that
 * is not the pod's sandbox (`pause`), or that the snapshot did not read; else unreadable when a
 * member's stat was; else stopped when a member other than the sandbox is and is no zombie; else
 * gone (every member gone, a zombie or the sandbox).
 */
function ruleCgroupLiveness(snapshot: NodeSnapshot, cgroup: string): Liveness['state'] {
  const members = snapshot.cgroupPids.get(cgroup);
  if (members === undefined) return 'unknown';
  const answers = [...members].map((member) => snapshot.proc.get(member));
  const engine = (answer: StatAnswer | undefined): answer is ProcStat =>
    answer != null && !('unreadable' in answer) && answer.state !== 'Z' && answer.state !== 'X' && answer.comm !== 'pause';
  if (answers.some((answer) => answer === undefined || (engine(answer) && !isStopped(answer.state)))) return 'alive';
  if (answers.some((answer) => answer != null && 'unreadable' in answer)) return 'unreadable';
  return answers.some((answer) => engine(answer) && isStopped(answer.state)) ? 'stopped' : 'gone';
}

/**
 * A shard the rules above find alive is stopped all the same when a GPU process it owns (by the
 * ownership rule, checked on its own below) is: a stopped worker stalls the engine.
 */
function withStoppedHolders(state: Liveness['state'], snapshot: NodeSnapshot, shard: ShardRecord, ownerByPid: ReadonlyMap<number, string>): Liveness['state'] {
  if (state !== 'alive') return state;
  const owned = snapshot.gpus.flatMap((gpu) => gpu.processes).filter((process) => ownerByPid.get(process.pid) === shard.id);
  return owned.some((process) => isStopped(readable(snapshot, process.pid)?.state ?? '')) ? 'stopped' : 'alive';
}

/**
 * A gone PID shard's orphans: GPU processes other than its own PID that no shard owns, in its group,
 * started no earlier than it; none when the group's number is led by a process younger than the
 * shard (the number was reused).
 */
function ruleOrphans(snapshot: NodeSnapshot, shard: ShardRecord, ownerByPid: ReadonlyMap<number, string>): number[] {
  if (earlierBoot(snapshot, shard) || groupReused(snapshot, shard)) return [];
  const group = lastGroup(snapshot, shard);
  return snapshot.gpus
    .flatMap((gpu) => gpu.processes.map((process) => process.pid))
    .filter((gpuPid) => {
      const stat = readable(snapshot, gpuPid);
      return gpuPid !== shard.identity.pid && !ownerByPid.has(gpuPid) && stat?.pgrp === group && stat.startTime >= shard.identity.startTime;
    });
}

const node = fc
  .record({
    // Per PID: absent from /proc (undefined), gone (null), unreadable this time, or a stat with a parent, a group and a state
    // (sleeping most often; a zombie, stopped by a signal or stopped by a tracer now and then).
    stats: fc.array(
      fc.oneof(
        { weight: 1, arbitrary: fc.constant('unreadable' as const) },
        { weight: 9, arbitrary: fc.option(fc.record({ ppid: parent, pgrp: group, state, sandbox: mostly(false), startTime }), { nil: null }) },
      ),
      { minLength: 12, maxLength: 12 },
    ),
    listed: fc.array(mostly(true), { minLength: 12, maxLength: 12 }),
    cgroups: fc.dictionary(fc.constantFrom('cg-a', 'cg-b'), fc.uniqueArray(pid, { maxLength: 4 })),
    gpus: fc.array(fc.array(fc.record({ pid, usedMiB: fc.option(fc.integer({ min: 0, max: 1000 }), { nil: null }) }), { maxLength: 6 }), {
      minLength: 1,
      maxLength: 3,
    }),
    shards: fc.uniqueArray(
      fc.record({
        id: fc.constantFrom('a', 'b', 'c', 'd', 'e'),
        pid,
        pgid: group,
        startTime: fc.constant(1),
        cgroup: fc.option(fc.constantFrom('cg-a', 'cg-b', 'cg-c'), { nil: null, freq: 2 }),
        // Registered in this boot, in an earlier one, or by a version that did not record it.
        bootId: fc.oneof(
          { weight: 6, arbitrary: fc.constant('boot-now') },
          { weight: 1, arbitrary: fc.constant('boot-before') },
          { weight: 2, arbitrary: fc.constant(undefined) },
        ),
      }),
      { selector: (shard) => shard.id, maxLength: 5 },
    ),
    // The snapshot's boot; null when /proc cannot say.
    bootId: fc.option(fc.constant('boot-now'), { nil: null, freq: 5 }),
  })
  .map(({ stats, listed, cgroups, gpus, shards, bootId }) => {
    const proc = new Map<number, StatAnswer>();
    stats.forEach((entry, i) => {
      const at = i + 1;
      if (!listed[i]) return;
      if (entry === 'unreadable') proc.set(at, { pid: at, unreadable: 'reading it failed (EIO)', advice: 'see the log' });
      else proc.set(at, entry === null ? null : { pid: at, comm: entry.sandbox ? 'pause' : `p${at}`, state: entry.state, ppid: entry.ppid, pgrp: entry.pgrp, session: 1, startTime: entry.startTime, cpuTicks: 0 });
    });
    const snapshot: NodeSnapshot = {
      takenAt: 1,
      gpus: gpus.map(
        (processes, index): GpuState => ({
          index,
          uuid: `GPU-${index}`,
          name: 'NVIDIA H200',
          totalMiB: 143771,
          usedMiB: 1,
          freeMiB: 1,
          reservedMiB: 0,
          migMode: 'Disabled',
          busId: null,
          utilizationPct: null,
          processes: processes.map((p) => ({ pid: p.pid, name: `p${p.pid}`, usedMiB: p.usedMiB, gpuIndex: index, gpuUuid: `GPU-${index}` })),
        }),
      ),
      proc,
      cgroupPids: new Map(Object.entries(cgroups).map(([cgroup, pids]) => [cgroup, new Set(pids)])),
      bootId,
      unmatchedProcesses: [],
      lostGpus: [],
      cpuCores: new Map(),
      modelFiles: new Map(),
      timings: { driverMs: 0, procMs: 0 },
    };
    const records = shards.map(
      (s): ShardRecord => ({
        id: s.id,
        pid: s.pid,
        cgroup: s.cgroup,
        gpus: [0],
        engine: 'other',
        graceMs: 1000,
        registeredAt: 0,
        identity: { pid: s.pid, pgid: s.pgid, startTime: s.startTime, name: 'engine', ...(s.bootId === undefined ? {} : { bootId: s.bootId }) },
      }),
    );
    return { snapshot, shards: records };
  });

/** Whether a gone PID shard's reason names exactly its orphans (and no other shard's reason names any). */
function reasonNamesOrphans(snapshot: NodeSnapshot, shard: ShardRecord, state: Liveness | undefined, ownerByPid: ReadonlyMap<number, string>): boolean {
  const orphans = shard.cgroup === null && state?.state === 'gone' ? [...new Set(ruleOrphans(snapshot, shard, ownerByPid))] : [];
  const why = state !== undefined && 'why' in state ? state.why : '';
  const killed = /still holds GPU memory: .*, kill ([\d ]+)$/.exec(why)?.[1]?.split(' ').map(Number) ?? [];
  return killed.join(' ') === orphans.join(' ');
}

t.test('every GPU process goes to the owner the rule names; holdings sum what each owner holds', async (t) => {
  const result = fc.check(
    fc.property(node, ({ snapshot, shards }) => {
      const { ownerByPid, holdings, liveness } = attribute(snapshot, shards);
      for (const shard of shards) {
        const rule = shard.cgroup === null ? ruleLiveness(snapshot, shard) : ruleCgroupLiveness(snapshot, shard.cgroup);
        if (liveness.get(shard.id)?.state !== withStoppedHolders(rule, snapshot, shard, ownerByPid)) return false;
        if (!reasonNamesOrphans(snapshot, shard, liveness.get(shard.id), ownerByPid)) return false;
      }
      const listed = snapshot.gpus.flatMap((gpu) => gpu.processes);
      for (const process of listed) {
        if (ownerByPid.get(process.pid) !== ruleOwner(snapshot, shards, liveness, process.pid)) return false;
      }
      if ([...ownerByPid.keys()].some((owned) => !listed.some((process) => process.pid === owned))) return false;
      for (const shard of shards) {
        for (const gpu of snapshot.gpus) {
          const mine = gpu.processes.filter((process) => ownerByPid.get(process.pid) === shard.id);
          const holding = holdings.get(shard.id)?.get(gpu.index);
          // A sum with an unreported ([N/A]) part is unknown: null, not the known part.
          const sum = mine.some((p) => p.usedMiB === null) ? null : mine.reduce((total, p) => total + p.usedMiB!, 0);
          if (mine.length === 0 ? holding !== undefined : holding?.usedMiB !== sum) return false;
          if (holding && holding.processes.length !== mine.length) return false;
        }
      }
      return true;
    }),
    { seed: SEED, numRuns: 5000 },
  );
  t.notOk(result.failed, fc.defaultReportMessage(result) ?? '5000 generated nodes attributed as the rule says');
});

t.test('the generator reaches every case the rule distinguishes', async (t) => {
  // Without these, the property above could pass on nodes too simple to tell a wrong attribute() apart.
  const seen = {
    byPid: 0,
    byCgroup: 0,
    byAncestor: 0,
    byGroup: 0,
    foreign: 0,
    gone: 0,
    unreadable: 0,
    // A PID shard, and a cgroup shard, whose processes are stopped: stopped, and owning what they hold.
    stoppedPid: 0,
    stoppedCgroup: 0,
    // A shard that runs but for a stopped process holding its GPU memory: stopped.
    stoppedGpuHolder: 0,
    ownedByStopped: 0,
    orphansNamed: 0,
    // A cgroup shard with members, none of them running but the pod's sandbox: gone.
    sandboxOnly: 0,
    // Contests, where the order of the rules decides.
    twoItIs: 0,
    itIsOverAncestor: 0,
    itIsOverGroup: 0,
    nearestOverFartherAncestor: 0,
    ancestorOverGroup: 0,
    groupOfTwoLive: 0,
    groupOfGoneAndLive: 0,
    groupOfOneProcessTwice: 0,
    // A member of a group one shard claims alone, started before that shard's process: not its.
    groupOlderMember: 0,
    // A PID shard of an earlier boot whose PID runs now with its start time: gone all the same.
    earlierBootCollision: 0,
    // A PID shard of a boot /proc cannot name now: judged by its PID and start time.
    bootUnknownNow: 0,
  };
  fc.assert(
    fc.property(node, ({ snapshot, shards }) => {
      const { ownerByPid, liveness } = attribute(snapshot, shards);
      for (const gpu of snapshot.gpus) {
        for (const { pid: candidate } of gpu.processes) {
          const owner = shards.find((shard) => shard.id === ownerByPid.get(candidate));
          const { isIt, byAncestor, inGroup } = ruleClaimants(snapshot, shards, liveness, candidate);
          const named = byAncestor.filter((claimants) => claimants.length > 0);
          if (owner !== undefined && liveness.get(owner.id)?.state === 'stopped') seen.ownedByStopped += 1;
          if (owner === undefined) seen.foreign += 1;
          else if (isIt.length > 0) seen[owner.cgroup !== null ? 'byCgroup' : 'byPid'] += 1;
          else if (named.length > 0) seen.byAncestor += 1;
          else seen.byGroup += 1;
          const isGone = (shard: ShardRecord) => liveness.get(shard.id)?.state === 'gone';
          if (isIt.length > 1) seen.twoItIs += 1;
          if (isIt.length > 0 && named.some((claimants) => claimants.some((shard) => !isIt.includes(shard)))) seen.itIsOverAncestor += 1;
          if (isIt.length > 0 && inGroup.some((shard) => !isIt.includes(shard) && !isGone(shard))) seen.itIsOverGroup += 1;
          if (isIt.length > 0) continue;
          if (named.slice(1).some((claimants) => claimants[0] !== named[0]![0])) seen.nearestOverFartherAncestor += 1;
          if (named.length > 0 && inGroup.some((shard) => shard !== named[0]![0])) seen.ancestorOverGroup += 1;
          if (named.length > 0) continue;
          if (new Set(inGroup.filter((shard) => !isGone(shard)).map((shard) => shard.identity.pid)).size > 1) seen.groupOfTwoLive += 1;
          if (inGroup.length > 1 && soleGroupClaimant(inGroup, liveness)) seen.groupOfOneProcessTwice += 1;
          if (inGroup.some(isGone) && inGroup.some((shard) => !isGone(shard))) seen.groupOfGoneAndLive += 1;
          if (soleGroupClaimant(inGroup, liveness) && !startedSince(snapshot, candidate, inGroup[0]!)) seen.groupOlderMember += 1;
        }
      }
      for (const shard of shards) {
        const stat = readable(snapshot, shard.identity.pid);
        if (earlierBoot(snapshot, shard) && stat?.startTime === shard.identity.startTime && stat.state === 'S') seen.earlierBootCollision += 1;
        if (shard.cgroup === null && shard.identity.bootId !== undefined && snapshot.bootId === null) seen.bootUnknownNow += 1;
      }
      for (const shard of shards) if (liveness.get(shard.id)?.state === 'stopped') seen[shard.cgroup === null ? 'stoppedPid' : 'stoppedCgroup'] += 1;
      const states = [...liveness.values()];
      seen.gone += states.filter((state) => state.state === 'gone').length;
      seen.unreadable += states.filter((state) => state.state === 'unreadable').length;
      seen.stoppedGpuHolder += states.filter((state) => state.state === 'stopped' && state.why.startsWith('a process holding its GPU memory')).length;
      seen.orphansNamed += states.filter((state) => state.state === 'gone' && state.why.includes('still holds GPU memory')).length;
      seen.sandboxOnly += states.filter((state) => state.state === 'gone' && state.why.includes("only the pod's sandbox")).length;
    }),
    { seed: SEED, numRuns: 5000 },
  );
  for (const [name, count] of Object.entries(seen)) t.ok(count > 50, `${name}: ${count}`);
});

t.test("a gone shard's group number, reused by a new group, is that group's: its processes are not contested", async (t) => {
  const now = 10_000_000;
  const stat = (pid: number, ppid: number, startTime: number, comm = 'python'): ProcStat => ({ pid, comm, state: 'S', ppid, pgrp: 500, session: 500, startTime, cpuTicks: 0 });
  // "old" was PID 500 leading group 500 (started at tick 5), exited and was never removed. PID 500 now
  // leads a new group 500 (a launcher, tick 900) whose ranks are siblings: rank 0 is registered, rank 1 holds GPU 1.
  const old = shardRecord(now, { id: 'old', pid: 500, identity: { pid: 500, pgid: 500, startTime: 5, name: 'llama-server' } });
  const rank0 = shardRecord(now, { id: 'rank0', pid: 600, gpus: [0, 1], identity: { pid: 600, pgid: 500, startTime: 901, name: 'python' } });
  const view = handMadeView({ now, gpus: [gpuState(0, [[600, 9000]]), gpuState(1, [[601, 9000]])], stats: [stat(500, 1, 900, 'torchrun'), stat(600, 500, 901), stat(601, 500, 901)] }, [old, rank0]);
  t.match(view.attribution.liveness.get('old'), { state: 'gone', why: /^PID 500 now belongs to another process/ });
  t.equal(view.attribution.ownerByPid.get(601), 'rank0', "rank 1 is in rank 0's group, which no live shard contests");
  t.same([...(view.attribution.holdings.get('rank0')?.keys() ?? [])].sort(), [0, 1]);
});
