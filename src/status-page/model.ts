// Owns what the status page says, as plain data: one model built from every shard's state and the
// snapshot they were judged on, which html.ts and text.ts render, and the words both views print.
// Pure: the route gathers the inputs from the cache, so the page never runs nvidia-smi.
import { formatDuration } from '../duration.js';
import { formatBytes, formatHeldMemory, formatMemory, formatMemoryUse } from '../memory-size.js';
import { foreignMemory, type ForeignProcess, type GpuForeignMemory } from '../node-state/foreign-memory.js';
import { saidOfBusId } from '../node-state/gpu-roster.js';
import type { GpuState, NodeSnapshot } from '../node-state/node-snapshot.js';
import { placedIndices, placementOf, type UnreachableKnownGpu, type UnreachableListedGpu } from '../node-state/placement.js';
import { snapshotMeta, unreachableSaid, type NodeView } from '../node-state/node-view.js';
import { staleNews, type SnapshotView } from '../node-state/snapshot.js';
import { READINESS_STATES, type ReadinessState } from '../shards/verdict.js';
import { deviceLabel } from '../shards/compute.js';
import type { ShardState } from '../shards/shard-service.js';
import type { ShardRecord } from '../shards/shard.js';
import type { ShardWeights } from '../shards/weights.js';
import { barColours, shardColours } from './colours.js';

export type SegmentKind = 'shard' | 'foreign' | 'reserved' | 'free';

/**
 * `label`: the shard id, or the kind; `mib`: null for a shard's [N/A] memory, drawn without width;
 * `color`: a shard's slot on this bar (colourClass); `upTo`: foreign memory that includes shard
 * processes' [N/A] memory, an upper bound; `title`: the tooltip; `stray`: a GPU it was not given.
 */
export interface Segment {
  kind: SegmentKind;
  label: string;
  mib: number | null;
  color: number | null;
  upTo: boolean;
  title: string;
  stray: boolean;
}

export type StatusModel = ReturnType<typeof statusModel>;
export type GpuModel = StatusModel['gpus'][number];
/** A GPU nvidia-smi no longer lists: no memory figures (unknown, not free). */
export type LostGpuModel = StatusModel['lostGpus'][number];
export type ShardRow = StatusModel['shards'][number];

/** What `shards.states()` answers, plus who and when this page is. */
export interface StatusInput {
  states: ShardState[];
  view: SnapshotView<NodeSnapshot> | null;
  node: NodeView | null;
  error: string | null;
  unreachable: readonly UnreachableListedGpu[];
  /** With no view, the cached snapshot however old (peek): it dates the outage and names its lost GPUs. */
  lastGood?: { observedAt: number; ageMs: number; snapshot: Pick<NodeSnapshot, 'gpus' | 'lostGpus'> } | null;
  maxStaleMs?: number;
  host: string;
  version: string;
  now: number;
}

export function processLabel(process: ForeignProcess): string {
  return `pid ${process.pid} ${process.name} (${formatHeldMemory(process.usedMiB)})`;
}

export function widthOf(segment: Segment): number {
  return segment.mib ?? 0;
}

function plainSegment(kind: Exclude<SegmentKind, 'shard'>, mib: number, title: string, upTo = false): Segment {
  return { kind, label: kind, mib, color: null, upTo, title, stray: false };
}

/** The Xid and double-bit ECC events NVML reported for a GPU, in a line; null when none came (or under nvidia-smi). */
function eventsNote(events: GpuState['events']): string | null {
  if (events === undefined) return null;
  const xids = Object.entries(events.xid).map(([xid, count]) => `Xid ${xid} x${count}`);
  const ecc = events.eccDoubleBit > 0 ? [`${events.eccDoubleBit} uncorrected (double-bit) ECC error(s)`] : [];
  if (xids.length + ecc.length === 0) return null;
  return `NVML reported ${[...xids, ...ecc].join(', ')} since nodecompute started: check \`dmesg\` (NVRM) before trusting this GPU's work`;
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
      title: `${shard.id}: ${formatHeldMemory(usage.usedMiB)} on GPU ${gpu.index}${usage.smUtilPct === null ? '' : `, SM ${usage.smUtilPct}% busy`}${stray ? ' (a GPU it was NOT given)' : ''}`,
      stray,
    });
  }
  if (foreign.foreignMiB !== null && foreign.foreignMiB > 0) {
    const holders = foreign.foreignProcesses.map(processLabel);
    const heldBy = holders.length > 0 ? ` - ${holders.join('; ')}` : ' (driver context or processes the GPU driver does not list)';
    const unreported = foreign.unreportedShardProcesses;
    const amount =
      unreported === 0
        ? formatMemory(foreign.foreignMiB)
        : `up to ${formatMemory(foreign.foreignMiB)} (it includes the memory of ${unreported} shard process(es) the GPU driver does not report)`;
    const title = `foreign: ${amount} held by no registered shard${heldBy}`;
    segments.push(plainSegment('foreign', foreign.foreignMiB, title, unreported > 0));
  }
  if (gpu.reservedMiB !== null && gpu.reservedMiB > 0) {
    segments.push(plainSegment('reserved', gpu.reservedMiB, `reserved by the driver: ${formatMemory(gpu.reservedMiB)}`));
  }
  if (gpu.freeMiB !== null) segments.push(plainSegment('free', gpu.freeMiB, `free: ${formatMemory(gpu.freeMiB)}`));
  const shards = segments.filter((segment) => segment.color !== null);
  barColours(shards.map((segment) => segment.color!)).forEach((colour, i) => {
    shards[i]!.color = colour;
  });
  return segments;
}

/** One line per MIG device NVML lists: its profile and UUID, memory, foreign memory and foreign processes. */
function migLines(gpu: GpuState, foreign: GpuForeignMemory): string[] {
  return (gpu.migDevices ?? []).map((mig, i) => {
    const split = foreign.migDevices![i]!;
    const others = split.foreignProcesses.length === 0 ? '' : ` (${split.foreignProcesses.map((process) => `PID ${process.pid} ${process.name}`).join(', ')})`;
    return `MIG ${mig.profile} ${mig.uuid}: ${formatMemoryUse(mig.usedMiB, mig.totalMiB)}, foreign ${formatHeldMemory(split.foreignMiB)}${others}`;
  });
}

function lostGpuModels(known: Pick<NodeSnapshot, 'gpus' | 'lostGpus'> | null, states: ShardState[], colors: Map<string, number>) {
  if (known === null) return [];
  const unlisted = states.map((state) => ({ state, unlisted: placementOf(state.shard, known.gpus).unlisted }));
  return known.lostGpus.map((gpu) => ({
    ...gpu,
    // The UUID of the GPU nvidia-smi lists under this index now.
    indexTakenBy: known.gpus.find((listed) => listed.index === gpu.index)?.uuid ?? null,
    placed: unlisted
      .filter(({ unlisted: gone }) => gone.some(({ index, uuid }) => (uuid === undefined ? index === gpu.index : uuid === gpu.uuid)))
      .map(({ state: { shard, readiness } }) => ({ id: shard.id, state: readiness.state, color: colors.get(shard.id)! })),
  }));
}

/** A warning ending with nvidia-smi's message points to the banner, which gives it once. */
function pointToBanner(warning: string, error: string | null): string {
  const suffix = `: ${error}`;
  return error !== null && warning.endsWith(suffix) ? `${warning.slice(0, -suffix.length)} (the GPU driver's message is at the top of the page)` : warning;
}

export function statusModel(input: StatusInput) {
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
  const gpus = listed.map((gpu, i) => {
    const segments = segmentsOf(gpu, foreign[i]!, input.states, colors);
    const holders = new Set(segments.filter((segment) => segment.kind === 'shard').map((segment) => segment.label));
    const unreachable = unreachableSaid(gpu.uuid, input.unreachable);
    return {
      index: gpu.index,
      uuid: gpu.uuid,
      name: gpu.name,
      mig: gpu.migMode === 'Enabled',
      migDevices: migLines(gpu, foreign[i]!),
      unreachable,
      events: eventsNote(gpu.events),
      // Not for a GPU nvidia-smi cannot reach: its figures are the last good snapshot's.
      utilizationPct: unreachable === null ? gpu.utilizationPct : null,
      totalMiB: gpu.totalMiB,
      usedMiB: gpu.usedMiB,
      // The bar can be drawn to scale.
      memoryKnown: gpu.totalMiB !== null && gpu.usedMiB !== null && segments.some((segment) => widthOf(segment) > 0),
      segments,
      foreignProcesses: foreign[i]!.foreignProcesses,
      // Shards given this GPU that hold no memory on it.
      idleShards: input.states.filter(({ shard }) => placed.get(shard.id)!.includes(gpu.index) && !holders.has(shard.id)).map(({ shard }) => shard.id),
    };
  });
  const shards = input.states.map(({ shard, readiness, compute }) => ({
    id: shard.id,
    state: readiness.state,
    engine: shard.engine,
    process: shard.pid !== null ? `pid ${shard.pid}` : `cgroup ${shard.cgroup}`,
    color: colors.get(shard.id)!,
    given: givenLabels(shard, input.node),
    // Null when nvidia-smi cannot be asked; strays: held but not given.
    held: compute ? compute.devices : null,
    strays: compute ? compute.strayGpus.map(deviceLabel) : [],
    // Null until two snapshots have read its processes, and when nvidia-smi cannot be asked.
    cpuCores: compute ? compute.cpuCores : null,
    // "4.0 GiB, 97% on GPU"; null where no model file is in view, or nvidia-smi cannot be asked.
    weights: compute ? weightsLabel(compute.weights) : null,
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
    // With no snapshot: the last good one, past max-stale, to date the outage.
    lastGood: lastGood && { observedAt: lastGood.observedAt, ageMs: lastGood.ageMs, maxStaleMs: input.maxStaleMs! },
    error: input.error,
    processesHidden: input.node?.processesHidden ?? null,
    lostGpus,
    // The GPUs nvidia-smi's failing queries say it cannot reach that a listing had, less the lost ones.
    unreachableGpus: input.unreachable.filter((gpu): gpu is UnreachableKnownGpu => gpu.listed !== null && !lostGpus.some((lost) => lost.uuid === gpu.listed!.uuid)),
    staleBanner: input.view ? staleNews(input.view) : null,
    gpus,
    shards,
    counts,
  };
}

/** A shard's given GPUs as registered and, where it differs, where nvidia-smi has each now. */
function givenLabels(shard: ShardRecord, node: NodeView | null): string[] {
  if (node === null) return shard.gpus.map(String);
  const placement = placementOf(shard, node.snapshot.gpus);
  return shard.gpus.map((index) => {
    const moved = placement.renumbered.find((gpu) => gpu.registered === index);
    if (moved !== undefined) return `${index}→${moved.now}`;
    return placement.unlisted.some((gpu) => gpu.index === index) ? `${index} lost` : String(index);
  });
}

/** A shard's weights for people: their size, the share on its GPUs and what stays mapped in host memory, as far as each is known. */
function weightsLabel(weights: ShardWeights): string | null {
  if (weights.files.length === 0) return null;
  const size = weights.bytes === null ? 'size unknown' : formatBytes(weights.bytes);
  const share = weights.gpuShare === null ? 'share on GPU unknown' : `${Math.round(weights.gpuShare * 100)}% on GPU`;
  const host = weights.hostBytes === null ? '' : `, ${formatBytes(weights.hostBytes)} in host memory`;
  return `${size}, ${share}${host}`;
}

// The words both views print.

export const MIG_NOTE = 'MIG is enabled: these memory figures are for the whole GPU; each MIG device has its own line where NVML lists them';
export const NOT_PLACED = 'no shard is placed on it';
/** What each shard reads while nvidia-smi cannot be asked. */
export const OUTAGE_MEANING =
  'a shard it last saw ready reads unverified and keeps serving; any other keeps its last verdict, or reads starting if never seen; ' +
  "/proc still shows exits and stops, an engine's output the CPU";

export function when(ms: number): string {
  return `${new Date(ms).toISOString().slice(0, 19).replace('T', ' ')} UTC`;
}

/** The header's line on the snapshot: its time and age, or when the last good one was taken. */
export function snapshotLine(model: StatusModel): string {
  if (model.snapshot) return `GPU driver snapshot of ${when(Date.parse(model.snapshot.observedAt))} (${formatDuration(model.snapshot.ageMs)} old)`;
  if (model.lastGood === null) return 'no GPU driver snapshot';
  const { observedAt, ageMs, maxStaleMs } = model.lastGood;
  return `no GPU driver snapshot: the last good one, of ${when(observedAt)} (${formatDuration(ageMs)} ago), is past max-stale (${formatDuration(maxStaleMs)})`;
}

export function missingSince(gpu: LostGpuModel, now: number): string {
  return `missing since ${when(gpu.lostAt)} (${formatDuration(now - gpu.lostAt)} ago)`;
}

/** The lost GPUs' banner: its heading, what to do (dated past max-stale), and one line per GPU; null when none is lost. */
export function lostBanner(model: StatusModel): { head: string; body: string; lines: string[] } | null {
  if (model.lostGpus.length === 0) return null;
  const unknown = 'the GPU driver cannot be asked now, so whether they are listed again is unknown. ';
  const asOf = model.lastGood ? `As of the last good snapshot, of ${when(model.lastGood.observedAt)}: ${unknown}` : '';
  const lines = model.lostGpus.map((gpu) => {
    const line = `GPU ${gpu.index} (${gpu.uuid}, ${gpu.name}), last listed ${when(gpu.lastListedAt)}, ${missingSince(gpu, model.generatedAt)}`;
    return gpu.said === undefined ? line : `${line}; ${saidOfBusId(gpu.busId, gpu.said)}`;
  });
  const advice =
    'They fell off the bus, were reset or were detached, and shards placed on them cannot hold them. ' +
    'Check dmesg for NVIDIA Xid errors (79: fallen off the bus) and nvidia-smi -L; such a GPU usually needs a reset or the node a reboot.';
  return { head: 'The GPU driver no longer lists GPUs it listed earlier.', body: `${asOf}${advice}`, lines };
}

/** Past max-stale, with no GPU figures: the rows below are the last good snapshot's lost GPUs. */
export function lostRowsNote(model: StatusModel): string | null {
  return model.lastGood && model.lostGpus.length > 0 ? 'Below, the GPUs its last good snapshot no longer listed.' : null;
}

export function unreachableNote(said: string): string {
  return `The GPU driver cannot reach this GPU: nothing can compute on it, and its figures are from the last good snapshot. It says: ${said}`;
}

/** Which GPU has the lost one's index now, if any. */
export function indexTakenNote(gpu: LostGpuModel): string | null {
  return gpu.indexTakenBy === null ? null : `the GPU driver lists ${gpu.indexTakenBy} as GPU ${gpu.index} now`;
}

/** The GPU table's rows in index order, a lost GPU before the one listed under its index now. */
export function inIndexOrder<T>(model: StatusModel, listed: (gpu: GpuModel) => T, lost: (gpu: LostGpuModel) => T): T[] {
  const rows = [
    ...model.lostGpus.map((gpu) => ({ index: gpu.index, rank: 0, row: lost(gpu) })),
    ...model.gpus.map((gpu) => ({ index: gpu.index, rank: 1, row: listed(gpu) })),
  ];
  return rows.sort((a, b) => a.index - b.index || a.rank - b.rank).map(({ row }) => row);
}

/** The page's one line (tab title, the text view's first line), lost GPUs first. */
export function summary(model: StatusModel): string {
  const parts = READINESS_STATES.filter((state) => model.counts[state] > 0).map((state) => `${model.counts[state]} ${state}`);
  const shards = parts.length > 0 ? parts.join(', ') : 'no shards';
  const lost = model.lostGpus.length + model.unreachableGpus.length;
  return lost === 0 ? shards : `${lost} GPU${lost === 1 ? '' : 's'} LOST · ${shards}`;
}

/** What a segment holds: "up to" where it is an upper bound. */
export function amountOf(segment: Segment): string {
  return `${segment.upTo ? 'up to ' : ''}${formatHeldMemory(segment.mib)}`;
}
