// buildApp's defaults: with no deps it makes its own logger and readers from the config alone.
import { join } from 'node:path';
import t from 'tap';
import { buildApp, writeClientError } from '../src/app.js';
import { defaultConfig } from '../src/config.js';

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
});

t.test('at debug level every answered request is logged; below it, only 5xx', async (t) => {
  const dir = t.testdir({});
  const lines: string[] = [];
  const { pino } = await import('pino');
  const logger = pino({ level: 'debug' }, { write: (line: string) => lines.push(line) });
  const app = await buildApp(defaultConfig({ stateFile: join(dir, 's.json'), nvidiaSmi: join(dir, 'missing') }), { logger });
  t.teardown(() => app.close());
  await app.inject({ method: 'GET', url: '/livez' });
  t.ok(lines.some((line) => line.includes('"url":"/livez"') && line.includes('"level":20') && line.includes('Request answered')));
});
