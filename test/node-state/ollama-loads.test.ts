// An Ollama server's last model load, kept across refreshes: the latest runner, what the last listing
// that saw it on a GPU said it held (with its model files then) and the least free memory while it
// ran, dropped with the server that started it or when its shard is gone.
import t from 'tap';
import { createLoadHistory } from '../../src/node-state/ollama-loads.js';
import type { ModelFile, ProcessModelFiles } from '../../src/system/model-files.js';
import type { ModelRunner } from '../../src/system/model-runners.js';
import type { ProcStat, StatAnswer } from '../../src/system/procfs.js';

const SERVER = 100;
const stat = (pid: number, ppid: number, startTime = 5): ProcStat => ({ pid, comm: 'x', state: 'S', ppid, pgrp: SERVER, session: SERVER, startTime, cpuTicks: 0 });
const runner = (pid: number, startedAt: number): ModelRunner => ({ pid, model: '/blobs/sha256-ab', startedAt });
/** GPU-0 with `free` MiB free, listing `pids`, each holding `used` MiB. */
const gpus = (free: number | null, pids: number[] = [], used: number | null = 300) => [{ uuid: 'GPU-0', freeMiB: free, processes: pids.map((pid) => ({ pid, usedMiB: used })) }];
/** What a refresh read of processes: their stats, and no model files unless `files` says. */
const stats = (...list: Array<[number, StatAnswer]>) => ({ stats: new Map<number, StatAnswer>(list), modelFiles: new Map<number, ProcessModelFiles>() });
const HOSTS = new Set<number | string>([SERVER]);

t.test('the latest runner is kept after it exits, with the free memory of its last listing', async (t) => {
  const history = createLoadHistory();
  const alive = stats([SERVER, stat(SERVER, 1)], [201, stat(201, SERVER)], [202, stat(202, SERVER)]);
  const undated = { ...runner(203, 0), startedAt: null };
  history.update(HOSTS, new Map([[SERVER, [runner(201, 1000), undated, runner(202, 2000)]]]), gpus(5000), alive, 3000);
  const loads = history.update(HOSTS, new Map([[SERVER, []]]), gpus(7000), stats([SERVER, stat(SERVER, 1)]), 4000);
  t.match(loads.get(SERVER), { runner: { pid: 202 }, seenAt: 3000, onGpu: null, server: { pid: SERVER, startTime: 5 } }, 'the later of two, as last seen');
  t.same([...loads.get(SERVER)!.freeMiB], [['GPU-0', 5000]]);
  t.same(history.servers(), [SERVER], 'its server, whose stat the snapshot reads');
});

t.test('free memory: the least any listing gave while the runner ran, as Ollama placed it at the start', async (t) => {
  const history = createLoadHistory();
  const alive = stats([SERVER, stat(SERVER, 1)], [201, stat(201, SERVER)]);
  const seen = (free: number | null) => history.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), gpus(free), alive, 2000).get(SERVER)!.freeMiB.get('GPU-0');
  t.equal(seen(3000), 3000);
  t.equal(seen(9000), 3000, 'a foreign job left while it ran: the load was placed without that room');
  t.equal(seen(null), 3000, 'a listing that does not say keeps what one said');
  t.equal(seen(2000), 2000);
  const unsaid = createLoadHistory();
  const first = (free: number | null) => unsaid.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), gpus(free), alive, 2000).get(SERVER)!.freeMiB.get('GPU-0');
  t.equal(first(null), null);
  t.equal(first(4000), 4000, 'the first listing that says');
  t.equal(unsaid.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), [], alive, 2000).get(SERVER)!.freeMiB.get('GPU-0'), 4000, 'a GPU no longer listed keeps its figure');
});

t.test("free memory counts the runner's own as free: it goes when the runner exits", async (t) => {
  const history = createLoadHistory();
  const alive = stats([SERVER, stat(SERVER, 1)], [201, stat(201, SERVER)]);
  const seen = (listed: ReturnType<typeof gpus>) => history.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), listed, alive, 2000).get(SERVER)!.freeMiB.get('GPU-0');
  t.equal(seen(gpus(5000, [201], 1500)), 6500, 'a context of 1.5 GiB: 5000 MiB free, 6500 without it');
  t.equal(seen(gpus(6000, [201], 200)), 6200, 'the least, each listing without the runner');
  t.equal(seen(gpus(5000, [201], null)), 6200, 'its memory not reported: the figure is not known, the one known stays');
});

t.test('an older runner still running never replaces a newer one that exited', async (t) => {
  const history = createLoadHistory();
  const alive = stats([SERVER, stat(SERVER, 1)], [201, stat(201, SERVER)], [202, stat(202, SERVER)]);
  history.update(HOSTS, new Map([[SERVER, [runner(201, 1000), runner(202, 2000)]]]), gpus(5000, [202]), alive, 3000);
  const loads = history.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), gpus(5000), alive, 4000);
  t.match(loads.get(SERVER), { runner: { pid: 202 }, seenAt: 3000 });
  t.same(loads.get(SERVER)?.onGpu?.usedMiB, new Map([['GPU-0', 300]]));
});

t.test('the runner on its GPUs as last listed there, with its model files then; a new runner starts afresh', async (t) => {
  const history = createLoadHistory();
  const alive = (pid: number) => stats([SERVER, stat(SERVER, 1)], [pid, stat(pid, SERVER)]);
  const blob: ModelFile = { path: '/blobs/sha256-ab', deleted: false, bytes: 4 << 30, mappedBytes: 4 << 30, seenIn: 'mapping', layers: null };
  const read = alive(201);
  read.modelFiles.set(201, { files: [blob], unreadable: null });
  const onGpu = (listed: ReturnType<typeof gpus>, seen = alive(201), pid = 201) =>
    history.update(HOSTS, new Map([[SERVER, [runner(pid, pid === 201 ? 1000 : 4000)]]]), listed, seen, 2000).get(SERVER)?.onGpu;
  t.equal(onGpu(gpus(5000)), null, 'not listed on a GPU yet');
  t.same(onGpu(gpus(5000, [201]), read), { usedMiB: new Map([['GPU-0', 300]]), files: [blob] }, 'a CUDA context, and the model mapped whole');
  t.same(onGpu(gpus(5000, [201], 4400)), { usedMiB: new Map([['GPU-0', 4400]]), files: [blob] }, 'its files not read again: those read before');
  t.same(onGpu(gpus(5000)), { usedMiB: new Map([['GPU-0', 4400]]), files: [blob] }, 'alive but no longer listed: the last listing that did');
  const reread = alive(201);
  reread.modelFiles.set(201, { files: [], unreadable: null });
  t.same(onGpu(gpus(5000, [201, 201]), reread), { usedMiB: new Map([['GPU-0', 600]]), files: [] }, 'read again, now none: as read; two entries on one GPU add up');
  t.same(onGpu(gpus(5000, [201], null)), { usedMiB: new Map([['GPU-0', null]]), files: [] }, 'memory not reported');
  t.equal(onGpu(gpus(5000), alive(301), 301), null, 'a later runner, never on a GPU');
});

t.test('dropped when the server that started the runner is gone or replaced, or the shard no longer asks', async (t) => {
  const start = () => {
    const history = createLoadHistory();
    history.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), gpus(5000), stats([SERVER, stat(SERVER, 1)], [201, stat(201, SERVER)]), 2000);
    return history;
  };
  const none = new Map<number | string, ModelRunner[]>();
  t.ok(start().update(HOSTS, none, gpus(5000), stats(), 3000).has(SERVER), 'its server not read this refresh: kept');
  t.notOk(start().update(HOSTS, none, gpus(5000), stats([SERVER, null]), 3000).has(SERVER), 'gone');
  t.notOk(start().update(HOSTS, none, gpus(5000), stats([SERVER, stat(SERVER, 1, 99)]), 3000).has(SERVER), 'its PID now another process');
  t.notOk(start().update(HOSTS, none, gpus(5000), stats([SERVER, { ...stat(SERVER, 1), state: 'Z' }]), 3000).has(SERVER), 'exited, not yet reaped');
  t.notOk(start().update(new Set(), none, gpus(5000), stats([SERVER, stat(SERVER, 1)]), 3000).has(SERVER), 'no shard asks for it');
});

t.test('a runner whose parent cannot be read is not recorded', async (t) => {
  const history = createLoadHistory();
  const unread = history.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), gpus(5000), stats([201, stat(201, SERVER)]), 2000);
  t.notOk(unread.has(SERVER));
  t.notOk(history.update(HOSTS, new Map([[SERVER, [runner(201, 1000)]]]), gpus(5000), stats(), 2000).has(SERVER), 'nor one whose own stat was not read');
});
