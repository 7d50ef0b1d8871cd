// The layer count read from a GGUF header (src/system/gguf-header.ts), from files written to disk: a
// llama model llama.cpp loads (test/helpers/gguf.ts), and headers laid out as the GGUF spec says with
// the key where a real file has it, after a vocabulary, of each integer type, or missing; anything
// malformed answers null.
import { open, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { readGgufHeader } from '../../src/system/gguf-header.js';
import { ggufHeader, writeLlamaModel, type Value } from '../helpers/gguf.js';

const TYPE = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9, u64: 10, i64: 11 } as const;

const u32 = (n: number): Buffer => Buffer.from(new Uint32Array([n]).buffer);
const u64 = (n: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(n);
  return b;
};
const i64 = (n: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigInt64LE(n);
  return b;
};
const typed = (type: number, bytes: Buffer): Value => ({ typed: type, bytes });
const arch = (name: string): [string, Value] => ['general.architecture', { string: name }];

async function layersOf(t: Test, bytes: Buffer): Promise<number | null> {
  const path = join(t.testdir(), 'model.gguf');
  await writeFile(path, bytes);
  const file = await open(path);
  try {
    return (await readGgufHeader(file)).layers;
  } finally {
    await file.close();
  }
}

t.test('a llama model: its 2 blocks and the output layer, as llama.cpp counts them', async (t) => {
  const path = join(t.testdir(), 'tiny.gguf');
  writeLlamaModel(path, { embedding: 64, feedForward: 128, layers: 2, heads: 4 });
  const file = await open(path);
  t.teardown(() => file.close());
  t.same(await readGgufHeader(file), { gguf: true, layers: 3 });
});

t.test('the key where real files have it: after the general keys, or after a vocabulary longer than a read', async (t) => {
  const tokens = Array.from({ length: 5000 }, (_, i) => `token-${i}`);
  const keys: Array<[string, Value]> = [
    arch('qwen2'),
    ['general.name', { string: 'Qwen2.5 7B Instruct' }],
    ['general.file_type', typed(TYPE.u32, u32(15))],
    ['general.quantized', typed(TYPE.bool, Buffer.from([1]))],
    ['tokenizer.ggml.tokens', { strings: tokens }],
    ['tokenizer.ggml.scores', { f32s: tokens.map(() => 0) }],
    ['tokenizer.ggml.merges', { strings: ['a b', 'c d'] }],
    ['qwen2.block_count', { u32: 28 }],
  ];
  t.equal(await layersOf(t, ggufHeader(keys)), 29, 'read past 5,000 strings, their scores and merges');
  t.equal(await layersOf(t, ggufHeader([['qwen2.block_count', { u32: 28 }], arch('qwen2')])), 29, 'the count before the architecture');
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['llama.block_count', { u32: 32 }], ['tokenizer.ggml.tokens', { strings: ['x'] }]], { version: 2 })), 33, 'GGUF v2');
});

t.test('a count of any integer type; none from a negative one, a float or another architecture', async (t) => {
  const count = (type: number, bytes: Buffer) => layersOf(t, ggufHeader([arch('llama'), ['llama.block_count', typed(type, bytes)]]));
  t.equal(await count(TYPE.i32, u32(40)), 41);
  t.equal(await count(TYPE.u64, u64(80n)), 81);
  t.equal(await count(TYPE.i64, i64(61n)), 62);
  t.equal(await count(TYPE.u16, Buffer.from([24, 0])), 25);
  t.equal(await count(TYPE.i64, i64(-1n)), null, 'negative');
  t.equal(await count(TYPE.i8, Buffer.from([0xff])), null, 'negative, one byte');
  t.equal(await count(TYPE.f32, Buffer.from(new Float32Array([32]).buffer)), null, 'a float');
  t.equal(await count(TYPE.string, Buffer.concat([u64(2n), Buffer.from('32')])), null, 'a string is skipped: never found');
  const projector = ggufHeader([arch('clip'), ['clip.vision.block_count', { u32: 24 }], ['clip.has_vision_encoder', typed(TYPE.bool, Buffer.from([1]))]]);
  t.equal(await layersOf(t, projector), null, 'a projector: its vision blocks are no layers llama.cpp offloads');
  t.equal(await layersOf(t, ggufHeader([['general.architecture', { u32: 1 }], ['llama.block_count', { u32: 32 }]])), null, 'an architecture that is no string');
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['split.count', typed(TYPE.u16, Buffer.from([3, 0]))]])), null, "a split's header without the count");
});

t.test('anything malformed is no answer, never an error', async (t) => {
  const llama = ggufHeader([arch('llama'), ['llama.block_count', { u32: 32 }]]);
  const magicOf = async (bytes: Buffer) => {
    const path = join(t.testdir(), 'any.bin');
    await writeFile(path, bytes);
    const file = await open(path);
    t.teardown(() => file.close());
    return readGgufHeader(file);
  };
  t.same(await magicOf(Buffer.from('not a model file at all')), { gguf: false, layers: null }, 'no magic: no GGUF');
  t.same(await magicOf(Buffer.from('GG')), { gguf: false, layers: null }, 'shorter than the magic');
  t.same(await magicOf(Buffer.from('GGUF')), { gguf: true, layers: null }, 'the magic alone: GGUF, its layers unsaid');
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['llama.block_count', { u32: 32 }]], { version: 1 })), null, 'GGUF v1 (32-bit sizes)');
  const bigEndian = Buffer.from(llama);
  bigEndian.writeUInt32BE(3, 4);
  t.equal(await layersOf(t, bigEndian), null, 'a big-endian file');
  t.equal(await layersOf(t, llama.subarray(0, llama.length - 6)), null, 'cut short in the count');
  t.equal(await layersOf(t, llama.subarray(0, 30)), null, 'cut short in a key');
  const longKey = ggufHeader([['x'.repeat(300), { u32: 1 }], arch('llama'), ['llama.block_count', { u32: 32 }]]);
  t.equal(await layersOf(t, longKey), null, 'a key longer than any real one');
  const hugeString = ggufHeader([arch('llama'), ['general.license', typed(TYPE.string, u64(1n << 40n))]]);
  t.equal(await layersOf(t, hugeString), null, 'a string of a terabyte');
  const hugeToken = typed(TYPE.array, Buffer.concat([u32(TYPE.string), u64(2n), u64(1n << 40n)]));
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['tokenizer.ggml.tokens', hugeToken]])), null, 'a token of a terabyte');
  const farArray = typed(TYPE.array, Buffer.concat([u32(TYPE.u64), u64(9_000_000n)]));
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['tokenizer.ggml.scores', farArray], ['llama.block_count', { u32: 32 }]])), null, 'the key past 16 MiB');
  // Three million empty strings (24 MB of lengths, a hole in the file): stepped over until the bound, not to the end.
  const emptyTokens = ggufHeader([arch('llama'), ['tokenizer.ggml.tokens', typed(TYPE.array, Buffer.concat([u32(TYPE.string), u64(3_000_000n)]))]]);
  t.equal(await layersOf(t, Buffer.concat([emptyTokens, Buffer.alloc(24_000_000)])), null, 'a vocabulary past 16 MiB');
  // Arrays of arrays, which llama.cpp's loader refuses: no answer at the first, however deep they nest.
  const nested = (depth: number): Buffer => Buffer.concat([...Array.from({ length: depth }, () => Buffer.concat([u32(TYPE.array), u64(1n)])), u32(TYPE.u8), u64(0n)]);
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['general.nested', typed(TYPE.array, nested(100_000))], ['llama.block_count', { u32: 32 }]])), null, 'an array of arrays');
  t.equal(await layersOf(t, ggufHeader([arch('llama'), ['general.weird', typed(13, u32(0))], ['llama.block_count', { u32: 32 }]])), null, 'a type GGUF does not have');
  const path = join(t.testdir(), 'closed.gguf');
  await writeFile(path, llama);
  const file = await open(path);
  await file.close();
  await t.rejects(readGgufHeader(file), 'a read of the magic that fails: the caller cannot tell (model-files.ts counts it unknown)');
});
