// Lost GPUs on the status page, over hand-made views: a GPU nvidia-smi stopped listing keeps its row
// in its index position (struck out, a "lost" badge, no memory figures, the shards placed on it) in
// the HTML and the text alike; a renumbered node puts it before the GPU that took its index; and past
// max-stale the last good snapshot's lost GPUs are still shown, dated.
import t from 'tap';
import type { LostGpu } from '../../src/node-state/gpu-roster.js';
import type { GpuState, NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import { createNodeView, type NodeView } from '../../src/node-state/node-view.js';
import type { SnapshotView } from '../../src/node-state/snapshot.js';
import { shardCompute } from '../../src/shards/compute.js';
import { readiness } from '../../src/shards/readiness.js';
import type { ShardState } from '../../src/shards/shard-service.js';
import type { ShardRecord } from '../../src/shards/shard.js';
import type { ProcStat } from '../../src/system/procfs.js';
import { colourClass, shardColours } from '../../src/status-page/colours.js';
import { renderHtml } from '../../src/status-page/html.js';
import { statusModel, type StatusInput } from '../../src/status-page/model.js';
import { renderText } from '../../src/status-page/text.js';
import { gpuState } from '../helpers/gpu-state.js';

const NOW = Date.parse('2026-11-29T12:00:30Z');

function stat(pid: number, state = 'S'): ProcStat {
  return { pid, comm: `p${pid}`, state, ppid: 1, pgrp: pid, session: pid, startTime: 5, cpuTicks: 0 };
}

function shard(id: string, pid: number, gpus: number[], graceMs = 0): ShardRecord {
  return {
    id,
    pid,
    cgroup: null,
    gpus,
    engine: 'vllm',
    graceMs,
    registeredAt: NOW - 60_000,
    identity: { pid, pgid: pid, startTime: 5, name: `p${pid}` },
  };
}

/** GPU 3 (GPU-3), last listed 30 s ago, missing since 25 s ago. */
const LOST_3: LostGpu = { index: 3, uuid: 'GPU-3', name: 'NVIDIA H200', busId: '00000000:04:00.0', lastListedAt: NOW - 30_000, lostAt: NOW - 25_000 };

/** `stopped`: the PIDs among `pids` in state T. */
function snapshotOf(gpus: GpuState[], lostGpus: LostGpu[], pids: number[], stopped: number[] = []): NodeSnapshot {
  return {
    takenAt: NOW,
    gpus,
    proc: new Map(pids.map((pid) => [pid, stat(pid, stopped.includes(pid) ? 'T' : 'S')])),
    cgroupPids: new Map(),
    bootId: null,
    unmatchedProcesses: [],
    lostGpus,
    cpuCores: new Map(),
    modelFiles: new Map(),
    timings: { driverMs: 1, procMs: 1 },
  };
}

/** The page's input for a node whose snapshot is `snapshot`, with each shard judged as the service judges it. */
function input(snapshot: NodeSnapshot, shards: ShardRecord[]): StatusInput {
  const node: NodeView = createNodeView(snapshot, shards, 1);
  const states = shards.map((record): ShardState => {
    const verdict = readiness({ shard: record, node, engine: null, staleReason: null, now: NOW, unavailable: 'unused' });
    return { shard: record, readiness: verdict, compute: shardCompute(record, node, null, verdict.state), observedAt: NOW };
  });
  const view: SnapshotView<NodeSnapshot> = { snapshot, observedAt: NOW, startedAt: NOW, ageMs: 0, stale: false, staleReason: null, failing: false, slow: false };
  return { states, view, node, error: null, unreachable: [], host: 'gpu-node-7', version: '0.1.0', now: NOW };
}

/** The indices of the GPU rows, in page order. */
const htmlRows = (html: string) => [...html.matchAll(/<div class="gpu( lost)?">\n<div class="gpu-id"><span class="gpu-index">GPU (\d+)<\/span>/g)].map((m) => `${m[2]}${m[1] ? ' lost' : ''}`);
const textRows = (text: string) => text.split('\n').filter((line) => /^\d+ /.test(line));

/** The HTML of the lost row of GPU `index`. */
function lostBlock(html: string, index: number): string {
  return html.split('<div class="gpu lost">').find((block) => block.startsWith(`\n<div class="gpu-id"><span class="gpu-index">GPU ${index}</span>`))?.split('\n</div>')[0] ?? '';
}

t.test('a lost GPU keeps its row in its index position: struck out, a lost badge, its UUID and name, since when, no figures, and the shards placed on it', async (t) => {
  // GPU 3 is gone; llama-a and llama-c (its process stopped) were placed on it, llama-b holds GPU 0.
  const gpus = [0, 1, 2, 4, 5, 6, 7].map((index) => gpuState(index, index === 0 ? [[101, 20480]] : []));
  const shards = [shard('llama-a', 100, [3]), shard('llama-b', 101, [0]), shard('llama-c', 102, [3], 3_600_000)];
  const model = statusModel(input(snapshotOf(gpus, [LOST_3], [100, 101, 102], [102]), shards));
  const colourOf = (id: string) => model.shards.find((row) => row.id === id)!.color;
  t.same(model.lostGpus, [
    {
      ...LOST_3,
      indexTakenBy: null,
      placed: [
        { id: 'llama-a', state: 'gpu-lost', color: colourOf('llama-a') },
        { id: 'llama-c', state: 'stopped', color: colourOf('llama-c') },
      ],
    },
  ]);
  const claims = shards.map(({ id, registeredAt, gpus: given }) => ({ id, registeredAt, gpus: [...given, ...(id === 'llama-b' ? [0] : [])] }));
  t.same(Object.fromEntries(shardColours(claims)), Object.fromEntries(model.shards.map((row) => [row.id, row.color])), 'the shard colours are those of the shards alone: a lost GPU moves none');
  t.same(
    model.gpus.map((gpu) => gpu.index),
    [0, 1, 2, 4, 5, 6, 7],
    'the listed GPUs stay what nvidia-smi lists',
  );

  const html = renderHtml(model);
  t.same(htmlRows(html), ['0', '1', '2', '3 lost', '4', '5', '6', '7'], 'eight rows, the lost one where it was');
  const lost = lostBlock(html, 3);
  t.match(lost, '<span class="gpu-name">NVIDIA H200</span><span class="badge gpu-lost">lost</span>');
  t.match(lost, '<div class="bar lost"><span>no longer listed by the GPU driver: memory unknown, not free</span></div>');
  t.match(lost, '<span class="gpu-used">unknown</span>', 'no figures: its memory is unknown, not free');
  t.notMatch(lost, /class="seg|GiB|free:/, 'no segment, no size');
  t.match(lost, '<span class="gpu-uuid" title="GPU-3">GPU-3</span>');
  t.match(lost, '<li>missing since 2026-11-29 12:00:05 UTC (25.0 s ago), last listed 2026-11-29 12:00:00 UTC</li>');
  t.match(lost, `<li><i class="sw shard ${colourClass(colourOf('llama-a'))}" aria-hidden="true"></i>llama-a: placed on it, <span class="badge gpu-lost">gpu-lost</span></li>`);
  t.match(lost, `<li><i class="sw shard ${colourClass(colourOf('llama-c'))}" aria-hidden="true"></i>llama-c: placed on it, <span class="badge stopped">stopped</span></li>`);
  t.match(html, /<span class="id">llama-a<\/span>.*placed on GPU 3, but GPU 3 \(GPU-3, NVIDIA H200\) is no longer listed by the GPU driver \(missing since 2026-11-29T12:00:05.000Z\)/s, "the shard's own verdict says why");
  t.match(html, '<code>GPU 3 (GPU-3, NVIDIA H200), last listed 2026-11-29 12:00:00 UTC, missing since 2026-11-29 12:00:05 UTC (25.0 s ago)</code>', 'the banner stays, with the same dates');
  // Greyed and struck out, on the GPU rows' own grid: the narrow-screen stacking applies to it as to any GPU.
  const css = /<style>(.*)<\/style>/s.exec(html)![1]!;
  t.match(css, '.gpu.lost .gpu-index,.gpu.lost .gpu-name{color:var(--muted);text-decoration:line-through}');
  t.match(css, /\.bar\.lost\{[^}]*border-style:dashed/);
  t.notMatch(css, /\.gpu\.lost\{[^}]*grid/, 'no grid of its own');
  t.notMatch(html, /<script/);

  const text = renderText(model);
  const rows = textRows(text);
  t.same(rows.map((line) => line.split(' ')[0]), ['0', '1', '2', '3', '4', '5', '6', '7']);
  const row3 = rows[3]!;
  t.match(row3, /^3\s+NVIDIA H200 \(LOST\)\s+\[-{14} lost: memory unknown -{14}\]\s+unknown\s+placed on it: llama-a \(gpu-lost\), llama-c \(stopped\)$/);
  for (const line of rows) t.equal(line.indexOf('['), rows[0]!.indexOf('['), 'bars aligned');
  t.equal(row3.indexOf(']') - row3.indexOf('['), rows[0]!.indexOf(']') - rows[0]!.indexOf('['), 'as wide as a bar');
  t.match(text, '!!   GPU 3 (GPU-3, NVIDIA H200), last listed 2026-11-29 12:00:00 UTC, missing since 2026-11-29 12:00:05 UTC (25.0 s ago)');
  t.notMatch(text, 'As of the last good snapshot', 'the snapshot is current');
});

t.test('GPUs renumbered after the loss: the lost row comes before the GPU listed under its index now, and lists the shards of its own device', async (t) => {
  // nvidia-smi numbers the GPUs that are left 0 to 6: GPU-4 is GPU 3 now. llama-a was given GPU 3
  // without its UUID (taken on trust): judged by index, it computes there. llama-b was given GPU 3
  // with its UUID, GPU-3: that device is lost.
  const gpus = [0, 1, 2, 4, 5, 6, 7].map((was, index) => ({ ...gpuState(index, index === 3 ? [[100, 20480]] : []), uuid: `GPU-${was}` }));
  for (const gpu of gpus) for (const process of gpu.processes) process.gpuUuid = gpu.uuid;
  const byUuid = { ...shard('llama-b', 101, [3]), gpuUuids: ['GPU-3'] };
  const model = statusModel(input(snapshotOf(gpus, [LOST_3], [100, 101]), [shard('llama-a', 100, [3]), byUuid]));
  t.match(model.lostGpus, [{ index: 3, uuid: 'GPU-3', indexTakenBy: 'GPU-4', placed: [{ id: 'llama-b', state: 'gpu-lost' }] }]);
  t.same(model.shards.map((row) => row.state), ['ready', 'gpu-lost'], 'llama-a judged on the GPU numbered 3 now, llama-b on its own device');
  const html = renderHtml(model);
  t.same(htmlRows(html), ['0', '1', '2', '3 lost', '3', '4', '5', '6']);
  t.match(lostBlock(html, 3), /<li>the GPU driver lists GPU-4 as GPU 3 now<\/li><li><i class="sw shard [^"]+" aria-hidden="true"><\/i>llama-b: placed on it, <span class="badge gpu-lost">gpu-lost<\/span><\/li>/);
  t.notMatch(lostBlock(html, 3), 'llama-a');
  const rows = textRows(renderText(model));
  t.match(rows[3]!, /^3\s+NVIDIA H200 \(LOST\)\s+\[.*\]\s+unknown\s+the GPU driver lists GPU-4 as GPU 3 now; placed on it: llama-b \(gpu-lost\)$/);
  t.match(rows[4]!, /^3\s+NVIDIA H200\s+\[#/, 'the GPU numbered 3 now, holding llama-a');
  t.notMatch(rows[4]!, 'llama-b', 'llama-b is not idle on a GPU that is not its own');
});

t.test('a lost GPU with no shard placed on it says so; a lost last GPU comes last; what nvidia-smi called it is escaped', async (t) => {
  const lost7: LostGpu = { index: 7, uuid: 'GPU-7', name: 'H200 <b>&', busId: null, lastListedAt: NOW - 3_600_000, lostAt: NOW - 3_000_000 };
  const gpus = [0, 1, 2, 4, 5, 6].map((index) => gpuState(index, []));
  const model = statusModel(input(snapshotOf(gpus, [LOST_3, lost7], []), []));
  const html = renderHtml(model);
  t.same(htmlRows(html), ['0', '1', '2', '3 lost', '4', '5', '6', '7 lost']);
  t.match(html, /<title>[^<]*nodecompute · 2 GPUs LOST · no shards<\/title>/);
  t.match(lostBlock(html, 3), '<li>no shard is placed on it</li>');
  t.match(lostBlock(html, 7), '<span class="gpu-name">H200 &#60;b&#62;&#38;</span>');
  t.match(lostBlock(html, 7), 'missing since 2026-11-29 11:10:30 UTC (50 min ago), last listed 2026-11-29 11:00:30 UTC');
  t.match(html, 'GPU 7 (GPU-7, H200 &#60;b&#62;&#38;), last listed');
  const rows = textRows(renderText(model));
  t.match(rows[3]!, /\sunknown\s+no shard is placed on it$/);
  t.match(rows[7]!, /^7\s+H200 <b>& \(LOST\)\s/);
});

t.test("what nvidia-smi says of a lost GPU's bus id, while it lists the others, is in its row and the banners, escaped", async (t) => {
  // The "Unable to determine the device handle for GPU1: 0000:04:00.0: Unknown Error" line, and an edited one with markup.
  const said: LostGpu = { ...LOST_3, said: 'Unknown Error' };
  const marked: LostGpu = { index: 7, uuid: 'GPU-7', name: 'NVIDIA H200', busId: '00000000:08:00.0', lastListedAt: NOW - 30_000, lostAt: NOW - 25_000, said: 'GPU <is> lost & gone' };
  const gpus = [0, 1, 2, 4, 5, 6].map((index) => gpuState(index, []));
  const model = statusModel(input(snapshotOf(gpus, [said, marked], []), []));
  const html = renderHtml(model);
  t.match(lostBlock(html, 3), '<ul class="legend"><li>missing since 2026-11-29 12:00:05 UTC (25.0 s ago), last listed 2026-11-29 12:00:00 UTC</li><li class="unreachable">the GPU driver says of its bus id 00000000:04:00.0: &#34;Unknown Error&#34;</li><li>no shard is placed on it</li></ul>');
  t.match(lostBlock(html, 7), '<li class="unreachable">the GPU driver says of its bus id 00000000:08:00.0: &#34;GPU &#60;is&#62; lost &#38; gone&#34;</li>');
  t.match(html, '<code>GPU 3 (GPU-3, NVIDIA H200), last listed 2026-11-29 12:00:00 UTC, missing since 2026-11-29 12:00:05 UTC (25.0 s ago); the GPU driver says of its bus id 00000000:04:00.0: &#34;Unknown Error&#34;\nGPU 7 (GPU-7');
  const text = renderText(model);
  t.match(text, '!!   GPU 3 (GPU-3, NVIDIA H200), last listed 2026-11-29 12:00:00 UTC, missing since 2026-11-29 12:00:05 UTC (25.0 s ago); the GPU driver says of its bus id 00000000:04:00.0: "Unknown Error"\n');
  t.match(text, '!!   GPU 7 (GPU-7, NVIDIA H200), last listed 2026-11-29 12:00:00 UTC, missing since 2026-11-29 12:00:05 UTC (25.0 s ago); the GPU driver says of its bus id 00000000:08:00.0: "GPU <is> lost & gone"\n');
  t.notMatch(renderHtml(statusModel(input(snapshotOf(gpus, [LOST_3], []), []))), 'says of its bus id', 'nothing said, nothing shown');
});

t.test('past max-stale the last good snapshot still names the lost GPUs: rows and banner, dated, without its stale figures', async (t) => {
  const gpus = [0, 1, 2, 4, 5, 6, 7].map((index) => gpuState(index, []));
  // Lost at 11:59:20, by the last good snapshot, of 11:59:45; nvidia-smi has failed since.
  const lost3 = { ...LOST_3, lastListedAt: NOW - 75_000, lostAt: NOW - 70_000 };
  const lastGood = { observedAt: NOW - 45_000, ageMs: 45_000, snapshot: snapshotOf(gpus, [lost3], []) };
  const record = shard('llama-a', 100, [3]);
  const state: ShardState = {
    shard: record,
    readiness: readiness({ shard: record, node: null, engine: null, staleReason: null, now: NOW, unavailable: 'nvidia-smi exited with code 9' }),
    compute: null,
    observedAt: null,
  };
  const model = statusModel({ states: [state], view: null, node: null, error: 'nvidia-smi exited with code 9', unreachable: [], lastGood, maxStaleMs: 30_000, host: 'h', version: '0', now: NOW });
  t.same(model.gpus, [], "the last good snapshot's figures are too old to show");
  t.match(model.lostGpus, [{ index: 3, uuid: 'GPU-3', indexTakenBy: null, placed: [{ id: 'llama-a', state: 'unverified' }] }]);
  const asOf = /As of the last good snapshot, of 2026-11-29 11:59:45 UTC: .*whether they are listed again is unknown\. They fell off the bus/;

  const html = renderHtml(model);
  t.match(html, /<strong>The GPU driver no longer lists GPUs it listed earlier\.<\/strong> /);
  t.match(html, asOf);
  t.match(html, /<p class="empty">No GPU figures: .*last good snapshot no longer listed\.<\/p>\n<div class="gpus"><div class="gpu lost">/);
  t.same(htmlRows(html), ['3 lost'], 'the lost GPU alone');
  t.match(lostBlock(html, 3), '<span class="badge unverified">unverified</span>');
  t.match(html, 'is past max-stale (30.0 s)');

  const text = renderText(model);
  t.match(text, /!! The GPU driver no longer lists GPUs it listed earlier\. /);
  t.match(text, asOf);
  t.match(text, '!!   GPU 3 (GPU-3, NVIDIA H200), last listed 2026-11-29 11:59:15 UTC, missing since 2026-11-29 11:59:20 UTC (70.0 s ago)');
  t.match(text, /  none: the GPU driver gave no GPU figures .*last good snapshot no longer listed\.\nGPU /);
  t.same(textRows(text).map((line) => line.split(' ')[0]), ['3']);
  t.match(textRows(text)[0]!, /\(LOST\).*placed on it: llama-a \(unverified\)$/);

  const none = statusModel({ states: [], view: null, node: null, error: 'boom', unreachable: [], lastGood: { ...lastGood, snapshot: snapshotOf(gpus, [], []) }, maxStaleMs: 30_000, host: 'h', version: '0', now: NOW });
  t.match(renderHtml(none), '<p class="empty">No GPU figures: the GPU driver gave none (see above).</p>\n</section>', 'no GPU lost by then: no rows, no note');
  t.match(renderText(none), '  none: the GPU driver gave no GPU figures (see above)\n\n');
});
