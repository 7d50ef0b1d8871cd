// Owns one repair to Node's graceful close: no answer is cut because the service is stopping, unless
// its reader is too slow to take it within a bounded time.
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
// that takes longer than maxWaitMs (one that stopped reading, say) has its connection destroyed then,
// so the close still completes well within the shutdown's grace delay (main.ts).
import type { Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** The answer Node is writing on a connection (Node's own field; null between requests). */
type HttpSocket = Socket & { _httpMessage?: ServerResponse | null };

export interface SpareOptions {
  /** How long a spared answer may take to be written out before its connection is destroyed. */
  maxWaitMs: number;
  /** Told when that happens, with the bytes of the answer still queued in this process. */
  onCut: (bytesLeft: number) => void;
}

export function spareUnflushedAnswers(server: Server, { maxWaitMs, onCut }: SpareOptions): void {
  // Connections, not requests, are tracked: one listener per connection, nothing per request.
  const sockets = new Set<HttpSocket>();
  server.on('connection', (socket: HttpSocket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  const deadlines = new WeakSet<HttpSocket>();
  const bound = (socket: HttpSocket): void => {
    if (deadlines.has(socket)) return;
    deadlines.add(socket);
    const timer = setTimeout(() => {
      onCut(socket.writableLength);
      socket.destroy();
    }, maxWaitMs);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
  };
  const closeIdle = server.closeIdleConnections.bind(server);
  server.closeIdleConnections = () => {
    const spared: ServerResponse[] = [];
    for (const socket of sockets) {
      const answer = socket._httpMessage;
      if (!answer || !answer.writableEnded || answer.writableFinished) continue;
      // `finished` is a plain field on Node 20 and 24; should a later Node make it read-only, the
      // sweep goes on as Node's own and may cut the answer, as it did before this repair.
      try {
        answer.finished = false;
      } catch {
        continue;
      }
      spared.push(answer);
      bound(socket);
    }
    try {
      closeIdle();
    } finally {
      for (const answer of spared) answer.finished = true;
    }
  };
}
