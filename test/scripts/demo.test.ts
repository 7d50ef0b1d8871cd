// The demo node (`npm run demo`): started on a free port with its real processes, every readiness
// state but `unverified` (which needs nvidia-smi failing) appears in GET /shards over HTTP, the stray GPU and the
// foreign memory are there, and stop() leaves no process and no temp dir behind.
import { existsSync } from 'node:fs';
import t from 'tap';
import { pino } from 'pino';
import { killGroup, startDemoNode } from '../../scripts/demo-node.js';
import { fakeNvidiaSmiBin } from '../../scripts/fake-nvidia-smi.js';
import { livePidsInGroup, waitUntil } from '../helpers/fake-nvidia-smi.js';

interface ShardBody {
  id: string;
  status: { state: string; reason: string | null; warnings: string[] };
  compute: { devices: string[]; strayGpus: Array<{ index: number }>; engine: { backend: string } | null } | null;
}

t.test('the demo node shows every state, a stray GPU and foreign memory, and stops cleanly', async (t) => {
  const demo = await startDemoNode({ host: '127.0.0.1', port: 0, logger: pino({ level: 'silent' }) });
  let stopped = false;
  t.teardown(async () => {
    if (!stopped) await demo.stop();
  });
  t.match(demo.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  t.equal(demo.settled, true, 'every shard reached its state');
  let shards: ShardBody[] = [];
  for (let i = 0; i < 100; i += 1) {
    const body = (await (await fetch(`${demo.url}/shards`)).json()) as { shards: ShardBody[] };
    shards = body.shards;
    if (shards.every((shard) => shard.status.state === demo.shards.find((s) => s.id === shard.id)?.state)) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const states = Object.fromEntries(shards.map((shard) => [shard.id, shard.status.state]));
  t.same(states, Object.fromEntries(demo.shards.map((shard) => [shard.id, shard.state])), 'GET /shards agrees with the demo');
  t.same(
    [...new Set(Object.values(states))].sort(),
    ['exited', 'on-cpu', 'ready', 'starting', 'stopped'],
    'every state a shard can reach on a working node',
  );
  const byId = (id: string) => shards.find((shard) => shard.id === id)!;
  t.same(byId('llama-70b').compute!.devices, ['GPU 0: 125.4 GiB', 'GPU 1: 125.4 GiB'], 'both tensor-parallel workers are attributed');
  t.same(byId('qwen-32b').compute!.strayGpus.map((gpu) => gpu.index), [3], 'qwen holds GPU 3, which it was not given');
  t.match(byId('qwen-32b').status.warnings.join(' '), 'holds memory on GPU 3, which it was not given');
  t.equal(byId('llama-8b').compute!.engine!.backend, 'CPU', "llama.cpp's own log says CPU");
  t.match(byId('llama-8b').status.reason, 'the engine itself reports it');
  t.match(byId('phi-3-mini').status.reason, 'hold no memory on GPU 5');
  t.match(byId('gemma-9b').status.reason, "the shard's process exited");
  t.match(byId('granite-8b').status.reason, /^process \d+ \(sh\) is stopped \(state T: /);
  t.same(byId('granite-8b').compute!.devices, ['GPU 7: 8.9 GiB'], 'a stopped shard keeps its memory');

  const foreign = (await (await fetch(`${demo.url}/gpus/foreign-memory`)).json()) as {
    gpus: Array<{ index: number; foreignMiB: number; foreignProcesses: Array<{ name: string }> }>;
  };
  t.same(foreign.gpus[4]!.foreignProcesses.map((p) => p.name), ['/opt/conda/bin/python3 -m ipykernel_launcher']);
  t.same(foreign.gpus[7]!.foreignProcesses.map((p) => p.name), ['[Not Found]']);
  t.equal(foreign.gpus[0]!.foreignMiB, 9, 'only the driver residue is foreign on a shard-held GPU');

  t.equal(demo.groups.length, 8, 'seven shards and one foreign notebook');
  const alive = demo.groups.filter((pgid) => livePidsInGroup(pgid).length > 0);
  t.equal(alive.length, 7, 'every group but the killed shard is there (the stopped one too)');
  await demo.stop();
  stopped = true;
  await waitUntil(() => demo.groups.every((pgid) => livePidsInGroup(pgid).length === 0), { what: 'every demo process to die' });
  t.notOk(existsSync(demo.dir), 'the temp dir is removed');
});

t.test('a port already taken fails the start and leaves nothing behind', async (t) => {
  const first = await startDemoNode({ host: '127.0.0.1', port: 0, logger: pino({ level: 'silent' }) });
  t.teardown(() => first.stop());
  const port = Number(new URL(first.url).port);
  await t.rejects(startDemoNode({ host: '127.0.0.1', port, logger: pino({ level: 'silent' }) }), { code: 'EADDRINUSE' });
});

t.test('the fake nvidia-smi is found from scripts/ and from dist/scripts/, or named when missing', async (t) => {
  t.match(fakeNvidiaSmiBin(), /test\/fixtures\/bin\/nvidia-smi$/);
  const fromDist = new URL('../../dist/scripts/demo-node.js', import.meta.url).href;
  t.equal(fakeNvidiaSmiBin(fromDist), fakeNvidiaSmiBin());
  t.throws(() => fakeNvidiaSmiBin('file:///nonexistent/a/b/demo-node.js'), /run this from a checkout of the repository/);
});

t.test('killing a process group that is gone says so instead of throwing', async (t) => {
  t.equal(killGroup(4_194_304), false);
});
