// Closing never cuts an answer that is still being written out, unless its reader takes too long:
// on a plain Node server with the repair, and through the app's own close. Each case checks that
// the answer really was ended and not yet written out when the sweep ran (a reader paused on a
// 16 MiB answer, where loopback buffered about 4 MiB for a paused reader here), so that a whole body
// proves the repair, not a fast reader.
import http from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import t, { type Test } from 'tap';
import { spareUnflushedAnswers, type SpareOptions } from '../src/unflushed-answers.js';
import { buildTestApp } from './helpers/app.js';
import { eightGpuNode, waitUntil } from './helpers/fake-nvidia-smi.js';
import { captureLog } from './helpers/log-capture.js';

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
function endedState(answer: http.ServerResponse): { unflushedAtSweep: boolean } {
  return { unflushedAtSweep: answer.writableEnded && !answer.writableFinished };
}

const neverCut: SpareOptions = { maxWaitMs: 60_000, onCut: () => t.fail('no answer should be cut') };

/** A plain server answering `body`, repaired with `options`, closed on request. */
async function plainServer(t: Test, body: Buffer, options: SpareOptions) {
  const answers: http.ServerResponse[] = [];
  const server = http.createServer((_request, answer) => {
    answer.setHeader('content-length', body.length);
    answer.end(body);
    answers.push(answer);
  });
  server.keepAliveTimeout = 1;
  spareUnflushedAnswers(server, options);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const closed = new Promise<void>((resolve) => server.once('close', resolve));
  t.teardown(() => server.close());
  return { server, answers, closed, port: (server.address() as AddressInfo).port };
}

/**
 * Waits until the server has ended its answer and Node counts the connection as idle (once the
 * request has been parsed to its end; in the handler it is not yet), then sweeps and closes.
 */
async function sweepWhenEnded(server: http.Server, answers: http.ServerResponse[]) {
  await waitUntil(() => answers.length === 1 && answers[0]!.writableEnded, { what: 'the answer to be ended' });
  await new Promise((resolve) => setTimeout(resolve, 50));
  const atSweep = endedState(answers[0]!);
  server.closeIdleConnections();
  server.close();
  return atSweep;
}

t.test('a plain Node server with the repair: the slow reader gets the whole answer, and close completes after it', async (t) => {
  const { server, answers, closed, port } = await plainServer(t, Buffer.alloc(BODY_BYTES, 0x61), neverCut);
  let swept!: () => void;
  const read = slowRead(port, '/', new Promise<void>((resolve) => (swept = resolve)));
  const atSweep = await sweepWhenEnded(server, answers);
  t.equal(answers[0]!.finished, true, 'a spared answer reads as finished again after the sweep');
  swept();
  t.same(atSweep, { unflushedAtSweep: true }, 'the answer was ended but not written out when the sweep ran');
  t.same(await read, { bodyBytes: BODY_BYTES, error: null }, 'every byte arrived, and the connection closed cleanly');
  await closed;
});

t.test('a reader that never reads: its connection is destroyed after maxWaitMs, the cut reported, and the close completes', async (t) => {
  const cuts: number[] = [];
  const { server, answers, closed, port } = await plainServer(t, Buffer.alloc(BODY_BYTES, 0x61), { maxWaitMs: 300, onCut: (left) => cuts.push(left) });
  const socket = connect(port, '127.0.0.1');
  socket.pause();
  socket.on('error', () => {});
  socket.write('GET / HTTP/1.1\r\nHost: test\r\n\r\n');
  t.teardown(() => socket.destroy());
  const atSweep = await sweepWhenEnded(server, answers);
  t.same(atSweep, { unflushedAtSweep: true }, 'spared by the sweep');
  server.closeIdleConnections();
  await closed;
  t.equal(cuts.length, 1, 'one cut reported, though the sweep ran twice');
  t.ok(cuts[0]! > 0, `with the bytes left unwritten (${cuts[0]})`);
});

t.test('should `finished` become read-only in a later Node, the sweep still runs as Node\'s own', async (t) => {
  const { server, answers, closed, port } = await plainServer(t, Buffer.alloc(BODY_BYTES, 0x61), neverCut);
  const read = slowRead(port, '/', closed);
  await waitUntil(() => answers.length === 1, { what: 'the answer' });
  Object.defineProperty(answers[0]!, 'finished', { get: () => true });
  await waitUntil(() => answers[0]!.writableEnded, { what: 'the answer to be ended' });
  await new Promise((resolve) => setTimeout(resolve, 50));
  t.doesNotThrow(() => server.closeIdleConnections(), 'the sweep does not throw');
  server.close();
  await closed;
  await read;
});

t.test('the sweep still closes an idle keep-alive connection at once', async (t) => {
  const { server, port } = await plainServer(t, Buffer.from('ok'), neverCut);
  const connection = new Promise<Socket>((resolve) => server.once('connection', resolve));
  const agent = new http.Agent({ keepAlive: true });
  t.teardown(() => agent.destroy());
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
  let answer: http.ServerResponse | undefined;
  let swept!: () => void;
  const sweptPromise = new Promise<void>((resolve) => (swept = resolve));
  let atSweep: { unflushedAtSweep: boolean } | null = null;
  // Seen at the sweep itself, wherever in the close it runs.
  const repaired = app.server.closeIdleConnections.bind(app.server);
  app.server.closeIdleConnections = () => {
    if (answer && atSweep === null) atSweep = endedState(answer);
    repaired();
    swept();
  };
  // A large answer the service could give (a huge node's /gpus, /metrics).
  app.get('/test/large', (_request, reply) => {
    answer = reply.raw;
    void reply.type('application/octet-stream').send(body);
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const read = slowRead((app.server.address() as AddressInfo).port, '/test/large', sweptPromise);
  await waitUntil(() => answer?.writableEnded === true, { what: 'the answer to be ended' });
  await new Promise((resolve) => setTimeout(resolve, 50));
  const closing = app.close();
  t.same(await read, { bodyBytes: BODY_BYTES, error: null }, 'every byte arrived, and the connection closed cleanly');
  t.same(atSweep, { unflushedAtSweep: true }, 'the answer was ended but not written out when the sweep ran');
  await closing;
});

t.test("the app's close: a client that never reads is cut after 5 s, with a warning that says so", async (t) => {
  const { log: logger, lines } = captureLog('warn');
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { logger } });
  let answer: http.ServerResponse | undefined;
  app.get('/test/large', (_request, reply) => {
    answer = reply.raw;
    void reply.type('application/octet-stream').send(Buffer.alloc(BODY_BYTES, 0x63));
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const socket = connect((app.server.address() as AddressInfo).port, '127.0.0.1');
  socket.pause();
  socket.on('error', () => {});
  t.teardown(() => socket.destroy());
  socket.write('GET /test/large HTTP/1.1\r\nHost: test\r\n\r\n');
  await waitUntil(() => answer?.writableEnded === true, { what: 'the answer to be ended' });
  await new Promise((resolve) => setTimeout(resolve, 50));
  const started = Date.now();
  // The close completes once the server has destroyed its side (the paused client does not notice).
  await app.close();
  t.ok(Date.now() - started >= 4_900, `the close waited for the reader (${Date.now() - started} ms)`);
  t.match(lines, [{ level: 40, bytesLeft: Number, msg: /^Stopping: a client had not taken its whole answer 5 s after shutdown began/ }]);
  t.ok((lines[0]!.bytesLeft as number) > 0, 'with the bytes it did not get');
});
