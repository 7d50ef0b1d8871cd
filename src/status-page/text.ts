// Owns the status page as aligned plain text, for curl and terminals: control characters from the
// node are replaced, so no process name can send escape sequences.
import { formatMemoryUse } from '../memory-size.js';
import { gpuUnreachable } from '../node-state/gpu-roster.js';
import {
  amountOf, indexTakenNote, inIndexOrder, lostBanner, lostRowsNote, MIG_NOTE, NOT_PLACED, OUTAGE_MEANING, processLabel, snapshotLine,
  summary, unreachableNote, widthOf, type GpuModel, type LostGpuModel, type Segment, type SegmentKind, type StatusModel,
} from './model.js';

/** Terminal-safe: control characters from the node become '?'. */
function plain(text: string): string {
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, '?');
}

export const TEXT_BAR_WIDTH = 50;

/** A GPU whose memory figures nvidia-smi does not report. */
const UNKNOWN_BAR = `[${'?'.repeat(TEXT_BAR_WIDTH)}]`;

const LOST_LABEL = ' lost: memory unknown ';
/** A lost GPU: no figures, and unlike the unknown bar, no GPU behind it. */
const LOST_BAR = `[${LOST_LABEL.padStart((TEXT_BAR_WIDTH + LOST_LABEL.length) / 2, '-').padEnd(TEXT_BAR_WIDTH, '-')}]`;

const BAR_CHAR: Record<SegmentKind, string> = { shard: '#', foreign: '=', reserved: ':', free: '.' };

/** Largest-remainder split, so the characters always add up to the width (memoryKnown: the total is above 0). */
function textBar(segments: Segment[]): string {
  const total = segments.reduce((sum, segment) => sum + widthOf(segment), 0);
  const exact = segments.map((segment) => (widthOf(segment) / total) * TEXT_BAR_WIDTH);
  const cells = exact.map(Math.floor);
  const left = TEXT_BAR_WIDTH - cells.reduce((sum, n) => sum + n, 0);
  const byRemainder = exact.map((value, i) => ({ i, rest: value - Math.floor(value) })).sort((a, b) => b.rest - a.rest);
  for (const { i } of byRemainder.slice(0, left)) cells[i]! += 1;
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

/** Where the shards placed on a lost GPU are, as its row says it. */
function placedOn(gpu: LostGpuModel): string {
  const placed = gpu.placed.length === 0 ? NOT_PLACED : `placed on it: ${gpu.placed.map((shard) => `${shard.id} (${shard.state})`).join(', ')}`;
  const taken = indexTakenNote(gpu);
  return taken === null ? placed : `${taken}; ${placed}`;
}

export function renderText(model: StatusModel): string {
  const out: string[] = [];
  out.push(`nodecompute ${model.version} on ${plain(model.host)}: ${summary(model)}`);
  out.push(snapshotLine(model));
  if (model.error !== null) {
    out.push('', `!! The GPU driver cannot be asked, so no shard's GPU use can be verified (${OUTAGE_MEANING}):`);
    out.push(...plain(model.error).split('\n').map((line) => `!!   ${line}`));
  }
  const lost = lostBanner(model);
  if (lost !== null) out.push('', `!! ${lost.head} ${lost.body}`, ...lost.lines.map((line) => `!!   ${plain(line)}`));
  if (model.processesHidden !== null) {
    out.push('', '!! nodecompute cannot tell whose GPU memory is whose (all of it reads as foreign, and no shard can be verified):');
    out.push(`!!   ${plain(model.processesHidden)}`);
  }
  if (model.staleBanner) out.push('', `!! showing an older snapshot: ${plain(model.staleBanner)}`);
  out.push('', 'GPUS  (# shards  = foreign  : reserved  . free)');
  if (model.gpus.length === 0) {
    const rowsNote = lostRowsNote(model);
    out.push(`  none: the GPU driver gave no GPU figures (see above)${rowsNote === null ? '' : `. ${rowsNote}`}`);
    out.push(...model.unreachableGpus.map((gpu) => `  (UNREACHABLE) ${plain(gpuUnreachable(gpu))}`));
  }
  const listedRow = (gpu: GpuModel) => {
    const shards = gpu.segments
      .filter((segment) => segment.kind === 'shard' || segment.kind === 'foreign')
      .map((segment) => `${segment.label} ${amountOf(segment)}${segment.stray ? ' (NOT given)' : ''}`);
    const idle = gpu.idleShards.map((id) => `${id} holds nothing`);
    const marks = (gpu.mig ? ' (MIG)' : '') + (gpu.unreachable === null ? '' : ' (UNREACHABLE)');
    const bar = gpu.memoryKnown ? textBar(gpu.segments) : UNKNOWN_BAR;
    return [String(gpu.index), plain(gpu.name) + marks, bar, formatMemoryUse(gpu.usedMiB, gpu.totalMiB), plain([...shards, ...idle].join(', '))];
  };
  const lostRow = (gpu: LostGpuModel) => [String(gpu.index), `${plain(gpu.name)} (LOST)`, LOST_BAR, 'unknown', plain(placedOn(gpu))];
  const gpuRows = inIndexOrder(model, listedRow, lostRow);
  if (gpuRows.length > 0) out.push(...table(['GPU', 'NAME', 'MEMORY', 'USED / TOTAL', 'HOLDERS'], gpuRows));
  if (model.gpus.some((gpu) => gpu.mig)) out.push(`  (MIG) ${MIG_NOTE}`);
  for (const gpu of model.gpus) if (gpu.unreachable !== null) out.push(`  (UNREACHABLE) GPU ${gpu.index}: ${plain(unreachableNote(gpu.unreachable))}`);
  for (const gpu of model.gpus) if (gpu.events !== null) out.push(`  (EVENTS) GPU ${gpu.index}: ${gpu.events}`);
  for (const gpu of model.gpus) out.push(...gpu.migDevices.map((line) => `  (MIG) GPU ${gpu.index}: ${plain(line)}`));
  const foreign = model.gpus.flatMap((gpu) => gpu.foreignProcesses.map((process) => `  GPU ${gpu.index}: ${plain(processLabel(process))}`));
  if (foreign.length > 0) out.push('', 'FOREIGN PROCESSES', ...foreign);
  out.push('', 'SHARDS');
  if (model.shards.length === 0) out.push('  none registered: register one with PUT /shards/<id> (see /docs)');
  const shardRows = model.shards.map((row) => {
    const held = row.held === null ? 'unknown' : [...row.held, ...row.strays.map((label) => `${label} (NOT given)`)].join(', ') || 'none';
    const notes = [...(row.reason === null ? [] : [row.reason]), ...row.warnings.map((warning) => `warning: ${warning}`)];
    const cpu = row.cpuCores === null ? '-' : String(row.cpuCores);
    return [plain(row.id), row.state, row.given.join(',') || 'none', held, cpu, row.weights ?? '-', plain(notes.join(' | ') || '-')];
  });
  if (shardRows.length > 0) out.push(...table(['SHARD', 'STATE', 'GIVEN', 'HELD', 'CPU CORES', 'WEIGHTS', 'REASON / WARNINGS'], shardRows));
  return `${out.join('\n')}\n`;
}

