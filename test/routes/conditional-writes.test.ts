// Writes with If-Match and If-None-Match (RFC 9110 13.1): "*" asks that the shard be registered or
// not, decided with the write; tags are never matched (shard ETags are weak); nothing changes on a 412.
import t from 'tap';
import { buildTestApp, spawnShardProcess } from '../helpers/app.js';
import { idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';

const PRECONDITION = { statusCode: 412, code: 'NODECOMPUTE_PRECONDITION_FAILED' };

t.test('PUT with If-None-Match: * registers only an absent shard; If-Match: * replaces only a registered one', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  const put = (headers: Record<string, string>, graceMs: number) => app.inject({ method: 'PUT', url: '/shards/a', headers, payload: { pid: shard.pid, gpus: [0], graceMs } });
  const grace = async () => (await app.inject({ method: 'GET', url: '/shards/a' })).json().graceMs;

  const early = await put({ 'if-match': '*' }, 1000);
  t.match(early.json(), PRECONDITION, 'If-Match: * on an absent shard');
  t.match(early.json().message, /If-Match.*registered shard "a".*nothing was changed/);
  t.equal((await app.inject({ method: 'GET', url: '/shards/a' })).statusCode, 404, 'not registered');

  t.equal((await put({ 'if-none-match': '*' }, 1000)).statusCode, 201);
  const again = await put({ 'if-none-match': ' * ' }, 2000);
  t.match(again.json(), PRECONDITION, 'If-None-Match: * on a registered shard, even an identical repeat');
  t.match(again.json().message, /If-None-Match: \*.*"a".*GET \/shards\/a/);
  t.equal(await grace(), 1000, 'unchanged');

  t.equal((await put({ 'if-match': '*' }, 3000)).statusCode, 200);
  t.equal(await grace(), 3000, 'replaced');
});

t.test('PUT with If-Match naming tags: 412 (weak tags never match); If-None-Match naming tags: 400', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  const payload = { pid: shard.pid, gpus: [0], graceMs: 1000 };
  t.equal((await app.inject({ method: 'PUT', url: '/shards/a', payload })).statusCode, 201);
  const etag = (await app.inject({ method: 'GET', url: '/shards/a' })).headers.etag as string;
  t.match(etag, /^W\//);
  const tagged = await app.inject({ method: 'PUT', url: '/shards/a', headers: { 'if-match': etag }, payload: { ...payload, graceMs: 5 } });
  t.match(tagged.json(), PRECONDITION);
  t.match(tagged.json().message, /weak.*If-Match: \*/);
  const listed = await app.inject({ method: 'PUT', url: '/shards/a', headers: { 'if-none-match': etag }, payload });
  t.match(listed.json(), { statusCode: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /If-None-Match.*"\*"/ });
  const empty = await app.inject({ method: 'PUT', url: '/shards/a', headers: { 'if-match': '' }, payload });
  t.match(empty.json(), { statusCode: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /If-Match is empty/ });
  t.equal((await app.inject({ method: 'GET', url: '/shards/a' })).json().graceMs, 1000, 'unchanged');
});

t.test('a precondition is judged before /proc: a create-only PUT of a registered id with a PID that is gone is 412, not 422', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  const res = await app.inject({ method: 'PUT', url: '/shards/a', headers: { 'if-none-match': '*' }, payload: { pid: 4_000_000, gpus: [0] } });
  t.match(res.json(), PRECONDITION);
});

t.test('concurrent create-only PUTs of one id: one is registered, the others get 412', async (t) => {
  const shards = await Promise.all([0, 1, 2, 3].map(() => spawnShardProcess(t, 0)));
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  const answers = await Promise.all(
    shards.map((shard) => app.inject({ method: 'PUT', url: '/shards/a', headers: { 'if-none-match': '*' }, payload: { pid: shard.pid, gpus: [0] } })),
  );
  t.same(answers.map((res) => res.statusCode).sort(), [201, 412, 412, 412]);
  const winner = answers.find((res) => res.statusCode === 201)!.json();
  t.equal((await app.inject({ method: 'GET', url: '/shards/a' })).json().pid, winner.pid, 'the one answered 201 is the one kept');
});

t.test('DELETE: If-Match: * removes a registered shard; If-None-Match: * or If-Match naming tags keep it (412); an absent one is 404 whatever they say', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  const del = (headers: Record<string, string>) => app.inject({ method: 'DELETE', url: '/shards/a', headers });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  t.match((await del({ 'if-none-match': '*' })).json(), PRECONDITION);
  t.match((await del({ 'if-match': 'W/"x", "y"' })).json(), PRECONDITION);
  t.equal((await app.inject({ method: 'GET', url: '/shards/a' })).statusCode, 200, 'kept');
  t.equal((await del({ 'if-match': '*' })).statusCode, 204);
  t.match((await del({ 'if-match': '*' })).json(), { statusCode: 404, code: 'NODECOMPUTE_SHARD_NOT_FOUND' });
  t.equal((await del({ 'if-none-match': '*' })).statusCode, 404);
  t.equal((await del({ 'if-none-match': 'W/"x"' })).statusCode, 400, 'tags in If-None-Match are refused first');
});

t.test('If-Match: * and If-None-Match: * together never hold: If-Match is judged first', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: idleEightGpuNode() });
  const put = () => app.inject({ method: 'PUT', url: '/shards/a', headers: { 'if-match': '*', 'if-none-match': '*' }, payload: { pid: shard.pid, gpus: [0] } });
  t.match((await put()).json(), { ...PRECONDITION, message: /If-Match/ }, 'absent');
  t.equal((await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  t.match((await put()).json(), { ...PRECONDITION, message: /If-None-Match/ }, 'registered');
});
