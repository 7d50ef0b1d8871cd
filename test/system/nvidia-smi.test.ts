// The pure nvidia-smi parsers, against tables of named cases cut from the real outputs in
// test/fixtures/samples (each case names its file). A case is either
//   verbatim: every line occurs as-is in the sample,
//   columns:  the sample's CSV cut to our columns (header and rows), checked by re-cutting it, or
//   edited:   changed by hand, with the change said (`how`).
// The first test re-derives every verbatim and columns case from its sample.
import t, { type Test } from 'tap';
import {
  COMPUTE_APPS_FIELDS,
  GPU_QUERY_FIELDS,
  parseComputeAppsCsv,
  parseGpuCsv,
  canonicalBusId,
  parseVersion,
  unreachableGpusIn,
  type ComputeAppRecord,
  type GpuRecord,
  type UnreachableGpu,
} from '../../src/system/nvidia-smi.js';
import { readSample } from '../helpers/samples.js';

type Source =
  | { file: string; kind: 'verbatim' }
  | { file: string; kind: 'columns'; columns: readonly string[]; units?: boolean; header?: boolean }
  | { file: string; kind: 'edited'; how: string };

interface Case<T> {
  name: string;
  source: Source;
  text: string;
  fields?: readonly string[];
  expected: T | { error: RegExp };
}

const ZERO_UUID = 'GPU-00000000-0000-0000-0000-000000000000';
/** What the oldest drivers know: neither memory.reserved nor mig.mode.current. */
const WITHOUT_OPTIONAL = GPU_QUERY_FIELDS.filter((f) => f !== 'memory.reserved' && f !== 'mig.mode.current');

const lines = (...rows: string[]) => rows.map((row) => `${row}\n`).join('');
/** The bus id of the H200 of the captures. */
const H200_BUS = '00000000:83:00.0';
const gpu = (
  index: number,
  uuid: string,
  name: string,
  mem: Array<number | null>,
  migMode: string | null = 'Disabled',
  busId: string | null = H200_BUS,
  utilizationPct: number | null = null,
): GpuRecord => ({
  index,
  uuid,
  name,
  totalMiB: mem[0] ?? null,
  usedMiB: mem[1] ?? null,
  freeMiB: mem[2] ?? null,
  reservedMiB: mem[3] ?? null,
  migMode,
  busId,
  utilizationPct,
});
const app = (gpuUuid: string, pid: number, name: string, usedMiB: number | null): ComputeAppRecord => ({
  gpuUuid,
  pid,
  name,
  usedMiB,
});

const GPU_HEADER =
  'index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB], mig.mode.current, pci.bus_id, utilization.gpu [%]';
const APPS_HEADER = 'gpu_uuid, pid, process_name, used_gpu_memory [MiB]';

const gpuCases: Array<Case<GpuRecord[]>> = [
  {
    name: 'h200 idle',
    source: { file: 'nvsmi-capture_h200_590.48.01_idle_query-gpu-ALLFIELDS.csv', kind: 'columns', columns: GPU_QUERY_FIELDS },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 0 MiB, 143158 MiB, 614 MiB, Disabled, ${H200_BUS}, 0 %`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 0, 143158, 614], 'Disabled', H200_BUS, 0)],
  },
  {
    name: 'h200 load',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'columns', columns: GPU_QUERY_FIELDS },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, 614], 'Disabled', H200_BUS, 100)],
  },
  {
    name: 'h100 MIG: the parent GPU is the only row, MIG mode Enabled',
    source: { file: 'nvsmi-capture_h100-mig_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'columns', columns: GPU_QUERY_FIELDS },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H100 80GB HBM3, 81559 MiB, 11125 MiB, 69956 MiB, 479 MiB, Enabled, 00000000:00:09.0, [N/A]`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H100 80GB HBM3', [81559, 11125, 69956, 479], 'Enabled', '00000000:00:09.0')],
  },
  {
    name: 'windows rtx2080s: no MIG mode ([N/A]) reads as null',
    source: { file: 'nvsmi-capture_win-rtx2080s_591.86_load_query-gpu-ALLFIELDS.csv', kind: 'columns', columns: GPU_QUERY_FIELDS },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA GeForce RTX 2080 SUPER, 8192 MiB, 1296 MiB, 6692 MiB, 205 MiB, [N/A], 00000000:0C:00.0, 7 %`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA GeForce RTX 2080 SUPER', [8192, 1296, 6692, 205], null, '00000000:0C:00.0', 7)],
  },
  {
    name: 'a GPU it cannot reach, said beside the rows it lists (before them, or after): the rows are read',
    source: { file: 'nvsmi-err_device-handle_unknown-error_with-space_2015.txt', kind: 'edited', how: 'its line, in the 610 form with the index, among the H200 capture\'s rows' },
    text: lines(
      'Unable to determine the device handle for GPU1: 0000:0B:00.0: Unknown Error',
      GPU_HEADER,
      `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 0 MiB, 143158 MiB, 614 MiB, Disabled, ${H200_BUS}, 0 %`,
      'Unable to determine the device handle for GPU 0000:0C:00.0: Unknown Error',
    ),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 0, 143158, 614], 'Disabled', H200_BUS, 0)],
  },
  {
    name: 'windows rtx2080s with CRLF line ends (the capture stored LF; Windows prints CRLF)',
    source: { file: 'nvsmi-capture_win-rtx2080s_591.86_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'columns cut, LF -> CRLF' },
    text: `${GPU_HEADER}\r\n0, ${ZERO_UUID}, NVIDIA GeForce RTX 2080 SUPER, 8192 MiB, 1296 MiB, 6692 MiB, 205 MiB, [N/A], 00000000:0C:00.0, 7 %\r\n`,
    expected: [gpu(0, ZERO_UUID, 'NVIDIA GeForce RTX 2080 SUPER', [8192, 1296, 6692, 205], null, '00000000:0C:00.0', 7)],
  },
  {
    name: 'h200 load, nounits (values bare, header keeps its units)',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'columns', columns: GPU_QUERY_FIELDS, units: false },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, 143771, 32362, 110796, 614, Disabled, ${H200_BUS}, 100`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, 614], 'Disabled', H200_BUS, 100)],
  },
  {
    name: 'h200 load, noheader,nounits',
    source: {
      file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv',
      kind: 'columns',
      columns: GPU_QUERY_FIELDS,
      units: false,
      header: false,
    },
    text: lines(`0, ${ZERO_UUID}, NVIDIA H200, 143771, 32362, 110796, 614, Disabled, ${H200_BUS}, 100`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, 614], 'Disabled', H200_BUS, 100)],
  },
  {
    name: 'hami rtx pro 6000: other fields in another order, no header; fields not asked read as null',
    source: { file: 'nvsmi-query-gpu_noheader_rtx-pro-6000_610.43.02_hami-doc.txt', kind: 'verbatim' },
    fields: ['index', 'name', 'uuid', 'driver_version', 'memory.total', 'mig.mode.current'],
    text: lines(
      '4, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288, 610.43.02, 97887 MiB, Disabled',
      '5, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-f4f5db98-143f-0a8d-47ce-956fab39a736, 610.43.02, 97887 MiB, Disabled',
    ),
    expected: [
      gpu(4, 'GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288', 'NVIDIA RTX PRO 6000 Blackwell Server Edition', [97887], 'Disabled', null),
      gpu(5, 'GPU-f4f5db98-143f-0a8d-47ce-956fab39a736', 'NVIDIA RTX PRO 6000 Blackwell Server Edition', [97887], 'Disabled', null),
    ],
  },
  {
    name: 'MIG container without privileges: [Insufficient Permissions] memory reads as null',
    source: {
      file: 'nvsmi-query-gpu_mig-container_insufficient-permissions_stableswarmui388.txt',
      kind: 'edited',
      how: 'our columns: index 0 and an invented uuid added; name and the three memory cells as in the sample; reserved [N/A]; MIG Enabled (a MIG container); an invented bus id; utilization as in the sample',
    },
    text: lines(
      GPU_HEADER,
      '0, GPU-5e3c0c4e-0000-0000-0000-000000000000, NVIDIA A100-SXM4-80GB, [Insufficient Permissions], [Insufficient Permissions], [Insufficient Permissions], [N/A], Enabled, 00000000:4B:00.0, [N/A]',
    ),
    expected: [gpu(0, 'GPU-5e3c0c4e-0000-0000-0000-000000000000', 'NVIDIA A100-SXM4-80GB', [null, null, null, null], 'Enabled', '00000000:4B:00.0')],
  },
  {
    name: 'older driver asked without memory.reserved and mig.mode.current: both read as null',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'columns', columns: WITHOUT_OPTIONAL },
    fields: WITHOUT_OPTIONAL,
    text: lines(
      'index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], pci.bus_id, utilization.gpu [%]',
      `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, ${H200_BUS}, 100 %`,
    ),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, null], null, H200_BUS, 100)],
  },
  {
    name: '[Unknown Error], N/A and [Not Supported] read as null',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'memory, bus id and utilization cells replaced by the markers' },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, [Unknown Error], N/A, [Not Supported], [N/A], [N/A], [N/A], [Not Supported]`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [null, null, null, null], null, null)],
  },
  {
    name: 'blank lines and trailing spaces are ignored; no output at all is no GPU',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'blank lines and spaces added' },
    text: `\n${GPU_HEADER}  \n\n0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %   \n\n`,
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, 614], 'Disabled', H200_BUS, 100)],
  },
  {
    name: 'empty output (noheader, no GPU)',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'nothing' },
    text: '',
    expected: [],
  },
  {
    name: 'garbage is quoted',
    source: { file: 'nvsmi-err_couldnt-communicate_gcp-pr18.txt', kind: 'verbatim' },
    text: lines(
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
    ),
    expected: {
      error: /cannot read: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\. Make sure .*running\." \(expected 10 values/,
    },
  },
  {
    name: 'a unit other than MiB is refused, not misread',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'memory.total in GiB' },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, 140 GiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %`),
    expected: { error: /"0, GPU-0.*, NVIDIA H200, 140 GiB, .*" \("140 GiB" is not a size in MiB\)/ },
  },
  {
    name: 'an index that is not a number',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'index replaced' },
    text: lines(`[N/A], ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %`),
    expected: { error: /index "\[N\/A\]" is not a whole number/ },
  },
  {
    name: 'an empty uuid',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'uuid emptied' },
    text: lines(`0, , NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %`),
    expected: { error: /"0, , NVIDIA H200.*" \(uuid is empty\)/ },
  },
  {
    name: 'a line with more values than fields asked (noheader) is refused, not read by position',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'our columns, no header, one value appended' },
    text: lines(`0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %, 0 MiB`),
    expected: { error: /\(expected 10 values \(index, uuid, name, memory.total, memory.used, memory.free, memory.reserved, mig.mode.current, pci.bus_id, utilization.gpu\), found 11\)/ },
  },
  {
    name: 'a header with fewer columns than asked',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'memory.reserved column dropped, asked for it' },
    text: lines(
      'index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB]',
      `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB`,
    ),
    expected: { error: /"index, uuid, name, .*memory.free \[MiB\]" \(the header does not match the fields asked: index, uuid, name, memory.total, memory.used, memory.free, memory.reserved, mig.mode.current, pci.bus_id, utilization.gpu\)/ },
  },
  {
    name: 'a header with the columns in another order',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'used and free swapped' },
    text: lines(
      'index, uuid, name, memory.total [MiB], memory.free [MiB], memory.used [MiB], memory.reserved [MiB], mig.mode.current, pci.bus_id, utilization.gpu [%]',
      `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 110796 MiB, 32362 MiB, 614 MiB, Disabled, ${H200_BUS}, 100 %`,
    ),
    expected: { error: /the header does not match the fields asked/ },
  },
  {
    name: 'a bus id of another form reads as null: it only matches errors with a GPU, and must not fail the listing',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'pci.bus_id replaced' },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, 83:00, 100 %`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, 614], 'Disabled', null, 100)],
  },
  {
    name: 'a utilization of another form reads as null: a figure to show, not worth failing the listing',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-gpu-ALLFIELDS.csv', kind: 'edited', how: 'utilization.gpu replaced' },
    text: lines(GPU_HEADER, `0, ${ZERO_UUID}, NVIDIA H200, 143771 MiB, 32362 MiB, 110796 MiB, 614 MiB, Disabled, ${H200_BUS}, 100.0 percent`),
    expected: [gpu(0, ZERO_UUID, 'NVIDIA H200', [143771, 32362, 110796, 614], 'Disabled', H200_BUS, null)],
  },
];

const appCases: Array<Case<ComputeAppRecord[]>> = [
  {
    name: 'a GPU it cannot reach, said before the header: the rows are read',
    source: { file: 'nvsmi-err_device-handle_unknown-error_no-space_2024.txt', kind: 'edited', how: 'its line before the H200 capture\'s header and a row' },
    text: lines('Unable to determine the device handle for GPU0000:07:00.0: Unknown Error', APPS_HEADER, `${ZERO_UUID}, 10291, /root/tools/memhog, 2566 MiB`),
    expected: [app(ZERO_UUID, 10291, '/root/tools/memhog', 2566)],
  },
  {
    name: 'h200 load: three processes',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv', kind: 'columns', columns: COMPUTE_APPS_FIELDS },
    text: lines(
      APPS_HEADER,
      `${ZERO_UUID}, 10291, /root/tools/memhog, 2566 MiB`,
      `${ZERO_UUID}, 10293, /root/tools/memhog, 1542 MiB`,
      `${ZERO_UUID}, 10309, ./gpu_burn, 28234 MiB`,
    ),
    expected: [
      app(ZERO_UUID, 10291, '/root/tools/memhog', 2566),
      app(ZERO_UUID, 10293, '/root/tools/memhog', 1542),
      app(ZERO_UUID, 10309, './gpu_burn', 28234),
    ],
  },
  {
    name: 'h200 idle: the header alone means no process',
    source: { file: 'nvsmi-capture_h200_590.48.01_idle_query-compute-apps_header-only.csv', kind: 'columns', columns: COMPUTE_APPS_FIELDS },
    text: lines(APPS_HEADER),
    expected: [],
  },
  {
    name: 'hami rtx pro 6000 MIG: the header alone',
    source: { file: 'nvsmi-compute-apps_header-only_rtx-pro-6000_610.43.02_hami-doc.txt', kind: 'verbatim' },
    text: lines(APPS_HEADER),
    expected: [],
  },
  {
    name: 'noheader and no process: nothing',
    source: { file: 'nvsmi-compute-apps_header-only_rtx-pro-6000_610.43.02_hami-doc.txt', kind: 'edited', how: 'header dropped' },
    text: '',
    expected: [],
  },
  {
    name: 'h100 MIG: rows carry the parent GPU UUID',
    source: { file: 'nvsmi-capture_h100-mig_590.48.01_load_query-compute-apps.csv', kind: 'columns', columns: COMPUTE_APPS_FIELDS },
    text: lines(
      APPS_HEADER,
      `${ZERO_UUID}, 21180, /root/tools/memhog, 2296 MiB`,
      `${ZERO_UUID}, 21181, /root/tools/memhog, 1272 MiB`,
      `${ZERO_UUID}, 21198, ./gpu_burn, 7484 MiB`,
    ),
    expected: [
      app(ZERO_UUID, 21180, '/root/tools/memhog', 2296),
      app(ZERO_UUID, 21181, '/root/tools/memhog', 1272),
      app(ZERO_UUID, 21198, './gpu_burn', 7484),
    ],
  },
  {
    name: 'h200 MIG: rows carry the parent GPU UUID',
    source: { file: 'nvsmi-capture_h200-mig_590.48.01_load_query-compute-apps.csv', kind: 'columns', columns: COMPUTE_APPS_FIELDS },
    text: lines(
      APPS_HEADER,
      `${ZERO_UUID}, 12249, /root/tools/memhog, 2194 MiB`,
      `${ZERO_UUID}, 12250, /root/tools/memhog, 1170 MiB`,
      `${ZERO_UUID}, 12267, ./gpu_burn, 13526 MiB`,
    ),
    expected: [
      app(ZERO_UUID, 12249, '/root/tools/memhog', 2194),
      app(ZERO_UUID, 12250, '/root/tools/memhog', 1170),
      app(ZERO_UUID, 12267, './gpu_burn', 13526),
    ],
  },
  {
    name: 'rtx4080s desktop: the compositor holds a compute context too',
    source: { file: 'nvsmi-capture_rtx4080s_595.71.05_load_query-compute-apps.csv', kind: 'columns', columns: COMPUTE_APPS_FIELDS },
    text: lines(
      APPS_HEADER,
      `${ZERO_UUID}, 2165, /usr/bin/kwin_wayland, 25 MiB`,
      `${ZERO_UUID}, 5022, ffmpeg, 503 MiB`,
      `${ZERO_UUID}, 5021, ffmpeg, 360 MiB`,
    ),
    expected: [
      app(ZERO_UUID, 2165, '/usr/bin/kwin_wayland', 25),
      app(ZERO_UUID, 5022, 'ffmpeg', 503),
      app(ZERO_UUID, 5021, 'ffmpeg', 360),
    ],
  },
  {
    name: 'windows WDDM: [N/A] memory, names with spaces and backslashes',
    source: { file: 'nvsmi-capture_win-rtx2080s_591.86_idle_query-compute-apps_NA-memory.csv', kind: 'columns', columns: COMPUTE_APPS_FIELDS },
    text: lines(
      APPS_HEADER,
      `${ZERO_UUID}, 12444, C:\\Windows\\SystemApps\\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\\TextInputHost.exe, [N/A]`,
      `${ZERO_UUID}, 15076, C:\\Windows\\SystemApps\\ShellExperienceHost_cw5n1h2txyewy\\ShellExperienceHost.exe, [N/A]`,
      `${ZERO_UUID}, 2056, C:\\Windows\\System32\\dwm.exe, [N/A]`,
      `${ZERO_UUID}, 12332, C:\\Windows\\explorer.exe, [N/A]`,
      `${ZERO_UUID}, 20372, C:\\Program Files\\NZXT CAM\\NZXT CAM.exe, [N/A]`,
      `${ZERO_UUID}, 4680, C:\\Program Files\\NVIDIA Corporation\\NVIDIA GeForce Experience\\NVIDIA Share.exe, [N/A]`,
      `${ZERO_UUID}, 14160, C:\\Windows\\SystemApps\\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\\SearchHost.exe, [N/A]`,
      `${ZERO_UUID}, 14184, C:\\Windows\\SystemApps\\Microsoft.Windows.StartMenuExperienceHost_cw5n1h2txyewy\\StartMenuExperienceHost.exe, [N/A]`,
      `${ZERO_UUID}, 16280, C:\\Program Files\\Controller Companion\\ControllerCompanion.exe, [N/A]`,
      `${ZERO_UUID}, 24804, C:\\Windows\\ImmersiveControlPanel\\SystemSettings.exe, [N/A]`,
    ),
    expected: [
      app(ZERO_UUID, 12444, 'C:\\Windows\\SystemApps\\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\\TextInputHost.exe', null),
      app(ZERO_UUID, 15076, 'C:\\Windows\\SystemApps\\ShellExperienceHost_cw5n1h2txyewy\\ShellExperienceHost.exe', null),
      app(ZERO_UUID, 2056, 'C:\\Windows\\System32\\dwm.exe', null),
      app(ZERO_UUID, 12332, 'C:\\Windows\\explorer.exe', null),
      app(ZERO_UUID, 20372, 'C:\\Program Files\\NZXT CAM\\NZXT CAM.exe', null),
      app(ZERO_UUID, 4680, 'C:\\Program Files\\NVIDIA Corporation\\NVIDIA GeForce Experience\\NVIDIA Share.exe', null),
      app(ZERO_UUID, 14160, 'C:\\Windows\\SystemApps\\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\\SearchHost.exe', null),
      app(
        ZERO_UUID,
        14184,
        'C:\\Windows\\SystemApps\\Microsoft.Windows.StartMenuExperienceHost_cw5n1h2txyewy\\StartMenuExperienceHost.exe',
        null,
      ),
      app(ZERO_UUID, 16280, 'C:\\Program Files\\Controller Companion\\ControllerCompanion.exe', null),
      app(ZERO_UUID, 24804, 'C:\\Windows\\ImmersiveControlPanel\\SystemSettings.exe', null),
    ],
  },
  {
    name: 'windows with CRLF line ends',
    source: { file: 'nvsmi-capture_win-rtx2080s_591.86_idle_query-compute-apps_NA-memory.csv', kind: 'edited', how: 'columns cut, two rows, LF -> CRLF' },
    text: `${APPS_HEADER}\r\n${ZERO_UUID}, 2056, C:\\Windows\\System32\\dwm.exe, [N/A]\r\n${ZERO_UUID}, 12332, C:\\Windows\\explorer.exe, [N/A]\r\n`,
    expected: [app(ZERO_UUID, 2056, 'C:\\Windows\\System32\\dwm.exe', null), app(ZERO_UUID, 12332, 'C:\\Windows\\explorer.exe', null)],
  },
  {
    name: '8xH200 container: [Not Found] (a PID of another namespace) is kept as reported, memory is real',
    source: { file: 'nvsmi-8xH200-container_query-gpu_and_compute-apps_not-found.txt', kind: 'verbatim' },
    text: lines(
      APPS_HEADER,
      'GPU-a44622e3-2296-6285-0a86-84d0f6c67900, 1328667, /usr/local/bin/python3.10, 130004 MiB',
      'GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb, 1328668, /usr/local/bin/python3.10, 130044 MiB',
      'GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092, 1328669, /usr/local/bin/python3.10, 129984 MiB',
      'GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72, 1758887, [Not Found], 58060 MiB',
    ),
    expected: [
      app('GPU-a44622e3-2296-6285-0a86-84d0f6c67900', 1328667, '/usr/local/bin/python3.10', 130004),
      app('GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb', 1328668, '/usr/local/bin/python3.10', 130044),
      app('GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092', 1328669, '/usr/local/bin/python3.10', 129984),
      app('GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72', 1758887, '[Not Found]', 58060),
    ],
  },
  {
    name: 'WSL2: [Not Found] name and [N/A] memory together',
    source: { file: 'nvsmi-compute-apps_wsl2_not-found_NA_table-cell.txt', kind: 'edited', how: 'the quoted row `203676, [Not Found], [N/A]` with a gpu_uuid in front' },
    text: lines(`${ZERO_UUID}, 203676, [Not Found], [N/A]`),
    expected: [app(ZERO_UUID, 203676, '[Not Found]', null)],
  },
  {
    name: 'vllm: used_memory is answered as used_gpu_memory [MiB], so the header still matches',
    source: {
      file: 'nvsmi-compute-apps_used_memory-alias_header_vllm.txt',
      kind: 'edited',
      how: 'a gpu_uuid column in front of the sample header and rows',
    },
    text: lines(APPS_HEADER, `${ZERO_UUID}, 3858903, VLLM::EngineCore, 6265 MiB`, `${ZERO_UUID}, 3880364, VLLM::EngineCore, 5530 MiB`),
    expected: [app(ZERO_UUID, 3858903, 'VLLM::EngineCore', 6265), app(ZERO_UUID, 3880364, 'VLLM::EngineCore', 5530)],
  },
  {
    name: 'vllm as printed (pid, process_name, used_memory): not our columns, refused',
    source: { file: 'nvsmi-compute-apps_used_memory-alias_header_vllm.txt', kind: 'verbatim' },
    text: lines('pid, process_name, used_gpu_memory [MiB]', '3858903, VLLM::EngineCore, 6265 MiB'),
    expected: { error: /"pid, process_name, used_gpu_memory \[MiB\]" \(expected gpu_uuid, pid, process_name, used_gpu_memory\)/ },
  },
  {
    name: 'rtx3090 noheader,nounits: bare numbers',
    source: {
      file: 'nvsmi-compute-apps_csv-vs-noheader-nounits_rtx3090_codecomment.txt',
      kind: 'edited',
      how: 'the noheader,nounits row with timestamp and gpu_name replaced by a gpu_uuid',
    },
    text: lines(`${ZERO_UUID}, 1106871, /app/llama-server, 23342`),
    expected: [app(ZERO_UUID, 1106871, '/app/llama-server', 23342)],
  },
  {
    name: 'names with ", " in them (nvidia-smi does not quote): first two cells from the left, the last from the right',
    source: { file: 'nvsmi-8xH200-container_query-gpu_and_compute-apps_not-found.txt', kind: 'edited', how: 'process names with commas and spaces' },
    text: lines(
      APPS_HEADER,
      'GPU-8e137fa6-c3d9-6980-7733-0d8df296756e, 1425260, /srv/jobs/eval, run 2/bin/python3, 105842 MiB',
      'GPU-d9337494-6060-1440-039f-4654245b5764, 1425261, python3 -m vllm,serve, a ,b, [N/A]',
    ),
    expected: [
      app('GPU-8e137fa6-c3d9-6980-7733-0d8df296756e', 1425260, '/srv/jobs/eval, run 2/bin/python3', 105842),
      app('GPU-d9337494-6060-1440-039f-4654245b5764', 1425261, 'python3 -m vllm,serve, a ,b', null),
    ],
  },
  {
    name: 'an empty name (what a container saw for host PIDs on older drivers) is kept empty',
    source: { file: 'nvsmi-xml_processes_block_530.30.02_test-fixture.xml', kind: 'edited', how: 'the XML process as a CSV row' },
    text: lines(`${ZERO_UUID}, 2271, , 306 MiB`),
    expected: [app(ZERO_UUID, 2271, '', 306)],
  },
  {
    name: 'llama.cpp doc: a redacted <pid> is not a pid',
    source: { file: 'llamacpp-lv5_load_tensors_plus_nvsmi-compute-apps.txt', kind: 'edited', how: 'a gpu_uuid column in front of the row' },
    text: lines(APPS_HEADER, `${ZERO_UUID}, <pid>, ./build/bin/llama-server, 6010 MiB`),
    expected: { error: /pid "<pid>" is not a whole number/ },
  },
  {
    name: 'dcgm-exporter: gpu_uuid,name only, two columns, refused',
    source: { file: 'nvsmi-compute-apps_name-alias_header_dcgm-exporter94.txt', kind: 'verbatim' },
    text: lines('GPU-d0180485-9584-433c-6782-c335d5df2cb3, vgpu'),
    expected: { error: /"GPU-d0180485-9584-433c-6782-c335d5df2cb3, vgpu" \(expected gpu_uuid/ },
  },
  {
    name: 'three columns, refused',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv', kind: 'edited', how: 'memory column dropped' },
    text: lines(`${ZERO_UUID}, 10291, /root/tools/memhog`),
    expected: { error: /\(expected gpu_uuid, pid, process_name, used_gpu_memory\)/ },
  },
  {
    name: 'an empty gpu_uuid, refused',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv', kind: 'edited', how: 'uuid emptied' },
    text: lines(', 10291, /root/tools/memhog, 2566 MiB'),
    expected: { error: /\(gpu_uuid is empty\)/ },
  },
  {
    name: 'memory in another unit, refused',
    source: { file: 'nvsmi-capture_h200_590.48.01_load_query-compute-apps.csv', kind: 'edited', how: 'MiB -> GiB' },
    text: lines(`${ZERO_UUID}, 10291, /root/tools/memhog, 2 GiB`),
    expected: { error: /"2 GiB" is not a size in MiB/ },
  },
  {
    name: 'garbage, quoted with the command to run by hand',
    source: { file: 'nvsmi-err_driver-library-mismatch_exit18_gputil55.txt', kind: 'verbatim' },
    text: lines('Failed to initialize NVML: Driver/library version mismatch'),
    expected: {
      error:
        /"Failed to initialize NVML: Driver\/library version mismatch" .*Run `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv` by hand/,
    },
  },
];

const VERSION_590 = lines(
  'NVIDIA-SMI version  : 590.48.01',
  'NVML version        : 590.48',
  'DRIVER version      : 590.48.01',
  'CUDA Version        : 13.1',
);

const versionCases: Array<Case<{ smiVersion: string | null; driverVersion: string | null; cudaVersion: string | null }>> = [
  {
    name: 'h200 590.48.01',
    source: { file: 'nvsmi-capture_h200_590.48.01_version.txt', kind: 'verbatim' },
    text: VERSION_590,
    expected: { smiVersion: '590.48.01', driverVersion: '590.48.01', cudaVersion: '13.1' },
  },
  {
    name: 'with CRLF line ends',
    source: { file: 'nvsmi-capture_h200_590.48.01_version.txt', kind: 'edited', how: 'LF -> CRLF' },
    text: VERSION_590.replace(/\n/g, '\r\n'),
    expected: { smiVersion: '590.48.01', driverVersion: '590.48.01', cudaVersion: '13.1' },
  },
  {
    name: 'lines it does not know are ignored, missing ones are null',
    source: { file: 'nvsmi-capture_h200_590.48.01_version.txt', kind: 'edited', how: 'CUDA line dropped, a line added' },
    text: lines('NVIDIA-SMI version  : 590.48.01', 'NVML version        : 590.48', 'Something new       : x', 'DRIVER version      : 590.48.01'),
    expected: { smiVersion: '590.48.01', driverVersion: '590.48.01', cudaVersion: null },
  },
  {
    name: 'driver 610 and later: the DRIVER and CUDA lines say "Deprecated", the numbers are on KMD and CUDA UMD',
    source: {
      file: 'nvsmi-capture_h200_590.48.01_version.txt',
      kind: 'edited',
      how: 'laid out as public outputs of driver 610.57.04 show it (no capture of 610 in test/fixtures/samples yet)',
    },
    text: lines(
      'NVIDIA-SMI version  : 610.57.04',
      'NVML version        : 610.57',
      'DRIVER version      : Deprecated, see "KMD version" instead',
      'CUDA version        : Deprecated, see "CUDA UMD version" instead',
      'KMD version         : 610.57.04',
      'CUDA UMD version    : 13.3',
    ),
    expected: { smiVersion: '610.57.04', driverVersion: '610.57.04', cudaVersion: '13.3' },
  },
  {
    name: 'the renamed lines win wherever they stand, and prose is never a version',
    source: { file: 'nvsmi-capture_h200_590.48.01_version.txt', kind: 'edited', how: 'renamed lines first, old ones after, one with a number' },
    text: lines('KMD version         : 610.62', 'CUDA UMD version    : 13.3', 'DRIVER version      : 610.61', 'CUDA version        : Deprecated, see "CUDA UMD version" instead'),
    expected: { smiVersion: null, driverVersion: '610.62', cudaVersion: '13.3' },
  },
  {
    name: 'a deprecated line with no renamed line beside it reads as unknown',
    source: { file: 'nvsmi-capture_h200_590.48.01_version.txt', kind: 'edited', how: 'the 610 DRIVER line, no KMD line' },
    text: lines('NVIDIA-SMI version  : 610.88', 'DRIVER version      : Deprecated, see "KMD version" instead', 'CUDA UMD version    : 13.3'),
    expected: { smiVersion: '610.88', driverVersion: null, cudaVersion: '13.3' },
  },
  {
    name: 'an error instead of versions is quoted',
    source: { file: 'nvsmi-capture_win-rtx2080s_591.86_topo-m_ERROR_exit255.txt', kind: 'verbatim' },
    text: lines("ERROR: Option -m is missing its value. Please run 'nvidia-smi -h' for help."),
    expected: { error: /"ERROR: Option -m is missing its value\. Please run 'nvidia-smi -h' for help\." \(no version number found\)/ },
  },
  {
    name: 'nothing at all',
    source: { file: 'nvsmi-capture_h200_590.48.01_version.txt', kind: 'edited', how: 'empty' },
    text: '',
    expected: { error: /cannot read: "" \(no version number found\)/ },
  },
];

const LOST_SAID = 'GPU is lost. Reboot the system to recover this GPU';

/** What nvidia-smi says when it cannot reach a GPU: never an error, at most nothing. */
const unreachableCases: Array<Case<UnreachableGpu[]>> = [
  {
    name: 'GPU is lost (exit 15): the bus id, with a space after GPU',
    source: { file: 'nvsmi-err_device-handle_gpu-is-lost_owod81.txt', kind: 'verbatim' },
    text: lines(`Unable to determine the device handle for GPU 0000:02:00.0: ${LOST_SAID}`),
    expected: [{ busId: '00000000:02:00.0', said: LOST_SAID }],
  },
  {
    name: 'Unknown Error, no space after GPU',
    source: { file: 'nvsmi-err_device-handle_unknown-error_no-space_2024.txt', kind: 'verbatim' },
    text: lines('$ nvidia-smi', 'Unable to determine the device handle for GPU0000:07:00.0: Unknown Error'),
    expected: [{ busId: '00000000:07:00.0', said: 'Unknown Error' }],
  },
  {
    name: 'Unknown Error, upper-case hex',
    source: { file: 'nvsmi-err_device-handle_unknown-error_with-space_2015.txt', kind: 'verbatim' },
    text: lines('Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error'),
    expected: [{ busId: '00000000:0B:00.0', said: 'Unknown Error' }],
  },
  {
    name: 'two GPUs, one named twice: each once, in order',
    source: { file: 'nvsmi-err_device-handle_gpu-is-lost_owod81.txt', kind: 'edited', how: 'a second GPU and a repeat added' },
    text: lines(
      `Unable to determine the device handle for GPU 0000:5d:00.0: ${LOST_SAID}`,
      'Unable to determine the device handle for GPU 0000:02:00.0: Unknown Error',
      `Unable to determine the device handle for GPU 0000:5D:00.0: ${LOST_SAID}`,
    ),
    expected: [
      { busId: '00000000:5D:00.0', said: LOST_SAID },
      { busId: '00000000:02:00.0', said: 'Unknown Error' },
    ],
  },
  {
    name: "quoted in nodecompute's failure message: what it said ends at the quote",
    source: { file: 'nvsmi-err_device-handle_gpu-is-lost_owod81.txt', kind: 'edited', how: "wrapped as the runner's error message words it" },
    text: `nvidia-smi exited with code 15 and said: "Unable to determine the device handle for GPU 0000:02:00.0: ${LOST_SAID}". This means a GPU has fallen off the bus.`,
    expected: [{ busId: '00000000:02:00.0', said: LOST_SAID }],
  },
  {
    name: 'lower-case "gpu" (nvidia-smi -L on an H100 node, 2026)',
    source: {
      file: 'nvsmi-err_device-handle_unknown-error_with-space_2015.txt',
      kind: 'edited',
      how: 'the line as a public fault report (GitHub, 2026-03) quotes nvidia-smi -L: "gpu" in lower case, another bus',
    },
    text: lines('Unable to determine the device handle for gpu 0000:23:00.0: Unknown Error', 'GPU 1: NVIDIA H100 80GB HBM3'),
    expected: [{ busId: '00000000:23:00.0', said: 'Unknown Error' }],
  },
  {
    name: 'the index before the bus id (--query-gpu on the same node)',
    source: {
      file: 'nvsmi-err_device-handle_unknown-error_with-space_2015.txt',
      kind: 'edited',
      how: 'the two lines the same report quotes for nvidia-smi --query-gpu: "GPU0: " and "GPU2: " before the bus ids',
    },
    text: lines('Unable to determine the device handle for GPU0: 0000:23:00.0: Unknown Error', 'Unable to determine the device handle for GPU2: 0000:43:00.0: Unknown Error'),
    expected: [
      { busId: '00000000:23:00.0', said: 'Unknown Error' },
      { busId: '00000000:43:00.0', said: 'Unknown Error' },
    ],
  },
  {
    name: 'its words broken over two lines: the first is what it said',
    source: { file: 'nvsmi-err_device-handle_gpu-is-lost_owod81.txt', kind: 'edited', how: 'broken after "GPU is lost.", as public notes (GitHub, 2026) quote it' },
    text: lines('Unable to determine the device handle for GPU 0000:01:00.0: GPU is lost.', 'Reboot the system to recover this GPU'),
    expected: [{ busId: '00000000:01:00.0', said: 'GPU is lost.' }],
  },
  {
    name: 'the words after the bus id on the next line',
    source: { file: 'nvsmi-err_device-handle_gpu-is-lost_owod81.txt', kind: 'edited', how: 'broken after the bus id: a form nodecompute should not depend on the line staying whole for' },
    text: lines('Unable to determine the device handle for gpu 0000:01:00.0:', LOST_SAID),
    expected: [{ busId: '00000000:01:00.0', said: LOST_SAID }],
  },
  {
    name: 'a bus id that is not one is passed over',
    source: { file: 'nvsmi-err_device-handle_unknown-error_with-space_2015.txt', kind: 'edited', how: 'a three-digit bus number' },
    text: lines('Unable to determine the device handle for GPU 0000:10B:00.0: Unknown Error'),
    expected: [],
  },
  {
    name: 'a failure that names no GPU: none',
    source: { file: 'nvsmi-err_couldnt-communicate_gcp-pr18.txt', kind: 'verbatim' },
    text: lines(
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
    ),
    expected: [],
  },
];

function runCases<T>(t: Test, cases: Array<Case<T>>, parse: (c: Case<T>) => T): void {
  for (const c of cases) {
    t.test(`${c.name} [${c.source.file}]`, async (t) => {
      if ('error' in (c.expected as object)) {
        t.throws(() => parse(c), { code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE', message: (c.expected as { error: RegExp }).error });
      } else {
        t.same(parse(c), c.expected);
      }
    });
  }
}

// --- provenance: re-derive verbatim and columns cases from test/fixtures/samples -------------------

function cutColumns(sample: string, source: Extract<Source, { kind: 'columns' }>): string[] {
  const [header = '', ...rows] = sample.split('\n').filter((line) => line !== '');
  const names = header.split(', ');
  const at = source.columns.map((column) => names.findIndex((name) => name.replace(/ \[.*\]$/, '') === column));
  const pick = (line: string) => {
    const cells = line.split(', ');
    return at.map((i) => (source.units === false ? (cells[i] as string).replace(/ (MiB|%)$/, '') : cells[i])).join(', ');
  };
  return [...(source.header === false ? [] : [pick(header)]), ...rows.map(pick)];
}

t.test('every verbatim and columns case is cut from its sample', async (t) => {
  const all = [...gpuCases, ...appCases, ...versionCases, ...unreachableCases] as Array<Case<unknown>>;
  for (const c of all) {
    const sample = readSample(c.source.file);
    const caseLines = c.text.split('\n').filter((line) => line !== '');
    if (c.source.kind === 'verbatim') {
      const sampleLines = new Set(sample.split('\n'));
      t.ok(caseLines.every((line) => sampleLines.has(line)), `${c.name}: every line is in ${c.source.file}`);
    } else if (c.source.kind === 'columns') {
      t.same(caseLines, cutColumns(sample, c.source), `${c.name}: the columns of ${c.source.file}`);
    } else {
      t.ok(c.source.how.length > 0, `${c.name}: edited from ${c.source.file} (${c.source.how})`);
    }
  }
});

t.test('parseGpuCsv', async (t) => {
  runCases(t, gpuCases, (c) => parseGpuCsv(c.text, c.fields ?? GPU_QUERY_FIELDS));
  t.test('needs index, uuid and name among the fields (a programming error, not nvidia-smi output)', async (t) => {
    t.throws(() => parseGpuCsv('', ['memory.total', 'uuid']), new TypeError('parseGpuCsv needs the fields index, name'));
  });
  t.test('the error says which command to run by hand', async (t) => {
    t.throws(() => parseGpuCsv('garbage\n', WITHOUT_OPTIONAL), {
      message: /Run `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free,pci.bus_id,utilization.gpu --format=csv` by hand/,
    });
  });
});

t.test('parseComputeAppsCsv', async (t) => {
  runCases(t, appCases, (c) => parseComputeAppsCsv(c.text));
});

t.test('parseVersion', async (t) => {
  runCases(t, versionCases, (c) => parseVersion(c.text));
});

t.test('unreachableGpusIn', async (t) => {
  runCases(t, unreachableCases, (c) => unreachableGpusIn(c.text));
});

t.test('canonicalBusId: the query form from the forms nvidia-smi and the kernel write', async (t) => {
  t.equal(canonicalBusId('00000000:83:00.0'), '00000000:83:00.0', 'the query form (the H200 capture) as it is');
  t.equal(canonicalBusId('0000:b3:00.0'), '00000000:B3:00.0', "dmesg's form (https://github.com/NVIDIA/NVSentinel/issues/155)");
  t.equal(canonicalBusId(' 0:3:0.1 '), '00000000:03:00.1', 'short fields padded');
  for (const text of ['', '83:00.0', '0000:83:00', '0000:83:00.8', 'GPU-00000000', '0000:zz:00.0']) t.equal(canonicalBusId(text), null, JSON.stringify(text));
});
