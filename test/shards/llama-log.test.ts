import fc from 'fast-check';
import t from 'tap';
import { appendTail, ENGINE_TAIL_MAX_BYTES } from '../../src/shards/engine-output.js';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import { parseLlamaLog, showsGpuWeights } from '../../src/shards/llama-log.js';
import { readSample as sample, sampleNames } from '../helpers/samples.js';

const LLAMA_SAMPLES = sampleNames().filter((file) => file.startsWith('llamacpp-'));

const NOT_CONFIRMED = 'but printed no model buffer line, so weights on the GPU are not confirmed';

/** Every llama.cpp sample, with what the engine said in it (null: nothing about where it computes). */
const sampleCases: Array<{ file: string; why: string; expected: EngineAccount | null }> = [
  {
    file: 'llamacpp-list-devices_b11146_b10964_from-test-literal.txt',
    why: '--list-devices naming a CUDA device: present, weights unknown',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 4060 Laptop GPU (8187 MiB)'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence: 'Available devices: CUDA0: NVIDIA GeForce RTX 4060 Laptop GPU (8187 MiB, 7099 MiB free)',
      summary: `llama.cpp found CUDA0 ${NOT_CONFIRMED}`,
    },
  },
  {
    file: 'llamacpp-log_2023-10_llava_ggml_init_cublas_offloaded-0of35_issue3616.txt',
    why: 'two CUDA devices found, but 0/35 layers and 0 MB VRAM: the weights are on the CPU',
    expected: {
      backend: 'CPU',
      devices: [],
      layersOffloaded: 0,
      layersTotal: 35,
      gpuBackendLoaded: true,
      evidence: 'llm_load_tensors: offloaded 0/35 layers to GPU | llm_load_tensors: VRAM used: 0.00 MB',
      summary: 'llama.cpp offloaded no layers to the GPU (llm_load_tensors: offloaded 0/35 layers to GPU)',
    },
  },
  {
    file: 'llamacpp-log_2023-10_issue3764_offloaded-0of43_total-vram-context.txt',
    why: '"offloaded 0/43" outweighs a later "total VRAM used" (context buffers, no model)',
    expected: {
      backend: 'CPU',
      devices: [],
      layersOffloaded: 0,
      layersTotal: 43,
      gpuBackendLoaded: true,
      evidence: 'llm_load_tensors: offloaded 0/43 layers to GPU | llm_load_tensors: VRAM used: 0.00 MB',
      summary: 'llama.cpp offloaded no layers to the GPU (llm_load_tensors: offloaded 0/43 layers to GPU)',
    },
  },
  {
    file: 'llamacpp-log_2023-12_ollama1341_ggml_init_cublas_2gpu_vram-used.txt',
    why: '2023 format: "VRAM used" > 0 after CUDA devices were found is that era\'s proof',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 3090', 'CUDA1: NVIDIA GeForce RTX 3090'],
      layersOffloaded: 43,
      layersTotal: 43,
      gpuBackendLoaded: true,
      evidence: 'llm_load_tensors: VRAM used: 6936.01 MiB',
      summary: 'llama.cpp reported 6936.01 MiB of VRAM used on CUDA0 and CUDA1 and offloaded 43/43 layers',
    },
  },
  {
    file: 'llamacpp-log_2023-12_pr4606_server_ggml_init_cublas_vmm.txt',
    why: 'ggml_init_cublas found two devices (VMM form), no load lines',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: Tesla V100S-PCIE-32GB', 'CUDA1: Tesla P40'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence:
        'ggml_init_cublas: found 2 CUDA devices: | Device 0: Tesla V100S-PCIE-32GB, compute capability 7.0, VMM: yes | Device 1: Tesla P40, compute capability 6.1, VMM: yes',
      summary: `llama.cpp found CUDA0 and CUDA1 ${NOT_CONFIRMED}`,
    },
  },
  {
    file: 'llamacpp-log_2024-01_ollama2266_journald_llm_load_tensors_multi-cuda.txt',
    why: 'journald prefixes; CUDA0 and CUDA1 buffers (the excerpt ends inside the buffer block)',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0', 'CUDA1'],
      layersOffloaded: 33,
      layersTotal: 33,
      gpuBackendLoaded: true,
      evidence: 'llm_load_tensors: CUDA0 buffer size = 4695.56 MiB | llm_load_tensors: CUDA1 buffer size = 3912.97 MiB',
      summary: 'llama.cpp put its model buffers on CUDA0 and CUDA1 and offloaded 33/33 layers',
    },
  },
  {
    file: 'llamacpp-log_2024-03_issue6184_no-cuda-devices-found_quoted.txt',
    why: 'no CUDA devices found',
    expected: {
      backend: 'CPU',
      devices: [],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: false,
      evidence: 'ggml_cuda_init: no CUDA devices found, CUDA will be disabled',
      summary: 'llama.cpp found no usable GPU (ggml_cuda_init: no CUDA devices found, CUDA will be disabled)',
    },
  },
  {
    file: 'llamacpp-log_2024-10_cortex1470_cuda-init-failed_claims-offload_cpu-only-buffer.txt',
    why: 'claims 13/33 offloaded, but CUDA init failed and only a CPU buffer exists',
    expected: {
      backend: 'CPU',
      devices: [],
      layersOffloaded: 13,
      layersTotal: 33,
      gpuBackendLoaded: false,
      evidence:
        'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected | llm_load_tensors: CPU buffer size = 8137.64 MiB',
      summary:
        'llama.cpp found no usable GPU (ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected) although it reported 13/33 layers offloaded',
    },
  },
  {
    file: 'llamacpp-log_2024_llamafile552_ggml_cuda_init_llm_load_tensors.txt',
    why: '2024 format: CUDA0 buffer after ggml_cuda_init; KV and compute buffers do not count',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 4080'],
      layersOffloaded: 31,
      layersTotal: 31,
      gpuBackendLoaded: true,
      evidence: 'llm_load_tensors: CUDA0 buffer size = 7317.71 MiB',
      summary: 'llama.cpp put its model buffers on CUDA0 and offloaded 31/31 layers',
    },
  },
  {
    file: 'llamacpp-log_2025_ci_prefix-timestamps_load_tensors.txt',
    why: '--log-prefix --log-timestamps lines',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0'],
      layersOffloaded: 13,
      layersTotal: 13,
      gpuBackendLoaded: true,
      evidence: 'load_tensors: CUDA0 model buffer size = 40.73 MiB',
      summary: 'llama.cpp put its model buffers on CUDA0 and offloaded 13/13 layers',
    },
  },
  {
    file: 'llamacpp-log_2025_load_tensors_cuda0_cpu_48of48.txt',
    why: 'CUDA0 model buffer then a CPU one: the CPU buffer is the embedding table, not a fallback',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0'],
      layersOffloaded: 48,
      layersTotal: 48,
      gpuBackendLoaded: true,
      evidence: 'load_tensors: CUDA0 model buffer size = 63980.86 MiB',
      summary: 'llama.cpp put its model buffers on CUDA0 and offloaded 48/48 layers',
    },
  },
  {
    file: 'llamacpp-log_2026-03_pr20184_UNMERGED-format_ggml_cuda_init_total-vram.txt',
    why: 'unmerged "CUDA0: NAME (T MiB, F MiB free)" enumeration and the shipped `using device` line with a PCI id',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 4070 Laptop GPU (7805 MiB)'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence:
        'ggml_cuda_init: found 1 CUDA devices (Total VRAM: 7805 MiB): | CUDA0: NVIDIA GeForce RTX 4070 Laptop GPU (7805 MiB, 7546 MiB free) | llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4070 Laptop GPU) (0000:01:00.0) - 7546 MiB free',
      summary: `llama.cpp found CUDA0 ${NOT_CONFIRMED}`,
    },
  },
  {
    file: 'llamacpp-log_2026_llama-bench_2gpus_total-vram.txt',
    why: '"(Total VRAM: ...)" header and per-device VRAM',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 2060 (11833 MiB)', 'CUDA1: Quadro M1200 (4035 MiB)'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence:
        'ggml_cuda_init: found 2 CUDA devices (Total VRAM: 15868 MiB): | Device 0: NVIDIA GeForce RTX 2060, compute capability 7.5, VMM: yes, VRAM: 11833 MiB | Device 1: Quadro M1200, compute capability 5.0, VMM: yes, VRAM: 4035 MiB',
      summary: `llama.cpp found CUDA0 and CUDA1 ${NOT_CONFIRMED}`,
    },
  },
  {
    file: 'llamacpp-log_b8783_llama-cli_win_ggml_cuda_init_total-vram_load_backend.txt',
    why: 'Windows llama-cli: device found; load_backend lines add nothing',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 3080 (10239 MiB)'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence:
        'ggml_cuda_init: found 1 CUDA devices (Total VRAM: 10239 MiB): | Device 0: NVIDIA GeForce RTX 3080, compute capability 8.6, VMM: yes, VRAM: 10239 MiB',
      summary: `llama.cpp found CUDA0 ${NOT_CONFIRMED}`,
    },
  },
  {
    file: 'llamacpp-lv5_load_tensors_plus_nvsmi-compute-apps.txt',
    why: 'CPU_Mapped before CUDA0 in the block; the prose mentioning "ROCm0 buffer" is not a log line',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0'],
      layersOffloaded: 29,
      layersTotal: 29,
      gpuBackendLoaded: true,
      evidence: 'load_tensors: CUDA0 model buffer size = 603.87 MiB',
      summary: 'llama.cpp put its model buffers on CUDA0 and offloaded 29/29 layers',
    },
  },
  {
    file: 'llamacpp-server-log_2026-05-17_b9151-b9828-era_default-lv3_device_info.txt',
    why: 'docker + llama.cpp prefixes; device_info lists CUDA0 then CPU',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 5090 (32606 MiB)'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence: 'device_info: - CUDA0 : NVIDIA GeForce RTX 5090 (32606 MiB, 30930 MiB free)',
      summary: `llama.cpp found CUDA0 ${NOT_CONFIRMED}`,
    },
  },
  {
    file: 'llamacpp-server-log_2026_b9829plus-era_default-lv3_no-device-lines.txt',
    why: 'b9829+ default verbosity prints no device line: no statement, not CPU',
    expected: null,
  },
  {
    file: 'llamacpp-server-log_b11146_default-lv3_from-test-literal.txt',
    why: 'b11146 default verbosity on a working GPU: no statement',
    expected: null,
  },
  {
    file: 'llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt',
    why: 'CUDA build without cudart: device_info lists only the CPU',
    expected: {
      backend: 'CPU',
      devices: [],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: false,
      evidence: 'device_info: - CPU : 13th Gen Intel(R) Core(TM) i9-13900HX (32487 MiB, 22489 MiB free)',
      summary:
        'llama.cpp saw no GPU device, only the CPU (device_info: - CPU : 13th Gen Intel(R) Core(TM) i9-13900HX (32487 MiB, 22489 MiB free))',
    },
  },
  {
    file: 'llamacpp-server-log_b9692_cuda-engaged_device_info_from-test-literal.txt',
    why: 'same binary with cudart: device_info lists CUDA0',
    expected: {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 4060 Laptop GPU (8187 MiB)'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence: 'device_info: - CUDA0 : NVIDIA GeForce RTX 4060 Laptop GPU (8187 MiB, 7099 MiB free)',
      summary: `llama.cpp found CUDA0 ${NOT_CONFIRMED}`,
    },
  },
];

t.test('every llama.cpp sample has a case', async (t) => {
  t.same([...new Set(sampleCases.map((c) => c.file))].sort(), [...LLAMA_SAMPLES].sort());
});

for (const { file, why, expected } of sampleCases) {
  t.test(`${file}: ${why}`, async (t) => {
    t.same(parseLlamaLog(sample(file)), expected);
  });
}

t.test('weights shown on a GPU: a CUDA buffer line or the 2023 "VRAM used", never CUDA merely found, nor a host buffer', async (t) => {
  const shown = LLAMA_SAMPLES.filter((file) => {
    const account = parseLlamaLog(sample(file));
    return account !== null && showsGpuWeights(account);
  });
  t.same(shown.sort(), [
    'llamacpp-log_2023-12_ollama1341_ggml_init_cublas_2gpu_vram-used.txt',
    'llamacpp-log_2024-01_ollama2266_journald_llm_load_tensors_multi-cuda.txt',
    'llamacpp-log_2024_llamafile552_ggml_cuda_init_llm_load_tensors.txt',
    'llamacpp-log_2025_ci_prefix-timestamps_load_tensors.txt',
    'llamacpp-log_2025_load_tensors_cuda0_cpu_48of48.txt',
    'llamacpp-lv5_load_tensors_plus_nvsmi-compute-apps.txt',
  ]);
  // A CPU account whose evidence is a buffer line: every model buffer in host memory.
  const host = parseLlamaLog('llama_model_loader: loaded meta data\nload_tensors:   CPU_Mapped model buffer size =  4685.30 MiB\nllama_context: n_ctx = 4096\n');
  t.match(host, { backend: 'CPU', evidence: 'load_tensors: CPU_Mapped model buffer size = 4685.30 MiB' });
  t.equal(showsGpuWeights(host!), false);
});

t.test('samples read the same through CRLF, journald, ISO, Kubernetes (CRI), docker compose, [epoch] and ANSI prefixes', async (t) => {
  const same = (line: string) => line;
  const wrappers: Array<[string, (line: string, i: number) => string, string]> = [
    ['CRLF', same, '\r\n'],
    ['lone CR', same, '\r'],
    ['journald', (line, i) => `Jan  5 12:00:${String(i % 60).padStart(2, '0')} gpu-node-7 ollama[123]: ${line}`, '\n'],
    ['journald short-iso', (line) => `2024-01-30T09:13:15+0000 gpu-node-7 ollama[5307]: ${line}`, '\n'],
    ['ISO + docker pipe', (line) => `2026-05-17 10:44:25.389 | ${line}`, '\n'],
    ['docker compose', (line) => `llamacpp-server-1  | ${line}`, '\n'],
    ['Kubernetes (CRI)', (line, i) => cri(i % 2 ? 'stdout' : 'stderr', 'F', line, `2026-05-17T10:44:25.${String(i).padStart(9, '0')}Z`), '\n'],
    ['[epoch] stamp', (line) => `[1706570000] ${line}`, '\n'],
    ['[tag]::Level:', (line) => `2024-10-11T12:45:53.660Z [CORTEX]::Error: ${line}`, '\n'],
    ['llama.cpp timestamp + level', (line) => `0.00.316.463 I ${line}`, '\n'],
    ['ANSI colours', (line) => `\u001b[32mI\u001b[0m \u001b[1m${line}\u001b[0m`, '\n'],
  ];
  for (const { file, expected } of sampleCases) {
    // Every sample ends with a newline: wrap the lines before it, keep it.
    const body = sample(file).split('\n').slice(0, -1);
    for (const [name, wrap, eol] of wrappers) {
      t.same(parseLlamaLog(body.map(wrap).join(eol) + eol), expected, `${file} with ${name}`);
    }
  }
});

const lines = (...l: string[]): string => `${l.join('\n')}\n`;

/** A CRI log record, as the container runtime writes it under /var/log/pods. */
const cri = (stream: 'stdout' | 'stderr', tag: 'F' | 'P', text: string, at = '2026-05-17T10:44:25.389123456Z') => `${at} ${stream} ${tag} ${text}`;

t.test("Kubernetes' container log records (CRI): a line the runtime cut into P records reads as the engine wrote it, per stream", async (t) => {
  for (const { file, expected } of sampleCases) {
    const body = sample(file).split('\n').slice(0, -1);
    // Each line in pieces of 5 characters (conmon writes what each read of the pipe got).
    const records = body.flatMap((line) => {
      const pieces = line.match(/.{1,5}/g) ?? [''];
      return pieces.map((piece, i) => cri('stderr', i === pieces.length - 1 ? 'F' : 'P', piece));
    });
    t.same(parseLlamaLog(lines(...records)), expected, `${file}, cut into pieces`);
  }

  const device = '  - CPU     : 13th Gen Intel(R) Core(TM) i9-13900HX (32487 MiB, 22489 MiB free)';
  const header = cri('stderr', 'F', 'device_info:');
  t.match(parseLlamaLog(lines(header, cri('stderr', 'P', device.slice(0, 30), '2026-05-17T12:44:25.389+02:00'), cri('stderr', 'F', device.slice(30)), cri('stderr', 'F', 'x'))), {
    backend: 'CPU',
    evidence: 'device_info: - CPU : 13th Gen Intel(R) Core(TM) i9-13900HX (32487 MiB, 22489 MiB free)',
  }, 'a time with an offset, and a record joined to the next of its stream');
  t.equal(parseLlamaLog(lines(cri('stderr', 'P', 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device'))), null, 'a piece the text ends with is half a line: not read yet');
  t.match(
    parseLlamaLog(lines(header, `2026-05-17T10:44:25Z stderr F:x1 ${device}`, '2026-05-17T10:44:25Z stdout F', cri('stderr', 'F', 'x'))),
    { backend: 'CPU' },
    'a tag after the colon, a time without fractions, and an empty record (an empty line, which ends the block)',
  );
  const failed = 'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected';
  t.equal(
    parseLlamaLog(lines(cri('stderr', 'P', 'x'.repeat(3000)), cri('stderr', 'P', 'y'.repeat(3000)), cri('stderr', 'F', failed))),
    null,
    'the end of a line past 4 KiB is not read as a line of its own',
  );
  t.match(
    parseLlamaLog(lines(header, cri('stdout', 'P', 'srv  log_server_r: request: GET /hea'), cri('stderr', 'F', device), cri('stdout', 'F', 'lth 127.0.0.1 200'), cri('stderr', 'F', 'x'))),
    { backend: 'CPU' },
    "a line of one stream cut mid-line does not run into the other stream's",
  );
});

t.test('synthetic prefixes', async (t) => {
  const buffer = 'load_tensors: CUDA0 model buffer size = 1024.00 MiB';
  const cases: Array<[string, string]> = [
    ['unknown prefix, re-anchored at the function name', `myapp | 12:00:00 stderr: ${buffer}`],
    ['llama-server module tag', `0.01.000.000 I lmd ${buffer}`],
    ['stacked prefixes', `Jan 30 09:13:15 host ollama[1]: [1706570000] 2024-01-30 09:13:15 0.00.000.001 W ${buffer}`],
    ['tabs and repeated spaces', `load_tensors:\t\t   CUDA0   model buffer size =\t1024.00 MiB  `],
  ];
  for (const [name, line] of cases) {
    const account = parseLlamaLog(lines(line));
    t.equal(account?.backend, 'CUDA', name);
    t.equal(account?.evidence, buffer, name);
  }
  t.equal(parseLlamaLog(lines(`${'[x] '.repeat(12)}${buffer}`))?.backend, 'CUDA', 'prefixes past the strip limit are found by the function name');
  t.same(
    parseLlamaLog(lines('0.00.460.559 I cmn device_info:', '0.00.621.607 I cmn   - CUDA0   : NVIDIA H200 (143771 MiB, 143000 MiB free)', 'x'))
      ?.devices,
    ['CUDA0: NVIDIA H200 (143771 MiB)'],
    'module tags before device_info lines',
  );
  t.equal(parseLlamaLog(lines(`${'x'.repeat(5000)} ${buffer}`)), null, 'lines over 4 KiB are not read');
});

t.test('docker compose logs: a "service-1  | " prefix before every line', async (t) => {
  // public file 23230519965 (a README quoting `docker compose logs` of a llama.cpp CUDA image, 2024 build)
  const compose = lines(
    'llamacpp-server-1  | ggml_cuda_init: found 1 CUDA devices:',
    'llamacpp-server-1  |   Device 0: NVIDIA T600 Laptop GPU, compute capability 7.5, VMM: yes',
    'llamacpp-server-1  | llm_load_tensors: ggml ctx size =    0.27 MiB',
    'llamacpp-server-1  | llm_load_tensors: offloading 12 repeating layers to GPU',
    'llamacpp-server-1  | llm_load_tensors: offloaded 12/33 layers to GPU',
    'llamacpp-server-1  | llm_load_tensors:        CPU buffer size =  4169.52 MiB',
    'llamacpp-server-1  | llm_load_tensors:      CUDA0 buffer size =  2362.81 MiB',
  );
  t.same(parseLlamaLog(compose), {
    backend: 'CUDA',
    devices: ['CUDA0: NVIDIA T600 Laptop GPU'],
    layersOffloaded: 12,
    layersTotal: 33,
    gpuBackendLoaded: true,
    evidence: 'llm_load_tensors: CUDA0 buffer size = 2362.81 MiB',
    summary: 'llama.cpp put its model buffers on CUDA0 and offloaded 12/33 layers',
  });
  // edited: the b9692 CUDA-DLL-missing sample (llamacpp-server-log_b9692_cuda-dll-missing_...) behind
  // the same compose prefix; without it nothing here starts with a known function name.
  const cpuOnly = sample('llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt')
    .split('\n')
    .slice(0, -1)
    .map((line) => `llamacpp-server-1  | ${line}`)
    .join('\n');
  t.same(
    parseLlamaLog(`${cpuOnly}\n`),
    parseLlamaLog(sample('llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt')),
    'a CUDA build that fell back to the CPU is told behind the prefix too',
  );
  t.match(parseLlamaLog(`${cpuOnly}\n`), { backend: 'CPU', gpuBackendLoaded: false });
  // public file 25378562007 (ggml-org/ci, llama-embedding -ngl 99 on a CPU build), behind the prefix (edited)
  t.match(
    parseLlamaLog(lines('llama-1  | warning: no usable GPU found, --gpu-layers option will be ignored', 'llama-1  | warning: one possible reason is that llama.cpp was compiled without GPU support')),
    { backend: 'CPU', evidence: 'warning: no usable GPU found, --gpu-layers option will be ignored' },
  );
});

t.test('a "no usable GPU found" warning printed before the same process found its CUDA devices is not CPU evidence', async (t) => {
  // https://github.com/ggml-org/llama.cpp/issues/22748 (b9049 llama-server, router child [58713]: the
  // warning comes from argument parsing, before the CUDA backend was loaded; "-ngl" was not ignored and
  // the GPU was used, see also issue 22778 and PR 22790)
  const b9049 = lines(
    '[58713] warning: no usable GPU found, --gpu-layers option will be ignored',
    '[58713] warning: one possible reason is that llama.cpp was compiled without GPU support',
    '[58713] warning: consult docs/build.md for compilation instructions',
    '[58713] main: n_parallel is set to auto, using n_parallel = 4 and kv_unified = true',
    '[58713] ggml_cuda_init: found 1 CUDA devices (Total VRAM: 8150 MiB):',
    '[58713]   Device 0: NVIDIA GeForce RTX 5060 Laptop GPU, compute capability 12.0, VMM: yes, VRAM: 8150 MiB',
    '[58713] load_backend: loaded CUDA backend from C:\\Apps\\llamacpp\\ggml-cuda.dll',
    '[58713] load_backend: loaded RPC backend from C:\\Apps\\llamacpp\\ggml-rpc.dll',
    '[58713] load_backend: loaded CPU backend from C:\\Apps\\llamacpp\\ggml-cpu-alderlake.dll',
    '[58713] build_info: b9049-2496f9c14',
  );
  t.same(parseLlamaLog(b9049), {
    backend: 'CUDA',
    devices: ['CUDA0: NVIDIA GeForce RTX 5060 Laptop GPU (8150 MiB)'],
    layersOffloaded: null,
    layersTotal: null,
    gpuBackendLoaded: true,
    evidence:
      'ggml_cuda_init: found 1 CUDA devices (Total VRAM: 8150 MiB): | Device 0: NVIDIA GeForce RTX 5060 Laptop GPU, compute capability 12.0, VMM: yes, VRAM: 8150 MiB',
    summary: `llama.cpp found CUDA0 ${NOT_CONFIRMED}`,
  });
  // Other CPU evidence of that run still counts (edited: the same run, then no layers offloaded).
  t.match(parseLlamaLog(b9049 + lines('load_tensors: offloaded 0/33 layers to GPU')), {
    backend: 'CPU',
    gpuBackendLoaded: true,
    evidence: 'load_tensors: offloaded 0/33 layers to GPU',
  });
  // The warning with no CUDA device found in its run still says CPU (ggml-org/ci, CPU build: public file 25378562007).
  t.match(parseLlamaLog(lines('warning: no usable GPU found, --gpu-layers option will be ignored')), { backend: 'CPU', gpuBackendLoaded: false });
});

t.test('b10145 prints device_info under its function name: "cmn  common_param: device_info:"', async (t) => {
  // public file 59756353065 (a Rust test of a llama-server sidecar: a CPU-only build, "observed, not assumed")
  const cpuOnly = [
    '0.00.057.089 I cmn  common_param: device_info:',
    '0.00.057.093 I cmn  common_param:   - CPU     : INTEL(R) XEON(R) GOLD 6530 (773849 MiB, 773849 MiB free)',
    '0.00.876.628 I load_tensors:   CPU_Mapped model buffer size =  2862.99 MiB',
    '0.05.859.504 I srv  llama_server: model loaded',
  ];
  t.same(parseLlamaLog(lines(...cpuOnly)), {
    backend: 'CPU',
    devices: [],
    layersOffloaded: null,
    layersTotal: null,
    gpuBackendLoaded: false,
    evidence:
      'device_info: - CPU : INTEL(R) XEON(R) GOLD 6530 (773849 MiB, 773849 MiB free) | load_tensors: CPU_Mapped model buffer size = 2862.99 MiB',
    summary: 'llama.cpp saw no GPU device, only the CPU (device_info: - CPU : INTEL(R) XEON(R) GOLD 6530 (773849 MiB, 773849 MiB free))',
  });
  t.match(parseLlamaLog(lines(cpuOnly[0] as string, cpuOnly[1] as string, cpuOnly[3] as string)), { backend: 'CPU', gpuBackendLoaded: false }, 'the device table alone');
  // Same file, "verbatim from the vendored b10145": a Metal device is neither CUDA nor CPU.
  t.equal(
    parseLlamaLog(
      lines(
        '0.00.070.257 I cmn  common_param: device_info:',
        '0.00.070.265 I cmn  common_param:   - MTL0    : Apple M1 Pro (25559 MiB, 25558 MiB free)',
        '0.00.070.265 I cmn  common_param:   - BLAS    : Accelerate (0 MiB, 0 MiB free)',
        '0.00.532.412 I llama_prepare_model_devices: using device MTL0 (Apple M1 Pro) (unknown id) - 25558 MiB free',
        '0.02.399.687 I srv  llama_server: model loaded',
      ),
    ),
    null,
  );
  // edited: the same table on a CUDA node (the b9151 sample's CUDA0 line under b10145's prefix)
  t.same(
    parseLlamaLog(
      lines(
        '0.00.061.002 I cmn  common_param: device_info:',
        '0.00.061.010 I cmn  common_param:   - CUDA0   : NVIDIA GeForce RTX 5090 (32606 MiB, 30930 MiB free)',
        '0.00.061.020 I cmn  common_param:   - CPU     : AMD Ryzen 9 5950X 16-Core Processor (64297 MiB, 64297 MiB free)',
      ),
    )?.devices,
    ['CUDA0: NVIDIA GeForce RTX 5090 (32606 MiB)'],
  );
});

t.test('weights on CUDA outweigh everything else in the same run', async (t) => {
  const account = parseLlamaLog(
    lines(
      'warning: no usable GPU found, --gpu-layers option will be ignored',
      'load_tensors: offloaded 0/33 layers to GPU',
      'load_tensors: CUDA0 model buffer size = 10.00 MiB',
      'load_tensors: CUDA1 model buffer size = 10.00 MiB',
      'load_tensors: CUDA2 model buffer size = 10.00 MiB',
      'load_tensors: CUDA3 model buffer size = 10.00 MiB',
      'load_tensors: CUDA4 model buffer size = 10.00 MiB',
      'load_tensors: CUDA10 model buffer size = 0.00 MiB',
    ),
  );
  t.same(account?.devices, ['CUDA0', 'CUDA1', 'CUDA2', 'CUDA3', 'CUDA4'], 'a 0 MiB buffer holds no weights');
  t.equal(account?.summary, 'llama.cpp put its model buffers on CUDA0, CUDA1, CUDA2, CUDA3 and CUDA4 and offloaded 0/33 layers');
  t.match(account?.evidence, /CUDA3 model buffer size = 10\.00 MiB \| \+1 more$/);
  const plain = parseLlamaLog(lines('llm_load_tensors: CUDA0 buffer size = 5.00 MiB'));
  t.equal(plain?.summary, 'llama.cpp put its model buffers on CUDA0', 'no layer count printed');
  t.equal(plain?.layersOffloaded, null);
});

t.test('a later run replaces an earlier one', async (t) => {
  const good = ['ggml_cuda_init: found 1 CUDA devices:', '  Device 0: NVIDIA L40S, compute capability 8.9, VMM: yes', 'load_tensors: CUDA0 model buffer size = 100.00 MiB', 'x'];
  const bad = ['ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected', 'load_tensors: offloaded 33/33 layers to GPU', 'load_tensors: CPU_Mapped model buffer size = 100.00 MiB', 'x'];
  t.equal(parseLlamaLog(lines(...good, ...bad))?.backend, 'CPU', 'restarted without its GPU');
  t.equal(parseLlamaLog(lines(...bad, ...good))?.backend, 'CUDA', 'restarted with its GPU');
  const afterRestart = parseLlamaLog(lines(...good, 'ggml_cuda_init: found 2 CUDA devices:'));
  t.same(afterRestart?.devices, ['CUDA0', 'CUDA1'], 'devices come from the header when the device lines are cut off');
  t.match(afterRestart?.summary, /^llama\.cpp found CUDA0 and CUDA1 but/);
  t.same(
    parseLlamaLog(lines('load_tensors: offloaded 0/33 layers to GPU', 'warning: no usable GPU found')),
    parseLlamaLog(lines('warning: no usable GPU found')),
    'an init line after loading began starts a new run',
  );
  t.same(
    parseLlamaLog(lines('load_tensors: offloaded 0/33 layers to GPU', 'Available devices:', '  CUDA0: NVIDIA A100 (81000 MiB, 80000 MiB free)'))?.layersOffloaded,
    null,
    'the layer count of the earlier run is gone',
  );
});

t.test('CPU evidence', async (t) => {
  const cases: Array<[string, string, Partial<EngineAccount>]> = [
    [
      'build without GPU support (older wording)',
      lines('warning: not compiled with GPU offload support, --gpu-layers option will be ignored', 'warning: see main README.md for information on enabling GPU BLAS support'),
      { backend: 'CPU', evidence: 'warning: not compiled with GPU offload support, --gpu-layers option will be ignored' },
    ],
    [
      'no usable GPU, then only a CPU_Mapped buffer (CI of a CPU build)',
      lines(
        'warning: no usable GPU found, --gpu-layers option will be ignored',
        '0.00.022.204 I load_tensors: loading model tensors, this can take a while... (mmap = true)',
        '0.00.026.668 I load_tensors:   CPU_Mapped model buffer size =    63.84 MiB',
        '...............................................',
      ),
      {
        backend: 'CPU',
        layersOffloaded: null,
        evidence: 'warning: no usable GPU found, --gpu-layers option will be ignored | load_tensors: CPU_Mapped model buffer size = 63.84 MiB',
        summary: 'llama.cpp found no usable GPU (warning: no usable GPU found, --gpu-layers option will be ignored)',
      },
    ],
    [
      'found 0 CUDA devices',
      lines('ggml_cuda_init: found 0 CUDA devices:'),
      { backend: 'CPU', devices: [], evidence: 'ggml_cuda_init: found 0 CUDA devices:' },
    ],
    [
      'offload claimed, only host buffers (CPU, CPU_REPACK, CUDA_Host), block closed',
      lines(
        'load_tensors: offloaded 29/29 layers to GPU',
        'load_tensors: CPU model buffer size = 100.00 MiB',
        'load_tensors: CPU_REPACK model buffer size = 50.00 MiB',
        'load_tensors: CUDA_Host model buffer size = 10.00 MiB',
        '....',
      ),
      {
        backend: 'CPU',
        layersOffloaded: 29,
        layersTotal: 29,
        gpuBackendLoaded: null,
        summary:
          'llama.cpp kept all its model buffers in host memory (load_tensors: CPU model buffer size = 100.00 MiB | load_tensors: CPU_REPACK model buffer size = 50.00 MiB | load_tensors: CUDA_Host model buffer size = 10.00 MiB) although it reported 29/29 layers offloaded',
      },
    ],
    [
      '2023: VRAM used 0 alone',
      lines('llama_model_load_internal: total VRAM used: 0 MB'),
      { backend: 'CPU', gpuBackendLoaded: null, summary: 'llama.cpp offloaded no layers to the GPU (llama_model_load_internal: total VRAM used: 0 MB)' },
    ],
    [
      '--list-devices with nothing listed (end of text closes the list)',
      'Available devices:\n',
      { backend: 'CPU', gpuBackendLoaded: false, evidence: 'Available devices: (none)', summary: 'llama.cpp saw no GPU device, only the CPU (Available devices: (none))' },
    ],
    [
      '--list-devices with nothing listed, then another line',
      lines('Available devices:', 'done'),
      { backend: 'CPU', evidence: 'Available devices: (none)' },
    ],
    [
      'device_info with BLAS and CPU, no GPU',
      lines('device_info:', '  - BLAS    : OpenBLAS', '  - CPU     : AMD EPYC 9654 (773000 MiB, 770000 MiB free)'),
      { backend: 'CPU', evidence: 'device_info: - CPU : AMD EPYC 9654 (773000 MiB, 770000 MiB free)' },
    ],
  ];
  for (const [name, text, expected] of cases) t.match(parseLlamaLog(text), expected, name);
});

t.test('CUDA present, weights not confirmed', async (t) => {
  t.same(
    parseLlamaLog(lines('llama_model_load_from_file_impl: using device CUDA1 (NVIDIA H200) - 140000 MiB free', 'llama_model_load_from_file_impl: using device CUDA1 (NVIDIA H200) - 140000 MiB free', 'load_tensors: offloaded 81/81 layers to GPU')),
    {
      backend: 'CUDA',
      devices: ['CUDA1: NVIDIA H200'],
      layersOffloaded: 81,
      layersTotal: 81,
      gpuBackendLoaded: true,
      evidence: 'llama_model_load_from_file_impl: using device CUDA1 (NVIDIA H200) - 140000 MiB free',
      summary: `llama.cpp found CUDA1 ${NOT_CONFIRMED} (it reported 81/81 layers offloaded)`,
    },
    '`using device` without a PCI id (b4xxx form), printed twice; offloaded alone is only a claim',
  );
  t.same(
    parseLlamaLog(lines('ggml_cuda_init: found 3 CUDA devices:', '  Device 0: NVIDIA GeForce RTX 3090', '  Device 2: NVIDIA GeForce RTX 3090', 'llama_model_load_from_file_impl: using device Vulkan0 (AMD) - 1 MiB free')),
    {
      backend: 'CUDA',
      devices: ['CUDA0: NVIDIA GeForce RTX 3090', 'CUDA1', 'CUDA2: NVIDIA GeForce RTX 3090'],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence: 'ggml_cuda_init: found 3 CUDA devices: | Device 0: NVIDIA GeForce RTX 3090 | Device 2: NVIDIA GeForce RTX 3090',
      summary: `llama.cpp found CUDA0, CUDA1 and CUDA2 ${NOT_CONFIRMED}`,
    },
    'mid-2023 device lines without compute capability; a non-CUDA `using device` is ignored',
  );
  t.same(
    parseLlamaLog(lines('llama_model_load_internal: using CUDA for GPU acceleration')),
    {
      backend: 'CUDA',
      devices: [],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence: 'llama_model_load_internal: using CUDA for GPU acceleration',
      summary: `llama.cpp reported using CUDA ${NOT_CONFIRMED}`,
    },
  );
  t.same(
    parseLlamaLog(lines('ggml_cuda_set_main_device: using device 0 (NVIDIA GeForce RTX 3090) as main device'))?.devices,
    ['CUDA0: NVIDIA GeForce RTX 3090'],
  );
  t.same(
    parseLlamaLog(lines('device_info:', '  - CUDA0   : NVIDIA A100', '  - CPU     : x (1 MiB, 1 MiB free)'))?.devices,
    ['CUDA0: NVIDIA A100'],
    'device_info without memory figures',
  );
  t.same(
    parseLlamaLog(lines('Available devices:', '  Vulkan0: AMD Radeon (8000 MiB, 7000 MiB free)', '  CUDA0: NVIDIA A100 (81000 MiB, 80000 MiB free)'))?.devices,
    ['CUDA0: NVIDIA A100 (81000 MiB)'],
  );
});

t.test('2023 "VRAM used"', async (t) => {
  t.same(
    parseLlamaLog(lines('llm_load_tensors: using CUDA for GPU acceleration', 'llm_load_tensors: VRAM used: 4000.00 MiB')),
    {
      backend: 'CUDA',
      devices: [],
      layersOffloaded: null,
      layersTotal: null,
      gpuBackendLoaded: true,
      evidence: 'llm_load_tensors: VRAM used: 4000.00 MiB',
      summary: 'llama.cpp reported 4000.00 MiB of VRAM used on its CUDA devices',
    },
  );
  t.equal(parseLlamaLog(lines('llama_model_load_internal: total VRAM used: 3475 MB')), null, 'no CUDA in sight (CLBlast printed it too)');
  // May 2023 (build 550): cuBLAS tagged its lines, and printed no device line. Public file 2596492486
  // (a blog's `main.exe ... -ngl 4` run); llama.cpp's docs/development/token_generation_performance_tips.md
  // quotes the same lines as the sign that the GPU is used.
  const build550 = lines(
    'main: build = 550 (79b2d5b)',
    'llama_model_load_internal: mem required  = 27497.09 MB (+ 1026.00 MB per state)',
    'llama_model_load_internal: [cublas] offloading 4 layers to GPU',
    'llama_model_load_internal: [cublas] total VRAM used: 3088 MB',
    'llama_init_from_file: kv self size  =   22.50 MB',
  );
  t.same(parseLlamaLog(build550), {
    backend: 'CUDA',
    devices: [],
    layersOffloaded: null,
    layersTotal: null,
    gpuBackendLoaded: true,
    evidence: 'llama_model_load_internal: [cublas] total VRAM used: 3088 MB',
    summary: 'llama.cpp reported 3088 MiB of VRAM used on its CUDA devices',
  });
  t.equal(showsGpuWeights(parseLlamaLog(build550)!), true);
  // edited: the same run with -ngl 0
  t.match(parseLlamaLog(lines('llama_model_load_internal: [cublas] offloading 0 layers to GPU', 'llama_model_load_internal: [cublas] total VRAM used: 0 MB')), {
    backend: 'CPU',
    gpuBackendLoaded: true,
    evidence: 'llama_model_load_internal: [cublas] total VRAM used: 0 MB',
  });
});

t.test('other accelerators and claims say nothing about CUDA vs CPU', async (t) => {
  const cases: Array<[string, string]> = [
    ['weights on ROCm0', lines('ggml_cuda_init: no CUDA devices found', 'load_tensors: ROCm0 model buffer size = 100.00 MiB', 'load_tensors: CPU model buffer size = 1.00 MiB', 'x')],
    ['device_info with Vulkan only', lines('device_info:', '  - Vulkan0 : Intel(R) Arc(TM) Graphics (8000 MiB, 8000 MiB free)', '  - CPU : x', 'x')],
    ['--list-devices with Vulkan only', lines('Available devices:', '  Vulkan0: AMD Radeon (8000 MiB, 7000 MiB free)')],
    ['device_info header cut before its devices', 'device_info:\n'],
    ['device_info header, then an unrelated line', lines('device_info:', 'system_info: n_threads = 4')],
    ['host buffers, block not closed yet', lines('load_tensors: offloaded 33/33 layers to GPU', 'load_tensors: CPU buffer size = 70.31 MiB')],
    ['a tail that starts inside the buffer block (its CUDA0 line cut off)', lines('load_tensors: CPU model buffer size = 407.00 MiB', '....', 'llama_context: n_ctx = 4096')],
    ['offloaded N/M alone', lines('load_tensors: offloaded 33/33 layers to GPU')],
    ['ROCm enumeration', lines('ggml_init_cublas: found 1 ROCm devices:', '  Device 0: Radeon RX 7900 XTX, compute capability 11.0')],
    ['empty', ''],
    ['blank lines', '\n\n\r\n'],
  ];
  for (const [name, text] of cases) t.equal(parseLlamaLog(text), null, name);
  t.equal(parseLlamaLog(undefined as unknown as string), null, 'not a string');
});

const arbitraryLine = fc.oneof(
  fc.string({ maxLength: 200 }),
  fc.string({ unit: 'binary', maxLength: 200 }),
  fc.constantFrom(
    'ggml_cuda_init: found 2 CUDA devices:',
    '  Device 1: x, compute capability 9.0, VMM: yes, VRAM: 1 MiB',
    'device_info:',
    '  - CUDA3 : y (1 MiB, 0 MiB free)',
    '  - CPU : z',
    'Available devices:',
    '  CUDA0: a (2 MiB, 1 MiB free)',
    'load_tensors: CUDA0 model buffer size = 1.00 MiB',
    'load_tensors: CPU_Mapped model buffer size = 1.00 MiB',
    'load_tensors: offloaded 99999/3 layers to GPU',
    'llm_load_tensors: VRAM used: 0.00 MB',
    'warning: no usable GPU found',
    '0.00.001.078 I srv  llama_server: initializing ...',
    '0.00.038.015 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)',
    'log_info: verbosity = 4',
  ),
);

function wellFormed(account: EngineAccount | null): boolean {
  if (account === null) return true;
  const layersOk =
    (account.layersOffloaded === null && account.layersTotal === null) ||
    (Number.isSafeInteger(account.layersOffloaded) && Number.isSafeInteger(account.layersTotal));
  return (
    (account.backend === 'CUDA' || account.backend === 'CPU') &&
    Array.isArray(account.devices) &&
    account.devices.every((d) => /^CUDA\d+(?:: .+)?$/.test(d)) &&
    (account.backend === 'CUDA' || account.devices.length === 0) &&
    layersOk &&
    account.evidence.length > 0 &&
    !/[\r\n]/.test(account.evidence) &&
    account.summary.startsWith('llama.cpp ') &&
    !account.summary.endsWith('.')
  );
}

t.test('never throws; always null or well-formed (fast-check)', async (t) => {
  const allSamples = LLAMA_SAMPLES.map(sample);
  const sampleLines = allSamples.flatMap((text) => text.split('\n'));
  t.doesNotThrow(
    () => fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 2000 }), (s) => wellFormed(parseLlamaLog(s))), { numRuns: 500 }),
    'arbitrary strings',
  );
  t.doesNotThrow(
    () =>
      fc.assert(
        fc.property(fc.array(fc.oneof(arbitraryLine, fc.constantFrom(...sampleLines)), { maxLength: 60 }), fc.constantFrom('\n', '\r\n', '\r'), (l, eol) =>
          wellFormed(parseLlamaLog(l.join(eol))),
        ),
        { numRuns: 1000 },
      ),
    'sample lines and fragments in any order, any line ending',
  );
  t.doesNotThrow(
    () =>
      fc.assert(
        fc.property(fc.constantFrom(...allSamples), fc.nat(), fc.nat({ max: 50 }), fc.string({ maxLength: 20 }), (text, at, length, insert) => {
          const start = at % (text.length + 1);
          return wellFormed(parseLlamaLog(text.slice(0, start) + insert + text.slice(start + length)));
        }),
        { numRuns: 1000 },
      ),
    'samples with a span replaced',
  );
  t.doesNotThrow(
    () =>
      fc.assert(
        fc.property(fc.constantFrom(...allSamples), fc.array(fc.nat(), { minLength: 1, maxLength: 40 }), (text, order) => {
          const shuffled = text
            .split('\n')
            .map((line, i) => ({ line, key: order[i % order.length] as number }))
            .sort((a, b) => a.key - b.key);
          return wellFormed(parseLlamaLog(shuffled.map((s) => s.line).join('\n')));
        }),
        { numRuns: 500 },
      ),
    'samples with their lines shuffled',
  );
});

t.test('fast on 1 MiB, whatever the content', async (t) => {
  const oneMiB = 1024 * 1024;
  const realistic = LLAMA_SAMPLES.map(sample).join('\n');
  const inputs: Array<[string, string]> = [
    ['repeated samples', realistic.repeat(Math.ceil(oneMiB / realistic.length)).slice(0, oneMiB)],
    ['one huge line', 'load_tensors: CUDA0 model buffer size = '.repeat(oneMiB / 41)],
    ['journald near-misses', `Jan 30 09:13:15 ${'h'.repeat(250)} ${'i'.repeat(60)}${' ('.repeat(1800)}\n`.repeat(oneMiB / 4000)],
    ['bracket stacks', `${'[x] '.repeat(1000)}\n`.repeat(oneMiB / 4001)],
    ['timestamp stacks', `${'0.00.000.000 '.repeat(300)}\n`.repeat(oneMiB / 3901)],
    ['listed-device near-misses', `Available devices:\n  CUDA0: ${'x ('.repeat(1300)}\n`.repeat(oneMiB / 3930)],
    ['using-device near-misses', `llama_model_load: using device CUDA0 (${'(x) '.repeat(950)}\n`.repeat(oneMiB / 3840)],
    ['weights near-misses', `load_tensors: CUDA0 model buffer size = ${'9'.repeat(3000)}\n`.repeat(oneMiB / 3041)],
  ];
  for (const [name, text] of inputs) {
    const started = performance.now();
    const account = parseLlamaLog(text);
    const ms = performance.now() - started;
    t.ok(wellFormed(account), name);
    t.ok(ms < 1500, `${name}: ${ms.toFixed(0)} ms`);
  }
});

t.test('appendTail', async (t) => {
  t.equal(ENGINE_TAIL_MAX_BYTES, 256 * 1024);
  t.equal(appendTail('a\n', 'b\n'), 'a\nb\n', 'under the bound: unchanged');
  t.equal(appendTail('line one\nline two\n', 'line three\n', 15), 'line three\n', 'cut at the next line start');
  t.equal(appendTail('line one\nline two\n', 'line three\n', 20), 'line two\nline three\n', 'a whole line that fits is kept');
  t.equal(appendTail('abc\n', 'def\n', 4), 'def\n', 'the cut lands exactly on a line start');
  t.equal(appendTail('', 'abcdefghij', 4), 'ghij', 'no newline: a byte cut');
  t.equal(appendTail('', 'abcdefghij\n', 4), 'hij\n', 'the only newline is the last character: a byte cut');
  t.equal(appendTail('x', 'y', 0), '', 'nothing kept for a 0 bound');
  t.equal(appendTail('x', 'y', Number.NaN), '', 'nor for a NaN one');
  const emoji = '😀'; // 4 UTF-8 bytes, a surrogate pair in UTF-16
  t.equal(appendTail('', `${emoji}${emoji}`, 5), emoji, 'never half a pair');
  t.equal(appendTail('', `${emoji}${emoji}`, 7), emoji);
  t.equal(appendTail('', 'é€a', 4), '€a', '2- and 3-byte characters counted in bytes');
  t.equal(appendTail('\ud83d', '\ude00x', 5), '😀x', 'a pair split across chunks is joined first');
  const codeUnits = fc.string({ unit: fc.nat({ max: 0xffff }).map((n) => String.fromCharCode(n)), maxLength: 300 });
  const text = fc.oneof(codeUnits, fc.string({ unit: 'binary', maxLength: 300 }), fc.array(fc.constantFrom('ab', '\n', '😀', 'é', '€'), { maxLength: 80 }).map((a) => a.join('')));
  t.doesNotThrow(
    () =>
      fc.assert(
    fc.property(text, text, fc.integer({ min: 1, max: 400 }), (a, b, max) => {
      const out = appendTail(a, b, max);
      const all = a + b;
      const cut = all.length - out.length;
      const high = (i: number) => all.charCodeAt(i) >= 0xd800 && all.charCodeAt(i) <= 0xdbff;
      const low = (i: number) => all.charCodeAt(i) >= 0xdc00 && all.charCodeAt(i) <= 0xdfff;
      const splitPair = cut > 0 && high(cut - 1) && low(cut);
      const fits = Buffer.byteLength(all, 'utf8') <= max;
      return Buffer.byteLength(out, 'utf8') <= max && all.endsWith(out) && !splitPair && (!fits || out === all);
    }),
    { numRuns: 3000 },
      ),
    'bounded, a suffix, never half a pair, unchanged when it fits',
  );
  let tail = '';
  for (let i = 0; i < 4000; i += 1) tail = appendTail(tail, `line ${i} ${'x'.repeat(100)}\n`);
  t.ok(Buffer.byteLength(tail) <= ENGINE_TAIL_MAX_BYTES, 'the default bound holds');
  t.match(tail, /^line \d+ x+\n/, 'and starts on a whole line');
  t.match(tail, /line 3999 x+\n$/);
});
