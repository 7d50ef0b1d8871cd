// Closing never cuts an answer that is still being written out: on a plain Node server with the
// repair, and through the app's own close. Each case first checks that the answer really was ended
// and not yet written out when the close began (a reader paused on a 16 MiB answer, more than
// loopback's socket buffers hold), so that a whole body proves the repair, not a fast reader.
import http from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import t from 'tap';
import { spareUnflushedAnswers } from '../src/unflushed-answers.js';
import { buildTestApp } from './helpers/app.js';
import { eightGpuNode } from './helpers/fake-nvidia-smi.js';

// More than loopback's socket buffers hold at Linux's default limits (tcp_rmem 6 MiB + tcp_wmem 4 MiB).
const BODY_BYTES = 16 * 1024 * 1024;
const READER_PAUSE_MS = 500;

interface SlowRead {
  /** Body bytes received before the connection closed. */
  bodyBytes: number;
  error: string | null;
}

/**
 * Sends one keep-alive GET on a socket that reads nothing until READER_PAUSE_MS after `ended` (the
 * server has ended its answer), then reads until the server closes the connection.
 */
function slowRead(port: number, path: string, ended: Promise<void>): Promise<SlowRead> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let error: string | null = null;
    socket.pause();
    socket.on('data', (data: Buffer) => chunks.push(data));
    socket.on('error', (err: NodeJS.ErrnoException) => (error = err.code ?? err.message));
    socket.on('close', () => {
      const received = Buffer.concat(chunks);
      const head = received.indexOf('\r\n\r\n');
      resolve({ bodyBytes: head < 0 ? 0 : received.length - head - 4, error });
    });
    socket.write(`GET ${path} HTTP/1.1\r\nHost: test\r\n\r\n`);
    void ended.then(() => setTimeout(() => socket.resume(), READER_PAUSE_MS));
  });
}

/** Whether `answer` is ended with bytes still to write out, now. */
function endedState(answer: http.ServerResponse): { unflushedAtClose: boolean } {
  return { unflushedAtClose: answer.writableEnded && !answer.writableFinished };
}

t.test('a plain Node server with the repair: the slow reader gets the whole answer, and close completes after it', async (t) => {
  const body = Buffer.alloc(BODY_BYTES, 0x61);
  let endAnswer!: () => void;
  const ended = new Promise<void>((resolve) => (endAnswer = resolve));
  let atClose: { unflushedAtClose: boolean } | null = null;
  const server = http.createServer((_request, answer) => {
    answer.setHeader('content-length', body.length);
    answer.end(body);
    // Later, not in the handler: until its request has been parsed to the end, Node does not count
    // the connection as idle, and the sweep would pass it by with or without the repair.
    setTimeout(() => {
      atClose = endedState(answer);
      server.closeIdleConnections();
      t.equal(answer.finished, true, 'a spared answer reads as finished again after the sweep');
      server.close();
      endAnswer();
    }, 50);
  });
  server.keepAliveTimeout = 1;
  spareUnflushedAnswers(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const closed = new Promise<void>((resolve) => server.once('close', resolve));
  const read = await slowRead((server.address() as AddressInfo).port, '/', ended);
  t.same(atClose, { unflushedAtClose: true }, 'the answer was ended but not written out when the close began');
  t.same(read, { bodyBytes: BODY_BYTES, error: null }, 'every byte arrived, and the connection closed cleanly');
  await closed;
});

t.test('the sweep still closes an idle keep-alive connection at once', async (t) => {
  const server = http.createServer((_request, answer) => answer.end('ok'));
  spareUnflushedAnswers(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const connection = new Promise<import('node:net').Socket>((resolve) => server.once('connection', resolve));
  const agent = new http.Agent({ keepAlive: true });
  t.teardown(() => agent.destroy());
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve, reject) => http.get({ host: '127.0.0.1', port, agent }, (res) => res.resume().on('end', resolve)).on('error', reject));
  const socket = await connection;
  const started = Date.now();
  server.closeIdleConnections();
  t.ok(socket.destroyed, 'the idle connection was destroyed by the sweep itself');
  await new Promise<void>((resolve) => server.close(() => resolve()));
  // Left to Node's keep-alive timeout (5 s), an idle connection would hold the close that long.
  t.ok(Date.now() - started < 4_000, `closed in ${Date.now() - started} ms`);
});

t.test("the app's close: a slow reader of a large answer gets all of it", async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const body = Buffer.alloc(BODY_BYTES, 0x62);
  let endAnswer!: () => void;
  const ended = new Promise<void>((resolve) => (endAnswer = resolve));
  let atClose: { unflushedAtClose: boolean } | null = null;
  let closing: Promise<void> | undefined;
  // A large answer the service could give (a huge node's /gpus, /metrics): sent whole, then the app closes.
  app.get('/test/large', (_request, reply) => {
    reply.raw.once('prefinish', () => {
      atClose = endedState(reply.raw);
      closing = app.close();
      endAnswer();
    });
    void reply.type('application/octet-stream').send(body);
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const read = await slowRead((app.server.address() as AddressInfo).port, '/test/large', ended);
  t.same(atClose, { unflushedAtClose: true }, 'the answer was ended but not written out when the close began');
  t.same(read, { bodyBytes: BODY_BYTES, error: null }, 'every byte arrived, and the connection closed cleanly');
  await closing;
});
