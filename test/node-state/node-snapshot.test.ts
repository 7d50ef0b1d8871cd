// Taking one snapshot: both queries joined by GPU UUID, /proc read for GPU and shard PIDs, cgroups
// scanned only when a cgroup shard exists, and rows under unknown UUIDs set aside with a warning.
import t from 'tap';
import { pino } from 'pino';
import { createSnapshotTaker, joinGpusAndProcesses } from '../../src/node-state/node-snapshot.js';
import type { ComputeAppRecord, GpuRecord, NvidiaSmi } from '../../src/system/nvidia-smi.js';
import { createProcReader } from '../../src/system/procfs.js';

const gpus: GpuRecord[] = [0, 1].map((index) => ({ index, uuid: `GPU-${index}`, name: 'NVIDIA H100 80GB HBM3', totalMiB: 81559, usedMiB: 100, freeMiB: 80000, reservedMiB: 479 }));

function smi(apps: ComputeAppRecord[]): NvidiaSmi {
  return {
    queryGpus: async () => gpus,
    queryComputeApps: async () => apps,
    queryVersion: async () => ({ smiVersion: null, driverVersion: null, cudaVersion: null }),
    killAll: () => undefined,
    running: 0,
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
  const lines: string[] = [];
  const log = pino({ level: 'warn' }, { write: (line: string) => lines.push(line) });
  let cgroups: string[] = [];
  const take = createSnapshotTaker({
    nvidiaSmi: smi([
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
  t.equal(snapshot.proc.get(5)?.startTime, 50);
  t.equal(snapshot.proc.get(9), null, 'a shard PID that is gone');
  t.same(snapshot.unmatchedProcesses.map((row) => row.pid), [6]);
  t.equal(snapshot.cgroupPids.size, 0, 'no cgroup shard, no scan');
  t.ok(lines.some((line) => line.includes('GPU UUIDs its GPU query did not return') && line.includes('GPU-7')));
  t.ok(snapshot.timings.nvidiaSmiMs >= 0 && snapshot.timings.procMs >= 0);

  cgroups = ['abcdef12-3456'];
  const withCgroup = await take();
  t.same([...(withCgroup.cgroupPids.get('abcdef12-3456') ?? [])], [5]);
});
