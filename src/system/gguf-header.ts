// Owns what nodecompute reads of a GGUF file's header: its magic (whether it is GGUF at all) and,
// from its key-values, how many layers llama.cpp can put on a GPU: `<general.architecture>.block_count`
// + 1 (its repeating blocks and the output layer, as its log's "offloaded N/M layers" counts M since
// early 2024; builds of 2023 counted two more).
// The rule: read only as far as that key, in chunks, never materialising a value it does not need (a
// vocabulary is hundreds of thousands of strings), within a bound; past the magic, anything
// unexpected (GGUF v1, a big-endian file, a truncated or absurd header, a failed read) is no answer,
// never an error. A GGUF library parses the whole header into objects: the wrong cost for an agent
// that only needs this number.
import type { FileHandle } from 'node:fs/promises';

/** GGUF files begin with these four bytes. */
const MAGIC = Buffer.from('GGUF', 'latin1');

/** The keys before block_count take a few KiB in files that llama.cpp's converters write. */
const CHUNK_BYTES = 16 * 1024;
/** Real key-values take up to about 10 MiB (a 262k-token vocabulary with its scores); a header past this is not read further. */
const SCAN_MAX_BYTES = 16 * 1024 * 1024;
/** Value types by their byte size (GGUF's enum): uint8 to float64, bool; 8 is a string, 9 an array. */
const FIXED_SIZE: Readonly<Record<number, number>> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
/** uint8, int8, uint16, int16, uint32, int32, uint64, int64: odd ones signed. */
const INTEGERS = new Set([0, 1, 2, 3, 4, 5, 10, 11]);
const STRING = 8;
const ARRAY = 9;
/** Keys and architecture names are a few dozen bytes; GGUF allows 65,535, but a file with one longer than this is not read. */
const NAME_MAX_BYTES = 256;

class OutOfBounds extends Error {}

/** A forward-only reader of the file's header, holding one chunk at a time. */
class Cursor {
  private chunk = Buffer.alloc(0);
  private chunkAt = 0;

  constructor(
    private readonly file: FileHandle,
    private at: number,
  ) {}

  /** Where the next `bytes` begin in the chunk held, if it holds them (the cursor never goes back before it). */
  private held(bytes: number): number | undefined {
    const offset = this.at - this.chunkAt;
    return offset + bytes <= this.chunk.length ? offset : undefined;
  }

  private async fill(bytes: number): Promise<number> {
    if (this.at + bytes > SCAN_MAX_BYTES) throw new OutOfBounds();
    const buffer = Buffer.alloc(Math.max(bytes, CHUNK_BYTES));
    const { bytesRead } = await this.file.read(buffer, 0, buffer.length, this.at);
    if (bytesRead < bytes) throw new OutOfBounds();
    [this.chunk, this.chunkAt] = [buffer.subarray(0, bytesRead), this.at];
    return 0;
  }

  /** The next `bytes` bytes, as an offset into the chunk held (read if need be), and moves past them. */
  private async take(bytes: number): Promise<number> {
    const offset = this.held(bytes) ?? (await this.fill(bytes));
    this.at += bytes;
    return offset;
  }

  async u32(): Promise<number> {
    const offset = await this.take(4);
    return this.chunk.readUInt32LE(offset);
  }

  /** A size or count: more than the bound is no header worth reading. */
  async size(): Promise<number> {
    const offset = await this.take(8);
    const value = this.chunk.readBigUInt64LE(offset);
    if (value > BigInt(SCAN_MAX_BYTES)) throw new OutOfBounds();
    return Number(value);
  }

  /** An integer value of GGUF type `type` (a count); null for a negative one, a float or a bool. */
  async integer(type: number): Promise<number | null> {
    const size = FIXED_SIZE[type]!;
    const offset = await this.take(size);
    if (!INTEGERS.has(type)) return null;
    const value = readInteger(this.chunk, offset, size, type % 2 === 1);
    return value < 0 ? null : value;
  }

  async name(): Promise<string> {
    const length = await this.size();
    if (length > NAME_MAX_BYTES) throw new OutOfBounds();
    const offset = await this.take(length);
    return this.chunk.toString('utf8', offset, offset + length);
  }

  async skip(type: number): Promise<void> {
    if (type === STRING) {
      const length = await this.size();
      this.at += length;
    } else if (type === ARRAY) await this.skipArray();
    else if (FIXED_SIZE[type] !== undefined) this.at += FIXED_SIZE[type];
    else throw new OutOfBounds();
  }

  private async skipArray(): Promise<void> {
    const items = await this.u32();
    const count = await this.size();
    if (FIXED_SIZE[items] !== undefined) this.at += FIXED_SIZE[items] * count;
    else if (items === STRING) {
      // A vocabulary: each string's length read where the chunk holds it, without a promise per string.
      for (let i = 0; i < count; i += 1) {
        const offset = this.held(8) ?? (await this.fill(8));
        const length = this.chunk.readBigUInt64LE(offset);
        if (length > BigInt(SCAN_MAX_BYTES)) throw new OutOfBounds();
        this.at += 8 + Number(length);
      }
    } else throw new OutOfBounds(); // An array of arrays, which llama.cpp's loader refuses too ("invalid GGUF type").
  }
}

function readInteger(chunk: Buffer, offset: number, size: number, signed: boolean): number {
  if (size === 8) return Number(signed ? chunk.readBigInt64LE(offset) : chunk.readBigUInt64LE(offset));
  return signed ? chunk.readIntLE(offset, size) : chunk.readUIntLE(offset, size);
}

export type GgufHeader = { gguf: boolean; layers: number | null };

/**
 * Whether the open file begins with GGUF's magic (a read that fails throws: the caller cannot tell), and then the layers
 * llama.cpp can offload of its model; null when its header does not say (a split but the first, a projector).
 */
export async function readGgufHeader(file: FileHandle): Promise<GgufHeader> {
  const head = Buffer.alloc(MAGIC.length);
  const { bytesRead } = await file.read(head, 0, head.length, 0);
  if (bytesRead < head.length || !head.equals(MAGIC)) return { gguf: false, layers: null };
  return { gguf: true, layers: await offloadableLayers(new Cursor(file, MAGIC.length)) };
}

async function offloadableLayers(cursor: Cursor): Promise<number | null> {
  try {
    const version = await cursor.u32();
    if (version !== 2 && version !== 3) return null;
    await cursor.size();
    const keys = await cursor.size();
    let architecture: string | null = null;
    const blocks = new Map<string, number | null>();
    for (let i = 0; i < keys; i += 1) {
      const key = await cursor.name();
      const type = await cursor.u32();
      if (key === 'general.architecture' && type === STRING) architecture = await cursor.name();
      else if (key.endsWith('.block_count') && FIXED_SIZE[type] !== undefined) blocks.set(key, await cursor.integer(type));
      else await cursor.skip(type);
      const count = architecture === null ? undefined : blocks.get(`${architecture}.block_count`);
      if (count !== undefined) return count === null ? null : count + 1;
    }
    return null;
  } catch {
    // Out of bounds, a value past the end of the file, a read that failed: no answer.
    return null;
  }
}
