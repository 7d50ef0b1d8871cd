// What Fastify itself reports about failed answers reaches the service's log, with the request it
// belongs to: through the app for the failures a test can cause on demand (a stream that breaks
// after its headers, a client that leaves mid-answer), and on the
// controller itself for the two that need a broken error path inside Fastify.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import t, { type Test } from 'tap';
import { buildApp } from '../src/app.js';
import { defaultConfig } from '../src/config.js';
import { ServiceLogController } from '../src/fastify-log.js';
import { waitUntil } from './helpers/fake-nvidia-smi.js';
import { captureLog } from './helpers/log-capture.js';

async function appWith(t: Test, logger: Logger) {
  const dir = t.testdir({});
  const app = await buildApp(defaultConfig({ stateFile: `${dir}/s.json`, nvidiaSmi: `${dir}/missing` }), { logger });
  t.teardown(() => app.close());
  return app;
}

/** A body that sends `first`, then fails with `error` (or, when null, never ends). */
function breakingBody(first: string, error: Error | null): Readable {
  return new Readable({
    read() {
      if (this.readableLength > 0 || this.destroyed) return;
      this.push(first);
      if (error) setImmediate(() => this.destroy(error));
    },
  });
}

t.test('an answer that breaks after its headers: a warning with the request, saying the client got a cut-off response', async (t) => {
  const { lines, log } = captureLog();
  const app = await appWith(t, log);
  app.get('/test/breaks', (_request, reply) => reply.type('text/plain').send(breakingBody('partial', new Error('disk went away'))));
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  const outcome = await new Promise<string>((resolve) => {
    http
      .get({ host: '127.0.0.1', port, path: '/test/breaks' }, (res) => {
        res.resume();
        res.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
        res.on('end', () => resolve('ended'));
      })
      .on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
  t.not(outcome, 'ended', `the client saw the cut (${outcome})`);
  await waitUntil(() => lines.some((line) => line.level === 40), { what: 'the warning' });
  t.match(lines.find((line) => line.level === 40), {
    reqId: String,
    method: 'GET',
    url: '/test/breaks',
    err: { message: 'disk went away' },
    msg: /after its headers were sent, so the client got a cut-off response/,
  });
});

t.test('a client that leaves before the answer is complete: a debug line, not a warning', async (t) => {
  const { lines, log } = captureLog();
  const app = await appWith(t, log);
  app.get('/test/endless', (_request, reply) => reply.type('text/plain').send(breakingBody('first part', null)));
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  await new Promise<void>((resolve) => {
    const request = http.get({ host: '127.0.0.1', port, path: '/test/endless' }, (res) => res.once('data', () => request.destroy()));
    request.on('close', resolve).on('error', () => {});
  });
  await waitUntil(() => lines.some((line) => /closed the connection before the answer was complete/.test(line.msg)), { what: 'the debug line' });
  t.match(lines.find((line) => /closed the connection/.test(line.msg)), { level: 20, url: '/test/endless' });
  t.notOk(lines.some((line) => line.level >= 40), 'no warning for a client that went away');
});

t.test('the failures inside Fastify\'s own error path are logged with the request', async (t) => {
  const { lines, log } = captureLog('trace');
  const controller = new ServiceLogController(log);
  const request = { id: 'req-7', method: 'GET', url: '/gpus' } as FastifyRequest;
  const reply = {} as FastifyReply;
  controller.writeHeadError(Object.assign(new Error('Invalid character in header'), { code: 'ERR_INVALID_CHAR' }), request, reply);
  controller.serializerError(new Error('no schema for 500'), request, reply, { statusCode: 500 });
  controller.incomingRequest();
  controller.requestCompleted();
  t.match(lines, [
    { level: 40, reqId: 'req-7', method: 'GET', url: '/gpus', err: { message: 'Invalid character in header' }, msg: /headers of an error answer/ },
    { level: 50, reqId: 'req-7', statusCode: 500, err: { message: 'no schema for 500' }, msg: /this is a bug in nodecompute, please report it/ },
  ]);
  t.equal(lines.length, 2, 'ordinary requests log nothing here');
});
