// Writes GGUF models for the tests: a llama-architecture model that llama.cpp loads, its tensors
// zeros in a hole of the file (a sparse file: gigabytes that cost no disk and no time), laid out as
// the GGUF format published with ggml says (v3: header, key-values, tensor infos, data aligned to 32);
// and headers alone, of any keys, for the reader of a model's layer count.
import { closeSync, ftruncateSync, openSync, writeSync } from 'node:fs';

const GGUF_TYPE = { u32: 4, i32: 5, f32: 6, string: 8, array: 9 } as const;
const F32 = 0;
const ALIGNMENT = 32;

/** A key's value; `typed`: any other GGUF type, its value's bytes as given. */
export type Value = { u32: number } | { f32: number } | { string: string } | { strings: string[] } | { f32s: number[] } | { i32s: number[] } | { typed: number; bytes: Buffer };

export interface LlamaShape {
  embedding: number;
  feedForward: number;
  layers: number;
  heads: number;
}

/** A little-endian writer of GGUF's scalars and strings (u64 length, then UTF-8). */
function encoder() {
  const parts: Buffer[] = [];
  const put = (size: number, write: (b: Buffer) => void) => {
    const b = Buffer.alloc(size);
    write(b);
    parts.push(b);
  };
  const e = {
    u32: (v: number) => put(4, (b) => b.writeUInt32LE(v)),
    i32: (v: number) => put(4, (b) => b.writeInt32LE(v)),
    f32: (v: number) => put(4, (b) => b.writeFloatLE(v)),
    u64: (v: number) => put(8, (b) => b.writeBigUInt64LE(BigInt(v))),
    string: (s: string) => {
      const bytes = Buffer.from(s, 'utf8');
      e.u64(bytes.length);
      parts.push(bytes);
    },
    raw: (b: Buffer) => parts.push(b),
    bytes: () => Buffer.concat(parts),
  };
  return e;
}

function writeValue(e: ReturnType<typeof encoder>, value: Value): void {
  const array = (type: number, items: unknown[], each: (item: never) => void) => {
    e.u32(GGUF_TYPE.array);
    e.u32(type);
    e.u64(items.length);
    for (const item of items) each(item as never);
  };
  if ('u32' in value) (e.u32(GGUF_TYPE.u32), e.u32(value.u32));
  else if ('f32' in value) (e.u32(GGUF_TYPE.f32), e.f32(value.f32));
  else if ('string' in value) (e.u32(GGUF_TYPE.string), e.string(value.string));
  else if ('typed' in value) (e.u32(value.typed), e.raw(value.bytes));
  else if ('strings' in value) array(GGUF_TYPE.string, value.strings, e.string);
  else if ('f32s' in value) array(GGUF_TYPE.f32, value.f32s, e.f32);
  else array(GGUF_TYPE.i32, value.i32s, e.i32);
}

/** A sentencepiece vocabulary llama.cpp accepts: unknown, begin, end, and the 256 byte tokens. */
function vocabulary(): { tokens: string[]; types: number[] } {
  const bytes = Array.from({ length: 256 }, (_, i) => `<0x${i.toString(16).toUpperCase().padStart(2, '0')}>`);
  // Token types: 2 unknown, 3 control, 6 byte.
  return { tokens: ['<unk>', '<s>', '</s>', ...bytes], types: [2, 3, 3, ...bytes.map(() => 6)] };
}

function tensorsOf(shape: LlamaShape, vocab: number): Array<[string, number[]]> {
  const { embedding: n, feedForward: ff } = shape;
  const tensors: Array<[string, number[]]> = [['token_embd.weight', [n, vocab]]];
  for (let i = 0; i < shape.layers; i += 1) {
    const blk = `blk.${i}`;
    tensors.push([`${blk}.attn_norm.weight`, [n]], [`${blk}.attn_q.weight`, [n, n]], [`${blk}.attn_k.weight`, [n, n]], [`${blk}.attn_v.weight`, [n, n]]);
    tensors.push([`${blk}.attn_output.weight`, [n, n]], [`${blk}.ffn_norm.weight`, [n]]);
    tensors.push([`${blk}.ffn_gate.weight`, [n, ff]], [`${blk}.ffn_down.weight`, [ff, n]], [`${blk}.ffn_up.weight`, [n, ff]]);
  }
  // Last in the file, as convert_hf_to_gguf.py writes them.
  tensors.push(['output_norm.weight', [n]], ['output.weight', [n, vocab]]);
  return tensors;
}

const aligned = (n: number): number => Math.ceil(n / ALIGNMENT) * ALIGNMENT;

/** A GGUF file's header up to its tensor infos: magic, `version` (3), the tensor count, and `keys` in order. */
export function ggufHeader(keys: ReadonlyArray<[string, Value]>, { version = 3, tensors = 0 } = {}): Buffer {
  const e = encoder();
  e.raw(Buffer.from('GGUF', 'latin1'));
  e.u32(version);
  e.u64(tensors);
  e.u64(keys.length);
  for (const [key, value] of keys) {
    e.string(key);
    writeValue(e, value);
  }
  return e.bytes();
}

/** Writes a llama model of `shape` (f32 zeros) to `path`; returns its size in bytes. */
export function writeLlamaModel(path: string, shape: LlamaShape): number {
  const { tokens, types } = vocabulary();
  const keys: Array<[string, Value]> = [
    ['general.architecture', { string: 'llama' }],
    ['general.name', { string: 'nodecompute-test' }],
    ['llama.context_length', { u32: 512 }],
    ['llama.embedding_length', { u32: shape.embedding }],
    ['llama.block_count', { u32: shape.layers }],
    ['llama.feed_forward_length', { u32: shape.feedForward }],
    ['llama.attention.head_count', { u32: shape.heads }],
    ['llama.attention.head_count_kv', { u32: shape.heads }],
    ['llama.attention.layer_norm_rms_epsilon', { f32: 1e-5 }],
    ['llama.rope.dimension_count', { u32: shape.embedding / shape.heads }],
    ['tokenizer.ggml.model', { string: 'llama' }],
    ['tokenizer.ggml.tokens', { strings: tokens }],
    ['tokenizer.ggml.scores', { f32s: tokens.map(() => 0) }],
    ['tokenizer.ggml.token_type', { i32s: types }],
    ['tokenizer.ggml.bos_token_id', { u32: 1 }],
    ['tokenizer.ggml.eos_token_id', { u32: 2 }],
    ['tokenizer.ggml.unknown_token_id', { u32: 0 }],
  ];
  const tensors = tensorsOf(shape, tokens.length);
  const e = encoder();
  e.raw(ggufHeader(keys, { tensors: tensors.length }));
  let offset = 0;
  for (const [name, dims] of tensors) {
    e.string(name);
    e.u32(dims.length);
    for (const dim of dims) e.u64(dim);
    e.u32(F32);
    e.u64(offset);
    offset = aligned(offset + dims.reduce((a, b) => a * b, 1) * 4);
  }
  const head = e.bytes();
  const size = aligned(head.length) + offset;
  const fd = openSync(path, 'w');
  try {
    writeSync(fd, head);
    ftruncateSync(fd, size);
  } finally {
    closeSync(fd);
  }
  return size;
}
