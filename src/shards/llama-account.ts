// Owns llama.cpp's own account of where it computes, decided over the evidence of one run; the
// strongest wins, not the latest: weights in a CUDA buffer (the only proof: they cannot exist if CUDA
// failed) or, in 2023 logs, VRAM used where CUDA devices were found -> CUDA; weights on another
// accelerator -> null; any CPU evidence -> CPU; CUDA merely present -> CUDA, with a summary saying so.
// "offloaded N/M layers" alone is a claim, not evidence. Summaries are quoted to operators verbatim.
import { andList } from './verdict.js';

export type EngineBackend = 'CUDA' | 'CPU';

export interface EngineAccount {
  backend: EngineBackend;
  /** As the engine names them ("CUDA0: NAME (T MiB)" or "CUDA0"); empty for CPU. */
  devices: string[];
  /** From `offloaded N/M layers to GPU`, else null. */
  layersOffloaded: number | null;
  layersTotal: number | null;
  /** True: it found or used a CUDA device (so a CPU account means -ngl); false: no usable GPU or only the CPU listed (the build); null: unsaid. */
  gpuBackendLoaded: boolean | null;
  /** The decisive line(s), prefixes removed and spaces collapsed, joined by " | ". */
  evidence: string;
  /** One sentence (no final period) saying what the engine itself saw. */
  summary: string;
}

export type CpuKind = 'no-gpu' | 'cpu-devices' | 'host-buffers' | 'zero-offload' | 'cpu-runner';

/** What one run of the engine printed, as evidence. */
export interface Run {
  /** CUDA index -> its weights' buffer line (size > 0). */
  cudaWeights: Map<number, string>;
  /** The 2023 "VRAM used" (> 0). */
  vram: { mib: string; line: string } | null;
  /** Weights on another accelerator (ROCm, Vulkan, Metal, RPC...). */
  otherWeights: boolean;
  cpu: Array<{ kind: CpuKind; line: string }>;
  /** Lines showing CUDA present: devices found, listed or chosen. */
  presence: string[];
  notes: Map<number, { name: string; totalMiB: number | null }>;
  found: number;
  chosen: number[];
  layers: { offloaded: number; total: number } | null;
}

const MAX_EVIDENCE_LINES = 4;

export function newRun(): Run {
  return { cudaWeights: new Map(), vram: null, otherWeights: false, cpu: [], presence: [], notes: new Map(), found: 0, chosen: [], layers: null };
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

const nameList = (indices: number[]): string => andList(indices.map((i) => `CUDA${i}`));

/** Devices the run used: those it chose with `using device`, else all it found, sorted. */
function presentDevices(run: Run): number[] {
  if (run.chosen.length > 0) return [...run.chosen].sort((a, b) => a - b);
  const indices = new Set(run.notes.keys());
  for (let i = 0; i < run.found; i += 1) indices.add(i);
  return [...indices].sort((a, b) => a - b);
}

function account(run: Run, backend: EngineBackend, indices: number[], lines: string[], summary: string, loaded: boolean | null = true): EngineAccount {
  return {
    backend,
    devices: indices.map((i) => describe(run, i)),
    layersOffloaded: run.layers?.offloaded ?? null,
    layersTotal: run.layers?.total ?? null,
    gpuBackendLoaded: loaded,
    evidence: evidenceOf(lines),
    summary,
  };
}

/** The run's account, `name` the engine as its summary names it; null when it says nothing the contract can name. */
export function decideAccount(run: Run, name: string): EngineAccount | null {
  const layers = run.layers ? `${run.layers.offloaded}/${run.layers.total}` : null;
  const offloaded = layers ? ` and offloaded ${layers} layers` : '';
  if (run.cudaWeights.size > 0) {
    const indices = [...run.cudaWeights.keys()].sort((a, b) => a - b);
    const lines = indices.map((i) => run.cudaWeights.get(i) as string);
    return account(run, 'CUDA', indices, lines, `${name} put its model buffers on ${nameList(indices)}${offloaded}`);
  }
  if (run.otherWeights) return null;
  // The 2023 "total VRAM used" counts scratch and KV buffers that exist with no layer offloaded.
  if (run.vram !== null && run.layers?.offloaded !== 0) {
    // That era's proof, where CUDA devices were found; without them, another accelerator's.
    if (run.presence.length === 0) return null;
    const indices = presentDevices(run);
    const where = indices.length > 0 ? nameList(indices) : 'its CUDA devices';
    return account(run, 'CUDA', indices, [run.vram.line], `${name} reported ${run.vram.mib} MiB of VRAM used on ${where}${offloaded}`);
  }
  if (run.cpu.length > 0) {
    const first = (kind: CpuKind) => run.cpu.find((c) => c.kind === kind);
    const claimed = run.layers && run.layers.offloaded > 0 ? ` although it reported ${layers} layers offloaded` : '';
    const noGpu = first('no-gpu');
    const devices = first('cpu-devices');
    const host = run.cpu.filter((c) => c.kind === 'host-buffers');
    const zero = first('zero-offload');
    let said: string;
    if (noGpu) said = `${name} found no usable GPU (${noGpu.line})`;
    else if (devices) said = `${name} saw no GPU device, only the CPU (${devices.line})`;
    else if (host.length > 0) said = `${name} kept all its model buffers in host memory (${host.map((c) => c.line).join(' | ')})`;
    else if (zero) said = `${name} offloaded no layers to the GPU (${zero.line})`;
    else said = `${name} started its CPU runner (${first('cpu-runner')!.line})`;
    const loaded = noGpu || devices ? false : run.found > 0 || run.presence.length > 0 ? true : null;
    return account(run, 'CPU', [], run.cpu.map((c) => c.line), `${said}${claimed}`, loaded);
  }
  if (run.presence.length > 0) {
    const indices = presentDevices(run);
    const saw = indices.length > 0 ? `found ${nameList(indices)}` : 'reported using CUDA';
    const claimed = layers ? ` (it reported ${layers} layers offloaded)` : '';
    return account(run, 'CUDA', indices, run.presence, `${name} ${saw} but printed no model buffer line, so weights on the GPU are not confirmed${claimed}`);
  }
  return null;
}
