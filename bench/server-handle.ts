// Owns the parent's side of a benchmark server (bench/server.ts in a child process): starting it,
// reading its resident memory and CPU time from /proc (its own numbers, not the load generator's),
// and stopping it. The child's output is kept as a short tail to explain a failure.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { FromServer, ServerSpec, ToServer } from './server.js';

const SERVER_JS = fileURLToPath(new URL('./server.js', import.meta.url));
/** How the service ships (package.json's config, the Dockerfile's NODE_OPTIONS, MALLOC_ARENA_MAX and UV_THREADPOOL_SIZE). */
const SHIPPED = (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { config: { nodeOptions: string; mallocArenaMax: string; uvThreadpoolSize: string } })
  .config;
const SERVICE_NODE_OPTIONS = SHIPPED.nodeOptions.split(' ');
/**
 * Node flags for the servers only, after the shipped ones (BENCH_SERVER_NODE_ARGS, split on spaces):
 * to profile them, e.g. `--cpu-prof --cpu-prof-dir=/tmp/prof`, which NODE_OPTIONS does not take.
 */
const EXTRA_NODE_ARGS = (process.env.BENCH_SERVER_NODE_ARGS ?? '').split(' ').filter((arg) => arg !== '');
/** As with `npm start`, a MALLOC_ARENA_MAX or UV_THREADPOOL_SIZE of the caller's own wins (an empty one counts as unset). */
const SERVICE_ENV = {
  ...process.env,
  MALLOC_ARENA_MAX: process.env.MALLOC_ARENA_MAX || SHIPPED.mallocArenaMax,
  UV_THREADPOOL_SIZE: process.env.UV_THREADPOOL_SIZE || SHIPPED.uvThreadpoolSize,
};
const TAIL_CHARS = 4000;

/** Clock ticks per second of the times in /proc/PID/stat (USER_HZ; 100 on every Linux port that matters). */
export const USER_HZ = 100;

export interface CpuTicks {
  self: number;
  children: number;
}

export interface ServerHandle {
  name: string;
  url: string;
  pid: number;
  /** VmRSS from /proc/PID/status, in bytes. */
  rssBytes(): number;
  /**
   * CPU time from /proc/PID/stat, in clock ticks (USER_HZ): `self` is the process's own utime +
   * stime, `children` the cutime + cstime of its children it has waited for (nvidia-smi runs).
   */
  cpuTicks(): CpuTicks;
  memoryUsage(): Promise<NodeJS.MemoryUsage>;
  output(): string;
  stop(): Promise<void>;
}

function nextMessage<T extends FromServer['type']>(child: ChildProcess, type: T, timeoutMs: number, output: () => string): Promise<Extract<FromServer, { type: T }>> {
  return new Promise((resolve, reject) => {
    const cleanup = () => {
      clearTimeout(timer);
      child.off('message', onMessage);
      child.off('exit', onExit);
    };
    const onMessage = (message: FromServer) => {
      if (message.type === 'error') {
        cleanup();
        reject(new Error(`benchmark server failed: ${message.message}`));
      } else if (message.type === type) {
        cleanup();
        resolve(message as Extract<FromServer, { type: T }>);
      }
    };
    const onExit = (code: number | null, signal: string | null) => {
      cleanup();
      reject(new Error(`benchmark server exited (${code ?? signal}) while waiting for "${type}": ${output()}`));
    };
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`benchmark server sent no "${type}" within ${timeoutMs} ms: ${output()}`));
    }, timeoutMs);
    child.on('message', onMessage);
    child.once('exit', onExit);
  });
}

export async function startServer(name: string, spec: ServerSpec): Promise<ServerHandle> {
  const child = spawn(process.execPath, [...SERVICE_NODE_OPTIONS, ...EXTRA_NODE_ARGS, SERVER_JS], { env: SERVICE_ENV, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  let tail = '';
  const keep = (chunk: Buffer) => {
    tail = (tail + chunk.toString()).slice(-TAIL_CHARS);
  };
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  const output = () => tail;
  const listening = nextMessage(child, 'listening', 30_000, output);
  child.send({ type: 'start', spec } satisfies ToServer);
  let port: number;
  try {
    ({ port } = await listening);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  const pid = child.pid!;
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
  return {
    name,
    url: `http://127.0.0.1:${port}`,
    pid,
    rssBytes() {
      const status = readFileSync(`/proc/${pid}/status`, 'utf8');
      const kib = /^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1];
      if (kib === undefined) throw new Error(`no VmRSS in /proc/${pid}/status`);
      return Number(kib) * 1024;
    },
    cpuTicks() {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // Fields 14 to 17 of proc(5) (utime, stime, cutime, cstime); this array starts at field 3.
      return { self: Number(fields[11]) + Number(fields[12]), children: Number(fields[13]) + Number(fields[14]) };
    },
    async memoryUsage() {
      const reply = nextMessage(child, 'memory', 5_000, output);
      child.send({ type: 'memory' } satisfies ToServer);
      return (await reply).usage;
    },
    output,
    async stop() {
      if (child.connected) child.send({ type: 'stop' } satisfies ToServer);
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
