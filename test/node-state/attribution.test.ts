// attribute() against its rule, stated plainly: a GPU process belongs to the first shard (in id
// order) that *is* it (its PID, or its cgroup holds it); failing that, to the first shard whose
// current process group holds it; a shard that is gone claims nothing. The rule is written below as
// the obvious loop over every shard for every process; attribute() must agree with it on thousands
// of generated nodes where PIDs, groups and cgroups collide far more often than on a real node.
import fc from 'fast-check';
import t from 'tap';
import { attribute, type Liveness } from '../../src/node-state/attribution.js';
import type { GpuState, NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcStat } from '../../src/system/procfs.js';

const SEED = 20_261_130;
// A small PID space, so that shard PIDs, groups, GPU processes and cgroup members overlap; most
// processes exist and are alive, so that most shards are too.
const pid = fc.integer({ min: 1, max: 12 });
const group = fc.integer({ min: 1, max: 4 });
const mostly = (value: boolean) => fc.oneof({ weight: 9, arbitrary: fc.constant(value) }, { weight: 1, arbitrary: fc.constant(!value) });
const startTime = fc.oneof({ weight: 9, arbitrary: fc.constant(1) }, { weight: 1, arbitrary: fc.constant(2) });

/** The rule's claimants of a process, each list in id order: the shards it is, and the shards whose group holds it. */
function ruleClaimants(snapshot: NodeSnapshot, shards: readonly ShardRecord[], liveness: ReadonlyMap<string, Liveness>, candidate: number) {
  const ordered = [...shards].sort((a, b) => (a.id < b.id ? -1 : 1)).filter((shard) => liveness.get(shard.id)?.state !== 'gone');
  const isIt = (shard: ShardRecord) =>
    shard.cgroup !== null ? (snapshot.cgroupPids.get(shard.cgroup)?.has(candidate) ?? false) : candidate === shard.identity.pid;
  const inGroup = (shard: ShardRecord) => {
    if (shard.cgroup !== null) return false;
    const group = snapshot.proc.get(shard.identity.pid)?.pgrp ?? shard.identity.pgid;
    return snapshot.proc.get(candidate)?.pgrp === group;
  };
  return { isIt: ordered.filter(isIt), inGroup: ordered.filter(inGroup) };
}

/** The rule: the first shard it is, else the first whose group holds it. */
function ruleOwner(snapshot: NodeSnapshot, shards: readonly ShardRecord[], liveness: ReadonlyMap<string, Liveness>, candidate: number): string | undefined {
  const { isIt, inGroup } = ruleClaimants(snapshot, shards, liveness, candidate);
  return (isIt[0] ?? inGroup[0])?.id;
}

const node = fc
  .record({
    // Per PID: absent from /proc (undefined), gone (null), or a stat with a group and a state.
    stats: fc.array(fc.option(fc.record({ pgrp: group, zombie: mostly(false), startTime }), { nil: null }), {
      minLength: 12,
      maxLength: 12,
    }),
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
        cgroup: fc.option(fc.constantFrom('cg-a', 'cg-b', 'cg-c'), { nil: null, freq: 4 }),
      }),
      { selector: (shard) => shard.id, maxLength: 5 },
    ),
  })
  .map(({ stats, listed, cgroups, gpus, shards }) => {
    const proc = new Map<number, ProcStat | null>();
    stats.forEach((entry, i) => {
      const at = i + 1;
      if (!listed[i]) return;
      proc.set(at, entry === null ? null : { pid: at, comm: `p${at}`, state: entry.zombie ? 'Z' : 'S', ppid: 1, pgrp: entry.pgrp, session: 1, startTime: entry.startTime });
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
          processes: processes.map((p) => ({ pid: p.pid, name: `p${p.pid}`, usedMiB: p.usedMiB, gpuIndex: index, gpuUuid: `GPU-${index}` })),
        }),
      ),
      proc,
      cgroupPids: new Map(Object.entries(cgroups).map(([cgroup, pids]) => [cgroup, new Set(pids)])),
      unmatchedProcesses: [],
      timings: { nvidiaSmiMs: 0, procMs: 0 },
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
        identity: { pid: s.pid, pgid: s.pgid, startTime: s.startTime, name: 'engine' },
      }),
    );
    return { snapshot, shards: records };
  });

t.test('every GPU process goes to the owner the rule names; holdings sum what each owner holds', async (t) => {
  const result = fc.check(
    fc.property(node, ({ snapshot, shards }) => {
      const { ownerByPid, holdings, liveness } = attribute(snapshot, shards);
      const listed = snapshot.gpus.flatMap((gpu) => gpu.processes);
      for (const process of listed) {
        if (ownerByPid.get(process.pid) !== ruleOwner(snapshot, shards, liveness, process.pid)) return false;
      }
      if ([...ownerByPid.keys()].some((owned) => !listed.some((process) => process.pid === owned))) return false;
      for (const shard of shards) {
        for (const gpu of snapshot.gpus) {
          const mine = gpu.processes.filter((process) => ownerByPid.get(process.pid) === shard.id);
          const holding = holdings.get(shard.id)?.get(gpu.index);
          if (mine.length === 0 ? holding !== undefined : holding?.usedMiB !== mine.reduce((sum, p) => sum + (p.usedMiB ?? 0), 0)) return false;
          if (holding && holding.processes.length !== mine.length) return false;
        }
      }
      return true;
    }),
    { seed: SEED, numRuns: 3000 },
  );
  t.notOk(result.failed, fc.defaultReportMessage(result) ?? '3000 generated nodes attributed as the rule says');
});

t.test('the generator reaches every case the rule distinguishes', async (t) => {
  // Without these, the property above could pass on nodes too simple to tell a wrong attribute() apart.
  const seen = { byPid: 0, byCgroup: 0, byGroup: 0, gone: 0, foreign: 0, twoItIs: 0, twoGroups: 0, itIsOverGroup: 0 };
  fc.assert(
    fc.property(node, ({ snapshot, shards }) => {
      const { ownerByPid, liveness } = attribute(snapshot, shards);
      for (const gpu of snapshot.gpus) {
        for (const { pid: candidate } of gpu.processes) {
          const owner = shards.find((shard) => shard.id === ownerByPid.get(candidate));
          if (owner === undefined) seen.foreign += 1;
          else if (owner.cgroup !== null) seen.byCgroup += 1;
          else if (owner.identity.pid === candidate) seen.byPid += 1;
          else seen.byGroup += 1;
          // Contests, where the order of the rule decides.
          const { isIt, inGroup } = ruleClaimants(snapshot, shards, liveness, candidate);
          if (isIt.length > 1) seen.twoItIs += 1;
          if (isIt.length === 0 && inGroup.length > 1) seen.twoGroups += 1;
          if (isIt.length > 0 && inGroup.some((shard) => !isIt.includes(shard))) seen.itIsOverGroup += 1;
        }
      }
      seen.gone += [...liveness.values()].filter((state) => state.state === 'gone').length;
    }),
    { seed: SEED, numRuns: 3000 },
  );
  for (const [name, count] of Object.entries(seen)) t.ok(count > 50, `${name}: ${count}`);
});
