// Registrations that would put one process or cgroup under two ids, end to end through the app:
// the same process or cgroup, a process and a cgroup that holds it, a PID shard's descendants,
// ancestors and process group, and the conflict reads' edge cases (zombies, reused PIDs, unreadable
// stats, a repeat removed while it waits). Real process groups where the case allows; a fixture
// /proc where it needs a shape a test cannot spawn (PID 1, kernel threads, pods, reparented members).
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { createProcReader } from '../../src/system/procfs.js';
import { createStateFile } from '../../src/system/state-file.js';
import { buildTestApp, spawnShardProcess } from '../helpers/app.js';
import { setup, twoGpuNode, UUIDS } from '../helpers/two-gpu-node.js';

t.test('PID 1 is refused: init in the host namespace, a container\'s main process in its own', async (t) => {
  const root = t.testdir({ '1': { stat: '1 (systemd) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0' } });
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode(),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  const res = await app.inject({ method: 'PUT', url: '/shards/init', payload: { pid: 1, gpus: [0] } });
  t.equal(res.statusCode, 422);
  t.equal(res.json().code, 'NODECOMPUTE_NOT_A_SHARD_PROCESS', 'it exists: another code than a PID with no process');
  t.match(res.json().message, `PID 1 in ${root} is init (systemd), not a shard: every process on the node descends from it, so as a shard it would claim other workloads' GPU memory`);
  t.match(res.json().message, "Register its host PID (`docker inspect -f '{{.State.Pid}}' CONTAINER`");
  t.match(res.json().message, 'crictl inspect');
  t.match(res.json().message, 'or register the pod by its cgroup');
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards, []);
});

t.test('a thread id is refused, naming its process: the GPU driver lists processes, never threads', async (t) => {
  const { app } = await setup(t);
  // This test process runs threads (libuv's, V8's): each has an id of its own under /proc.
  const thread = readdirSync(`/proc/${process.pid}/task`).map(Number).find((tid) => tid !== process.pid)!;
  const res = await app.inject({ method: 'PUT', url: '/shards/a-thread', payload: { pid: thread, gpus: [0] } });
  t.equal(res.statusCode, 422);
  t.equal(res.json().code, 'NODECOMPUTE_NOT_A_SHARD_PROCESS');
  t.match(res.json().message, `PID ${thread} in /proc is a thread`);
  t.match(res.json().message, `Register process ${process.pid}.`);
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards, []);
});

t.test('one process under two ids is refused with 409, naming the other id; a re-PUT under its own id is fine', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app, config } = await setup(t);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/first', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  const stateFile = readFileSync(config.stateFile);
  const twin = await app.inject({ method: 'PUT', url: '/shards/second', payload: { pid: shard.pid, gpus: [1], engine: 'vllm' } });
  t.equal(twin.statusCode, 409);
  t.same(Object.keys(twin.json()).sort(), ['code', 'error', 'message', 'statusCode']);
  t.match(twin.json(), { statusCode: 409, code: 'NODECOMPUTE_SHARD_CONFLICT', error: 'Conflict' });
  t.match(twin.json().message, new RegExp(`^Process ${shard.pid} \\(sh, started at tick \\d+\\) is already registered as shard "first"\\. .*To register it as "second", DELETE /shards/first first; to change its GPUs, grace or engine, PUT /shards/first instead\\.$`));
  t.ok(readFileSync(config.stateFile).equals(stateFile), 'nothing written');
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards.map((s: { id: string }) => s.id), ['first']);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/first', payload: { pid: shard.pid, gpus: [1] } })).statusCode, 200);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/first' })).statusCode, 204);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/second', payload: { pid: shard.pid, gpus: [1] } })).statusCode, 201, 'once the first is removed');
});

t.test('a cgroup under two ids is refused with 409 (fixture /proc)', async (t) => {
  const container = 'f00dfeedcafe0123456789abcdef0123';
  const root = t.testdir({ '300': { stat: '300 (vllm) S 1 300 300 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 900 0 0', cgroup: `0::/docker/${container}\n` } });
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode(),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/pod', payload: { cgroup: container, gpus: [0] } })).statusCode, 201);
  const twin = await app.inject({ method: 'PUT', url: '/shards/pod-again', payload: { cgroup: container, gpus: [0] } });
  t.equal(twin.statusCode, 409);
  t.match(twin.json().message, `The cgroup "${container}" is already registered as shard "pod". `);
});

t.test('a process and a cgroup that holds it under two ids are refused with 409, either way round, as are two cgroups of one pod (fixture /proc)', async (t) => {
  const podUid = '0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0';
  const container = 'cafe0123456789abcdef0123456789ab';
  const inPod = `0::/kubepods.slice/kubepods-pod${podUid.replaceAll('-', '_')}.slice/cri-containerd-${container}.scope\n`;
  const root = t.testdir({
    '300': { stat: '300 (pause) S 1 300 300 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 900 0 0', cgroup: `0::/kubepods.slice/kubepods-pod${podUid.replaceAll('-', '_')}.slice/cri-containerd-sandbox.scope\n` },
    '303': { stat: '303 (llama-server) S 1 303 303 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 950 0 0', cgroup: inPod },
    '400': { stat: '400 (python3) S 1 400 400 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 990 0 0', cgroup: '0::/system.slice/other.service\n' },
  });
  const { app, config } = await buildTestApp(t, {
    scenario: twoGpuNode(),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { proc: createProcReader({ root, log: pino({ level: 'silent' }) }) },
  });
  const put = (id: string, payload: Record<string, unknown>) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload });
  const ids = async () => (await app.inject({ method: 'GET', url: '/shards' })).json().shards.map((shard: { id: string }) => shard.id);
  const REMEDY = (id: string, other: string) => `. Under two ids its GPU memory would go to one, and the other would read on-cpu while computing on the GPU. To register it as "${id}", DELETE /shards/${other} first;`;

  t.equal((await put('pod', { cgroup: podUid, gpus: [0] })).statusCode, 201);
  const stateFile = readFileSync(config.stateFile);
  const byPid = await put('by-pid', { pid: 303, gpus: [0] });
  t.equal(byPid.statusCode, 409, 'the engine of a registered pod, by its PID');
  t.match(byPid.json(), { code: 'NODECOMPUTE_SHARD_CONFLICT' });
  t.match(byPid.json().message, `Process 303 (llama-server, started at tick 950) runs in the cgroup "${podUid}", which is already registered as shard "pod"${REMEDY('by-pid', 'pod')}`);
  const byContainer = await put('by-container', { cgroup: container, gpus: [0] });
  t.equal(byContainer.statusCode, 409, 'a container of a registered pod, by its id');
  t.match(byContainer.json().message, `The cgroup "${container}" shares processes with the cgroup "${podUid}", which is already registered as shard "pod"${REMEDY('by-container', 'pod')}`);
  t.ok(readFileSync(config.stateFile).equals(stateFile), 'nothing written');
  t.equal((await put('other', { pid: 400, gpus: [1] })).statusCode, 201, 'a process outside the pod is another shard');
  t.same(await ids(), ['other', 'pod']);

  t.equal((await app.inject({ method: 'DELETE', url: '/shards/pod' })).statusCode, 204);
  t.equal((await put('by-pid', { pid: 303, gpus: [0] })).statusCode, 201, 'once the pod is removed, by its PID');
  const pod = await put('pod', { cgroup: podUid, gpus: [0] });
  t.equal(pod.statusCode, 409, 'and now the pod that holds that process');
  t.match(pod.json().message, `The cgroup "${podUid}" holds process 303 (llama-server, started at tick 950), which is already registered as shard "by-pid"${REMEDY('pod', 'by-pid')}`);
  t.same(await ids(), ['by-pid', 'other']);
});

t.test("a PID shard's child or parent is refused under another id, as it would take the shard's GPU memory; sibling shards in one process group are not", async (t) => {
  // The leader sh and its two sleep children, all in the leader's group; child 0 holds GPU 0.
  const engine = await spawnShardProcess(t, 2);
  const [child, sibling] = engine.members as [number, number];
  const real = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  const statsRead: number[] = [];
  const proc = { ...real, readStat: (pid: number) => (statsRead.push(pid), real.readStat(pid)) };
  const { app, config } = await buildTestApp(t, {
    scenario: twoGpuNode([{ gpuUuid: UUIDS[0]!, pid: child, name: 'sleep', usedMiB: 900 }]),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { proc },
  });
  const put = (id: string, pid: number) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus: [0] } });
  const ids = async () => (await app.inject({ method: 'GET', url: '/shards' })).json().shards.map((shard: { id: string }) => shard.id);
  const named = (pid: number, comm: string) => new RegExp(`process ${pid} \\(${comm}, started at tick \\d+\\)`);

  // A shard whose process has ended since: its PID names nothing of its own now, so it covers nothing.
  const ended = await spawnShardProcess(t, 0);
  t.equal((await put('ended', ended.pid)).statusCode, 201);
  await ended.kill();
  t.equal((await put('engine', engine.pid)).statusCode, 201);
  const stored = readFileSync(config.stateFile);
  const worker = await put('worker', child);
  t.equal(worker.statusCode, 409, "the engine's child, which holds its GPU memory");
  t.match(worker.json(), { code: 'NODECOMPUTE_SHARD_CONFLICT' });
  t.match(worker.json().message, new RegExp(`^Process ${child} \\(sleep, started at tick \\d+\\) descends from ${named(engine.pid, 'sh').source}, which is already registered as shard "engine"\\. A PID shard's descendants and the process group it leads are part of it\\. Under two ids its GPU memory would go to one, .* DELETE /shards/engine first;`));
  t.ok(readFileSync(config.stateFile).equals(stored), 'nothing written');
  t.same(await ids(), ['ended', 'engine']);
  t.equal((await app.inject({ method: 'GET', url: '/shards/engine/ready' })).json().state, 'ready', 'the engine keeps its GPU memory');

  t.equal((await app.inject({ method: 'DELETE', url: '/shards/engine' })).statusCode, 204);
  t.equal((await put('worker', child)).statusCode, 201, 'once the engine is removed, its child by itself');
  t.equal((await put('other-worker', sibling)).statusCode, 201, 'and its sibling: neither descends from the other, nor leads their group');
  const parent = await put('engine', engine.pid);
  t.equal(parent.statusCode, 409, 'and now the parent of a registered shard');
  t.match(parent.json().message, new RegExp(`^Process ${engine.pid} \\(sh, started at tick \\d+\\) is an ancestor of ${named(child, 'sleep').source}, which is already registered as shard "worker"\\. A PID shard's`));
  t.same(await ids(), ['ended', 'other-worker', 'worker']);
  statsRead.length = 0;
  t.equal((await put('worker', child)).statusCode, 200, 'a control plane repeating a registration');
  t.same(statsRead, [child], "reads its process only: a repeat is never a conflict, so the other shards' are not read");
});

t.test("the process group a PID shard leads is part of it: a member that no longer descends from it, or the leader of a shard's group, is refused under another id, also when the other is being stored as it is read", async (t) => {
  const dir = t.testdir({
    proc: {
      // 500 leads its group; 501, in that group, was reparented to init (its parent exited).
      '500': { stat: '500 (sh) S 1 500 500 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 900 0 0' },
      '501': { stat: '501 (llama-server) S 1 500 500 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 910 0 0' },
      // 700 leads its group, and 701 is its child.
      '700': { stat: '700 (sh) S 1 700 700 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 0' },
      '701': { stat: '701 (python3) S 700 700 700 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1010 0 0' },
    },
    state: {},
  });
  const log = pino({ level: 'silent' });
  // A write the test holds until it opens the gate: a registration read while another is being stored.
  const file = createStateFile(join(dir, 'state', 'shards.json'), { log });
  let hold: { started: () => void; opened: Promise<void> } | null = null;
  const stateFile = {
    ...file,
    write: async (text: string) => {
      const held = hold;
      hold = null;
      if (held) {
        held.started();
        await held.opened;
      }
      return file.write(text);
    },
  };
  const real = createProcReader({ root: join(dir, 'proc'), log });
  let onRead: ((pid: number) => void) | null = null;
  const proc = { ...real, readStat: (pid: number) => (onRead?.(pid), real.readStat(pid)) };
  const { app } = await buildTestApp(t, {
    scenario: twoGpuNode(),
    config: { cacheTtlMs: 0, maxStaleMs: 0 },
    deps: { proc, stateFile },
  });
  const put = (id: string, pid: number) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus: [0] } });

  t.equal((await put('leader', 500)).statusCode, 201);
  const member = await put('member', 501);
  t.equal(member.statusCode, 409, 'a member of the group the shard leads');
  t.match(member.json().message, /^Process 501 \(llama-server, started at tick 910\) is in the process group process 500 \(sh, started at tick 900\) leads, which is already registered as shard "leader"\./);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/leader' })).statusCode, 204);
  t.equal((await put('member', 501)).statusCode, 201);
  const leader = await put('leader', 500);
  t.equal(leader.statusCode, 409, "the leader of a registered shard's group");
  t.match(leader.json().message, /^Process 500 \(sh, started at tick 900\) leads the process group process 501 \(llama-server, started at tick 910\) is in, which is already registered as shard "member"\./);

  // The child is being stored when its parent's registration is read: judged by what the parent's own reading shows.
  let open = () => {};
  const writing = new Promise<void>((started) => {
    hold = { started, opened: new Promise<void>((resolve) => (open = resolve)) };
  });
  const first = put('kid', 701);
  await writing;
  // The gate opens once the parent's registration has read the shards stored (not the kid yet) and
  // gone on to its own ancestors (its parent, PID 1, is not in this /proc).
  const ancestorsRead = new Promise<void>((resolve) => (onRead = (pid) => pid === 1 && resolve()));
  const second = put('parent', 700);
  await ancestorsRead;
  open();
  t.equal((await first).statusCode, 201);
  const refused = await second;
  t.equal(refused.statusCode, 409, 'the parent, stored second');
  t.match(refused.json().message, /^Process 700 \(sh, started at tick 1000\) leads the process group process 701 \(python3, started at tick 1010\) is in, which is already registered as shard "kid"\./);
  t.same((await app.inject({ method: 'GET', url: '/shards' })).json().shards.map((shard: { id: string }) => shard.id), ['kid', 'member']);
});

t.test('conflict reads: a shard gone (a zombie, or its PID another process now) covers nothing; an unreadable stat of another process fails no registration; a repeat removed before it is stored is judged in full', async (t) => {
  const line = (pid: number, comm: string, state: string, ppid: number, pgrp: number, start: number) => `${pid} (${comm}) ${state} ${ppid} ${pgrp} ${pgrp} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 ${start} 0 0`;
  const root = t.testdir({
    '900': { stat: line(900, 'sh', 'S', 1, 900, 2000) },
    '901': { stat: line(901, 'llama-server', 'S', 900, 900, 2010) },
    '910': { stat: line(910, 'sh', 'S', 1, 910, 2100) },
    '911': { stat: line(911, 'llama-server', 'S', 1, 910, 2110) },
    '920': { stat: line(920, 'sh', 'S', 1, 920, 2200) },
    '921': { stat: line(921, 'llama-server', 'S', 1, 920, 2210) },
    '930': { stat: line(930, 'python3', 'S', 931, 930, 2400) },
    '931': { stat: 'not a stat line' },
    '940': { stat: line(940, 'sh', 'S', 1, 911, 2500) },
  });
  const real = createProcReader({ root, log: pino({ level: 'silent' }) });
  let onRead: ((pid: number) => void) | null = null;
  const proc = { ...real, readStat: (pid: number) => (onRead?.(pid), real.readStat(pid)) };
  const { app, fake } = await buildTestApp(t, { scenario: twoGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0 }, deps: { proc } });
  const put = (id: string, pid: number, gpus: number[] = []) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus } });

  for (const [id, pid] of [['zombie', 910], ['reused', 920], ['unreadable', 940]] as const) t.equal((await put(id, pid)).statusCode, 201);
  writeFileSync(join(root, '910', 'stat'), line(910, 'sh', 'Z', 1, 910, 2100));
  writeFileSync(join(root, '920', 'stat'), line(920, 'bash', 'S', 1, 920, 2300));
  writeFileSync(join(root, '940', 'stat'), 'garbled');
  t.equal((await put('orphan-of-zombie', 911)).statusCode, 201, "a member of a zombie's group: the zombie claims nothing");
  t.equal((await put('orphan-of-reused', 921)).statusCode, 201, 'a member of a group whose leader PID names another process now');
  t.equal((await put('unreadable-parent', 930)).statusCode, 201, 'a process whose parent cannot be read: its ancestry stops there');

  t.equal((await put('engine', 901, [0])).statusCode, 201);
  // The next repeat of "engine" waits on a slow nvidia-smi after its process was read; meanwhile
  // "engine" is removed and its parent registered.
  // 4 s: room for the removal and the registration below on a loaded machine.
  fake.update((scenario) => ({ ...scenario, delayMs: 4000 }));
  const read = new Promise<void>((resolve) => (onRead = (pid) => pid === 901 && resolve()));
  const repeat = put('engine', 901, [0]);
  await read;
  onRead = null;
  // Its process read, it is judged a repeat within the same turn (microtasks); then it waits on nvidia-smi.
  await new Promise((resolve) => setImmediate(resolve));
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/engine' })).statusCode, 204);
  t.equal((await put('parent', 900)).statusCode, 201);
  const refused = await repeat;
  t.equal(refused.statusCode, 409, 'no longer a repeat when it was decided, so judged in full');
  t.match(refused.json().message, /^Process 901 \(llama-server, started at tick 2010\) descends from process 900 \(sh, started at tick 2000\), which is already registered as shard "parent"\./);
});
