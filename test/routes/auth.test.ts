// Who may write: a configured bearer token (constant-time compared), else loopback only. Reads stay open.
import t from 'tap';
import { describeWriteAccess, isLoopback, WRITE_REFUSALS } from '../../src/auth.js';
import { defaultConfig } from '../../src/config.js';
import { REPEATED_WARNING_MS } from '../../src/repeat-limit.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';

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
  const wrong = await put({ authorization: 'Bearer wrong' });
  t.match(wrong.json().message, 'does not match');
  t.equal(wrong.headers['www-authenticate'], 'Bearer realm="nodecompute", error="invalid_token"', 'RFC 6750: a token presented and refused');
  t.match((await put({ authorization: `Basic ${TOKEN}` })).json().message, 'The Authorization header sent is not that', 'another scheme: said so');
  t.notMatch(missing.json().message, 'header sent', 'none sent: nothing to say of it');

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
  t.equal(app.services.tokenFile, null, 'a token given in the environment has no file to look at later');
});

t.test('without a token, writes are accepted from loopback only', async (t) => {
  const shard = await spawnShardProcess(t, 0);
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  for (const remoteAddress of ['10.1.2.3', '::ffff:192.0.2.9', '2001:db8::1']) {
    const res = await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [] }, remoteAddress });
    t.equal(res.statusCode, 403, remoteAddress);
    t.equal(res.json().code, 'NODECOMPUTE_FORBIDDEN');
    t.match(res.json().message, 'NODECOMPUTE_TOKEN');
    const shown = remoteAddress.replace('::ffff:', '');
    t.match(res.json().message, /no token is configured.*loopback only \(127\.0\.0\.1, ::1\)/i);
    t.match(res.json().message, `came from ${shown}.`, 'it names the address the write came from');
    t.match(res.json().message, /Docker's -p .*172\.17\.0\.1.*a proxy.*"Authorization: Bearer <token>"/);
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

/** The value of an unlabelled-but-for-reason counter series in a /metrics text. */
function refusedCount(text: string, reason: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`nodecompute_writes_refused_total{reason="${reason}"} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

t.test('refused writes are counted by reason and logged, once a minute per reason and address, never with the token', async (t) => {
  const clock = manualClock();
  const { log: logger, lines } = captureLog('debug');
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: { token: TOKEN }, deps: { now: clock.now, logger } });
  const metrics = async () => (await app.inject({ method: 'GET', url: '/metrics' })).body;
  const before = await metrics();
  for (const reason of WRITE_REFUSALS) t.equal(refusedCount(before, reason), 0, `${reason} starts at 0, so increase() sees the first`);

  const del = (remoteAddress: string, authorization?: string) =>
    app.inject({ method: 'DELETE', url: '/shards/a', remoteAddress, headers: authorization === undefined ? {} : { authorization } });
  const refusals = () => lines.filter((line) => typeof line.reason === 'string');
  for (let i = 0; i < 5; i += 1) t.equal((await del('10.0.0.7')).statusCode, 401);
  t.same(
    refusals().map((line) => [line.level, line.reason, line.remoteAddress, line.method, line.url]),
    [[40, 'missing-token', '10.0.0.7', 'DELETE', '/shards/a'], ...Array.from({ length: 4 }, () => [20, 'missing-token', '10.0.0.7', 'DELETE', '/shards/a'])],
    'a write without a header is logged too: a warning, then its repeats at debug level',
  );
  t.match(refusals()[0]!.msg, 'Refused a write without "Authorization: Bearer <token>" (repeats from this address are logged at debug level for a minute)');

  await del('10.0.0.7', 'Bearer wrong-token-presented-here');
  await del('10.0.0.7', 'Bearer wrong-token-presented-here');
  await del('10.0.0.8', 'Bearer wrong-token-presented-here');
  t.same(
    refusals().slice(5).map((line) => [line.level, line.reason, line.remoteAddress]),
    [[40, 'wrong-token', '10.0.0.7'], [20, 'wrong-token', '10.0.0.7'], [40, 'wrong-token', '10.0.0.8']],
    'another reason, or another address, is a warning of its own',
  );
  clock.advance(REPEATED_WARNING_MS);
  await del('10.0.0.7');
  t.equal(refusals().at(-1)!.level, 40, 'a minute later, a warning again');
  t.notMatch(JSON.stringify(lines), /wrong-token-presented-here|correct-horse/, 'no token is ever logged');

  const after = await metrics();
  t.equal(refusedCount(after, 'missing-token'), 6, 'every refusal is counted, logged at warn or not');
  t.equal(refusedCount(after, 'wrong-token'), 3);
  t.equal(refusedCount(after, 'not-loopback'), 0);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/a', headers: { authorization: `Bearer ${TOKEN}` } })).statusCode, 404, 'an accepted write');
  t.equal(refusedCount(await metrics(), 'wrong-token'), 3, 'is not counted');
});

t.test('without a token, a write from the network is counted and logged as not-loopback', async (t) => {
  const { log: logger, lines } = captureLog('info');
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { logger } });
  const res = await app.inject({ method: 'DELETE', url: '/shards/a', remoteAddress: '::ffff:172.17.0.1' });
  t.equal(res.statusCode, 403);
  t.match(res.json().message, /came from 172\.17\.0\.1\. Behind Docker's -p/);
  t.match(lines.find((line) => line.reason === 'not-loopback'), { level: 40, remoteAddress: '::ffff:172.17.0.1', msg: /^Refused a write from the network: no token is configured, so only loopback may write/ });
  t.equal(refusedCount((await app.inject({ method: 'GET', url: '/metrics' })).body, 'not-loopback'), 1);
});

t.test('a write a web page could have sent is refused, counted and logged by its own reason, token or not', async (t) => {
  for (const token of [null, TOKEN]) {
    const { log: logger, lines } = captureLog('info');
    const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: { token }, deps: { logger } });
    const authorization = token === null ? {} : { authorization: `Bearer ${token}` };
    const del = (headers: Record<string, string>) => app.inject({ method: 'DELETE', url: '/shards/a', headers: { ...authorization, ...headers } });

    const crossSite = await del({ origin: 'http://attacker.example' });
    t.equal(crossSite.statusCode, 403, `token ${token === null ? 'none' : 'set'}: another origin`);
    t.equal(crossSite.json().code, 'NODECOMPUTE_CROSS_ORIGIN');
    t.match(crossSite.json().message, 'Origin: http://attacker.example');
    t.equal((await del({ 'sec-fetch-site': 'cross-site' })).json().code, 'NODECOMPUTE_CROSS_ORIGIN');
    t.match(lines.find((line) => line.reason === 'cross-origin'), { level: 40, msg: /^Refused a write a web page could have sent: / });

    const rebound = await del({ host: 'rebind.attacker.example:9470' });
    const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
    t.equal(refusedCount(metrics, 'cross-origin'), 2);
    if (token === null) {
      t.equal(rebound.statusCode, 403, 'a loopback write naming a foreign host');
      t.equal(rebound.json().code, 'NODECOMPUTE_HOST_NOT_ALLOWED');
      t.match(rebound.json().message, /NODECOMPUTE_ALLOWED_HOSTS/);
      t.equal(refusedCount(metrics, 'foreign-host'), 1);
    } else {
      t.equal(rebound.statusCode, 404, 'with a token, the Host is not what grants the write');
      t.equal(refusedCount(metrics, 'foreign-host'), 0);
    }
  }
});

t.test('how writes are authorised, as the start-up line says it', async (t) => {
  t.equal(
    describeWriteAccess(defaultConfig({ tokenFile: '/var/run/secrets/nodecompute/token', token: 'a'.repeat(16), fileTokens: ['a'.repeat(16), 'b'.repeat(16)] })),
    'Writes need a bearer token: 2 token(s) from /var/run/secrets/nodecompute/token (re-read when it changes).',
  );
  t.equal(describeWriteAccess(defaultConfig({ token: TOKEN })), 'Writes need a bearer token: 1 token from NODECOMPUTE_TOKEN.');
  t.match(describeWriteAccess(defaultConfig({})), /^No token is configured: writes are accepted from loopback only \(127\.0\.0\.1, ::1\), from any local process\. .*Docker's -p.*set NODECOMPUTE_TOKEN_FILE/);
});
