// Owns the engine output kept per shard: a bounded tail of what was posted, in memory only (the
// engine can post it again), and the engine's account read from it (llama.cpp's and Ollama's only). A new run's
// output begins a new tail; a tail cut from the front keeps whole lines. Posts are one stream of UTF-8
// bytes: log shippers cut chunks anywhere, so a character split between two posts is read whole, and
// bytes that are not UTF-8 are refused rather than kept mangled.
import { BadRequestError } from '../errors.js';
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

/** `bytes` as UTF-8 text up to a character they end inside; null when they are not UTF-8. */
function readUtf8(bytes: Buffer): Decoded | null {
  // fatal: a byte that is not UTF-8 throws, not U+FFFD; stream: a character cut at the end is held,
  // not replaced; ignoreBOM: a BOM is kept, as every other byte is.
  const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
  let text: string;
  try {
    text = decoder.decode(bytes, { stream: true });
  } catch {
    return null;
  }
  // Every character came whole from its own bytes, so the bytes past them are the ones held. A copy:
  // a view would keep the whole body in memory.
  return { text, pending: Buffer.from(bytes.subarray(Buffer.byteLength(text))) };
}

/**
 * A post of `bytes` to `posted`, read on from the character its last post ended inside (not when
 * `fresh`: a new tail). A post that does not complete that character begins anew: those bytes were the
 * cut-off end of the output before. Bytes that are not UTF-8 are a 400: nothing of the post is kept.
 */
export function decodePost(posted: Posted | undefined, bytes: Buffer, fresh: boolean): Decoded {
  const pending = fresh || posted === undefined ? NO_BYTES : posted.pending;
  const read = readUtf8(pending.length === 0 ? bytes : Buffer.concat([pending, bytes])) ?? (pending.length === 0 ? null : readUtf8(bytes));
  if (read !== null) return read;
  throw new BadRequestError(
    'This engine output is not UTF-8: it holds bytes that are not UTF-8 text, or begins inside a character that the post before it did not begin. ' +
      'Kept, they would be mangled, so nothing of this post was kept. Post the log as the engine wrote it, its bytes unchanged and its chunks in order; ' +
      'convert a log in another encoding first (iconv -f <encoding> -t UTF-8), or drop the bytes that are not UTF-8 (iconv -f UTF-8 -t UTF-8 -c).',
  );
}

/** `posted` with `chunk` appended (or begun afresh with it), posted at `ticks`. */
export function appended(posted: Posted | undefined, chunk: Decoded, ticks: number | null, fresh: boolean): Posted {
  const begun = fresh || posted === undefined || posted.tail === '';
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
