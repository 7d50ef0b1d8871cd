// The NVML backend when the driver answers part of a query badly: processes gone between the count
// and the read, a MIG device or the optional utilization call refusing, samples no real figure can
// be (stale stamps, utilizations past 100, as real drivers return: nvtop #110). The GPU stays listed
// and its processes attributed; only the part that failed reads null or is left out.
import t from 'tap';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { rig, sameAsSmi } from '../helpers/nvml-rig.js';

const MIG_UUID = 'MIG-11111111-0000-0000-0000-000000000000';

t.test('processes that exit between the count and the read leave the entry size to be probed later', async (t) => {
  const emptied = { done: false };
  const { nvml, smi, fake } = rig(t, { ...eightGpuNode(), nvml: { processStruct: 32 } }, {
    calls: (library, fake) => async (fn, ...args) => {
      const code = await library.call(fn, ...args);
      // After GPU 0's count, every process exits.
      if (fn === 'processes' && args[2] === null && !emptied.done) {
        emptied.done = true;
        fake.update((s) => ({ ...s, processes: [] }));
      }
      return code;
    },
  });
  t.same(await nvml.queryComputeApps(), [], 'nothing listed');
  // They come back, two on GPU 0: 32-byte entries, read as such.
  fake.update((s) => ({ ...s, processes: [...eightGpuNode().processes, { ...eightGpuNode().processes[1]!, gpuUuid: eightGpuNode().gpus[0]!.uuid }] }));
  const apps = await nvml.queryComputeApps();
  t.same(sameAsSmi(apps), await smi.queryComputeApps());
  t.same(apps.slice(0, 2).map((app) => [app.pid, app.usedMiB]), [[1328667, 130004], [1328668, 130044]]);
});

t.test('a MIG device refusing a call is left out; its GPU stays listed and its processes attributed', async (t) => {
  const scenario = eightGpuNode();
  Object.assign(scenario.gpus[1]!, { migMode: 'Enabled', migDevices: [{ profile: '7g.141gb', uuid: MIG_UUID, gpuInstanceId: 0, computeInstanceId: 0 }] });
  Object.assign(scenario.processes[1]!, { gpuInstanceId: 0, computeInstanceId: 0 });
  const { nvml, fake } = rig(t, scenario);
  t.same((await nvml.queryGpus()).gpus[1]!.migDevices?.map((mig) => mig.uuid), [MIG_UUID]);
  for (const code of [999, 15]) {
    fake.update((s) => ({ ...s, nvml: { errors: { nvmlDeviceGetComputeInstanceId: { code, index: 1 } } } }));
    const listing = await nvml.queryGpus();
    t.same(listing.unreachable, [], `code ${code}: no GPU said lost`);
    t.same(listing.gpus[1]!.migDevices, [], `code ${code}: the MIG device left out`);
    const app = (await nvml.queryComputeApps()).find((one) => one.pid === 1328668);
    t.match(app, { gpuUuid: scenario.gpus[1]!.uuid, usedMiB: 130044, migInstance: null }, `code ${code}: its process listed, on no known instance`);
  }
  fake.update((s) => ({ ...s, nvml: { errors: { nvmlDeviceGetMemoryInfo_v2: { code: 999, index: 1 } } } }));
  t.same((await nvml.queryGpus()).unreachable.map((gpu) => gpu.said), ['Unknown Error'], 'the GPU\'s own call failing still says so');
});

t.test('the utilization call failing leaves the processes listed, with no figure', async (t) => {
  const { nvml, fake } = rig(t, eightGpuNode());
  for (const code of [999, 15]) {
    fake.update((s) => ({ ...s, nvml: { errors: { nvmlDeviceGetProcessUtilization: { code, index: 0 } } } }));
    const apps = await nvml.queryComputeApps();
    t.equal(apps.length, 8, `code ${code}: every process listed`);
    t.same([apps[0]!.pid, apps[0]!.smUtilPct, apps[1]!.smUtilPct], [1328667, null, 0], `code ${code}: GPU 0 gives no figure, GPU 1 its own`);
  }
});

t.test('utilization samples no real figure can be are dropped, and do not hide later samples', async (t) => {
  const scenario = eightGpuNode();
  const [first, second] = scenario.processes as [(typeof scenario.processes)[0], (typeof scenario.processes)[0]];
  // On GPU 0 beside its process: a garbage sample (SM past 100, stamped far ahead) and a sound one.
  scenario.processes.push({ ...second, gpuUuid: first.gpuUuid, smUtilPct: 4294967295, sampleStampUs: 2 ** 52 });
  first.smUtilPct = 40;
  const { nvml, fake } = rig(t, scenario);
  const smOf = async (pid: number) => (await nvml.queryComputeApps()).find((app) => app.pid === pid && app.gpuUuid === first.gpuUuid)?.smUtilPct;
  t.equal(await smOf(1328668), 0, 'SM past 100: dropped');
  fake.update((s) => void (s.processes[0]!.smUtilPct = 30));
  t.equal(await smOf(1328667), 30, 'the next sample still read');
  // A sound figure stamped a century ahead: dropped, as a stamp kept from it would hide the next ones.
  fake.update((s) => void s.processes.push({ ...s.processes[8]!, smUtilPct: 50, sampleStampUs: 2 ** 52 }));
  t.equal(await smOf(1328668), 0, 'a stamp ahead of the clock: dropped');
  fake.update((s) => void (s.processes[0]!.smUtilPct = 20));
  t.equal(await smOf(1328667), 20, 'and the next sample still read');
  // A sample stamped before the last one read: seen already, not counted again.
  fake.update((s) => void Object.assign(s.processes[0]!, { smUtilPct: 90, sampleStampUs: 1 }));
  t.equal(await smOf(1328667), 0, 'a stale sample: no work since');
});
