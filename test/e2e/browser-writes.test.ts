// A web page in a browser on the node must not borrow the loopback trust (issue 38), tried against
// the real server over HTTP as a browser would send: a DNS-rebound Host, a cross-site simple POST of
// a CPU-looking log, a cross-site DELETE. Each is refused, coded, and changes nothing; the same
// requests as curl sends them still work.
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { spawnShardProcess } from '../helpers/app.js';
import { createFakeNvidiaSmi, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { readSample } from '../helpers/samples.js';
import { startServer, type RunningServer } from '../helpers/server.js';

const TOKEN = 'a-token-of-enough-length';
const CPU_LOG = readSample('llamacpp-server-log_b9692_cuda-dll-missing_cpu-only-device_info_from-test-literal.txt');

interface Answer {
  status: number;
  body: { code?: string; message?: string; account?: unknown };
}

/** One request with exactly these headers (fetch would set Host and Origin itself). */
function send(server: RunningServer, method: string, path: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  const { port } = new URL(server.url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers: { host: `127.0.0.1:${port}`, ...headers }, setHost: false }, (res) => {
      let text = '';
      res.on('data', (chunk: Buffer) => (text += chunk.toString()));
      res.on('end', () => resolve({ status: res.statusCode!, body: text === '' ? {} : (JSON.parse(text) as Answer['body']) }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function node(t: Test, env: Record<string, string> = {}) {
  const dir = t.testdir({ smi: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), idleEightGpuNode());
  const server = await startServer(t, { NODECOMPUTE_NVIDIA_SMI: fake.path, NODECOMPUTE_STATE_FILE: join(dir, 's.json'), ...env });
  const { port } = new URL(server.url);
  const shard = await spawnShardProcess(t, 0);
  const register = (id: string, headers: Record<string, string> = {}) =>
    send(server, 'PUT', `/shards/${id}`, { 'content-type': 'application/json', ...headers }, JSON.stringify({ pid: shard.pid, gpus: [0], engine: 'llama.cpp' }));
  const shards = async () => ((await (await server.fetch('/shards')).json()) as { shards: Array<{ id: string; compute: { engine: unknown } | null }> }).shards;
  return { server, port, register, shards };
}

t.test('without a token: a rebound Host, a cross-site POST and a cross-site DELETE are refused and change nothing', async (t) => {
  const { server, port, register, shards } = await node(t);

  const rebound = await register('evil', { host: `rebind.attacker.example:${port}` });
  t.equal(rebound.status, 403, 'DNS rebinding: the Host is not loopback');
  t.equal(rebound.body.code, 'NODECOMPUTE_HOST_NOT_ALLOWED');
  t.match(rebound.body.message, /NODECOMPUTE_ALLOWED_HOSTS/, 'it says what to set');
  t.same(await shards(), [], 'nothing stored');

  t.equal((await register('llama')).status, 201, 'the same PUT as curl sends it');
  t.equal((await register('llama2', { host: `localhost:${port}` })).status, 409, 'Host: localhost is loopback (409: the process is llama\'s)');

  const post = await send(server, 'POST', '/shards/llama/engine-output', { 'content-type': 'text/plain', origin: 'http://attacker.example' }, CPU_LOG);
  t.equal(post.status, 403, 'a cross-site simple POST');
  t.equal(post.body.code, 'NODECOMPUTE_CROSS_ORIGIN');
  const ready = (await (await server.fetch('/shards/llama/ready')).json()) as { cause: string | null };
  t.not(ready.cause, 'engine-gpu-backend-failed', 'the log was not taken: the engine did not say CPU');

  const del = await send(server, 'DELETE', '/shards/llama', { origin: 'http://attacker.example', 'sec-fetch-site': 'cross-site' });
  t.equal(del.status, 403, 'a cross-site DELETE');
  t.equal(del.body.code, 'NODECOMPUTE_CROSS_ORIGIN');
  t.same((await shards()).map((shard) => shard.id), ['llama'], 'still registered');

  const sameSite = await send(server, 'DELETE', '/shards/llama', { 'sec-fetch-site': 'same-site' });
  t.equal(sameSite.status, 403, 'same-site from another port is another origin');

  const own = await send(server, 'POST', '/shards/llama/engine-output', { 'content-type': 'text/plain', origin: `http://127.0.0.1:${port}`, 'sec-fetch-site': 'same-origin' }, 'hello\n');
  t.equal(own.status, 200, "this server's own page (/docs) may write");
  t.equal((await send(server, 'DELETE', '/shards/llama', {})).status, 204, 'a DELETE as curl sends it');

  const refusals = await (await server.fetch('/metrics')).text();
  t.match(refusals, /nodecompute_writes_refused_total\{reason="cross-origin"\} 3/);
  t.match(refusals, /nodecompute_writes_refused_total\{reason="foreign-host"\} 1/);
});

t.test('NODECOMPUTE_ALLOWED_HOSTS names the hosts a loopback write may give', async (t) => {
  const { port, register } = await node(t, { NODECOMPUTE_ALLOWED_HOSTS: 'GPU-Node-7, other.example' });
  t.equal((await register('a', { host: `gpu-node-7:${port}` })).status, 201, 'a listed name, any case and port');
  t.equal((await register('b', { host: 'elsewhere.example' })).body.code, 'NODECOMPUTE_HOST_NOT_ALLOWED');
});

t.test('with a token: any Host is fine, another origin is not', async (t) => {
  const { server, register } = await node(t, { NODECOMPUTE_TOKEN: TOKEN });
  const auth = { authorization: `Bearer ${TOKEN}` };
  t.equal((await register('a', { ...auth, host: 'nodecompute.nodecompute.svc:9470' })).status, 201, 'a control plane through a Service name');
  const cross = await send(server, 'DELETE', '/shards/a', { ...auth, origin: 'https://dashboard.example' });
  t.equal(cross.status, 403, 'a browser holding the token is still refused from another origin');
  t.equal(cross.body.code, 'NODECOMPUTE_CROSS_ORIGIN');
});
