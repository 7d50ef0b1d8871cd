// Whether nvidia-smi's processes are hidden from this /proc, judged snapshot after snapshot
// (judgePids): every listed PID missing counts at once in the first snapshot, and after it only
// when some PID stays missing, so one refresh listing a process that has just exited is not taken
// for another PID namespace. The view cache says once in the log when the judgement changes.
import t from 'tap';
import type { NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import { gpuState } from '../helpers/gpu-state.js';
import { captureLog } from '../helpers/log-capture.js';
import { createNodeViewCache, judgePids, PID_NAMESPACE_WARNING, type PidsJudged } from '../../src/node-state/node-view.js';
import type { ProcStat } from '../../src/system/procfs.js';

/** A snapshot whose nvidia-smi lists `listed` on GPU 0 (and `also` on GPU 1), of which /proc has `present`. */
function snapshot(listed: number[], present: number[], also: number[] = []): NodeSnapshot {
  const stat = (pid: number): ProcStat => ({ pid, comm: `p${pid}`, state: 'S', ppid: 1, pgrp: pid, session: pid, startTime: 1, cpuTicks: 0 });
  return {
    takenAt: 0,
    gpus: [gpuState(0, listed.map((pid) => [pid, 500])), gpuState(1, also.map((pid) => [pid, 500]))],
    proc: new Map(present.map((pid) => [pid, stat(pid)])),
    cgroupPids: new Map(),
    bootId: null,
    unmatchedProcesses: [],
    lostGpus: [],
    cpuCores: new Map(),
    modelFiles: new Map(),
    timings: { driverMs: 1, procMs: 1 },
  };
}

/** The judgements of a run of snapshots, each against the one before. */
function judgeAll(snapshots: NodeSnapshot[]): Array<string | null> {
  let previous: PidsJudged | null = null;
  return snapshots.map((current) => (previous = judgePids(current, previous)).hidden);
}

const HIDDEN = PID_NAMESPACE_WARNING;

t.test('the first snapshot with every listed PID missing is another PID namespace at once', async (t) => {
  t.same(judgeAll([snapshot([7, 8], [])]), [HIDDEN]);
  t.same(judgeAll([snapshot([7], [], [7])]), [HIDDEN], 'one process on two GPUs is one PID');
  t.same(judgeAll([snapshot([7, 8], [7])]), [null], 'one found: this is its namespace');
});

t.test('after the first, only a PID that stays missing counts: a process that exited between two reads does not', async (t) => {
  t.same(judgeAll([snapshot([7], [7]), snapshot([9], [7])]), [null, null], 'the one listed process exited after nvidia-smi listed it');
  t.same(judgeAll([snapshot([7], [7]), snapshot([9], [7]), snapshot([9], [7])]), [null, null, HIDDEN], 'still listed and missing: another namespace');
  t.same(judgeAll([snapshot([7, 9], [7]), snapshot([9], [7])]), [null, HIDDEN], 'missing in both (one of two before, the only one now)');
  t.same(judgeAll([snapshot([], []), snapshot([9], [])]), [null, null], 'after idle GPUs: the first process listed may have exited already');
  t.same(judgeAll([snapshot([9], [7]), snapshot([10], [7]), snapshot([11], [7])]), [HIDDEN, HIDDEN, HIDDEN], 'once it counts, every process listed missing keeps it, whichever they are');
  t.same(judgeAll([snapshot([9], []), snapshot([9, 7], [7]), snapshot([12], [7])]), [HIDDEN, null, null], 'a process found ends it; a new missing one starts over');
});

t.test('no process listed: hidden only when GPUs hold memory (header-only process query), whatever came before', async (t) => {
  const busyIdle: NodeSnapshot = { ...snapshot([], []), gpus: [gpuState(0, [], 20_000), gpuState(1, [], 3)] };
  const [hidden] = judgeAll([busyIdle]);
  t.match(hidden, /no GPU process, yet GPU 0 has memory in use/);
  t.same(judgeAll([snapshot([7], [7]), busyIdle]).map((h) => h !== null), [false, true]);
  t.same(judgeAll([snapshot([7], [7]), busyIdle, snapshot([7], [7])]).map((h) => h !== null), [false, true, false]);
});

t.test('idle GPUs are no evidence: the judgement before them stands, for them and for the jobs after them', async (t) => {
  const idle = (): NodeSnapshot => ({ ...snapshot([], []), gpus: [gpuState(0, [], 3)] });
  t.same(judgeAll([idle()]), [null], 'nothing to judge at first');
  t.same(judgeAll([snapshot([9], []), idle(), snapshot([11], []), snapshot([11], [])]), [HIDDEN, HIDDEN, HIDDEN, HIDDEN], 'another namespace between two jobs is still one');
  t.same(judgeAll([snapshot([7], [7]), idle(), snapshot([11], [7])]), [null, null, null], 'a process that exited right after idle GPUs is still a process that exited');
  const [, busyHidden] = judgeAll([snapshot([7], [7]), { ...snapshot([], []), gpus: [gpuState(0, [], 20_000)] }, idle()]);
  t.match(busyHidden, /no GPU process, yet GPU 0 has memory in use/);
  t.same(judgeAll([{ ...snapshot([], []), gpus: [gpuState(0, [], 20_000)] }, idle()])[1], busyHidden, 'hidden processes stay hidden while the GPUs idle');
});

t.test('the view cache judges each new snapshot against the last, and logs each change once', async (t) => {
  const { log, lines } = captureLog('info');
  const derive = createNodeViewCache(log);
  const shards = () => [];
  const idle = { ...snapshot([], []), gpus: [gpuState(0, [], 3)] };
  const busy = (index: number): NodeSnapshot => ({ ...snapshot([], []), gpus: [gpuState(index, [], 20_000)] });
  const run = [snapshot([7], [7]), snapshot([9], [7]), snapshot([9], [7]), idle, snapshot([9], [7]), busy(0), busy(1), snapshot([7], [7])];
  const judged = run.map((current) => derive(current, 1, shards).processesHidden);
  t.same(judged.slice(0, 5), [null, null, HIDDEN, HIDDEN, HIDDEN], 'idle GPUs keep it, and the PID missing before still counts');
  t.match(judged[5], /yet GPU 0 has memory in use/);
  t.match(judged[6], /yet GPU 1 has memory in use/, 'the words change with the busy GPUs');
  t.equal(judged[7], null);
  t.equal(derive(run[4]!, 2, shards).processesHidden, null, 'a new registry version of the same snapshot is not judged again');
  t.match(lines, [
    { level: 40, missingPids: [9], msg: /PIDs do not exist in this \/proc.*--pid=host.*unverified.*foreign.*\/readyz fails/ },
    { level: 30, msg: /match this \/proc again/ },
  ]);
  t.equal(lines.length, 2);
});

t.test('a registration between two snapshots does not judge the current one against itself', async (t) => {
  const { log, lines } = captureLog('info');
  const derive = createNodeViewCache(log);
  const shards = () => [];
  t.equal(derive(snapshot([7], [7]), 1, shards).processesHidden, null);
  // Process 7 exited between nvidia-smi's listing and the /proc read: one refresh like that is no namespace problem.
  const exited = snapshot([7], []);
  t.equal(derive(exited, 1, shards).processesHidden, null);
  t.equal(derive(exited, 2, shards).processesHidden, null, 'a PUT or DELETE (a new registry version) keeps the judgement of the same snapshot');
  t.same(lines, [], 'and logs nothing');
});
