// llama.cpp's own account of where it computes, read from the text it printed (pure: no I/O).
//
// A CUDA build of llama.cpp silently computes on the CPU when its GPU backend does not load, and
// only its log says so. nvidia-smi stays the engine-agnostic truth; this is the second, optional
// signal, and the operator-facing reason quotes its evidence verbatim, so it must be exact.
//
// What each llama.cpp generation prints (samples in ../shared/samples/llamacpp-*):
//   2023-05  llama_model_load_internal: [cublas] total VRAM used: X MB (no device line)
//   2023     ggml_init_cublas: found N CUDA devices: + "  Device i: NAME, compute capability ..."
//            llm_load_tensors: offloaded N/M layers to GPU, then "VRAM used: X MiB" (no buffer lines)
//   2024     ggml_cuda_init: ... the same header, then llm_load_tensors: CUDA0 buffer size = X MiB
//   2025+    load_tensors: CUDA0 model buffer size = X MiB, CPU_Mapped model buffer size = ...
//            llama_model_load_from_file_impl: using device CUDA0 (NAME) [(PCI id)] - N MiB free
//   b9151..  llama-server "log_info: verbosity = 3 (adjust with ...)" first, then a "device_info:"
//            block: "  - CUDA0   : NAME (T MiB, F MiB free)", CPU last
//   b9829+   "common_params_print_info: verbosity = 3 (adjust with ...)" first (b11146 prints
//            "llama_server: initializing ..." before it), then nothing about devices at the
//            default verbosity: such a log says nothing (null); where it prints device_info
//            (b10145) each line reads "cmn  common_param: device_info:", "...:   - CPU : ..."
//   --list-devices  "Available devices:" then "  CUDA0: NAME (T MiB, F MiB free)" (CPU not listed)
//
// Decision, over the LAST run in the text, so a restarted engine's older output cannot outvote the
// current one. A process prints its start-up in this order: "llama_server: initializing ..."
// (b11146, before anything else), backend init (CUDA init lines, no-GPU warnings; a b11146 CUDA
// failure comes after "initializing"), the verbosity line (b9151+), the device list (device_info,
// --list-devices), model loading; all but backend init and loading once. A line of a stage the run
// has passed, or a once-only line of the stage it is in, starts a new run. So the verbosity line of
// a b9829+ restart ends an older CPU run, and the new run, holding nothing, says nothing (null).
// Not process starts: system_info follows device_info and build info follows CUDA init in their
// own process (samples b9692, 2023 server), "listening" ends start-up. A run that got no further
// than backend init cannot be told from the backend lines a next process prints before its
// verbosity line: they stay one run.
// Within a run the strongest evidence wins, not the latest:
//   1. weights on a CUDA device (a `CUDA<n> [model ]buffer size` > 0 from load_tensors) -> CUDA.
//      This is the only proof (DESIGN.md 5): a buffer on CUDA<n> cannot exist if CUDA failed, so it
//      outweighs any warning of the same run. KV, compute and CUDA_Host buffers do not count: with
//      -ngl 0 a CUDA build still allocates a CUDA0 compute buffer while every weight stays on host.
//   2. weights on another accelerator (ROCm0, Vulkan0, Metal, RPC...), or the 2023 "VRAM used"
//      with no CUDA device in sight -> null: neither CUDA nor CPU, the contract has no word for it.
//   3. the 2023 "VRAM used: X" > 0 where CUDA devices were found -> CUDA (that era's proof).
//   4. any CPU evidence -> CPU: failed to initialize CUDA / no CUDA devices found / no usable GPU /
//      not compiled with GPU offload (a warning the run's "found N CUDA devices" follows is not:
//      llama-server b9031..b9049 printed it before loading its backends, issue 22748); "offloaded 0/N" or "VRAM used: 0"; device_info or
//      --list-devices naming no GPU; a complete block of model buffers all in host memory (the
//      cortex.cpp case: "offloaded 13/33" claimed, only a CPU buffer allocated). A block that
//      opens the text is not complete: the tail may have cut its CUDA0 line off.
//   5. CUDA merely present (devices found, listed or chosen, "using CUDA for GPU acceleration")
//      -> CUDA, with a summary saying that no buffer line confirms the weights are there.
//   6. nothing of the above -> null. "offloaded N/M layers" alone is a claim, not evidence.
// A block (model buffers, device enumeration) is judged only once a later line closes it, since
// the tail may end mid-block (device_info prints its CUDA line ~300 ms after its header);
// --list-devices is the exception: it prints its list in one go and exits.
//
// Kubernetes' container log records (CRI) are unwrapped first, a line's pieces joined. Lines may
// carry any prefix (journald, ISO/docker timestamps, docker compose's "name-1  | ",
// [tags], llama.cpp's "0.00.316.450 I ", module tags like "srv  "), CRLF and ANSI colours; after an
// unknown prefix a line is re-anchored at a known function name (device and warning lines have none). Line regexes are anchored with bounded repetition
// and no nested quantifier, and lines over 4096 characters are skipped, so a 1 MiB tail parses in
// one linear pass (about 50 ms) and no input can make it throw.

export type EngineBackend = 'CUDA' | 'CPU';

export interface EngineAccount {
  /** Where the engine itself says its weights/compute are. */
  backend: EngineBackend;
  /** GPU devices the engine reports using, as it names them ("CUDA0: NAME (T MiB)" or "CUDA0"); empty for CPU. */
  devices: string[];
  /** From `offloaded N/M layers to GPU`, else null. */
  layersOffloaded: number | null;
  layersTotal: number | null;
  /**
   * Whether its GPU backend loaded: true when the run found or used a CUDA device (so a CPU account
   * means no weights were put on it: -ngl), false when it said no GPU is usable or listed only the
   * CPU (the build, its libraries or the container's GPU runtime), null when the output does not say.
   */
  gpuBackendLoaded: boolean | null;
  /** The decisive line(s), prefixes removed and spaces collapsed, joined by " | ". */
  evidence: string;
  /** One sentence (no final period) saying what the engine itself saw. */
  summary: string;
}

/** How much engine output the registry keeps per shard. */
export const ENGINE_TAIL_MAX_BYTES = 256 * 1024;

const MAX_LINE_CHARS = 4096;
const MAX_EVIDENCE_LINES = 4;
const MAX_PREFIX_STRIPS = 8;

const ANSI = /\u001b\[[0-9;?]{0,32}[ -/]{0,4}[@-~]/g;
const WHITESPACE = /\s+/g;

// Tried in order, repeatedly, at the start of a line (spaces already collapsed to one).
const PREFIXES: readonly RegExp[] = [
  // journald / syslog: "Jan 30 09:13:15 host ollama[5307]: "
  /^[A-Z][a-z]{2} \d{1,2} \d\d:\d\d:\d\d(?:\.\d{1,9})? [^ ]{1,253} [^ :[\]]{1,64}(?:\[\d{1,10}\])?: /,
  // ISO or docker timestamps: "2024-10-11T12:45:53.660Z ", "2026-05-17 10:44:25.389 | ", and
  // journalctl -o short-iso: "2024-01-30T09:13:15+0000 host ollama[5307]: "
  /^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?(?: [^ ]{1,253} [^ :[\]]{1,64}\[\d{1,10}\]:)?(?: \| | |$)/,
  // docker compose logs: "llamacpp-server-1  | " (service and replica, then a pipe)
  /^[A-Za-z0-9][\w.-]{0,63} \| /,
  // bracketed stamps and tags: "[1706570000] ", "[CORTEX]::Error: "
  /^\[[^\]]{0,64}\](?:::[A-Za-z]{1,16}:)? ?/,
  // llama.cpp --log-timestamps: "0.00.316.450 "
  /^\d{1,6}\.\d\d\.\d{3}\.\d{3} /,
  // llama.cpp --log-prefix level letter: "I ", "W "
  /^[IWEDT] /,
  // llama-server module tags (b9829+): "srv load_model: ", "cmn - CUDA0 : " (only before what we read)
  /^[a-z]{3,4} (?=- |Device \d|CUDA\d|Available devices:|\w{1,64}:(?: |$))/,
  // ...then its function (b10145): "cmn  common_param: device_info:", "cmn  common_param:   - CPU : "
  /^common_param: (?=device_info:$|- )/,
];

// A record of Kubernetes' container log files (CRI), as a log shipper tailing /var/log/pods reads
// them: "2026-05-17T10:44:25.389123456Z stderr F <text>" (tags may follow F or P after a colon,
// which the CRI format keeps for later use). Tag F ends a line; P is a piece of one
// that the runtime wrote before the engine ended it (conmon writes what each read of the pipe
// got), continued by the stream's next record.
const RE_CRI_RECORD = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) (stdout|stderr) ([FP])(?::[^ ]{0,64})?(?: |$)/;

// Function prefixes that may follow an unknown prefix: the line is re-anchored at them.
const KNOWN_FUNCTION =
  /(?:ggml_cuda_init|ggml_init_cublas|ggml_cuda_set_main_device|llm_load_tensors|load_tensors|llama_model_load\w{0,32}|llama_load_model_from_file|llama_server|common_params_print_info|log_info): /;

const RE_PROCESS_START = /^llama_server: initializing \.\.\.$/;
const RE_VERBOSITY = /^(?:common_params_print_info|log_info): verbosity = \d{1,4}(?: |$)/;
const RE_FOUND = /^(?:ggml_cuda_init|ggml_init_cublas): found (\d{1,4}) CUDA devices/;
const RE_INIT_FAILED = /^(?:ggml_cuda_init|ggml_init_cublas): (?:failed to initialize CUDA|no CUDA devices found)/;
const RE_NO_GPU_WARNING = /^warning: (?:no usable GPU found|not compiled with GPU offload support)/;
const RE_DEVICE_ENUMERATED = /^Device (\d{1,4}): (.{1,1024})$/;
const RE_DEVICE_LISTED = /^([^ ]{1,64}): (.{1,1024}) \((\d{1,9}) MiB, \d{1,9} MiB free\)$/;
const RE_DEVICE_INFO_HEADER = /^device_info:$/;
const RE_DEVICE_INFO_ITEM = /^- ([^ ]{1,64}) ?: (.{0,1024})$/;
const RE_LIST_HEADER = /^Available devices:$/;
const RE_OFFLOADED = /^(?:\w{1,64}: )?offloaded (\d{1,6})\/(\d{1,6}) layers to GPU/;
const RE_WEIGHTS = /^(?:llm_)?load_tensors: ([^ ]{1,64}) (?:model )?buffer size ?= ?(\d{1,12}(?:\.\d{1,6})?) MiB/;
const RE_VRAM = /^\w{1,64}: (\[cublas\] )?(?:total )?VRAM used: (\d{1,12}(?:\.\d{1,6})?) Mi?B/;
const RE_USING_DEVICE = /^\w{1,64}: using device ([^ ]{1,64}) \((.{1,1024})\) - \d{1,9} MiB free$/;
const RE_MAIN_DEVICE = /^ggml_cuda_set_main_device: using device (\d{1,4}) \((.{1,1024})\) as main device/;
const RE_USING_CUDA = /^\w{1,64}: using CUDA for GPU acceleration/;
const RE_MEMORY_SUFFIX = /^(.{1,1024}) \((\d{1,9}) MiB, \d{1,9} MiB free\)$/;
const RE_VRAM_FIELD = /, VRAM: (\d{1,9}) MiB/;
const RE_CUDA_NAME = /^CUDA(\d{1,4})$/;
// Host-memory buffer types: CPU, CPU_Mapped, CPU_REPACK, CUDA_Host (pinned host memory), AMX...
const RE_HOST_NAME = /^(?:CPU\w{0,32}|\w{1,32}_Host|BLAS|AMX|KleidiAI|KLEIDIAI)$/;

type CpuKind = 'no-gpu' | 'cpu-devices' | 'host-buffers' | 'zero-offload';

// How far a run's process has got in its start-up, in the order one process prints them.
const STAGE = { none: 0, process: 1, backends: 2, verbosity: 3, devices: 4, loading: 5 } as const;
type Stage = (typeof STAGE)[keyof typeof STAGE];

interface DeviceNote {
  name: string;
  totalMiB: number | null;
}

interface Run {
  stage: Stage;
  cudaWeights: Map<number, string>;
  vram: { mib: string; line: string } | null;
  otherWeights: boolean;
  cpu: Array<{ kind: CpuKind; line: string }>;
  presence: string[];
  notes: Map<number, DeviceNote>;
  found: number;
  chosen: number[];
  layers: { offloaded: number; total: number } | null;
}

type Block =
  | { kind: 'cuda-enum' }
  | { kind: 'device-info'; header: string; gpu: boolean }
  | { kind: 'list'; header: string; items: number }
  // cutOff: the block opens the text, so a cut tail may have dropped its first (CUDA) lines.
  | { kind: 'buffers'; hostLines: string[]; accelerator: boolean; cutOff: boolean };

interface State {
  run: Run;
  block: Block | null;
  linesSeen: number;
}

function newRun(): Run {
  return {
    stage: STAGE.none,
    cudaWeights: new Map(),
    vram: null,
    otherWeights: false,
    cpu: [],
    presence: [],
    notes: new Map(),
    found: 0,
    chosen: [],
    layers: null,
  };
}

function prefixLength(line: string): number {
  for (const re of PREFIXES) {
    const m = re.exec(line);
    if (m && m[0].length > 0) return m[0].length;
  }
  return 0;
}

/** The line with its prefixes, colours and repeated spaces removed; '' for lines too long to matter. */
function clean(raw: string): string {
  if (raw.length > MAX_LINE_CHARS) return '';
  let line = (raw.includes('\u001b') ? raw.replace(ANSI, '') : raw).replace(WHITESPACE, ' ').trim();
  for (let strips = 0; strips < MAX_PREFIX_STRIPS; strips += 1) {
    const length = prefixLength(line);
    if (length === 0) break;
    line = line.slice(length).trimStart();
  }
  const fn = KNOWN_FUNCTION.exec(line);
  return fn && fn.index > 0 ? line.slice(fn.index) : line;
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

/** The run reaches `stage`; a line that its process can no longer print (`newFrom` reached) starts a new run. */
function enter(st: State, stage: Stage, newFrom: Stage): void {
  if (st.run.stage >= newFrom) st.run = newRun();
  if (stage > st.run.stage) st.run.stage = stage;
}

/** "llama_server: initializing ...": a process prints nothing before it. */
function beginProcess(st: State): void {
  enter(st, STAGE.process, STAGE.process);
}

/** CUDA init and no-GPU warnings: printed (maybe several) while backends load, before the verbosity line. */
function beginInit(st: State): void {
  enter(st, STAGE.backends, STAGE.verbosity);
}

/** The verbosity line: once, after backend init. */
function beginVerbosity(st: State): void {
  enter(st, STAGE.verbosity, STAGE.verbosity);
}

/** device_info or --list-devices: once, listing backends already loaded. */
function beginDevices(st: State): void {
  enter(st, STAGE.devices, STAGE.devices);
}

function beginLoad(st: State): void {
  st.run.stage = STAGE.loading;
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
      if (listed && deviceKind(listed[1] as string) === 'cuda') {
        note(run, cudaIndex(listed[1] as string), listed[2] as string, Number(listed[3]));
        run.presence.push(line);
        return true;
      }
      return false;
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
      if (deviceKind(listed[1] as string) === 'cuda') {
        note(run, cudaIndex(listed[1] as string), listed[2] as string, Number(listed[3]));
        run.presence.push(`${block.header} ${line}`);
      }
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

function closeBlock(run: Run, block: Block): void {
  if (block.kind === 'list' && block.items === 0) {
    run.cpu.push({ kind: 'cpu-devices', line: `${block.header} (none)` });
  } else if (block.kind === 'buffers' && block.hostLines.length > 0 && !block.accelerator && !block.cutOff) {
    for (const line of block.hostLines) run.cpu.push({ kind: 'host-buffers', line });
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

function classify(st: State, line: string): void {
  let m: RegExpExecArray | null;
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
    beginLoad(st);
    const offloaded = Number(m[1]);
    st.run.layers = { offloaded, total: Number(m[2]) };
    if (offloaded === 0) st.run.cpu.push({ kind: 'zero-offload', line });
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
    if (block) {
      closeBlock(st.run, block);
      st.block = null;
    }
    classify(st, line);
  }
  st.linesSeen += 1;
}

function describe(run: Run, index: number): string {
  const known = run.notes.get(index);
  if (!known) return `CUDA${index}`;
  return known.totalMiB === null ? `CUDA${index}: ${known.name}` : `CUDA${index}: ${known.name} (${known.totalMiB} MiB)`;
}

function evidenceOf(lines: string[]): string {
  const unique = [...new Set(lines)];
  const shown = unique.slice(0, MAX_EVIDENCE_LINES).join(' | ');
  return unique.length > MAX_EVIDENCE_LINES ? `${shown} | +${unique.length - MAX_EVIDENCE_LINES} more` : shown;
}

function nameList(indices: number[]): string {
  const names = indices.map((i) => `CUDA${i}`);
  return names.length <= 2 ? names.join(' and ') : `${names.slice(0, -1).join(', ')} and ${names[names.length - 1]}`;
}

/** Devices the run used: those it chose with `using device`, else all it found, sorted. */
function presentDevices(run: Run): number[] {
  if (run.chosen.length > 0) return [...run.chosen].sort((a, b) => a - b);
  const indices = new Set(run.notes.keys());
  for (let i = 0; i < run.found; i += 1) indices.add(i);
  return [...indices].sort((a, b) => a - b);
}

function account(
  run: Run,
  backend: EngineBackend,
  indices: number[],
  evidence: string[],
  summary: string,
  gpuBackendLoaded: boolean | null = true,
): EngineAccount {
  return {
    backend,
    devices: indices.map((i) => describe(run, i)),
    layersOffloaded: run.layers?.offloaded ?? null,
    layersTotal: run.layers?.total ?? null,
    gpuBackendLoaded,
    evidence: evidenceOf(evidence),
    summary,
  };
}

function decide(run: Run): EngineAccount | null {
  const layers = run.layers ? `${run.layers.offloaded}/${run.layers.total}` : null;
  if (run.cudaWeights.size > 0) {
    const indices = [...run.cudaWeights.keys()].sort((a, b) => a - b);
    const offloaded = layers ? ` and offloaded ${layers} layers` : '';
    return account(
      run,
      'CUDA',
      indices,
      indices.map((i) => run.cudaWeights.get(i) as string),
      `llama.cpp put its model buffers on ${nameList(indices)}${offloaded}`,
    );
  }
  if (run.otherWeights) return null;
  if (run.vram !== null) {
    if (run.presence.length === 0) return null;
    const indices = presentDevices(run);
    const where = indices.length > 0 ? nameList(indices) : 'its CUDA devices';
    const offloaded = layers ? ` and offloaded ${layers} layers` : '';
    return account(run, 'CUDA', indices, [run.vram.line], `llama.cpp reported ${run.vram.mib} MiB of VRAM used on ${where}${offloaded}`);
  }
  if (run.cpu.length > 0) {
    const first = (kind: CpuKind) => run.cpu.find((c) => c.kind === kind);
    const claimed = run.layers && run.layers.offloaded > 0 ? ` although it reported ${layers} layers offloaded` : '';
    const noGpu = first('no-gpu');
    const devices = first('cpu-devices');
    const host = run.cpu.filter((c) => c.kind === 'host-buffers');
    let said: string;
    if (noGpu) said = `llama.cpp found no usable GPU (${noGpu.line})`;
    else if (devices) said = `llama.cpp saw no GPU device, only the CPU (${devices.line})`;
    else if (host.length > 0) said = `llama.cpp kept all its model buffers in host memory (${host.map((c) => c.line).join(' | ')})`;
    else said = `llama.cpp offloaded no layers to the GPU (${(first('zero-offload') as { line: string }).line})`;
    const loaded = noGpu || devices ? false : run.found > 0 || run.presence.length > 0 ? true : null;
    return account(run, 'CPU', [], run.cpu.map((c) => c.line), `${said}${claimed}`, loaded);
  }
  if (run.presence.length > 0) {
    const indices = presentDevices(run);
    const saw = indices.length > 0 ? `found ${nameList(indices)}` : 'reported using CUDA';
    const claimed = layers ? ` (it reported ${layers} layers offloaded)` : '';
    return account(
      run,
      'CUDA',
      indices,
      run.presence,
      `llama.cpp ${saw} but printed no model buffer line, so weights on the GPU are not confirmed${claimed}`,
    );
  }
  return null;
}

/**
 * Whether an account rests on weights seen on a CUDA device (a `CUDA<n> model buffer` line, or the
 * 2023 "VRAM used" after CUDA devices were found), not on CUDA merely being present: such an engine
 * allocated GPU memory, which nvidia-smi must then list. Its evidence opens with that line.
 */
export function showsGpuWeights(account: EngineAccount): boolean {
  return account.backend === 'CUDA' && (RE_WEIGHTS.test(account.evidence) || RE_VRAM.test(account.evidence));
}

/**
 * What llama.cpp's output says about where it computes; null when it says nothing about it.
 * Never throws.
 */
export function parseLlamaLog(text: string): EngineAccount | null {
  if (typeof text !== 'string' || text.length === 0) return null;
  const lines = text.split(/\r\n|\r|\n/);
  // A final newline ends the last line; it does not start an empty one that would close a block.
  if (lines[lines.length - 1] === '') lines.pop();
  const st: State = { run: newRun(), block: null, linesSeen: 0 };
  for (const raw of criLines(lines)) feed(st, clean(raw));
  // --list-devices prints its whole list and exits: the end of the text closes that block.
  if (st.block?.kind === 'list') closeBlock(st.run, st.block);
  return decide(st.run);
}

/**
 * The lines as the engine wrote them: a CRI record's text without its time, stream and tag, the
 * pieces of a line (P records) joined to the stream's record that ends it; a piece the text ends
 * with is half a line, not read yet. Other lines pass as they are.
 */
function criLines(lines: string[]): string[] {
  const pieces = new Map<string, string>();
  const whole: string[] = [];
  for (const line of lines) {
    const record = RE_CRI_RECORD.exec(line);
    if (record === null) {
      whole.push(line);
      continue;
    }
    const [prefix, stream, tag] = record as unknown as [string, string, string];
    // A line past what is read stays past it (and its pieces are not kept whole).
    const text = ((pieces.get(stream) ?? '') + line.slice(prefix.length)).slice(0, MAX_LINE_CHARS + 1);
    if (tag === 'P') pieces.set(stream, text);
    else {
      pieces.delete(stream);
      whole.push(text);
    }
  }
  return whole;
}

function utf8Bytes(codePoint: number): number {
  if (codePoint < 0x80) return 1;
  if (codePoint < 0x800) return 2;
  return codePoint < 0x10000 ? 3 : 4;
}

/**
 * previous + chunk, keeping at most the last maxBytes of UTF-8. When it cuts, it starts at the
 * first whole line left (if any) and never inside a surrogate pair, so a parser sees whole lines.
 */
export function appendTail(previous: string, chunk: string, maxBytes: number = ENGINE_TAIL_MAX_BYTES): string {
  const all = previous + chunk;
  if (!(maxBytes > 0)) return '';
  let excess = Buffer.byteLength(all, 'utf8') - maxBytes;
  if (excess <= 0) return all;
  let start = 0;
  while (excess > 0) {
    const codePoint = all.codePointAt(start) as number;
    excess -= utf8Bytes(codePoint);
    start += codePoint > 0xffff ? 2 : 1;
  }
  if (all[start - 1] !== '\n') {
    const newline = all.indexOf('\n', start);
    // Keep the cut mid-line when the only newline left is the last character.
    if (newline >= 0 && newline + 1 < all.length) start = newline + 1;
  }
  return all.slice(start);
}
