// Shard colours on the status page: each shard's own colour comes from its id (FNV-1a), not from
// its place in the sorted list, so it does not move when shards come and go; shards that share a
// GPU never share a colour (the older keeps its own, the newer steps aside), and a bar resolves
// what the shard-wide choice could not.
import t from 'tap';
import { barColours, colourClass, COLOUR_SLOTS, shardColours, shardHue, type ColourClaim } from '../../src/status-page/colours.js';

/** The first id `${prefix}${n}` whose hue is that of `slot`. */
function idWithHue(prefix: string, slot: number): string {
  const hue = slot % 10;
  for (let n = 0; n < 1000; n += 1) if (shardHue(`${prefix}${n}`) === hue) return `${prefix}${n}`;
  throw new Error(`no id ${prefix}N of hue ${hue}`);
}

const claim = (id: string, registeredAt: number, gpus: number[]): ColourClaim => ({ id, registeredAt, gpus });

t.test('a shard hue is FNV-1a of its id, modulo the ten palette colours', async (t) => {
  // FNV-1a 32-bit test vectors: "a" 0xe40c292c, "b" 0xe70c2de5, "foobar" 0xbf9cf968.
  t.equal(shardHue('a'), 0xe40c292c % 10);
  t.equal(shardHue('b'), 0xe70c2de5 % 10);
  t.equal(shardHue('foobar'), 0xbf9cf968 % 10);
  const hues = new Set(Array.from({ length: 40 }, (_, i) => shardHue(`llama-${i}`)));
  t.equal(hues.size, 10, 'forty ids use every colour');
});

t.test('colour classes: the palette colour, then a fill for the slots past the first ten', async (t) => {
  t.equal(colourClass(0), 'c0');
  t.equal(colourClass(9), 'c9');
  t.equal(colourClass(13), 'c3 f1');
  t.equal(colourClass(25), 'c5 f2');
  t.equal(COLOUR_SLOTS, 30);
});

t.test('each shard keeps its own hue while no shard on its GPUs has it, and shards on different GPUs may share one', async (t) => {
  const first = idWithHue('a-', 4);
  const elsewhere = idWithHue('z-', 4);
  const colours = shardColours([claim(first, 1, [0]), claim(elsewhere, 2, [1]), claim('none', 3, [])]);
  t.equal(colours.get(first), 4);
  t.equal(colours.get(elsewhere), 4, 'not on the same GPU: no need to move');
  t.equal(colours.get('none'), shardHue('none'));
});

t.test('two shards on one GPU with the same hue: the older keeps it, the newer takes the next colour', async (t) => {
  const older = idWithHue('m-', 6);
  const newer = idWithHue('b-', 6);
  t.ok(newer < older, 'the newer one sorts first, where a colour by position would have moved the older one');
  const colours = shardColours([claim(newer, 20, [2, 3]), claim(older, 10, [3])]);
  t.equal(colours.get(older), 6);
  t.equal(colours.get(newer), 7);
  // Registered in the same millisecond: the id decides, so the answer is still the same at every reload.
  const tie = shardColours([claim(older, 10, [3]), claim(newer, 10, [3])]);
  t.equal(tie.get(newer), 6);
  t.equal(tie.get(older), 7);
});

t.test('adding a shard never moves an older one\'s colour', async (t) => {
  const shards = Array.from({ length: 12 }, (_, i) => claim(`s${i}`, i, [i % 3]));
  shards.push(claim('tp', 100, [0, 1, 2]));
  const before = shardColours(shards);
  for (const id of ['aaa', idWithHue('0-', before.get('s0')!), idWithHue('0-', before.get('tp')!)]) {
    const after = shardColours([claim(id, 200, [0, 1, 2]), ...shards]);
    for (const [shard, colour] of before) t.equal(after.get(shard), colour, `${shard} with ${id} added`);
    const neighbours = [...before.values()];
    t.notOk(neighbours.includes(after.get(id)!), `${id} takes a colour no shard on its GPUs has`);
  }
});

t.test('no two shards on one GPU share a slot, up to COLOUR_SLOTS of them; past that one must repeat', async (t) => {
  const crowd = Array.from({ length: COLOUR_SLOTS }, (_, i) => claim(`p${i}`, i, [0]));
  const colours = shardColours(crowd);
  t.equal(new Set(colours.values()).size, COLOUR_SLOTS, 'thirty shards, thirty slots: solid, striped and dotted');
  t.ok([...colours.values()].every((slot) => slot >= 0 && slot < COLOUR_SLOTS));
  const extra = shardColours([...crowd, claim('late', 99, [0])]);
  t.equal(extra.get('late'), shardHue('late'), 'every slot taken: it keeps its own hue');
});

t.test('a bar resolves a collision the shard-wide choice could not, on that bar only', async (t) => {
  t.same(barColours([]), []);
  t.same(barColours([2, 5, 7]), [2, 5, 7], 'no collision: each keeps its slot');
  t.same(barColours([3, 3, 4]), [3, 4, 5], 'the second 3 takes 4, and then the 4 takes 5');
  t.same(barColours([13, 3]), [13, 3], 'a striped and a solid colour are different slots');
  const full = barColours(Array.from({ length: COLOUR_SLOTS + 1 }, () => 0));
  t.equal(new Set(full.slice(0, COLOUR_SLOTS)).size, COLOUR_SLOTS);
  t.equal(full[COLOUR_SLOTS], 0, 'past thirty shards on one bar a slot repeats');
  // A shard whose neighbours hold every slot keeps its hue, and its bars move it where it collides.
  // Thirty shards that all share GPU 3 hold every slot between them; "wide" meets them all on GPUs 0-2, ten a bar.
  const claims = [...Array.from({ length: COLOUR_SLOTS }, (_, i) => claim(`n${i}`, i, [i % 3, 3])), claim('wide', 99, [0, 1, 2])];
  const colours = shardColours(claims);
  const wide = colours.get('wide')!;
  t.equal(wide, shardHue('wide'));
  for (const gpu of [0, 1, 2]) {
    const onBar = claims.filter((c) => c.gpus.includes(gpu)).map((c) => colours.get(c.id)!);
    const resolved = barColours(onBar);
    t.equal(new Set(resolved).size, onBar.length, `GPU ${gpu}: every segment its own slot`);
  }
});
