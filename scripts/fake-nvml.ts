// Owns building and installing the fake NVML library (test/fixtures/nvml/fake-nvml.c) for tests
// without a GPU: compiled once per source and variant with the system `cc` into a shared temp cache,
// then copied beside a fake nvidia-smi's scenario.json, which the library reads. Every file it puts
// in place lands by rename, so a process that loaded or is building a copy never sees half a file.
import { createHash, randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export type FakeNvmlVariant = 'current' | 'old';

export interface BuildFakeNvmlOptions {
  /** Where builds are cached; `<tmpdir>/nodecompute-fake-nvml` when absent. */
  cacheDir?: string;
  /** The compiler's environment (PATH finds `cc`); this process's when absent. */
  env?: NodeJS.ProcessEnv;
}

/** One line of `<dir>/nvml-calls.log`, written when the scenario sets `nvml.logCalls`. */
export interface NvmlCall {
  fn: string;
  /** The device index the call was about, or null. */
  index: number | null;
  /** The process that made the call. */
  pid: number | null;
}

/** The library's C source, from scripts/ (TypeScript run by tests) or dist/scripts/ (compiled). */
export function fakeNvmlSource(from: string = import.meta.url): string {
  for (const up of ['../', '../../']) {
    const path = fileURLToPath(new URL(`${up}test/fixtures/nvml/fake-nvml.c`, from));
    if (existsSync(path)) return path;
  }
  throw new Error(`The fake NVML source (test/fixtures/nvml/fake-nvml.c) is not beside ${fileURLToPath(from)}: run this from a checkout of the repository.`);
}

/** Compiles the fake (once per source and variant) and returns the path of its libnvidia-ml.so.1. */
export function buildFakeNvml(variant: FakeNvmlVariant = 'current', options: BuildFakeNvmlOptions = {}): string {
  const source = fakeNvmlSource();
  const text = readFileSync(source);
  const key = createHash('sha256').update(text).update(`\0${variant}`).digest('hex').slice(0, 16);
  const dir = join(options.cacheDir ?? join(tmpdir(), 'nodecompute-fake-nvml'), key);
  const library = join(dir, 'libnvidia-ml.so.1');
  if (existsSync(library)) return library;
  mkdirSync(dir, { recursive: true });
  const temp = join(dir, `.build-${process.pid}-${randomBytes(6).toString('hex')}.so`);
  const args = ['-std=c11', '-D_GNU_SOURCE', '-shared', '-fPIC', '-O2', '-Wall', '-Wextra', '-Werror'];
  if (variant === 'old') args.push('-DFAKE_NVML_OLD');
  args.push('-o', temp, '-Wl,-soname,libnvidia-ml.so.1', source, '-ldl', '-lpthread');
  try {
    execFileSync('cc', args, { env: options.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (error) {
    rmSync(temp, { force: true });
    const failure = error as NodeJS.ErrnoException & { stderr?: Buffer };
    if (failure.code === 'ENOENT') {
      throw new Error('The fake NVML library needs a C compiler, `cc`, on PATH: install one (`apt-get install gcc`, or build-essential).');
    }
    throw new Error(`\`cc\` could not build the fake NVML library (${source}):\n${String(failure.stderr).trim()}`);
  }
  renameSync(temp, library);
  return library;
}

/** Puts the fake library in `dir`, beside the fake nvidia-smi's scenario.json it answers from. */
export function installFakeNvml(dir: string, variant: FakeNvmlVariant = 'current', options: BuildFakeNvmlOptions = {}): string {
  const path = join(dir, 'libnvidia-ml.so.1');
  // A new file renamed into place: a copy this process already loaded keeps its own pages.
  const temp = `${path}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  copyFileSync(buildFakeNvml(variant, options), temp);
  renameSync(temp, path);
  return path;
}

/** The calls the fake in `dir` logged, oldest first. */
export function nvmlCalls(dir: string): NvmlCall[] {
  const path = join(dir, 'nvml-calls.log');
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => {
      // `<function> <device index or -> <pid>`
      const [fn, index, pid] = line.split(' ') as [string, string, string];
      return { fn, index: index === '-' ? null : Number(index), pid: Number(pid) };
    });
}
