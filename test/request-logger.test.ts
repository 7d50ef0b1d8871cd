// The per-request logger builds its pino child only when the request logs, and then logs exactly
// what an eager child would: the parent's bindings, the request's, the level it was given.
import t from 'tap';
import { pino } from 'pino';
import type { FastifyBaseLogger } from 'fastify';
import { deferredChildLogger } from '../src/request-logger.js';

function parent(level = 'trace') {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level, base: { service: 'nodecompute' } }, { write: (line: string) => lines.push(JSON.parse(line) as Record<string, unknown>) });
  let children = 0;
  const child = logger.child.bind(logger);
  const counted = Object.assign(Object.create(logger) as typeof logger, {
    child: (...args: Parameters<typeof child>) => {
      children += 1;
      return child(...args);
    },
  });
  return { logger: counted as unknown as FastifyBaseLogger, lines, children: () => children };
}

t.test('no child is built for a request that does not log', async (t) => {
  const p = parent();
  const log = deferredChildLogger(p.logger, { reqId: 'req-1' }, {});
  t.equal(log.level, 'trace', 'its level is the parent\'s');
  t.equal(p.children(), 0);
});

t.test('every level logs through one child with the request id', async (t) => {
  const p = parent();
  const log = deferredChildLogger(p.logger, { reqId: 'req-7' }, {});
  const methods = ['fatal', 'error', 'warn', 'info', 'debug', 'trace'] as const;
  for (const method of methods) log[method]({ n: method }, `via ${method}`);
  log.silent('never written');
  t.equal(p.children(), 1, 'built once, on the first line');
  t.same(
    p.lines.map((line) => [line.reqId, line.service, line.n, line.msg]),
    methods.map((method) => ['req-7', 'nodecompute', method, `via ${method}`]),
  );
});

t.test('a route log level applies, and a level set later sticks', async (t) => {
  const p = parent('info');
  const log = deferredChildLogger(p.logger, { reqId: 'req-2' }, { level: 'warn' });
  t.equal(log.level, 'warn', 'the route\'s level before anything is built');
  log.info('dropped at warn');
  log.warn('kept');
  log.level = 'error';
  t.equal(log.level, 'error');
  log.warn('dropped at error');
  t.same(p.lines.map((line) => line.msg), ['kept']);
});

t.test('children of the request logger carry both sets of bindings', async (t) => {
  const p = parent();
  const log = deferredChildLogger(p.logger, { reqId: 'req-3' }, {});
  log.child({ component: 'auth' }).info('nested');
  t.same([p.lines[0]?.reqId, p.lines[0]?.component, p.lines[0]?.msg], ['req-3', 'auth', 'nested']);
});
