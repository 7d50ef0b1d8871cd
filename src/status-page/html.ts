// Owns the status page as HTML: a self-contained page (inline CSS, no script, no external asset)
// that reloads itself. Every string from the node is escaped.
import { formatMemoryUse } from '../memory-size.js';
import { gpuUnreachable, saidOfBusId } from '../node-state/gpu-roster.js';
import { READINESS_STATES } from '../shards/verdict.js';
import { colourClass } from './colours.js';
import {
  amountOf, indexTakenNote, inIndexOrder, lostBanner, lostRowsNote, MIG_NOTE, missingSince, NOT_PLACED, OUTAGE_MEANING,
  processLabel, snapshotLine, summary, unreachableNote, when, widthOf,
  type GpuModel, type LostGpuModel, type Segment, type ShardRow, type StatusModel,
} from './model.js';
import { CSS } from './styles.js';

/** Seconds between the page's own reloads (meta refresh). */
const REFRESH_SECONDS = 5;

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** A colour square; `classes` after "sw". */
function swatch(classes: string): string {
  return `<i class="sw ${classes}" aria-hidden="true"></i>`;
}

function badge(kind: string, text: string = kind): string {
  return `<span class="badge ${kind}">${text}</span>`;
}

const HELD_NOTE =
  'GPUs held: every GPU whose memory the shard\'s processes hold, as the GPU driver lists them, a GPU it was not given marked "not given" (1 GiB = 1024 MiB, the unit nvidia-smi reports).';

/** Segments wider than this share of the bar carry their label inside; the legend names them all. */
const INLINE_LABEL_SHARE = 0.09;

function segmentHtml(segment: Segment, total: number): string {
  const colour = segment.color === null ? '' : ` ${colourClass(segment.color)}`;
  const inline = segment.kind !== 'free' && widthOf(segment) / total >= INLINE_LABEL_SHARE;
  const text = inline ? `<span>${escapeHtml(segment.label)} ${amountOf(segment)}</span>` : '';
  return `<div class="seg ${segment.kind}${colour}${segment.stray ? ' stray' : ''}" style="flex-grow:${widthOf(segment)}" title="${escapeHtml(segment.title)}">${text}</div>`;
}

function legendHtml(segment: Segment): string {
  const colour = segment.color === null ? '' : ` ${colourClass(segment.color)}`;
  const stray = segment.stray ? ' <em>not given this GPU</em>' : '';
  const amount = `<b>${amountOf(segment).replaceAll(' ', '&nbsp;')}</b>`;
  return `<li title="${escapeHtml(segment.title)}">${swatch(`${segment.kind}${colour}`)}${escapeHtml(segment.label)} ${amount}${stray}</li>`;
}

function gpuHtml(gpu: GpuModel): string {
  const total = gpu.segments.reduce((sum, segment) => sum + widthOf(segment), 0);
  const describe = gpu.segments.map((segment) => `${segment.label} ${amountOf(segment)}`).join(', ');
  const bar = gpu.memoryKnown
    ? `<div class="bar" role="img" aria-label="GPU ${gpu.index} memory: ${escapeHtml(describe)}">${gpu.segments.map((segment) => segmentHtml(segment, total)).join('')}</div>`
    : '<div class="bar unknown">The GPU driver reports no memory figures for this GPU</div>';
  const foreign = gpu.foreignProcesses.map((process) => `<li class="proc">${escapeHtml(processLabel(process))}</li>`);
  const idle = gpu.idleShards.map((id) => `<li class="idle">${escapeHtml(id)}: given this GPU, holds no memory on it</li>`);
  const unreachable = gpu.unreachable === null ? [] : [`<li class="unreachable">${escapeHtml(unreachableNote(gpu.unreachable))}</li>`];
  const unreachableBadge = gpu.unreachable === null ? '' : badge('gpu-lost', 'unreachable');
  const events = gpu.events === null ? [] : [`<li class="unreachable">${escapeHtml(gpu.events)}</li>`];
  const migs = gpu.migDevices.map((line) => `<li class="mig">${escapeHtml(line)}</li>`);
  const items = [...unreachable, ...events, ...migs, ...gpu.segments.filter((segment) => segment.kind !== 'reserved').map(legendHtml), ...foreign, ...idle];
  const busy = gpu.utilizationPct === null ? '' : `<span class="gpu-busy" title="${BUSY_NOTE}">${gpu.utilizationPct}% busy</span>`;
  const marks = `${gpu.mig ? `<span class="gpu-mig" title="${MIG_NOTE}">MIG</span>` : ''}${unreachableBadge}${busy}`;
  return gpuRow(gpu.unreachable === null ? '' : ' unreachable', gpu, marks, bar, formatMemoryUse(gpu.usedMiB, gpu.totalMiB), items);
}

/** A lost GPU's row: struck out, a bar with no figures, and the shards placed on it. */
function lostGpuHtml(gpu: LostGpuModel, now: number): string {
  const placed = gpu.placed.map(({ id, color, state }) => `<li>${swatch(`shard ${colourClass(color)}`)}${escapeHtml(id)}: placed on it, ${badge(state)}</li>`);
  const taken = indexTakenNote(gpu);
  const items = [
    `<li>${missingSince(gpu, now)}, last listed ${when(gpu.lastListedAt)}</li>`,
    ...(gpu.said === undefined ? [] : [`<li class="unreachable">${escapeHtml(saidOfBusId(gpu.busId, gpu.said))}</li>`]),
    ...(taken === null ? [] : [`<li>${escapeHtml(taken)}</li>`]),
    ...(placed.length > 0 ? placed : [`<li>${NOT_PLACED}</li>`]),
  ];
  const bar = '<div class="bar lost"><span>no longer listed by the GPU driver: memory unknown, not free</span></div>';
  return gpuRow(' lost', gpu, badge('gpu-lost', 'lost'), bar, 'unknown', items);
}

/** One GPU's row; `marks` and `bar` are HTML, `items` its legend's list items. */
function gpuRow(kind: string, gpu: { index: number; name: string; uuid: string }, marks: string, bar: string, used: string, items: string[]): string {
  return `<div class="gpu${kind}">
<div class="gpu-id"><span class="gpu-index">GPU ${gpu.index}</span><span class="gpu-name">${escapeHtml(gpu.name)}</span>${marks}</div>
${bar}
<span class="gpu-used">${used}</span>
<span class="gpu-uuid" title="${escapeHtml(gpu.uuid)}">${escapeHtml(gpu.uuid)}</span>
<ul class="legend">${items.join('')}</ul>
</div>`;
}

const BUSY_NOTE = "utilization.gpu: share of the driver's last sample period in which a kernel ran on this GPU, whoever ran it";

/** One key for every bar, so each GPU's legend only names what is on it. */
const KEY_HTML =
  '<ul class="key" aria-label="Key">' +
  `<li>${swatch('shard c0')}${swatch('shard c1')}a shard (one colour each; red outline: a GPU it was not given)</li>` +
  `<li>${swatch('foreign')}foreign: held by no registered shard</li><li>${swatch('reserved')}reserved by the driver</li><li>${swatch('free')}free</li></ul>`;

/** A cell's lines (HTML), or a muted "none". */
function cellLines(items: string[]): string {
  return items.length > 0 ? items.join('<br>') : '<span class="none">none</span>';
}

function heldHtml(row: ShardRow): string {
  if (row.held === null) return '<span class="none">unknown</span>';
  return cellLines([...row.held.map(escapeHtml), ...row.strays.map((label) => `<span class="stray-tag">${escapeHtml(label)} (not given)</span>`)]);
}

function shardRowHtml(row: ShardRow): string {
  const reason = row.reason === null ? '' : `<p>${escapeHtml(row.reason)}</p>`;
  const warnings = row.warnings.map((warning) => `<p class="warning">Warning: ${escapeHtml(warning)}</p>`).join('');
  const note = reason + warnings || '<span class="none">-</span>';
  const cpu = row.cpuCores === null ? '' : ` · CPU ${row.cpuCores} cores`;
  const weights = row.weights === null ? '' : ` · weights ${row.weights}`;
  const who = `<span class="id">${escapeHtml(row.id)}</span><small>${escapeHtml(row.engine)} · ${escapeHtml(row.process)}${cpu}${escapeHtml(weights)}</small>`;
  return `<tr>
<th scope="row">${swatch(`shard ${colourClass(row.color)}`)}${who}</th>
<td data-label="State">${badge(row.state)}</td>
<td class="given" data-label="Given">${cellLines(row.given.map((label) => escapeHtml(`GPU ${label}`)))}</td>
<td class="held" data-label="Held">${heldHtml(row)}</td>
<td class="why" data-label="Reason">${note}</td>
</tr>`;
}

export function renderHtml(model: StatusModel): string {
  const counts = READINESS_STATES.filter((state) => model.counts[state] > 0)
    .map((state) => `<li>${badge(state, `${model.counts[state]} ${state}`)}</li>`)
    .join('');
  const meta = `${model.snapshot ? escapeHtml(snapshotLine(model)) : `<span class="outage">${escapeHtml(snapshotLine(model))}</span>`} · reloads every ${REFRESH_SECONDS} s`;
  const banners: string[] = [];
  // `body` is HTML; `code`, nvidia-smi's or the node's words, is escaped.
  const banner = (head: string, body: string, code: string, kind = 'error') => {
    const role = kind === 'error' ? 'alert' : 'status';
    banners.push(`<div class="banner ${kind}" role="${role}"><strong>${head}</strong>${body}<code>${escapeHtml(code)}</code></div>`);
  };
  if (model.error !== null) {
    const meaning = ` Meanwhile ${OUTAGE_MEANING}. Run <code style="display:inline">nodecompute doctor</code>. The GPU driver said:`;
    banner("The GPU driver cannot be asked, so no shard's GPU use can be verified.", meaning, model.error);
  }
  if (model.processesHidden !== null) {
    banner('nodecompute cannot tell whose GPU memory is whose.', ' All of it reads as foreign, and no shard can be verified.', model.processesHidden);
  }
  const lost = lostBanner(model);
  if (lost !== null) banner(lost.head, ` ${lost.body}`, lost.lines.join('\n'));
  if (model.staleBanner) banner('Showing an older snapshot.', '', model.staleBanner, 'stale');
  const gpuRows = inIndexOrder(model, gpuHtml, (gpu) => lostGpuHtml(gpu, model.generatedAt));
  const rowsNote = lostRowsNote(model);
  const noFigures = [
    `<p class="empty">No GPU figures: the GPU driver gave none (see above).${rowsNote === null ? '' : ` ${rowsNote}`}</p>`,
    ...model.unreachableGpus.map((gpu) => `<p class="empty unreachable">${escapeHtml(gpuUnreachable(gpu))}</p>`),
  ];
  const gpus = [...(model.gpus.length > 0 ? [] : noFigures), ...(gpuRows.length > 0 ? [`<div class="gpus">${gpuRows.join('\n')}</div>`] : [])].join('\n');
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
