// Owns the engine output kept per shard: a bounded tail of what was posted, in memory only (the
// engine can post it again), and the engine's account read from it (llama.cpp's and Ollama's only). A new run's
// output begins a new tail; a tail cut from the front keeps whole lines.
import type { EngineAccount } from './llama-account.js';
import { parseLlamaLog } from './llama-log.js';
import type { ShardRecord } from './shard.js';

export const ENGINE_TAIL_MAX_BYTES = 256 * 1024;

/** The engines whose output is read, as an account's summary names them. */
export const READ_ENGINES: Partial<Record<ShardRecord['engine'], string>> = { 'llama.cpp': 'llama.cpp', ollama: 'Ollama' };

/** Engine output posted; ticks are clock ticks since boot (the unit of /proc start times). */
export interface Posted {
  tail: string;
  /** When this tail was begun (null when /proc could not say): a cgroup shard whose processes all started after it has restarted since. */
  tailStartedAtTicks: number | null;
}

export type EngineState = Posted & { account: EngineAccount | null };

export function engineState(engine: ShardRecord['engine'], posted: Posted): EngineState {
  // Only llama.cpp's and Ollama's accounts are understood; other engines' output is kept for operators.
  const name = READ_ENGINES[engine];
  return { ...posted, account: name === undefined ? null : parseLlamaLog(posted.tail, name) };
}

/** `posted` with `text` appended (or begun afresh with it), posted at `ticks`. */
export function appended(posted: Posted | undefined, text: string, ticks: number | null, fresh: boolean): Posted {
  const begun = fresh || posted === undefined || posted.tail === '';
  return {
    tail: appendTail(begun ? '' : posted.tail, text),
    tailStartedAtTicks: begun ? ticks : posted.tailStartedAtTicks,
  };
}

function utf8Bytes(codePoint: number): number {
  if (codePoint < 0x80) return 1;
  if (codePoint < 0x800) return 2;
  return codePoint < 0x10000 ? 3 : 4;
}

/** previous + chunk, at most the last maxBytes of UTF-8: a cut starts at the first whole line left (if any), never inside a surrogate pair. */
export function appendTail(previous: string, chunk: string, maxBytes: number = ENGINE_TAIL_MAX_BYTES): string {
  const all = previous + chunk;
  if (!(maxBytes > 0)) return '';
  let excess = Buffer.byteLength(all, 'utf8') - maxBytes;
  if (excess <= 0) return all;
  let start = 0;
  while (excess > 0) {
    const codePoint = all.codePointAt(start) as number;
    excess -= utf8Bytes(codePoint);
    start += codePoint > 0xffff ? 2 : 1;
  }
  if (all[start - 1] !== '\n') {
    const newline = all.indexOf('\n', start);
    // Keep the cut mid-line when the only newline left is the last character.
    if (newline >= 0 && newline + 1 < all.length) start = newline + 1;
  }
  return all.slice(start);
}
