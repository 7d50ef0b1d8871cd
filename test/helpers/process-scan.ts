// /proc scans for the fault tests: which processes a fake nvidia-smi left behind. The fake's wrapper
// exports FAKE_NVIDIA_SMI_SCENARIO=<its own dir>/scenario.json, and every process it starts inherits
// it, so scanning environments finds each of them (a grandchild that left the process group too),
// however many run at once in other tests on the same machine.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FakeNvidiaSmi } from './fake-nvidia-smi.js';
import { livePidsInGroup } from './fake-nvidia-smi.js';

/** True while `pid` exists and is not a zombie. */
export function isProcessAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] !== 'Z';
  } catch {
    return false;
  }
}

/** Live processes whose environment holds `needle` (root may read every /proc/PID/environ). */
export function livePidsWithEnv(needle: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    let environ: string;
    try {
      environ = readFileSync(join('/proc', entry, 'environ'), 'latin1');
    } catch {
      continue; // gone, or not ours to read
    }
    if (environ.split('\0').includes(needle) && isProcessAlive(Number(entry))) found.push(Number(entry));
  }
  return found;
}

/** Every live process this fake started, found three ways: its logged groups, its logged grandchildren, its environment. */
export function leftoversOf(fake: FakeNvidiaSmi): number[] {
  const pids = new Set<number>();
  for (const invocation of fake.invocations()) for (const pid of livePidsInGroup(invocation.pid)) pids.add(pid);
  for (const spawned of fake.spawned()) if (isProcessAlive(spawned.childPid)) pids.add(spawned.childPid);
  for (const pid of livePidsWithEnv(`FAKE_NVIDIA_SMI_SCENARIO=${join(fake.dir, 'scenario.json')}`)) pids.add(pid);
  return [...pids].sort((a, b) => a - b);
}

/** Kills whatever a fake left behind (teardown safety net; a passing test leaves nothing). */
export function killLeftovers(fake: FakeNvidiaSmi): void {
  for (const pid of leftoversOf(fake)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}
