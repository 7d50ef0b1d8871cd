// Owns the words both views of the status page print: the header's line on the snapshot, the lost
// GPUs' banner and rows, the notes, and the order of the GPU rows.
import { formatDuration } from '../duration.js';
import { formatHeldMemory } from '../memory-size.js';
import { saidOfBusId } from '../node-state/gpu-roster.js';
import { READINESS_STATES } from '../shards/verdict.js';
import type { GpuModel, LostGpuModel, Segment, StatusModel } from './model.js';

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
  if (model.snapshot) return `nvidia-smi snapshot of ${when(Date.parse(model.snapshot.observedAt))} (${formatDuration(model.snapshot.ageMs)} old)`;
  if (model.lastGood === null) return 'no nvidia-smi snapshot';
  const { observedAt, ageMs, maxStaleMs } = model.lastGood;
  return `no nvidia-smi snapshot: the last good one, of ${when(observedAt)} (${formatDuration(ageMs)} ago), is past max-stale (${formatDuration(maxStaleMs)})`;
}

export function missingSince(gpu: LostGpuModel, now: number): string {
  return `missing since ${when(gpu.lostAt)} (${formatDuration(now - gpu.lostAt)} ago)`;
}

/** The lost GPUs' banner: its heading, what to do (dated past max-stale), and one line per GPU; null when none is lost. */
export function lostBanner(model: StatusModel): { head: string; body: string; lines: string[] } | null {
  if (model.lostGpus.length === 0) return null;
  const unknown = 'nvidia-smi cannot be asked now, so whether they are listed again is unknown. ';
  const asOf = model.lastGood ? `As of the last good snapshot, of ${when(model.lastGood.observedAt)}: ${unknown}` : '';
  const lines = model.lostGpus.map((gpu) => {
    const line = `GPU ${gpu.index} (${gpu.uuid}, ${gpu.name}), last listed ${when(gpu.lastListedAt)}, ${missingSince(gpu, model.generatedAt)}`;
    return gpu.said === undefined ? line : `${line}; ${saidOfBusId(gpu.busId, gpu.said)}`;
  });
  const advice =
    'They fell off the bus, were reset or were detached, and shards placed on them cannot hold them. ' +
    'Check dmesg for NVIDIA Xid errors (79: fallen off the bus) and nvidia-smi -L; such a GPU usually needs a reset or the node a reboot.';
  return { head: 'nvidia-smi no longer lists GPUs it listed earlier.', body: `${asOf}${advice}`, lines };
}

/** Past max-stale, with no GPU figures: the rows below are the last good snapshot's lost GPUs. */
export function lostRowsNote(model: StatusModel): string | null {
  return model.lastGood && model.lostGpus.length > 0 ? 'Below, the GPUs its last good snapshot no longer listed.' : null;
}

export function unreachableNote(said: string): string {
  return `nvidia-smi cannot reach this GPU: nothing can compute on it, and its figures are from the last good snapshot. It says: ${said}`;
}

/** Which GPU has the lost one's index now, if any. */
export function indexTakenNote(gpu: LostGpuModel): string | null {
  return gpu.indexTakenBy === null ? null : `nvidia-smi lists ${gpu.indexTakenBy} as GPU ${gpu.index} now`;
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
