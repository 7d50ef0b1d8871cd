// Starts the tests' model loaders (test/fixtures/engines/) as real processes in process groups of
// their own, and registers one as a shard that the fake nvidia-smi lists holding some GPU memory:
// the service then reads the loader's real /proc/PID/maps and cmdline.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import { buildTestApp, manualClock, settle } from './app.js';
import { livePidsInGroup, waitUntil, type FakeMemory } from './fake-nvidia-smi.js';
import { twoGpuNode, UUIDS } from './two-gpu-node.js';

/** Maps a file as llama.cpp's loader does, unmapping what --keep leaves out (Python, ctypes). */
export const MAPPING_LOADER = fileURLToPath(new URL('../fixtures/engines/model-loader.py', import.meta.url));
/** A real llama.cpp (node-llama-cpp's CPU build) loading the model. */
export const LLAMA_CPP_LOADER = fileURLToPath(new URL('../fixtures/engines/llama-cpp-loader.mjs', import.meta.url));

/** A folder for the test's models, removed after it. */
export function modelDir(t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-model-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Runs `command args` in a process group of its own; resolves with its PID and what it printed once it prints "loaded". */
export async function startLoader(t: Test, command: string, args: string[]): Promise<{ pid: number; said: string }> {
  const child = spawn(command, args, { detached: true, stdio: ['ignore', 'pipe', 'inherit'] });
  const pid = child.pid!;
  t.teardown(async () => {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // already gone
    }
    await waitUntil(() => livePidsInGroup(pid).length === 0, { what: `the loader ${pid} to die` });
  });
  const said = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes('loaded') && out.endsWith('\n')) resolve(out);
    });
    child.on('exit', (code) => reject(new Error(`${command} exited (${code}) before it loaded its model`)));
  });
  return { pid, said };
}

/** An app whose fake lists `pid` on GPU 0 with `usedMiB`, registered as shard "s" (grace 0 unless given). */
export async function shardHeldBy(t: Test, pid: number, usedMiB: FakeMemory, registration: Record<string, unknown> = {}) {
  const clock = manualClock();
  const scenario = twoGpuNode([{ gpuUuid: UUIDS[0]!, pid, name: 'llama-server', usedMiB }]);
  const built = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0, gpuGraceMs: 0 }, deps: { now: clock.now } });
  const put = await built.app.inject({ method: 'PUT', url: '/shards/s', payload: { pid, gpus: [0], engine: 'llama.cpp', ...registration } });
  t.equal(put.statusCode, 201, 'registered');
  await settle(built.app);
  clock.advance(1);
  const get = async (url: string) => built.app.inject({ method: 'GET', url });
  return { ...built, clock, get };
}
