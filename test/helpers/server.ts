// Starts the built service (dist/src/main.js; `npm test` builds first) as a real process on a free
// port, collects its JSON logs, and stops it. For the tests that need a real process: signals,
// restarts, crashes.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import { waitUntil } from './fake-nvidia-smi.js';

export const MAIN = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url));

export interface RunningServer {
  url: string;
  child: ChildProcess;
  logs: () => Array<Record<string, unknown>>;
  /** The JSON log lines as written (JSON.parse would hide a key written twice). */
  lines: () => string[];
  stderr: () => string;
  /** Resolves with the exit code (or signal name) once the process has exited. */
  exited: Promise<number | string>;
  /**
   * fetch() on this server's URL. A request that gets no answer (a reset, a refused connection)
   * fails with what the process was doing then: alive or how it ended, its stderr and last log lines.
   */
  fetch: (path: string, init?: RequestInit) => Promise<Response>;
}

/** How long a request that got no answer waits for the server's exit to be seen before reporting. */
const EXIT_NOTICE_MS = 1000;

export async function startServer(t: Test, env: Record<string, string>, args: string[] = []): Promise<RunningServer> {
  const child = spawn(process.execPath, [MAIN, ...args], {
    env: { ...process.env, NODECOMPUTE_HOST: '127.0.0.1', NODECOMPUTE_PORT: '0', NODECOMPUTE_LOG_LEVEL: 'info', NODECOMPUTE_BACKEND: 'nvidia-smi', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | string>((resolve) => child.on('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')));
  let done = false;
  void exited.then(() => (done = true));
  t.teardown(async () => {
    if (!done) child.kill('SIGKILL');
    await exited;
  });
  const lines = () => stdout.split('\n').filter((line) => line.startsWith('{'));
  const logs = () => lines().map((line) => JSON.parse(line) as Record<string, unknown>);
  await waitUntil(() => done || logs().some((entry) => typeof entry.url === 'string'), { timeoutMs: 30_000, what: 'the server to listen' });
  const listening = logs().find((entry) => typeof entry.url === 'string');
  if (!listening) throw new Error(`the server exited before listening: ${stderr}`);
  const url = listening.url as string;
  const request = async (path: string, init?: RequestInit): Promise<Response> => {
    try {
      return await fetch(`${url}${path}`, init);
    } catch (err) {
      const cause = (err as Error & { cause?: NodeJS.ErrnoException }).cause;
      const end = await within(exited, EXIT_NOTICE_MS);
      const state = end === 'still running' ? `was still running ${EXIT_NOTICE_MS} ms later` : `had exited (${end})`;
      throw new Error(
        `${init?.method ?? 'GET'} ${path} got no answer (${cause?.code ?? cause?.message ?? (err as Error).message}); the server (pid ${child.pid}) ${state}. ` +
          `Its stderr: ${JSON.stringify(stderr)}. Its last log lines:\n${lines().slice(-10).join('\n')}`,
        { cause: err },
      );
    }
  };
  return { url, child, logs, lines, stderr: () => stderr, exited, fetch: request };
}

/**
 * Runs main.js with `args` to its end, on the environment plus `env`: how it ended (the exit code or
 * signal name, or 'still running' when it was killed after `hangMs`) and what it printed.
 */
export async function runToEnd(args: string[], env: Record<string, string>, hangMs: number): Promise<{ end: number | string; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [MAIN, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | string>((resolve) => child.on('exit', (code, signal) => resolve(code ?? signal ?? 'unknown')));
  const end = await within(exited, hangMs);
  if (end === 'still running') {
    child.kill('SIGKILL');
    await exited;
  }
  return { end, stdout, stderr };
}

/** How `exited` ended: the exit code or signal name, or 'still running' after `ms`. */
export function within(exited: Promise<number | string>, ms: number): Promise<number | string> {
  let timer: NodeJS.Timeout | undefined;
  const giveUp = new Promise<string>((resolve) => (timer = setTimeout(() => resolve('still running'), ms)));
  return Promise.race([exited, giveUp]).finally(() => clearTimeout(timer));
}
