// Owns the engine output kept per shard: a bounded tail of what was posted, in memory only (the
// engine can post it again), and the engine's account read from it (llama.cpp's and Ollama's only). A new run's
// output begins a new tail; a tail cut from the front keeps whole lines. Posts are one stream of UTF-8
// bytes: log shippers cut chunks anywhere, so a character split between two posts is read whole.
import type { EngineAccount } from './llama-account.js';
import { parseLlamaLog } from './llama-log.js';
import type { ShardRecord } from './shard.js';

export const ENGINE_TAIL_MAX_BYTES = 256 * 1024;

/** The engines whose output is read, as an account's summary names them. */
export const READ_ENGINES: Partial<Record<ShardRecord['engine'], string>> = { 'llama.cpp': 'llama.cpp', ollama: 'Ollama' };

/** Engine output posted; ticks are clock ticks since boot (the unit of /proc start times). */
export interface Posted {
  tail: string;
  /** The bytes of the character the last post ended inside (at most 3), which the next post completes. */
  pending: Buffer;
  /** When this tail was begun (null when /proc could not say): a cgroup shard whose processes all started after it has restarted since. */
  tailStartedAtTicks: number | null;
}

export type EngineState = Posted & { account: EngineAccount | null };

export function engineState(engine: ShardRecord['engine'], posted: Posted): EngineState {
  // Only llama.cpp's and Ollama's accounts are understood; other engines' output is kept for operators.
  const name = READ_ENGINES[engine];
  return { ...posted, account: name === undefined ? null : parseLlamaLog(posted.tail, name) };
}

export const NO_BYTES = Buffer.alloc(0);

/** A post read as text: its whole characters, and the bytes of one it ends inside. */
export interface Decoded {
  text: string;
  pending: Buffer;
}

/** Bytes that are not UTF-8 read as U+FFFD, as any UTF-8 reader shows them; a BOM is kept, as every other byte is. */
const UTF8 = new TextDecoder('utf-8', { ignoreBOM: true });

/** How many of the last bytes begin a character they do not finish (0 to 3): the next post may. */
function unfinished(bytes: Buffer): number {
  for (let back = 1; back <= Math.min(3, bytes.length); back += 1) {
    const byte = bytes[bytes.length - back]!;
    if (byte < 0x80) return 0;
    // A lead byte says how long its character is (11110xxx: 4 bytes, 1110xxxx: 3, 110xxxxx: 2).
    if (byte >= 0xc0) return back < (byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : 2) ? back : 0;
  }
  return 0;
}

/**
 * A post of `bytes` to `posted`, read on from the character its last post ended inside (not when
 * `fresh`: a new tail). Bytes that are not UTF-8 (a post that does not go on with that character
 * included) are kept as U+FFFD, not refused: a log sender would stop at a 400 for one stray byte.
 */
export function decodePost(posted: Posted | undefined, bytes: Buffer, fresh: boolean): Decoded {
  const pending = fresh || posted === undefined ? NO_BYTES : posted.pending;
  const all = pending.length === 0 ? bytes : Buffer.concat([pending, bytes]);
  const whole = all.length - unfinished(all);
  // A copy of the held bytes: a view would keep the whole body in memory.
  return { text: UTF8.decode(all.subarray(0, whole)), pending: Buffer.from(all.subarray(whole)) };
}

/** `posted` with `chunk` appended (or begun afresh with it), posted at `ticks`. */
export function appended(posted: Posted | undefined, chunk: Decoded, ticks: number | null, fresh: boolean): Posted {
  // A tail that holds no whole character yet has not begun: its start time is the first text's.
  const begun = fresh || posted === undefined || (posted.tail === '' && posted.pending.length === 0);
  return {
    tail: appendTail(begun ? '' : posted.tail, chunk.text),
    pending: chunk.pending,
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
