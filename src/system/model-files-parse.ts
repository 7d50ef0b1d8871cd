// Owns reading a process's model files out of its /proc text: the file mappings of /proc/PID/maps
// (grouped by file, with the bytes still mapped) and the model an engine's command line names. Pure:
// no file is opened here. The rule: only what the text says; a path is the process's own view.

/** One file mapped read-only and not executable (libraries' code is left out), with every range of it summed. */
export type MappedFile = { path: string; deleted: boolean; device: string; inode: string; mappedBytes: number };

// start-end perms offset dev inode [path]; the path may hold spaces and ends " (deleted)" once unlinked.
const MAPS_LINE = /^([0-9a-f]+)-([0-9a-f]+) (\S{4}) [0-9a-f]+ (\S+) (\d+) +(\/.*)$/;
const DELETED = ' (deleted)';
// Devices, shared memory and memfd regions are no model file.
const NOT_FILES = /^\/(?:dev|SYSV|memfd:)/;

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

/** /proc/PID/cmdline's NUL-separated arguments. */
export function parseCmdline(bytes: Buffer): string[] {
  const text = bytes.toString('utf8');
  const args = text.split('\0');
  if (args.at(-1) === '') args.pop();
  return args;
}

/** GGUF files begin with these four bytes ("GGUF", little-endian 0x46554747). */
export const GGUF_MAGIC = Buffer.from('GGUF', 'latin1');

/** A name that only a model has: a .gguf file, or an Ollama blob (sha256-named, no extension). */
export function namedLikeModel(path: string): boolean {
  return /\.gguf$/i.test(path) || /\/blobs\/sha256[-:][0-9a-f]{64}$/.test(path);
}
