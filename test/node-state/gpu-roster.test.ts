// The GPU roster: a GPU nvidia-smi stops listing is lost from that snapshot until one lists it
// again, each change logged once, with what to check; and what a failure's bus ids were last listed as.
import t from 'tap';
import { createGpuRoster, unreachableListedIn } from '../../src/node-state/gpu-roster.js';
import { listedAs } from '../../src/node-state/placement.js';
import { unreachableGpusIn } from '../../src/system/nvidia-smi.js';
import { gpuState } from '../helpers/gpu-state.js';
import { captureLog } from '../helpers/log-capture.js';

t.test('a GPU that drops out of the list is lost until it is listed again, and each change is logged once', async (t) => {
  const { log, lines } = captureLog('info');
  const roster = createGpuRoster(log);
  const [g0, g1, g2] = [gpuState(0, []), gpuState(1, []), gpuState(2, [])];
  t.same(roster.update([g0!, g1!, g2!], 1000), [], 'all listed');
  t.same(roster.update([g0!, g2!], 2000), [{ index: 1, uuid: 'GPU-1', name: 'NVIDIA H200', busId: '00000000:02:00.0', lastListedAt: 1000, lostAt: 2000 }], 'with its bus id, by which nvidia-smi errors name it');
  t.same(roster.update([g0!], 3000), [
    { index: 1, uuid: 'GPU-1', name: 'NVIDIA H200', busId: '00000000:02:00.0', lastListedAt: 1000, lostAt: 2000 },
    { index: 2, uuid: 'GPU-2', name: 'NVIDIA H200', busId: '00000000:03:00.0', lastListedAt: 2000, lostAt: 3000 },
  ], 'by index, each with when it was last listed and when first missed');
  t.same(roster.update([g0!], 4000).map((gpu) => [gpu.index, gpu.lostAt]), [[1, 2000], [2, 3000]], 'still lost, since the snapshot that first missed it');
  const warnings = lines.filter((line) => line.level === 40);
  t.same(warnings.map((line) => line.uuid), ['GPU-1', 'GPU-2'], 'one warning per GPU, not one per snapshot');
  t.match(warnings[0]!.msg, /^GPU 1 \(GPU-1, NVIDIA H200\) is no longer listed.*dmesg.*Xid errors \(79/);

  // GPU 2 comes back, renumbered 1 (indices follow enumeration).
  t.same(roster.update([g0!, { ...g2!, index: 1 }], 5000).map((gpu) => gpu.uuid), ['GPU-1']);
  const back = lines.filter((line) => line.level === 30);
  t.same(back.map((line) => [line.uuid, line.missingForMs]), [['GPU-2', 3000]]);
  t.match(back[0]!.msg, /^GPU 1 \(GPU-2\) is listed .*again/);
  t.same(roster.update([g0!, { ...g2!, index: 1 }, g1!], 6000), [], 'and GPU 1 too');
});

t.test("a GPU the listing says it cannot reach: lost with nvidia-smi's words; one never listed is logged once while it says so", async (t) => {
  const { log, lines } = captureLog('info');
  const roster = createGpuRoster(log);
  const [g0, g1] = [gpuState(0, []), gpuState(1, [])];
  roster.update([g0!, g1!], 1000);
  const said = [{ busId: '00000000:02:00.0', said: 'Unknown Error' }, { busId: '00000000:0A:00.0', said: 'GPU is lost. Reboot the system to recover this GPU' }];
  t.match(roster.update([g0!], 2000, said), [{ index: 1, busId: '00000000:02:00.0', lostAt: 2000, said: 'Unknown Error' }]);
  roster.update([g0!], 3000, said);
  t.same(roster.update([g0!], 4000), [{ index: 1, uuid: 'GPU-1', name: 'NVIDIA H200', busId: '00000000:02:00.0', lastListedAt: 1000, lostAt: 2000 }], 'lost still, its words gone once nvidia-smi no longer says them');
  roster.update([g0!], 5000, said);
  const warnings = lines.filter((line) => line.level === 40).map((line) => line.msg);
  t.equal(warnings.length, 3, 'the lost GPU once; the unknown bus id once, and again once said anew after a listing that did not say it');
  t.match(warnings[0], /^GPU 1 \(GPU-1, NVIDIA H200\) is no longer listed.*00000000:02:00\.0: "Unknown Error"/);
  t.match(warnings[1], /PCI 00000000:0A:00\.0: it says "GPU is lost\. Reboot the system to recover this GPU".*never listed/);
});

t.test('a snapshot that lists no GPU at all loses every one listed before', async (t) => {
  const { log } = captureLog('info');
  const roster = createGpuRoster(log);
  roster.update([gpuState(0, [])], 1);
  t.same(roster.update([], 2).map((gpu) => gpu.uuid), ['GPU-0']);
});

t.test("a failure naming several bus ids: each one a listing had is named as last listed, listed or lost; the others are left as nvidia-smi said", async (t) => {
  const message =
    'nvidia-smi exited with code 15 and said: "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU\n' +
    'Unable to determine the device handle for GPU 0000:03:00.0: Unknown Error\nUnable to determine the device handle for GPU 0000:5D:00.0: Unknown Error".';
  const [g0, g1, g2] = [gpuState(0, []), gpuState(1, []), gpuState(2, [])];
  // GPU 2 dropped out of the listing before nvidia-smi failed on it: the snapshot has it as lost.
  const known = { gpus: [g0!, g1!], lostGpus: [{ index: 2, uuid: 'GPU-2', name: 'NVIDIA H200', busId: g2!.busId, lastListedAt: 1000, lostAt: 2000 }] };
  const failure = Object.assign(new Error(message), { unreachable: unreachableGpusIn(message) });
  const unreachable = listedAs(unreachableGpusIn(message), known);
  t.equal(unreachable.length, 3);
  const said = unreachableListedIn(failure, unreachable);
  t.match(said, /PCI 00000000:02:00\.0 as GPU 1 \(GPU-1, NVIDIA H200\), PCI 00000000:03:00\.0 as GPU 2 \(GPU-2, NVIDIA H200\)\.$/);
  t.notMatch(said, '5D', 'a bus id no listing had is left as nvidia-smi said it');
  t.equal(unreachableListedIn(new Error('nvidia-smi exited with code 9 and said: "NVIDIA-SMI has failed"'), unreachable), '', 'an error naming no bus id: nothing to add');
  t.equal(unreachableListedIn(failure, []), '', 'nothing known of them: nothing to add');
});
