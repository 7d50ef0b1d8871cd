// Owns the dry run of scripts/gpu-smoke.sh: the script runs end to end against the built service
// and the fake nvidia-smi, with a `sleep` standing in for the CUDA process. The stand-in writes its
// pid to SMOKE_CUDA_PID_FILE; this test then makes the fake list that pid on GPU 0, as the real
// nvidia-smi would once the process holds memory. A passing run must PASS every check and record
// the service's exact queries (and the doctor's report); a run where nvidia-smi never lists the
// process must FAIL; a run outside the host's PID namespace must say so in one row, at once; on a
// GPU 0 with MIG devices the CUDA process must be pointed at the first of them. With the fake NVML
// library beside the fake's scenario (scripts/fake-nvml.ts) the script's second run, under NVML, must
// agree with the first to the MiB, and a fake NVML that reads another scenario must make it FAIL
// naming the difference; without the library, one INFO row says that NVML was not compared.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import t, { type Test } from 'tap';
import { createFakeNvidiaSmi, waitUntil, type FakeScenario } from '../helpers/fake-nvidia-smi.js';
import { CHECKS, GPU0, node, NVML_CHECKS, ROOT, rows, runSmoke, SCRIPT } from '../helpers/gpu-smoke-run.js';
import { installFakeNvml } from '../../scripts/fake-nvml.js';

// About a dozen runs of the script, each starting the service and a doctor: minutes on a busy machine.
t.setTimeout(900_000);

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts') ? [path] : [];
  });
}

/** dist/ is stale when any source of the service has no output or a newer mtime than its output. */
function staleOutputs(): string[] {
  return ['src', 'routes']
    .flatMap((dir) => sources(join(ROOT, dir)))
    .filter((source) => {
      const output = join(ROOT, 'dist', relative(ROOT, source)).replace(/\.ts$/, '.js');
      return !existsSync(output) || statSync(output).mtimeMs < statSync(source).mtimeMs;
    });
}

t.before(() => {
  const stale = staleOutputs();
  if (stale.length === 0) return;
  const tsc = spawnSync(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 240_000,
  });
  // tsc still emits when another file has a type error; the typecheck step reports those.
  if (tsc.status !== 0) t.comment(`tsc exited ${tsc.status}: ${tsc.stdout}${tsc.stderr}`);
  if (!existsSync(join(ROOT, 'dist/src/main.js'))) throw new Error(`the build produced no dist/src/main.js: ${tsc.stdout}${tsc.stderr}`);
});

t.test('a GPU process of the shard: every check passes and the queries are recorded', async (t) => {
  const dir = t.testdir({ smi: {}, recorded: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  const recorded = join(dir, 'recorded');
  const run = await runSmoke(t, fake, ['--record', recorded], { SMOKE_HTTP_CLIENT: 'curl' }, (pid) =>
    fake.update((s) => {
      s.processes.push({ gpuUuid: GPU0, pid, name: 'python3', usedMiB: 1530 });
      s.gpus[0]!.usedMiB = 1548;
    }),
  );
  const table = rows(run.stdout);
  t.equal(run.code, 0, 'exit 0', { stdout: run.stdout, stderr: run.stderr });
  t.same([...table.keys()], CHECKS, 'every check ran, in order');
  for (const [name, row] of table) t.equal(row.result, 'PASS', `${name}: ${row.detail}`);
  t.match(table.get('smoke-gpu starting -> ready')?.detail, /^starting -> ready after/, 'readiness went starting -> ready');
  t.match(table.get('/gpus/foreign-memory')?.detail, /shardMiB 1530 /);
  t.match(table.get('host PID namespace')?.detail, new RegExp(`^nvidia-smi lists the CUDA process as pid ${run.cudaPid} \\(GPU 0\\), the pid this /proc \\(PID namespace pid:\\[\\d+\\]\\) has for it$`));
  // No NVML library beside the fake: one row, no check, says NVML was not compared.
  t.same([...rows(run.stdout, ['INFO']).keys()], ['nvml backend'], 'one INFO row');
  t.match(rows(run.stdout, ['INFO']).get('nvml backend')?.detail, /^NVML cannot be loaded, so only nvidia-smi was checked \(NVML_LIBRARY names a library; --require-nvml makes this a FAIL\): NODECOMPUTE_BACKEND is nvml, but .*libnvidia-ml\.so\.1 could not be loaded/);
  t.match(run.stdout, /0 failed, 0 skipped, 1 noted/);
  t.match(run.stdout, /^nodecompute GPU smoke check: nvidia-smi .*, NVML not available, driver .*, GPU 0 NVIDIA H200 \(MIG Disabled\), PID namespace pid:\[\d+\]( \(.*\))?, node /m, 'the header names NVML, the MIG mode and the PID namespace');
  t.match(
    run.stdout,
    / 0 failed, 0 skipped, 1 noted\n\nnodecompute doctor with NODECOMPUTE_BACKEND=nvidia-smi \(exit 0; evidence, not a check of this script\):\n {4}OK {4}settings .*\n {4}OK {4}backend {13}GPU figures come from nvidia-smi \(.*\): NODECOMPUTE_BACKEND is nvidia-smi\n {4}OK {4}nvidia-smi /,
    "the doctor's report follows the table, indented, and names the backend",
  );
  t.notMatch(run.stdout, /NODECOMPUTE_BACKEND=nvml \(exit/, 'no doctor under NVML');

  const prefix = 'nvsmi-real_nvidia-h200_590.48.01';
  t.same(readdirSync(recorded).sort(), ['commands', 'doctor', 'list-L', 'query-compute-apps', 'query-gpu', 'version'].map((q) => `${prefix}_${q}.txt`));
  t.match(readFileSync(join(recorded, `${prefix}_doctor.txt`), 'utf8'), /^OK {4}settings .*\nOK {4}backend .*\nOK {4}nvidia-smi .*\n[^]*nodecompute doctor: /, "the doctor's report is recorded");
  const apps = readFileSync(join(recorded, `${prefix}_query-compute-apps.txt`), 'utf8');
  t.match(apps, new RegExp(`^gpu_uuid, pid, process_name, used_gpu_memory \\[MiB\\]\\n${GPU0}, ${run.cudaPid}, python3, 1530 MiB\\n$`), 'compute-apps recorded while the process ran');
  t.match(readFileSync(join(recorded, `${prefix}_query-gpu.txt`), 'utf8'), /^index, uuid, name, memory\.total \[MiB\], memory\.used \[MiB\], memory\.free \[MiB\], memory\.reserved \[MiB\], mig\.mode\.current, pci\.bus_id, utilization\.gpu \[%\]\n0, GPU-[^,]+, NVIDIA H200, (?:[^,]+, ){5}00000000:01:00\.0, \d+ %\n$/);
  t.match(readFileSync(join(recorded, `${prefix}_version.txt`), 'utf8'), /DRIVER version\s+: 590\.48\.01/);
  t.match(readFileSync(join(recorded, `${prefix}_list-L.txt`), 'utf8'), /^GPU 0: NVIDIA H200 \(UUID: GPU-/);
  t.match(readFileSync(join(recorded, `${prefix}_commands.txt`), 'utf8'), new RegExp(`while pid ${run.cudaPid} `));

  // The recording asks exactly what the service asks: same arguments, byte for byte.
  const queries = fake.invocations().map((i) => i.argv.join(' ')).filter((argv) => argv.startsWith('--query-'));
  const byKind = (flag: string) => new Set(queries.filter((argv) => argv.startsWith(flag)));
  t.equal(byKind('--query-gpu').size, 1, `one form of the GPU query: ${[...byKind('--query-gpu')].join(' | ')}`);
  t.equal(byKind('--query-compute-apps').size, 1, 'one form of the compute-apps query');
});

const noCompiler = spawnSync('cc', ['--version'], { encoding: 'utf8' }).status === 0 ? false : 'no C compiler (cc) here to build the fake NVML library';

/** `text` as a regular expression that matches it literally. */
const literally = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Writes `scenario` as the scenario.json of the fake NVML library in `dir` (by rename: it re-reads the file as it changes). */
function writeNvmlScenario(dir: string, scenario: FakeScenario): void {
  writeFileSync(join(dir, 'scenario.json.tmp'), JSON.stringify(scenario));
  renameSync(join(dir, 'scenario.json.tmp'), join(dir, 'scenario.json'));
}

t.test('NVML beside nvidia-smi, on the same node: the NVML run agrees to the MiB and both answers are recorded', { skip: noCompiler }, async (t) => {
  const dir = t.testdir({ smi: {}, recorded: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  // The fake library reads the fake nvidia-smi's own scenario.json: both backends see one node.
  const library = installFakeNvml(fake.dir);
  const recorded = join(dir, 'recorded');
  const run = await runSmoke(t, fake, ['--record', recorded, '--require-nvml'], { SMOKE_HTTP_CLIENT: 'curl' }, (pid) =>
    fake.update((s) => {
      s.processes.push({ gpuUuid: GPU0, pid, name: 'python3', usedMiB: 1530, smUtilPct: 37 });
      s.gpus[0]!.usedMiB = 1548;
    }),
  );
  const table = rows(run.stdout);
  t.equal(run.code, 0, 'exit 0', { stdout: run.stdout, stderr: run.stderr });
  t.same([...table.keys()], [...CHECKS, ...NVML_CHECKS], 'every check ran, then the NVML run, in order');
  for (const [name, row] of table) t.equal(row.result, 'PASS', `${name}: ${row.detail}`);
  t.match(table.get('nvml backend')?.detail, new RegExp(`^start log: GPU figures come from nvml \\(${literally(library)}\\): NODECOMPUTE_BACKEND is nvml; doctor: ${literally(library)} answers: driver 590\\.48\\.01, CUDA 13\\.1$`));
  t.match(table.get('nvml: smoke-gpu ready')?.detail, /^(starting -> )?ready after \d+ s, as under nvidia-smi \(starting -> ready\)$/);
  t.equal(table.get('nvml: /gpus same GPUs')?.detail, '1 GPU(s), the same index, UUID and memory total as under nvidia-smi (GPU 0: 143771 MiB)');
  t.match(table.get('nvml: CUDA pid on GPU 0')?.detail, new RegExp(`^the same usedMiB as under nvidia-smi: \\{"pid":${run.cudaPid},"name":"python3","usedMiB":1530,"shard":"smoke-gpu","smUtilPct":37,"migUuid":null\\}$`), 'with the SM utilization only NVML gives');
  t.match(table.get('service starts')?.detail, /\(NODECOMPUTE_BACKEND=nvidia-smi\)$/, 'the first run names nvidia-smi');
  t.match(run.stdout, /18 passed, 0 failed, 0 skipped\n/);
  t.match(run.stdout, new RegExp(`^nodecompute GPU smoke check: nvidia-smi .*, NVML ${literally(library)}, driver `, 'm'));
  t.match(run.stdout, /\n\nnodecompute doctor with NODECOMPUTE_BACKEND=nvml \(exit 0; evidence, not a check of this script\):\n {4}OK {4}settings .*\n {4}OK {4}backend {13}GPU figures come from nvml .*\n {4}OK {4}nvml /, "the doctor's report under NVML follows nvidia-smi's");

  const prefix = 'nvsmi-real_nvidia-h200_590.48.01';
  const files = ['commands', 'doctor', 'doctor-nvml', 'list-L', 'query-compute-apps', 'query-gpu', 'version'].map((q) => `${prefix}_${q}.txt`);
  files.push(`${prefix}_gpus-nvidia-smi.json`, `${prefix}_gpus-nvml.json`);
  t.same(readdirSync(recorded).sort(), files.sort());
  type Gpus = { gpus: Array<{ index: number; uuid: string; memory: { totalMiB: number }; processes: Array<{ pid: number; usedMiB: number; shard: string | null; smUtilPct: number | null }>; events?: unknown }> };
  const answer = (backend: string) => JSON.parse(readFileSync(join(recorded, `${prefix}_gpus-${backend}.json`), 'utf8')) as Gpus;
  const [smi, nvml] = [answer('nvidia-smi'), answer('nvml')];
  for (const gpus of [smi, nvml]) {
    t.same(gpus.gpus.map(({ index, uuid, memory }) => [index, uuid, memory.totalMiB]), [[0, GPU0, 143771]]);
    t.same(gpus.gpus[0]?.processes.map(({ pid, usedMiB, shard }) => [pid, usedMiB, shard]), [[run.cudaPid, 1530, 'smoke-gpu']]);
  }
  t.equal(smi.gpus[0]?.processes[0]?.smUtilPct, null, 'nvidia-smi gives no SM utilization');
  t.ok(nvml.gpus[0]?.events, "NVML's answer has the GPU's events");
  t.match(readFileSync(join(recorded, `${prefix}_doctor-nvml.txt`), 'utf8'), /^OK {4}settings .*\nOK {4}backend .*GPU figures come from nvml .*\nOK {4}nvml /);
  const commands = readFileSync(join(recorded, `${prefix}_commands.txt`), 'utf8');
  t.match(commands, /_gpus-nvidia-smi\.json: GET \/gpus with NODECOMPUTE_BACKEND=nvidia-smi /);
  t.match(commands, /_gpus-nvml\.json: GET \/gpus with NODECOMPUTE_BACKEND=nvml /);
  t.match(commands, /_doctor-nvml\.txt: nodecompute doctor with NODECOMPUTE_BACKEND=nvml \(exit 0; /);
});

t.test('NVML and nvidia-smi disagree: the NVML run FAILs naming each difference', { skip: noCompiler }, async (t) => {
  const dir = t.testdir({ smi: {}, nvml: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  // A library of its own, reading a scenario of its own: GPU 0 a little smaller, the process larger.
  const nvmlDir = join(dir, 'nvml');
  const library = installFakeNvml(nvmlDir);
  const other = node();
  other.gpus[0]!.totalMiB = 143760;
  writeNvmlScenario(nvmlDir, other);
  const run = await runSmoke(t, fake, [], { SMOKE_HTTP_CLIENT: 'node', NVML_LIBRARY: library }, (pid) => {
    fake.update((s) => {
      s.processes.push({ gpuUuid: GPU0, pid, name: 'python3', usedMiB: 1530 });
    });
    other.processes.push({ gpuUuid: GPU0, pid, name: 'python3', usedMiB: 1532 });
    writeNvmlScenario(nvmlDir, other);
  });
  const table = rows(run.stdout);
  t.equal(run.code, 1, 'exit 1', { stdout: run.stdout, stderr: run.stderr });
  t.same([...table.keys()], [...CHECKS.filter((name) => name !== 'record nvidia-smi outputs'), ...NVML_CHECKS]);
  for (const name of [...CHECKS.filter((name) => name !== 'record nvidia-smi outputs'), 'nvml backend', 'nvml: smoke-gpu ready', 'nvml: service stops on SIGTERM']) {
    t.equal(table.get(name)?.result, 'PASS', `${name}: ${table.get(name)?.detail}`);
  }
  t.same(table.get('nvml: /gpus same GPUs'), { result: 'FAIL', detail: 'GPU 0: memory total 143771 MiB under nvidia-smi, 143760 MiB under nvml' });
  t.same(table.get('nvml: CUDA pid on GPU 0'), { result: 'FAIL', detail: `pid ${run.cudaPid} on GPU 0: usedMiB 1530 under nvidia-smi, 1532 under nvml` });
  t.match(run.stdout, /15 passed, 2 failed, 0 skipped\n/);
  t.match(run.stderr, /last lines of the nodecompute log \(.*service-nvidia-smi\.log\)[^]*last lines of the nodecompute log \(.*service-nvml\.log\)/, "both runs' logs are shown");
});

t.test('nvidia-smi never lists the CUDA process: the GPU checks FAIL and the exit is non-zero', async (t) => {
  const dir = t.testdir({ smi: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  const run = await runSmoke(t, fake, [], { SMOKE_HTTP_CLIENT: 'node', SMOKE_READY_TIMEOUT_S: '3' }, () => undefined);
  const table = rows(run.stdout);
  t.equal(run.code, 1, 'exit 1', { stdout: run.stdout, stderr: run.stderr });
  for (const name of ['smoke-gpu starting -> ready', '/gpus: CUDA pid on GPU 0', '/shards/smoke-gpu/compute', '/gpus/foreign-memory']) {
    t.equal(table.get(name)?.result, 'FAIL', `${name}: ${table.get(name)?.detail}`);
  }
  t.match(table.get('/gpus: CUDA pid on GPU 0')?.detail, new RegExp(`pid ${run.cudaPid} is not among GPU 0's processes`));
  // Never ready: still starting when the wait ends, or, on a machine loaded enough that the wait
  // outlasts the shard's grace, on-cpu by then.
  t.match(table.get('smoke-gpu starting -> ready')?.detail, /^starting( -> on-cpu)? \(HTTP 503\)/);
  t.equal(table.get('host PID namespace')?.result, 'SKIP', 'nothing listed: no telling the PID namespace');
  t.match(table.get('host PID namespace')?.detail, /^cannot tell: within 10 s nvidia-smi listed neither the CUDA process/);
  for (const name of ['service starts', 'register smoke-gpu', 'smoke-cpu starting -> on-cpu', 'service stops on SIGTERM']) {
    t.equal(table.get(name)?.result, 'PASS', `${name} still passes: ${table.get(name)?.detail}`);
  }
  t.match(table.get('/gpus/foreign-memory')?.detail, /^GPU 0: shardMiB \d+ after 5 s, expected >= 900: /, 'shard memory is looked at for 5 s before failing');
  t.match(run.stderr, /last lines of the nodecompute log/, 'the service log is shown for a failed run');
});

/** A pid this /proc does not have: what nvidia-smi reports for our process from another PID namespace. */
function absentPid(): number {
  let pid = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8')) - 1;
  while (existsSync(`/proc/${pid}`)) pid -= 1;
  return pid;
}

t.test("not the host's PID namespace: one clear FAIL as soon as the CUDA process holds GPU 0, and the checks that cannot pass are skipped", async (t) => {
  const dir = t.testdir({ smi: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  const foreign = absentPid();
  const started = Date.now();
  // The readiness wait is long: only the namespace check can make this run short. No NVML library
  // here, which --require-nvml makes a FAIL of its own.
  const run = await runSmoke(t, fake, ['--require-nvml'], { SMOKE_HTTP_CLIENT: 'curl', SMOKE_READY_TIMEOUT_S: '120' }, () =>
    fake.update((s) => {
      s.processes.push({ gpuUuid: GPU0, pid: foreign, name: '[Not Found]', usedMiB: 1530 });
      s.gpus[0]!.usedMiB = 1548;
    }),
  );
  const elapsed = Date.now() - started;
  const table = rows(run.stdout);
  t.equal(run.code, 1, 'exit 1', { stdout: run.stdout, stderr: run.stderr });
  t.equal(table.get('host PID namespace')?.result, 'FAIL');
  t.match(
    table.get('host PID namespace')?.detail,
    new RegExp(
      `^not the host's PID namespace: nvidia-smi reports pid ${foreign} \\(\\[Not Found\\], 1530 MiB\\) on GPU 0, and this /proc \\(PID namespace pid:\\[\\d+\\]\\) has no such pid, ` +
        `while it has the CUDA process as pid ${run.cudaPid}, which nvidia-smi does not list.*\\. Run this with the host's PID namespace \\(docker run --pid=host, hostPID: true in Kubernetes\\)$`,
    ),
  );
  for (const name of ['smoke-gpu starting -> ready', '/gpus: CUDA pid on GPU 0', '/shards/smoke-gpu/compute', '/gpus/foreign-memory', 'smoke-cpu starting -> on-cpu']) {
    t.equal(table.get(name)?.result, 'SKIP', name);
    t.match(table.get(name)?.detail, /^cannot pass outside the host's PID namespace \(see host PID namespace\)$/);
  }
  for (const name of ['service starts', '/readyz', '/gpus lists GPU 0', 'register smoke-gpu', 'DELETE shards', 'service stops on SIGTERM']) {
    t.equal(table.get(name)?.result, 'PASS', `${name}: ${table.get(name)?.detail}`);
  }
  t.same(table.get('nvml backend')?.result, 'FAIL');
  t.match(table.get('nvml backend')?.detail, /^NVML cannot be loaded, so it was not compared with nvidia-smi \(--require-nvml\): NODECOMPUTE_BACKEND is nvml, but /);
  t.match(run.stdout, /2 failed, 5 skipped\n/);
  t.ok(elapsed < 60_000, `the run took ${elapsed} ms, not the readiness wait of 120 s`);
});

// The default CUDA command is what runs on a GPU machine: python3 scripts/cuda-hold.py, through the
// CUDA driver API or else torch. A stand-in torch module (on PYTHONPATH) and a stand-in driver library
// (compiled here from test/fixtures/cuda/) let it run here, quoting and pid hand-over included.
const STAND_IN_TORCH = [
  'import os',
  'if os.environ.get("STAND_IN_TORCH") == "broken":',
  '    raise OSError("libcudnn.so.9: cannot open shared object file: No such file or directory")',
  '__version__ = "0.0-stand-in"',
  'uint8 = "uint8"',
  'class _Tensor:',
  '    def fill_(self, value):',
  '        return self',
  'def empty(size, dtype=None, device=None):',
  '    if os.environ.get("STAND_IN_TORCH") == "oom":',
  '        raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")',
  '    # nvidia-smi numbers GPUs in PCI order; CUDA does so only when told, and only without a mask.',
  '    assert device == "cuda:0" and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"',
  '    assert os.environ.get("CUDA_VISIBLE_DEVICES") == os.environ.get("STAND_IN_CUDA_VISIBLE_DEVICES")',
  '    return _Tensor()',
  'class cuda:',
  '    @staticmethod',
  '    def is_available():',
  '        return os.environ.get("STAND_IN_CUDA") == "1"',
  '    @staticmethod',
  '    def synchronize():',
  '        pass',
  '',
].join('\n');
const python = spawnSync('python3', ['--version'], { encoding: 'utf8' });
const noPython = python.status === 0 ? false : 'python3 is not installed here';
const compiler = spawnSync('cc', ['--version'], { encoding: 'utf8' });
const noDriverStandIn = noPython || (compiler.status === 0 ? false : 'no C compiler (cc) here to build the stand-in CUDA driver library');
const HOLDER = join(ROOT, 'scripts', 'cuda-hold.py');

/** Builds the stand-in libcuda.so.1 into `dir` and returns its path. */
function standInDriver(dir: string): string {
  const library = join(dir, 'libcuda-stand-in.so');
  const source = join(ROOT, 'test', 'fixtures', 'cuda', 'libcuda-stand-in.c');
  const build = spawnSync('cc', ['-shared', '-fPIC', '-Wall', '-Werror', '-o', library, source], { encoding: 'utf8' });
  if (build.status !== 0) throw new Error(`cc could not build the stand-in driver: ${build.stderr}`);
  return library;
}

/**
 * Runs the script with its default CUDA command (cuda-hold.py; torch from `dir`/py) and `env`; the
 * fake lists the holder on GPU 0 once it reports its pid. Every check must pass; returns the table.
 */
async function runHolder(t: Test, dir: string, env: Record<string, string>, scenario = node()) {
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), scenario);
  const run = await runSmoke(t, fake, [], { SMOKE_CUDA_CMD: '', PYTHONPATH: join(dir, 'py'), CUDA_VISIBLE_DEVICES: '3', ...env }, (pid) =>
    fake.update((s) => {
      s.processes.push({ gpuUuid: GPU0, pid, name: '/usr/bin/python3', usedMiB: 1536 });
    }),
  );
  const table = rows(run.stdout);
  t.equal(run.code, 0, 'exit 0', { stdout: run.stdout, stderr: run.stderr });
  for (const [name, row] of table) t.equal(row.result, 'PASS', `${name}: ${row.detail}`);
  t.equal(table.size, CHECKS.length - 1, 'every check but the recording');
  return { table, stdout: run.stdout };
}

t.test('the default CUDA command: no driver library, so python3 + torch (a stand-in module) holds GPU 0', { skip: noPython }, async (t) => {
  const dir = t.testdir({ smi: {}, py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const { table } = await runHolder(t, dir, { STAND_IN_CUDA: '1', SMOKE_CUDA_DRIVER_LIB: join(dir, 'no-libcuda.so.1') });
  t.match(table.get('register smoke-gpu')?.detail, /CUDA process: python3 scripts\/cuda-hold\.py through torch 0\.0-stand-in, 1 GiB on GPU 0$/);
});

t.test('the default CUDA command: the CUDA driver API (a stand-in libcuda) holds GPU 0', { skip: noDriverStandIn }, async (t) => {
  const dir = t.testdir({ smi: {}, py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const calls = join(dir, 'driver-calls.log');
  const { table } = await runHolder(t, dir, { STAND_IN_CUDA: '0', SMOKE_CUDA_DRIVER_LIB: standInDriver(dir), STAND_IN_CUDA_LOG: calls });
  t.match(table.get('register smoke-gpu')?.detail, /through the CUDA driver API \(.*libcuda-stand-in\.so, CUDA 13\.1\), 1 GiB on GPU 0$/);
  // The --check run initialises the driver once; the holder then allocates and writes 1 GiB on device 0.
  t.same(readFileSync(calls, 'utf8').trim().split('\n'), [
    ...['cuInit', 'cuDeviceGetCount', 'cuDriverGetVersion'],
    ...['cuInit', 'cuDeviceGetCount', 'cuDriverGetVersion'],
    'cuDeviceGet 0',
    'cuDevicePrimaryCtxRetain 0',
    'cuCtxSetCurrent',
    'cuMemAlloc_v2 1073741824',
    'cuMemsetD8_v2 0x7f0000000000 1 1073741824',
    'cuCtxSynchronize',
  ]);
});

// GPU 0 of the H200 MIG capture (test/fixtures/samples/nvsmi-capture_h200-mig_590.48.01_list-L.txt):
// its five MIG devices, as `nvidia-smi -L` lists them. With MIG enabled CUDA sees MIG devices only.
const H200_MIG_DEVICES = [
  { profile: '1c.3g.71gb', uuid: 'MIG-00000000-0000-0000-0000-000000000000' },
  { profile: '2c.3g.71gb', uuid: 'MIG-00000001-0000-0000-0000-000000000001' },
  { profile: '2g.35gb', uuid: 'MIG-00000002-0000-0000-0000-000000000002' },
  { profile: '1g.18gb', uuid: 'MIG-00000003-0000-0000-0000-000000000003' },
  { profile: '1g.18gb', uuid: 'MIG-00000004-0000-0000-0000-000000000004' },
];

function migNode(): FakeScenario {
  const scenario = node();
  Object.assign(scenario.gpus[0]!, { migMode: 'Enabled', migDevices: H200_MIG_DEVICES });
  return scenario;
}

t.test("MIG on GPU 0: the CUDA process is pointed at GPU 0's first MIG device, and the header says MIG is on", { skip: noDriverStandIn }, async (t) => {
  const dir = t.testdir({ smi: {}, py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const calls = join(dir, 'driver-calls.log');
  const first = H200_MIG_DEVICES[0]!.uuid;
  // The stand-in driver fails cuInit unless CUDA_VISIBLE_DEVICES is exactly this.
  const env = { STAND_IN_CUDA: '0', SMOKE_CUDA_DRIVER_LIB: standInDriver(dir), STAND_IN_CUDA_LOG: calls, STAND_IN_CUDA_VISIBLE_DEVICES: first };
  const { table, stdout } = await runHolder(t, dir, env, migNode());
  t.match(table.get('register smoke-gpu')?.detail, new RegExp(`through the CUDA driver API \\(.*\\) on GPU 0's MIG device ${first}, 1 GiB on GPU 0$`));
  t.match(stdout, new RegExp(`, GPU 0 NVIDIA H200 \\(MIG Enabled; CUDA on its MIG device ${first}\\), `), 'the header names the MIG mode and device');
  t.same(
    readFileSync(calls, 'utf8').split('\n').filter((line) => line.startsWith('cuInit')),
    [`cuInit CUDA_VISIBLE_DEVICES=${first}`, `cuInit CUDA_VISIBLE_DEVICES=${first}`],
    'the check and the holder both saw the MIG device',
  );
});

t.test('cuda-hold.py says why each way failed, and writes no pid', { skip: noDriverStandIn }, async (t) => {
  const dir = t.testdir({ smi: {}, py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const pidFile = join(dir, 'cuda.pid');
  // No nvidia-smi to ask for MIG devices: CUDA_VISIBLE_DEVICES is dropped.
  const base: NodeJS.ProcessEnv = {
    ...process.env,
    PYTHONPATH: join(dir, 'py'),
    STAND_IN_CUDA: '0',
    SMOKE_CUDA_DRIVER_LIB: standInDriver(dir),
    SMOKE_CUDA_PID_FILE: pidFile,
    NVIDIA_SMI: join(dir, 'no-nvidia-smi'),
  };
  delete base.CUDA_DEVICE_ORDER;
  delete base.CUDA_VISIBLE_DEVICES;
  const hold = (env: NodeJS.ProcessEnv, args: string[] = []) => spawnSync('python3', [HOLDER, ...args], { env: { ...base, ...env }, encoding: 'utf8', timeout: 30_000 });
  const driver = 'the CUDA driver API \\(.*libcuda-stand-in\\.so, CUDA 13\\.1\\)';
  const noTorch = 'torch 0\\.0-stand-in sees no CUDA device \\(a CPU-only build, or no driver access\\)';
  const prefix = '^cuda-hold: cannot hold memory on GPU 0: ';
  const cases: Array<[string, NodeJS.ProcessEnv, RegExp]> = [
    ['out of memory', { STAND_IN_CUDA_FAIL: 'cuMemAlloc_v2' }, new RegExp(`${prefix}${driver} could not hold it: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY \\(2\\); ${noTorch}$`)],
    ['the write', { STAND_IN_CUDA_FAIL: 'cuMemsetD8_v2' }, new RegExp(`${prefix}${driver} could not hold it: cuMemsetD8_v2 failed: CUDA_ERROR_OUT_OF_MEMORY \\(2\\); ${noTorch}$`)],
    ['no device', { STAND_IN_CUDA_DEVICES: '0' }, new RegExp(`${prefix}the CUDA driver sees no device; ${noTorch}$`)],
    [
      'a broken torch and no driver library',
      { STAND_IN_TORCH: 'broken', SMOKE_CUDA_DRIVER_LIB: join(dir, 'no-libcuda.so.1') },
      new RegExp(`${prefix}the CUDA driver library cannot be loaded \\(.*no-libcuda\\.so\\.1.*\\); torch cannot be imported \\(OSError: libcudnn\\.so\\.9: cannot open shared object file`),
    ],
    [
      'both allocations',
      { STAND_IN_CUDA: '1', STAND_IN_TORCH: 'oom', STAND_IN_CUDA_FAIL: 'cuMemAlloc_v2' },
      new RegExp(`${prefix}${driver} could not hold it: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY \\(2\\); torch 0\\.0-stand-in could not hold it: RuntimeError: CUDA out of memory\\. Tried to allocate 1\\.00 GiB$`),
    ],
    ['only torch asked for (--ways torch)', { STAND_IN_CUDA_FAIL: 'cuMemAlloc_v2', args: '--ways torch' }, new RegExp(`${prefix}${noTorch}$`)],
  ];
  for (const [what, { args, ...env }, reason] of cases) {
    const run = hold(env, args === undefined ? [] : args.split(' '));
    t.equal(run.status, 1, `${what}: exit 1`, { stderr: run.stderr });
    t.match(run.stderr.trim(), reason, `${what}: says why each way failed`);
    t.notOk(existsSync(pidFile), `${what}: no pid written`);
  }
  const unknown = hold({}, ['--help']);
  t.equal(unknown.status, 2, 'an unknown argument is a usage error, not an allocation');
  t.match(unknown.stderr, /unknown arguments --help; usage: cuda-hold\.py \[--ways driver,torch\] \[--check\]/);
  t.equal(hold({}, ['--ways', 'driver,cupy', '--check']).status, 2, 'an unknown way is a usage error');

  // The stand-in fails cuInit unless CUDA numbers devices in PCI order with no mask: the script sees to it.
  const check = hold({ CUDA_VISIBLE_DEVICES: '3' }, ['--check']);
  t.equal(check.status, 0, '--check passes, CUDA_VISIBLE_DEVICES dropped and PCI order set by the script itself', { stderr: check.stderr });
  t.match(check.stdout, new RegExp(`^${driver}\\n$`), '--check names the way it would hold memory');
  t.match(hold({ STAND_IN_TORCH: 'broken' }, ['--check']).stdout, new RegExp(`^${driver}\\n$`), 'the driver comes first: torch is not even imported');
  t.match(hold({ STAND_IN_CUDA: '1' }, ['--ways', 'torch', '--check']).stdout, /^torch 0\.0-stand-in\n$/, '--ways torch asks torch alone');

  // GPU 0 with MIG devices (nvidia-smi -L of the H200 MIG capture): the first of them, by its UUID.
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), migNode());
  const first = H200_MIG_DEVICES[0]!.uuid;
  const mig = hold({ NVIDIA_SMI: fake.path, STAND_IN_CUDA_VISIBLE_DEVICES: first }, ['--check']);
  t.equal(mig.status, 0, 'CUDA_VISIBLE_DEVICES is the MIG UUID the stand-in expects', { stderr: mig.stderr });
  t.match(mig.stdout, new RegExp(`^${driver} on GPU 0's MIG device ${first}\\n$`));
  const noMig = hold({ NVIDIA_SMI: fake.path }, ['--check']);
  t.equal(noMig.status, 1, 'the stand-in refuses a CUDA_VISIBLE_DEVICES it did not expect: the MIG device was set');
  t.match(noMig.stderr, new RegExp(`\\(CUDA_VISIBLE_DEVICES=${first}, GPU 0's first MIG device\\)\\n$`), 'a failure names the MIG device');
  t.notOk(existsSync(pidFile), '--check holds nothing');
});

t.test("cuda-hold.py holds through torch when the driver's allocation fails", { skip: noDriverStandIn }, async (t) => {
  const dir = t.testdir({ py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const pidFile = join(dir, 'cuda.pid');
  const calls = join(dir, 'driver-calls.log');
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    PYTHONPATH: join(dir, 'py'),
    STAND_IN_CUDA: '1',
    STAND_IN_CUDA_FAIL: 'cuMemAlloc_v2',
    SMOKE_CUDA_DRIVER_LIB: standInDriver(dir),
    STAND_IN_CUDA_LOG: calls,
    SMOKE_CUDA_PID_FILE: pidFile,
    NVIDIA_SMI: join(dir, 'no-nvidia-smi'),
  };
  delete env.CUDA_VISIBLE_DEVICES;
  const holder = spawn('python3', [HOLDER], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  t.teardown(() => holder.kill('SIGKILL'));
  let stderr = '';
  holder.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  await waitUntil(() => /\n/.test(stderr) || holder.exitCode !== null, { timeoutMs: 30_000, what: 'the holder to say what it holds' });
  t.match(stderr, /^cuda-hold: pid \d+ holds 1 GiB on GPU 0 through torch 0\.0-stand-in\n/);
  t.equal(readFileSync(pidFile, 'utf8'), String(holder.pid), 'its own pid, for gpu-smoke.sh');
  t.match(readFileSync(calls, 'utf8'), /cuMemAlloc_v2 1073741824\n$/, 'the driver was tried first, and its allocation failed');
});

t.test('neither torch with CUDA nor a driver library: the CUDA checks are SKIPPED with the reasons, the rest pass', { skip: noPython }, async (t) => {
  const dir = t.testdir({ smi: {}, py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  // No driver library either: the one in the path below does not exist.
  const env = { SMOKE_CUDA_CMD: '', PYTHONPATH: join(dir, 'py'), STAND_IN_CUDA: '0', SMOKE_CUDA_DRIVER_LIB: join(dir, 'no-libcuda.so.1') };
  const run = await runSmoke(t, fake, [], env, () => undefined);
  const table = rows(run.stdout);
  t.equal(run.code, 0, 'exit 0: nothing failed', { stdout: run.stdout, stderr: run.stderr });
  const skipped = [...table].filter(([, row]) => row.result === 'SKIP');
  t.same(
    skipped.map(([name]) => name),
    ['register smoke-gpu', 'host PID namespace', 'smoke-gpu starting -> ready', '/gpus: CUDA pid on GPU 0', '/shards/smoke-gpu/compute', '/gpus/foreign-memory'],
  );
  for (const [, row] of skipped) {
    t.match(row.detail, /^python3 cannot hold GPU memory: the CUDA driver library cannot be loaded \(.*no-libcuda\.so\.1.*\); torch 0\.0-stand-in sees no CUDA device /);
  }
  t.equal(table.get('smoke-cpu starting -> on-cpu')?.result, 'PASS');
  t.match(run.stdout, /0 failed, 6 skipped/);
  t.match(run.stderr, /SKIPPING the CUDA checks/);
});

t.test('--require-cuda: no CUDA process is a FAIL, not a SKIP', { skip: noPython }, async (t) => {
  const dir = t.testdir({ smi: {}, py: { torch: { '__init__.py': STAND_IN_TORCH } } });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
  const env = { SMOKE_CUDA_CMD: '', PYTHONPATH: join(dir, 'py'), STAND_IN_CUDA: '0', SMOKE_CUDA_DRIVER_LIB: join(dir, 'no-libcuda.so.1') };
  const run = await runSmoke(t, fake, ['--require-cuda'], env, () => undefined);
  const table = rows(run.stdout);
  t.equal(run.code, 1, 'exit 1', { stdout: run.stdout, stderr: run.stderr });
  for (const name of ['register smoke-gpu', 'host PID namespace', 'smoke-gpu starting -> ready', '/gpus: CUDA pid on GPU 0', '/shards/smoke-gpu/compute', '/gpus/foreign-memory']) {
    t.equal(table.get(name)?.result, 'FAIL', name);
    t.match(table.get(name)?.detail, /^python3 cannot hold GPU memory: .* \(--require-cuda\)$/);
  }
  t.match(run.stdout, /6 failed, 0 skipped/);
});

// A CUDA process that dies ends the waits at once: 600 s waits would time the test out. Exiting
// after its start-up, as torch does, it is registered and then read as exited; exiting at once, it
// is almost always gone before the PUT (422), and then no verdict can come (404).
t.test('a CUDA process that exits without its pid: the checks FAIL at once, with its output', async (t) => {
  const cases = [
    { when: 'after its start-up', cmd: 'sleep 2; echo "CUDA error: no kernel image is available" >&2; exit 3', registered: true, output: 'CUDA error: no kernel image is available' },
    { when: 'at once', cmd: 'echo "no CUDA-capable device is detected" >&2; exit 3', registered: null, output: 'no CUDA-capable device is detected' },
  ];
  for (const { when, cmd, registered, output } of cases) {
    const dir = t.testdir({ smi: {} });
    const fake = createFakeNvidiaSmi(join(dir, 'smi'), node());
    const run = await runSmoke(t, fake, [], { SMOKE_CUDA_CMD: cmd, SMOKE_CUDA_TIMEOUT_S: '600', SMOKE_READY_TIMEOUT_S: '600' }, () => undefined);
    const table = rows(run.stdout);
    t.equal(run.code, 1, `${when}: exit 1`, { stdout: run.stdout, stderr: run.stderr });
    const wasRegistered = table.get('register smoke-gpu')?.result === 'PASS';
    if (registered !== null) t.equal(wasRegistered, registered, `${when}: registered`);
    t.match(
      table.get('smoke-gpu starting -> ready')?.detail,
      wasRegistered ? /^(starting -> )?exited \(HTTP 503\)/ : /^HTTP-404 \(HTTP 404\) after \d+ s: No shard "smoke-gpu"/,
      `${when}: readiness stops at the first answer that settles it`,
    );
    t.equal(table.get('/gpus: CUDA pid on GPU 0')?.detail, `the CUDA process (the SMOKE_CUDA_CMD command) exited without writing its pid: ${output}`, `${when}: says it exited, with its output`);
  }
});

t.test('no nvidia-smi: one clear FAIL, no service started', async (t) => {
  const env: NodeJS.ProcessEnv = { ...process.env, NVIDIA_SMI: join(t.testdirName, 'no-such-nvidia-smi') };
  delete env.NODE_OPTIONS;
  delete env.NODE_V8_COVERAGE;
  const run = spawnSync('bash', [SCRIPT], { cwd: ROOT, env, encoding: 'utf8', timeout: 60_000 });
  t.equal(run.status, 1);
  t.match(run.stdout, /FAIL\s+nvidia-smi answers\s+".*no-such-nvidia-smi" -L failed/);
});

t.test('an unknown argument is a usage error', async (t) => {
  const run = spawnSync('bash', [SCRIPT, '--bogus'], { cwd: ROOT, encoding: 'utf8' });
  t.equal(run.status, 2);
  t.match(run.stderr, /unknown argument "--bogus"/);
});
