// Ollama's server log, read into the same account as llama.cpp's (parseLlamaLog with the name
// "Ollama"): its scheduler's plan (a claim, as "offloaded N/M" is), the CPU runner it starts, the
// GPU libraries it finds, and the llama.cpp lines it relays. Every case is a real log (samples/INDEX.md).
import t from 'tap';
import { parseLlamaLog } from '../../src/shards/llama-log.js';
import { readSample } from '../helpers/samples.js';

const ollama = (file: string) => parseLlamaLog(readSample(file), 'Ollama');

t.test('the scheduler plans 0 of 62 layers on CUDA and starts its CPU runner: CPU, its GPU backend found', async (t) => {
  const account = ollama('ollama-log_2025-02_issue8963_offload-to-cuda-0-layers_cpu-runner.txt');
  t.match(account, { backend: 'CPU', devices: [], layersOffloaded: 0, layersTotal: 62, gpuBackendLoaded: true });
  t.match(account?.summary, /^Ollama offloaded no layers to the GPU \(.*msg="offload to cuda" .*layers\.offload=0\)$/);
  t.match(account?.evidence, /runners\/cpu_avx2\//, 'the CPU runner is part of the evidence');
});

t.test('a plan of 25/25 layers on CUDA that finds no GPU library counts as none: CPU, the backend failed', async (t) => {
  const account = ollama('ollama-log_2025-08_issue11723_offload-library-cuda_no-compatible-gpu-libraries.txt');
  t.match(account, { backend: 'CPU', layersOffloaded: 25, layersTotal: 25, gpuBackendLoaded: false });
  t.match(account?.summary, /^Ollama found no usable GPU \(.*compatible=\[\]\) although it reported 25\/25 layers offloaded$/);
});

t.test('"offload to cpu": no layer on a GPU', async (t) => {
  t.match(ollama('ollama-log_2024-12_ipex-llm12513_offload-to-cpu.txt'), {
    backend: 'CPU',
    layersOffloaded: 0,
    layersTotal: 29,
    gpuBackendLoaded: null,
    summary: /^Ollama offloaded no layers to the GPU \(.*"offload to cpu"/,
  });
});

t.test('a CUDA GPU found at start: CUDA present, weights not confirmed', async (t) => {
  t.match(ollama('ollama-log_2025-02_batteries1663_inference-compute-cuda.txt'), {
    backend: 'CUDA',
    gpuBackendLoaded: true,
    summary: /^Ollama reported using CUDA but printed no model buffer line/,
    evidence: /name="NVIDIA A10G"/,
  });
});

t.test('Ollama 0.12.4+ names the library CUDA, 0.13+ adds filter_id: CUDA found at start', async (t) => {
  t.match(ollama('ollama-log_2025-11_journald_inference-compute-CUDA-filter_id.txt'), {
    backend: 'CUDA',
    gpuBackendLoaded: true,
    summary: /^Ollama reported using CUDA but printed no model buffer line/,
    evidence: /filter_id="" library=CUDA/,
  });
  t.match(ollama('ollama-log_2026-05_inference-compute-CUDA_load_tensors-29of29.txt'), {
    backend: 'CUDA',
    devices: ['CUDA0'],
    layersOffloaded: 29,
    layersTotal: 29,
    gpuBackendLoaded: true,
  });
});

t.test('"inference compute" with library=cpu: Ollama found no GPU, so its GPU backend failed', async (t) => {
  const account = ollama('ollama-log_2025-12_0.13.5_inference-compute-cpu.txt');
  t.match(account, { backend: 'CPU', devices: [], gpuBackendLoaded: false });
  t.match(account?.summary, /^Ollama found no usable GPU \(.*id=cpu library=cpu\)$/);
  // Before 0.12.4 the CPU entry had id=0 and more fields (ollama/ollama app/server/server_test.go at fb30760).
  const older =
    'time=2025-07-01T17:59:51.470Z level=INFO source=types.go:130 msg="inference compute" id=0 library=cpu variant="" compute="" driver=0.0 name="" total="31.3 GiB" available="30.4 GiB"';
  t.match(parseLlamaLog(older, 'Ollama'), { backend: 'CPU', gpuBackendLoaded: false });
  // Another library is neither CUDA nor the CPU (same test file).
  const rocm =
    'time=2025-07-01T19:36:13.315Z level=INFO source=types.go:130 msg="inference compute" id=GPU-9abb57639fa80c50 library=rocm variant="" compute=gfx1030 driver=6.3 name=1002:73bf total="16.0 GiB" available="1.3 GiB"';
  t.equal(parseLlamaLog(rocm, 'Ollama'), null);
});

t.test("a server's device lines after a model load are a restarted server's: they open a new run", async (t) => {
  const gpuRun = readSample('ollama-log_2026-05_inference-compute-CUDA_load_tensors-29of29.txt');
  const cpuStart = readSample('ollama-log_2025-12_0.13.5_inference-compute-cpu.txt');
  t.match(parseLlamaLog(gpuRun + cpuStart, 'Ollama'), { backend: 'CPU', gpuBackendLoaded: false });
  // At start, before any load, they join the run the runner's lines continue.
  t.match(parseLlamaLog(cpuStart + gpuRun, 'Ollama'), { backend: 'CUDA', devices: ['CUDA0'] });
});

t.test("Ollama's own engine prints offloaded N/M in its log format: 0 of 41 on a server that found no GPU", async (t) => {
  const account = ollama('ollama-log_2026-05_inference-compute-cpu_engine-offloaded-0of41.txt');
  t.match(account, { backend: 'CPU', devices: [], layersOffloaded: 0, layersTotal: 41, gpuBackendLoaded: false });
  t.match(account?.evidence, /msg="offloaded 0\/41 layers to GPU"/);
  const alone = readSample('ollama-log_2026-05_inference-compute-cpu_engine-offloaded-0of41.txt').split('\n')[4]!;
  t.match(parseLlamaLog(alone, 'Ollama'), { backend: 'CPU', layersOffloaded: 0, gpuBackendLoaded: null, summary: /^Ollama offloaded no layers to the GPU/ });
});

t.test('"Listening on" starts a server: what the one before printed is set aside', async (t) => {
  // public file 70469963003 (Ollama 0.32.13's start line).
  const listening = 'time=2026-08-14T20:21:10.190-03:00 level=INFO source=routes.go:1990 msg="Listening on 127.0.0.1:11435 (version 0.32.13)"';
  const noGpu = readSample('ollama-log_2025-12_0.13.5_inference-compute-cpu.txt');
  const cuda = readSample('ollama-log_2025-11_journald_inference-compute-CUDA-filter_id.txt');
  t.match(parseLlamaLog(`${noGpu}${listening}\n${cuda}`, 'Ollama'), { backend: 'CUDA', gpuBackendLoaded: true }, 'restarted, it found a GPU');
  t.match(parseLlamaLog(`${noGpu}${cuda}`, 'Ollama'), { backend: 'CPU' }, 'without the start line, one run: no GPU found outweighs');
});

t.test('a plan naming the library CUDA (0.12.4 to 0.12.x) reads as one naming cuda', async (t) => {
  // The plan's shape as llm/memory.go's MemoryEstimate.LogValue printed it at v0.12.6, library from discovery.
  const plan = (library: string, offload: number) =>
    `time=2025-10-20T10:00:00.000Z level=INFO source=server.go:544 msg=offload library=${library} layers.requested=-1 layers.model=29 layers.offload=${offload} layers.split=""`;
  t.match(parseLlamaLog(plan('CUDA', 0), 'Ollama'), { backend: 'CPU', layersOffloaded: 0, gpuBackendLoaded: true });
  t.match(parseLlamaLog(plan('CUDA', 29), 'Ollama'), { backend: 'CUDA', layersOffloaded: 29, gpuBackendLoaded: true });
  t.match(parseLlamaLog(plan('cpu', 0), 'Ollama'), { backend: 'CPU', gpuBackendLoaded: null });
});

t.test("llama.cpp's lines relayed through journald: 5 of 37 layers on CUDA0", async (t) => {
  t.match(ollama('ollama-log_2025-05_issue10833_journald_offloaded-5of37.txt'), {
    backend: 'CUDA',
    devices: ['CUDA0'],
    layersOffloaded: 5,
    layersTotal: 37,
    summary: 'Ollama put its model buffers on CUDA0 and offloaded 5/37 layers',
  });
});

t.test('each plan opens a model load: the last one decides', async (t) => {
  const cpuThenFailed =
    readSample('ollama-log_2025-02_issue8963_offload-to-cuda-0-layers_cpu-runner.txt') +
    readSample('ollama-log_2025-08_issue11723_offload-library-cuda_no-compatible-gpu-libraries.txt');
  t.match(parseLlamaLog(cpuThenFailed, 'Ollama'), { layersTotal: 25, gpuBackendLoaded: false });
  const planThenLoad =
    readSample('ollama-log_2025-08_issue11723_offload-library-cuda_no-compatible-gpu-libraries.txt').split('\n')[0] +
    '\n' +
    readSample('ollama-log_2025-05_issue10833_journald_offloaded-5of37.txt');
  t.match(parseLlamaLog(planThenLoad, 'Ollama'), { backend: 'CUDA', layersOffloaded: 5, layersTotal: 37 });
  const runnerAlone = readSample('ollama-log_2025-02_issue8963_offload-to-cuda-0-layers_cpu-runner.txt').split('\n').slice(-2).join('\n');
  t.match(parseLlamaLog(runnerAlone, 'Ollama'), { backend: 'CPU', gpuBackendLoaded: null, summary: /^Ollama started its CPU runner \(.*runners\/cpu_avx2\/\)$/ });
});
