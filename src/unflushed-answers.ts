// Owns one repair to Node's graceful close: no answer is cut because the service is stopping.
//
// Node's server.close() (and Fastify's close, with forceCloseConnections 'idle') destroys every
// connection it counts as idle. It counts one whose answer has been ended but is still being
// written out to a slow reader as idle, because it asks the answer's `finished`, which end() sets
// before the bytes are out (Node 20 and 24 alike). Measured: a reader that paused for half a second
// received 3.9 of an 8 MiB answer, then the connection closed, with no error on either side.
//
// The repair wraps this server's closeIdleConnections: for the sweep, an answer not yet written out
// in full reads as unfinished, so Node leaves its connection alone. The answer is then written out,
// and the short keep-alive timeout the app sets while closing ends the connection after it. A reader
// that never reads holds the close no longer than the shutdown's grace delay (main.ts).
import type { Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** The answer Node is writing on a connection (Node's own field; null between requests). */
type HttpSocket = Socket & { _httpMessage?: ServerResponse | null };

export function spareUnflushedAnswers(server: Server): void {
  // Connections, not requests, are tracked: one listener per connection, nothing per request.
  const sockets = new Set<HttpSocket>();
  server.on('connection', (socket: HttpSocket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  const closeIdle = server.closeIdleConnections.bind(server);
  server.closeIdleConnections = () => {
    const unflushed: ServerResponse[] = [];
    for (const socket of sockets) {
      const answer = socket._httpMessage;
      if (answer && answer.writableEnded && !answer.writableFinished) unflushed.push(answer);
    }
    for (const answer of unflushed) answer.finished = false;
    try {
      closeIdle();
    } finally {
      for (const answer of unflushed) answer.finished = true;
    }
  };
}
