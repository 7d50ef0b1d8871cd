// Talks HTTP/1.1 over a bare TCP socket, for the requests fetch and inject cannot send: a lying
// Content-Length, raw `..` path segments, headers that contradict each other. Loopback only.
import { connect } from 'node:net';

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

export interface RawExchange {
  responses: RawResponse[];
  /** Everything the server sent, as text. */
  text: string;
  /** The socket ended with an error (ECONNRESET, ...) rather than a clean close. */
  error: string | null;
}

/**
 * Writes `chunks` (a pause between each), optionally half-closes, and collects what comes back
 * until the server closes or `timeoutMs` passes.
 */
export function rawHttp(
  port: number,
  chunks: string[],
  { halfClose = false, pauseMs = 100, timeoutMs = 10_000 }: { halfClose?: boolean; pauseMs?: number; timeoutMs?: number } = {},
): Promise<RawExchange> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    let text = '';
    let error: string | null = null;
    const timer = setTimeout(() => socket.destroy(), timeoutMs);
    socket.setEncoding('latin1');
    socket.on('data', (data: string) => (text += data));
    socket.on('error', (err) => (error = (err as NodeJS.ErrnoException).code ?? err.message));
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ responses: parseResponses(text), text, error });
    });
    socket.on('connect', async () => {
      for (const [i, chunk] of chunks.entries()) {
        if (i > 0) await new Promise((r) => setTimeout(r, pauseMs));
        if (socket.destroyed) return;
        socket.write(chunk, 'latin1');
      }
      if (halfClose && !socket.destroyed) socket.end();
    });
  });
}

/** Splits a byte stream into HTTP/1.1 responses (Content-Length framed; nodecompute never chunks errors). */
export function parseResponses(text: string): RawResponse[] {
  const responses: RawResponse[] = [];
  let rest = text;
  while (rest.startsWith('HTTP/')) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const [statusLine, ...headerLines] = rest.slice(0, end).split('\r\n');
    const headers: Record<string, string> = {};
    for (const line of headerLines) {
      const colon = line.indexOf(':');
      headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    const length = Number(headers['content-length'] ?? 0);
    // latin1: one character per byte, so Content-Length counts characters here.
    const body = Buffer.from(rest.slice(end + 4, end + 4 + length), 'latin1').toString('utf8');
    responses.push({ status: Number(statusLine!.split(' ')[1]), headers, body });
    rest = rest.slice(end + 4 + length);
  }
  return responses;
}
