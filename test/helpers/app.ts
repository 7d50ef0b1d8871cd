// Builds the real app for a test: the fake nvidia-smi (or NVML) in a test directory, a state file beside it,
// the real /proc, a silent logger and (optionally) a clock the test moves. Also spawns real shard
// processes: a detached leader with children that stay in its process group.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import { pino } from 'pino';
import { buildApp, type App, type AppDeps } from '../../src/app.js';
import { defaultConfig, type Config } from '../../src/config.js';
import { installFakeNvml } from '../../scripts/fake-nvml.js';
import { BACKEND, type TestBackend } from './backend.js';
import { createFakeNvidiaSmi, livePidsInGroup, waitUntil, type FakeNvidiaSmi, type FakeScenario } from './fake-nvidia-smi.js';

export interface TestApp {
  app: App;
  fake: FakeNvidiaSmi;
  config: Config;
  dir: string;
}

export interface TestAppOptions {
  scenario: FakeScenario;
  /**
   * nvml: the fake libnvidia-ml.so.1 beside the fake nvidia-smi, on the same scenario. Left out, the
   * suite's (helpers/backend.ts); a test that pins what only one backend does names it.
   */
  backend?: TestBackend;
  config?: Partial<Config>;
  deps?: AppDeps;
}

export async function buildTestApp(t: Test, options: TestAppOptions): Promise<TestApp> {
  // Not t.testdir(): a test may already use that for a fixture /proc tree.
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-test-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(join(dir, 'smi'));
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), options.scenario);
  const backend = options.backend ?? BACKEND;
  const config = defaultConfig({
    backend,
    nvmlLibrary: backend === 'nvml' ? installFakeNvml(join(dir, 'smi')) : null,
    nvidiaSmi: fake.path,
    stateFile: join(dir, 'state', 'shards.json'),
    logLevel: 'silent',
    // A loaded 2-core CI machine can take seconds to start the fake: probes must not give up on it.
    probeWaitMs: 20_000,
    ...options.config,
  });
  const app = await buildApp(config, { logger: pino({ level: 'silent' }), ...options.deps });
  t.teardown(() => app.close());
  return { app, fake, config, dir };
}

/** Waits until no snapshot refresh is running (a registration starts one in the background). */
export async function settle(app: App): Promise<void> {
  await waitUntil(() => !app.services.node.snapshots.refreshing, { what: 'the snapshot refresh to finish' });
}

/** A clock for deps.now that only moves when the test says so. */
export function manualClock(start = Date.now()) {
  let now = start;
  return {
    now: () => now,
    advance: (ms: number) => {
      now += ms;
    },
  };
}

export interface ShardProcess {
  /** The leader: its pid is the process group id. */
  pid: number;
  child: ChildProcess;
  /** Members of the group other than the leader (the "engine" children). */
  members: number[];
  kill(): Promise<void>;
}

/**
 * Spawns a detached `sh` (its own process group) that starts `children` sleeping grandchildren in
 * the same group, like an engine that computes in a child. Killed at teardown.
 */
export async function spawnShardProcess(t: Test, children = 2): Promise<ShardProcess> {
  const script = `${Array.from({ length: children }, () => 'sleep 600 &').join(' ')} wait`;
  const child =
    children === 0
      ? spawn('sleep', ['600'], { detached: true, stdio: 'ignore' })
      : spawn('sh', ['-c', script], { detached: true, stdio: 'ignore' });
  const pid = child.pid!;
  await waitUntil(() => livePidsInGroup(pid).length === children + 1, { what: `process group ${pid} to have ${children + 1} members` });
  const members = livePidsInGroup(pid).filter((member) => member !== pid);
  let killed = false;
  const kill = async () => {
    if (killed) return;
    killed = true;
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // already gone
    }
    await waitUntil(() => livePidsInGroup(pid).length === 0, { what: `process group ${pid} to die` });
  };
  t.teardown(kill);
  return { pid, child, members, kill };
}
