// Owns reading llama.cpp's output, and Ollama's server log around it (pure; never throws), into the evidence of its LAST run, so a
// restarted engine's older output cannot outvote the current one: a line of a start-up stage the run
// has passed, or a once-only line of the stage it is in, starts a new run (STAGE). A block (device
// list, model buffers) is judged only once a later line closes it, since a cut tail may end mid-block;
// --list-devices, which prints its list whole and exits, is closed by the end of the text.
import { decideAccount, newRun, type EngineAccount, type Run } from './llama-account.js';
import { llamaLogLines } from './llama-log-lines.js';

const RE_PROCESS_START = /^llama_server: initializing \.\.\.$/; // b11146+, before anything else
const RE_VERBOSITY = /^(?:common_params_print_info|log_info): verbosity = \d{1,4}(?: |$)/; // b9151+
const RE_FOUND = /^(?:ggml_cuda_init|ggml_init_cublas): found (\d{1,4}) CUDA devices/;
const RE_INIT_FAILED = /^(?:ggml_cuda_init|ggml_init_cublas): (?:failed to initialize CUDA|no CUDA devices found)/;
const RE_NO_GPU_WARNING = /^warning: (?:no usable GPU found|not compiled with GPU offload support)/;
const RE_DEVICE_ENUMERATED = /^Device (\d{1,4}): (.{1,1024})$/; // after RE_FOUND: "Device 0: NAME, compute capability ..."
const RE_DEVICE_LISTED = /^([^ ]{1,64}): (.{1,1024}) \((\d{1,9}) MiB, \d{1,9} MiB free\)$/; // --list-devices
const RE_DEVICE_INFO_HEADER = /^device_info:$/; // b9151+, then "- CUDA0 : NAME (T MiB, F MiB free)", CPU last
const RE_DEVICE_INFO_ITEM = /^- ([^ ]{1,64}) ?: (.{0,1024})$/;
const RE_LIST_HEADER = /^Available devices:$/;
const RE_OFFLOADED = /^(?:\w{1,64}: )?offloaded (\d{1,6})\/(\d{1,6}) layers to GPU/;
// Model weights only: KV, compute and CUDA_Host buffers do not count (with -ngl 0 a CUDA build still
// allocates a CUDA0 compute buffer while every weight stays on host).
const RE_WEIGHTS = /^(?:llm_)?load_tensors: ([^ ]{1,64}) (?:model )?buffer size ?= ?(\d{1,12}(?:\.\d{1,6})?) MiB/;
const RE_VRAM = /^\w{1,64}: (\[cublas\] )?(?:total )?VRAM used: (\d{1,12}(?:\.\d{1,6})?) Mi?B/; // 2023
const RE_USING_DEVICE = /^\w{1,64}: using device ([^ ]{1,64}) \((.{1,1024})\) - \d{1,9} MiB free$/;
const RE_MAIN_DEVICE = /^ggml_cuda_set_main_device: using device (\d{1,4}) \((.{1,1024})\) as main device/;
const RE_USING_CUDA = /^\w{1,64}: using CUDA for GPU acceleration/;
const RE_MEMORY_SUFFIX = /^(.{1,1024}) \((\d{1,9}) MiB, \d{1,9} MiB free\)$/;
const RE_VRAM_FIELD = /, VRAM: (\d{1,9}) MiB/;
const RE_CUDA_NAME = /^CUDA(\d{1,4})$/;
// Ollama's server log (logfmt): its start ("Listening on"), the devices it found then ("inference
// compute": one line per GPU, or one "library=cpu" line when it found none), its scheduler's plan for
// a model ("offload to cuda" until 2025, then "offload library=cuda", "CUDA" from 0.12.4 until 0.13
// dropped the line), the runner it starts, and its own engine's "offloaded N/M" (models it runs
// without llama.cpp print no llama.cpp line). A plan is a claim, as "offloaded N/M" is; 0 layers, the
// CPU library, its CPU runner or no GPU found are CPU evidence.
const OLLAMA_HEAD = '^time=[^ ]{1,40} level=[A-Z]{1,8} source=[^ ]{1,64} msg=';
const RE_OLLAMA_PLAN = new RegExp(`${OLLAMA_HEAD}(?:"offload to ([a-z]{1,16})"|offload library=([A-Za-z]{1,16})) layers\\.requested=-?\\d{1,6} layers\\.model=(\\d{1,6}) layers\\.offload=(\\d{1,6})`);
const RE_OLLAMA_CPU_RUNNER = new RegExp(`${OLLAMA_HEAD}"starting llama server" cmd="[^ "]{0,1024}/runners/cpu[a-z0-9_]{0,16}/`);
const RE_OLLAMA_NO_GPU_LIBRARY = new RegExp(`${OLLAMA_HEAD}"compatible gpu libraries" compatible=\\[\\]`);
const RE_OLLAMA_START = new RegExp(`${OLLAMA_HEAD}"Listening on [^"]{1,256} \\(version [^")]{1,64}\\)"`);
const RE_OLLAMA_ENGINE_OFFLOADED = new RegExp(`${OLLAMA_HEAD}"offloaded (\\d{1,6})/(\\d{1,6}) layers to GPU"`);
const RE_OLLAMA_DEVICE = new RegExp(`${OLLAMA_HEAD}"inference compute" id=[^ ]{1,128}(?: filter_id=[^ ]{0,130})? library=([A-Za-z]{1,16})(?: |$)`);
// Host-memory buffer types: CPU, CPU_Mapped, CPU_REPACK, CUDA_Host (pinned host memory), AMX...
const RE_HOST_NAME = /^(?:CPU\w{0,32}|\w{1,32}_Host|BLAS|AMX|KleidiAI|KLEIDIAI)$/;

// A process's start-up, in the order it prints it; all but backend init and loading print once.
const STAGE = { none: 0, process: 1, backends: 2, verbosity: 3, devices: 4, loading: 5 } as const;
type Stage = (typeof STAGE)[keyof typeof STAGE];

type Block =
  | { kind: 'cuda-enum' }
  | { kind: 'device-info'; header: string; gpu: boolean }
  | { kind: 'list'; header: string; items: number }
  // cutOff: the block opens the text, so a cut tail may have dropped its first (CUDA) lines.
  | { kind: 'buffers'; hostLines: string[]; accelerator: boolean; cutOff: boolean };

interface State {
  run: Run;
  stage: Stage;
  block: Block | null;
  linesSeen: number;
}

function deviceKind(name: string): 'cuda' | 'host' | 'other' {
  if (RE_CUDA_NAME.test(name)) return 'cuda';
  return RE_HOST_NAME.test(name) ? 'host' : 'other';
}

function cudaIndex(name: string): number {
  return Number((RE_CUDA_NAME.exec(name) as RegExpExecArray)[1]);
}

function note(run: Run, index: number, name: string, totalMiB: number | null): void {
  // A later line may name a device without its size (`using device`): keep the size already seen.
  run.notes.set(index, { name, totalMiB: totalMiB ?? run.notes.get(index)?.totalMiB ?? null });
}

/** The run reaches `stage`; a line its process can no longer print (`newFrom` reached; none: loading repeats) starts a new run. */
function enter(st: State, stage: Stage, newFrom?: Stage): void {
  if (newFrom !== undefined && st.stage >= newFrom) {
    st.run = newRun();
    st.stage = STAGE.none;
  }
  if (stage > st.stage) st.stage = stage;
}

const beginProcess = (st: State): void => enter(st, STAGE.process, STAGE.process);
/** CUDA init and no-GPU warnings: printed (maybe several) while backends load, before the verbosity line. */
const beginInit = (st: State): void => enter(st, STAGE.backends, STAGE.verbosity);
const beginVerbosity = (st: State): void => enter(st, STAGE.verbosity, STAGE.verbosity);
/** device_info or --list-devices: once, listing backends already loaded. */
const beginDevices = (st: State): void => enter(st, STAGE.devices, STAGE.devices);
const beginLoad = (st: State): void => enter(st, STAGE.loading);

/** A --list-devices line naming a CUDA device: noted as evidence of CUDA (`presence`: the line as quoted); false for others. */
function noteListed(run: Run, listed: RegExpExecArray, presence: string): boolean {
  if (deviceKind(listed[1] as string) !== 'cuda') return false;
  note(run, cudaIndex(listed[1] as string), listed[2] as string, Number(listed[3]));
  run.presence.push(presence);
  return true;
}

/** A device line inside the open block; false when the line ends the block. */
function continueBlock(st: State, block: Block, line: string): boolean {
  const run = st.run;
  switch (block.kind) {
    case 'cuda-enum': {
      const old = RE_DEVICE_ENUMERATED.exec(line);
      if (old) {
        const [, index, body] = old as unknown as [string, string, string];
        const cut = body.indexOf(', compute capability');
        const vram = RE_VRAM_FIELD.exec(body);
        note(run, Number(index), cut >= 0 ? body.slice(0, cut) : body, vram ? Number(vram[1]) : null);
        run.presence.push(line);
        return true;
      }
      const listed = RE_DEVICE_LISTED.exec(line);
      return listed !== null && noteListed(run, listed, line);
    }
    case 'device-info': {
      const item = RE_DEVICE_INFO_ITEM.exec(line);
      if (!item) return false;
      const [, name, body] = item as unknown as [string, string, string];
      const kind = deviceKind(name);
      if (kind === 'cuda') {
        const memory = RE_MEMORY_SUFFIX.exec(body);
        note(run, cudaIndex(name), memory ? (memory[1] as string) : body, memory ? Number(memory[2]) : null);
        run.presence.push(`${block.header} ${line}`);
        block.gpu = true;
      } else if (kind === 'other') {
        block.gpu = true;
      } else if (name.startsWith('CPU')) {
        // The CPU device is registered, and so listed, last: the list of GPUs is complete.
        if (!block.gpu) run.cpu.push({ kind: 'cpu-devices', line: `${block.header} ${line}` });
        st.block = null;
      }
      return true;
    }
    case 'list': {
      const listed = RE_DEVICE_LISTED.exec(line);
      if (!listed) return false;
      block.items += 1;
      noteListed(run, listed, `${block.header} ${line}`);
      return true;
    }
    case 'buffers': {
      const weights = RE_WEIGHTS.exec(line);
      if (!weights) return false;
      addWeights(run, block, line, weights[1] as string, Number(weights[2]));
      return true;
    }
  }
}

function closeBlock(st: State, block: Block): void {
  st.block = null;
  if (block.kind === 'list' && block.items === 0) {
    st.run.cpu.push({ kind: 'cpu-devices', line: `${block.header} (none)` });
  } else if (block.kind === 'buffers' && block.hostLines.length > 0 && !block.accelerator && !block.cutOff) {
    for (const line of block.hostLines) st.run.cpu.push({ kind: 'host-buffers', line });
  }
}

function addWeights(run: Run, block: Extract<Block, { kind: 'buffers' }>, line: string, name: string, mib: number): void {
  const kind = deviceKind(name);
  if (kind === 'host') {
    block.hostLines.push(line);
  } else if (mib > 0) {
    block.accelerator = true;
    if (kind === 'cuda') run.cudaWeights.set(cudaIndex(name), line);
    else run.otherWeights = true;
  }
}

/** "offloaded N/M layers to GPU", llama.cpp's or Ollama's engine's: a claim, and CPU evidence when N is 0. */
function noteOffloaded(st: State, line: string, offloaded: number, total: number): void {
  beginLoad(st);
  st.run.layers = { offloaded, total };
  if (offloaded === 0) st.run.cpu.push({ kind: 'zero-offload', line });
}

/** An Ollama scheduler or runner line; false when the line is none of them. */
function classifyOllama(st: State, line: string): boolean {
  let m: RegExpExecArray | null;
  if (RE_OLLAMA_START.test(line)) {
    // A server starts: what an earlier one printed is not this one's.
    enter(st, STAGE.none, STAGE.none);
  } else if ((m = RE_OLLAMA_ENGINE_OFFLOADED.exec(line))) {
    noteOffloaded(st, line, Number(m[1]), Number(m[2]));
  } else if ((m = RE_OLLAMA_PLAN.exec(line))) {
    // A plan opens each model load, before its runner prints anything.
    beginProcess(st);
    const offloaded = Number(m[4]);
    const library = (m[1] ?? m[2])!.toLowerCase();
    st.run.layers = { offloaded, total: Number(m[3]) };
    // A plan for CUDA means Ollama found CUDA GPUs.
    if (library === 'cuda') st.run.presence.push(m[0]);
    if (offloaded === 0 || library === 'cpu') st.run.cpu.push({ kind: 'zero-offload', line: m[0] });
  } else if ((m = RE_OLLAMA_CPU_RUNNER.exec(line))) {
    st.run.cpu.push({ kind: 'cpu-runner', line: m[0] });
  } else if (RE_OLLAMA_NO_GPU_LIBRARY.test(line)) {
    st.run.cpu.push({ kind: 'no-gpu', line });
  } else if ((m = RE_OLLAMA_DEVICE.exec(line))) {
    // Printed when the server starts: after a model load, a restarted server.
    enter(st, STAGE.none, STAGE.loading);
    const library = m[1]!.toLowerCase();
    if (library === 'cuda') st.run.presence.push(line);
    else if (library === 'cpu') st.run.cpu.push({ kind: 'no-gpu', line });
  } else {
    return false;
  }
  return true;
}

function classify(st: State, line: string): void {
  let m: RegExpExecArray | null;
  if (line.startsWith('time=') && classifyOllama(st, line)) return;
  if (RE_PROCESS_START.test(line)) {
    beginProcess(st);
  } else if (RE_VERBOSITY.test(line)) {
    beginVerbosity(st);
  } else if ((m = RE_WEIGHTS.exec(line))) {
    beginLoad(st);
    const block: Block = { kind: 'buffers', hostLines: [], accelerator: false, cutOff: st.linesSeen === 0 };
    st.block = block;
    addWeights(st.run, block, line, m[1] as string, Number(m[2]));
  } else if ((m = RE_FOUND.exec(line))) {
    beginInit(st);
    const count = Number(m[1]);
    if (count === 0) {
      st.run.cpu.push({ kind: 'no-gpu', line });
    } else {
      st.run.found = count;
      // b9031..b9049 (and mtmd-cli) warn "no usable GPU found" while parsing -ngl, before loading
      // their backends: a process that then finds CUDA devices did not ignore -ngl.
      st.run.cpu = st.run.cpu.filter((c) => !RE_NO_GPU_WARNING.test(c.line));
      st.run.presence.push(line);
      st.block = { kind: 'cuda-enum' };
    }
  } else if (RE_INIT_FAILED.test(line) || RE_NO_GPU_WARNING.test(line)) {
    beginInit(st);
    st.run.cpu.push({ kind: 'no-gpu', line });
  } else if (RE_DEVICE_INFO_HEADER.test(line)) {
    beginDevices(st);
    st.block = { kind: 'device-info', header: line, gpu: false };
  } else if (RE_LIST_HEADER.test(line)) {
    beginDevices(st);
    st.block = { kind: 'list', header: line, items: 0 };
  } else if ((m = RE_OFFLOADED.exec(line))) {
    noteOffloaded(st, line, Number(m[1]), Number(m[2]));
  } else if ((m = RE_VRAM.exec(line))) {
    beginLoad(st);
    // May 2023 (build ~550) tagged the line "[cublas]" and printed no device line: the tag is CUDA.
    if (m[1] !== undefined) st.run.presence.push(line);
    if (Number(m[2]) > 0) st.run.vram = { mib: m[2] as string, line };
    else st.run.cpu.push({ kind: 'zero-offload', line });
  } else if ((m = RE_USING_DEVICE.exec(line))) {
    beginLoad(st);
    const name = m[1] as string;
    if (deviceKind(name) === 'cuda') {
      // The b6470+ form adds the PCI id in a second pair of parentheses.
      const described = m[2] as string;
      const pci = described.lastIndexOf(') (');
      const index = cudaIndex(name);
      note(st.run, index, pci >= 0 ? described.slice(0, pci) : described, null);
      if (!st.run.chosen.includes(index)) st.run.chosen.push(index);
      st.run.presence.push(line);
    }
  } else if ((m = RE_MAIN_DEVICE.exec(line))) {
    beginLoad(st);
    note(st.run, Number(m[1]), m[2] as string, null);
    st.run.presence.push(line);
  } else if (RE_USING_CUDA.test(line)) {
    beginLoad(st);
    st.run.presence.push(line);
  }
}

function feed(st: State, line: string): void {
  const block = st.block;
  if (!block || !continueBlock(st, block, line)) {
    if (block) closeBlock(st, block);
    classify(st, line);
  }
  st.linesSeen += 1;
}

/** Whether an account rests on weights seen on a CUDA device, not CUDA merely present: GPU memory that nvidia-smi must then list. */
export function showsGpuWeights(account: EngineAccount): boolean {
  return account.backend === 'CUDA' && (RE_WEIGHTS.test(account.evidence) || RE_VRAM.test(account.evidence));
}

/** What llama.cpp's output (or Ollama's log, `name` 'Ollama') says about where it computes; null when it says nothing about it. */
export function parseLlamaLog(text: string, name = 'llama.cpp'): EngineAccount | null {
  if (typeof text !== 'string' || text.length === 0) return null;
  const st: State = { run: newRun(), stage: STAGE.none, block: null, linesSeen: 0 };
  for (const line of llamaLogLines(text)) feed(st, line);
  if (st.block?.kind === 'list') closeBlock(st, st.block);
  return decideAccount(st.run, name);
}
