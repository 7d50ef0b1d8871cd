// Owns which model files a process loaded, as /proc shows them with no help from the engine: the
// GGUF files it maps (llama.cpp and Ollama mmap the model by default and, once loaded, unmap what
// they put on a GPU), else the file its command line names (-m/--model, or llama.cpp's
// LLAMA_ARG_MODEL: --no-mmap leaves no mapping), and a split model's other splits beside them; also
// the GPU layers its command line asks for (-ngl, or LLAMA_ARG_N_GPU_LAYERS), as written.
// The rule: a file counts only when it begins with GGUF's magic, read with its layer count once per
// file through the process's own root (/proc/PID/root); a deleted one, which cannot be opened,
// counts by its name.
// Each read has a deadline: one that does not answer leaves that process unjudged, and no second
// read of it starts until the first answers. The parsers of /proc/PID/maps and cmdline are pure:
// only what the text says, a path as the process itself sees it.
import { open, readFile, type FileHandle } from 'node:fs/promises';
import { settleWithin } from '../deadline.js';
import { readGgufHeader, type GgufHeader } from './gguf-header.js';
import { codeOf, isGone } from './procfs.js';

/** One file mapped read-only and not executable (libraries' code is left out), with every range of it summed. */
type MappedFile = { path: string; deleted: boolean; device: string; inode: string; mappedBytes: number };

// start-end perms offset dev inode [path]; the path may hold spaces and ends " (deleted)" once unlinked.
const MAPS_LINE = /^([0-9a-f]+)-([0-9a-f]+) (\S{4}) [0-9a-f]+ (\S+) (\d+) +(\/.*)$/;
const DELETED = ' (deleted)';
// Device files, SysV shared memory and memfd regions are no model file (and reading a device could
// block); a file on /dev/shm, a tmpfs where models are staged, is one.
const NOT_FILES = /^\/(?:dev\/(?!shm\/)|SYSV|memfd:)/;

export function parseMappedFiles(text: string): MappedFile[] {
  const files = new Map<string, MappedFile>();
  for (const line of text.split('\n')) {
    const match = MAPS_LINE.exec(line);
    if (match === null) continue;
    const [, start, end, perms, device, inode, rawPath] = match as unknown as [string, string, string, string, string, string, string];
    if (inode === '0' || perms[0] !== 'r' || perms[2] === 'x' || NOT_FILES.test(rawPath)) continue;
    const deleted = rawPath.endsWith(DELETED);
    const path = deleted ? rawPath.slice(0, -DELETED.length) : rawPath;
    const bytes = parseInt(end, 16) - parseInt(start, 16);
    const key = `${device}:${inode}`;
    const known = files.get(key);
    if (known === undefined) files.set(key, { path, deleted, device, inode, mappedBytes: bytes });
    else known.mappedBytes += bytes;
  }
  return [...files.values()];
}

/** The model file an engine's argv names: `-m PATH`, `--model PATH` or `--model=PATH` (llama.cpp, Ollama's runner); null when none. */
export function modelArgument(argv: readonly string[]): string | null {
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i]!;
    if ((arg === '-m' || arg === '--model') && i + 1 < argv.length && argv[i + 1] !== '') return argv[i + 1]!;
    if (arg.startsWith('--model=') && arg.length > '--model='.length) return arg.slice('--model='.length);
  }
  return null;
}

/** Whether argv runs one of llama.cpp's programs (llama-server, llama-cli, ...). */
const isLlamaProgram = (argv: readonly string[]): boolean => /(?:^|\/)llama-[^/]*$/.test(argv[0] ?? '');

/**
 * The value a llama.cpp program's environment (/proc/PID/environ's entries) gives `name`, a LLAMA_ARG_*
 * variable standing for an argument; null when none. Only a llama-* program reads them: a wrapper (sh,
 * tini) inherits them and loads nothing.
 */
function llamaVariable(argv: readonly string[], environment: readonly string[], name: string): string | null {
  if (!isLlamaProgram(argv)) return null;
  const value = environment.find((entry) => entry.startsWith(`${name}=`))?.slice(name.length + 1);
  return value === undefined || value === '' ? null : value;
}

/** The model LLAMA_ARG_MODEL names for a llama.cpp program; null when none. */
export const modelVariable = (argv: readonly string[], environment: readonly string[]): string | null => llamaVariable(argv, environment, 'LLAMA_ARG_MODEL');

const LAYERS_FLAGS = new Set(['-ngl', '--gpu-layers', '--n-gpu-layers']);

/**
 * The GPU layers an engine's argv asks for, as written (a count, or llama.cpp's `auto` and `all`), the
 * last one given as its parser keeps; null when none. Ollama's runners take it too: `--n-gpu-layers N`
 * (to 0.11.4), `-ngl N` (its llama-server, 2026).
 */
export function gpuLayersArgument(argv: readonly string[]): string | null {
  let asked: string | null = null;
  for (let i = 0; i + 1 < argv.length; i += 1) if (LAYERS_FLAGS.has(argv[i]!) && argv[i + 1] !== '') asked = argv[i + 1]!;
  return asked;
}

/** The GPU layers a process asks for: its argv's, else LLAMA_ARG_N_GPU_LAYERS for a llama-* program (its environment read only then); null: unsaid. */
export async function gpuLayersOf(argv: readonly string[], environment: () => Promise<readonly string[]>): Promise<string | null> {
  const asked = gpuLayersArgument(argv);
  if (asked !== null || !isLlamaProgram(argv)) return asked;
  return llamaVariable(argv, await environment(), 'LLAMA_ARG_N_GPU_LAYERS');
}

/** A process's environment (/proc/PID/environ under `base`); [] where it cannot be read. */
export const environmentOf = (base: string, pid: number): Promise<string[]> => readFile(`${base}${pid}/environ`).then(parseCmdline, () => []);

/** /proc/PID/cmdline's NUL-separated arguments (and /proc/PID/environ's entries). */
export function parseCmdline(bytes: Buffer): string[] {
  const args = bytes.toString('utf8').split('\0');
  if (args.at(-1) === '') args.pop();
  return args;
}

const SPLIT = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/i;

/** Every split of a model in splits (llama.cpp's gguf-split names: `m-00001-of-00003.gguf`) as `path` names one; [] for a whole file. */
export function splitsOf(path: string): string[] {
  const match = SPLIT.exec(path);
  if (match === null) return [];
  const [, stem, , count] = match as unknown as [string, string, string, string];
  return Array.from({ length: Number(count) }, (_, i) => `${stem}-${String(i + 1).padStart(5, '0')}-of-${count}.gguf`);
}

/** A name that only a model has: a .gguf file, or an Ollama blob (sha256-named, no extension). */
export function namedLikeModel(path: string): boolean {
  return /\.gguf$/i.test(path) || /\/blobs\/sha256[-:][0-9a-f]{64}$/.test(path);
}

/**
 * `mappedBytes`: what is still mapped in host memory (null: named on the command line, not mapped); `bytes`: the file's size,
 * null when it cannot be opened; `layers`: the layers llama.cpp can offload of the model it holds (gguf-header.ts), null
 * when its header does not say (a split but the first, a file that cannot be opened).
 */
export type ModelFile = { path: string; deleted: boolean; bytes: number | null; mappedBytes: number | null; seenIn: 'mapping' | 'command-line'; layers: number | null };

/**
 * A process's model files; `unreadable`: why its maps could not be read (the files are then unknown, not
 * none); `gpuLayers`: the GPU layers its command line asks for (gpuLayersArgument), absent when unsaid.
 */
export type ProcessModelFiles = { files: ModelFile[]; unreadable: string | null; gpuLayers?: string };

/** Mappings smaller than this, not named .gguf, are not worth opening: no model blob is that small. */
const PROBE_MIN_BYTES = 16 * 1024 * 1024;
/** Files probed before the cache starts again (models come and go over weeks). */
const PROBED_MAX = 1024;
/** A process's maps, and the model files they name, answer in microseconds; a hung mount or a held mmap lock never does. */
const READ_DEADLINE_MS = 1000;
/** Stuck reads at most: each holds a thread of libuv's pool (8 as shipped), which NVML's calls and the state file need too. */
const STUCK_MAX = 2;
const STUCK_MEANING = 'its weights are not judged until it answers (a model on a hung network mount, or a process stuck in the kernel); the next refreshes try again';

type Probe = { gguf: boolean | null; bytes: number | null; layers: number | null };

export type ModelFileReader = ReturnType<typeof createModelFileReader>;

/** Why a process's maps could not be read, by the errno (null: it is gone). */
export function mapsUnreadable(pid: number, err: unknown): string | null {
  if (isGone(err)) return null;
  const code = codeOf(err);
  if (code === 'EACCES' || code === 'EPERM') {
    return (
      `nodecompute may not read /proc/${pid}/maps (${code}): another user's process needs nodecompute to run as root with CAP_SYS_PTRACE ` +
      '(deploy/kubernetes/README.md, "Seeing where weights are"); until then its weights are not judged'
    );
  }
  return `reading /proc/${pid}/maps failed (${code || (err as Error).message})`;
}

/** probedMax: files whose probe is remembered before the memory starts again; deadlineMs: how long one
 *  process's read may take. */
export function createModelFileReader(root: string, { probedMax = PROBED_MAX, deadlineMs = READ_DEADLINE_MS } = {}) {
  const base = root.endsWith('/') ? root : `${root}/`;
  const probed = new Map<string, Probe>();
  // What a file's first bytes say, by its identity and version: a file named on a command line (--no-mmap) is opened at
  // every refresh, its header read once per version.
  const headers = new Map<string, GgufHeader>();
  // Reads past their deadline, by PID: each holds a libuv thread until the kernel answers.
  const stuck = new Map<number, Promise<unknown>>();

  const remember = <T>(cache: Map<string, T>, key: string, value: T): T => {
    if (cache.size >= probedMax) cache.clear();
    cache.set(key, value);
    return value;
  };

  /** Opens `path` as process `pid` sees it: whether it is GGUF, its size and layers; null for each that cannot be read. */
  const probe = async (pid: number, path: string): Promise<Probe> => {
    let file: FileHandle | undefined;
    try {
      file = await open(`${base}${pid}/${path.startsWith('/') ? `root${path}` : `cwd/${path}`}`, 'r');
      // The change time, which no one can set back, and a bigint inode (overlayfs and NFS ones pass 2^53) name a version.
      const { dev, ino, size, ctimeNs } = await file.stat({ bigint: true });
      const key = `${dev}:${ino}:${size}:${ctimeNs}`;
      return { ...(headers.get(key) ?? remember(headers, key, await readGgufHeader(file))), bytes: Number(size) };
    } catch {
      return { gguf: null, bytes: null, layers: null };
    } finally {
      await file?.close();
    }
  };

  const probeMapped = async (pid: number, file: MappedFile): Promise<Probe> => {
    if (file.deleted) return { gguf: null, bytes: null, layers: null };
    const key = `${file.device}:${file.inode}:${file.path}`;
    return probed.get(key) ?? remember(probed, key, await probe(pid, file.path));
  };

  const counts = (file: { path: string }, found: Probe): boolean =>
    found.gguf === true || (found.gguf === null && namedLikeModel(file.path));

  /** The process's arguments: a process gone since its maps were read throws, to answer null as one gone before; [] where they may not be read (hidepid). */
  const argvOf = (pid: number): Promise<string[]> =>
    readFile(`${base}${pid}/cmdline`).then(parseCmdline, (err: unknown) => {
      if (isGone(err)) throw err;
      return [];
    });

  /** The environment, read once and only when an argument leaves a question open. */
  const lazily = (pid: number): (() => Promise<string[]>) => {
    let environment: Promise<string[]> | undefined;
    return () => (environment ??= environmentOf(base, pid));
  };

  const fromCommandLine = async (pid: number, argv: readonly string[], environment: () => Promise<string[]>): Promise<ModelFile[]> => {
    const path = modelArgument(argv) ?? modelVariable(argv, await environment());
    if (path === null) return [];
    const found = await probe(pid, path);
    return counts({ path }, found) ? [{ path, deleted: false, bytes: found.bytes, mappedBytes: null, seenIn: 'command-line', layers: found.layers }] : [];
  };

  // The loader unmaps a split whose tensors all went to a GPU whole, and a command line names the
  // first split only: the other splits of a model seen are found beside it (a file there that is not
  // GGUF is none).
  const withSplits = async (pid: number, files: ModelFile[]): Promise<ModelFile[]> => {
    const all = [...files];
    for (const file of files) {
      for (const path of splitsOf(file.path)) {
        if (all.some((known) => known.path === path)) continue;
        const found = await probe(pid, path);
        // One that cannot be opened counts with its size unknown: leaving it out would overstate the share on the GPU.
        if (counts({ path }, found)) all.push({ path, deleted: false, bytes: found.bytes, mappedBytes: file.mappedBytes === null ? null : 0, seenIn: file.seenIn, layers: found.layers });
      }
    }
    return all;
  };

  const readNow = async (pid: number): Promise<ProcessModelFiles | null> => {
    try {
      const mapped = parseMappedFiles(await readFile(`${base}${pid}/maps`, 'utf8')).filter(
        (file) => file.mappedBytes >= PROBE_MIN_BYTES || namedLikeModel(file.path),
      );
      const files: ModelFile[] = [];
      for (const file of mapped) {
        const found = await probeMapped(pid, file);
        if (counts(file, found)) files.push({ path: file.path, deleted: file.deleted, bytes: found.bytes, mappedBytes: file.mappedBytes, seenIn: 'mapping', layers: found.layers });
      }
      const argv = await argvOf(pid);
      const environment = lazily(pid);
      const all = await withSplits(pid, files.length > 0 ? files : await fromCommandLine(pid, argv, environment));
      const gpuLayers = await gpuLayersOf(argv, environment);
      return { files: all, unreadable: null, ...(gpuLayers === null ? {} : { gpuLayers }) };
    } catch (err) {
      const why = mapsUnreadable(pid, err);
      return why === null ? null : { files: [], unreadable: why };
    }
  };

  return {
    /** Null when the process is gone. */
    async read(pid: number): Promise<ProcessModelFiles | null> {
      if (stuck.has(pid)) return { files: [], unreadable: `the last read of /proc/${pid}/maps (or a file it maps) has not answered yet: ${STUCK_MEANING}` };
      if (stuck.size >= STUCK_MAX) return { files: [], unreadable: `not read: ${stuck.size} reads of other processes' maps have not answered (${STUCK_MEANING})` };
      const reading = readNow(pid);
      const first = await settleWithin(reading, deadlineMs, () => 'late' as const);
      if (first !== 'late') return first;
      stuck.set(pid, reading);
      void reading.finally(() => stuck.delete(pid));
      return { files: [], unreadable: `reading /proc/${pid}/maps (or a file it maps) did not answer within ${deadlineMs} ms: ${STUCK_MEANING}` };
    },
  };
}
