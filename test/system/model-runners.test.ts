// Finding an Ollama server's model runners: real processes in the real /proc (a runner behind a
// wrapper, a cgroup's members), then a fixture proc root for what a live system rarely shows (no
// children files, a thread gone mid-read, no uptime to date a runner by, a command line re-read).
import { spawn } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { pino } from 'pino';
import { createModelRunnerReader, parseChildren, runnerModel } from '../../src/system/model-runners.js';
import { createProcReader, type StatAnswer } from '../../src/system/procfs.js';
import { livePidsInGroup, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { fifoTestdir } from '../helpers/fifo.js';
import { procStat } from '../helpers/hand-made-view.js';

const log = pino({ level: 'silent' });
const TAKEN_AT = 1_700_000_000_000;

/** A command line as /proc/PID/cmdline holds it. */
const argv = (...args: string[]) => args.map((arg) => `${arg}\0`).join('');

/** An empty proc root for the test, and a writer of files under it. */
function fixtureRoot(t: Test) {
  const root = mkdtempSync(join(tmpdir(), 'nodecompute-runners-'));
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const write = (path: string, text: string) => {
    mkdirSync(join(root, path, '..'), { recursive: true });
    writeFileSync(join(root, path), text);
  };
  return { root, write };
}

t.test('parseChildren: the PIDs of a children file', async (t) => {
  t.same(parseChildren('4711 4712 '), [4711, 4712]);
  t.same(parseChildren(''), []);
});

t.test('real processes: a runner below a wrapper, and among a cgroup\'s members', async (t) => {
  // host (sh) -> wrapper (sh) -> runner (python3 --model); host -> sleep, which runs no model.
  const runnerLine = `python3 -c 'import time; time.sleep(600)' --model /models/blobs/sha256-ef --port 0`;
  const host = spawn('sh', ['-c', `sh -c "${runnerLine.replace(/"/g, '\\"')} & wait" & sleep 600 & wait`], { detached: true, stdio: 'ignore' });
  const pid = host.pid!;
  t.teardown(async () => {
    process.kill(-pid, 'SIGKILL');
    await waitUntil(() => livePidsInGroup(pid).length === 0, { what: `group ${pid} to die` });
  });
  const proc = createProcReader({ root: '/proc', log });
  const cmdline = (member: number) => {
    try {
      return String(readFileSync(`/proc/${member}/cmdline`));
    } catch {
      return '';
    }
  };
  let runner = 0;
  await waitUntil(() => (runner = livePidsInGroup(pid).find((member) => /python3$/.test(cmdline(member).split('\0')[0]!)) ?? 0) > 0, { what: 'the runner to start' });
  const sleeper = livePidsInGroup(pid).find((member) => cmdline(member).startsWith('sleep'))!;

  const reader = createModelRunnerReader(proc);
  const stats = new Map<number, StatAnswer>(await proc.readStats([pid]));
  const found = await reader.read([{ pid }, { pid: 4_194_305 }], stats, new Map(), TAKEN_AT);
  t.same([...found.keys()], [pid], 'a server that is not there is left out');
  const [seen] = found.get(pid)!;
  t.match(seen, { pid: runner, model: '/models/blobs/sha256-ef' });
  t.ok(seen!.startedAt! <= TAKEN_AT && seen!.startedAt! > TAKEN_AT - 60_000, 'dated by its start on the snapshot clock');
  t.ok(stats.has(runner), "the runner's stat is read with the rest");

  const again = await reader.read([{ pid }], stats, new Map(), TAKEN_AT + 5000);
  t.equal(again.get(pid)![0]!.startedAt, seen!.startedAt, 'dated once');

  const members = new Map([['pod-1', new Set([pid, sleeper, runner])]]);
  const byCgroup = await reader.read([{ cgroup: 'pod-1' }, { cgroup: 'not-scanned' }], stats, members, TAKEN_AT);
  t.same([...byCgroup.keys()], ['pod-1'], 'a cgroup the scan did not answer is left out');
  t.same(byCgroup.get('pod-1')!.map((found) => found.pid), [runner], 'only the member naming a model');
});

t.test('a fixture proc root', async (t) => {
  const { root, write } = fixtureRoot(t);
  const reader = createModelRunnerReader(createProcReader({ root, log }));
  // 100 serves; its thread 107 ended after the listing. 101 runs a model; 102 does not, and its children
  // cannot be listed; 103 is gone; 104's command line cannot be read.
  write('100/task/100/children', '101 102 103 104 ');
  mkdirSync(join(root, '100/task/107'), { recursive: true });
  write('101/cmdline', argv('ollama', 'runner', '--model', '/blobs/sha256-aa', '--port', '123'));
  write('102/cmdline', argv('sh', '-c', 'ollama serve'));
  const stats = new Map<number, StatAnswer>([100, 101, 102, 104].map((pid): [number, StatAnswer] => [pid, procStat(pid)]));
  stats.set(103, null);

  let found = await reader.read([{ pid: 100 }], stats, new Map(), TAKEN_AT);
  t.same(found.get(100), [{ pid: 101, model: '/blobs/sha256-aa', startedAt: null }], 'without an uptime file, not dated');
  write('uptime', '12.50 3.00\n');
  found = await reader.read([{ pid: 100 }], stats, new Map(), TAKEN_AT);
  t.same(found.get(100)![0]!.startedAt, TAKEN_AT - (1250 - 5) * 10, 'dated once /proc can say when it started');

  write('101/cmdline', argv('ollama', 'runner', '--model', '/blobs/sha256-bb'));
  stats.set(105, procStat(105));
  write('100/task/100/children', '101 102 103 104 105 ');
  write('105/cmdline', argv('/usr/lib/ollama/llama-server', '--model', '/blobs/sha256-dd', '-ngl', '0', '--port', '9'));
  const [plain, asked] = (await reader.read([{ pid: 100 }], stats, new Map(), TAKEN_AT)).get(100)!;
  t.match(asked, { pid: 105, model: '/blobs/sha256-dd', gpuLayers: '0' }, 'the GPU layers asked (num_gpu 0)');
  t.notOk(plain && 'gpuLayers' in plain, 'unsaid: absent');
  write('100/task/100/children', '101 102 103 104 ');
  t.equal((await reader.read([{ pid: 100 }], stats, new Map(), TAKEN_AT)).get(100)![0]!.model, '/blobs/sha256-aa', 'a command line is read once');
  stats.set(101, { ...procStat(101), startTime: 6 });
  t.equal((await reader.read([{ pid: 100 }], stats, new Map(), TAKEN_AT)).get(100)![0]!.model, '/blobs/sha256-bb', 'a new process under the PID is read again');
  write('101/cmdline', argv('ollama', 'runner', '--model', '/blobs/sha256-cc'));
  await reader.read([], stats, new Map(), TAKEN_AT);
  t.equal((await reader.read([{ pid: 100 }], stats, new Map(), TAKEN_AT)).get(100)![0]!.model, '/blobs/sha256-cc', 'forgotten once not seen');

  write('200/task/200/children', '');
  stats.set(200, procStat(200));
  mkdirSync(join(root, '200/task/201/children'), { recursive: true });
  stats.set(300, procStat(300));
  found = await reader.read([{ pid: 200 }, { pid: 300 }], stats, new Map(), TAKEN_AT);
  t.same([...found.keys()], [], "a thread's children file that fails to read, and a kernel without children files: unknown, not none");
});

t.test('runnerModel: --model PATH or --model=PATH only', async (t) => {
  t.equal(runnerModel(['llama-server', '--model', '/b/sha256-aa', '--port', '1']), '/b/sha256-aa');
  t.equal(runnerModel(['llama-server', '--model=/b/sha256-aa']), '/b/sha256-aa');
  t.equal(runnerModel(['python3', '-m', 'http.server']), null, 'not -m');
  t.equal(runnerModel(['x', '--model']), null);
  t.equal(runnerModel(['x', '--model', '']), null);
  t.equal(runnerModel(['x', '--model=']), null);
});

t.test('what a runner is, and what leaves its host unknown', async (t) => {
  const { root, write } = fixtureRoot(t);
  const stats = new Map<number, StatAnswer>();
  /** `pid` with `children` (a tree below it), its stat started at `startTime` (uptime is 12.5 s: 1250 ticks). */
  const process = (pid: number, command: string[] | null, children: number[] = [], startTime = 5) => {
    write(`${pid}/task/${pid}/children`, children.map((child) => `${child} `).join(''));
    if (command !== null) write(`${pid}/cmdline`, argv(...command));
    stats.set(pid, { ...procStat(pid), startTime });
  };
  write('uptime', '12.50 3.00\n');
  const reader = createModelRunnerReader(createProcReader({ root, log }));
  const runnersOf = async (pid: number) => (await reader.read([{ pid }], stats, new Map(), TAKEN_AT)).get(pid);

  process(400, ['ollama', 'serve'], [401, 402, 403]);
  process(401, ['python3', '-m', 'http.server']);
  process(402, ['llama-server', '--model=/m/x.gguf']);
  process(403, ['ollama', 'runner', '--model', '/m/y']);
  stats.set(403, procStat(403, 'Z'));
  t.same((await runnersOf(400))?.map((runner) => runner.pid), [402], 'not -m, nor a zombie');

  process(500, ['ollama', 'serve'], [501]);
  stats.set(501, { pid: 501, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: 'Raise nofile.' });
  t.equal(await runnersOf(500), undefined, 'a stat that cannot be read: unknown');
  process(600, ['ollama', 'serve'], [601]);
  process(601, null);
  mkdirSync(join(root, '601/cmdline'));
  t.equal(await runnersOf(600), undefined, 'a command line that cannot be read: unknown');

  process(700, ['tini', '--', '/entrypoint.sh'], [701]);
  process(701, ['sh', '/entrypoint.sh'], [702]);
  process(702, ['ollama', 'serve'], [703]);
  process(703, ['ollama', 'runner', '--model', '/m/z']);
  t.same((await runnersOf(700))?.map((runner) => runner.pid), [703], 'behind two wrappers');
  process(720, ['tini', '--', '/entrypoint.sh'], [721]);
  process(721, ['sh', '/entrypoint.sh'], [722]);
  process(722, ['ollama', 'serve'], [723]);
  process(723, ['/usr/lib/ollama/llama-server', '--list-devices']);
  t.same(await runnersOf(720), [], 'an idle server behind two wrappers, probing its GPUs');
  process(710, ['tini'], [700]);
  t.equal(await runnersOf(710), undefined, 'deeper than the search goes: unknown, not none');

  process(800, ['ollama', 'serve'], [801]);
  process(801, ['ollama', 'serve'], [], 1200);
  t.same(await runnersOf(800), [], 'a child just forked, before its exec');
  process(801, ['ollama', 'runner', '--model', '/m/w'], [], 1200);
  t.same((await runnersOf(800))?.map((runner) => runner.pid), [801], 'read again once it has run its command');
  process(900, ['ollama', 'serve'], [901]);
  process(901, ['sleep', '600']);
  t.same(await runnersOf(900), []);
  process(901, ['ollama', 'runner', '--model', '/m/v']);
  t.same(await runnersOf(900), [], 'a settled process is read once');
});

t.test('a command line that does not answer: its host unknown until it does, and at most two such reads', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  const stats = new Map<number, StatAnswer>();
  // Servers 10, 20 and 30, each with one child; 11's and 21's command lines hang.
  for (const host of [10, 20, 30]) {
    mkdirSync(join(dir, `${host}/task/${host}`), { recursive: true });
    writeFileSync(join(dir, `${host}/task/${host}/children`), `${host + 1} `);
    mkdirSync(join(dir, String(host + 1)));
    stats.set(host, procStat(host)).set(host + 1, procStat(host + 1));
  }
  writeFileSync(join(dir, '31/cmdline'), argv('ollama', 'runner', '--model', '/blobs/sha256-dd'));
  const hung = [fifo('11/cmdline'), fifo('21/cmdline')];
  const reader = createModelRunnerReader(createProcReader({ root: dir, log }), { deadlineMs: 50 });
  const hosts = [{ pid: 10 }, { pid: 20 }, { pid: 30 }];
  t.same([...(await reader.read(hosts, stats, new Map(), TAKEN_AT)).keys()], [], 'two reads hang; no third is started');
  t.same([...(await reader.read(hosts, stats, new Map(), TAKEN_AT)).keys()], [], 'nor again while they hang');
  for (const path of hung) closeSync(openSync(path, 'w'));
  // Released, the late reads answer, and what they said is kept.
  let found = await reader.read(hosts, stats, new Map(), TAKEN_AT);
  for (let i = 0; i < 200 && found.size < 3; i += 1) {
    await new Promise((resolve) => setTimeout(resolve, 10));
    found = await reader.read(hosts, stats, new Map(), TAKEN_AT);
  }
  t.same(found.get(30), [{ pid: 31, model: '/blobs/sha256-dd', startedAt: null }]);
  t.same(found.get(10), [], 'an empty command line names no model');
});

t.test('a hanging command line below a wrapper leaves its host unknown too', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  for (const [pid, children] of [[40, '41 '], [41, '42 ']] as const) {
    mkdirSync(join(dir, `${pid}/task/${pid}`), { recursive: true });
    writeFileSync(join(dir, `${pid}/task/${pid}/children`), children);
  }
  writeFileSync(join(dir, '41/cmdline'), argv('tini', '--', 'ollama', 'serve'));
  mkdirSync(join(dir, '42'));
  const hung = fifo('42/cmdline');
  const stats = new Map<number, StatAnswer>([40, 41, 42].map((pid): [number, StatAnswer] => [pid, procStat(pid)]));
  const reader = createModelRunnerReader(createProcReader({ root: dir, log }), { deadlineMs: 50 });
  t.same([...(await reader.read([{ pid: 40 }], stats, new Map(), TAKEN_AT)).keys()], []);
  closeSync(openSync(hung, 'w'));
});
