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
