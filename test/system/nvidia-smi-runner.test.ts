// The nvidia-smi runner against the fake executable: real child processes, real process groups.
// Timing is only ever bounded from above with generous slack, and state is awaited by polling, so
// the tests hold on a loaded two-core machine.
import t, { type Test } from 'tap';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout } from 'node:timers/promises';
import { pino } from 'pino';
import { isCodedError } from '../../src/errors.js';
import {
  createNvidiaSmi,
  isDirectory,
  GPU_QUERY_FIELDS,
  type QueryObservation,
} from '../../src/system/nvidia-smi.js';
import type { GpuDriver } from '../../src/system/gpu-driver.js';
import {
  createFakeNvidiaSmi,
  eightGpuNode,
  livePidsInGroup,
  waitUntil,
  type FakeFailure,
  type FakeNvidiaSmi,
  type FakeScenario,
} from '../helpers/fake-nvidia-smi.js';
import { captureLog, type LogLine } from '../helpers/log-capture.js';

const SLACK_MS = 1500;
const GPU_ARGS = [`--query-gpu=${GPU_QUERY_FIELDS.join(',')}`, '--format=csv'];
const GPU_ARGS_WITHOUT_RESERVED = [
  '--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,mig.mode.current,pci.bus_id,utilization.gpu',
  '--format=csv',
];

interface Rig {
  fake: FakeNvidiaSmi;
  smi: GpuDriver;
  observations: QueryObservation[];
  logs: LogLine[];
}

/** `pathIn` picks another nvidia-smi path inside the fake's directory. */
function rig(t: Test, scenario: FakeScenario = eightGpuNode(), timeoutMs = 15_000, pathIn?: (dir: string) => string): Rig {
  const fake = createFakeNvidiaSmi(t.testdir(), scenario);
  const path = pathIn?.(fake.dir);
  const observations: QueryObservation[] = [];
  const { log, lines: logs } = captureLog();
  const smi = createNvidiaSmi({ path: path ?? fake.path, timeoutMs, log, onQuery: (o) => observations.push(o) });
  t.teardown(() => smi.killAll());
  return { fake, smi, observations, logs };
}

function failing(kind: 'all' | 'gpu' | 'compute-apps' | 'version', failure: FakeFailure): FakeScenario {
  return { ...eightGpuNode(), failures: { [kind]: failure } };
}

async function noneAlive(pgid: number): Promise<void> {
  await waitUntil(() => livePidsInGroup(pgid).length === 0, { what: `process group ${pgid} to be gone` });
}

t.test('queryGpus reads every GPU of an 8x H200 node', async (t) => {
  const { fake, smi, observations, logs } = rig(t);
  const { gpus } = await smi.queryGpus();
  t.equal(gpus.length, 8);
  t.same(gpus[0], {
    index: 0,
    uuid: 'GPU-a44622e3-2296-6285-0a86-84d0f6c67900',
    name: 'NVIDIA H200',
    totalMiB: 143771,
    usedMiB: 130013,
    freeMiB: 13145,
    reservedMiB: 614,
    migMode: 'Disabled',
    busId: '00000000:18:00.0',
    utilizationPct: 0,
  });
  t.same(gpus.map((g) => g.index), [0, 1, 2, 3, 4, 5, 6, 7]);
  t.same(fake.invocations().map((i) => i.argv), [GPU_ARGS], 'asks with header and units, no shell');
  t.match(observations, [{ query: 'gpus', outcome: 'ok', durationMs: Number }]);
  t.match(logs, [{ level: 20, query: 'gpus', durationMs: Number, msg: 'nvidia-smi answered' }]);
  t.equal(smi.running, 0);
});

t.test('queryComputeApps keeps [N/A] memory, names with ", ", a pid on two GPUs and [Not Found]', async (t) => {
  const { smi, observations } = rig(t);
  const apps = await smi.queryComputeApps();
  t.equal(apps.length, 8);
  t.same(
    apps.filter((a) => a.pid === 1425258).map((a) => a.gpuUuid),
    ['GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90', 'GPU-cb449822-5571-be90-8303-e7558da3ea66'],
  );
  t.same(apps[5], {
    gpuUuid: 'GPU-8e137fa6-c3d9-6980-7733-0d8df296756e',
    pid: 1425260,
    name: '/srv/jobs/eval, run 2/bin/python3',
    usedMiB: 105842,
  });
  t.same(apps[6], { gpuUuid: 'GPU-d9337494-6060-1440-039f-4654245b5764', pid: 1425261, name: 'python3', usedMiB: null });
  t.same(apps[7], { gpuUuid: 'GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72', pid: 1758887, name: '[Not Found]', usedMiB: 58060 });
  t.match(observations, [{ query: 'compute-apps', outcome: 'ok' }]);
});

t.test('queryVersion reads nvidia-smi --version', async (t) => {
  const { fake, smi, observations } = rig(t, { ...eightGpuNode(), driverVersion: '535.161.08', cudaVersion: '12.2' });
  t.same(await smi.queryVersion(), { smiVersion: '535.161.08', driverVersion: '535.161.08', cudaVersion: '12.2' });
  t.same(fake.invocations().map((i) => i.argv), [['--version']]);
  t.match(observations, [{ query: 'version', outcome: 'ok' }]);
});

t.test('queryVersion on a driver from 610 on, whose DRIVER and CUDA lines only say "Deprecated"', async (t) => {
  const { smi } = rig(t, { ...eightGpuNode(), driverVersion: '610.57.04', cudaVersion: '13.3' });
  t.same(await smi.queryVersion(), { smiVersion: '610.57.04', driverVersion: '610.57.04', cudaVersion: '13.3' });
});

t.test('a GPU the driver cannot reach: the others are listed, and its bus id comes with what nvidia-smi said of it', async (t) => {
  const node = eightGpuNode();
  const { smi, observations } = rig(t, { ...node, unreachable: [{ index: 1 }, { index: 5, said: 'GPU is lost. Reboot the system to recover this GPU' }] });
  const { gpus, unreachable } = await smi.queryGpus();
  t.same(gpus.map((gpu) => gpu.index), [0, 2, 3, 4, 6, 7]);
  t.same(unreachable, [
    { busId: node.gpus[1]!.busId, said: 'Unknown Error' },
    { busId: node.gpus[5]!.busId, said: 'GPU is lost. Reboot the system to recover this GPU' },
  ]);
  const lost = new Set([node.gpus[1]!.uuid, node.gpus[5]!.uuid]);
  const apps = await smi.queryComputeApps();
  t.ok(apps.length > 0, 'the process query lists what it can too');
  t.same(apps.map((app) => app.pid), node.processes.filter((p) => !lost.has(p.gpuUuid)).map((p) => p.pid), 'the processes of the GPUs it can reach');
  t.match(observations, [{ query: 'gpus', outcome: 'ok' }, { query: 'compute-apps', outcome: 'ok' }]);
  const all = await rig(t).smi.queryGpus();
  t.same([all.gpus.length, all.unreachable], [8, []], 'a node whose GPUs are all reachable');
});

t.test('every call sees the node as it is now', async (t) => {
  const { fake, smi } = rig(t);
  t.equal((await smi.queryComputeApps()).length, 8);
  fake.update((s) => {
    s.processes = [];
  });
  t.same(await smi.queryComputeApps(), [], 'no process: the header alone');
  fake.update((s) => ({ ...s, lineEnding: 'crlf', processes: [{ gpuUuid: s.gpus[3]!.uuid, pid: 42, name: 'llama-server', usedMiB: 6010 }] }));
  t.same(await smi.queryComputeApps(), [{ gpuUuid: 'GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092', pid: 42, name: 'llama-server', usedMiB: 6010 }], 'CRLF');
  t.equal(fake.countQueries('compute-apps'), 3);
});

const failures: Array<{ name: string; failure: FakeFailure; exitCode: number; words: RegExp; meaning: RegExp }> = [
  {
    name: 'driver unreachable',
    failure: { kind: 'driver-unreachable' },
    exitCode: 9,
    words: /said: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\. Make sure that the latest NVIDIA driver is installed and running\."/,
    meaning: /the NVIDIA driver is not loaded\. Install or load it/,
  },
  {
    name: 'driver/library mismatch',
    failure: { kind: 'library-mismatch' },
    exitCode: 18,
    words: /said: "Failed to initialize NVML: Driver\/library version mismatch\nNVML library version: 535\.161"/,
    meaning: /Reboot the node, or reload the nvidia kernel modules/,
  },
  {
    name: 'no devices',
    failure: { kind: 'no-devices' },
    exitCode: 6,
    words: /said: "No devices were found"/,
    meaning: /no GPU was found\. .*--gpus all/,
  },
  {
    name: 'GPU lost',
    failure: { kind: 'gpu-lost' },
    exitCode: 15,
    words: /said: "Unable to determine the device handle for GPU 0000:02:00\.0: GPU is lost\. Reboot the system to recover this GPU"/,
    meaning: /fallen off the bus.*Xid 79/,
  },
  {
    name: 'an exit code nvidia-smi(1) does not list, words on stderr',
    failure: { kind: 'custom', stderr: 'something odd\n', exitCode: 42 },
    exitCode: 42,
    words: /said: "something odd"/,
    meaning: /no specific advice for; see RETURN VALUE in nvidia-smi\(1\)/,
  },
  {
    name: 'a failure without a word',
    failure: { kind: 'custom', exitCode: 255 },
    exitCode: 255,
    words: /said: "\(nothing\)"/,
    meaning: /internal driver error/,
  },
];

for (const f of failures) {
  t.test(`${f.name}: NvidiaSmiFailedError with nvidia-smi's own words, the exit code and what it means`, async (t) => {
    const { smi, observations, logs } = rig(t, failing('all', f.failure));
    const err = await smi.queryComputeApps().catch((e: unknown) => e);
    t.match(err, { code: 'NODECOMPUTE_NVIDIA_SMI_FAILED', statusCode: 503, message: f.words });
    t.ok(isCodedError(err), 'the error handler recognises it');
    t.match(err, { message: new RegExp(`exited with code ${f.exitCode} and`) });
    t.match(err, { message: f.meaning });
    t.match((err as Error).cause, { exitCode: f.exitCode });
    t.match(observations, [{ query: 'compute-apps', outcome: 'NODECOMPUTE_NVIDIA_SMI_FAILED' }]);
    t.match(logs, [{ level: 20, query: 'compute-apps', err: { code: 'NODECOMPUTE_NVIDIA_SMI_FAILED' }, msg: 'nvidia-smi query failed' }]);
  });
}

t.test('a failure of one query leaves the others working', async (t) => {
  const { smi } = rig(t, failing('compute-apps', { kind: 'gpu-lost', busId: '0000:DB:00.0' }));
  t.equal((await smi.queryGpus()).gpus.length, 8);
  await t.rejects(smi.queryComputeApps(), { message: /GPU 0000:DB:00\.0: GPU is lost/ });
  t.equal((await smi.queryVersion()).driverVersion, '590.48.01');
});

t.test('garbage with exit 0: NvidiaSmiUnparsableError quoting the line', async (t) => {
  const { smi, observations } = rig(t, failing('version', { kind: 'garbage' }));
  await t.rejects(smi.queryVersion(), {
    code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE',
    message: /"<html><body>502 Bad Gateway<\/body><\/html>"/,
  });
  t.match(observations, [{ query: 'version', outcome: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE' }]);
});

t.test('nothing printed with exit 0, not even the CSV header: NvidiaSmiUnparsableError, not "no GPUs" or "no processes"', async (t) => {
  for (const stdout of ['', '\n  \n']) {
    const { smi, observations } = rig(t, failing('all', { kind: 'custom', stdout, exitCode: 0 }));
    const empty = { code: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE', message: /^nvidia-smi exited 0 but printed nothing, not even the CSV header/ };
    await t.rejects(smi.queryGpus(), { ...empty, message: /run `nvidia-smi --query-gpu=index,uuid,name,.* --format=csv` by hand/ }, JSON.stringify(stdout));
    await t.rejects(smi.queryComputeApps(), { ...empty, message: /run `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv` by hand/ }, JSON.stringify(stdout));
    t.match(observations, [{ query: 'gpus', outcome: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE' }, { query: 'compute-apps', outcome: 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE' }]);
  }
  const idle = rig(t, { ...eightGpuNode(), processes: [] });
  t.same(await idle.smi.queryComputeApps(), [], 'the header alone is no process, as an idle node answers');
});

t.test('killed by a signal (the OOM killer): NvidiaSmiFailedError saying so', async (t) => {
  const { smi } = rig(t, failing('gpu', { kind: 'killed-by-signal' }));
  await t.rejects(smi.queryGpus(), {
    code: 'NODECOMPUTE_NVIDIA_SMI_FAILED',
    message: /did not finish normally: Command was killed with SIGKILL.*the OOM killer\?.*dmesg/s,
  });
});

t.test('no nvidia-smi at the path: NvidiaSmiNotFoundError naming the path and what to do', async (t) => {
  const { smi, observations, fake } = rig(t, eightGpuNode(), 15_000, (dir) => join(dir, 'usr', 'bin', 'nvidia-smi'));
  const path = join(fake.dir, 'usr', 'bin', 'nvidia-smi');
  const err = await smi.queryGpus().catch((e: unknown) => e);
  t.match(err, { code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND', statusCode: 503 });
  t.ok(isCodedError(err));
  const { message } = err as Error;
  t.ok(message.includes(`from ${JSON.stringify(path)}: there is no such file (ENOENT)`), message);
  for (const hint of ['driver utilities', '--gpus all', 'NVIDIA_DRIVER_CAPABILITIES=utility', 'NODECOMPUTE_NVIDIA_SMI']) {
    t.ok(message.includes(hint), `says ${hint}`);
  }
  t.match((err as Error).cause, { code: 'ENOENT' });
  t.match(observations, [{ query: 'gpus', outcome: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND' }]);
  t.equal(smi.running, 0);
});

t.test('a run that could not be spawned is never taken for one stuck past its deadline, however short the deadline', async (t) => {
  const { smi, fake } = rig(t, eightGpuNode(), 0, (dir) => join(dir, 'missing'));
  for (let i = 0; i < 20; i++) {
    await t.rejects(smi.queryGpus(), { code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND' }, `run ${i}: not found, not "still alive although it was killed"`);
  }
  writeFileSync(join(fake.dir, 'missing'), '#!/bin/sh\nexit 0\n', { mode: 0o755 });
  await t.rejects(smi.queryVersion(), { message: /did not answer within 0 ms|no version number found/ }, 'once it exists, it is run');
});

t.test('a file that may not be executed: NvidiaSmiNotFoundError (EACCES)', async (t) => {
  const { smi, fake } = rig(t, eightGpuNode(), 15_000, (dir) => join(dir, 'not-executable'));
  writeFileSync(join(fake.dir, 'not-executable'), '#!/bin/sh\n', { mode: 0o644 });
  await t.rejects(smi.queryVersion(), {
    code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND',
    message: /the file exists but this user may not execute it \(EACCES\).*x bit.*`ls -l .*not-executable`.*Without it/,
  });
});

t.test('nvidia-smi given as a directory: said to be a directory, not a permission problem', async (t) => {
  const dir = t.testdir({ bin: {} });
  const smi = createNvidiaSmi({ path: join(dir, 'bin'), timeoutMs: 15_000, log: pino({ level: 'silent' }) });
  const err = (await smi.queryVersion().catch((e: unknown) => e)) as Error;
  t.match(err, { code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND' });
  t.match(err.message, `nvidia-smi could not be run from ${JSON.stringify(join(dir, 'bin'))}: it is a directory, not the executable (EACCES)`);
  t.match(err.message, 'NODECOMPUTE_NVIDIA_SMI (--nvidia-smi)');
  t.match(err.message, JSON.stringify(join(dir, 'bin', 'nvidia-smi')));
  t.match(err.message, /unset to look on PATH/);
});

t.test('isDirectory: a path that cannot be looked at reads as no directory, so the permission words stand', async (t) => {
  const dir = t.testdir({ file: 'x' });
  t.equal(isDirectory(dir), true);
  t.equal(isDirectory(join(dir, 'file')), false);
  t.equal(isDirectory(join(dir, 'missing')), false);
  t.equal(isDirectory(`${dir}/bad\0name`), false, 'stat throws (an invalid path): not a directory, and no throw');
});

t.test('a bare name is looked up on PATH: not found there, or found and not executable, the message says so and shows PATH', async (t) => {
  const dir = t.testdir({ bin: { 'nvidia-smi-not-executable': '#!/bin/sh\n' } });
  const path = process.env.PATH;
  process.env.PATH = `${join(dir, 'bin')}:/nonexistent-bin`;
  t.teardown(() => {
    process.env.PATH = path;
  });
  const run = (name: string) => createNvidiaSmi({ path: name, timeoutMs: 15_000, log: pino({ level: 'silent' }) }).queryVersion();
  const searched = `PATH is ${JSON.stringify(`${join(dir, 'bin')}:/nonexistent-bin`)}`;
  await t.rejects(run('nvidia-smi-nowhere'), {
    code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND',
    message: `nvidia-smi could not be run from "nvidia-smi-nowhere": no program of that name was found on PATH (ENOENT; ${searched}). Without it nodecompute cannot see the GPUs.`,
  });
  await t.rejects(run('nvidia-smi-not-executable'), {
    code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND',
    message: `nvidia-smi could not be run from "nvidia-smi-not-executable": a file of that name on PATH may not be executed by this user, or is a directory (EACCES; ${searched}).`,
  });
});

t.test('memory.reserved unknown to an older driver: one failing attempt, then remembered', async (t) => {
  const { fake, smi, observations, logs } = rig(t, { ...eightGpuNode(), supportsReserved: false });
  const { gpus } = await smi.queryGpus();
  t.equal(gpus.length, 8);
  t.ok(gpus.every((g) => g.reservedMiB === null && g.totalMiB === 143771), 'reservedMiB is null, the rest is read');
  t.same(fake.invocations().map((i) => i.argv), [GPU_ARGS, GPU_ARGS_WITHOUT_RESERVED]);
  t.ok(logs.some((l) => l.level === 30 && /does not know memory\.reserved/.test(String(l.msg))), 'says so once, at info');

  await smi.queryGpus();
  t.same(fake.invocations().map((i) => i.argv).slice(2), [GPU_ARGS_WITHOUT_RESERVED], 'not asked again');
  t.same(observations.map((o) => o.outcome), ['NODECOMPUTE_NVIDIA_SMI_FAILED', 'ok', 'ok']);

  fake.update((s) => ({ ...s, failures: { gpu: { kind: 'driver-unreachable' } } }));
  await t.rejects(smi.queryGpus(), { code: 'NODECOMPUTE_NVIDIA_SMI_FAILED', message: /exited with code 9/ });
  t.equal(fake.countQueries('gpu'), 4, 'a later failure is not retried');
});

t.test('a driver older than both optional fields: each one it rejects is dropped in turn, within one deadline, and remembered', async (t) => {
  const { fake, smi, logs } = rig(t, { ...eightGpuNode(), supportsReserved: false, supportsMigMode: false });
  const { gpus } = await smi.queryGpus();
  t.ok(gpus.every((g) => g.reservedMiB === null && g.migMode === null && g.usedMiB !== null), 'both read as null, the rest is read');
  const oldest = ['--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,pci.bus_id,utilization.gpu', '--format=csv'];
  t.same(fake.invocations().map((i) => i.argv), [GPU_ARGS, GPU_ARGS_WITHOUT_RESERVED, oldest]);
  t.same(
    logs.filter((l) => l.level === 30).map((l) => l.field),
    ['memory.reserved', 'mig.mode.current'],
    'each said once, at info',
  );
  await smi.queryGpus();
  t.same(fake.invocations().map((i) => i.argv).slice(3), [oldest], 'neither is asked again');
});

t.test('a driver that knows memory.reserved but fails is not retried without it', async (t) => {
  const { fake, smi } = rig(t, failing('gpu', { kind: 'library-mismatch' }));
  await t.rejects(smi.queryGpus(), { message: /exited with code 18/ });
  t.equal(fake.countQueries('gpu'), 1);
});

t.test('a hang: the timeout error at the deadline, and nothing of the process group is left', async (t) => {
  // 3 s rather than 0.5 s so that even a slow machine starts the fake and it logs its run before the kill.
  const { fake, smi, observations } = rig(t, failing('gpu', { kind: 'hang', partialOutput: 'index, uuid, na' }), 3_000);
  const started = Date.now();
  const err = await smi.queryGpus().catch((e: unknown) => e);
  const waited = Date.now() - started;
  t.ok(isCodedError(err));
  t.match(err, {
    code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT',
    statusCode: 503,
    message: /did not answer within 3000 ms \(nvidia-smi --query-gpu=index,.*--format=csv\), so its process group was killed/,
  });
  for (const hint of ['state D', 'dmesg', 'persistence mode']) t.ok((err as Error).message.includes(hint), `says ${hint}`);
  t.ok(waited >= 2_950 && waited < 3_000 + SLACK_MS, `answered after ${waited} ms`);
  t.match(observations, [{ query: 'gpus', outcome: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' }]);
  t.equal(fake.countQueries('gpu'), 1, 'a timeout is not mistaken for an unknown field');

  const [invocation] = fake.invocations();
  await noneAlive(invocation!.pid);
  for (const { childPid } of fake.spawned()) t.same(livePidsInGroup(invocation!.pid).includes(childPid), false);
  await waitUntil(() => smi.running === 0, { what: 'running to return to 0' });
  t.equal(smi.running, 0);
});

t.test('a grandchild that left the group and holds stdout open: still answered at the deadline', async (t) => {
  // 3 s rather than 0.5 s so that even a slow machine starts the fake and lets the grandchild escape first.
  const { fake, smi } = rig(t, failing('compute-apps', { kind: 'escaped-grandchild' }), 3_000);
  const started = Date.now();
  try {
    await t.rejects(smi.queryComputeApps(), {
      code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT',
      message: /^nvidia-smi \(nvidia-smi --query-compute-apps=.*\) exited, but its output was still open 3000 ms after it started: a process it started holds it, so its group was killed/,
    });
    t.ok(Date.now() - started < 3_000 + SLACK_MS);
    const [spawn] = fake.spawned();
    t.ok(spawn && livePidsInGroup(spawn.childPid).includes(spawn.childPid), 'the grandchild is out of reach of the group kill');
    t.equal(smi.running, 0, 'nvidia-smi itself has exited');
    await setTimeout(1_100);
    t.equal((await smi.queryGpus()).gpus.length, 8, 'an nvidia-smi that had exited by its deadline is not taken for a stuck one');
  } finally {
    for (const { childPid } of fake.spawned()) process.kill(childPid, 'SIGKILL');
  }
});

t.test('a slow answer within the timeout is waited for; one past it is not', async (t) => {
  const { smi, observations } = rig(t, { ...eightGpuNode(), delayMs: { 'compute-apps': 300 } }, 5_000);
  t.equal((await smi.queryComputeApps()).length, 8);
  t.ok(observations[0]!.durationMs! >= 250, `took ${observations[0]!.durationMs} ms`);

  // 3 s: time for a slow machine to start the fake, so that it logs its run before the kill.
  const slow = rig(t, { ...eightGpuNode(), delayMs: 60_000 }, 3_000);
  const started = Date.now();
  await t.rejects(slow.smi.queryVersion(), { code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT', message: /within 3000 ms \(nvidia-smi --version\)/ });
  t.ok(Date.now() - started < 3_000 + SLACK_MS);
  await noneAlive(slow.fake.invocations()[0]!.pid);
});

t.test('a killed nvidia-smi that stays alive (wedged driver, state D) blocks new runs until it exits', async (t) => {
  // SIGKILL cannot be resisted here, so the stand-in for the wedged driver is a kill that does nothing:
  // the hung fake really stays alive, as nvidia-smi in state D does.
  const fake = createFakeNvidiaSmi(t.testdir(), failing('gpu', { kind: 'hang' }));
  const { log, lines: logs } = captureLog('info');
  const observations: QueryObservation[] = [];
  const survived: Array<{ pid: number; at: number }> = [];
  const smi = createNvidiaSmi({
    path: fake.path,
    timeoutMs: 3_000,
    log,
    onQuery: (o) => observations.push(o),
    killTimedOut: (pid) => survived.push({ pid, at: Date.now() }),
  });
  t.teardown(() => smi.killAll());

  await t.rejects(smi.queryGpus(), { code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT', message: /did not answer within 3000 ms/ });
  const stuck = survived[0]!.pid;
  t.equal(stuck, fake.invocations()[0]!.pid, 'the timed-out run was the one killed');
  t.equal((await smi.queryComputeApps()).length, 8, 'just after the kill it may still be exiting: runs go on');

  await setTimeout(Math.max(0, survived[0]!.at + 1_100 - Date.now()));
  t.ok(livePidsInGroup(stuck).includes(stuck), 'the killed nvidia-smi is still alive a second later');
  const spawnedBefore = fake.invocations().length;
  const refusals = await Promise.all([smi.queryComputeApps().catch((e: unknown) => e), smi.queryVersion().catch((e: unknown) => e)]);
  t.match(refusals[0], {
    code: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT',
    statusCode: 503,
    message: new RegExp(`^nvidia-smi \\(pid ${stuck}\\) did not answer within 3000 ms and is still alive although it was killed with SIGKILL at \\d{4}-\\d\\d-\\d\\dT`),
  });
  for (const hint of ['state D', 'starts no other nvidia-smi', 'dmesg', `ps -o pid,stat,wchan -p ${stuck}`, 'drain']) {
    t.ok((refusals[0] as Error).message.includes(hint), `says ${hint}`);
  }
  t.equal((refusals[1] as Error).message, (refusals[0] as Error).message, 'every refusal says the same, so the failure is logged once');
  t.equal(fake.invocations().length, spawnedBefore, 'no nvidia-smi was started beside the stuck one');
  t.match(observations.slice(-2), [
    { query: 'compute-apps', durationMs: null, outcome: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' },
    { query: 'version', durationMs: null, outcome: 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT' },
  ], 'counted as failures, with no run time');
  t.equal(smi.running, 1);

  process.kill(-stuck, 'SIGKILL');
  await waitUntil(() => smi.running === 0, { what: 'the stuck nvidia-smi to exit' });
  t.match(logs, [{ level: 30, nvidiaSmiPid: stuck, stillStuck: 0, msg: /The stuck nvidia-smi has exited at last; nodecompute runs nvidia-smi again/ }]);
  t.equal((await smi.queryComputeApps()).length, 8, 'once it has exited, nvidia-smi runs again');
});

t.test('killAll kills hung nvidia-smi process groups, grandchildren included', async (t) => {
  const { fake, smi } = rig(t, failing('all', { kind: 'hang' }), 60_000);
  const pending = [smi.queryComputeApps().catch((e: unknown) => e), smi.queryGpus().catch((e: unknown) => e)];
  await waitUntil(() => fake.spawned().length === 2, { what: 'both fakes to hang with a grandchild' });
  t.equal(smi.running, 2);
  const groups = fake.invocations().map((i) => i.pid);
  for (const pgid of groups) t.ok(livePidsInGroup(pgid).length >= 2, `group ${pgid} holds the fake and its sleep`);

  t.equal(smi.stopped, false, 'not stopped before killAll');
  smi.killAll();
  t.equal(smi.stopped, true, 'stopped from killAll on: the failures that follow are the shutdown\'s doing');
  const errors = await Promise.all(pending);
  for (const err of errors) t.match(err, { code: 'NODECOMPUTE_NVIDIA_SMI_FAILED', message: /killed with SIGKILL/ });
  for (const pgid of groups) await noneAlive(pgid);
  await waitUntil(() => smi.running === 0, { what: 'running to return to 0' });
  t.equal(smi.running, 0);
  smi.killAll();
  t.pass('killAll with nothing running is harmless');
  const runs = fake.invocations().length;
  await t.rejects(smi.queryGpus(), { code: 'NODECOMPUTE_NVIDIA_SMI_FAILED', message: 'nvidia-smi was not run: nodecompute is shutting down.' }, 'after killAll (the shutdown), no new run');
  t.equal(fake.invocations().length, runs, 'nvidia-smi was not started');
});

t.test('onQuery is optional', async (t) => {
  const fake = createFakeNvidiaSmi(t.testdir(), eightGpuNode());
  const smi = createNvidiaSmi({ path: fake.path, timeoutMs: 15_000, log: pino({ level: 'silent' }) });
  t.equal((await smi.queryGpus()).gpus.length, 8);
  await t.rejects(
    createNvidiaSmi({ path: join(fake.dir, 'missing'), timeoutMs: 15_000, log: pino({ level: 'silent' }) }).queryGpus(),
    { code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND' },
  );
});
