// Taking one snapshot: both queries joined by GPU UUID, /proc read for GPU and shard PIDs and the
// parents between them, cgroups scanned only when a cgroup shard exists, and rows under unknown UUIDs
// set aside with a warning.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { attribute } from '../../src/node-state/attribution.js';
import { ANCESTRY_DEPTH, createSnapshotTaker, joinGpusAndProcesses, procFactsAfter, statOf } from '../../src/node-state/node-snapshot.js';
import { createNodeService, procOnlyLiveness } from '../../src/node-state/node-view.js';
import type { NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import { createSnapshotSource, type SnapshotSource } from '../../src/node-state/snapshot.js';
import type { Registry } from '../../src/shards/registry.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { GpuDriver } from '../../src/system/gpu-driver.js';
import type { ComputeAppRecord, GpuRecord } from '../../src/system/nvidia-smi.js';
import { createProcReader, type ProcReader } from '../../src/system/procfs.js';
import { captureLog } from '../helpers/log-capture.js';

const gpus: GpuRecord[] = [0, 1].map((index) => ({ index, uuid: `GPU-${index}`, name: 'NVIDIA H100 80GB HBM3', totalMiB: 81559, usedMiB: 100, freeMiB: 80000, reservedMiB: 479, migMode: 'Disabled', busId: `00000000:0${index + 1}:00.0`, utilizationPct: null }));

function smi(apps: ComputeAppRecord[]): GpuDriver {
  return {
    backend: 'nvidia-smi',
    source: 'stand-in',
    queryGpus: async () => ({ gpus, unreachable: [] }),
    queryComputeApps: async () => apps,
    queryVersion: async () => ({ smiVersion: null, driverVersion: null, cudaVersion: null }),
    killAll: () => undefined,
    running: 0,
    stopped: false,
  };
}

t.test('join: MIG rows under the parent UUID land on it; unknown UUIDs are set aside', async (t) => {
  const { gpus: joined, unmatched } = joinGpusAndProcesses(gpus, [
    { gpuUuid: 'GPU-1', pid: 5, name: 'a', usedMiB: 10 },
    { gpuUuid: 'GPU-1', pid: 6, name: 'b', usedMiB: null },
    { gpuUuid: 'MIG-9', pid: 7, name: 'c', usedMiB: 1 },
  ]);
  t.same(joined[0]!.processes, []);
  t.same(joined[1]!.processes.map((p) => [p.pid, p.gpuIndex, p.usedMiB]), [[5, 1, 10], [6, 1, null]]);
  t.same(unmatched.map((row) => row.pid), [7]);
});

t.test('take: /proc facts for GPU and shard PIDs, cgroup members, and a warning for unmatched rows', async (t) => {
  const root = t.testdir({
    '5': { stat: '5 (a) S 1 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 50 0 0', cgroup: '0::/kubepods/podabcdef12-3456/x\n' },
    '8': { stat: '8 (shard) S 1 8 8 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 80 0 0', cgroup: '0::/system.slice/x\n' },
  });
  const { log, lines } = captureLog('warn');
  let cgroups: string[] = [];
  const take = createSnapshotTaker({
    driver: smi([
      { gpuUuid: 'GPU-0', pid: 5, name: 'a', usedMiB: 10 },
      { gpuUuid: 'GPU-7', pid: 6, name: 'lost', usedMiB: 1 },
    ]),
    proc: createProcReader({ root, log }),
    log,
    interest: () => ({ pids: [8, 9], cgroups }),
    now: () => 1234,
  });
  const snapshot = await take();
  t.equal(snapshot.takenAt, 1234);
  t.same([...snapshot.proc.keys()].sort(), [5, 6, 8, 9]);
  t.equal(statOf(snapshot, 5)?.startTime, 50);
  t.equal(snapshot.proc.get(9), null, 'a shard PID that is gone');
  t.same(snapshot.unmatchedProcesses.map((row) => row.pid), [6]);
  t.equal(snapshot.cgroupPids.size, 0, 'no cgroup shard, no scan');
  t.ok(lines.some((line) => line.msg.includes('GPU UUIDs its GPU query did not return') && Array.isArray(line.uuids) && line.uuids.includes('GPU-7')));
  t.ok(snapshot.timings.driverMs >= 0 && snapshot.timings.procMs >= 0);

  cgroups = ['abcdef12-3456'];
  const withCgroup = await take();
  t.same([...(withCgroup.cgroupPids.get('abcdef12-3456') ?? [])], [5]);
});

t.test('take: reads the parents through which a GPU process may descend from a shard, and no others', async (t) => {
  // "pid (comm) S ppid pgrp session ... starttime": every process its own start time.
  const st = (pid: number, ppid: number, session: number, pgrp = session, startTime = pid * 10) =>
    `${pid} (p${pid}) S ${ppid} ${pgrp} ${session} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 ${startTime} 0 0\n`;
  const tree: Record<string, string> = {
    // Session 50: a script (its leader) that started shard 100.
    50: st(50, 1, 50),
    100: st(100, 50, 50),
    101: st(101, 100, 50), // the shard's EngineCore: no GPU process, read to reach 102 and 103
    102: st(102, 101, 50),
    103: st(103, 101, 50),
    104: st(104, 100, 50), // a GPU child of the shard: its parent is read already
    105: st(105, 104, 50), // a GPU child of that child: its parent is a GPU process
    // Chains of 4 and 5 generations to the shard; the longer one left its group (setpgid).
    200: st(200, 201, 50),
    201: st(201, 202, 50),
    202: st(202, 203, 50),
    203: st(203, 100, 50),
    210: st(210, 211, 50, 210),
    211: st(211, 212, 50),
    212: st(212, 213, 50),
    213: st(213, 214, 50),
    214: st(214, 100, 50),
    // Started after the shard (PIDs wrap), in its group, with no chain to it:
    70: st(70, 1, 50, 50, 1100), // re-parented to PID 1
    80: st(80, 81, 50, 50, 1200),
    81: '81 (truncated', // its parent's stat does not parse: the chain stops there
    90: st(90, 91, 50, 50, 1300), // its parent is gone
    75: st(75, 1, 50), // a program the script started before the shard (re-parented): in its group, not its
    // A foreign session, and a session led by a GPU process with shard 61 in it.
    300: st(300, 301, 300),
    301: st(301, 1, 300),
    59: st(59, 1, 59),
    60: st(60, 59, 60),
    61: st(61, 60, 60),
  };
  const root = t.testdir(Object.fromEntries(Object.entries(tree).map(([pid, stat]) => [pid, { stat }])));
  const base = createProcReader({ root, log: pino({ level: 'silent' }) });
  const calls: Array<[number[], boolean]> = [];
  const proc: ProcReader = {
    ...base,
    readStats: async (pids, options) => {
      calls.push([pids, options?.keep ?? false]);
      return base.readStats(pids, options);
    },
  };
  const listed = (pids: number[]) => smi(pids.map((pid) => ({ gpuUuid: 'GPU-0', pid, name: `p${pid}`, usedMiB: 10 })));
  const gpuPids = [102, 103, 104, 105, 200, 210, 70, 80, 90, 75, 300, 60];
  const take = createSnapshotTaker({ driver: listed(gpuPids), proc, log: pino({ level: 'silent' }), interest: () => ({ pids: [100, 61], cgroups: [] }), now: () => 1 });
  const snapshot = await take();
  t.same(
    calls,
    [
      [[...gpuPids, 100, 61], true],
      [[301], false],
      [[101, 201, 211, 81, 91], false],
      [[202, 212], false],
      [[203, 213], false],
    ],
    `GPU and shard PIDs kept open, the parent of a foreign session's leader, then parents ${ANCESTRY_DEPTH - 1} generations up, each read once, fresh`,
  );
  t.match(snapshot.proc.get(81), { pid: 81, unreadable: 'its stat does not parse' }, 'an unreadable parent is in the snapshot as such');
  t.equal(snapshot.proc.get(91), null, 'a gone one as null');
  t.equal(statOf(snapshot, 81), undefined, 'statOf gives neither');
  t.equal(statOf(snapshot, 91), undefined);

  const shards: ShardRecord[] = [
    { id: 's', pid: 100, cgroup: null, gpus: [0], engine: 'vllm', graceMs: 0, registeredAt: 0, identity: { pid: 100, pgid: 50, startTime: 1000, name: 'p100' } },
  ];
  const owners = attribute(snapshot, shards).ownerByPid;
  t.same(
    gpuPids.filter((pid) => owners.get(pid) === 's'),
    [102, 103, 104, 105, 200, 70, 80, 90],
    'descendants within reach and members of its group started after it are the shard; 75 (older), 210 (5 generations, another group) and the other sessions are not',
  );

  calls.length = 0;
  await createSnapshotTaker({ driver: listed([105, 104]), proc, log: pino({ level: 'silent' }), interest: () => ({ pids: [100], cgroups: [] }), now: () => 1 })();
  t.same(calls, [[[105, 104, 100], true]], "a parent that is itself a GPU process is not read again");

  calls.length = 0;
  await createSnapshotTaker({ driver: listed(gpuPids), proc, log: pino({ level: 'silent' }), interest: () => ({ pids: [], cgroups: [] }), now: () => 1 })();
  t.same(calls, [[gpuPids, true]], 'no shard process, no session to follow: nothing more is read');
});

t.test('take: a session a shard\'s descendant started (setsid, torchrun\'s workers) is walked through to the shard; others are not', async (t) => {
  const st = (pid: number, ppid: number, session: number, startTime = pid * 10) => `${pid} (p${pid}) S ${ppid} ${session} ${session} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 ${startTime} 0 0\n`;
  const tree: Record<string, string> = {
    50: st(50, 1, 50), // a script leading session 50,
    100: st(100, 50, 50), // the shard it started,
    400: st(400, 100, 50), // a launcher (torchrun),
    401: st(401, 400, 401), // a worker leading a session of its own (GPU),
    402: st(402, 401, 401), // and its child (GPU).
    403: st(403, 100, 403), // A child of the shard in a session of its own, with a GPU grandchild.
    404: st(404, 403, 403),
    500: st(500, 501, 500), // Foreign: a session leader under a process in no shard's session,
    501: st(501, 1, 501),
    600: st(600, 1, 600), // a daemon's session (its leader's parent is init),
    601: st(601, 600, 600),
    701: st(701, 700, 700), // and a session whose leader is gone.
  };
  const root = t.testdir(Object.fromEntries(Object.entries(tree).map(([pid, stat]) => [pid, { stat }])));
  const base = createProcReader({ root, log: pino({ level: 'silent' }) });
  const calls: number[][] = [];
  const proc: ProcReader = { ...base, readStats: async (pids, options) => (calls.push([...pids]), base.readStats(pids, options)) };
  const gpuPids = [401, 402, 404, 500, 601, 701];
  const listed = smi(gpuPids.map((pid) => ({ gpuUuid: 'GPU-0', pid, name: `p${pid}`, usedMiB: 10 })));
  const snapshot = await createSnapshotTaker({ driver: listed, proc, log: pino({ level: 'silent' }), interest: () => ({ pids: [100], cgroups: [] }), now: () => 1 })();
  t.same(calls, [[...gpuPids, 100], [403, 600, 700], [400, 501]], 'the leaders not read yet, their parents, then no more: the launcher was read already');
  const shards: ShardRecord[] = [
    { id: 's', pid: 100, cgroup: null, gpus: [0], engine: 'vllm', graceMs: 0, registeredAt: 0, identity: { pid: 100, pgid: 50, startTime: 1000, name: 'p100' } },
  ];
  const owners = attribute(snapshot, shards).ownerByPid;
  t.same(gpuPids.filter((pid) => owners.get(pid) === 's'), [401, 402, 404], 'the workers in sessions the shard\'s descendants started');
});

t.test('take: the members of cgroup shards are read with the GPU and shard PIDs, in one kept read after the scan', async (t) => {
  const pod = '0::/kubepods.slice/kubepods-pod7d5b1f2c_1111_4c3e_9e0a_3f7c2b9d8e11.slice/cri-containerd-abc.scope\n';
  const root = t.testdir({
    '10': { stat: '10 (pause) S 1 10 10 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0', cgroup: pod },
    '12': { stat: '12 (llama-server) S 1 12 12 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 700 0 0', cgroup: pod },
    '20': { stat: '20 (python3) S 1 20 20 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 800 0 0', cgroup: '0::/system.slice/x\n' },
  });
  const base = createProcReader({ root, log: pino({ level: 'silent' }) });
  const calls: Array<[number[], boolean]> = [];
  const proc: ProcReader = {
    ...base,
    readStats: async (pids, options) => {
      calls.push([[...pids], options?.keep ?? false]);
      return base.readStats(pids, options);
    },
  };
  const take = createSnapshotTaker({
    driver: smi([{ gpuUuid: 'GPU-0', pid: 12, name: 'llama-server', usedMiB: 4000 }]),
    proc,
    log: pino({ level: 'silent' }),
    interest: () => ({ pids: [20], cgroups: ['7d5b1f2c-1111-4c3e-9e0a-3f7c2b9d8e11'] }),
    now: () => 1,
  });
  const snapshot = await take();
  t.same(calls, [[[12, 20, 10], true]], 'GPU process, shard PID, then the members not read already: one call, kept open');
  t.same(statOf(snapshot, 10), { pid: 10, comm: 'pause', state: 'S', ppid: 1, pgrp: 10, session: 10, startTime: 5, cpuTicks: 0 }, 'the sandbox, by its name');
  const pods: ShardRecord[] = [
    { id: 'pod', pid: null, cgroup: '7d5b1f2c-1111-4c3e-9e0a-3f7c2b9d8e11', gpus: [0], engine: 'llama.cpp', graceMs: 0, registeredAt: 0, identity: { pid: 10, pgid: 10, startTime: 5, name: 'pause' } },
  ];
  t.same(attribute(snapshot, pods).liveness.get('pod'), { state: 'alive', oldestStart: 700 });
});

t.test('take: CPU cores are measured between the stat reads, not up to the model files read after them', async (t) => {
  const root = t.testdir({ '30': { stat: '30 (llama-server) R 1 30 30 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 90 0 0' } });
  let slow = true;
  const take = createSnapshotTaker({
    driver: smi([]),
    proc: createProcReader({ root, log: pino({ level: 'silent' }) }),
    log: pino({ level: 'silent' }),
    interest: () => ({ pids: [30], cgroups: [] }),
    now: () => 1,
    // The first snapshot's read of its model files takes 600 ms (a slow mount), the next one's none.
    modelFiles: { read: async () => (slow ? ((slow = false), await new Promise((resolve) => setTimeout(resolve, 600))) : undefined, { files: [], unreadable: null }) },
  });
  await take();
  // 100 ticks (1 s of CPU) between two stat reads at least 600 ms apart: at most 1.67 cores.
  writeFileSync(join(root, '30', 'stat'), '30 (llama-server) R 1 30 30 0 -1 0 0 0 0 0 100 0 0 0 20 0 1 0 90 0 0');
  const cores = (await take()).cpuCores.get(30)!;
  t.ok(cores > 0.2 && cores < 1.7, `${cores} cores`);
});

t.test('take, when nvidia-smi fails: the shards\' /proc facts stay with the error, without touching the kept stat files', async (t) => {
  const root = t.testdir({
    '8': { stat: '8 (shard) S 1 8 8 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 80 0 0', cgroup: '0::/system.slice/x\n' },
    '20': { stat: '20 (pause) S 1 20 20 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 200 0 0', cgroup: '0::/kubepods/podabcdef12-3456/x\n' },
  });
  const log = pino({ level: 'silent' });
  const failure = new Error('nvidia-smi did not answer');
  let clock = 500;
  const calls: Array<{ pids: number[]; keep: boolean | undefined }> = [];
  const real = createProcReader({ root, log });
  const proc: ProcReader = { ...real, readStats: (pids, options) => (calls.push({ pids: [...pids].sort((a, b) => a - b), keep: options?.keep }), real.readStats(pids, options)) };
  const take = createSnapshotTaker({
    driver: { ...smi([]), queryComputeApps: async () => Promise.reject(failure) },
    proc,
    log,
    interest: () => ({ pids: [8, 9], cgroups: ['abcdef12-3456'] }),
    now: () => (clock += 10),
  });
  t.equal(procFactsAfter(null), undefined);
  await t.rejects(take(), failure, 'the error is nvidia-smi\'s, unchanged');
  const facts = procFactsAfter(failure)!;
  t.same([facts.startedAt, facts.takenAt], [510, 520], 'when the refresh began, and when /proc was read');
  t.same([...facts.cgroupPids.get('abcdef12-3456')!], [20]);
  t.same([...facts.proc.keys()].sort((a, b) => a - b), [8, 9, 20]);
  t.equal(facts.proc.get(9), null, 'a shard PID that is gone');
  t.same(calls, [{ pids: [8, 9, 20], keep: false }], 'one read, not kept');
  t.equal(procFactsAfter(new Error('another')), undefined, 'nothing for an error no refresh threw');
});

t.test('take, when nvidia-smi fails and /proc cannot be read either: the nvidia-smi error, no facts, one warning', async (t) => {
  const { log, lines } = captureLog('warn');
  const proc = createProcReader({ root: '/nonexistent-proc-root', log });
  const failure = new Error('no devices');
  const take = createSnapshotTaker({
    driver: { ...smi([]), queryGpus: async () => Promise.reject(failure) },
    proc: { ...proc, readStats: async () => Promise.reject(new Error('EACCES: /proc')) },
    log,
    interest: () => ({ pids: [8], cgroups: [] }),
    now: () => 1,
  });
  await t.rejects(take(), failure);
  t.equal(procFactsAfter(failure), undefined);
  t.match(lines, [{ msg: /^Could not read the shards' processes in \/proc after the GPU driver failed/ }]);
  const odd = createSnapshotTaker({ driver: { ...smi([]), queryGpus: async () => Promise.reject('not an Error') }, proc, log, interest: () => ({ pids: [], cgroups: [] }), now: () => 1 });
  await t.rejects(odd(), 'not an Error');
  t.equal(lines.length, 1, 'a rejection that is not an Error carries nothing, and is no /proc failure');
});

t.test('take: a cgroup scan that fails (one unreadable cgroup file) leaves the snapshot, and the facts after a failure, to the rest', async (t) => {
  const root = t.testdir({
    '5': { stat: '5 (a) S 1 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 50 0 0', cgroup: '0::/kubepods/podabcdef12-3456/x\n' },
    '8': { stat: '8 (shard) S 1 8 8 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 80 0 0', cgroup: { 'not-a-file': '' } },
  });
  const { log, lines } = captureLog('debug');
  let failure: Error | null = null;
  const take = createSnapshotTaker({
    driver: { ...smi([{ gpuUuid: 'GPU-0', pid: 5, name: 'a', usedMiB: 10 }]), queryGpus: async () => (failure ? Promise.reject(failure) : { gpus, unreachable: [] }) },
    proc: createProcReader({ root, log: pino({ level: 'silent' }) }),
    log,
    interest: () => ({ pids: [8], cgroups: ['abcdef12-3456'] }),
    now: () => 1,
  });
  const snapshot = await take();
  t.match(snapshot.cgroupScanFailed, /^cannot read .*\/8\/cgroup: EISDIR/);
  t.same([...snapshot.cgroupPids], [], 'no member is known');
  t.same(snapshot.gpus[0]!.processes.map((p) => p.pid), [5], "nvidia-smi's listing is kept");
  t.match(statOf(snapshot, 8), { comm: 'shard' }, "the PID shard's stat is read as ever");
  t.equal(attribute(snapshot, []).liveness.size, 0);
  await take();
  failure = new Error('no devices');
  await t.rejects(take(), failure);
  const facts = procFactsAfter(failure)!;
  t.match(facts.cgroupScanFailed, /EISDIR/, 'the facts after a failure say so too');
  t.match(facts.proc.get(8), { comm: 'shard' });
  t.same(
    lines.filter((line) => /^Could not find the processes of the cgroup shards/.test(line.msg)).map((line) => line.level),
    [40, 20, 20],
    'a warning, then the same failure at debug level',
  );
  const { log: otherLog, lines: otherLines } = captureLog('debug');
  const proc = createProcReader({ root, log: pino({ level: 'silent' }) });
  const uncoded = createSnapshotTaker({
    driver: smi([]),
    proc: { ...proc, findPidsInCgroups: async () => Promise.reject(new Error('the scan gave up')) },
    log: otherLog,
    interest: () => ({ pids: [], cgroups: ['abcdef12-3456'] }),
    now: () => 1,
  });
  t.equal((await uncoded()).cgroupScanFailed, 'the scan gave up');
  await uncoded();
  t.same(otherLines.map((line) => line.level), [40, 20], 'a failure without a system code repeats by its message');
});

t.test('procOnlyLiveness: the facts describe only shards registered before they were read', async (t) => {
  const stat = (pid: number, startTime: number, state = 'S') => ({ pid, comm: `p${pid}`, state, ppid: 1, pgrp: pid, session: pid, startTime, cpuTicks: 0 });
  const facts = {
    startedAt: 1000,
    takenAt: 1010,
    proc: new Map([[8, stat(8, 80)], [9, null], [10, stat(10, 999)]]),
    cgroupPids: new Map([['abcdef12-3456', new Set([20])]]),
    bootId: 'boot-now',
  };
  const shard = (id: string, pid: number, registeredAt: number, startTime = pid * 10): ShardRecord => ({
    id,
    pid,
    cgroup: null,
    gpus: [0],
    engine: 'other',
    graceMs: 0,
    registeredAt,
    identity: { pid, pgid: pid, startTime, name: 'x' },
  });
  const { liveness } = procOnlyLiveness(facts, [shard('alive', 8, 1000), shard('gone', 9, 500), shard('late', 10, 1001)]);
  t.same(liveness.get('alive'), { state: 'alive' });
  t.match(liveness.get('gone'), { state: 'gone', why: 'process 9 no longer exists' });
  const before = shard('before', 8, 1000);
  const afterRestart = procOnlyLiveness(facts, [{ ...before, identity: { ...before.identity, bootId: 'boot-before' } }]).liveness.get('before');
  t.match(afterRestart, { state: 'gone', why: /restarted.*boot boot-before, now boot-now/ }, 'the facts name their boot: PID 8 of an earlier boot is gone');
  t.equal(liveness.get('late'), undefined, 'registered after the read: its PID may have been another process then (here: another start time)');
  const pod: ShardRecord = { ...shard('pod', 20, 1000), pid: null, cgroup: 'abcdef12-3456' };
  t.match(procOnlyLiveness(facts, [pod]).liveness.get('pod'), { state: 'alive' });
  const scanFailed = procOnlyLiveness({ ...facts, cgroupPids: new Map(), cgroupScanFailed: 'cannot read /proc/7/cgroup: EIO' }, [pod, shard('alive', 8, 1000)]).liveness;
  const why = /cgroup "abcdef12-3456".*cannot read \/proc\/7\/cgroup: EIO/;
  t.match(scanFailed.get('pod'), { state: 'unreadable', why }, 'a failed cgroup scan: unknown whether it runs');
  t.same(scanFailed.get('alive'), { state: 'alive' }, "and a PID shard's as read");
});

t.test('NodeService.current: a refresh held up by a /proc read that never returns is answered at the bound', async (t) => {
  const take = createSnapshotTaker({
    driver: smi([]),
    proc: { ...createProcReader({ root: t.testdir({}), log: pino({ level: 'silent' }) }), readStats: () => new Promise(() => undefined) },
    log: pino({ level: 'silent' }),
    interest: () => ({ pids: [8], cgroups: [] }),
    now: Date.now,
  });
  const snapshots = createSnapshotSource({ take, ttlMs: 1000, maxStaleMs: 5000, log: pino({ level: 'silent' }), now: Date.now });
  const registry = { version: 1, list: () => [] } as unknown as Registry;
  const node = createNodeService(snapshots, registry, pino({ level: 'silent' }), 100);
  const started = Date.now();
  await t.rejects(node.current(), { code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT', message: /refresh has not finished within 100 ms.*\/proc.*doctor/ });
  t.ok(Date.now() - started < 2000, 'answered at its bound, not held');
  await t.rejects(node.current({ maxWaitMs: 20 }), { message: /within this request's 20 ms/ }, "a caller's own budget wins");
});

t.test('NodeService.procOnly: the latest failed refresh\'s facts, derived once per facts and registry version', async (t) => {
  const facts = { startedAt: 10, takenAt: 11, proc: new Map([[8, null]]), cgroupPids: new Map(), bootId: null };
  let lastError: Error | null = null;
  const snapshots = { get lastError() { return lastError; } } as unknown as SnapshotSource<NodeSnapshot>;
  const shards: ShardRecord[] = [{ id: 's', pid: 8, cgroup: null, gpus: [0], engine: 'other', graceMs: 0, registeredAt: 5, identity: { pid: 8, pgid: 8, startTime: 80, name: 'x' } }];
  const registry = { version: 1, list: () => shards } as unknown as Registry;
  const node = createNodeService(snapshots, registry, pino({ level: 'silent' }));
  t.equal(node.procOnly(), null, 'no failed refresh');
  lastError = new Error('an error no refresh read /proc for');
  t.equal(node.procOnly(), null, 'a failure without facts');
  const failure = new Error('no devices');
  const take = createSnapshotTaker({
    driver: { ...smi([]), queryGpus: async () => Promise.reject(failure) },
    proc: { ...createProcReader({ root: t.testdir({}), log: pino({ level: 'silent' }) }), readStats: async () => facts.proc },
    log: pino({ level: 'silent' }),
    interest: () => ({ pids: [8], cgroups: [] }),
    now: () => 10,
  });
  await t.rejects(take(), failure);
  lastError = failure;
  const first = node.procOnly();
  t.match(first?.liveness.get('s'), { state: 'gone' });
  t.equal(node.procOnly(), first, 'the same answer while nothing changed');
  (registry as { version: number }).version = 2;
  t.not(node.procOnly(), first, 'derived again for a new registry version');
});
