// buildApp's defaults (with no deps it makes its own logger and readers from the config alone), how
// it logs requests (answered ones at debug, coded failures as one warning a minute each), and how it
// closes keep-alive connections and answers the requests that arrive on them while it stops.
import http from 'node:http';
import { join } from 'node:path';
import { connect, type AddressInfo } from 'node:net';
import t from 'tap';
import { buildApp } from '../src/app.js';
import { writeClientError } from '../src/http/errors.js';
import { defaultConfig } from '../src/config.js';
import { buildTestApp } from './helpers/app.js';
import { eightGpuNode, waitUntil } from './helpers/fake-nvidia-smi.js';
import { captureLog } from './helpers/log-capture.js';
import { parseResponses } from './helpers/raw-http.js';

t.test('buildApp(config) needs nothing else', async (t) => {
  const dir = t.testdir({});
  const app = await buildApp(defaultConfig({ stateFile: join(dir, 's.json'), nvidiaSmi: join(dir, 'missing'), logLevel: 'silent' }));
  t.teardown(() => app.close());
  t.equal((await app.inject({ method: 'GET', url: '/livez' })).statusCode, 200);
  const gpus = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(gpus.json().code, 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND');
  t.equal(app.services.proc.root, '/proc');
});

t.test('malformed HTTP on a socket the client already closed is left alone', async (t) => {
  const closed = { writable: false, end: () => t.fail('must not write to a closed socket') };
  writeClientError(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }), closed as unknown as import('node:net').Socket);
  const written: string[] = [];
  const open = { writable: true, end: (text: string) => written.push(text) };
  writeClientError(Object.assign(new Error('Parse Error'), { code: 'HPE_INVALID_CONTENT_LENGTH' }), open as unknown as import('node:net').Socket);
  t.match(written[0], /^HTTP\/1\.1 400 Bad Request\r\n[^]*"code":"NODECOMPUTE_BAD_REQUEST"[^]*HPE_INVALID_CONTENT_LENGTH/);
  // Node raises this after requestTimeout (30 s); the abuse suite sends a real header overflow.
  writeClientError(Object.assign(new Error('Request timeout'), { code: 'ERR_HTTP_REQUEST_TIMEOUT' }), open as unknown as import('node:net').Socket);
  t.match(written[1], /^HTTP\/1\.1 408 Request Timeout\r\n[^]*"code":"NODECOMPUTE_REQUEST_TIMEOUT"[^]*not completed within 30 s/);
});

t.test('a path asked with a trailing slash is told the path it meant, whatever the method, where the router has one for the path without it', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const meant = (method: string, path: string) =>
    `No route ${method} ${path}. Did you mean ${path.slice(0, -1)}, without the trailing slash? The API is listed at /docs and /openapi.json.`;
  // A concrete path of a route with a parameter (a route pattern never matches it), and ones without.
  for (const path of ['/shards/s1/ready/', '/shards/s1/engine-output/', '/gpus/', '/docs/json/']) {
    for (const method of ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'PROPFIND']) {
      const res = await app.inject({ method: method as 'GET', url: `${path}?x=1` });
      t.equal(res.statusCode, 404, `${method} ${path}: 404`);
      t.equal(res.json().message, meant(method, path), `${method} ${path}: the hint`);
    }
    // A HEAD answer has no body; its Content-Length is that of the one with the hint.
    const head = await app.inject({ method: 'HEAD', url: path });
    t.equal(head.statusCode, 404, `HEAD ${path}: 404`);
    const body = { statusCode: 404, code: 'NODECOMPUTE_NOT_FOUND', error: 'Not Found', message: meant('HEAD', path) };
    t.equal(Number(head.headers['content-length']), Buffer.byteLength(JSON.stringify(body)), `HEAD ${path}: the hint`);
  }
  // The /docs files' wildcard matches any path below it: no hint where there is no such file.
  for (const path of ['/docs/static/nope.css/', '/shards/s1/nope/']) {
    const res = await app.inject({ method: 'GET', url: path });
    t.equal(res.json().message, `No route GET ${path}. The API is listed at /docs and /openapi.json.`, `${path}: no hint`);
  }
});

t.test('a 4xx raised without a code of ours gets the code of its status, never NODECOMPUTE_BAD_REQUEST for all', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  // As a plugin would raise one (http-errors: a status and its text, no code).
  app.get('/test/teapot', async () => {
    throw Object.assign(new Error("I'm a Teapot"), { statusCode: 418 });
  });
  const res = await app.inject({ method: 'GET', url: '/test/teapot?x=1' });
  t.equal(res.statusCode, 418);
  t.same(res.json(), {
    statusCode: 418,
    code: 'NODECOMPUTE_I_M_A_TEAPOT',
    error: "I'm a Teapot",
    message: "GET /test/teapot was refused (I'm a Teapot). Check it against the API at /docs and /openapi.json.",
  });
});

t.test('at debug level every answered request is logged', async (t) => {
  const dir = t.testdir({});
  const { log: logger, lines } = captureLog();
  const app = await buildApp(defaultConfig({ stateFile: join(dir, 's.json'), nvidiaSmi: join(dir, 'missing') }), { logger });
  t.teardown(() => app.close());
  await app.inject({ method: 'GET', url: '/livez' });
  t.ok(lines.some((line) => line.url === '/livez' && line.level === 20 && line.msg.includes('Request answered')));
});

t.test('a coded failure repeating on every request is one warning a minute, its repeats debug lines', async (t) => {
  const dir = t.testdir({});
  const { log: logger, lines } = captureLog();
  let clock = Date.now();
  const app = await buildApp(defaultConfig({ stateFile: join(dir, 's.json'), nvidiaSmi: join(dir, 'missing') }), { logger, now: () => clock });
  t.teardown(() => app.close());
  const failedLevels = async (url: string) => {
    const res = await app.inject({ method: 'GET', url });
    t.equal(res.statusCode, 503);
    return lines.filter((line) => line.msg === 'Request failed').map((line) => line.level);
  };
  for (let i = 0; i < 3; i += 1) await failedLevels('/gpus');
  t.same(await failedLevels('/gpus/foreign-memory'), [40, 20, 20, 20], 'the same failure through another route is a repeat too');
  const first = lines.find((line) => line.msg === 'Request failed')!;
  t.match(first, { reqId: String, method: 'GET', url: '/gpus', err: { code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND', message: /could not be run from/ } });
  clock += 60_000;
  t.same((await failedLevels('/gpus')).slice(4), [40], 'a minute later it is a warning again');
});

t.test('the failures remembered for that are bounded: past 100 distinct ones the memory starts afresh', async (t) => {
  const dir = t.testdir({});
  const { createProcReader } = await import('../src/system/procfs.js');
  const { log: logger, lines } = captureLog('warn');
  const base = createProcReader({ root: '/proc', log: logger });
  // Each registration fails with a message of its own (the PID is in it): a distinct failure each.
  const readStat = (pid: number) => Promise.reject(new Error(`cannot read /proc/${pid}/stat: permission denied (EACCES).`));
  const app = await buildApp(defaultConfig({ stateFile: join(dir, 's.json'), nvidiaSmi: join(dir, 'missing') }), { logger, proc: { ...base, root: base.root, readStat } });
  t.teardown(() => app.close());
  const register = (pid: number) => app.inject({ method: 'PUT', url: '/shards/p', payload: { pid, gpus: [] } });
  const warnings = () => lines.filter((line) => line.msg === 'Request failed').length;
  await register(1);
  await register(1);
  t.equal(warnings(), 1, 'a repeat within the minute is not a warning');
  for (let pid = 2; pid <= 101; pid += 1) t.equal((await register(pid)).statusCode, 503);
  t.equal(warnings(), 101);
  await register(1);
  t.equal(warnings(), 102, 'the 101st distinct failure started the memory afresh, so the first is news again');
});

t.test('closing with a keep-alive request in flight: it is answered, and close does not wait out the keep-alive timeout', async (t) => {
  const { app, fake } = await buildTestApp(t, { scenario: eightGpuNode(), config: { cacheTtlMs: 0, maxStaleMs: 0, smiTimeoutMs: 60_000 } });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as import('node:net').AddressInfo;
  fake.update((scenario) => ({ ...scenario, delayMs: 30_000 }));
  const before = fake.invocations().length;
  const agent = new http.Agent({ keepAlive: true });
  t.teardown(() => agent.destroy());
  const answer = new Promise<{ status: number; body: string }>((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/gpus', agent }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk));
        res.on('end', () => resolve({ status: res.statusCode!, body }));
      })
      .on('error', reject);
  });
  await waitUntil(() => fake.invocations().length > before, { what: 'the request to start nvidia-smi' });
  const closeStarted = Date.now();
  const closed = app.close();
  const { status, body } = await answer;
  t.equal(status, 503, 'answered, with the coded failure of the stopped nvidia-smi run');
  t.match(JSON.parse(body), { code: /^NODECOMPUTE_/ });
  await closed;
  // Node would keep the idle connection for Fastify's 72 s keep-alive timeout.
  t.ok(Date.now() - closeStarted < 20_000, `closed ${Date.now() - closeStarted} ms after close began`);
});

t.test('a request that arrives while the app closes is answered as any other, with Connection: close: from the cache, or with the coded 503 of the nvidia-smi run it may not start', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: { cacheTtlMs: 600_000 } });
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  t.teardown(() => release());
  const arrived: string[] = [];
  app.server.on('request', (request: http.IncomingMessage) => void arrived.push(request.url!));
  app.get('/test/held', async () => {
    await held;
    return 'done';
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  t.equal((await app.inject({ method: 'GET', url: '/gpus' })).statusCode, 200, 'a snapshot in the cache');
  // Two keep-alive connections, each with a request in flight when the close begins; new
  // connections are refused from then on, so only these can still bring a request.
  const connections = ['/gpus', '/doctor'].map((later) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    socket.setEncoding('latin1').on('data', (data: string) => (text += data));
    const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    socket.write('GET /test/held HTTP/1.1\r\nHost: test\r\n\r\n');
    return { socket, closed, later, responses: () => parseResponses(text) };
  });
  const count = (url: string) => arrived.filter((seen) => seen === url).length;
  await waitUntil(() => count('/test/held') === 2, { what: 'both held requests to arrive' });
  const closing = app.close();
  for (const { socket, later } of connections) socket.write(`GET ${later} HTTP/1.1\r\nHost: test\r\n\r\n`);
  // Released once both later requests are in: the answer to a held one lets its connection close.
  await waitUntil(() => count('/gpus') === 1 && count('/doctor') === 1, { what: 'the later requests to arrive' });
  release();
  await Promise.all([closing, ...connections.map((connection) => connection.closed)]);

  const [heldAnswer, fromCache] = connections[0]!.responses();
  const [, refused] = connections[1]!.responses();
  t.equal(heldAnswer?.status, 200, 'the request in flight is answered');
  t.equal(fromCache?.status, 200, 'a later one too, from the snapshot in hand');
  t.equal(JSON.parse(fromCache!.body).gpus.length, 8);
  t.equal(fromCache?.headers.connection, 'close', 'and told the connection closes');
  // The doctor asks nvidia-smi afresh, and the shutdown has stopped it.
  t.equal(refused?.status, 503);
  t.equal(refused?.headers.connection, 'close');
  t.same(
    JSON.parse(refused!.body),
    { statusCode: 503, code: 'NODECOMPUTE_NVIDIA_SMI_FAILED', error: 'Service Unavailable', message: 'nvidia-smi was not run: nodecompute is shutting down.' },
    'the one error shape, saying why',
  );
});

t.test('a request that stops arriving is answered 408 at its timeout, not up to a check interval later', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { requestTimeoutMs: 500 } });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  const ask = (head: string) =>
    new Promise<{ ms: number; answer: string }>((resolve, reject) => {
      const started = Date.now();
      const socket = connect(port, '127.0.0.1', () => socket.write(head));
      let answer = '';
      socket.on('data', (chunk) => (answer += String(chunk)));
      socket.on('close', () => resolve({ ms: Date.now() - started, answer }));
      socket.on('error', reject);
    });
  const body = await ask('PUT /shards/s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"pid":');
  t.match(body.answer, /^HTTP\/1\.1 408 [^]*"code":"NODECOMPUTE_REQUEST_TIMEOUT"/, 'a body that stops: 408');
  t.ok(body.ms < 2500, `answered ${body.ms} ms after it began, with a timeout of 500 ms`);
  const headers = await ask('GET /gpus HTTP/1.1\r\nHost: 127.0.0.1\r\n');
  t.match(headers.answer, /^HTTP\/1\.1 408 /, 'headers that stop: 408');
  t.ok(headers.ms < 2500, `answered ${headers.ms} ms after it began`);
});
