// CPU a shard burns: the per-process rates between two snapshots (cpuSince) and their sum over the
// shard's processes (shardCpuCores), on hand-made /proc answers; the warning for a shard that burns
// CPU while its GPU does no work (cpuBurnWarning) and the verdict that carries it.
import t from 'tap';
import { cpuSince } from '../../src/node-state/node-snapshot.js';
import { shardCpuCores } from '../../src/node-state/node-view.js';
import { CPU_BURN_CORES, cpuBurnWarning } from '../../src/shards/on-cpu-verdict.js';
import { readiness } from '../../src/shards/readiness.js';
import type { GpuState } from '../../src/node-state/node-snapshot.js';
import type { ProcStat, StatAnswer } from '../../src/system/procfs.js';
import { gpuState } from '../helpers/gpu-state.js';
import { handMadeView, procStat, shardRecord } from '../helpers/hand-made-view.js';

const NOW = 1_700_000_000_000;
const stat = (pid: number, cpuTicks: number, startTime = 5): ProcStat => ({ ...procStat(pid), startTime, cpuTicks });
const answers = (...stats: StatAnswer[]): Map<number, StatAnswer> => new Map(stats.map((s, i) => [s === null ? -i : 'pid' in s ? s.pid : -i, s]));

t.test('cpuSince: cores per process between two reads of the same process', async (t) => {
  const first = cpuSince(new Map(), answers(stat(10, 100), stat(11, 50)), 0);
  t.same([...first.cores], [], 'nothing to measure from at the first read');
  // 2 s later: 10 used 300 ticks (3 s of CPU: 1.5 cores); 11 was replaced by another process under its PID.
  const second = cpuSince(first.sample, answers(stat(10, 400), stat(11, 60, 99), stat(12, 7)), 2_000);
  t.same(Object.fromEntries(second.cores), { 10: 1.5 }, 'a reused PID (another start time) and a new process have no rate yet');
  const third = cpuSince(second.sample, answers(stat(10, 400), stat(11, 160, 99), stat(12, 7)), 3_000);
  t.same(Object.fromEntries(third.cores), { 10: 0, 11: 1, 12: 0 });
});

t.test('cpuSince: a read sooner than 500 ms after a process\'s baseline is measured from it, and keeps it', async (t) => {
  const first = cpuSince(new Map(), answers(stat(10, 100)), 0);
  const soon = cpuSince(first.sample, answers(stat(10, 120), stat(20, 5)), 200);
  t.same(Object.fromEntries(soon.cores), { 10: 1 }, '20 ticks in 200 ms');
  t.same(soon.sample.get(10), { startTime: 5, cpuTicks: 100, at: 0 }, 'its baseline stays');
  t.same(soon.sample.get(20), { startTime: 5, cpuTicks: 5, at: 200 }, 'a new process is read from now');
  const later = cpuSince(soon.sample, answers(stat(10, 300), stat(20, 105), null), 1_000);
  t.same(Object.fromEntries(later.cores), { 10: 2, 20: 1.25 }, 'each over the span since its own baseline; an unreadable answer is skipped');
  t.same([...later.sample.keys()], [10, 20], 'a process no longer read is forgotten');
  t.equal(later.sample.get(10)?.at, 1_000);
});

/** GPU 0 holds the shard's process 101 (its SM figure as given), GPU 1 a foreign one; `utilizationPct`: GPU 0's. */
const gpus = (smUtilPct: number | null | undefined, utilizationPct: number | null = null): GpuState[] => {
  const gpu = { ...gpuState(0, [[101, 4000]]), utilizationPct };
  if (smUtilPct !== undefined) gpu.processes[0]!.smUtilPct = smUtilPct;
  return [gpu, gpuState(1, [[300, 2000]])];
};

t.test('shardCpuCores: its registered process, its GPU processes and its cgroup members, each once', async (t) => {
  const shard = shardRecord(NOW);
  const node = (cores: Array<[number, number]>, stats = [procStat(100), procStat(101)]) => handMadeView({ now: NOW, gpus: gpus(0), stats, cpuCores: cores }, [shard]);
  t.equal(shardCpuCores(shard, node([])), null, 'not read twice yet: null, not 0');
  t.equal(shardCpuCores(shard, node([[100, 0.25], [101, 3.004], [300, 7]])), 3.25, 'the leader and its GPU process; the foreign process on GPU 1 is not its');
  const reused = [{ ...procStat(100), startTime: 9 }, procStat(101)];
  t.equal(shardCpuCores(shard, node([[100, 5], [101, 1]], reused)), null, 'its PID now names another process: the shard is gone, and nothing burns for it');
  const byCgroup = shardRecord(NOW, { pid: null, cgroup: 'pod-1' });
  const cgroupNode = handMadeView({ now: NOW, gpus: gpus(0), stats: [procStat(101), procStat(102)], cgroupPids: [['pod-1', [101, 102]]], cpuCores: [[101, 1], [102, 0.5]] }, [byCgroup]);
  t.equal(shardCpuCores(byCgroup, cgroupNode), 1.5, 'a cgroup shard: its members');
});

t.test('cpuBurnWarning: several cores while its processes do no SM work on every GPU it holds', async (t) => {
  const shard = shardRecord(NOW);
  const node = (cores: number, smUtilPct: number | null | undefined, utilizationPct: number | null = null) =>
    handMadeView({ now: NOW, gpus: gpus(smUtilPct, utilizationPct), stats: [procStat(100), procStat(101)], cpuCores: [[101, cores]] }, [shard]);
  const warning = cpuBurnWarning(shard, node(3.5, 0));
  t.match(warning, /burn about 4 CPU cores/, 'in whole cores');
  t.match(warning, /GPU 0 \(0% SM\)/);
  t.match(warning, /-ngl/);
  const engineWarning = (engine: 'ollama' | 'vllm' | 'other') => cpuBurnWarning({ ...shard, engine }, node(3.5, 0));
  t.match(engineWarning('ollama'), /num_gpu/, "Ollama's terms");
  t.match(engineWarning('vllm'), /--cpu-offload-gb/, "vLLM's terms");
  for (const engine of ['ollama', 'vllm', 'other'] as const) t.notMatch(engineWarning(engine), /-ngl/, `no llama.cpp flag for ${engine}`);
  t.equal(cpuBurnWarning(shard, node(CPU_BURN_CORES - 0.5, 0)), null, 'fewer cores: an engine host thread');
  t.equal(cpuBurnWarning(shard, node(3.5, 60)), null, 'its GPU busy');
  t.equal(cpuBurnWarning(shard, node(3.5, null)), null, 'no SM figure and no GPU utilization (MIG): nothing to weigh it against');
  t.equal(cpuBurnWarning(shard, node(3.5, undefined)), null);
  t.match(cpuBurnWarning(shard, node(3.5, undefined, 0)), /GPU 0 \(0% busy\)/, "under nvidia-smi: the whole GPU's utilization");
  t.equal(cpuBurnWarning(shard, node(3.5, undefined, 90)), null, 'the GPU busy');
  t.match(cpuBurnWarning(shard, node(3.5, 0, 90)), /GPU 0 \(0% SM\)/, "its own processes' SM figure outweighs the GPU's: another tenant may keep it busy");
  const holdsNothing = handMadeView({ now: NOW, gpus: [gpuState(0, [])], stats: [procStat(100)], cpuCores: [[100, 4]] }, [shard]);
  t.equal(cpuBurnWarning(shard, holdsNothing), null, 'holding no GPU is for the on-cpu verdict to judge');

  const verdict = readiness({ shard, node: node(3.5, 0), engine: null, enginePosted: false, staleReason: null, now: NOW });
  t.equal(verdict.state, 'ready', 'it holds its GPU: still ready');
  t.match(verdict.warnings, [/CPU cores/]);
});
