// A path that exists asked with a method it does not have: 405 with an Allow header listing what the
// path answers, in the one error body; OPTIONS on a known path: 204 with the same Allow. Paths that
// do not exist stay 404. The expected Allow of every documented path is derived from the OpenAPI
// document, so a new route or method is covered without touching this file.
import { METHODS as HTTP_METHODS, STATUS_CODES } from 'node:http';
import { readFileSync } from 'node:fs';
import t, { type Test } from 'tap';
import Fastify from 'fastify';
import { parse } from 'yaml';
import type { InjectOptions, LightMyRequestResponse } from 'fastify';
import type { App } from '../../src/app.js';
import { answerOtherMethods } from '../../src/http/method-not-allowed.js';
import { buildTestApp } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';

/** Every method Node's parser accepts, WebDAV's included; CONNECT never reaches a route. */
const METHODS = HTTP_METHODS.filter((method) => method !== 'CONNECT');

function check405(t: Test, res: LightMyRequestResponse, method: string, path: string, allow: string): void {
  t.equal(res.statusCode, 405, `${method} ${path}: 405 (${res.body.slice(0, 200)})`);
  t.equal(res.headers.allow, allow, `${method} ${path}: Allow`);
  if (method === 'HEAD') {
    t.equal(res.body, '', 'HEAD: no body');
    return;
  }
  t.match(res.headers['content-type'], /^application\/json/);
  const body = res.json() as Record<string, unknown>;
  t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode'], 'the one error shape');
  t.equal(body.statusCode, 405);
  t.equal(body.code, 'NODECOMPUTE_METHOD_NOT_ALLOWED');
  t.equal(body.error, STATUS_CODES[405]);
  t.equal(body.message, `${method} ${path} is not allowed: this path answers ${allow} (also in the Allow header). The API is listed at /docs and /openapi.json.`);
}

t.test('every documented path: the methods it lacks are 405 with Allow, OPTIONS is 204 with Allow', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const spec = parse(readFileSync(new URL('../../openapi.yaml', import.meta.url), 'utf8')) as { paths: Record<string, Record<string, unknown>> };
  t.ok(Object.keys(spec.paths).length >= 12, 'the document has the paths');
  for (const [template, operations] of Object.entries(spec.paths)) {
    const path = template.replace('{id}', 'some-shard');
    const documented = Object.keys(operations).map((method) => method.toUpperCase());
    // Fastify answers HEAD wherever there is a GET; every known path answers OPTIONS.
    const answered = [...documented, ...(documented.includes('GET') ? ['HEAD'] : []), 'OPTIONS'];
    const allow = [...answered].sort().join(', ');
    for (const method of METHODS.filter((m) => !answered.includes(m))) {
      const res = await app.inject({ method: method as InjectOptions['method'], url: `${path}?x=1`, ...(method === 'QUERY' ? { headers: { 'content-type': 'application/json' }, payload: '{}' } : {}) });
      check405(t, res, method, path, allow);
    }
    const options = await app.inject({ method: 'OPTIONS', url: path });
    t.equal(options.statusCode, 204, `OPTIONS ${path}: 204`);
    t.equal(options.headers.allow, allow, `OPTIONS ${path}: Allow`);
    t.equal(options.body, '', `OPTIONS ${path}: no body`);
    t.same(Object.keys(options.headers).filter((name) => name.startsWith('access-control-')), [], 'no CORS header: a cross-origin preflight still fails');
  }
});

t.test('the exact answers a user meets: POST /gpus, PATCH /shards/x, GET of a POST-only path', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const post = await app.inject({ method: 'POST', url: '/gpus', headers: { 'content-type': 'application/json' }, payload: '{}' });
  t.same(post.json(), {
    statusCode: 405,
    code: 'NODECOMPUTE_METHOD_NOT_ALLOWED',
    error: 'Method Not Allowed',
    message: 'POST /gpus is not allowed: this path answers GET, HEAD, OPTIONS (also in the Allow header). The API is listed at /docs and /openapi.json.',
  });
  t.equal(post.headers.allow, 'GET, HEAD, OPTIONS');
  check405(t, await app.inject({ method: 'PATCH', url: '/shards/x', headers: { 'content-type': 'application/json' }, payload: '{"gpus": [1]}' }), 'PATCH', '/shards/x', 'DELETE, GET, HEAD, OPTIONS, PUT');
  check405(t, await app.inject({ method: 'GET', url: '/shards/x/engine-output' }), 'GET', '/shards/x/engine-output', 'OPTIONS, POST');
  check405(t, await app.inject({ method: 'HEAD', url: '/shards/x/engine-output' }), 'HEAD', '/shards/x/engine-output', 'OPTIONS, POST');
  check405(t, await app.inject({ method: 'DELETE', url: '/shards' }), 'DELETE', '/shards', 'GET, HEAD, OPTIONS');
  check405(t, await app.inject({ method: 'PROPFIND' as InjectOptions['method'], url: '/shards/x' }), 'PROPFIND', '/shards/x', 'DELETE, GET, HEAD, OPTIONS, PUT');
  const propfind = await app.inject({ method: 'PROPFIND' as InjectOptions['method'], url: '/nope' });
  t.equal(propfind.json().message, 'No route PROPFIND /nope. The API is listed at /docs and /openapi.json.', 'a WebDAV method on a missing path: 404');
});

t.test('the undocumented paths too: /openapi.json and the /docs pages, wildcard included', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  for (const path of ['/openapi.json', '/docs', '/docs/', '/docs/json', '/docs/static/index.html', '/docs/static/some/asset.css']) {
    check405(t, await app.inject({ method: 'POST', url: path, headers: { 'content-type': 'text/plain' }, payload: 'x' }), 'POST', path, 'GET, HEAD, OPTIONS');
  }
});

t.test('the method is refused before the body is read: no 400, 413 or 415 about a body the path would never take', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const bodies: Array<[string, Record<string, string>, string]> = [
    ['broken JSON', { 'content-type': 'application/json' }, '{"pid": '],
    ['a type no route takes', { 'content-type': 'application/xml' }, '<shard/>'],
    ['over the 64 KiB body limit', { 'content-type': 'application/json' }, JSON.stringify({ pad: 'x'.repeat(70_000) })],
    ['an empty JSON body', { 'content-type': 'application/json' }, ''],
  ];
  for (const [name, headers, payload] of bodies) {
    t.test(name, async (t) => check405(t, await app.inject({ method: 'POST', url: '/livez', headers, payload }), 'POST', '/livez', 'GET, HEAD, OPTIONS'));
  }
});

t.test('writes are refused as writes would be: a wrong method from the network is 405, and changes nothing', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'PATCH', url: '/shards/x', remoteAddress: '10.1.2.3', headers: { 'content-type': 'application/json' }, payload: '{}' });
  check405(t, res, 'PATCH', '/shards/x', 'DELETE, GET, HEAD, OPTIONS, PUT');
  t.equal((await app.inject({ method: 'GET', url: '/shards/x' })).statusCode, 404, 'no shard x came to be');
});

t.test('the methods a path has still work, and paths that do not exist stay 404', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  t.equal((await app.inject({ method: 'GET', url: '/livez' })).statusCode, 200);
  t.equal((await app.inject({ method: 'HEAD', url: '/livez' })).statusCode, 200);
  t.equal((await app.inject({ method: 'DELETE', url: '/shards/nope' })).json().code, 'NODECOMPUTE_SHARD_NOT_FOUND');
  for (const [method, url] of [
    ['POST', '/nope'],
    ['OPTIONS', '/nope'],
    ['GET', '/gpu'],
    ['PATCH', '/shards/a/b'],
    ['OPTIONS', '/shards/a/b'],
    ['DELETE', '/shards/x/secrets'],
  ] as const) {
    const res = await app.inject({ method, url });
    t.equal(res.statusCode, 404, `${method} ${url}`);
    t.equal(res.json().code, 'NODECOMPUTE_NOT_FOUND');
    t.notOk(res.headers.allow, 'no Allow on a 404');
  }
});

t.test('the hidden routes stay out of the OpenAPI document', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const spec = (await app.inject({ method: 'GET', url: '/openapi.json' })).json() as { paths: Record<string, Record<string, unknown>> };
  t.same(Object.keys(spec.paths['/gpus']!), ['get']);
  t.same(Object.keys(spec.paths['/shards/{id}']!).sort(), ['delete', 'get', 'put']);
  t.notOk(Object.values(spec.paths).some((item) => 'options' in item || 'patch' in item || 'trace' in item));
});

t.test('a path that answers every method gets no hidden route; routes added after sealing are not collected', async (t) => {
  const app = Fastify() as unknown as App;
  t.teardown(() => app.close());
  const seal = answerOtherMethods(app);
  app.all('/any', async () => 'any');
  app.get('/one', async () => 'one');
  seal();
  app.get('/late', async () => 'late');
  for (const method of METHODS) t.equal((await app.inject({ method: method as InjectOptions['method'], url: '/any', ...(method === 'QUERY' ? { headers: { 'content-type': 'text/plain' }, payload: 'q' } : {}) })).statusCode, 200, `${method} /any`);
  t.equal((await app.inject({ method: 'POST', url: '/one' })).statusCode, 405);
  t.equal((await app.inject({ method: 'POST', url: '/late' })).statusCode, 404, 'a route added after sealing has no 405 of its own');
});
