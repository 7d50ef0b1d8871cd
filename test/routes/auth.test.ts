// Who may write: a configured bearer token (constant-time compared), else loopback only. Reads stay open.
import t from 'tap';
import { isLoopback } from '../../src/auth.js';
import { buildTestApp, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';

const TOKEN = 'correct-horse-battery-staple';

t.test('with a token configured, writes need it; reads stay open', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: { token: TOKEN } });
  const put = (headers: Record<string, string>, remoteAddress = '127.0.0.1') =>
    app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] }, headers, remoteAddress });

  const missing = await put({});
  t.equal(missing.statusCode, 401);
  t.equal(missing.json().code, 'NODECOMPUTE_UNAUTHORIZED');
  t.match(missing.json().message, 'Authorization: Bearer <token>');
  t.equal(missing.headers['www-authenticate'], 'Bearer realm="nodecompute"');

  for (const authorization of [`Bearer ${TOKEN}x`, 'Bearer wrong', `Basic ${TOKEN}`, 'Bearer ', `bearer${TOKEN}`]) {
    const res = await put({ authorization });
    t.equal(res.statusCode, 401, authorization);
  }
  t.match((await put({ authorization: 'Bearer wrong' })).json().message, 'does not match');

  const ok = await put({ authorization: `Bearer ${TOKEN}` }, '10.0.0.7');
  t.equal(ok.statusCode, 201, 'with the token, a write from the network is accepted');
  t.notOk(ok.headers['www-authenticate']);
  t.equal((await app.inject({ method: 'GET', url: '/shards', remoteAddress: '10.0.0.7' })).statusCode, 200, 'reads need no token');
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/a' })).statusCode, 401, 'DELETE is a write');
  t.equal(
    (await app.inject({ method: 'POST', url: '/shards/a/engine-output', payload: 'x', headers: { 'content-type': 'text/plain' } })).statusCode,
    401,
    'engine output is a write',
  );
  t.equal(app.services.tokenProblem(), null, 'a token given in the environment has nothing that can go wrong later');
});

t.test('without a token, writes are accepted from loopback only', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  for (const remoteAddress of ['10.1.2.3', '::ffff:192.0.2.9', '2001:db8::1']) {
    const res = await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [] }, remoteAddress });
    t.equal(res.statusCode, 403, remoteAddress);
    t.equal(res.json().code, 'NODECOMPUTE_FORBIDDEN');
    t.match(res.json().message, 'NODECOMPUTE_TOKEN');
  }
  for (const remoteAddress of ['127.0.0.1', '::1', '::ffff:127.0.0.1']) {
    const res = await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [] }, remoteAddress });
    t.ok([200, 201].includes(res.statusCode), remoteAddress);
  }
});

// Token comparison (prefixes, longer tokens, another case, several tokens) is tested through the
// app: test/abuse/bad-requests.test.ts and test/routes/auth-rotation.test.ts.
t.test('loopback: any 127.0.0.0/8 address, and nothing else (::1 and v4-mapped ones are tested through the app above)', async (t) => {
  t.ok(isLoopback('127.10.0.1'));
  t.notOk(isLoopback(undefined));
  t.notOk(isLoopback('128.0.0.1'));
});
