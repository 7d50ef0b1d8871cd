// Owns the bounded tail of engine output kept per shard: previous + chunk, cut from the front to
// the last ENGINE_TAIL_MAX_BYTES of UTF-8 at a line start, so a parser sees whole lines.

export const ENGINE_TAIL_MAX_BYTES = 256 * 1024;

function utf8Bytes(codePoint: number): number {
  if (codePoint < 0x80) return 1;
  if (codePoint < 0x800) return 2;
  return codePoint < 0x10000 ? 3 : 4;
}

/**
 * previous + chunk, keeping at most the last maxBytes of UTF-8. When it cuts, it starts at the
 * first whole line left (if any) and never inside a surrogate pair, so a parser sees whole lines.
 */
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
