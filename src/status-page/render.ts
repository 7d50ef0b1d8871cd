// Owns the status page an operator opens on a node (GET /): one model built from every shard's state
// and the snapshot they were judged on, rendered as a self-contained HTML page (inline CSS, no
// script, no external asset, so it works offline and behind any proxy) or as an aligned plain-text
// page for curl. Pure: the route gathers the inputs from the cache, so rendering never causes an
// nvidia-smi run. Every string that comes from the node (process names, reasons, nvidia-smi's own
// messages) is escaped for HTML and stripped of control characters for terminals. A GPU the node
// has lost (gpu-roster.ts) keeps its row, in its index position, so an 8-GPU node never silently
// reads as 7; past max-stale the last good snapshot still says which GPUs were lost by then. A GPU
// nvidia-smi's failing queries name as unreachable is marked on its row, with what nvidia-smi said.
import { formatDuration } from '../duration.js';
import { formatHeldMemory, formatMemory, formatMemoryUse } from '../memory-size.js';
import { foreignMemory, type ForeignProcess, type GpuForeignMemory } from '../node-state/foreign-memory.js';
import { gpuUnreachable, saidOfBusId, type LostGpu } from '../node-state/gpu-roster.js';
import type { GpuState, NodeSnapshot } from '../node-state/node-snapshot.js';
import { placedIndices, placementOf, type UnreachableKnownGpu, type UnreachableListedGpu } from '../node-state/placement.js';
import { snapshotMeta, unreachableSaid, type NodeView, type SnapshotMeta } from '../node-state/node-view.js';
import { staleNews, type SnapshotView } from '../node-state/snapshot.js';
import { READINESS_STATES, type ReadinessState } from '../shards/verdict.js';
import { deviceLabel } from '../shards/compute.js';
import type { ShardState } from '../shards/shard-service.js';
import type { ShardRecord } from '../shards/shard.js';

/** Seconds between the page's own reloads (meta refresh: no script needed). */
export const REFRESH_SECONDS = 5;

/** Distinct shard colours (background, text), readable at WCAG AA either way. */
const PALETTE: ReadonlyArray<readonly [string, string]> = [
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

/**
 * Fills layered over a palette colour, so that more shards than colours on one GPU still read apart:
 * slot k is colour k % 10 with fill floor(k / 10) (solid, stripes, dots).
 */
const FILLS = 3;

/** Colour slots a shard can take: every palette colour in every fill. */
export const COLOUR_SLOTS = PALETTE.length * FILLS;

/**
 * A shard's own colour, from its id alone (FNV-1a): it does not move when other shards come and go,
 * as a colour by sorted position did (every colour shifted when a shard sorting first was added).
 */
export function shardHue(id: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < id.length; i += 1) hash = Math.imul(hash ^ id.charCodeAt(i), 0x01000193) >>> 0;
  return hash % PALETTE.length;
}

/** The slots a shard of this hue tries, in order: its colour solid first, the next colours, then the other fills. */
function slotsFrom(hue: number): number[] {
  return Array.from({ length: COLOUR_SLOTS }, (_, k) => Math.floor(k / PALETTE.length) * PALETTE.length + ((hue + k) % PALETTE.length));
}

/** The first slot of this hue's order not in `taken`; null when every slot is. */
function freeSlot(hue: number, taken: ReadonlySet<number>): number | null {
  return slotsFrom(hue).find((slot) => !taken.has(slot)) ?? null;
}

export interface ColourClaim {
  id: string;
  registeredAt: number;
  /** The GPUs whose bars it may appear on: those it was given and those it holds. */
  gpus: readonly number[];
}

/**
 * One colour slot per shard, its hue's where it can: shards that share a GPU never share a slot.
 * Oldest registration first (then id: ids are unique), each taking the first slot its GPU neighbours already
 * coloured have not taken, so a new shard never moves an older one's colour: it is the one to step
 * aside. A shard all of whose slots its neighbours hold keeps its hue here; the bar resolves it.
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

/** The classes of a colour slot: its palette colour, and its fill past the first ten. */
export function colourClass(slot: number): string {
  const fill = Math.floor(slot / PALETTE.length) % FILLS;
  return `c${slot % PALETTE.length}${fill > 0 ? ` f${fill}` : ''}`;
}

export type SegmentKind = 'shard' | 'foreign' | 'reserved' | 'free';

export interface Segment {
  kind: SegmentKind;
  /** Shard id, or "foreign", "reserved", "free". */
  label: string;
  /** null for a shard whose memory there nvidia-smi does not report ([N/A]): it is drawn without width. */
  mib: number | null;
  /** Colour slot of the shard on this bar (see colourClass); null for the other kinds. */
  color: number | null;
  /** Foreign memory that includes shard processes' unreported memory: an upper bound, shown as "up to". */
  upTo: boolean;
  /** The tooltip: what this memory is, who holds it. */
  title: string;
  /** A shard holding a GPU it was not given. */
  stray: boolean;
}

export interface GpuModel {
  index: number;
  uuid: string;
  name: string;
  /** MIG is enabled: its memory figures are the whole GPU's, not any instance's. */
  mig: boolean;
  /** What nvidia-smi said when its queries since this snapshot failed naming this GPU; null when they did not. */
  unreachable: string | null;
  totalMiB: number | null;
  usedMiB: number | null;
  /**
   * nvidia-smi reports the used and the total memory, and the segments have a size: without them no
   * bar can be drawn to scale (shard segments alone would fill it, or leave it white, as if free).
   */
  memoryKnown: boolean;
  segments: Segment[];
  foreignProcesses: ForeignProcess[];
  /** Shards given this GPU that hold no memory on it. */
  idleShards: string[];
}

/** A GPU nvidia-smi listed earlier and no longer lists: no memory figures, as its memory is unknown (not free). */
export interface LostGpuModel extends LostGpu {
  /**
   * The UUID of the GPU nvidia-smi lists under this index now (it renumbered the GPUs after this one);
   * null when no GPU has the index.
   */
  indexTakenBy: string | null;
  /** The shards placed on it (placement.ts: by UUID; by index where registered without): their verdicts say what it means for them. */
  placed: Array<{ id: string; state: ReadinessState; color: number }>;
}

export interface ShardRow {
  id: string;
  state: ReadinessState;
  engine: string;
  /** "pid 1234" or "cgroup abc...". */
  process: string;
  color: number;
  /** The GPUs it was given, as registered: "2", "2→1" when nvidia-smi lists that device as GPU 1 now, "2 lost" when it lists it no more. */
  given: string[];
  /** compute.devices, or null when nvidia-smi cannot be asked. */
  held: string[] | null;
  /** GPUs held but not given, labelled like devices. */
  strays: string[];
  reason: string | null;
  warnings: string[];
}

export interface StatusModel {
  host: string;
  version: string;
  generatedAt: number;
  /** The snapshot the verdicts come from; null when nvidia-smi cannot be asked. */
  snapshot: SnapshotMeta | null;
  /**
   * With no snapshot: the last good one, too old to be served (past max-stale), so the header can date
   * the outage; null otherwise.
   */
  lastGood: { observedAt: number; ageMs: number; maxStaleMs: number } | null;
  /** Why nvidia-smi cannot be asked; null when it answered. */
  error: string | null;
  /** Why the GPU processes cannot be matched to this /proc (the node view's `processesHidden`); null when they can. */
  processesHidden: string | null;
  /**
   * The GPUs nvidia-smi listed earlier and no longer lists, by index; empty when none. Past max-stale
   * (lastGood set), those of the last good snapshot: nothing since says whether they are back.
   */
  lostGpus: LostGpuModel[];
  /**
   * The GPUs nvidia-smi's failing queries say it cannot reach that a listing had, less the lost ones
   * (their rows say enough): marked on their rows, and past max-stale, with no rows, said under the table.
   */
  unreachableGpus: UnreachableKnownGpu[];
  /**
   * The stale banner: why the snapshot is not being renewed (the last refresh failed, or nvidia-smi is
   * slow now); null otherwise. A snapshot that is merely one refresh behind (stale-while-revalidate,
   * however long nobody looked) is routine, and the header's age says enough.
   */
  staleBanner: string | null;
  gpus: GpuModel[];
  shards: ShardRow[];
  counts: Record<ReadinessState, number>;
}

/** What `shards.states()` answers, plus who and when this page is. */
export interface StatusInput {
  states: ShardState[];
  view: SnapshotView<NodeSnapshot> | null;
  node: NodeView | null;
  error: string | null;
  /** The GPUs nvidia-smi's failing queries say it cannot reach (NodeService.unreachable()). */
  unreachable: readonly UnreachableListedGpu[];
  /**
   * The cached snapshot however old (the snapshot source's peek), when there is no view; with
   * maxStaleMs, the header then says when the last good one was taken, and its lost GPUs are shown.
   */
  lastGood?: { observedAt: number; ageMs: number; snapshot: Pick<NodeSnapshot, 'gpus' | 'lostGpus'> } | null;
  maxStaleMs?: number;
  host: string;
  version: string;
  now: number;
}

/** Why a GPU is marked MIG: its figures are not what placement on its instances can use. */
const MIG_NOTE = 'MIG is enabled: these memory figures are for the whole GPU, not per MIG instance';

const LOST_GPUS = 'nvidia-smi no longer lists GPUs it listed earlier.';

/** What an unreachable GPU's row says besides nvidia-smi's words. */
const UNREACHABLE_NOTE = 'nvidia-smi cannot reach this GPU: nothing can compute on it, and its figures are from the last good snapshot';
/** Past max-stale, what the lost rows under "no GPU figures" are. */
const LOST_ROWS_NOTE = 'Below, the GPUs its last good snapshot no longer listed.';
const LOST_GPUS_ADVICE =
  'They fell off the bus, were reset or were detached, and shards placed on them cannot hold them. Check dmesg for NVIDIA Xid errors (79: fallen off the bus) and nvidia-smi -L; such a GPU usually needs a reset or the node a reboot.';

function processLabel(process: ForeignProcess): string {
  return `pid ${process.pid} ${process.name} (${formatHeldMemory(process.usedMiB)})`;
}

/** Foreign memory, as an upper bound when it includes shard processes' unreported memory. */
function foreignAmount(foreignMiB: number, unreportedShardProcesses: number): string {
  if (unreportedShardProcesses === 0) return formatMemory(foreignMiB);
  return `up to ${formatMemory(foreignMiB)} (it includes the memory of ${unreportedShardProcesses} shard process(es) nvidia-smi does not report)`;
}

/** A segment's share of its bar: one whose size is not reported takes none (the legend still names it). */
function widthOf(segment: Segment): number {
  return segment.mib ?? 0;
}

/**
 * One bar's shard colours, in segment order: each shard's own slot, unless an earlier segment on
 * this bar already has it (possible only when a shard's neighbours held every slot), then the next
 * free one, on this bar only; past COLOUR_SLOTS shards on one bar a slot repeats.
 */
export function barColours(slots: readonly number[]): number[] {
  const taken = new Set<number>();
  return slots.map((slot) => {
    const colour = taken.has(slot) ? (freeSlot(slot % PALETTE.length, taken) ?? slot) : slot;
    taken.add(colour);
    return colour;
  });
}

function segmentsOf(gpu: GpuState, foreign: GpuForeignMemory, states: ShardState[], colors: Map<string, number>): Segment[] {
  const segments: Segment[] = [];
  for (const { shard, compute } of states) {
    // With a node view every shard has a compute answer.
    const usage = [...compute!.gpus, ...compute!.strayGpus].find((held) => held.index === gpu.index);
    if (!usage) continue;
    const stray = compute!.strayGpus.includes(usage);
    segments.push({
      kind: 'shard',
      label: shard.id,
      mib: usage.usedMiB,
      color: colors.get(shard.id)!,
      upTo: false,
      title: `${shard.id}: ${formatHeldMemory(usage.usedMiB)} on GPU ${gpu.index}${stray ? ' (a GPU it was NOT given)' : ''}`,
      stray,
    });
  }
  if (foreign.foreignMiB !== null && foreign.foreignMiB > 0) {
    const holders = foreign.foreignProcesses.map(processLabel);
    segments.push({
      kind: 'foreign',
      label: 'foreign',
      mib: foreign.foreignMiB,
      color: null,
      upTo: foreign.unreportedShardProcesses > 0,
      title: `foreign: ${foreignAmount(foreign.foreignMiB, foreign.unreportedShardProcesses)} held by no registered shard${holders.length > 0 ? ` - ${holders.join('; ')}` : ' (driver context or processes nvidia-smi does not list)'}`,
      stray: false,
    });
  }
  if (gpu.reservedMiB !== null && gpu.reservedMiB > 0) {
    segments.push({ kind: 'reserved', label: 'reserved', mib: gpu.reservedMiB, color: null, upTo: false, title: `reserved by the driver: ${formatMemory(gpu.reservedMiB)}`, stray: false });
  }
  if (gpu.freeMiB !== null) {
    segments.push({ kind: 'free', label: 'free', mib: gpu.freeMiB, color: null, upTo: false, title: `free: ${formatMemory(gpu.freeMiB)}`, stray: false });
  }
  const shards = segments.filter((segment) => segment.color !== null);
  barColours(shards.map((segment) => segment.color!)).forEach((colour, i) => {
    shards[i]!.color = colour;
  });
  return segments;
}

/** The GPUs `known` (the snapshot served, or past max-stale the last good one) says are lost, with the shards placed on each. */
function lostGpuModels(known: Pick<NodeSnapshot, 'gpus' | 'lostGpus'> | null, states: ShardState[], colors: Map<string, number>): LostGpuModel[] {
  if (known === null) return [];
  const unlisted = states.map((state) => ({ state, unlisted: placementOf(state.shard, known.gpus).unlisted }));
  return known.lostGpus.map((gpu) => {
    const indexTakenBy = known.gpus.find((listed) => listed.index === gpu.index)?.uuid ?? null;
    const placed = unlisted
      .filter(({ unlisted: gone }) => gone.some(({ index, uuid }) => (uuid === undefined ? index === gpu.index : uuid === gpu.uuid)))
      .map(({ state }) => state);
    return {
      index: gpu.index,
      uuid: gpu.uuid,
      name: gpu.name,
      busId: gpu.busId,
      lastListedAt: gpu.lastListedAt,
      lostAt: gpu.lostAt,
      ...(gpu.said === undefined ? {} : { said: gpu.said }),
      indexTakenBy,
      placed: placed.map(({ shard, readiness }) => ({ id: shard.id, state: readiness.state, color: colors.get(shard.id)! })),
    };
  });
}

/**
 * A warning that ends with nvidia-smi's own message, which the banner already gives in full: once
 * on the page, not once per shard.
 */
function pointToBanner(warning: string, error: string | null): string {
  const suffix = `: ${error}`;
  return error !== null && warning.endsWith(suffix) ? `${warning.slice(0, -suffix.length)} (nvidia-smi's message is at the top of the page)` : warning;
}

export function statusModel(input: StatusInput): StatusModel {
  const colors = shardColours(
    input.states.map(({ shard, compute }) => ({
      id: shard.id,
      registeredAt: shard.registeredAt,
      gpus: [...shard.gpus, ...(compute ? [...compute.gpus, ...compute.strayGpus].map((held) => held.index) : [])],
    })),
  );
  const counts = Object.fromEntries(READINESS_STATES.map((state) => [state, 0])) as Record<ReadinessState, number>;
  for (const { readiness } of input.states) counts[readiness.state] += 1;
  // foreignMemory answers one entry per GPU, in the snapshot's order.
  const foreign = input.node ? foreignMemory(input.node) : [];
  const listed = input.node?.snapshot.gpus ?? [];
  const placed = new Map(input.states.map(({ shard }) => [shard.id, placedIndices(shard, listed)]));
  const gpus = listed.map((gpu, i): GpuModel => {
    const segments = segmentsOf(gpu, foreign[i]!, input.states, colors);
    const holders = new Set(segments.filter((segment) => segment.kind === 'shard').map((segment) => segment.label));
    return {
      index: gpu.index,
      uuid: gpu.uuid,
      name: gpu.name,
      mig: gpu.migMode === 'Enabled',
      unreachable: unreachableSaid(gpu.uuid, input.unreachable),
      totalMiB: gpu.totalMiB,
      usedMiB: gpu.usedMiB,
      memoryKnown: gpu.totalMiB !== null && gpu.usedMiB !== null && segments.some((segment) => widthOf(segment) > 0),
      segments,
      foreignProcesses: foreign[i]!.foreignProcesses,
      idleShards: input.states.filter(({ shard }) => placed.get(shard.id)!.includes(gpu.index) && !holders.has(shard.id)).map(({ shard }) => shard.id),
    };
  });
  const shards = input.states.map(({ shard, readiness, compute }): ShardRow => ({
    id: shard.id,
    state: readiness.state,
    engine: shard.engine,
    process: shard.pid !== null ? `pid ${shard.pid}` : `cgroup ${shard.cgroup}`,
    color: colors.get(shard.id)!,
    given: givenLabels(shard, input.node),
    held: compute ? compute.devices : null,
    strays: compute ? compute.strayGpus.map(deviceLabel) : [],
    reason: readiness.reason,
    warnings: readiness.warnings.map((warning) => pointToBanner(warning, input.error)),
  }));
  const lastGood = input.view === null && input.lastGood && input.maxStaleMs !== undefined && input.lastGood.ageMs > input.maxStaleMs ? input.lastGood : null;
  const lostGpus = lostGpuModels(input.node?.snapshot ?? lastGood?.snapshot ?? null, input.states, colors);
  return {
    host: input.host,
    version: input.version,
    generatedAt: input.now,
    snapshot: input.view ? snapshotMeta(input.view) : null,
    lastGood: lastGood && { observedAt: lastGood.observedAt, ageMs: lastGood.ageMs, maxStaleMs: input.maxStaleMs! },
    error: input.error,
    processesHidden: input.node?.processesHidden ?? null,
    lostGpus,
    unreachableGpus: input.unreachable.filter((gpu): gpu is UnreachableKnownGpu => gpu.listed !== null && !lostGpus.some((lost) => lost.uuid === gpu.listed!.uuid)),
    staleBanner: input.view ? staleNews(input.view) : null,
    gpus,
    shards,
    counts,
  };
}

// ---------------------------------------------------------------------------------------------
// HTML

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function when(ms: number): string {
  return `${new Date(ms).toISOString().slice(0, 19).replace('T', ' ')} UTC`;
}

/** The header's word on the snapshot: its time and age, or, without one, when the last good one was taken. */
function snapshotLine(model: StatusModel): string {
  if (model.snapshot) return `nvidia-smi snapshot of ${when(Date.parse(model.snapshot.observedAt))} (${formatDuration(model.snapshot.ageMs)} old)`;
  if (model.lastGood === null) return 'no nvidia-smi snapshot';
  const { observedAt, ageMs, maxStaleMs } = model.lastGood;
  return `no nvidia-smi snapshot: the last good one, of ${when(observedAt)} (${formatDuration(ageMs)} ago), is past max-stale (${formatDuration(maxStaleMs)})`;
}

/** Past max-stale: the lost GPUs shown are the last good snapshot's. */
function lostAsOf(observedAt: number): string {
  return `As of the last good snapshot, of ${when(observedAt)}: nvidia-smi cannot be asked now, so whether they are listed again is unknown.`;
}

/**
 * One lost GPU, for the banners: what it was, when it went (between its last listing and the first
 * snapshot without it), and what nvidia-smi says of it where it says something ("Unknown Error").
 */
function lostLine(gpu: LostGpuModel, now: number): string {
  const line = `GPU ${gpu.index} (${gpu.uuid}, ${gpu.name}), last listed ${when(gpu.lastListedAt)}, missing since ${when(gpu.lostAt)} (${formatDuration(now - gpu.lostAt)} ago)`;
  return gpu.said === undefined ? line : `${line}; ${saidOfBusId(gpu.busId, gpu.said)}`;
}

/** Where the shards placed on a lost GPU are, as its row says it. */
function placedOn(gpu: LostGpuModel): string {
  const placed = gpu.placed.length === 0 ? NOT_PLACED : `placed on it: ${gpu.placed.map((shard) => `${shard.id} (${shard.state})`).join(', ')}`;
  const taken = indexTakenNote(gpu);
  return taken === null ? placed : `${taken}; ${placed}`;
}

const NOT_PLACED = 'no shard is placed on it';

/** A shard's given GPUs, each as registered and, where that differs, where nvidia-smi has it now. */
function givenLabels(shard: ShardRecord, node: NodeView | null): string[] {
  if (node === null) return shard.gpus.map(String);
  const placement = placementOf(shard, node.snapshot.gpus);
  return shard.gpus.map((index) => {
    const moved = placement.renumbered.find((gpu) => gpu.registered === index);
    if (moved !== undefined) return `${index}→${moved.now}`;
    return placement.unlisted.some((gpu) => gpu.index === index) ? `${index} lost` : String(index);
  });
}

/** Which GPU has the lost one's index now, if nvidia-smi renumbered the GPUs after it. */
function indexTakenNote(gpu: LostGpuModel): string | null {
  return gpu.indexTakenBy === null ? null : `nvidia-smi lists ${gpu.indexTakenBy} as GPU ${gpu.index} now`;
}

/**
 * The rows of the GPU table in index order: the GPUs listed, and the lost ones where they were; a lost
 * one before the GPU listed under its index now.
 */
function inIndexOrder<T>(model: StatusModel, listed: (gpu: GpuModel) => T, lost: (gpu: LostGpuModel) => T): T[] {
  const rows = [
    ...model.lostGpus.map((gpu) => ({ index: gpu.index, rank: 0, row: lost(gpu) })),
    ...model.gpus.map((gpu) => ({ index: gpu.index, rank: 1, row: listed(gpu) })),
  ];
  return rows.sort((a, b) => a.index - b.index || a.rank - b.rank).map(({ row }) => row);
}

/** What the GPUs held column lists. */
const HELD_NOTE =
  'GPUs held: every GPU whose memory the shard\'s processes hold, as nvidia-smi lists them, a GPU it was not given marked "not given" (1 GiB = 1024 MiB, the unit nvidia-smi reports).';

/** The page's one line (its tab title, the text view's first line): a lost GPU first, where a dashboard of tabs shows it. */
function summary(model: StatusModel): string {
  const parts = READINESS_STATES.filter((state) => model.counts[state] > 0).map((state) => `${model.counts[state]} ${state}`);
  const shards = parts.length > 0 ? parts.join(', ') : 'no shards';
  const lost = model.lostGpus.length + model.unreachableGpus.length;
  return lost === 0 ? shards : `${lost} GPU${lost === 1 ? '' : 's'} LOST · ${shards}`;
}

/** Segments wider than this share of the bar carry their label inside; the legend names them all. */
const INLINE_LABEL_SHARE = 0.09;

/** What a segment holds, as its label, legend and the text page say it: "up to" where it is an upper bound. */
function amountOf(segment: Segment): string {
  return `${segment.upTo ? 'up to ' : ''}${formatHeldMemory(segment.mib)}`;
}

function segmentHtml(segment: Segment, total: number): string {
  const colour = segment.color === null ? '' : ` ${colourClass(segment.color)}`;
  const inline = segment.kind !== 'free' && widthOf(segment) / total >= INLINE_LABEL_SHARE;
  const text = inline ? `<span>${escapeHtml(segment.label)} ${amountOf(segment)}</span>` : '';
  return `<div class="seg ${segment.kind}${colour}${segment.stray ? ' stray' : ''}" style="flex-grow:${widthOf(segment)}" title="${escapeHtml(segment.title)}">${text}</div>`;
}

function legendHtml(segment: Segment): string {
  const colour = segment.color === null ? '' : ` ${colourClass(segment.color)}`;
  const stray = segment.stray ? ' <em>not given this GPU</em>' : '';
  return `<li title="${escapeHtml(segment.title)}"><i class="sw ${segment.kind}${colour}" aria-hidden="true"></i>${escapeHtml(segment.label)} <b>${amountOf(segment).replaceAll(' ', '&nbsp;')}</b>${stray}</li>`;
}

function gpuHtml(gpu: GpuModel): string {
  const total = gpu.segments.reduce((sum, segment) => sum + widthOf(segment), 0);
  const describe = gpu.segments.map((segment) => `${segment.label} ${amountOf(segment)}`).join(', ');
  const bar = gpu.memoryKnown
    ? `<div class="bar" role="img" aria-label="GPU ${gpu.index} memory: ${escapeHtml(describe)}">${gpu.segments.map((segment) => segmentHtml(segment, total)).join('')}</div>`
    : '<div class="bar unknown">nvidia-smi reports no memory figures for this GPU</div>';
  const foreign = gpu.foreignProcesses.map((process) => `<li class="proc">${escapeHtml(processLabel(process))}</li>`);
  const idle = gpu.idleShards.map((id) => `<li class="idle">${escapeHtml(id)}: given this GPU, holds no memory on it</li>`);
  const unreachable = gpu.unreachable === null ? [] : [`<li class="unreachable">${UNREACHABLE_NOTE}. It says: ${escapeHtml(gpu.unreachable)}</li>`];
  const badge = gpu.unreachable === null ? '' : '<span class="badge gpu-lost">unreachable</span>';
  return `<div class="gpu${gpu.unreachable === null ? '' : ' unreachable'}">
<div class="gpu-id"><span class="gpu-index">GPU ${gpu.index}</span><span class="gpu-name">${escapeHtml(gpu.name)}</span>${gpu.mig ? `<span class="gpu-mig" title="${MIG_NOTE}">MIG</span>` : ''}${badge}</div>
${bar}
<span class="gpu-used">${formatMemoryUse(gpu.usedMiB, gpu.totalMiB)}</span>
<span class="gpu-uuid" title="${escapeHtml(gpu.uuid)}">${escapeHtml(gpu.uuid)}</span>
<ul class="legend">${[...unreachable, ...gpu.segments.filter((segment) => segment.kind !== 'reserved').map(legendHtml), ...foreign, ...idle].join('')}</ul>
</div>`;
}

/** A lost GPU's row: struck out and greyed, a grey bar with no figures, and the shards placed on it (their verdicts say why). */
function lostGpuHtml(gpu: LostGpuModel, now: number): string {
  const placed =
    gpu.placed.length > 0
      ? gpu.placed.map(
          (shard) =>
            `<li><i class="sw shard ${colourClass(shard.color)}" aria-hidden="true"></i>${escapeHtml(shard.id)}: placed on it, <span class="badge ${shard.state}">${shard.state}</span></li>`,
        )
      : [`<li>${NOT_PLACED}</li>`];
  const taken = indexTakenNote(gpu);
  if (taken !== null) placed.unshift(`<li>${escapeHtml(taken)}</li>`);
  if (gpu.said !== undefined) placed.unshift(`<li class="unreachable">${escapeHtml(saidOfBusId(gpu.busId, gpu.said))}</li>`);
  return `<div class="gpu lost">
<div class="gpu-id"><span class="gpu-index">GPU ${gpu.index}</span><span class="gpu-name">${escapeHtml(gpu.name)}</span><span class="badge gpu-lost">lost</span></div>
<div class="bar lost"><span>no longer listed by nvidia-smi: memory unknown, not free</span></div>
<span class="gpu-used">unknown</span>
<span class="gpu-uuid" title="${escapeHtml(gpu.uuid)}">${escapeHtml(gpu.uuid)}</span>
<ul class="legend"><li>missing since ${when(gpu.lostAt)} (${formatDuration(now - gpu.lostAt)} ago), last listed ${when(gpu.lastListedAt)}</li>${placed.join('')}</ul>
</div>`;
}

/** One key for every bar, so each GPU's legend only names what is on it. */
const KEY_HTML =
  '<ul class="key" aria-label="Key">' +
  '<li><i class="sw shard c0" aria-hidden="true"></i><i class="sw shard c1" aria-hidden="true"></i>a shard (one colour each; red outline: a GPU it was not given)</li>' +
  '<li><i class="sw foreign" aria-hidden="true"></i>foreign: held by no registered shard</li>' +
  '<li><i class="sw reserved" aria-hidden="true"></i>reserved by the driver</li>' +
  '<li><i class="sw free" aria-hidden="true"></i>free</li></ul>';

function listOrDash(items: string[]): string {
  return items.length > 0 ? items.map(escapeHtml).join('<br>') : '<span class="none">none</span>';
}

function heldHtml(row: ShardRow): string {
  if (row.held === null) return '<span class="none">unknown</span>';
  const strays = row.strays.map((label) => `<span class="stray-tag">${escapeHtml(label)} (not given)</span>`);
  return row.held.length + strays.length > 0 ? [...row.held.map(escapeHtml), ...strays].join('<br>') : '<span class="none">none</span>';
}

function shardRowHtml(row: ShardRow): string {
  const reason = row.reason === null ? '' : `<p>${escapeHtml(row.reason)}</p>`;
  const warnings = row.warnings.map((warning) => `<p class="warning">Warning: ${escapeHtml(warning)}</p>`).join('');
  const note = reason + warnings || '<span class="none">-</span>';
  return `<tr>
<th scope="row"><i class="sw shard ${colourClass(row.color)}" aria-hidden="true"></i><span class="id">${escapeHtml(row.id)}</span><small>${escapeHtml(row.engine)} · ${escapeHtml(row.process)}</small></th>
<td data-label="State"><span class="badge ${row.state}">${row.state}</span></td>
<td class="given" data-label="Given">${listOrDash(row.given.map((label) => `GPU ${label}`))}</td>
<td class="held" data-label="Held">${heldHtml(row)}</td>
<td class="why" data-label="Reason">${note}</td>
</tr>`;
}

/** Below this width the shard table becomes one card per shard, each cell labelled. */
const CARDS_BELOW_PX = 900;
/** Below this width a GPU's row stacks: name and figures, then its bar, its legend and its UUID, each the full width. */
const STACK_BELOW_PX = 700;

const CSS = `
:root{--fg:#1f2328;--muted:#57606a;--line:#d0d7de;--bg:#f6f8fa;--card:#fff}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg)}
header{background:#1f2328;color:#fff;padding:14px 28px;display:flex;flex-wrap:wrap;align-items:baseline;gap:6px 22px}
header h1{font-size:20px;margin:0;font-weight:650;overflow-wrap:anywhere}
header h1 .host{font-weight:400;color:#c9d1d9}
header .meta{margin:0;color:#c9d1d9;font-size:13px}
header .meta .outage{color:#ffb3ad;font-weight:600}
.counts{list-style:none;margin:0 0 0 auto;padding:0;display:flex;flex-wrap:wrap;gap:8px}
main{padding:16px 28px 8px;max-width:1480px}
h2{font-size:15px;margin:18px 0 8px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.banner{border-radius:6px;padding:10px 14px;margin:8px 0;border:1px solid}
.banner.error{background:#ffebe9;border-color:#cf222e;color:#82071e}
.banner.stale{background:#fff8c5;border-color:#bf8700;color:#4d2d00}
.banner code{font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;white-space:pre-wrap;overflow-wrap:anywhere;display:block;margin-top:4px}
.gpus{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:4px 16px}
.gpu{display:grid;grid-template-columns:200px minmax(0,1fr) 130px;grid-template-areas:"id bar used" "uuid legend legend";column-gap:16px;row-gap:3px;align-items:center;padding:7px 0;border-bottom:1px solid #eaeef2}
.gpu:last-child{border-bottom:0}
.gpu-id{grid-area:id;min-width:0;overflow-wrap:anywhere}
.gpu-index{font-weight:700;margin-right:10px}
.gpu-mig{margin-left:8px;padding:0 6px;border:1px solid currentColor;border-radius:4px;font-size:11px}
.gpu-uuid{grid-area:uuid;min-width:0;color:var(--muted);font:10px/1.3 ui-monospace,"DejaVu Sans Mono",monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.gpu-used{grid-area:used;text-align:right;font-variant-numeric:tabular-nums;font-weight:600;white-space:nowrap}
.section-head{display:flex;align-items:baseline;gap:16px;flex-wrap:wrap}
.key{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px;color:var(--muted)}
.bar{grid-area:bar;min-width:0;display:flex;height:22px;border-radius:4px;overflow:hidden;border:1px solid #afb8c1;background:#fff}
.bar.unknown{align-items:center;padding:0 8px;color:var(--muted);font-size:12px;white-space:nowrap;text-overflow:ellipsis;background:repeating-linear-gradient(135deg,#f6f8fa 0 6px,#eaeef2 6px 12px)}
.gpu.lost .gpu-index,.gpu.lost .gpu-name{color:var(--muted);text-decoration:line-through}
.gpu.lost .gpu-used{color:var(--muted);font-weight:400}
.gpu-id .badge{margin-left:8px}
.bar.lost{height:auto;min-height:22px;align-items:center;padding:2px 8px;color:var(--muted);font-size:12px;line-height:1.3;border-style:dashed;background:#eaeef2}
.seg{min-width:0;display:flex;align-items:center;overflow:hidden;white-space:nowrap;font-size:12px;font-weight:600}
.seg span{padding:0 6px;overflow:hidden;text-overflow:ellipsis}
.seg.shard{min-width:3px}
.seg+.seg{border-left:1px solid #fff}
.foreign{background:repeating-linear-gradient(135deg,#6e7781 0 4px,#afb8c1 4px 8px);color:#fff}
.foreign span{background:#57606a;border-radius:3px;margin:0 4px;padding:0 4px}
.reserved{background:#424a53}
.free{background:#fff}
.stray{box-shadow:inset 0 0 0 2px #cf222e}
${PALETTE.map(([bg, fg], i) => `.c${i}{background:${bg};color:${fg}}`).join('\n')}
.f1{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.5) 0 3px,transparent 3px 7px)}
.f2{background-image:radial-gradient(rgba(0,0,0,.45) 1.5px,transparent 2px);background-size:5px 5px}
.seg.f1 span,.seg.f2 span{background-color:inherit;border-radius:3px;margin:0 3px}
.legend{grid-area:legend;min-width:0;list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px;color:var(--muted)}
.legend li{min-width:0;overflow-wrap:anywhere}
.legend b{color:var(--fg);font-weight:600}
.legend em{color:#cf222e;font-style:normal;font-weight:600}
.legend .idle,.legend .unreachable,.empty.unreachable{color:#82071e}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px;border:1px solid rgba(0,0,0,.25)}
.table-wrap{overflow-x:auto;background:var(--card);border:1px solid var(--line);border-radius:8px}
table{width:100%;border-collapse:collapse}
th,td{text-align:left;vertical-align:top;padding:8px 12px;border-bottom:1px solid #eaeef2}
tbody tr:last-child th,tbody tr:last-child td{border-bottom:0}
thead th{white-space:nowrap;background:#eaeef2;font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
tbody th{position:relative;padding-left:30px;min-width:calc(30px + 14ch);font-weight:600}
tbody th>.sw{position:absolute;left:12px;top:12px}
tbody th .id,tbody th small{display:block;max-width:36ch;overflow-wrap:anywhere}
tbody th small{font-weight:400;color:var(--muted)}
td{font-variant-numeric:tabular-nums}
td.given{white-space:nowrap}
td.held{min-width:11ch}
td.why{min-width:26ch;max-width:620px;font-size:13px;overflow-wrap:anywhere}
td.why p{margin:0 0 4px}
.note{margin:0;padding:6px 2px;font-size:12px}
.warning{color:#6f4a00}
.none{color:var(--muted)}
.stray-tag{color:#a40e26;font-weight:600}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:700;white-space:nowrap}
.badge.ready{background:#1a7f37;color:#fff}
.badge.starting{background:#f2c744;color:#1f2328}
.badge.on-cpu{background:#cf222e;color:#fff}
.badge.gpu-lost{background:#82071e;color:#fff}
.badge.stopped{background:#8250df;color:#fff}
.badge.exited{background:#6e7781;color:#fff}
.badge.unverified{background:#0969da;color:#fff}
.empty{background:var(--card);border:1px dashed var(--line);border-radius:8px;padding:14px;color:var(--muted)}
footer{padding:8px 28px 18px;color:var(--muted);font-size:12px;overflow-wrap:anywhere}
footer a{color:#0550ae}
@media (max-width:${CARDS_BELOW_PX}px){
.shards thead{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);white-space:nowrap}
.shards,.shards tbody,.shards tr,.shards tbody th,.shards td{display:block}
.shards tr{padding:6px 0;border-bottom:1px solid #eaeef2}
.shards tbody tr:last-child{border-bottom:0}
.shards tbody th,.shards td{border:0;padding:3px 12px;min-width:0;max-width:none}
.shards tbody th{padding-left:30px}
.shards tbody th>.sw{top:7px}
.shards td{position:relative;padding-left:calc(12px + 6.5em);white-space:normal}
.shards td::before{content:attr(data-label);position:absolute;left:12px;top:5px;font-size:11px;font-weight:600;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.shards tbody th .id,.shards tbody th small{max-width:none}
}
@media (max-width:${STACK_BELOW_PX}px){
header{padding:12px 14px}
main{padding:12px 14px 8px}
footer{padding:8px 14px 18px}
.counts{margin-left:0}
.gpus{padding:4px 12px}
.gpu{grid-template-columns:minmax(0,1fr) auto;grid-template-areas:"id used" "bar bar" "legend legend" "uuid uuid";padding:9px 0}
.gpu-uuid{white-space:normal;overflow-wrap:anywhere}
}
`;

export function renderHtml(model: StatusModel): string {
  const counts = READINESS_STATES.filter((state) => model.counts[state] > 0)
    .map((state) => `<li><span class="badge ${state}">${model.counts[state]} ${state}</span></li>`)
    .join('');
  const meta = `${model.snapshot ? escapeHtml(snapshotLine(model)) : `<span class="outage">${escapeHtml(snapshotLine(model))}</span>`} · reloads every ${REFRESH_SECONDS} s`;
  const banners: string[] = [];
  if (model.error !== null) {
    banners.push(
      `<div class="banner error" role="alert"><strong>nvidia-smi cannot be asked, so no shard's GPU use can be verified.</strong> A shard it last saw ready is shown as unverified and keeps serving; one it last saw starting, on the CPU or on a lost GPU keeps that verdict, and one it has not seen since its registration reads starting. /proc still shows an exit or a stop, and an engine's own output the CPU. Check the driver on this node (run <code style="display:inline">nodecompute doctor</code>). nvidia-smi said:<code>${escapeHtml(model.error)}</code></div>`,
    );
  }
  if (model.processesHidden !== null) {
    banners.push(
      `<div class="banner error" role="alert"><strong>nodecompute cannot tell whose GPU memory is whose.</strong> All of it reads as foreign, and no shard can be verified.<code>${escapeHtml(model.processesHidden)}</code></div>`,
    );
  }
  if (model.lostGpus.length > 0) {
    const asOf = model.lastGood ? `${lostAsOf(model.lastGood.observedAt)} ` : '';
    const lines = model.lostGpus.map((gpu) => escapeHtml(lostLine(gpu, model.generatedAt)));
    banners.push(`<div class="banner error" role="alert"><strong>${LOST_GPUS}</strong> ${asOf}${LOST_GPUS_ADVICE}<code>${lines.join('\n')}</code></div>`);
  }
  const staleReason = model.staleBanner;
  if (staleReason) {
    banners.push(`<div class="banner stale" role="status"><strong>Showing an older snapshot.</strong><code>${escapeHtml(staleReason)}</code></div>`);
  }
  const gpuRows = inIndexOrder(model, gpuHtml, (gpu) => lostGpuHtml(gpu, model.generatedAt));
  const gpus = [
    ...(model.gpus.length > 0 ? [] : [`<p class="empty">No GPU figures: nvidia-smi gave none (see above).${model.lastGood && model.lostGpus.length > 0 ? ` ${LOST_ROWS_NOTE}` : ''}</p>`]),
    ...(model.gpus.length > 0 ? [] : model.unreachableGpus.map((gpu) => `<p class="empty unreachable">${escapeHtml(gpuUnreachable(gpu))}</p>`)),
    ...(gpuRows.length > 0 ? [`<div class="gpus">${gpuRows.join('\n')}</div>`] : []),
  ].join('\n');
  const shards =
    model.shards.length > 0
      ? `<div class="table-wrap"><table class="shards" aria-describedby="held-note">
<thead><tr><th scope="col">Shard</th><th scope="col">State</th><th scope="col">GPUs given</th><th scope="col">GPUs held</th><th scope="col">Reason and warnings</th></tr></thead>
<tbody>
${model.shards.map(shardRowHtml).join('\n')}
</tbody>
</table></div>
<p class="note none" id="held-note">${escapeHtml(HELD_NOTE)}</p>`
      : '<p class="empty">No shard is registered on this node. Register one with <code>PUT /shards/&lt;id&gt;</code> (see /docs).</p>';
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="${REFRESH_SECONDS}">
<title>${escapeHtml(`${model.host} · nodecompute · ${summary(model)}`)}</title>
<style>${CSS}</style>
</head>
<body>
<header>
<h1>nodecompute <span class="host">${escapeHtml(model.host)}</span></h1>
<p class="meta">${meta}</p>
<ul class="counts" aria-label="Shards by state">${counts}</ul>
</header>
<main>
${banners.join('\n')}
<section aria-labelledby="gpus-title">
<div class="section-head"><h2 id="gpus-title">GPUs</h2>${model.gpus.length > 0 ? KEY_HTML : ''}</div>
${gpus}
</section>
<section aria-labelledby="shards-title">
<h2 id="shards-title">Shards</h2>
${shards}
</section>
</main>
<footer>nodecompute ${escapeHtml(model.version)} · page made ${when(model.generatedAt)} · JSON: <a href="/shards">/shards</a> · <a href="/gpus">/gpus</a> · <a href="/gpus/foreign-memory">/gpus/foreign-memory</a> · <a href="/metrics">/metrics</a> · <a href="/docs">/docs</a> · as plain text: <code>curl</code> this address</footer>
</body>
</html>
`;
}

// ---------------------------------------------------------------------------------------------
// Plain text

/** Terminal-safe: no escape sequences or other control characters from process names or messages. */
export function plain(text: string): string {
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, '?');
}

export const TEXT_BAR_WIDTH = 50;

/** A GPU whose memory figures nvidia-smi does not report. */
const UNKNOWN_BAR = `[${'?'.repeat(TEXT_BAR_WIDTH)}]`;

const LOST_LABEL = ' lost: memory unknown ';
/** A lost GPU: no figures, and unlike the unknown bar, no GPU behind it. */
const LOST_BAR = `[${LOST_LABEL.padStart((TEXT_BAR_WIDTH + LOST_LABEL.length) / 2, '-').padEnd(TEXT_BAR_WIDTH, '-')}]`;

const BAR_CHAR: Record<SegmentKind, string> = { shard: '#', foreign: '=', reserved: ':', free: '.' };

/** Largest-remainder split of the bar's width, so the characters always add up to the width (memoryKnown: the total is above 0). */
function textBar(segments: Segment[]): string {
  const total = segments.reduce((sum, segment) => sum + widthOf(segment), 0);
  const exact = segments.map((segment) => (widthOf(segment) / total) * TEXT_BAR_WIDTH);
  const cells = exact.map(Math.floor);
  let left = TEXT_BAR_WIDTH - cells.reduce((sum, n) => sum + n, 0);
  const byRemainder = exact.map((value, i) => ({ i, rest: value - Math.floor(value) })).sort((a, b) => b.rest - a.rest);
  for (const { i } of byRemainder) {
    if (left === 0) break;
    cells[i]! += 1;
    left -= 1;
  }
  return `[${segments.map((segment, i) => BAR_CHAR[segment.kind].repeat(cells[i]!)).join('')}]`;
}

function table(header: string[], rows: string[][]): string[] {
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)));
  const line = (cells: string[]) =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column]!)))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)];
}

export function renderText(model: StatusModel): string {
  const out: string[] = [];
  out.push(`nodecompute ${model.version} on ${plain(model.host)}: ${summary(model)}`);
  out.push(snapshotLine(model));
  if (model.error !== null) {
    out.push('', "!! nvidia-smi cannot be asked, so no shard's GPU use can be verified (a shard it last saw ready is unverified and keeps serving; any other keeps its last verdict, or reads starting if nvidia-smi never saw it; /proc still shows exits and stops, an engine's output the CPU):");
    out.push(...plain(model.error).split('\n').map((line) => `!!   ${line}`));
  }
  if (model.lostGpus.length > 0) {
    const asOf = model.lastGood ? `${lostAsOf(model.lastGood.observedAt)} ` : '';
    out.push('', `!! ${LOST_GPUS} ${asOf}${LOST_GPUS_ADVICE}`, ...model.lostGpus.map((gpu) => `!!   ${plain(lostLine(gpu, model.generatedAt))}`));
  }
  if (model.processesHidden !== null) {
    out.push('', '!! nodecompute cannot tell whose GPU memory is whose (all of it reads as foreign, and no shard can be verified):', `!!   ${plain(model.processesHidden)}`);
  }
  const staleReason = model.staleBanner;
  if (staleReason) {
    out.push('', `!! showing an older snapshot: ${plain(staleReason)}`);
  }
  out.push('', 'GPUS  (# shards  = foreign  : reserved  . free)');
  if (model.gpus.length === 0) {
    out.push(`  none: nvidia-smi gave no GPU figures (see above)${model.lastGood && model.lostGpus.length > 0 ? `. ${LOST_ROWS_NOTE}` : ''}`);
    out.push(...model.unreachableGpus.map((gpu) => `  (UNREACHABLE) ${plain(gpuUnreachable(gpu))}`));
  }
  const listedRow = (gpu: GpuModel) => {
    const shards = gpu.segments
      .filter((segment) => segment.kind === 'shard' || segment.kind === 'foreign')
      .map((segment) => `${segment.label} ${amountOf(segment)}${segment.stray ? ' (NOT given)' : ''}`);
    const idle = gpu.idleShards.map((id) => `${id} holds nothing`);
    const marks = (gpu.mig ? ' (MIG)' : '') + (gpu.unreachable === null ? '' : ' (UNREACHABLE)');
    return [String(gpu.index), plain(gpu.name) + marks, gpu.memoryKnown ? textBar(gpu.segments) : UNKNOWN_BAR, formatMemoryUse(gpu.usedMiB, gpu.totalMiB), plain([...shards, ...idle].join(', '))];
  };
  const lostRow = (gpu: LostGpuModel) => [String(gpu.index), `${plain(gpu.name)} (LOST)`, LOST_BAR, 'unknown', plain(placedOn(gpu))];
  const gpuRows = inIndexOrder(model, listedRow, lostRow);
  if (gpuRows.length > 0) out.push(...table(['GPU', 'NAME', 'MEMORY', 'USED / TOTAL', 'HOLDERS'], gpuRows));
  if (model.gpus.some((gpu) => gpu.mig)) out.push(`  (MIG) ${MIG_NOTE}`);
  for (const gpu of model.gpus) if (gpu.unreachable !== null) out.push(`  (UNREACHABLE) GPU ${gpu.index}: ${UNREACHABLE_NOTE}. It says: ${plain(gpu.unreachable)}`);
  const foreign = model.gpus.flatMap((gpu) => gpu.foreignProcesses.map((process) => `  GPU ${gpu.index}: ${plain(processLabel(process))}`));
  if (foreign.length > 0) out.push('', 'FOREIGN PROCESSES', ...foreign);
  out.push('', 'SHARDS');
  if (model.shards.length === 0) out.push('  none registered: register one with PUT /shards/<id> (see /docs)');
  const shardRows = model.shards.map((row) => {
    const held = row.held === null ? 'unknown' : [...row.held, ...row.strays.map((label) => `${label} (NOT given)`)].join(', ') || 'none';
    const notes = [...(row.reason === null ? [] : [row.reason]), ...row.warnings.map((warning) => `warning: ${warning}`)];
    return [plain(row.id), row.state, row.given.join(',') || 'none', held, plain(notes.join(' | ') || '-')];
  });
  if (shardRows.length > 0) out.push(...table(['SHARD', 'STATE', 'GIVEN', 'HELD', 'REASON / WARNINGS'], shardRows));
  return `${out.join('\n')}\n`;
}
