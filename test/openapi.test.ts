// openapi.yaml must equal the spec generated from the route schemas; /openapi.json and /docs serve it.
import { readFileSync } from 'node:fs';
import t from 'tap';
import { isAlias, parse, parseDocument, visit } from 'yaml';
import { Type } from '@sinclair/typebox';
import { generateOpenApiYaml } from '../src/app.js';
import { Ref } from '../src/schemas/common.js';
import { eightGpuNode } from './helpers/fake-nvidia-smi.js';
import { buildTestApp } from './helpers/app.js';

t.test('openapi.yaml equals the generated spec (run `npm run openapi` after changing a route)', async (t) => {
  const committed = readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8');
  t.equal(committed, await generateOpenApiYaml());
});

/** Every object in `node` (the node itself included), with its JSON pointer. */
function* objects(node: unknown, pointer = ''): Generator<[string, Record<string, unknown>]> {
  if (typeof node !== 'object' || node === null) return;
  if (!Array.isArray(node)) yield [pointer, node as Record<string, unknown>];
  for (const [key, value] of Object.entries(node)) yield* objects(value, `${pointer}/${key}`);
}

/** `node`, or what its $ref points to in `spec` (a local reference: #/components/...). */
function resolve<T>(spec: unknown, node: T | { $ref: string }): T {
  if (typeof node !== 'object' || node === null || !('$ref' in node)) return node as T;
  return node.$ref
    .slice(2)
    .split('/')
    .reduce<unknown>((at, key) => (at as Record<string, unknown>)[key], spec) as T;
}

t.test('the shared shapes are components, each written once and named by $ref', async (t) => {
  const text = readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8');
  const spec = parse(text) as {
    components: { schemas: Record<string, { properties?: Record<string, unknown> }>; headers: object; parameters: object };
    paths: Record<string, Record<string, { parameters: Array<{ $ref?: string }> }>>;
  };
  const schemas = spec.components.schemas;
  t.same(Object.keys(schemas), [
    'Error',
    'SnapshotMeta',
    'Gpu',
    'GpuProcess',
    'GpuUnreachable',
    'GpuEvents',
    'MigDevice',
    'LostGpu',
    'LostGpus',
    'ForeignMemoryGpu',
    'ShardRecord',
    'ShardStatus',
    'ShardSnapshot',
    'Readiness',
    'ReadinessProbe',
    'ShardCompute',
    'ShardGpuUsage',
    'ShardWeights',
    'ModelFile',
    'EngineAccount',
  ]);
  const refs = [...objects(spec)].flatMap(([, node]) => (typeof node.$ref === 'string' ? [node.$ref] : []));
  t.same(Object.keys(spec.components.headers), ['ETag', 'CacheControl', 'NvidiaSmiRetryAfter', 'StateRetryAfter']);
  t.same(Object.keys(spec.components.parameters), ['IfNoneMatch', 'IfMatch', 'IfNoneMatchWrite']);
  for (const method of ['put', 'delete']) {
    const names = spec.paths['/shards/{id}']![method]!.parameters.map((parameter) => parameter.$ref).filter(Boolean);
    t.same(names, ['#/components/parameters/IfMatch', '#/components/parameters/IfNoneMatchWrite'], `${method}: its preconditions`);
  }
  const components = Object.entries(spec.components).flatMap(([kind, named]) => (kind === 'securitySchemes' ? [] : Object.keys(named).map((name) => `#/components/${kind}/${name}`)));
  t.same(refs.filter((ref) => !components.includes(ref)), [], 'every $ref names a component');
  for (const ref of components) t.ok(refs.includes(ref), `${ref.slice('#/components/'.length)}: referenced`);
  const prefix = '#/components/schemas/';
  // A component's fields, written out anywhere else, would be an inlined copy.
  const fields = (node: Record<string, unknown>) => JSON.stringify(node.properties);
  const withProperties = [...objects(spec)].filter(([, node]) => typeof node.properties === 'object' && node.properties !== null);
  for (const [name, schema] of Object.entries(schemas)) {
    if (!schema.properties) continue;
    const at = withProperties.filter(([, node]) => fields(node) === fields(schema)).map(([pointer]) => pointer);
    t.same(at, [`/components/schemas/${name}`], `${name}: written once`);
  }
  t.equal(refs.filter((ref) => ref === `${prefix}Gpu`).length, 1, 'Gpu: one $ref (GET /gpus)');
  t.equal(refs.filter((ref) => ref === `${prefix}Error`).length, 34, 'Error: 34 $refs');
  let aliases = 0;
  visit(parseDocument(text), { Alias: () => void aliases++ });
  t.equal(aliases, 0, 'no YAML aliases');
  t.notMatch(text, /(:|-) [&*][A-Za-z]/, 'no YAML anchors');
  t.notOk(isAlias(parseDocument(text).contents), 'a plain document');
});

t.test('/openapi.json serves the same document and every route declares its error answers', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/openapi.json' });
  t.equal(res.statusCode, 200);
  const spec = res.json();
  t.same(spec, parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')));
  t.ok(spec.components.schemas.Error, 'the error body is one named schema');
  const nvidiaSmi503 = ['/gpus', '/gpus/foreign-memory', '/shards/{id}/compute'];
  for (const path of nvidiaSmi503) {
    t.ok(spec.paths[path].get.responses['503'], `${path} declares its 503`);
  }
  const retryAfter = Object.entries(spec.paths as Record<string, Record<string, { responses: Record<string, { headers?: Record<string, { $ref: string }> }> }>>).flatMap(([path, item]) =>
    Object.entries(item).flatMap(([method, op]) => {
      const header = op.responses['503']?.headers?.['Retry-After'];
      return header ? [[`${method} ${path}`, resolve<{ description: string }>(spec, header).description] as const] : [];
    }),
  );
  const nvidiaSmi = retryAfter.filter(([, description]) => description.startsWith('With a GPU driver failure')).map(([at]) => at);
  t.same(nvidiaSmi.sort(), [...nvidiaSmi503, '/readyz'].map((path) => `get ${path}`).sort(), "Retry-After of nvidia-smi's failure on the reads whose 503 it is, /readyz's included, not on a verdict");
  const stateFile = retryAfter.filter(([, description]) => description.startsWith('With NODECOMPUTE_STATE_WRITE_FAILED or NODECOMPUTE_STATE_WRITE_PENDING')).map(([at]) => at);
  t.same(stateFile.sort(), ['delete /shards/{id}', 'put /shards/{id}'], "Retry-After of the state file's failure on the writes whose 503 it is");
  t.equal(retryAfter.length, nvidiaSmi.length + stateFile.length, 'and nowhere else');
  t.ok(spec.paths['/shards/{id}'].put.responses['422'], 'PUT /shards/{id} declares 422');
  t.match(spec.paths['/shards/{id}/engine-output'].post.requestBody, { required: true, content: { 'text/plain': { schema: { type: 'string' } } } }, 'engine output is text/plain, read as bytes');
  t.notOk(spec.paths['/shards/{id}/engine-output'].post.requestBody.content['application/json']);
  const docs = await app.inject({ method: 'GET', url: '/docs/' });
  t.equal(docs.statusCode, 200);
  t.match(docs.headers['content-type'], /text\/html/);
});

t.test('every operation has its own operationId and every response a description, as client generators need', async (t) => {
  const spec = parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')) as {
    paths: Record<string, Record<string, { operationId?: string; responses: Record<string, { description?: string }> }>>;
  };
  const operations = Object.entries(spec.paths).flatMap(([path, item]) => Object.entries(item).map(([method, op]) => ({ at: `${method.toUpperCase()} ${path}`, op })));
  const ids = operations.map(({ op }) => op.operationId);
  for (const { at, op } of operations) {
    t.match(op.operationId, /^[a-z][A-Za-z]+$/, `${at}: ${op.operationId}`);
    for (const [status, response] of Object.entries(op.responses)) {
      t.ok(response.description && response.description !== 'Default Response', `${at} ${status} says what it is: ${response.description}`);
    }
  }
  t.equal(new Set(ids).size, ids.length, 'no two alike');
});

t.test('writes declare the bearer scheme; answers that can be 304 declare If-None-Match, ETag and a bodiless 304', async (t) => {
  const spec = parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')) as {
    components: { securitySchemes: Record<string, { type: string; scheme: string }> };
    paths: Record<string, Record<string, { security?: unknown; parameters?: Array<{ $ref: string }>; responses: Record<string, { content?: unknown; headers?: Record<string, { $ref: string }> }> }>>;
  };
  t.match(spec.components.securitySchemes.bearer, { type: 'http', scheme: 'bearer' });
  const operations = Object.entries(spec.paths).flatMap(([path, item]) => Object.entries(item).map(([method, op]) => ({ path, method, op })));
  const writes = operations.filter(({ method }) => ['put', 'post', 'delete'].includes(method));
  t.same(
    writes.map(({ method, path }) => `${method} ${path}`).sort(),
    ['delete /shards/{id}', 'post /shards/{id}/engine-output', 'put /shards/{id}'],
  );
  for (const { method, path, op } of writes) t.same(op.security, [{ bearer: [] }], `${method} ${path} needs the token`);
  for (const { method, path, op } of operations.filter(({ method }) => method === 'get')) t.notOk(op.security, `${method} ${path} needs none`);
  const pollable = operations.filter(({ op }) => op.responses['304']);
  t.same(pollable.map(({ path }) => path).sort(), ['/gpus', '/gpus/foreign-memory', '/shards', '/shards/{id}']);
  for (const { path, op } of pollable) {
    t.ok(op.parameters?.map((p) => resolve<{ name: string; in: string }>(spec, p)).some((p) => p.name === 'If-None-Match' && p.in === 'header'), `${path}: If-None-Match`);
    t.notOk(op.responses['304']!.content, `${path}: a 304 has no body`);
    for (const status of ['200', '304']) t.same(Object.keys(op.responses[status]!.headers ?? {}), ['ETag', 'Cache-Control'], `${path} ${status}: ETag and Cache-Control`);
    // conditional.ts: a digest of the content, with a suffix while nvidia-smi fails or is slow; not of the snapshot or its age.
    const etag = resolve<{ description: string }>(spec, op.responses['200']!.headers!.ETag!).description;
    t.match(etag, /a digest of what the answer says/, `${path}: the ETag is said to digest the content`);
    t.match(etag, /suffix .* the GPU driver fails or is far slower than usual/, `${path}: and to carry a suffix while nvidia-smi is in trouble`);
    t.notMatch(etag, /registry version|freshness/, `${path}: not the snapshot, a registry version or freshness`);
  }
});

t.test('a reference needs a component with an $id', async (t) => {
  t.throws(() => Ref(Type.String()), { message: /no \$id/ });
});
