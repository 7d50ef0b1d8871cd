// The server side of the HTTP benchmarks, run as a child process of bench/run.ts so the load
// generator's CPU and memory never count as the server's: nodecompute itself (buildApp with the
// given settings). The parent sends the spec over IPC; the child answers with its port, and later
// with its memory usage on request. It listens on 127.0.0.1 only. With `floor`, it is a bare Fastify
// instead, replaying captured answers (figure 1's reference, figures/floor.ts).
import Fastify from 'fastify';
import { buildApp } from '../src/app.js';
import { defaultConfig, type Config } from '../src/config.js';

/** An answer nodecompute gave, replayed as it was for the same path. */
export interface FloorAnswer {
  path: string;
  status: number;
  contentType: string;
  body: string;
}

export interface ServerSpec {
  config: Partial<Config>;
  floor?: FloorAnswer[];
}

export type ToServer = { type: 'start'; spec: ServerSpec } | { type: 'memory' } | { type: 'stop' };
export type FromServer =
  | { type: 'listening'; port: number }
  | { type: 'memory'; usage: NodeJS.MemoryUsage }
  | { type: 'error'; message: string };

function send(message: FromServer): void {
  process.send?.(message);
}

async function start(spec: ServerSpec) {
  if (spec.floor) return startFloor(spec.floor);
  const app = await buildApp(defaultConfig({ ...spec.config, host: '127.0.0.1', port: 0 }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  return app;
}

async function startFloor(answers: FloorAnswer[]) {
  const app = Fastify();
  for (const answer of answers) {
    app.get(answer.path, async (_request, reply) => reply.status(answer.status).type(answer.contentType).send(answer.body));
  }
  await app.listen({ host: '127.0.0.1', port: 0 });
  return app;
}

let running: Awaited<ReturnType<typeof start>> | null = null;

process.on('message', (message: ToServer) => {
  if (message.type === 'start') {
    start(message.spec).then(
      (app) => {
        running = app;
        const address = app.server.address();
        send({ type: 'listening', port: typeof address === 'object' && address ? address.port : 0 });
      },
      (err: Error) => send({ type: 'error', message: err.stack ?? err.message }),
    );
  } else if (message.type === 'memory') {
    send({ type: 'memory', usage: process.memoryUsage() });
  } else if (message.type === 'stop') {
    const closing = running ? running.close() : Promise.resolve();
    void closing.finally(() => process.exit(0));
  }
});
// Without a parent there is nothing to serve; with one, leave when it goes.
process.on('disconnect', () => process.exit(0));
if (!process.send) {
  process.stderr.write('bench/server.js is started by bench/run.js over IPC\n');
  process.exit(2);
}
