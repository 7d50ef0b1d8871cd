// One shard's engine tail can hold several processes' output: a shard registered by cgroup keeps its
// registration across container restarts, and output posted before the service has seen a restart
// lands in the same tail. The verdict must come from the last run. (Where the text alone cannot tell
// runs apart, the service does, by start times: test/shards/cgroup-restarts.test.ts.)
import t from 'tap';
import { parseLlamaLog } from '../../src/shards/llama-log.js';
import { readSample as sample } from '../helpers/samples.js';

const lines = (...l: string[]): string => `${l.join('\n')}\n`;

/** Runs that ended on the CPU. */
const FAILED: Array<[string, string]> = [
  ['b9692 without cudart (device_info lists only the CPU)', 'llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt'],
  ['cortex.cpp: CUDA init failed, only a CPU buffer', 'llamacpp-log_2024-10_cortex1470_cuda-init-failed_claims-offload_cpu-only-buffer.txt'],
  ['2023: 0/35 layers offloaded', 'llamacpp-log_2023-10_llava_ggml_init_cublas_offloaded-0of35_issue3616.txt'],
];

/** What a restarted llama-server prints at its default verbosity. */
const RESTARTED: Array<[string, string]> = [
  ['b9829+ (verbosity line, no device line)', 'llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt'],
  ['b11146 ("initializing ..." then the verbosity line)', 'llamacpp-server-log_b11146_default-lv3_from-test-literal.txt'],
  ['b9151-b9828 (verbosity line, device_info with CUDA0)', 'llamacpp-server-log_2026-05-17_b9151-b9828-era_default-lv3_device_info.txt'],
  ['b9692 with cudart (device_info with CUDA0)', 'llamacpp-server-log_b9692_cuda-engaged_device_info_from-test-literal.txt'],
];

const B9829 = sample('llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt');
const B11146 = sample('llamacpp-server-log_b11146_default-lv3_from-test-literal.txt');
const B9692_CPU = sample('llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt');
const CUDA_FAILED = 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected';

t.test('the reviewer\'s case: a CPU run, then a restart that says nothing, says nothing', async (t) => {
  t.equal(parseLlamaLog(B9692_CPU)?.backend, 'CPU');
  t.equal(parseLlamaLog(B9692_CPU + B9829), null, 'b9829+ restart');
  t.equal(parseLlamaLog(B9692_CPU + B11146), null, 'b11146 restart');
});

t.test('a failed run, then a restart: the restart\'s verdict', async (t) => {
  for (const [failedName, failed] of FAILED) {
    t.equal(parseLlamaLog(sample(failed))?.backend, 'CPU', `${failedName} alone`);
    for (const [restartName, restarted] of RESTARTED) {
      t.same(parseLlamaLog(sample(failed) + sample(restarted)), parseLlamaLog(sample(restarted)), `${failedName}, then ${restartName}`);
    }
  }
});

t.test('a restart, then a failed run: the failed run\'s verdict', async (t) => {
  for (const [restartName, restarted] of RESTARTED) {
    for (const [failedName, failed] of FAILED) {
      t.same(parseLlamaLog(sample(restarted) + sample(failed)), parseLlamaLog(sample(failed)), `${restartName}, then ${failedName}`);
    }
  }
});

t.test('one process\'s own start-up lines stay one run', async (t) => {
  // Order of a b11146-era server on a machine without a usable GPU (public file 70294305779):
  // the CUDA failure comes between "initializing ..." and the verbosity line.
  t.same(
    parseLlamaLog(
      lines(
        '0.00.001.606 I srv  llama_server: initializing ...',
        `0.00.070.233 E ${CUDA_FAILED}`,
        '0.00.071.310 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)',
        "0.00.075.674 I srv    load_model: loading model '/models/qwen2.5-coder-1.5b-instruct-q8_0.gguf'",
        '0.01.030.409 I srv  llama_server: model loaded',
      ),
    ),
    parseLlamaLog(lines(CUDA_FAILED)),
    'CUDA failure before the verbosity line',
  );
  // The no-GPU warning is printed while arguments are parsed, before the verbosity line.
  t.match(
    parseLlamaLog(lines('warning: no usable GPU found, --gpu-layers option will be ignored', B9829)),
    { backend: 'CPU', evidence: 'warning: no usable GPU found, --gpu-layers option will be ignored' },
    'no-GPU warning before the verbosity line',
  );
  // -lv 4 start of a b10549 server (public file 69588799766, trimmed by its author): a build line
  // (not a verbosity line) and the verbosity line, then this process's own devices and weights.
  const lv4 = lines(
    '0.00.126.310 I cmn  common_param: common_params_print_info: build 10549 (b2e5e9b28) with Clang 20.1.8 for Windows x86_64',
    '0.00.126.315 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)',
    '0.00.126.316 I cmn  common_param: device_info:',
    '0.00.128.116 I cmn  common_param:   - Vulkan0 : AMD Radeon RX 7900 XTX (24560 MiB, 22033 MiB free)',
    '0.00.129.683 I cmn  common_param:   - CPU     : AMD Ryzen 9 7900X 12-Core Processor             (64660 MiB, 24864 MiB free)',
    '0.00.129.722 I cmn  common_param: system_info: n_threads = 12 (n_threads_batch = 12) / 24 | CPU : SSE3 = 1',
    '0.00.129.759 I srv          init: running without SSL',
    '0.00.626.826 I load_tensors: offloaded 0/37 layers to GPU',
    '0.00.626.829 I load_tensors:   CPU_Mapped model buffer size =  2375.91 MiB',
    '0.00.630.726 I llama_context: n_ctx                 = 4096',
  );
  t.match(parseLlamaLog(lv4), { backend: 'CPU', layersOffloaded: 0, layersTotal: 37 }, '-lv 4: build and verbosity lines, then model loading');
  const cuda = sample('llamacpp-server-log_2026-05-17_b9151-b9828-era_default-lv3_device_info.txt');
  t.same(parseLlamaLog(cuda + lv4), parseLlamaLog(lv4), 'the same, after an earlier run on CUDA0');
});

t.test('a restart whose CUDA fails before its verbosity line', async (t) => {
  const good = sample('llamacpp-server-log_2026-05-17_b9151-b9828-era_default-lv3_device_info.txt');
  t.equal(parseLlamaLog(good)?.backend, 'CUDA');
  const earlier: Array<[string, string]> = [
    ['after a b9151-era run on CUDA0', good],
    ['after a b9829+ run', B9829],
  ];
  for (const [name, before] of earlier) {
    t.match(parseLlamaLog(before + lines(`0.00.070.233 E ${CUDA_FAILED}`) + B9829), { backend: 'CPU', evidence: CUDA_FAILED }, name);
  }
});

t.test('a run that got no further than CUDA init cannot be told from the next process\'s own by the text', async (t) => {
  const noDevices = sample('llamacpp-log_2024-03_issue6184_no-cuda-devices-found_quoted.txt');
  // So a cgroup shard's new run, posted after the old one's, reads CPU here. The service dates each
  // tail from its first post: once a snapshot shows every process of the shard started after that,
  // the account is set aside (a mixed tail too) and the next post begins a new tail (the restart
  // tests in cgroup-restarts.test.ts). A re-registration for the new run drops the old tail at once.
  t.equal(parseLlamaLog(noDevices + B9829)?.backend, 'CPU', 'a verbosity line after CUDA init belongs to the same process');
  t.equal(parseLlamaLog(noDevices + B11146), null, '"initializing ..." is printed before CUDA init: a new process');
});

t.test('each once-only start-up line starts a new run when it comes again', async (t) => {
  const cudaInfo = lines('device_info:', '  - CUDA0   : NVIDIA H200 (143771 MiB, 143000 MiB free)', '  - CPU     : x (1 MiB, 1 MiB free)');
  const cpuInfo = lines('device_info:', '  - CPU     : x (1 MiB, 1 MiB free)', 'system_info: n_threads = 4');
  t.equal(parseLlamaLog(cpuInfo + cudaInfo)?.backend, 'CUDA', 'device_info');
  t.equal(parseLlamaLog(cudaInfo + cpuInfo)?.backend, 'CPU', 'device_info, the other way round');
  t.equal(parseLlamaLog(lines('Available devices:', 'Available devices:', '  CUDA0: a (2 MiB, 1 MiB free)'))?.backend, 'CUDA', '--list-devices');
  t.equal(parseLlamaLog(B11146 + lines(CUDA_FAILED) + B11146), null, '"initializing ..."');
  t.equal(parseLlamaLog(lines(CUDA_FAILED, 'log_info: verbosity = 3 (adjust with the `-lv N` CLI arg)', 'log_info: verbosity = 3')), null, 'the verbosity line');
});

t.test('start-up lines are found behind prefixes', async (t) => {
  const unknown = (text: string) =>
    text
      .split('\n')
      .map((line) => (line === '' ? line : `shard-7 stderr | ${line}`))
      .join('\n');
  const journald = (text: string) =>
    text
      .split('\n')
      .map((line) => (line === '' ? line : `Jan 30 09:13:15 gpu-node-7 llama-server[5307]: ${line}`))
      .join('\n');
  for (const [name, wrap] of [
    ['unknown prefix, re-anchored at the function name', unknown],
    ['journald', journald],
  ] as const) {
    t.equal(parseLlamaLog(B9692_CPU + wrap(B9829)), null, `${name}: b9829+ restart`);
    t.equal(parseLlamaLog(B9692_CPU + wrap(B11146)), null, `${name}: b11146 restart`);
  }
});
