// The fake nvidia-smi answers like the real one. Each case runs the fake with the arguments the sample's
// author ran, on a scenario describing that sample's machine, and expects the sample's own lines (the
// `timestamp` column masked). The first test checks that every expected line really is in the sample
// named (in test/fixtures/samples). Then the failure modes, the scenario knobs, and the harness.
import t from 'tap';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import {
  createFakeNvidiaSmi,
  eightGpuNode,
  idleEightGpuNode,
  FAKE_NVIDIA_SMI_BIN,
  livePidsInGroup,
  waitUntil,
  type FakeGpu,
  type FakeNvidiaSmi,
  type FakeScenario,
} from './helpers/fake-nvidia-smi.js';
import { readSample } from './helpers/samples.js';

const ZERO_UUID = 'GPU-00000000-0000-0000-0000-000000000000';
const CAPTURE_APPS_ARGS = [
  '--query-compute-apps=timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,used_gpu_memory',
  '--format=csv',
];

const mask = (text: string) => text.replace(/\d{4}\/\d{2}\/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}/g, '<timestamp>');
const lines = (...rows: string[]) => rows.map((row) => `${row}\n`).join('');

async function run(fake: FakeNvidiaSmi, args: string[]) {
  const r = await execa(fake.path, args, { reject: false, stripFinalNewline: false, stdin: 'ignore' });
  return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode, signal: r.signal };
}

function h200(overrides: Partial<FakeGpu> = {}): FakeGpu {
  return {
    index: 0,
    uuid: ZERO_UUID,
    name: 'NVIDIA H200',
    busId: '00000000:83:00.0',
    serial: '0000000000000',
    totalMiB: 143771,
    usedMiB: 32362,
    freeMiB: 110796,
    reservedMiB: 614,
    ...overrides,
  };
}

const oneGpu = (gpu: FakeGpu, processes: FakeScenario['processes'] = []): FakeScenario => ({ gpus: [gpu], processes });

interface SampleCase {
  name: string;
  from: string;
  scenario: FakeScenario;
  args: string[];
  stdout: string;
  exitCode?: number;
}

const sampleCases: SampleCase[] = [
  {
    name: 'h200 under load: compute apps as the capture asked',
    from: 'nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv',
    scenario: oneGpu(h200(), [
      { gpuUuid: ZERO_UUID, pid: 10291, name: '/root/tools/memhog', usedMiB: 2566 },
      { gpuUuid: ZERO_UUID, pid: 10293, name: '/root/tools/memhog', usedMiB: 1542 },
      { gpuUuid: ZERO_UUID, pid: 10309, name: './gpu_burn', usedMiB: 28234 },
    ]),
    args: CAPTURE_APPS_ARGS,
    stdout: lines(
      'timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, used_gpu_memory [MiB]',
      `<timestamp>, NVIDIA H200, 00000000:83:00.0, 0000000000000, ${ZERO_UUID}, 10291, /root/tools/memhog, 2566 MiB`,
      `<timestamp>, NVIDIA H200, 00000000:83:00.0, 0000000000000, ${ZERO_UUID}, 10293, /root/tools/memhog, 1542 MiB`,
      `<timestamp>, NVIDIA H200, 00000000:83:00.0, 0000000000000, ${ZERO_UUID}, 10309, ./gpu_burn, 28234 MiB`,
    ),
  },
  {
    name: 'h200 idle: no process, the header alone',
    from: 'nvsmi-capture_h200_590.48.01_idle_query-compute-apps_header-only.csv',
    scenario: oneGpu(h200({ usedMiB: 0, freeMiB: 143158 })),
    args: CAPTURE_APPS_ARGS,
    stdout: lines('timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, used_gpu_memory [MiB]'),
  },
  {
    name: 'h100 MIG: every process carries the parent GPU UUID',
    from: 'nvsmi-capture_h100-mig_590.48.01_load_query-compute-apps.csv',
    scenario: oneGpu(h200({ name: 'NVIDIA H100 80GB HBM3', busId: '00000000:00:09.0', migMode: 'Enabled' }), [
      { gpuUuid: ZERO_UUID, pid: 21180, name: '/root/tools/memhog', usedMiB: 2296 },
      { gpuUuid: ZERO_UUID, pid: 21181, name: '/root/tools/memhog', usedMiB: 1272 },
      { gpuUuid: ZERO_UUID, pid: 21198, name: './gpu_burn', usedMiB: 7484 },
    ]),
    args: CAPTURE_APPS_ARGS,
    stdout: lines(
      'timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, used_gpu_memory [MiB]',
      `<timestamp>, NVIDIA H100 80GB HBM3, 00000000:00:09.0, 0000000000000, ${ZERO_UUID}, 21180, /root/tools/memhog, 2296 MiB`,
      `<timestamp>, NVIDIA H100 80GB HBM3, 00000000:00:09.0, 0000000000000, ${ZERO_UUID}, 21181, /root/tools/memhog, 1272 MiB`,
      `<timestamp>, NVIDIA H100 80GB HBM3, 00000000:00:09.0, 0000000000000, ${ZERO_UUID}, 21198, ./gpu_burn, 7484 MiB`,
    ),
  },
  {
    name: 'h100 MIG: -L lists the MIG devices under their GPU',
    from: 'nvsmi-capture_h100-mig_590.48.01_list-L.txt',
    scenario: oneGpu(
      h200({
        name: 'NVIDIA H100 80GB HBM3',
        migDevices: [
          { profile: '3g.40gb', uuid: 'MIG-00000000-0000-0000-0000-000000000000' },
          { profile: '2g.20gb', uuid: 'MIG-00000001-0000-0000-0000-000000000001' },
          { profile: '1g.10gb', uuid: 'MIG-00000002-0000-0000-0000-000000000002' },
          { profile: '1g.10gb', uuid: 'MIG-00000003-0000-0000-0000-000000000003' },
        ],
      }),
    ),
    args: ['-L'],
    stdout: lines(
      `GPU 0: NVIDIA H100 80GB HBM3 (UUID: ${ZERO_UUID})`,
      '  MIG 3g.40gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)',
      '  MIG 2g.20gb     Device  1: (UUID: MIG-00000001-0000-0000-0000-000000000001)',
      '  MIG 1g.10gb     Device  2: (UUID: MIG-00000002-0000-0000-0000-000000000002)',
      '  MIG 1g.10gb     Device  3: (UUID: MIG-00000003-0000-0000-0000-000000000003)',
    ),
  },
  {
    name: 'h200 MIG: -L with 10-character profiles',
    from: 'nvsmi-capture_h200-mig_590.48.01_list-L.txt',
    scenario: oneGpu(
      h200({
        migDevices: [
          { profile: '1c.3g.71gb', uuid: 'MIG-00000000-0000-0000-0000-000000000000' },
          { profile: '2c.3g.71gb', uuid: 'MIG-00000001-0000-0000-0000-000000000001' },
          { profile: '2g.35gb', uuid: 'MIG-00000002-0000-0000-0000-000000000002' },
          { profile: '1g.18gb', uuid: 'MIG-00000003-0000-0000-0000-000000000003' },
          { profile: '1g.18gb', uuid: 'MIG-00000004-0000-0000-0000-000000000004' },
        ],
      }),
    ),
    args: ['--list-gpus'],
    stdout: lines(
      `GPU 0: NVIDIA H200 (UUID: ${ZERO_UUID})`,
      '  MIG 1c.3g.71gb  Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)',
      '  MIG 2c.3g.71gb  Device  1: (UUID: MIG-00000001-0000-0000-0000-000000000001)',
      '  MIG 2g.35gb     Device  2: (UUID: MIG-00000002-0000-0000-0000-000000000002)',
      '  MIG 1g.18gb     Device  3: (UUID: MIG-00000003-0000-0000-0000-000000000003)',
      '  MIG 1g.18gb     Device  4: (UUID: MIG-00000004-0000-0000-0000-000000000004)',
    ),
  },
  {
    name: 'h200: -L',
    from: 'nvsmi-capture_h200_590.48.01_list-L.txt',
    scenario: oneGpu(h200()),
    args: ['-L'],
    stdout: lines(`GPU 0: NVIDIA H200 (UUID: ${ZERO_UUID})`),
  },
  {
    name: 'h200: --version',
    from: 'nvsmi-capture_h200_590.48.01_version.txt',
    scenario: oneGpu(h200()),
    args: ['--version'],
    stdout: lines(
      'NVIDIA-SMI version  : 590.48.01',
      'NVML version        : 590.48',
      'DRIVER version      : 590.48.01',
      'CUDA Version        : 13.1',
    ),
  },
  {
    name: 'rtx4080s desktop: serial [N/A]',
    from: 'nvsmi-capture_rtx4080s_595.71.05_load_query-compute-apps.csv',
    scenario: oneGpu(h200({ name: 'NVIDIA GeForce RTX 4080 SUPER', busId: '00000000:01:00.0', serial: undefined }), [
      { gpuUuid: ZERO_UUID, pid: 2165, name: '/usr/bin/kwin_wayland', usedMiB: 25 },
      { gpuUuid: ZERO_UUID, pid: 5022, name: 'ffmpeg', usedMiB: 503 },
      { gpuUuid: ZERO_UUID, pid: 5021, name: 'ffmpeg', usedMiB: 360 },
    ]),
    args: CAPTURE_APPS_ARGS,
    stdout: lines(
      'timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, used_gpu_memory [MiB]',
      `<timestamp>, NVIDIA GeForce RTX 4080 SUPER, 00000000:01:00.0, [N/A], ${ZERO_UUID}, 2165, /usr/bin/kwin_wayland, 25 MiB`,
      `<timestamp>, NVIDIA GeForce RTX 4080 SUPER, 00000000:01:00.0, [N/A], ${ZERO_UUID}, 5022, ffmpeg, 503 MiB`,
      `<timestamp>, NVIDIA GeForce RTX 4080 SUPER, 00000000:01:00.0, [N/A], ${ZERO_UUID}, 5021, ffmpeg, 360 MiB`,
    ),
  },
  {
    name: 'windows WDDM: used_gpu_memory [N/A]',
    from: 'nvsmi-capture_win-rtx2080s_591.86_idle_query-compute-apps_NA-memory.csv',
    scenario: oneGpu(h200({ name: 'NVIDIA GeForce RTX 2080 SUPER', busId: '00000000:0C:00.0', serial: '[N/A]' }), [
      { gpuUuid: ZERO_UUID, pid: 2056, name: 'C:\\Windows\\System32\\dwm.exe', usedMiB: '[N/A]' },
      { gpuUuid: ZERO_UUID, pid: 20372, name: 'C:\\Program Files\\NZXT CAM\\NZXT CAM.exe', usedMiB: '[N/A]' },
    ]),
    args: CAPTURE_APPS_ARGS,
    stdout: lines(
      'timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, used_gpu_memory [MiB]',
      `<timestamp>, NVIDIA GeForce RTX 2080 SUPER, 00000000:0C:00.0, [N/A], ${ZERO_UUID}, 2056, C:\\Windows\\System32\\dwm.exe, [N/A]`,
      `<timestamp>, NVIDIA GeForce RTX 2080 SUPER, 00000000:0C:00.0, [N/A], ${ZERO_UUID}, 20372, C:\\Program Files\\NZXT CAM\\NZXT CAM.exe, [N/A]`,
    ),
  },
  {
    name: 'vllm: used_memory is answered as used_gpu_memory [MiB]',
    from: 'nvsmi-compute-apps_used_memory-alias_header_vllm.txt',
    scenario: oneGpu(h200(), [
      { gpuUuid: ZERO_UUID, pid: 3858903, name: 'VLLM::EngineCore', usedMiB: 6265 },
      { gpuUuid: ZERO_UUID, pid: 3880364, name: 'VLLM::EngineCore', usedMiB: 5530 },
    ]),
    args: ['--query-compute-apps=pid,process_name,used_memory', '--format=csv'],
    stdout: lines('pid, process_name, used_gpu_memory [MiB]', '3858903, VLLM::EngineCore, 6265 MiB', '3880364, VLLM::EngineCore, 5530 MiB'),
  },
  {
    name: 'dcgm-exporter: name is answered as process_name; one GPU UUID twice',
    from: 'nvsmi-compute-apps_name-alias_header_dcgm-exporter94.txt',
    scenario: {
      gpus: [
        h200({ uuid: 'GPU-d0180485-9584-433c-6782-c335d5df2cb3' }),
        h200({ index: 1, uuid: 'GPU-777ead31-954e-837f-590f-6c4974d8e571' }),
      ],
      processes: [
        { gpuUuid: 'GPU-777ead31-954e-837f-590f-6c4974d8e571', pid: 11, name: 'vgpu', usedMiB: 1 },
        { gpuUuid: 'GPU-d0180485-9584-433c-6782-c335d5df2cb3', pid: 10, name: 'vgpu', usedMiB: 1 },
        { gpuUuid: 'GPU-777ead31-954e-837f-590f-6c4974d8e571', pid: 12, name: 'vgpu', usedMiB: 1 },
      ],
    },
    args: ['--query-compute-apps=gpu_uuid,name', '--format=csv'],
    stdout: lines(
      'gpu_uuid, process_name',
      'GPU-d0180485-9584-433c-6782-c335d5df2cb3, vgpu',
      'GPU-777ead31-954e-837f-590f-6c4974d8e571, vgpu',
      'GPU-777ead31-954e-837f-590f-6c4974d8e571, vgpu',
    ),
  },
  {
    name: 'rtx3090: the field list as a separate argument',
    from: 'nvsmi-compute-apps_csv-vs-noheader-nounits_rtx3090_codecomment.txt',
    scenario: oneGpu(h200({ name: 'NVIDIA GeForce RTX 3090' }), [
      { gpuUuid: ZERO_UUID, pid: 1106871, name: '/app/llama-server', usedMiB: 23342 },
    ]),
    args: ['--query-compute-apps', 'timestamp,gpu_name,pid,process_name,used_memory', '--format=csv'],
    stdout: lines(
      'timestamp, gpu_name, pid, process_name, used_gpu_memory [MiB]',
      '<timestamp>, NVIDIA GeForce RTX 3090, 1106871, /app/llama-server, 23342 MiB',
    ),
  },
  {
    name: 'rtx3090: noheader,nounits',
    from: 'nvsmi-compute-apps_csv-vs-noheader-nounits_rtx3090_codecomment.txt',
    scenario: oneGpu(h200({ name: 'NVIDIA GeForce RTX 3090' }), [
      { gpuUuid: ZERO_UUID, pid: 1106871, name: '/app/llama-server', usedMiB: 23342 },
    ]),
    args: ['--query-compute-apps', 'timestamp,gpu_name,pid,process_name,used_memory', '--format=csv,noheader,nounits'],
    stdout: lines('<timestamp>, NVIDIA GeForce RTX 3090, 1106871, /app/llama-server, 23342'),
  },
  {
    name: 'hami rtx pro 6000: MIG node, no process: the header alone',
    from: 'nvsmi-compute-apps_header-only_rtx-pro-6000_610.43.02_hami-doc.txt',
    scenario: oneGpu(h200({ migMode: 'Enabled' })),
    args: ['--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory', '--format=csv'],
    stdout: lines('gpu_uuid, pid, process_name, used_gpu_memory [MiB]'),
  },
  {
    name: 'hami rtx pro 6000: index,name,uuid,driver_version,memory.total,mig.mode.current, noheader',
    from: 'nvsmi-query-gpu_noheader_rtx-pro-6000_610.43.02_hami-doc.txt',
    scenario: {
      driverVersion: '610.43.02',
      gpus: [4, 5].map((index) =>
        h200({
          index,
          name: 'NVIDIA RTX PRO 6000 Blackwell Server Edition',
          uuid: index === 4 ? 'GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288' : 'GPU-f4f5db98-143f-0a8d-47ce-956fab39a736',
          totalMiB: 97887,
        }),
      ),
      processes: [],
    },
    args: ['--query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current', '--format=csv,noheader'],
    stdout: lines(
      '4, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288, 610.43.02, 97887 MiB, Disabled',
      '5, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-f4f5db98-143f-0a8d-47ce-956fab39a736, 610.43.02, 97887 MiB, Disabled',
    ),
  },
  {
    name: 'MIG container without privileges: gpu_name answers as name, memory [Insufficient Permissions]',
    from: 'nvsmi-query-gpu_mig-container_insufficient-permissions_stableswarmui388.txt',
    scenario: {
      driverVersion: '535.161.08',
      gpus: [
        h200({
          name: 'NVIDIA A100-SXM4-80GB',
          totalMiB: '[Insufficient Permissions]',
          usedMiB: '[Insufficient Permissions]',
          freeMiB: '[Insufficient Permissions]',
          extra: { 'temperature.gpu': '47', 'utilization.gpu [%]': '[N/A]', 'utilization.memory [%]': '[N/A]' },
        }),
      ],
      processes: [],
    },
    args: [
      '--query-gpu=gpu_name,driver_version,temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.free,memory.used',
      '--format=csv',
    ],
    stdout: lines(
      'name, driver_version, temperature.gpu, utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], memory.used [MiB]',
      'NVIDIA A100-SXM4-80GB, 535.161.08, 47, [N/A], [N/A], [Insufficient Permissions], [Insufficient Permissions], [Insufficient Permissions]',
    ),
  },
  {
    name: '8xH200 container: query-gpu with a utilization column',
    from: 'nvsmi-8xH200-container_query-gpu_and_compute-apps_not-found.txt',
    scenario: {
      ...eightGpuNode(),
      gpus: eightGpuNode().gpus.map((g) => ({ ...g, extra: { 'utilization.gpu [%]': g.index === 7 ? '0 %' : '100 %' } })),
    },
    args: ['--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu', '--format=csv'],
    stdout: lines(
      'index, uuid, memory.used [MiB], memory.total [MiB], utilization.gpu [%]',
      '0, GPU-a44622e3-2296-6285-0a86-84d0f6c67900, 130013 MiB, 143771 MiB, 100 %',
      '1, GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb, 130053 MiB, 143771 MiB, 100 %',
      '2, GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90, 105851 MiB, 143771 MiB, 100 %',
      '3, GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092, 129993 MiB, 143771 MiB, 100 %',
      '4, GPU-cb449822-5571-be90-8303-e7558da3ea66, 106091 MiB, 143771 MiB, 100 %',
      '5, GPU-8e137fa6-c3d9-6980-7733-0d8df296756e, 105851 MiB, 143771 MiB, 100 %',
      '6, GPU-d9337494-6060-1440-039f-4654245b5764, 106139 MiB, 143771 MiB, 100 %',
      '7, GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72, 58071 MiB, 143771 MiB, 0 %',
    ),
  },
  {
    name: '8xH200 container: [Not Found] for a PID of another namespace, its memory real',
    from: 'nvsmi-8xH200-container_query-gpu_and_compute-apps_not-found.txt',
    scenario: {
      ...eightGpuNode(),
      processes: eightGpuNode().processes.filter((p) => [1328667, 1328668, 1328669, 1758887].includes(p.pid)),
    },
    args: ['--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory', '--format=csv'],
    stdout: lines(
      'gpu_uuid, pid, process_name, used_gpu_memory [MiB]',
      'GPU-a44622e3-2296-6285-0a86-84d0f6c67900, 1328667, /usr/local/bin/python3.10, 130004 MiB',
      'GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb, 1328668, /usr/local/bin/python3.10, 130044 MiB',
      'GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092, 1328669, /usr/local/bin/python3.10, 129984 MiB',
      'GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72, 1758887, [Not Found], 58060 MiB',
    ),
  },
  {
    name: 'driver unreachable: exit 9',
    from: 'nvsmi-err_couldnt-communicate_gcp-pr18.txt',
    scenario: { ...oneGpu(h200()), failures: { all: { kind: 'driver-unreachable' } } },
    args: ['--query-gpu=index', '--format=csv'],
    stdout: lines(
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
    ),
    exitCode: 9,
  },
  {
    name: 'driver/library mismatch: exit 18',
    from: 'nvsmi-err_driver-library-mismatch_exit18_gputil55.txt',
    scenario: { ...oneGpu(h200()), failures: { all: { kind: 'library-mismatch' } } },
    args: ['--version'],
    stdout: lines('Failed to initialize NVML: Driver/library version mismatch', 'NVML library version: 535.161'),
    exitCode: 18,
  },
  {
    name: 'no devices: exit 6',
    from: 'nvsmi-err_no-devices-were-found_ogkm862.txt',
    scenario: { ...oneGpu(h200()), failures: { list: { kind: 'no-devices' } } },
    args: ['-L'],
    stdout: lines('No devices were found'),
    exitCode: 6,
  },
  {
    name: 'a GPU lost: exit 15',
    from: 'nvsmi-err_device-handle_gpu-is-lost_owod81.txt',
    scenario: { ...oneGpu(h200()), failures: { 'compute-apps': { kind: 'gpu-lost' } } },
    args: ['--query-compute-apps=pid', '--format=csv'],
    stdout: lines('Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU'),
    exitCode: 15,
  },
  {
    name: 'an unknown field: the message on stdout, a blank line, non-zero exit (2)',
    from: 'nvsmi-err_invalid-field_stdout_nonzero.txt',
    scenario: oneGpu(h200()),
    args: ['--query-gpu=driver_version,cuda_version', '--format=csv,noheader'],
    stdout: lines('Field "cuda_version" is not a valid field to query.', ''),
    exitCode: 2,
  },
];

// The same H200 load capture asked for our fields plus the few the fake knows: cut from the ALLFIELDS CSV.
const ALLFIELDS_FILE = 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv';
const ALLFIELDS_COLUMNS = [
  'timestamp',
  'driver_version',
  'count',
  'name',
  'serial',
  'uuid',
  'pci.bus_id',
  'index',
  'persistence_mode',
  'memory.total',
  'memory.reserved',
  'memory.used',
  'memory.free',
  'mig.mode.current',
];
const ALLFIELDS_CUT = lines(
  'timestamp, driver_version, count, name, serial, uuid, pci.bus_id, index, persistence_mode, memory.total [MiB], memory.reserved [MiB], memory.used [MiB], memory.free [MiB], mig.mode.current',
  `<timestamp>, 590.48.01, 1, NVIDIA H200, 0000000000000, ${ZERO_UUID}, 00000000:83:00.0, 0, Enabled, 143771 MiB, 614 MiB, 32362 MiB, 110796 MiB, Disabled`,
);

t.test('every expected answer is cut from its sample', async (t) => {
  const read = (file: string) => mask(readSample(file));
  for (const c of sampleCases) {
    const sampleLines = new Set(read(c.from).split('\n').map((line) => line.trimStart()));
    const expected = c.stdout.split('\n').filter((line) => line !== '');
    t.ok(expected.every((line) => sampleLines.has(line.trimStart())), `${c.name}: every line is in ${c.from}`);
  }
  const [header = '', row = ''] = read(ALLFIELDS_FILE).split('\n');
  const names = header.split(', ').map((name) => name.replace(/ \[.*\]$/, ''));
  const at = ALLFIELDS_COLUMNS.map((column) => names.indexOf(column));
  const cut = (line: string) => at.map((i) => line.split(', ')[i]).join(', ');
  t.equal(ALLFIELDS_CUT, lines(cut(header), cut(row)), `the columns of ${ALLFIELDS_FILE}`);
});

t.test('answers like the real nvidia-smi', async (t) => {
  for (const c of sampleCases) {
    t.test(`${c.name} [${c.from}]`, async (t) => {
      const fake = createFakeNvidiaSmi(t.testdir(), c.scenario);
      const r = await run(fake, c.args);
      t.equal(mask(r.stdout), c.stdout);
      t.equal(r.stderr, '');
      t.equal(r.exitCode, c.exitCode ?? 0);
    });
  }
  t.test(`query-gpu, the fields it knows [${ALLFIELDS_FILE}]`, async (t) => {
    const fake = createFakeNvidiaSmi(t.testdir(), oneGpu(h200()));
    const r = await run(fake, [`--query-gpu=${ALLFIELDS_COLUMNS.join(',')}`, '--format=csv']);
    t.equal(mask(r.stdout), ALLFIELDS_CUT);
  });
});

t.test('formats and line ends', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), oneGpu(h200(), [{ gpuUuid: ZERO_UUID, pid: 7, name: 'a, b', usedMiB: 5 }]));
  const gpuArgs = '--query-gpu=index,memory.used,memory.reserved,gpu_uuid,gpu_bus_id,gpu_serial';
  t.equal((await run(fake, [gpuArgs, '--format=csv,nounits'])).stdout, lines(
    'index, memory.used [MiB], memory.reserved [MiB], uuid, pci.bus_id, serial',
    `0, 32362, 614, ${ZERO_UUID}, 00000000:83:00.0, 0000000000000`,
  ), 'nounits: bare values, the header keeps its units');
  t.equal((await run(fake, [gpuArgs, '--format=noheader,csv'])).stdout, lines(`0, 32362 MiB, 614 MiB, ${ZERO_UUID}, 00000000:83:00.0, 0000000000000`));
  t.equal((await run(fake, ['--query-compute-apps=gpu_uuid,pid,name,used_memory', '--format', 'csv,noheader'])).stdout, lines(`${ZERO_UUID}, 7, a, b, 5 MiB`), 'names are not quoted');
  fake.update((s) => ({ ...s, processes: [], lineEnding: 'crlf' }));
  t.equal((await run(fake, ['--query-compute-apps=pid', '--format=csv,noheader'])).stdout, '', 'noheader and no process: nothing');
  t.equal((await run(fake, ['--version'])).stdout.split('\r\n').length, 5, 'CRLF line ends');
  fake.update((s) => ({ ...s, gpus: [{ index: 3, uuid: 'GPU-x', name: 'NVIDIA L40S', totalMiB: 46068, usedMiB: 1, freeMiB: 45574, extra: { 'utilization.gpu [%]': '5 %' } }] }));
  t.equal(
    (await run(fake, ['--query-gpu=pci.bus_id,serial,persistence_mode,mig.mode.current,memory.reserved,utilization.gpu', '--format=csv,noheader,nounits'])).stdout,
    '00000000:04:00.0, [N/A], Enabled, Disabled, 0, 5\r\n',
    'defaults for what a scenario leaves out',
  );
});

t.test('-i picks GPUs by index, UUID or bus id', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), eightGpuNode());
  const ask = async (id: string) => (await run(fake, ['-i', id, '--query-gpu=index', '--format=csv,noheader'])).stdout;
  t.equal(await ask('7'), '7\n');
  t.equal(await ask('GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90,00000000:DB:00.0'), '2\n7\n');
  t.equal((await run(fake, ['--id=7', '--query-compute-apps=pid,process_name,used_memory', '--format=csv'])).stdout, lines(
    'pid, process_name, used_gpu_memory [MiB]',
    '1758887, [Not Found], 58060 MiB',
  ));
  const none = await run(fake, ['-i', '9', '--query-gpu=index', '--format=csv']);
  t.same([none.stdout, none.exitCode], ['No devices were found\n', 6]);
});

t.test('failure knobs', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), { ...eightGpuNode(), failures: { all: { kind: 'no-devices' }, gpu: { kind: 'garbage', text: 'hello\n' } } });
  const gpu = await run(fake, ['--query-gpu=index', '--format=csv']);
  t.same([gpu.stdout, gpu.exitCode], ['hello\n', 0], 'the failure for a kind wins over all');
  t.equal((await run(fake, ['--version'])).exitCode, 6, 'all applies to the other kinds');

  fake.update((s) => ({ ...s, failures: { 'compute-apps': { kind: 'garbage' } } }));
  t.equal((await run(fake, ['--query-gpu=index', '--format=csv,noheader'])).stdout.split('\n').length, 9, 'only compute-apps fails');
  t.match((await run(fake, ['--query-compute-apps=pid', '--format=csv'])).stdout, /502 Bad Gateway/);

  fake.update((s) => ({ ...s, failures: { all: { kind: 'library-mismatch', nvmlVersion: '550.54' } } }));
  t.match((await run(fake, ['-L'])).stdout, /NVML library version: 550\.54\n$/);
  fake.update((s) => ({ ...s, failures: { all: { kind: 'custom', stdout: 'out\n', stderr: 'err\n', exitCode: 3 } } }));
  t.same(await run(fake, ['-L']), { stdout: 'out\n', stderr: 'err\n', exitCode: 3, signal: undefined });
  fake.update((s) => ({ ...s, failures: { all: { kind: 'killed-by-signal', signal: 'SIGTERM' } } }));
  t.equal((await run(fake, ['-L'])).signal, 'SIGTERM');
  fake.update((s) => ({ ...s, failures: { all: { kind: 'killed-by-signal' } } }));
  t.equal((await run(fake, ['-L'])).signal, 'SIGKILL');
  fake.update((s) => ({ ...s, failures: { gpu: { kind: 'driver-unreachable' } }, supportsReserved: false }));
  t.same(
    await run(fake, ['--query-gpu=index,memory.reserved', '--format=csv']),
    { stdout: 'Field "memory.reserved" is not a valid field to query.\n\n', stderr: '', exitCode: 2, signal: undefined },
    'an older driver: memory.reserved is unknown, and arguments are checked before the driver',
  );
  fake.update((s) => ({ ...s, failures: { all: { kind: 'nonsense' } } }) as unknown as FakeScenario);
  t.match(await run(fake, ['-L']), { stderr: 'fake nvidia-smi: unknown failure kind "nonsense" in the scenario\n', exitCode: 2 });
});

t.test('a GPU the driver cannot reach: left out of every listing, said on stderr, exit 0', async (t) => {
  const two = { gpus: [h200(), h200({ index: 1, uuid: 'GPU-1', busId: '00000000:34:00.0' })], processes: [{ gpuUuid: 'GPU-1', pid: 42, name: 'python3', usedMiB: 10 }] };
  const fake = createFakeNvidiaSmi(t.testdir(), { ...two, unreachable: [{ index: 1 }] });
  const said = 'Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error\n';
  t.same(await run(fake, ['--query-gpu=index', '--format=csv,noheader']), { stdout: '0\n', stderr: said, exitCode: 0, signal: undefined });
  t.same(await run(fake, ['--query-compute-apps=pid', '--format=csv']), { stdout: 'pid\n', stderr: said, exitCode: 0, signal: undefined });
  t.match(await run(fake, ['-L']), { stdout: /^GPU 0: NVIDIA H200 \(UUID: /, stderr: said, exitCode: 0 });
  fake.update((s) => ({ ...s, unreachable: [{ index: 0, said: 'GPU is lost. Reboot the system to recover this GPU' }, { index: 1 }] }));
  t.match(await run(fake, ['--query-gpu=index', '--format=csv']), { stdout: 'No devices were found\n', stderr: /GPU0: 0000:83:00\.0: GPU is lost\. Reboot the system to recover this GPU\n.*GPU1/s, exitCode: 6 }, 'none left');
});

t.test('slow answers take at least delayMs, per kind or for all', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), { ...eightGpuNode(), delayMs: { version: 400 } });
  let started = Date.now();
  t.equal((await run(fake, ['--version'])).exitCode, 0);
  t.ok(Date.now() - started >= 400);
  fake.update((s) => ({ ...s, delayMs: 300, failures: { all: { kind: 'no-devices' } } }));
  started = Date.now();
  t.equal((await run(fake, ['-L'])).exitCode, 6, 'a failure is slow too');
  t.ok(Date.now() - started >= 300);
});

t.test('FAKE_NVIDIA_SMI_JITTER_MS: a call that waits answers the scenario it read when it started; a value that is not a duration is refused', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), eightGpuNode());
  const jittery = (value: string) => ({ reject: false, stripFinalNewline: false, stdin: 'ignore' as const, env: { FAKE_NVIDIA_SMI_JITTER_MS: value } });
  const call = execa(fake.path, ['--query-gpu=index', '--format=csv,noheader'], jittery('300'));
  await waitUntil(() => fake.invocations().length === 1, { what: 'the call to start' });
  fake.update((s) => ({ ...s, gpus: s.gpus.slice(0, 1) }));
  t.equal((await call).stdout, '0\n1\n2\n3\n4\n5\n6\n7\n', 'eight GPUs, as when it started');
  const refused = await execa(fake.path, ['-L'], jittery('soon'));
  t.same([refused.exitCode, refused.stdout, refused.stderr], [2, '', 'fake nvidia-smi: FAKE_NVIDIA_SMI_JITTER_MS must be a number of milliseconds, 0 or more; it is "soon"\n']);
});

t.test('a hang never exits and holds stdout open from a grandchild in its process group', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), { ...eightGpuNode(), failures: { gpu: { kind: 'hang', partialOutput: 'index, uu' } } });
  const child = execa(fake.path, ['--query-gpu=index,uuid', '--format=csv'], { reject: false, detached: true, stdin: 'ignore' });
  await waitUntil(() => fake.spawned().length === 1, { what: 'the grandchild' });
  const { pid, childPid } = fake.spawned()[0]!;
  t.equal(pid, child.pid, 'exec kept the pid: the fake leads the group');
  t.same(livePidsInGroup(pid).sort(), [pid, childPid].sort());
  process.kill(-pid, 'SIGKILL');
  const r = await child;
  t.same([r.stdout, r.signal], ['index, uu', 'SIGKILL'], 'the pipe closed only once the whole group was gone');
  await waitUntil(() => livePidsInGroup(pid).length === 0, { what: 'the group to be gone' });
});

t.test('an escaped grandchild: exits 0 but stdout stays open from another session', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), { ...eightGpuNode(), failures: { all: { kind: 'escaped-grandchild' } } });
  const child = execa(fake.path, ['-L'], { reject: false, stdin: 'ignore' });
  await waitUntil(() => fake.spawned().length === 1 && child.exitCode !== null, { what: 'the fake to exit' });
  const { pid, childPid } = fake.spawned()[0]!;
  t.equal(child.exitCode, 0);
  t.same(livePidsInGroup(childPid), [childPid], 'its own group');
  t.same(livePidsInGroup(pid), []);
  process.kill(childPid, 'SIGKILL');
  t.equal((await child).stdout, '');
});

t.test('arguments it does not implement are refused on stderr as the fake', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), eightGpuNode());
  const refused = async (args: string[], message: string) => {
    t.same(await run(fake, args), { stdout: '', stderr: `fake nvidia-smi: ${message}\n`, exitCode: 2, signal: undefined }, message);
  };
  await refused([], 'unsupported arguments: (none)');
  await refused(['-q'], 'unsupported arguments: -q');
  await refused(['--query-gpu=index'], 'a query needs its field list and --format=csv[,noheader][,nounits]');
  await refused(['--format=csv', '--query-compute-apps'], 'a query needs its field list and --format=csv[,noheader][,nounits]');
  await refused(['--query-gpu=index', '--format=noheader'], 'unsupported --format noheader');
  await refused(['--query-gpu=index', '--format=csv,json'], 'unsupported --format csv,json');
  const unknownApps = await run(fake, ['--query-compute-apps=pid,memory.used', '--format=csv']);
  t.same([unknownApps.stdout, unknownApps.exitCode], ['Field "memory.used" is not a valid field to query.\n\n', 2]);
});

t.test('the executable itself: a scenario is required, the log is optional', async (t) => {
  const dir = t.testdir();
  // Through sh, as the wrapper does, so the test runner's NODE_OPTIONS hooks stay out of the fake.
  const direct = (env: Record<string, string>) =>
    execa('sh', ['-c', 'unset NODE_OPTIONS; exec "$0" "$@"', FAKE_NVIDIA_SMI_BIN, '-L'], { reject: false, env });
  const bare = await direct({ FAKE_NVIDIA_SMI_SCENARIO: '' });
  t.same([bare.stderr, bare.exitCode], ['fake nvidia-smi: FAKE_NVIDIA_SMI_SCENARIO is not set', 2]);
  writeFileSync(join(dir, 's.json'), JSON.stringify(oneGpu(h200())));
  const logless = await direct({ FAKE_NVIDIA_SMI_SCENARIO: join(dir, 's.json'), FAKE_NVIDIA_SMI_LOG: '' });
  t.equal(logless.stdout, `GPU 0: NVIDIA H200 (UUID: ${ZERO_UUID})`);
  t.same(readdirSync(dir), ['s.json'], 'no log without FAKE_NVIDIA_SMI_LOG');
});

t.test('harness: scenario files, the invocation log, re-reading at every call', async (t) => {
  const dir = t.testdir();
  const fake = createFakeNvidiaSmi(dir, eightGpuNode());
  t.equal(fake.path, join(dir, 'nvidia-smi'));
  t.same(fake.invocations(), [], 'no call yet');
  t.same(fake.spawned(), []);
  t.match(readFileSync(fake.path, 'utf8'), /^#!\/bin\/sh\n[\s\S]*unset NODE_OPTIONS\n[\s\S]*exec '.*node' '.*test\/fixtures\/bin\/nvidia-smi' "\$@"\n$/);

  await run(fake, ['--query-gpu=index', '--format=csv']);
  fake.update((s) => {
    s.gpus = s.gpus.slice(0, 2);
  });
  t.equal((await run(fake, ['--query-gpu=index', '--format=csv,noheader'])).stdout, '0\n1\n', 'a mutated draft');
  fake.update((s) => ({ ...s, gpus: s.gpus.slice(0, 1) }));
  t.equal((await run(fake, ['--query-gpu', 'index', '--format', 'csv,noheader'])).stdout, '0\n', 'a returned scenario');
  fake.setScenario(idleEightGpuNode());
  await run(fake, ['--query-compute-apps=pid', '--format=csv']);
  await run(fake, ['--version']);

  const calls = fake.invocations();
  t.equal(calls.length, 5);
  t.same(calls[2]!.argv, ['--query-gpu', 'index', '--format', 'csv,noheader']);
  t.ok(calls.every((c) => Number.isInteger(c.pid) && c.at > 0));
  t.equal(fake.countQueries('gpu'), 3);
  t.equal(fake.countQueries('compute-apps'), 1);
  t.same(JSON.parse(readFileSync(join(dir, 'scenario.json'), 'utf8')).processes, []);
  t.same(readdirSync(dir).filter((name) => name.endsWith('.tmp')), [], 'written through a temp file and renamed');
});

t.test('eightGpuNode: an 8x H200 node with the awkward processes', async (t) => {
  const node = eightGpuNode();
  t.equal(node.gpus.length, 8);
  for (const g of node.gpus) {
    t.same([g.name, g.totalMiB, g.reservedMiB], ['NVIDIA H200', 143771, 614]);
    t.equal(g.freeMiB, 143771 - 614 - (g.usedMiB as number) + 1);
    const known = node.processes.filter((p) => p.gpuUuid === g.uuid && typeof p.usedMiB === 'number');
    const unexplained = (g.usedMiB as number) - known.reduce((sum, p) => sum + (p.usedMiB as number), 0);
    t.ok(known.length === 0 || (unexplained > 0 && unexplained < 20), `GPU ${g.index}: ${unexplained} MiB not in any process`);
  }
  t.ok(node.processes.some((p) => p.usedMiB === '[N/A]'));
  t.ok(node.processes.some((p) => p.name.includes(', ')));
  t.ok(node.processes.some((p) => p.name === '[Not Found]'));
  t.equal(new Set(node.processes.filter((p) => p.pid === 1425258).map((p) => p.gpuUuid)).size, 2);
  t.not(eightGpuNode(), node, 'a fresh copy each time');
});

t.test('livePidsInGroup reads /proc: skips zombies, other groups and processes that vanish mid-scan', async (t) => {
  const proc = t.testdir({
    '100': { stat: '100 (nvidia-smi) S 1 100 100 0 -1' },
    '101': { stat: '101 (sleep) S 100 100 100 0 -1' },
    '102': { stat: '102 (x) (y z) S 100 100 100 0 -1' },
    '103': { stat: '103 (defunct) Z 100 100 100 0 -1' },
    '104': { stat: '104 (other) S 1 104 104 0 -1' },
    '105': {},
    self: { stat: '1 (self) S 0 1 1 0 -1' },
  });
  t.same(livePidsInGroup(100, proc).sort(), [100, 101, 102]);
  t.same(livePidsInGroup(104, proc), [104]);

  const sleeper = execa('sleep', ['60'], { detached: true, reject: false });
  t.same(livePidsInGroup(sleeper.pid as number), [sleeper.pid], 'the real /proc by default');
  process.kill(-(sleeper.pid as number), 'SIGKILL');
  await sleeper;
});

t.test('waitUntil polls until true, and gives up with a message', async (t) => {
  let n = 0;
  await waitUntil(() => ++n === 3, { intervalMs: 1 });
  t.equal(n, 3);
  await t.rejects(waitUntil(() => false, { timeoutMs: 30, intervalMs: 5, what: 'godot' }), /timed out after 30 ms waiting for godot/);
  await t.rejects(waitUntil(() => false, { timeoutMs: 1 }), /waiting for condition/);
});
