// Owns the shards' colours on the status page: each shard's own slot (a palette colour and a fill),
// from its id, stable as other shards come and go; shards that share a GPU never share a slot.

/** Distinct shard colours (background, text), readable at WCAG AA either way. */
export const PALETTE: ReadonlyArray<readonly [string, string]> = [
  ['#2f6fb0', '#ffffff'],
  ['#e8833a', '#1f2328'],
  ['#3d9a8b', '#ffffff'],
  ['#8e5ea8', '#ffffff'],
  ['#e2c044', '#1f2328'],
  ['#5b9a3a', '#ffffff'],
  ['#d9718c', '#1f2328'],
  ['#8c6a4f', '#ffffff'],
  ['#5fb3d9', '#1f2328'],
  ['#b34a7a', '#ffffff'],
];

/** Fills over a palette colour (solid, stripes, dots): slot k is colour k % 10 with fill floor(k / 10). */
const FILLS = 3;

export const COLOUR_SLOTS = PALETTE.length * FILLS;

/** A shard's own colour, from its id alone (FNV-1a), so it stays put as other shards come and go. */
export function shardHue(id: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < id.length; i += 1) hash = Math.imul(hash ^ id.charCodeAt(i), 0x01000193) >>> 0;
  return hash % PALETTE.length;
}

/** The first slot not `taken` in a hue's order (its colour solid, the next colours, then the other fills); null when none. */
function freeSlot(hue: number, taken: ReadonlySet<number>): number | null {
  const order = Array.from({ length: COLOUR_SLOTS }, (_, k) => Math.floor(k / PALETTE.length) * PALETTE.length + ((hue + k) % PALETTE.length));
  return order.find((slot) => !taken.has(slot)) ?? null;
}

export interface ColourClaim {
  id: string;
  registeredAt: number;
  /** The GPUs whose bars it may appear on: those it was given and those it holds. */
  gpus: readonly number[];
}

/**
 * One slot per shard, oldest registration first, each the first of its hue's order its GPU neighbours
 * have not taken: a new shard never moves an older one's colour. With none free it keeps its hue.
 */
export function shardColours(claims: readonly ColourClaim[]): Map<string, number> {
  const colours = new Map<string, number>();
  const byGpu = new Map<number, string[]>();
  const order = [...claims].sort((a, b) => a.registeredAt - b.registeredAt || (a.id < b.id ? -1 : 1));
  for (const { id, gpus } of order) {
    const taken = new Set(gpus.flatMap((gpu) => (byGpu.get(gpu) ?? []).map((other) => colours.get(other)!)));
    colours.set(id, freeSlot(shardHue(id), taken) ?? shardHue(id));
    for (const gpu of new Set(gpus)) byGpu.set(gpu, [...(byGpu.get(gpu) ?? []), id]);
  }
  return colours;
}

export function colourClass(slot: number): string {
  const fill = Math.floor(slot / PALETTE.length) % FILLS;
  return `c${slot % PALETTE.length}${fill > 0 ? ` f${fill}` : ''}`;
}

/** One bar's shard colours in segment order: each shard's own slot, or the next free one when taken on this bar. */
export function barColours(slots: readonly number[]): number[] {
  const taken = new Set<number>();
  return slots.map((slot) => {
    const colour = taken.has(slot) ? (freeSlot(slot % PALETTE.length, taken) ?? slot) : slot;
    taken.add(colour);
    return colour;
  });
}
