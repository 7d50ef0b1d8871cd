// formatMemory and formatMemoryUse: the one way a memory size reads for people. The label must
// match the arithmetic: binary units (MiB / 1024) are GiB, never "GB" (10000 MiB is 9.8 GiB but
// 10.5 GB). Sizes come from the samples in test/fixtures/samples where named, plus the reviewer's
// 10000 MiB and the unit's edges.
import t from 'tap';
import { formatMemory, formatMemoryUse } from '../src/memory-size.js';
import { deviceLabel } from '../src/shards/compute.js';

const cases: Array<[what: string, mib: number, words: string]> = [
  ['the reviewer\'s case: 10000 MiB is 9.8 GiB (10.5 GB would be decimal)', 10_000, '9.8 GiB'],
  ['H200 memory.total (nvsmi-capture_h200_590.48.01_idle_query-gpu-ALLFIELDS.csv)', 143_771, '140.4 GiB'],
  ['gpu_burn used_gpu_memory (nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv)', 28_234, '27.6 GiB'],
  ['memhog used_gpu_memory (nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv)', 2566, '2.5 GiB'],
  ['H200 memory.reserved (nvsmi-capture_h200_590.48.01_idle_query-gpu-ALLFIELDS.csv) stays in MiB', 614, '614 MiB'],
  ['an idle GPU (nvsmi-capture_h200_590.48.01_idle_query-gpu-ALLFIELDS.csv)', 0, '0 MiB'],
  ['the last size in MiB', 1023, '1023 MiB'],
  ['one GiB', 1024, '1.0 GiB'],
  ['tenths round to the nearest: 1075 MiB is 1.0498 GiB', 1075, '1.0 GiB'],
  ['and 1076 MiB is 1.0508 GiB', 1076, '1.1 GiB'],
];

t.test('GiB with one decimal from 1 GiB up, whole MiB below, labelled as binary units', async (t) => {
  for (const [what, mib, words] of cases) t.equal(formatMemory(mib), words, `${what}: ${mib} MiB`);
});

t.test('a compute device reads the same size with the same label', async (t) => {
  t.equal(deviceLabel({ index: 0, usedMiB: 10_000 }), 'GPU 0: 9.8 GiB', 'not "GPU 0: 9.8 GB"');
  t.equal(deviceLabel({ index: 3, usedMiB: 614 }), 'GPU 3: 614 MiB');
  for (const [, mib, words] of cases) t.equal(deviceLabel({ index: 1, usedMiB: mib }), `GPU 1: ${words}`);
});

t.test('a GPU\'s use of its memory, and the figures nvidia-smi did not report', async (t) => {
  t.equal(formatMemoryUse(32_362, 143_771), '31.6 / 140.4 GiB', 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv: memory.used 32362 MiB of memory.total 143771 MiB');
  t.equal(formatMemoryUse(614, 143_771), '614 MiB / 140.4 GiB', 'below 1 GiB used: MiB, as the segments of that GPU read');
  t.equal(formatMemoryUse(1024, 143_771), '1.0 / 140.4 GiB');
  t.equal(formatMemoryUse(null, 143_771), '? / 140.4 GiB');
  t.equal(formatMemoryUse(null, null), '? / ? GiB', '[N/A] or [Insufficient Permissions]');
});

t.test('no size reads in decimal units', async (t) => {
  for (let mib = 0; mib < 200_000; mib += 997) t.match(formatMemory(mib), /^(\d+ MiB|\d+\.\d GiB)$/, `${mib} MiB`);
});
