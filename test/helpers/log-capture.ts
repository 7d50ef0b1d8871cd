// Owns how a test reads back what the service logs: a pino logger at a chosen level that keeps
// every line it writes, parsed, in the order written.
import { pino } from 'pino';

/** A log line as pino writes it: its level (20 debug, 30 info, 40 warn, 50 error), its message, its other fields. */
export type LogLine = Record<string, unknown> & { level: number; msg: string };

export function captureLog(level = 'debug') {
  const lines: LogLine[] = [];
  const log = pino({ level }, { write: (line: string) => void lines.push(JSON.parse(line) as LogLine) });
  /** The message of every line written so far. */
  const messages = () => lines.map((line) => line.msg);
  return { log, lines, messages };
}
