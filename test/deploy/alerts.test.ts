// Owns the checks of deploy/kubernetes/prometheusrule.yaml: promtool accepts the rules, and its unit
// tests, fed with the /metrics of real nodecompute apps (one with shards on-cpu, stopped, exited and stray,
// one whose GPU processes are hidden, one whose nvidia-smi fails, one whose GPU drops out of
// nvidia-smi's list under a shard, one whose token file is deleted, one whose nvidia-smi fails naming the GPU
// under a shard), fire exactly the alerts each node deserves,
// with their annotations rendered.
// A renamed metric or label fails here.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { parse } from 'yaml';
import { readStartTokens, resolveConfig } from '../../src/config.js';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { failDriver, reloaded } from '../helpers/backend.js';
import { waitUntil, type FakeProcess, type FakeScenario } from '../helpers/fake-nvidia-smi.js';

const RULES = fileURLToPath(new URL('../../deploy/kubernetes/prometheusrule.yaml', import.meta.url));
const UUIDS = ['GPU-aaaaaaaa-0000-0000-0000-000000000000', 'GPU-bbbbbbbb-0000-0000-0000-000000000000'];
/** A PID above Linux's largest pid_max (2^22): listed by nvidia-smi, never present in /proc. */
const INVISIBLE_PID = 4194305;
const STRAY_MIB = 4096;

interface Rule {
  alert: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}
const rules: Rule[] = (parse(readFileSync(RULES, 'utf8')) as { spec: { groups: Array<{ rules: Rule[] }> } }).spec.groups.flatMap((g) => g.rules);

function node(processes: FakeProcess[]): FakeScenario {
  return {
    gpus: UUIDS.map((uuid, index) => ({ index, uuid, name: 'NVIDIA H100 80GB HBM3', totalMiB: 81559, usedMiB: 20000, freeMiB: 61000, reservedMiB: 479 })),
    processes,
  };
}

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The nodecompute_* samples of a scrape (the text format as prom-client writes it: no escapes in these values). */
function samples(text: string): Sample[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith('nodecompute_'))
    .map((line) => {
      const match = /^(\w+)(?:\{(.*)\})? (\S+)$/.exec(line)!;
      const labels = Object.fromEntries([...(match[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1]!, m[2]!]));
      return { name: match[1]!, labels, value: Number(match[3]) };
    })
    .filter((sample) => Number.isFinite(sample.value));
}

const seriesText = (sample: Sample) =>
  `${sample.name}{${Object.entries(sample.labels)
    .map(([k, v]) => `${k}="${v}"`)
    .join(',')}}`;

/** Renders what these rules' templates use: label values, and humanize1024 of a power of 1024. */
function render(text: string, labels: Record<string, string>, value: number): string {
  const units = ['', 'Ki', 'Mi', 'Gi', 'Ti'];
  const power = Math.floor(Math.log(value) / Math.log(1024));
  return text
    .replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, key: string) => labels[key] ?? '')
    .replace('{{ $value | humanize1024 }}', `${value / 1024 ** power}${units[power]}`);
}

function expected(alertname: string, sample: Sample) {
  const rule = rules.find((r) => r.alert === alertname)!;
  const labels = { ...sample.labels, ...rule.labels };
  return {
    exp_labels: labels,
    exp_annotations: Object.fromEntries(Object.entries(rule.annotations).map(([k, v]) => [k, render(v, labels, sample.value)])),
  };
}

t.test('the alert rules fire on real nodecompute metrics, each for the node and shard that deserve it', async (t) => {
  // Node 1: a ready shard that also holds memory on a GPU it was not placed on, one on the CPU, one exited.
  const ready = await spawnShardProcess(t, 1);
  const onCpu = await spawnShardProcess(t, 0);
  const exited = await spawnShardProcess(t, 0);
  const stopped = await spawnShardProcess(t, 0);
  const busy = await buildTestApp(t, {
    scenario: node([
      { gpuUuid: UUIDS[0]!, pid: ready.members[0]!, name: 'llama-server', usedMiB: 12000 },
      { gpuUuid: UUIDS[1]!, pid: ready.members[0]!, name: 'llama-server', usedMiB: STRAY_MIB },
    ]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
  });
  const put = (id: string, body: object) => busy.app.inject({ method: 'PUT', url: `/shards/${id}`, payload: body });
  t.equal((await put('llama-a', { pid: ready.pid, gpus: [0] })).statusCode, 201);
  t.equal((await put('llama-b', { pid: onCpu.pid, gpus: [1], graceMs: 0 })).statusCode, 201);
  t.equal((await put('llama-c', { pid: exited.pid, gpus: [1] })).statusCode, 201);
  t.equal((await put('llama-d', { pid: stopped.pid, gpus: [] })).statusCode, 201);
  await exited.kill();
  // SIGKILL, which its teardown sends, ends a stopped process too.
  process.kill(stopped.pid, 'SIGSTOP');
  await waitUntil(() => /\) T /.test(readFileSync(`/proc/${stopped.pid}/stat`, 'utf8')), { what: `process ${stopped.pid} to stop` });
  await settle(busy.app);

  // Node 2: nvidia-smi lists a process this /proc does not have.
  const hidden = await buildTestApp(t, { scenario: node([{ gpuUuid: UUIDS[0]!, pid: INVISIBLE_PID, name: '[Not Found]', usedMiB: 12000 }]), config: { cacheTtlMs: 0 } });

  // Node 3: nvidia-smi fails.
  const clock = manualClock();
  const failing = await buildTestApp(t, { scenario: node([]), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { now: clock.now } });
  await failing.app.inject({ method: 'GET', url: '/gpus' });
  failDriver(failing.fake, { kind: 'driver-unreachable' });
  clock.advance(5);

  // Node 4: idle GPUs (nothing used, so no process can be hidden); GPU 1 drops out of nvidia-smi's list (fallen off the bus).
  // The shard placed on it, on-cpu before (no grace, nothing held), is then gpu-lost: the GPU's and
  // the shard's gpu-lost alerts fire, not the shard's on-cpu alert.
  const idle = node([]);
  const idleScenario = { ...idle, gpus: idle.gpus.map((gpu) => ({ ...gpu, usedMiB: 0 })) };
  const dropping = await buildTestApp(t, { scenario: idleScenario, config: { cacheTtlMs: 0 } });
  const onLostGpu = await spawnShardProcess(t, 0);
  t.equal((await dropping.app.inject({ method: 'PUT', url: '/shards/llama-e', payload: { pid: onLostGpu.pid, gpus: [1], graceMs: 0 } })).statusCode, 201);
  let before = '';
  for (let i = 0; i < 200 && before !== 'on-cpu'; i += 1) {
    // The first answers may come from a snapshot taken before the registration (unverified).
    before = (await dropping.app.inject({ method: 'GET', url: '/shards/llama-e/ready' })).json().state;
    await settle(dropping.app);
  }
  t.equal(before, 'on-cpu');
  t.equal((await dropping.app.inject({ method: 'GET', url: '/gpus' })).json().gpus.length, 2);
  // That answer may have started a refresh: let it land first, or it may read the GPUs of before and be the one waited for below.
  await settle(dropping.app);
  dropping.fake.update((s) => ({ ...s, gpus: s.gpus.slice(0, 1), nvml: reloaded(s) }));
  // The first answer may be the snapshot of before, while the refresh that sees it runs behind.
  await dropping.app.inject({ method: 'GET', url: '/gpus' });
  await settle(dropping.app);
  t.same((await dropping.app.inject({ method: 'GET', url: '/gpus' })).json().lostGpus.map((gpu: { uuid: string }) => gpu.uuid), [UUIDS[1]]);
  t.equal((await dropping.app.inject({ method: 'GET', url: '/shards/llama-e/ready' })).json().state, 'gpu-lost');

  // Node 6: nvidia-smi fails every query, naming GPU 1 by bus id ("GPU is lost"), past max-stale: the
  // shard on it is gpu-lost and the GPU lost, as on node 4, and nvidia-smi is down, as on node 3.
  // That failure is nvidia-smi's own, so this node runs it under either backend of the suite.
  const onUnreachableGpu = await spawnShardProcess(t, 1);
  const clock6 = manualClock();
  const unreachable = await buildTestApp(t, {
    backend: 'nvidia-smi',
    scenario: node([{ gpuUuid: UUIDS[1]!, pid: onUnreachableGpu.members[0]!, name: 'llama-server', usedMiB: 12000 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { now: clock6.now },
  });
  t.equal((await unreachable.app.inject({ method: 'PUT', url: '/shards/llama-f', payload: { pid: onUnreachableGpu.pid, gpus: [1] } })).statusCode, 201);
  await settle(unreachable.app);
  t.equal((await unreachable.app.inject({ method: 'GET', url: '/shards/llama-f/ready' })).json().state, 'ready');
  unreachable.fake.update((s) => ({ ...s, failures: { all: { kind: 'gpu-lost', busId: '0000:02:00.0' } } }));
  clock6.advance(5);
  t.equal((await unreachable.app.inject({ method: 'GET', url: '/shards/llama-f/ready' })).json().cause, 'gpu-unreachable');

  // Node 5: its token file (a Secret's) is deleted after start; the tokens read at start stay in force.
  const tokenFile = join(t.testdir({ token: 'alerts-token-0123456789\n' }), 'token');
  const { token, fileTokens } = await readStartTokens(resolveConfig({ NODECOMPUTE_TOKEN_FILE: tokenFile }, []).config);
  const noSecret = await buildTestApp(t, { scenario: idleScenario, config: { token, tokenFile, fileTokens } });
  rmSync(tokenFile);

  const scrape = async (app: typeof busy.app, instance: string): Promise<Sample[]> =>
    samples((await app.inject({ method: 'GET', url: '/metrics' })).body).map((s) => ({ ...s, labels: { ...s.labels, instance, job: 'nodecompute' } }));
  const all = [...(await scrape(busy.app, 'gpu-node-1:9470')), ...(await scrape(hidden.app, 'gpu-node-2:9470')), ...(await scrape(failing.app, 'gpu-node-3:9470')), ...(await scrape(dropping.app, 'gpu-node-4:9470')), ...(await scrape(noSecret.app, 'gpu-node-5:9470')), ...(await scrape(unreachable.app, 'gpu-node-6:9470'))];
  const find = (name: string, labels: Record<string, string>) => {
    const found = all.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
    t.ok(found, `the scrapes have ${name} ${JSON.stringify(labels)}`);
    return found!;
  };

  const alerts: Record<string, ReturnType<typeof expected>[]> = {
    NodecomputeShardOnCpu: [expected('NodecomputeShardOnCpu', find('nodecompute_shard_state', { shard: 'llama-b', state: 'on-cpu' }))],
    NodecomputeShardStopped: [expected('NodecomputeShardStopped', find('nodecompute_shard_state', { shard: 'llama-d', state: 'stopped' }))],
    NodecomputeShardExited: [expected('NodecomputeShardExited', find('nodecompute_shard_state', { shard: 'llama-c', state: 'exited' }))],
    NodecomputeStrayGpuMemory: [expected('NodecomputeStrayGpuMemory', find('nodecompute_shard_gpu_memory_bytes', { shard: 'llama-a', gpu: '1' }))],
    NodecomputeGpuProcessesHidden: [expected('NodecomputeGpuProcessesHidden', find('nodecompute_gpu_processes_visible', { instance: 'gpu-node-2:9470' }))],
    NodecomputeNvidiaSmiDown: ['gpu-node-3:9470', 'gpu-node-6:9470'].map((instance) => expected('NodecomputeNvidiaSmiDown', find('nodecompute_nvidia_smi_up', { instance }))),
    NodecomputeShardGpuLost: [
      expected('NodecomputeShardGpuLost', find('nodecompute_shard_state', { instance: 'gpu-node-4:9470', shard: 'llama-e', state: 'gpu-lost' })),
      expected('NodecomputeShardGpuLost', find('nodecompute_shard_state', { instance: 'gpu-node-6:9470', shard: 'llama-f', state: 'gpu-lost' })),
    ],
    NodecomputeGpuLost: ['gpu-node-4:9470', 'gpu-node-6:9470'].map((instance) => expected('NodecomputeGpuLost', find('nodecompute_gpu_lost', { instance, gpu: '1', uuid: UUIDS[1]! }))),
    NodecomputeTokenFileBroken: [expected('NodecomputeTokenFileBroken', find('nodecompute_token_file_ok', { instance: 'gpu-node-5:9470', file: tokenFile }))],
  };
  for (const sample of Object.values(alerts).flat()) delete (sample.exp_labels as Record<string, string>).__name__;
  t.same(Object.keys(alerts).sort(), rules.map((r) => r.alert).sort(), 'every rule is tested');
  // Stray memory needs its shard's placement series: the join is on (instance, shard, gpu).
  t.equal(find('nodecompute_shard_gpu_placed', { shard: 'llama-a', gpu: '0' }).value, 1);
  t.equal(find('nodecompute_shard_gpu_memory_bytes', { shard: 'llama-a', gpu: '1' }).value, STRAY_MIB * 1024 * 1024);

  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-alerts-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const rulesFile = join(dir, 'rules.yaml');
  writeFileSync(rulesFile, JSON.stringify({ groups: (parse(readFileSync(RULES, 'utf8')) as { spec: { groups: unknown } }).spec.groups }));
  const check = spawnSync('promtool', ['check', 'rules', rulesFile], { encoding: 'utf8' });
  t.equal(check.status, 0, `promtool check rules: ${check.stdout}${check.stderr}`);

  const unitTests = {
    rule_files: [rulesFile],
    evaluation_interval: '1m',
    tests: [
      {
        interval: '1m',
        input_series: all.map((sample) => ({ series: seriesText(sample), values: `${sample.value}x30` })),
        alert_rule_test: Object.entries(alerts).flatMap(([alertname, exp]) => [
          // Before its `for` has passed, no rule fires.
          { eval_time: '1m', alertname, exp_alerts: [] },
          { eval_time: '15m', alertname, exp_alerts: exp },
        ]),
      },
    ],
  };
  const testFile = join(dir, 'tests.yaml');
  writeFileSync(testFile, JSON.stringify(unitTests));
  const run = spawnSync('promtool', ['test', 'rules', testFile], { encoding: 'utf8' });
  t.equal(run.status, 0, `promtool test rules:\n${run.stdout}${run.stderr}`);
});
