// The node check: each check's verdict and advice, the human table and GET /doctor (the CLI: doctor-cli.test.ts).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { pino } from 'pino';
import { formatDoctorReport, runDoctor, type DoctorDeps, type DoctorReport } from '../../src/doctor/doctor.js';
import { nvmlCalls } from '../../scripts/fake-nvml.js';
import { createModelFileReader } from '../../src/system/model-files.js';
import { createNvidiaSmi } from '../../src/system/nvidia-smi.js';
import { createProcReader } from '../../src/system/procfs.js';
import { createStateFile } from '../../src/system/state-file.js';
import { loadRegistry } from '../../src/shards/registry.js';
import { serialiseShards } from '../../src/shards/registry-file.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { DRIVER_CHECK, driverQueries, failDriver, REFRESH_FAILED_SAID } from '../helpers/backend.js';
import { createFakeNvidiaSmi, eightGpuNode, idleEightGpuNode, type FakeScenario, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { fifoTestdir, releaseBlockedWriter } from '../helpers/fifo.js';
import { shardRecord } from '../helpers/hand-made-view.js';

const log = pino({ level: 'silent' });

/** A directory fsync as a filesystem that cannot do it answers. */
async function cannotSyncDirectories(): Promise<void> {
  throw Object.assign(new Error('EINVAL: invalid argument, fsync'), { code: 'EINVAL' });
}

function doctorFor(
  t: Test,
  scenario: FakeScenario | null,
  overrides: {
    proc?: string;
    limitsFile?: string;
    stateFile?: string;
    stateTimeoutMs?: number;
    token?: boolean;
    slowQueryMs?: number;
    syncDirectory?: (dir: string) => Promise<void>;
    deps?: Partial<DoctorDeps>;
  } = {},
) {
  // Not t.testdir(): the test may hold its own fixture there.
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-doctor-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(join(dir, 'smi'));
  const path = scenario ? createFakeNvidiaSmi(join(dir, 'smi'), scenario).path : join(dir, 'smi', 'missing-nvidia-smi');
  return runDoctor({
    driver: createNvidiaSmi({ path, timeoutMs: 20_000, log }),
    proc: createProcReader({ root: overrides.proc ?? '/proc', log, ...(overrides.limitsFile === undefined ? {} : { limitsFile: overrides.limitsFile }) }),
    modelFiles: createModelFileReader(overrides.proc ?? '/proc'),
    stateFile: createStateFile(overrides.stateFile ?? join(dir, 'state', 'shards.json'), {
      log,
      ...(overrides.syncDirectory === undefined ? {} : { syncDirectory: overrides.syncDirectory }),
      ...(overrides.stateTimeoutMs === undefined ? {} : { timeoutMs: overrides.stateTimeoutMs }),
    }),
    driverWhy: 'NODECOMPUTE_BACKEND is nvidia-smi',
    tokenConfigured: overrides.token ?? false,
    version: '9.9.9',
    now: () => Date.parse('2026-11-29T12:00:00Z'),
    ...(overrides.slowQueryMs === undefined ? {} : { slowQueryMs: overrides.slowQueryMs }),
    ...overrides.deps,
  });
}

function byName(report: DoctorReport) {
  return Object.fromEntries(report.checks.map((check) => [check.name, check]));
}

t.test('a healthy node: every check ok (the token is a warning only)', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const scenario = eightGpuNode();
  scenario.processes = [{ gpuUuid: scenario.gpus[0]!.uuid, pid: shard.pid, name: 'llama-server', usedMiB: 1000 }];
  const report = await doctorFor(t, scenario, { token: true });
  t.equal(report.ok, true);
  t.equal(report.version, '9.9.9');
  t.equal(report.checkedAt, '2026-11-29T12:00:00.000Z');
  const checks = byName(report);
  t.same(Object.keys(checks), ['backend', 'nvidia-smi', 'gpus', 'query-time', 'host-pid-namespace', 'weights', 'proc', 'open-files', 'state-file', 'registered-gpus', 'token']);
  t.match(checks.weights!, { status: 'ok', detail: 'the memory maps of the 1 GPU process(es) can be read, so where shards\' weights are is judged' });
  t.equal(checks['registered-gpus']!.detail, 'no stored shard registration names a GPU by UUID, so none can be missing');
  t.match(checks['open-files']!.detail, /^an open-file limit of \d+: up to \d+ \/proc stat files kept open between snapshots \(1 GPU process\(es\) now\)$/);
  t.match(checks['nvidia-smi']!.detail, 'nvidia-smi 590.48.01, driver 590.48.01, CUDA 13.1');
  t.match(checks.gpus!.detail, '8 GPU(s) visible: GPU 0 NVIDIA H200');
  t.match(checks['host-pid-namespace']!, { status: 'ok', detail: 'all 1 PID(s) the GPU driver lists exist in /proc' });
  t.ok(report.checks.every((check) => check.status === 'ok' && check.fix === null));
  t.match(formatDoctorReport(report), /OK    nvidia-smi .*\n[^]*nodecompute doctor: this node is fine\.\n$/);
});

t.test('MIG enabled on some GPUs is a warning: the memory figures there are the whole GPU\'s, not an instance\'s', async (t) => {
  const scenario = eightGpuNode();
  scenario.processes = [];
  for (const gpu of scenario.gpus) gpu.usedMiB = 0;
  scenario.gpus[2]!.migMode = 'Enabled';
  scenario.gpus[5]!.migMode = 'Enabled';
  scenario.gpus[6]!.migMode = '[N/A]';
  const report = await doctorFor(t, scenario, { token: true });
  t.equal(report.ok, true, 'a warning, not a failure');
  t.match(byName(report).mig, {
    name: 'mig',
    status: 'warn',
    detail: /^MIG is on for GPU 2, GPU 5: .*memory figures .*whole GPU, not per MIG device$/,
    fix: /NVML backend.*by MIG device \(nvidia-smi -L/,
  });
  scenario.gpus[2]!.migMode = 'Disabled';
  scenario.gpus[5]!.migMode = 'Disabled';
  t.notOk('mig' in byName(await doctorFor(t, scenario, { token: true })), 'no check where no GPU has MIG enabled');
});

t.test('PIDs nvidia-smi lists that are missing from /proc: not in the host PID namespace', async (t) => {
  const report = await doctorFor(t, eightGpuNode());
  const check = byName(report)['host-pid-namespace']!;
  t.equal(check.status, 'fail');
  t.match(check.detail, /7 of 7 PID\(s\) the GPU driver lists do not exist in \/proc \(1328667, 1328668, 1425258/);
  t.match(check.fix, '--pid=host');
  t.equal(report.ok, false);
  const table = formatDoctorReport(report);
  t.match(table, /FAIL  host-pid-namespace/);
  t.match(table, /fix: Not the host's PID namespace/);
  t.match(table, /something is wrong/);
});

t.test('some PIDs missing is a warning (they may have exited in between)', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const scenario = eightGpuNode();
  scenario.processes = [
    { gpuUuid: scenario.gpus[0]!.uuid, pid: shard.pid, name: 'a', usedMiB: 1 },
    { gpuUuid: scenario.gpus[0]!.uuid, pid: 4_100_000, name: 'b', usedMiB: 1 },
  ];
  const check = byName(await doctorFor(t, scenario))['host-pid-namespace']!;
  t.equal(check.status, 'warn');
  t.match(check.detail, '1 of 2 PID(s)');
});

t.test('many missing PIDs are listed up to ten; an odd --version answer is reported as unknown', async (t) => {
  const scenario = eightGpuNode();
  scenario.processes = Array.from({ length: 12 }, (_, i) => ({ gpuUuid: scenario.gpus[0]!.uuid, pid: 4_100_000 + i, name: 'x', usedMiB: 1 }));
  scenario.failures = { version: { kind: 'custom', stdout: 'NVIDIA-SMI version  : 590.48.01\n', exitCode: 0 } };
  const checks = byName(await doctorFor(t, scenario));
  t.match(checks['host-pid-namespace']!.detail, /12 of 12 PID\(s\) .*\(4100000, .*, 4100009, \.\.\.\)/);
  t.match(checks['nvidia-smi']!.detail, 'nvidia-smi 590.48.01, driver unknown, CUDA unknown');
});

t.test('an unreadable /proc with GPU processes listed: the PID check says it could not be made, rather than blaming the namespace', async (t) => {
  const scenario = eightGpuNode();
  const report = await doctorFor(t, scenario, { proc: join(t.testdir(), 'nonexistent') });
  const checks = byName(report);
  t.match(checks['host-pid-namespace'], {
    status: 'warn',
    detail: `could not be checked: the GPU driver lists 7 PID(s), but ${join(t.testdirName, 'nonexistent')} cannot be read (see the proc check)`,
    fix: 'Fix the proc check first, then run the doctor again.',
  });
  t.notMatch(checks['host-pid-namespace']!.fix, /pid=host/);
  t.equal(checks.proc!.status, 'fail', 'the proc check fails, and says why');
  t.equal(report.ok, false);
});

t.test('a detail of several lines (nvidia-smi\'s own words) keeps to its column in the table', async (t) => {
  const report = await doctorFor(t, { ...eightGpuNode(), failures: { all: { kind: 'library-mismatch', nvmlVersion: '535.161' } } });
  const table = formatDoctorReport(report);
  const lines = table.split('\n');
  const first = lines.findIndex((line) => line.startsWith('FAIL  nvidia-smi'));
  const column = lines[first]!.indexOf('nvidia-smi exited');
  t.ok(column > 0, table);
  t.match(lines[first], /said: "Failed to initialize NVML: Driver\/library version mismatch$/);
  t.ok(lines[first + 1]!.startsWith(`${' '.repeat(column)}NVML library version: 535.161". This means the NVIDIA kernel module and driver libraries are different versions`));
  t.match(lines[first + 1], /not rebooted.*Reboot the node, or reload the nvidia kernel modules\.$/);
  t.notMatch(table, /^NVML/m, 'no line starts at column 0');
  const multiLineFix = formatDoctorReport({ ok: true, version: '1', checkedAt: '', checks: [{ name: 'x', status: 'warn', detail: 'a', fix: 'one\ntwo' }] });
  t.equal(multiLineFix, 'WARN  x  a\n         fix: one\n         two\n\nnodecompute doctor: this node is fine.\n');
});

t.test('what a start says of the settings: its warnings as the first row, a token file it refuses as a failed token check', async (t) => {
  const warnings = ['The environment variable NODECOMPUTE_TOKEN_FIEL is not a setting of nodecompute and is ignored (did you mean NODECOMPUTE_TOKEN_FILE?).', 'A second warning.'];
  const refused = 'Invalid setting NODECOMPUTE_TOKEN_FILE (--token-file): got "/x" (cannot read it: ENOENT: no such file or directory, open \'/x\'); it accepts a path.';
  const report = await doctorFor(t, idleEightGpuNode(), { token: true, deps: { settingsWarnings: warnings, tokenFileRefused: refused } });
  t.same(report.checks[0], { name: 'settings', status: 'warn', detail: warnings.join('\n'), fix: null }, 'each warning says what to do');
  t.match(byName(report).token, { status: 'fail', detail: refused, fix: /^Fix the token file .*`nodecompute serve` stops at start \(exit 2\); a running one keeps its tokens\.$/ });
  t.equal(report.ok, false);
  t.match(formatDoctorReport(report), /^WARN  settings  +The environment variable NODECOMPUTE_TOKEN_FIEL .*\n +A second warning\.$/m);
  const none = await doctorFor(t, idleEightGpuNode(), { token: true, deps: { settingsWarnings: [] } });
  t.same(none.checks[0], { name: 'settings', status: 'ok', detail: 'no setting looks mistyped or at odds with another', fix: null });
  t.notOk('settings' in byName(await doctorFor(t, idleEightGpuNode())), 'no row when the caller has no settings to say');
});

t.test('no GPU process: nothing to compare', async (t) => {
  const check = byName(await doctorFor(t, idleEightGpuNode()))['host-pid-namespace']!;
  t.equal(check.status, 'ok');
  t.match(check.detail, 'nothing to compare');
});

t.test('no GPU process listed while GPUs hold memory: the processes are hidden, a failure with the fix', async (t) => {
  const check = byName(await doctorFor(t, { ...eightGpuNode(), processes: [] }))['host-pid-namespace']!;
  t.equal(check.status, 'fail');
  t.match(check.detail, /the GPU driver lists no GPU process, yet GPU 0, .*GPU 7 have memory in use/);
  t.match(check.fix, /--pid=host \/ hostPID: true\).*GPU-sharing layer hides processes/);
});

t.test('a missing nvidia-smi fails first and skips what depends on it', async (t) => {
  const report = await doctorFor(t, null);
  const checks = byName(report);
  t.equal(checks['nvidia-smi']!.status, 'fail');
  t.match(checks['nvidia-smi']!.detail, /missing-nvidia-smi": there is no such file \(ENOENT\)\. .*set NODECOMPUTE_NVIDIA_SMI to its full path\.$/);
  t.equal(checks['nvidia-smi']!.fix, null, 'the detail says what to do: no second, vaguer fix under it');
  t.notOk(checks.gpus);
  t.notOk(checks['host-pid-namespace']);
  t.equal(checks.proc!.status, 'ok');
  t.equal(report.ok, false);
});

t.test('nvidia-smi answers --version but the queries fail, each named; slow queries', async (t) => {
  const failing = byName(await doctorFor(t, { ...eightGpuNode(), failures: { gpu: { kind: 'gpu-lost' } } }));
  t.match(failing.gpus, {
    status: 'fail',
    detail: /^nvidia-smi answers --version, but its GPU query \(--query-gpu\), which every GPU answer needs, fails: nvidia-smi exited with code 15 .*GPU is lost/,
    fix: null,
  });
  const apps = await doctorFor(t, { ...eightGpuNode(), failures: { 'compute-apps': { kind: 'custom', stdout: 'Field "pid" is not a valid field to query.\n', exitCode: 2 } } });
  t.match(byName(apps).gpus, {
    status: 'fail',
    detail:
      /^nvidia-smi answers --version and its GPU query \(8 GPU\(s\)\), but its process query \(--query-compute-apps\), which tells whose memory is whose, fails: nvidia-smi exited with code 2 and said: "Field "pid" is not a valid field to query\."\. This means nvidia-smi rejected an argument/,
    fix: null,
  });
  t.same(apps.checks.map((check) => check.name), ['backend', 'nvidia-smi', 'gpus', 'proc', 'open-files', 'state-file', 'registered-gpus', 'token'], 'what needs the processes is not checked');
  const slow = byName(await doctorFor(t, { ...eightGpuNode(), processes: [], delayMs: { gpu: 300 } }, { slowQueryMs: 100 }));
  t.equal(slow['query-time']!.status, 'warn');
  t.match(slow['query-time']!.fix, 'persistence mode');
});

t.test('an unreadable proc root and an unwritable state directory fail with what to do', async (t) => {
  const dir = t.testdir({ file: 'not a directory' });
  const report = await doctorFor(t, idleEightGpuNode(), { proc: join(dir, 'no-proc'), stateFile: join(dir, 'file', 'shards.json') });
  const checks = byName(report);
  t.equal(checks.proc!.status, 'fail');
  t.match(checks.proc!.fix, 'NODECOMPUTE_PROC');
  t.equal(checks['state-file']!.status, 'fail');
  t.match(checks['state-file']!.detail, /cannot write in .*file/);
  t.equal(checks.token!.status, 'warn');
  t.match(checks.token!.detail, /any local process, and only a local process, may write/, 'no token: who may write, said plainly');
  t.match(checks.token!.fix, 'NODECOMPUTE_TOKEN_FILE');
});

t.test('the state file is read and parsed as a start does: a file a start refuses fails with its words, a missing one is a first start', async (t) => {
  const dir = t.testdir({
    torn: { 'shards.json': '{"format":"nodecompute-shards/v1","shards":[{"id":' },
    other: { 'shards.json': '{"version":1}' },
    good: { 'shards.json': JSON.stringify({ format: 'nodecompute-shards/v1', shards: [] }) },
    directory: { 'shards.json': {} },
  });
  const stateFile = (name: string) => join(dir, name, 'shards.json');
  const checkOf = async (name: string) => byName(await doctorFor(t, idleEightGpuNode(), { stateFile: stateFile(name), token: true }))['state-file']!;
  /** What a start says of the same file: loadRegistry's error, as `nodecompute serve` prints it after "cannot start: ". */
  const startSays = (name: string) => loadRegistry({ stateFile: createStateFile(stateFile(name), { log }), log }).then(() => 'started', (err: Error) => err.message);
  for (const [name, problem] of [
    ['torn', /^The state file .*torn\/shards\.json is not valid JSON \(.*\)\. It was left untouched\.$/],
    ['other', /^The state file .*other\/shards\.json is not a nodecompute shard registry: \/format .*\. It was left untouched\.$/],
    ['directory', /^Cannot read the state file .*directory\/shards\.json: EISDIR: illegal operation on a directory, read\.$/],
  ] as const) {
    const check = await checkOf(name);
    t.equal(check.status, 'fail', name);
    const [said, consequence] = check.detail.split(' nodecompute stops at start on it');
    t.match(said, problem, `${name}: what is wrong`);
    t.equal(consequence, ' (exit 1): the service cannot start, or restart, until it is fixed.', `${name}: what it means`);
    t.equal(`${said} ${check.fix}`, await startSays(name), `${name}: a start's own message, in its two parts`);
  }
  t.match(await checkOf('good'), { status: 'ok', detail: /good\/shards\.json holds 0 shard registration\(s\) and can be written$/, fix: null });
  t.match(await checkOf('missing'), { status: 'ok', detail: /missing\/shards\.json does not exist yet \(a first start: no shards\) and can be written$/ });
});

t.test('a state file this user may not read: the fix names the user nodecompute runs as', async (t) => {
  // Tests may run as root, which reads any file: the refusal a non-root user meets is stood in.
  const stateFile = createStateFile(join(t.testdir(), 'shards.json'), { log });
  const denied = Object.assign(new Error(`EACCES: permission denied, open '${stateFile.path}'`), { code: 'EACCES' });
  const report = await runDoctor({
    driver: createNvidiaSmi({ path: join(t.testdir(), 'missing-nvidia-smi'), timeoutMs: 20_000, log }),
    proc: createProcReader({ root: '/proc', log }),
    modelFiles: createModelFileReader('/proc'),
    stateFile: { ...stateFile, read: () => Promise.reject(denied) },
    driverWhy: 'NODECOMPUTE_BACKEND is nvidia-smi',
    tokenConfigured: true,
    version: '9.9.9',
    now: Date.now,
  });
  t.match(byName(report)['state-file'], {
    status: 'fail',
    detail: `Cannot read the state file ${stateFile.path}: EACCES: permission denied, open '${stateFile.path}'. nodecompute stops at start on it (exit 1): the service cannot start, or restart, until it is fixed.`,
    fix: `nodecompute runs as uid ${process.getuid!()}, gid ${process.getgid!()}: make the file and its directory theirs (\`chown -R\` the state directory: a file written by an earlier run as another user stays unreadable), or point NODECOMPUTE_STATE_FILE elsewhere.`,
  });
});

t.test('a state directory that does not answer fails within the bound, saying so, instead of hanging the doctor', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  // The probe file is a FIFO with no reader: opening it for writing blocks, as on a hung mount.
  const probe = fifo(`.shards.json.${process.pid}.probe`);
  const report = await doctorFor(t, idleEightGpuNode(), { stateFile: join(dir, 'shards.json'), stateTimeoutMs: 100 });
  // The filesystem answers at last (before the test directory goes): the look ends, failed (EPIPE).
  await waitUntil(() => releaseBlockedWriter(probe), { what: 'the look to wait in open()' });
  t.match(byName(report)['state-file'], {
    status: 'fail',
    detail: `writing a probe file in ${dir} did not finish within 100 ms: its filesystem does not answer (a hung network mount?)`,
    fix: /Make the state directory writable/,
  });
  t.equal(report.ok, false);
});

t.test('open files: too low a limit to keep every GPU process\'s stat file open is a warning with the fix', async (t) => {
  const shards = await Promise.all([0, 1, 2].map((i) => spawnShardProcess(t, i)));
  const scenario = eightGpuNode();
  scenario.processes = shards.map((shard, i) => ({ gpuUuid: scenario.gpus[i]!.uuid, pid: shard.pid, name: 'llama-server', usedMiB: 1000 }));
  // The limits file of a process whose soft limit is 4: half of it, 2 stat files, may be kept.
  const limits = (max: string) => join(t.testdir({ limits: `Limit                     Soft Limit           Hard Limit           Units\nMax open files            ${max}                ${max}                files\n` }), 'limits');
  const low = byName(await doctorFor(t, scenario, { limitsFile: limits('4') }))['open-files']!;
  t.match(low, {
    status: 'warn',
    detail: /^3 GPU processes, but with an open-file limit of 4 at most 2 \/proc stat files stay open/,
    fix: /nofile.*65536/,
  });
  const unlimited = byName(await doctorFor(t, scenario, { limitsFile: limits('unlimited') }))['open-files']!;
  t.match(unlimited, { status: 'ok', detail: /^no open-file limit: up to 2048 \/proc stat files kept open between snapshots \(3 GPU process\(es\) now\)$/ });
  const fixtureRoot = t.testdir({ 1: { stat: '1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0\n' } });
  const tree = byName(await doctorFor(t, idleEightGpuNode(), { proc: fixtureRoot }))['open-files']!;
  t.match(tree, { status: 'ok', detail: /is not a proc filesystem, so no stat file is kept open$/ });
  const noSmi = byName(await doctorFor(t, null))['open-files']!;
  t.match(noSmi, { status: 'ok', detail: /kept open between snapshots$/ }, 'without nvidia-smi, the limit alone');
});

t.test("GPU processes whose memory maps cannot be read: a warning that their shards' weights are not judged, and how to fix it", async (t) => {
  // Tests may run as root, which reads every process's maps: a maps file that cannot be read stands in for the refusal.
  const stat = (pid: number) => `${pid} (llama-server) S 1 ${pid} ${pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0\n`;
  const root = t.testdir({ 1: { stat: stat(1), maps: '', cmdline: 'init\0' }, 4242: { stat: stat(4242), maps: {} } });
  const scenario = eightGpuNode();
  scenario.processes = [1, 4242].map((pid) => ({ gpuUuid: scenario.gpus[0]!.uuid, pid, name: 'llama-server', usedMiB: 1000 }));
  const weights = byName(await doctorFor(t, scenario, { proc: root })).weights!;
  t.match(weights, { status: 'warn', detail: /^1 of 2 GPU process\(es\): reading \/proc\/4242\/maps failed \(EISDIR\)\. .*-ngl 0/, fix: /CAP_SYS_PTRACE/ });
  scenario.processes = [];
  t.match(byName(await doctorFor(t, scenario, { proc: root })).weights!, { status: 'ok', detail: /re-run under load/ });
});

t.test("the service's reader of model files: a doctor run starts no second read of maps that hang", async (t) => {
  const stat = (pid: number) => `${pid} (llama-server) S 1 ${pid} ${pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0\n`;
  const { dir, fifo } = fifoTestdir(t);
  mkdirSync(join(dir, '4242'));
  writeFileSync(join(dir, '4242', 'stat'), stat(4242));
  writeFileSync(join(dir, '4242', 'cmdline'), 'llama-server\0');
  fifo('4242/maps');
  const scenario = eightGpuNode();
  scenario.processes = [{ gpuUuid: scenario.gpus[0]!.uuid, pid: 4242, name: 'llama-server', usedMiB: 1000 }];
  const modelFiles = createModelFileReader(dir, { deadlineMs: 50 });
  const run = async () => byName(await doctorFor(t, scenario, { proc: dir, deps: { modelFiles } })).weights!;
  t.match(await run(), { status: 'warn', detail: /4242\/maps .*did not answer within 50 ms/ });
  t.match(await run(), { status: 'warn', detail: /4242\/maps .*has not answered yet/ }, 'the next run waits on the read under way');
});

t.test('a state directory that cannot be fsynced is a warning saying what is at risk and what to do', async (t) => {
  const report = await doctorFor(t, idleEightGpuNode(), { token: true, syncDirectory: cannotSyncDirectories });
  t.match(byName(report)['state-file'], {
    status: 'warn',
    detail: /shards\.json does not exist yet \(a first start: no shards\) and can be written, but the fsync of .*state failed \(EINVAL: invalid argument, fsync\): a change is stored and served, yet a power cut/,
    fix: /cannot fsync a directory .*local disk/,
  });
  t.equal(report.ok, true, 'writes work: the doctor does not fail the node for it');
});

t.test('GET /doctor answers the same report as JSON; concurrent requests share one check, reused for 5 s', async (t) => {
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { now: clock.now } });
  const queries = async () => (await driverQueries(app, 'version')) + (await driverQueries(app, 'gpus')) + (await driverQueries(app, 'compute-apps'));
  const before = await queries();
  const reports = await Promise.all(Array.from({ length: 20 }, () => app.inject({ method: 'GET', url: '/doctor' })));
  t.equal((await queries()) - before, 3, 'one version, one GPU and one process query for 20 requests');
  t.ok(reports.every((report) => report.body === reports[0]!.body && report.statusCode === reports[0]!.statusCode));
  clock.advance(4000);
  await app.inject({ method: 'GET', url: '/doctor' });
  t.equal((await queries()) - before, 3, 'reused within 5 s');
  clock.advance(1000);
  const res = await app.inject({ method: 'GET', url: '/doctor' });
  t.equal(res.statusCode, 503, 'a failed check');
  t.equal(res.json().ok, false);
  t.match(res.json().checks, [{ name: 'settings', status: 'ok' }, { name: 'backend', status: 'ok' }, { name: DRIVER_CHECK, status: 'ok' }], 'the settings row first, as in the CLI');
  t.ok(res.json().checks.some((check: { name: string; status: string }) => check.name === 'host-pid-namespace' && check.status === 'fail'));
});

t.test('GET /doctor under NVML takes no utilization sample: the next snapshot still judges SM work by its own', async (t) => {
  const { app, dir } = await buildTestApp(t, { scenario: { ...eightGpuNode(), nvml: { logCalls: true } }, backend: 'nvml' });
  t.equal((await app.inject({ method: 'GET', url: '/doctor' })).json().checks.find((check: { name: string }) => check.name === 'gpus').status, 'ok');
  const sampled = () => nvmlCalls(join(dir, 'smi')).filter((call) => call.fn === 'nvmlDeviceGetProcessUtilization').length;
  t.equal(sampled(), 0);
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200);
  t.ok(sampled() > 0, 'a snapshot samples');
});

t.test('GET /doctor: 200 while no check fails (warnings allowed), 503 with the same report once one does, so `curl -f` and monitors tell them apart', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: idleEightGpuNode(), deps: { now: clock.now } });
  const well = await app.inject({ method: 'GET', url: '/doctor' });
  t.equal(well.statusCode, 200);
  t.match(well.headers['content-type'], /^application\/json/);
  t.match(well.json(), { ok: true, checks: [{ name: 'settings', status: 'ok' }, { name: 'backend', status: 'ok' }, { name: DRIVER_CHECK, status: 'ok' }] });
  t.ok(well.json().checks.some((check: { name: string; status: string }) => check.name === 'token' && check.status === 'warn'), 'a warning alone is still 200');

  failDriver(fake, { kind: 'driver-unreachable' });
  clock.advance(5000);
  const sick = await app.inject({ method: 'GET', url: '/doctor' });
  t.equal(sick.statusCode, 503);
  t.match(sick.headers['content-type'], /^application\/json/);
  t.match(sick.json(), {
    ok: false,
    version: String,
    checkedAt: String,
    checks: [{ name: 'settings', status: 'ok' }, { name: 'backend', status: 'ok' }, { name: DRIVER_CHECK, status: 'fail', detail: new RegExp(`${REFRESH_FAILED_SAID}.*This means the NVIDIA driver is not loaded\\. Install or load it`), fix: null }],
  });
  const again = await app.inject({ method: 'GET', url: '/doctor' });
  t.equal(again.statusCode, 503, 'the reused report keeps its status');
  t.equal(again.body, sick.body);

  const spec = (await app.inject({ method: 'GET', url: '/openapi.json' })).json();
  const responses = spec.paths['/doctor'].get.responses;
  t.same(Object.keys(responses).sort(), ['200', '503'], 'the OpenAPI document declares both');
  t.ok(responses['200'].content['application/json'].schema.properties.checks, '200 carries the report');
  t.match(
    responses['503'].content['application/json'].schema.anyOf,
    [{ properties: { checks: { type: 'array' } } }, { $ref: '#/components/schemas/Error' }],
    '503 carries the report, or the error body when a shutdown cut the check off',
  );
});

t.test('GET /doctor cut off by a shutdown: the coded 503 every request cut off then gets, not a report blaming nvidia-smi', async (t) => {
  // The --version query answers; the GPU query is the one the shutdown kills (the e2e test has the other).
  const { app, fake } = await buildTestApp(t, { scenario: { ...idleEightGpuNode(), delayMs: { gpu: 60_000 } }, backend: 'nvidia-smi', config: { smiTimeoutMs: 60_000 } });
  const answer = app.inject({ method: 'GET', url: '/doctor' });
  await waitUntil(() => fake.invocations().some((call) => call.argv.some((arg) => arg.startsWith('--query-gpu'))), { what: 'the doctor to query the GPUs' });
  await app.close();
  const res = await answer;
  t.equal(res.statusCode, 503, res.body.slice(0, 400));
  const body = res.json();
  t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode'], 'the one error shape, not a report');
  t.equal(body.code, 'NODECOMPUTE_NVIDIA_SMI_FAILED', 'as /gpus answers when the shutdown kills its nvidia-smi');
  t.match(body.message, /^nvidia-smi did not finish normally: .*nodecompute stopped it because nodecompute is shutting down\.$/);
  t.notMatch(res.body, /"checks"/);
});

t.test('the GPUs the stored registrations name: those nvidia-smi no longer lists fail, whatever index the others have now', async (t) => {
  const shards = await Promise.all([spawnShardProcess(t, 0), spawnShardProcess(t, 0), spawnShardProcess(t, 0)]);
  const scenario = idleEightGpuNode();
  const { app, config, fake } = await buildTestApp(t, { scenario, config: { cacheTtlMs: 0, maxStaleMs: 0 } });
  for (const [i, gpus] of [[2], [5, 6]].entries()) {
    t.equal((await app.inject({ method: 'PUT', url: `/shards/s${i}`, payload: { pid: shards[i]!.pid, gpus } })).statusCode, 201);
  }
  // Registered while nvidia-smi fails: taken on trust, by index alone, so no UUID of it can be missed.
  failDriver(fake, { kind: 'driver-unreachable' });
  const trusted = await app.inject({ method: 'PUT', url: '/shards/s2', payload: { pid: shards[2]!.pid, gpus: [7] } });
  t.same([trusted.statusCode, trusted.json().gpuUuids], [201, null]);
  await app.close();
  const [gpu2, gpu6] = [scenario.gpus[2]!, scenario.gpus[6]!];
  // GPUs 2 and 6 are gone: nvidia-smi numbers those after them lower, so GPU 5 is 4 now.
  const without = { ...scenario, gpus: scenario.gpus.filter((gpu) => gpu !== gpu2 && gpu !== gpu6).map((gpu, index) => ({ ...gpu, index })) };
  const report = await doctorFor(t, without, { stateFile: config.stateFile });
  t.equal(report.ok, false);
  t.same(byName(report)['registered-gpus'], {
    name: 'registered-gpus',
    status: 'fail',
    detail:
      `shard "s0" was given ${gpu2.uuid} (GPU 2 when it was registered)\n` +
      `shard "s1" was given ${gpu6.uuid} (GPU 6 when it was registered):\n` +
      'the GPU driver does not list them: each fell off the bus, was reset or was detached (or the state file came from another node). Such a shard reads gpu-lost.',
    fix:
      'Check `dmesg` for NVIDIA Xid errors (79: fallen off the bus) and `nvidia-smi -L`; the GPU usually needs a reset or the node a reboot, and its shards another GPU. ' +
      "Start such a shard's engine on GPUs the GPU driver lists and PUT it with them, or DELETE a shard that is gone.",
  });
  const listed = byName(await doctorFor(t, scenario, { stateFile: config.stateFile }))['registered-gpus'];
  t.same([listed!.status, listed!.detail], ['ok', 'the GPU driver lists every GPU the 2 shard registration(s) naming GPUs by UUID name']);
  t.notOk('registered-gpus' in byName(await doctorFor(t, null, { stateFile: config.stateFile })), 'without a GPU listing, nothing to compare');
});

t.test("with an Ollama shard stored: whether its model runners can be found", async (t) => {
  const dir = t.testdir({ state: {}, proc: { '1': { stat: '' } } });
  const stateFile = join(dir, 'state', 'shards.json');
  const stored = (engine: ShardRecord['engine'], cgroup: string | null = null) =>
    writeFileSync(stateFile, serialiseShards(new Map([['s', shardRecord(Date.now(), { engine, cgroup, pid: cgroup === null ? 100 : null })]])));
  stored('llama.cpp');
  t.notOk(byName(await doctorFor(t, idleEightGpuNode(), { stateFile }))['ollama-runners'], 'asked only with an Ollama shard');
  stored('ollama', 'pod-uid');
  t.notOk(byName(await doctorFor(t, idleEightGpuNode(), { stateFile }))['ollama-runners'], 'registered by PID');
  stored('ollama');
  t.match(byName(await doctorFor(t, idleEightGpuNode(), { stateFile }))['ollama-runners'], { status: 'ok', detail: /1 Ollama shard/ });
  const without = byName(await doctorFor(t, idleEightGpuNode(), { stateFile, proc: join(dir, 'proc') }))['ollama-runners'];
  t.match(without, { status: 'warn', detail: /CONFIG_PROC_CHILDREN.*on-cpu/, fix: /by cgroup.*OLLAMA_KEEP_ALIVE=-1/ });
});
