// The HTML answers carry nosniff and a Content-Security-Policy: the status page may run no script
// and load nothing; /docs only its own assets. JSON answers are left as they are.
import t from 'tap';
import { buildTestApp } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';

const directives = (header: unknown) => new Map(String(header).split(';').map((part) => part.trim().split(/\s+/)).map(([name, ...values]) => [name!, values]));

t.test('the status page: no script, no external asset, nosniff, in HTML and text alike', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  for (const accept of ['text/html', 'text/plain']) {
    const res = await app.inject({ method: 'GET', url: '/', headers: { accept } });
    t.equal(res.statusCode, 200);
    t.equal(res.headers['x-content-type-options'], 'nosniff', accept);
    const csp = directives(res.headers['content-security-policy']);
    t.same(csp.get('default-src'), ["'none'"], `${accept}: nothing loads by default, scripts included`);
    t.notOk(csp.has('script-src'), 'no script source is allowed');
    t.same(csp.get('frame-ancestors'), ["'none'"]);
  }
  const html = await app.inject({ method: 'GET', url: '/', headers: { accept: 'text/html' } });
  t.notMatch(html.body, /<script/i, 'the page itself holds no script');
});

t.test('/docs: its own assets only, nosniff on the page and its files', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  for (const url of ['/docs/', '/docs/static/swagger-initializer.js', '/docs/static/index.css', '/docs/static/swagger-ui-bundle.js']) {
    const res = await app.inject({ method: 'GET', url });
    t.equal(res.statusCode, 200, url);
    t.equal(res.headers['x-content-type-options'], 'nosniff', url);
    const csp = directives(res.headers['content-security-policy']);
    t.same(csp.get('default-src'), ["'self'"], url);
    t.same(csp.get('script-src'), ["'self'"], `${url}: scripts from /docs itself only`);
    t.notMatch(String(res.headers['content-security-policy']), /https?:|\*/, `${url}: no other origin`);
  }
});

t.test('JSON answers carry no CSP', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const res = await app.inject({ method: 'GET', url: '/livez' });
  t.equal(res.headers['content-security-policy'], undefined);
});
