// openapi.yaml must equal the spec generated from the route schemas; /openapi.json and /docs serve it.
import { readFileSync } from 'node:fs';
import t from 'tap';
import { parse } from 'yaml';
import { generateOpenApiYaml } from '../src/openapi.js';
import { eightGpuNode } from './helpers/fake-nvidia-smi.js';
import { buildTestApp } from './helpers/app.js';

t.test('openapi.yaml equals the generated spec (run `npm run openapi` after changing a route)', async (t) => {
  const committed = readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8');
  t.equal(committed, await generateOpenApiYaml());
});

t.test('/openapi.json serves the same document and every route declares its error answers', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/openapi.json' });
  t.equal(res.statusCode, 200);
  const spec = res.json();
  t.same(spec, parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')));
  t.ok(spec.components.schemas.Error, 'the error body is one named schema');
  for (const path of ['/gpus', '/gpus/foreign-memory', '/shards/{id}/compute']) {
    t.ok(spec.paths[path].get.responses['503'], `${path} declares its 503`);
  }
  t.ok(spec.paths['/shards/{id}'].put.responses['422'], 'PUT /shards/{id} declares 422');
  const docs = await app.inject({ method: 'GET', url: '/docs/' });
  t.equal(docs.statusCode, 200);
  t.match(docs.headers['content-type'], /text\/html/);
});
