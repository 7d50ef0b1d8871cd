// An Ollama shard through its load cycle, end to end: a real stand-in for `ollama serve` (a shell in a
// process group of its own) starts a model runner as Ollama does, a child naming the model with
// --model, and stops it as an unload does; the fake GPU driver lists the runner while it holds memory.
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import t, { type Test } from 'tap';
import { settle } from '../helpers/app.js';
import { livePidsInGroup, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { modelDir } from '../helpers/model-loaders.js';
import { setup, twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';

// Reads "load BLOB [FLAGS]" and "unload" lines; a runner is a child of the server, in its process group.
const SERVER = `
while read -r command blob flags; do
  case $command in
    load) python3 -c 'import time; time.sleep(600)' --model "$blob" $flags --port 0 & runner=$!; echo "runner $runner";;
    unload) kill $runner; wait $runner 2>/dev/null; echo unloaded;;
  esac
done`;

/**
 * Probes until `done` holds (at most 20 refreshes, 1 ms of the manual clock apart), and returns the last answer: a
 * process that has just exec'd or exited can be missed by the one refresh after it on a loaded machine (seen in CI).
 */
async function probeUntil<T>(step: (ms?: number) => void, probe: () => Promise<T>, done: (answer: T) => boolean): Promise<T> {
  let answer = await probe();
  for (let tries = 1; tries < 20 && !done(answer); tries += 1) {
    step(1);
    answer = await probe();
  }
  return answer;
}

/** Starts the stand-in server (`restarting`: under a wrapper that starts it again when it dies); `say` sends it a line and resolves with its answer. */
async function startServer(t: Test, restarting = false) {
  const args = restarting ? ['-c', 'while :; do sh -c "$1" ollama; done', 'wrapper', SERVER] : ['-c', SERVER, 'ollama'];
  const server = spawn('sh', args, { detached: true, stdio: ['pipe', 'pipe', 'inherit'] });
  const pid = server.pid!;
  t.teardown(async () => {
    process.kill(-pid, 'SIGKILL');
    await waitUntil(() => livePidsInGroup(pid).length === 0, { what: `the server ${pid} to die` });
  });
  const lines = createInterface({ input: server.stdout! })[Symbol.asyncIterator]();
  const say = async (line: string): Promise<string> => {
    server.stdin!.write(`${line}\n`);
    const answer = String((await lines.next()).value);
    // A runner is one once it has exec'd: until then its command line is the shell's.
    const runner = /^runner (\d+)$/.exec(answer)?.[1];
    if (runner !== undefined) await waitUntil(() => readFileSync(`/proc/${runner}/cmdline`, 'latin1').split('\0').includes('--model'), { what: `runner ${runner} to exec` });
    return answer;
  };
  return { pid, say };
}

t.test('idle, loading, on the CPU past its grace, on its GPU, idle again', async (t) => {
  const blobs = join(modelDir(t), 'models', 'blobs');
  mkdirSync(blobs, { recursive: true });
  const blob = join(blobs, `sha256-${'cd'.repeat(32)}`);
  writeFileSync(blob, Buffer.concat([Buffer.from('GGUF'), Buffer.alloc(4096)]));
  const server = await startServer(t);
  const { app, step, setProcesses } = await setup(t);
  const put = await app.inject({ method: 'PUT', url: '/shards/o', payload: { pid: server.pid, gpus: [0], engine: 'ollama' } });
  t.equal(put.statusCode, 201);
  await settle(app);
  step();
  const ready = async () => {
    const res = await app.inject({ method: 'GET', url: '/shards/o/ready' });
    return { status: res.statusCode, ...res.json() };
  };

  let verdict = await ready();
  t.match(verdict, { status: 200, state: 'ready', cause: 'no-model-loaded', reason: null }, 'no runner within the grace: ready, not starting');
  t.match(verdict.warnings.at(-1), /runs no model.*OLLAMA_KEEP_ALIVE/);
  step(20_000);
  t.match(await ready(), { status: 200, cause: 'no-model-loaded' }, 'nor on-cpu after it');

  const runner = Number((await server.say(`load ${blob}`)).split(' ')[1]);
  t.ok(runner > 0);
  step();
  verdict = await probeUntil(step, ready, (answer) => answer.cause !== 'no-model-loaded');
  t.match(verdict, { status: 200, state: 'ready', cause: 'model-loading', reason: null }, 'a runner within its grace loads');
  t.match(verdict.warnings.at(-1), new RegExp(`runner ${runner} \\(--model ${blob}\\).*within its 15\\.0 s grace.*\\(no-gpu-memory\\)`));

  step(20_000);
  verdict = await ready();
  t.match(verdict, { status: 503, state: 'on-cpu', cause: 'no-gpu-memory' }, 'past its grace with no GPU memory: on the CPU');
  t.match(verdict.reason, new RegExp(`runner ${runner} .*started 20\\.\\d s ago \\(its grace of 15\\.0 s`));

  setProcesses([{ gpuUuid: UUIDS[0]!, pid: runner, name: 'ollama', usedMiB: 9000 }]);
  step();
  t.match(await ready(), { status: 200, state: 'ready', cause: null }, 'the runner holds its GPU');
  const gpus = (await app.inject({ method: 'GET', url: '/gpus' })).json();
  t.equal(gpus.gpus[0].processes[0].shard, 'o', "the runner's memory is the shard's");

  t.equal(await server.say('unload'), 'unloaded');
  setProcesses([]);
  step();
  t.match(await ready(), { status: 200, state: 'ready', cause: 'no-model-loaded' }, 'unloaded: idle again');
});

t.test('unloaded after a load on the CPU: on-cpu while idle, until its GPU gains room', async (t) => {
  const server = await startServer(t);
  const { app, step, fake } = await setup(t);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/o', payload: { pid: server.pid, gpus: [0], engine: 'ollama' } })).statusCode, 201);
  await settle(app);
  const ready = async () => {
    const res = await app.inject({ method: 'GET', url: '/shards/o/ready' });
    return { status: res.statusCode, ...res.json() };
  };
  const runner = Number((await server.say('load /models/blobs/sha256-00 -ngl 0')).split(' ')[1]);
  step();
  t.match(await ready(), { status: 200, cause: 'model-loading' });
  step(20_000);
  t.match(await ready(), { status: 503, cause: 'no-gpu-memory' }, 'past its grace with no GPU memory');

  t.equal(await server.say('unload'), 'unloaded');
  step();
  const stuck = await ready();
  t.match(stuck, { status: 503, state: 'on-cpu', cause: 'last-load-on-cpu' }, 'idle, but its next load would compute on the CPU too');
  t.match(stuck.reason, new RegExp(`last model runner ${runner} \\(--model /models/blobs/sha256-00\\) ran 20\\.\\d s`));
  t.match(stuck.reason, /runner with no GPU layers: num_gpu 0 was asked/, "as its command line shows");
  step(600_000);
  t.match(await ready(), { status: 503, cause: 'last-load-on-cpu' }, 'time alone changes nothing');

  const roomy = twoGpuNode();
  roomy.gpus[0]!.freeMiB = 102_048;
  fake.setScenario(roomy);
  step();
  const room = await ready();
  t.match(room, { status: 200, state: 'ready', cause: 'no-model-loaded' }, '2 GiB more free: the next load may reach the GPU');
  t.match(room.warnings.at(-1), /2\.0 GiB more free memory since/);
});

t.test('unloaded after a load that held a CUDA context alone: on-cpu while idle too', async (t) => {
  const blobs = join(modelDir(t), 'models', 'blobs');
  mkdirSync(blobs, { recursive: true });
  const blob = join(blobs, `sha256-${'ef'.repeat(32)}`);
  writeFileSync(blob, Buffer.from('GGUF'));
  truncateSync(blob, 4 * 2 ** 30); // sparse: a 4 GiB model on disk, none of it written
  const server = await startServer(t);
  const { app, step, setProcesses, fake } = await setup(t);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/o', payload: { pid: server.pid, gpus: [0], engine: 'ollama' } })).statusCode, 201);
  await settle(app);
  const ready = async () => (await app.inject({ method: 'GET', url: '/shards/o/ready' })).json();
  const runner = Number((await server.say(`load ${blob}`)).split(' ')[1]);
  // A context of 1.4 GiB, taken from the GPU's free memory as a real driver reports it.
  const loaded = twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: runner, name: 'ollama', usedMiB: 1400 }]);
  loaded.gpus[0]!.freeMiB = 100_000 - 1400;
  fake.setScenario(loaded);
  step();
  t.match(await ready(), { cause: 'model-loading' }, 'the runner, seen and dated');
  step(20_000);
  t.match(await ready(), { state: 'on-cpu', cause: 'weights-in-host-memory' }, 'past its grace with a context and no layers');

  t.equal(await server.say('unload'), 'unloaded');
  fake.setScenario(twoGpuNode());
  step();
  const stuck = await ready();
  t.match(stuck, { state: 'on-cpu', cause: 'last-load-on-cpu' }, "idle: its next load would hold a context alone too, the context's own memory no room");
  t.match(stuck.reason, /CUDA context.*1\.4 GiB/);

  const full = await server.say(`load ${blob}`);
  setProcesses([{ gpuUuid: UUIDS[0]!, pid: Number(full.split(' ')[1]), name: 'ollama', usedMiB: 5000 }]);
  step();
  t.match(await ready(), { state: 'ready', cause: null }, 'a load with its weights on the GPU');
  // A refresh whose command-line read of the runner runs past its deadline (a stalled event loop on a loaded CI
  // machine) leaves the runners unknown, and the load unrecorded, until the next: a few more refreshes while it runs.
  for (let i = 0; i < 4; i += 1) {
    step(1);
    await ready();
  }
  step(20_000);
  await server.say('unload');
  setProcesses([]);
  step();
  t.match(await ready(), { state: 'ready', cause: 'no-model-loaded' }, 'and idle after it');
});

t.test('a restarted Ollama forgets the last load of the one before', async (t) => {
  const wrapper = await startServer(t, true);
  const { app, step } = await setup(t);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/o', payload: { pid: wrapper.pid, gpus: [0], engine: 'ollama' } })).statusCode, 201);
  await settle(app);
  const cause = async () => (await app.inject({ method: 'GET', url: '/shards/o/ready' })).json().cause;
  const runner = Number((await wrapper.say('load /models/blobs/sha256-00')).split(' ')[1]);
  const server = Number(readFileSync(`/proc/${runner}/stat`, 'latin1').split(') ')[1]!.split(' ')[1]);
  step();
  t.equal(await cause(), 'model-loading', 'the runner, seen and dated');
  step(20_000);
  t.equal(await cause(), 'no-gpu-memory');
  await wrapper.say('unload');
  step();
  const stuck = (await app.inject({ method: 'GET', url: '/shards/o/ready' })).json();
  t.match(stuck, { cause: 'last-load-on-cpu', reason: /num_gpu 0, in a Modelfile or one request's options/ }, 'behind a wrapper, as when registered directly; its GPU layers unsaid');
  process.kill(server, 'SIGKILL');
  // A signal lands when the process next runs: until then the old server still runs (seen under load).
  await waitUntil(
    () => {
      const live = livePidsInGroup(wrapper.pid);
      return !live.includes(server) && live.some((pid) => pid !== wrapper.pid);
    },
    { what: 'the server to die and the wrapper to start it again' },
  );
  step();
  t.equal(await cause(), 'no-model-loaded', 'its server replaced: the next load is judged afresh');
});

t.test('another engine with no GPU memory is on the CPU; so is an Ollama whose runner computes there', async (t) => {
  const server = await startServer(t);
  const other = await startServer(t);
  const { app, step } = await setup(t);
  for (const [id, pid, engine] of [['o', server.pid, 'ollama'], ['l', other.pid, 'llama.cpp']] as const) {
    t.equal((await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus: [0], engine, graceMs: 0 } })).statusCode, 201);
  }
  await settle(app);
  step();
  const causes = async () =>
    Promise.all(['o', 'l'].map(async (id) => (await app.inject({ method: 'GET', url: `/shards/${id}/ready` })).json().cause));
  t.same(await causes(), ['no-model-loaded', 'no-gpu-memory'], 'only Ollama reads a server without a runner as idle');
  await server.say('load /models/blobs/sha256-00');
  step(1000);
  t.same(await causes(), ['no-gpu-memory', 'no-gpu-memory'], 'with a zero grace, a runner without GPU memory is on the CPU at once');
});
