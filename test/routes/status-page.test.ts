// GET /, the status page, through the real app: the fake nvidia-smi replays an 8x H200 node on which
// real shard processes hold memory, so every state, a stray GPU, foreign and [N/A] memory appear in
// both the HTML and the plain text. A headless Chromium renders the page from a listening server
// to prove it is a real, self-contained page (and leaves a screenshot in test-artifacts/).
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t, { type Test } from 'tap';
import type { App } from '../../src/app.js';
import type { NodeSnapshot } from '../../src/node-state/node-snapshot.js';
import type { SnapshotView } from '../../src/node-state/snapshot.js';
import type { ShardState } from '../../src/shards/shard-service.js';
import { colourClass, shardHue } from '../../src/status-page/colours.js';
import { renderHtml } from '../../src/status-page/html.js';
import { statusModel } from '../../src/status-page/model.js';
import { renderText, TEXT_BAR_WIDTH } from '../../src/status-page/text.js';
import { prefersHtml } from '../../routes/status-page.js';
import { buildTestApp, manualClock, settle as settleRefresh, spawnShardProcess, type ShardProcess } from '../helpers/app.js';
import { driverQueries, failDriver, IDLE_SM_NOTE, NO_GPUS_SAID, REFRESH_FAILED_SAID, UNREACHABLE_SAID } from '../helpers/backend.js';
import { eightGpuNode, idleEightGpuNode, type FakeScenario } from '../helpers/fake-nvidia-smi.js';

const execFileAsync = promisify(execFile);
const CHROMIUM = '/usr/bin/chromium';
const ARTIFACTS = fileURLToPath(new URL('../../test-artifacts/', import.meta.url));
const BROWSER_ACCEPT = 'text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8';
const EVIL_NAME = '<script>alert("x")</script> & \'q\'';

/** The lead registers the page in buildApp; until then the test adds it itself. */
interface Node {
  app: App;
  shards: Record<'ready' | 'onCpu' | 'starting' | 'exited', ShardProcess>;
}

/**
 * GPU 0: alpha (ready) holds it; GPU 1: alpha again, a GPU it was not given (stray); GPU 2: bravo
 * was given it but holds nothing (on-cpu), a foreign python3 does; GPU 3: empty, no reserved
 * memory, given to charlie (starting); GPU 5: a foreign process whose name is HTML; GPU 6: a
 * foreign process with [N/A] memory; GPU 7: every memory figure [N/A] and a [Not Found] process.
 */
function scenarioFor(alpha: ShardProcess): FakeScenario {
  const node = eightGpuNode();
  const [g0, g1, , g3, , g5, , g7] = node.gpus;
  node.processes = node.processes.filter((p) => ![g0!.uuid, g1!.uuid, g3!.uuid].includes(p.gpuUuid));
  node.processes.unshift(
    { gpuUuid: g0!.uuid, pid: alpha.members[0]!, name: 'python3', usedMiB: 130004 },
    { gpuUuid: g1!.uuid, pid: alpha.members[0]!, name: 'python3', usedMiB: 20480 },
  );
  g1!.usedMiB = 20489;
  g1!.freeMiB = 143771 - 614 - 20489;
  Object.assign(g3!, { usedMiB: 0, reservedMiB: 0, freeMiB: 143771 });
  node.processes.find((p) => p.gpuUuid === g5!.uuid)!.name = EVIL_NAME;
  Object.assign(g7!, { totalMiB: '[N/A]', usedMiB: '[N/A]', freeMiB: '[N/A]', reservedMiB: '[N/A]' });
  return node;
}

async function register(t: Test, app: App, id: string, payload: Record<string, unknown>) {
  const res = await app.inject({ method: 'PUT', url: `/shards/${id}`, payload });
  t.equal(res.statusCode, 201, `${id} registered: ${res.body}`);
}

const EXPECTED: Record<string, string> = {
  'alpha-ready': 'ready',
  'bravo-on-cpu': 'on-cpu',
  'charlie-starting': 'starting',
  'delta-exited': 'exited',
  'echo-cpu-only': 'ready',
};

/**
 * Polls GET /shards until every shard has its expected state from a fresh snapshot. The clock is
 * manual, so once settled the cached snapshot stays fresh and every later page shows the same facts
 * however slow this machine is.
 */
async function settle(app: App, expected: Record<string, string>): Promise<void> {
  let last = '';
  for (let i = 0; i < 300; i += 1) {
    const res = await app.inject({ method: 'GET', url: '/shards' });
    const body = res.json() as { stale: boolean; shards: Array<{ id: string; status: { state: string } }> };
    const states = Object.fromEntries(body.shards.map((shard) => [shard.id, shard.status.state]));
    last = JSON.stringify({ stale: body.stale, states });
    if (!body.stale && !app.services.node.snapshots.refreshing && JSON.stringify(states) === JSON.stringify(expected)) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`shards never settled: ${last}`);
}

async function buildNode(t: Test): Promise<Node> {
  const [ready, onCpu, starting, exited, cpuOnly] = await Promise.all([1, 2, 3, 4, 5].map(() => spawnShardProcess(t, 1)));
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: scenarioFor(ready!), deps: { now: clock.now }, config: { smiTimeoutMs: 60_000 } });
  await register(t, app, 'alpha-ready', { pid: ready!.pid, gpus: [0] });
  await register(t, app, 'bravo-on-cpu', { pid: onCpu!.pid, gpus: [2], graceMs: 0 });
  await register(t, app, 'charlie-starting', { pid: starting!.pid, gpus: [3], graceMs: 3_600_000 });
  await register(t, app, 'delta-exited', { pid: exited!.pid, gpus: [4] });
  await register(t, app, 'echo-cpu-only', { pid: cpuOnly!.pid, gpus: [] });
  await exited!.kill();
  // Past the TTL, so the next snapshot sees delta's process gone.
  clock.advance(2000);
  await settle(app, EXPECTED);
  return { app, shards: { ready: ready!, onCpu: onCpu!, starting: starting!, exited: exited! } };
}

async function page(app: App, accept?: string, query = '') {
  const res = await app.inject({ method: 'GET', url: `/${query}`, headers: accept === undefined ? {} : { accept } });
  return res;
}

/** The plain-text line that starts with `prefix` (after trimming). */
function lineOf(text: string, prefix: string): string {
  return text.split('\n').find((line) => line.trimStart().startsWith(prefix)) ?? '';
}

t.test('the HTML page shows every GPU and shard with their memory and states', async (t) => {
  const { app } = await buildNode(t);
  const res = await page(app, BROWSER_ACCEPT);
  t.equal(res.statusCode, 200);
  t.equal(res.headers['content-type'], 'text/html; charset=utf-8');
  t.equal(res.headers.vary, 'Accept');
  t.equal(res.headers['cache-control'], 'no-store');
  const html = res.body;
  t.match(html, /^<!doctype html>\n<html lang="en">/);
  t.match(html, '<meta http-equiv="refresh" content="5">');
  t.match(html, /<title>[^<]*nodecompute · 2 ready, 1 starting, 1 on-cpu, 1 exited<\/title>/);
  t.notMatch(html, /<script|src=|@import|url\(|https?:\/\//, 'no script, no external asset');
  for (let index = 0; index < 8; index += 1) t.match(html, `<span class="gpu-index">GPU ${index}</span><span class="gpu-name">NVIDIA H200</span>`);
  t.match(html, '<span class="gpu-used">127.0 / 140.4 GiB</span>', 'GPU 0 used / total');
  t.match(html, '<span class="gpu-used">? / ? GiB</span>', 'GPU 7 reports [N/A]');
  t.match(html, 'The GPU driver reports no memory figures for this GPU');
  t.match(html, new RegExp(`title="alpha-ready: 127\\.0 GiB on GPU 0${IDLE_SM_NOTE}">\\s*<span>alpha-ready 127\\.0 GiB</span>`), 'shard segment, labelled, with a tooltip');
  t.match(html, `title="alpha-ready: 20.0 GiB on GPU 1${IDLE_SM_NOTE} (a GPU it was NOT given)"`);
  t.match(html, `class="seg shard ${colourClass(shardHue('alpha-ready'))} stray"`, "alpha's own colour: no shard shares its GPUs");
  t.match(html, /class="seg foreign" style="flex-grow:9" title="foreign: 9 MiB held by no registered shard \(driver context/, 'foreign residue on GPU 0');
  t.match(html, /class="seg free" style="flex-grow:13145" title="free: 12\.8 GiB"/);
  t.match(html, /class="seg reserved" style="flex-grow:614"/);
  t.match(html, 'bravo-on-cpu: given this GPU, holds no memory on it');
  t.match(html, 'charlie-starting: given this GPU, holds no memory on it');
  t.match(html, 'pid 1758887 [Not Found] (56.7 GiB)');
  t.match(html, 'pid 1425261 python3 (memory not reported)');
  const rows = [...html.matchAll(/<tr>\n<th scope="row">(.*?)<\/tr>/gs)].map((m) => m[1]!);
  t.equal(rows.length, 5, 'one row per shard');
  const row = (id: string) => rows.find((r) => r.includes(`<span class="id">${id}</span>`)) ?? '';
  t.match(row('alpha-ready'), '<span class="badge ready">ready</span>');
  t.match(row('alpha-ready'), '<td class="given" data-label="Given">GPU 0</td>');
  t.match(row('alpha-ready'), /<td class="held" data-label="Held">GPU 0: 127\.0 GiB<br><span class="stray-tag">GPU 1: 20\.0 GiB \(not given\)<\/span><\/td>/);
  t.match(row('alpha-ready'), 'Warning: holds memory on GPU 1, which it was not given');
  t.match(html, '(1 GiB = 1024 MiB, the unit nvidia-smi reports)', 'the HELD note names the binary unit');
  t.match(html, /<table class="shards" aria-describedby="held-note">.*<p class="note none" id="held-note">GPUs held: every GPU whose memory the shard&#39;s processes hold, as the GPU driver lists them, a GPU it was not given marked &#34;not given&#34;/s, 'the note says the column lists GPUs not given too');
  t.notMatch(html, 'the given GPUs whose memory', 'not the old caption, which said only given GPUs were listed');
  t.notMatch(html, /\d GB\b/, 'no size labelled in decimal units');
  t.match(row('bravo-on-cpu'), '<span class="badge on-cpu">on-cpu</span>');
  t.match(row('bravo-on-cpu'), 'placed on GPU 2 but computing on the CPU');
  t.match(row('charlie-starting'), '<span class="badge starting">starting</span>');
  t.match(row('charlie-starting'), 'waiting for the shard to hold memory on GPU 3');
  t.match(row('delta-exited'), '<span class="badge exited">exited</span>');
  t.match(row('delta-exited'), "the shard&#39;s process exited");
  t.match(row('echo-cpu-only'), '<span class="badge ready">ready</span>');
  for (const id of Object.keys(EXPECTED)) {
    t.same([...row(id).matchAll(/data-label="(\w+)"/g)].map((m) => m[1]), ['State', 'Given', 'Held', 'Reason'], `${id}: every cell labelled for the narrow-screen cards`);
  }
  t.match(row('echo-cpu-only'), /<td class="given" data-label="Given"><span class="none">none<\/span><\/td>\n<td class="held" data-label="Held"><span class="none">none<\/span><\/td>\n<td class="why" data-label="Reason"><span class="none">-<\/span><\/td>/);
  // Responsive without a script: a phone stacks each GPU (its bar the full width), the shard table
  // turns into labelled cards, and a long id wraps within a bounded width instead of pushing the reason off-screen.
  const css = /<style>(.*)<\/style>/s.exec(html)![1]!;
  t.match(html, '<meta name="viewport" content="width=device-width, initial-scale=1">');
  t.match(css, /@media \(max-width:700px\)\{[^@]*\.gpu\{grid-template-columns:minmax\(0,1fr\) auto;grid-template-areas:"id used" "bar bar" "legend legend" "uuid uuid"/, 'a narrow screen stacks each GPU');
  t.match(css, /\.gpu\{display:grid;grid-template-columns:200px minmax\(0,1fr\) 130px;grid-template-areas:"id bar used" "uuid legend legend"/, 'a wide one keeps the row');
  t.match(css, /@media \(max-width:900px\)\{[^@]*\.shards td::before\{content:attr\(data-label\)/, 'below 900 px each shard is a card, its cells labelled');
  t.match(css, '.table-wrap{overflow-x:auto', 'a table wider than the screen scrolls rather than being cut off');
  t.match(html, '<div class="table-wrap"><table class="shards"');
  t.match(css, 'tbody th .id,tbody th small{display:block;max-width:36ch;overflow-wrap:anywhere}', 'a 128-character id or a cgroup id wraps, within a bounded width');
  t.notMatch(css, /tbody th\{[^}]*nowrap/, 'no id is held on one line');
  t.match(css, /td\.why\{min-width:26ch;/, 'the reason keeps a readable width');
  t.match(css, '.legend li{min-width:0;overflow-wrap:anywhere}', 'a long process name or id in a legend wraps');
});

t.test('the plain-text page is an aligned table of the same facts', async (t) => {
  const { app, shards } = await buildNode(t);
  for (const accept of [undefined, '*/*', 'text/plain', 'application/json']) {
    const res = await page(app, accept);
    t.equal(res.headers['content-type'], 'text/plain; charset=utf-8', `Accept ${accept}`);
  }
  const text = (await page(app, '*/*')).body;
  t.match(text, /^nodecompute \S+ on .+: 2 ready, 1 starting, 1 on-cpu, 1 exited\nGPU driver snapshot of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((?:\d+ ms|\d+\.\d s) old\)\n/);
  t.notMatch(text, /&lt;|&#/, 'text is not HTML-escaped');
  const gpu0 = lineOf(text, '0 ');
  t.match(gpu0, /^0\s+NVIDIA H200\s+\[#{45}\.{5}\]\s+127\.0 \/ 140\.4 GiB\s+alpha-ready 127\.0 GiB, foreign 9 MiB$/);
  t.match(lineOf(text, '1 '), /\[#{7}:?\.+\]\s+20\.0 \/ 140\.4 GiB\s+alpha-ready 20\.0 GiB \(NOT given\)/);
  t.match(lineOf(text, '2 '), /foreign 103\.4 GiB, bravo-on-cpu holds nothing$/);
  t.match(lineOf(text, '3 '), /\[\.{50}\]\s+0 MiB \/ 140\.4 GiB\s+charlie-starting holds nothing$/);
  t.match(lineOf(text, '7 '), new RegExp(`\\[\\?{${TEXT_BAR_WIDTH}}\\]\\s+\\? / \\? GiB$`));
  for (const line of text.split('\n').filter((l) => /^\d\s/.test(l))) t.equal(line.indexOf('['), gpu0.indexOf('['), 'bars aligned');
  t.match(text, `GPU 5: pid 1425260 ${EVIL_NAME} (103.4 GiB)`);
  t.match(text, 'GPU 7: pid 1758887 [Not Found] (56.7 GiB)');
  const header = lineOf(text, 'SHARD ');
  t.match(header, /^SHARD\s+STATE\s+GIVEN\s+HELD\s+CPU CORES\s+WEIGHTS\s+REASON \/ WARNINGS$/);
  const alpha = lineOf(text, 'alpha-ready');
  t.match(alpha, /^alpha-ready\s+ready\s+0\s+GPU 0: 127\.0 GiB, GPU 1: 20\.0 GiB \(NOT given\)\s+(?:[\d.]+|-)\s+-\s+warning: holds memory on GPU 1/);
  t.equal(alpha.indexOf('ready', 'alpha-ready'.length), header.indexOf('STATE'), 'columns aligned');
  t.notMatch(text, /\d GB\b/, 'no size labelled in decimal units: the GPU table and HELD read alike');
  t.match(lineOf(text, 'bravo-on-cpu'), /^bravo-on-cpu\s+on-cpu\s+2\s+none\s+(?:[\d.]+|-)\s+-\s+placed on GPU 2 but computing on the CPU/);
  t.match(lineOf(text, 'charlie-starting'), /^charlie-starting\s+starting\s+3\s+none\s+(?:[\d.]+|-)\s+-\s+waiting for the shard/);
  t.match(lineOf(text, 'delta-exited'), new RegExp(`^delta-exited\\s+exited\\s+4\\s+none\\s+(?:[\\d.]+|-)\\s+-\\s+the shard's process exited: process ${shards.exited.pid} `));
  t.match(lineOf(text, 'echo-cpu-only'), /^echo-cpu-only\s+ready\s+none\s+none\s+(?:[\d.]+|-)\s+-\s+-$/);
});

t.test('Accept negotiation: only a client preferring text/html gets HTML; ?format overrides', async (t) => {
  const cases: Array<[string | undefined, boolean]> = [
    [undefined, false],
    ['', false],
    ['*/*', false],
    ['text/*', false],
    ['text/plain', false],
    ['application/json', false],
    ['text/html', true],
    ['TEXT/HTML', true],
    [BROWSER_ACCEPT, true],
    ['text/html;q=0.5, text/plain;q=0.9', false],
    ['text/plain;q=0.1, text/*;q=0.8', true],
    // A range with parameters applies to that media type only (RFC 9110 12.5.1): */* decides, a tie.
    ['text/html;level=1;q=0.7, */*;q=0.2', false],
    ['text/html;q=bogus, text/plain;q=0', false],
    ['text/html;q=2', true],
  ];
  for (const [accept, html] of cases) t.equal(prefersHtml(accept), html, `Accept: ${accept}`);
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  t.match((await page(app, BROWSER_ACCEPT)).headers['content-type'], 'text/html');
  t.match((await page(app, 'text/plain')).headers['content-type'], 'text/plain');
  t.match((await page(app, '*/*', '?format=html')).headers['content-type'], 'text/html');
  t.match((await page(app, BROWSER_ACCEPT, '?format=text')).headers['content-type'], 'text/plain');
  const bad = await page(app, '*/*', '?format=pdf');
  t.equal(bad.statusCode, 400);
  t.equal(bad.json().code, 'NODECOMPUTE_BAD_REQUEST');
  t.equal((await app.inject({ method: 'HEAD', url: '/' })).statusCode, 200);
  const doc = (await app.inject({ method: 'GET', url: '/openapi.json' })).json();
  const operation = doc.paths['/'].get;
  t.same(operation.tags, ['operators']);
  t.match(operation.summary, 'Status page');
  t.same(Object.keys(operation.responses['200'].content).sort(), ['text/html', 'text/plain'], 'both media types documented');
  t.match(bad.headers['content-type'], /^application\/json/);
  t.same(Object.keys(operation.responses['400'].content), ['application/json'], 'the 400 documented as what it is: JSON, not the page\'s types');
});

t.test('the page reads the cached snapshot: reloading it asks the driver no more', async (t) => {
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { now: clock.now }, config: { smiTimeoutMs: 60_000 } });
  await settle(app, {});
  await page(app, BROWSER_ACCEPT);
  const queries = await driverQueries(app, 'gpus');
  t.equal(queries, 1);
  for (let i = 0; i < 5; i += 1) {
    await page(app, BROWSER_ACCEPT);
    await page(app, '*/*');
  }
  await settleRefresh(app);
  t.equal(await driverQueries(app, 'gpus'), queries, 'ten more pages, no more driver queries within the TTL');
});

t.test('nvidia-smi cannot be asked: a banner with its words, and a shard it never saw listed as starting', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const { app } = await buildTestApp(t, {
    scenario: { ...eightGpuNode(), failures: { all: { kind: 'driver-unreachable' } } },
    deps: { now: manualClock().now },
    config: { smiTimeoutMs: 60_000 },
  });
  await register(t, app, 'alpha', { pid: shard.pid, gpus: [0, 1] });
  // On a slow machine the first pages may see the probe budget run out before nvidia-smi's answer.
  let html = '';
  const saidInHtml = UNREACHABLE_SAID.replace("'", '&#39;');
  for (let i = 0; i < 200 && !html.includes(saidInHtml); i += 1) {
    html = (await page(app, BROWSER_ACCEPT)).body;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  t.match(html, /<div class="banner error" role="alert"><strong>The GPU driver cannot be asked/);
  t.match(html, saidInHtml);
  t.match(html, 'No GPU figures: the GPU driver gave none (see above).');
  t.match(html, 'no GPU driver snapshot');
  t.match(html, '<span class="badge starting">starting</span>');
  t.match(html, /<span class="id">alpha<\/span>.*<td class="given" data-label="Given">GPU 0<br>GPU 1<\/td>\n<td class="held" data-label="Held"><span class="none">unknown<\/span><\/td>/s);
  const text = (await page(app)).body;
  t.match(text, "!! The GPU driver cannot be asked, so no shard's GPU use can be verified");
  t.match(text, new RegExp(`!!   ${REFRESH_FAILED_SAID}.*${UNREACHABLE_SAID}`));
  t.match(text, 'none: the GPU driver gave no GPU figures (see above)');
  t.match(lineOf(text, 'alpha'), /^alpha\s+starting\s+0,1\s+unknown\s+-\s+-\s+registered .* ago, and no listing of the GPU driver since has included it, .* \| warning: the GPU driver cannot be asked \(the GPU driver's message is at the top of the page\)$/);
  // nvidia-smi's words once, in the banner, not again in every shard's row.
  t.equal(html.split(saidInHtml).length - 1, 1, 'HTML: once');
  t.equal(text.split(UNREACHABLE_SAID).length - 1, 1, 'text: once');
  t.match(html, /<p class="warning">Warning: the GPU driver cannot be asked \(the GPU driver&#39;s message is at the top of the page\)<\/p><\/td>/);
  t.notMatch(html, 'past max-stale', 'never a snapshot, so no last good one to date');
});

t.test('an older snapshot served while nvidia-smi fails carries a stale banner', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { now: clock.now }, config: { smiTimeoutMs: 60_000 } });
  await settle(app, {});
  failDriver(fake, { kind: 'no-devices' });
  // Past the TTL: the next page starts a refresh, which fails; the page says so at once.
  clock.advance(2000);
  let text = '';
  for (let i = 0; i < 200 && !text.includes(NO_GPUS_SAID); i += 1) {
    text = (await page(app)).body;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  t.match(text, new RegExp(`!! showing an older snapshot: .*${NO_GPUS_SAID}`));
  t.match(lineOf(text, '0 '), /NVIDIA H200/, 'the last good GPUs are still shown');
  t.match((await page(app, 'text/html')).body, new RegExp(`<div class="banner stale" role="status"><strong>Showing an older snapshot.</strong><code>.*${NO_GPUS_SAID}`));
  t.notMatch(text, 'past max-stale', 'within max-stale the snapshot is served, and the header dates it');
  // Past max-stale (30 s) nothing is served, but the header still says when the last good snapshot was taken.
  const lastGood = app.services.node.snapshots.peek()!.observedAt;
  const stamp = new Date(lastGood).toISOString().slice(0, 19).replace('T', ' ');
  clock.advance(31_000);
  for (let i = 0; i < 200 && !text.includes('past max-stale'); i += 1) {
    text = (await page(app)).body;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  t.match(lineOf(text, 'no GPU driver snapshot'), `no GPU driver snapshot: the last good one, of ${stamp} UTC (33.0 s ago), is past max-stale (30.0 s)`);
  t.match(text, "!! The GPU driver cannot be asked, so no shard's GPU use can be verified", 'with the error banner');
  t.match((await page(app, 'text/html')).body, `<p class="meta"><span class="outage">no GPU driver snapshot: the last good one, of ${stamp} UTC (33.0 s ago), is past max-stale (30.0 s)</span> · reloads every 5 s</p>`);
});

t.test('a page after a quiet spell is one refresh behind: no stale banner, unless that refresh is slow', async (t) => {
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { now: clock.now }, config: { smiTimeoutMs: 600_000 } });
  await settle(app, {});
  // Nobody looked for 20 s (max-stale is 30 s): the page gets the old snapshot while one refresh runs,
  // a long one (real time), during which this clock does not move.
  fake.update((s) => ({ ...s, delayMs: 600_000 }));
  clock.advance(20_000);
  const quiet = (await page(app)).body;
  t.ok(app.services.node.snapshots.refreshing, 'a refresh is under way');
  t.notMatch(quiet, '!! showing an older snapshot', 'routine: no banner');
  t.notMatch(quiet, 'the GPU driver is slow', 'and no word against nvidia-smi');
  t.notMatch((await page(app, BROWSER_ACCEPT)).body, 'banner stale');
  // The refresh has now run for 5 s (far beyond the last one's time, and past 1 s).
  clock.advance(5_000);
  const slow = (await page(app)).body;
  t.match(slow, /!! showing an older snapshot: the GPU driver is slow: a refresh has been running for 5\.0 s \(the last one took \d+ ms\), so answers come from a snapshot 25\.0 s old/);
  t.match((await page(app, BROWSER_ACCEPT)).body, /<div class="banner stale" role="status"><strong>Showing an older snapshot.<\/strong><code>the GPU driver is slow: /);
});

t.test('GPU processes hidden from this /proc: a banner saying no memory can be attributed, and why', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  const scenario = eightGpuNode();
  // Every process nvidia-smi lists has a PID above Linux's largest pid_max: none is in this /proc.
  scenario.processes = scenario.processes.map((process, i) => ({ ...process, pid: 4194305 + i }));
  const { app } = await buildTestApp(t, { scenario });
  await register(t, app, 'alpha', { pid: shard.pid, gpus: [0], graceMs: 0 });
  await settle(app, { alpha: 'unverified' });
  const html = (await page(app, BROWSER_ACCEPT)).body;
  t.match(html, /<div class="banner error" role="alert"><strong>nodecompute cannot tell whose GPU memory is whose\.<\/strong>.*<code>.*PIDs do not exist/);
  t.match(html, 'hostPID: true (Kubernetes)');
  const text = (await page(app)).body;
  t.match(text, /!! nodecompute cannot tell whose GPU memory is whose .*\n!!   .*PIDs do not exist in this \/proc/);
  t.match(lineOf(text, 'alpha'), /^alpha\s+unverified\s/);
});

t.test('a node whose GPU processes are visible has no such banner', async (t) => {
  const alpha = await spawnShardProcess(t, 1);
  const { app } = await buildTestApp(t, { scenario: scenarioFor(alpha) });
  t.notMatch((await page(app, BROWSER_ACCEPT)).body, 'cannot tell whose GPU memory is whose');
  t.notMatch((await page(app)).body, 'cannot tell whose GPU memory is whose');
});

t.test('a node with no GPU (nvidia-smi: "No devices were found") and no shard says so', async (t) => {
  const { app } = await buildTestApp(t, { scenario: { gpus: [], processes: [], failures: { all: { kind: 'no-devices' } } } });
  const html = (await page(app, 'text/html')).body;
  t.match(html, NO_GPUS_SAID);
  t.match(html, 'No GPU figures: the GPU driver gave none (see above).');
  t.match(html, 'No shard is registered on this node.');
  t.match(html, /<title>[^<]*no shards<\/title>/);
  const text = (await page(app)).body;
  t.match(text, ': no shards\n');
  t.match(text, 'none registered: register one with PUT /shards/<id>');
});

/** The HTML of GPU `index`'s row. */
function gpuBlock(html: string, index: number): string {
  return html.split('<div class="gpu">').find((block) => block.startsWith(`\n<div class="gpu-id"><span class="gpu-index">GPU ${index}</span>`)) ?? '';
}

/** Shard id -> colour classes of its segment on GPU `index`'s bar. */
function barColoursOf(html: string, index: number): Record<string, string> {
  return Object.fromEntries([...gpuBlock(html, index).matchAll(/<div class="seg shard ([^"]+?)(?: stray)?" style="[^"]*" title="([^:]+):/g)].map((m) => [m[2]!, m[1]!]));
}

/** Shard id -> colour classes of its swatch in the shard table. */
function tableColoursOf(html: string): Record<string, string> {
  return Object.fromEntries([...html.matchAll(/<th scope="row"><i class="sw shard ([^"]+)" aria-hidden="true"><\/i><span class="id">([^<]+)<\/span>/g)].map((m) => [m[2]!, m[1]!]));
}

async function pageWhere(app: App, accept: string | undefined, done: (body: string) => boolean): Promise<string> {
  let body = '';
  for (let i = 0; i < 300 && !done(body); i += 1) {
    body = (await page(app, accept)).body;
    if (!done(body)) await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return body;
}

t.test('shard colours come from their ids: segments on one bar never share one, and a new shard moves no older one', async (t) => {
  const hue = (id: string) => shardHue(id);
  const old = 'mistral-old';
  // Two more ids of the same hue: one sorting after it, one sorting first (as the explorer's "aaa").
  const twin = Array.from({ length: 1000 }, (_, i) => `x-twin-${i}`).find((id) => hue(id) === hue(old))!;
  const first = Array.from({ length: 1000 }, (_, i) => `aaa-${i}`).find((id) => hue(id) === hue(old))!;
  const [a, b, c] = await Promise.all([1, 2, 3].map(() => spawnShardProcess(t, 1)));
  const node = idleEightGpuNode();
  const gpu0 = node.gpus[0]!;
  const held = (shard: ShardProcess) => ({ gpuUuid: gpu0.uuid, pid: shard.members[0]!, name: 'python3', usedMiB: 20480 });
  const withProcesses = (scenario: FakeScenario, shards: ShardProcess[]) => {
    scenario.processes = shards.map(held);
    scenario.gpus[0]!.usedMiB = 20480 * shards.length + 9;
    scenario.gpus[0]!.freeMiB = 143771 - 614 - scenario.gpus[0]!.usedMiB;
    return scenario;
  };
  const clock = manualClock();
  const { app, fake } = await buildTestApp(t, { scenario: withProcesses(node, [a!, b!]), deps: { now: clock.now }, config: { smiTimeoutMs: 60_000 } });
  await register(t, app, old, { pid: a!.pid, gpus: [0] });
  clock.advance(1000);
  await register(t, app, twin, { pid: b!.pid, gpus: [0] });
  clock.advance(1000);
  const before = await pageWhere(app, BROWSER_ACCEPT, (html) => Object.keys(barColoursOf(html, 0)).length === 2);
  const bar = barColoursOf(before, 0);
  t.equal(bar[old], colourClass(hue(old)), 'the older shard has its own colour');
  t.equal(bar[twin], colourClass((hue(old) + 1) % 10), 'the newer one, of the same hue, steps to the next colour');
  t.same(tableColoursOf(before), bar, 'the table shows each shard in its bar colour');

  fake.update((scenario) => withProcesses(scenario, [a!, b!, c!]));
  await register(t, app, first, { pid: c!.pid, gpus: [0] });
  clock.advance(1000);
  const after = await pageWhere(app, BROWSER_ACCEPT, (html) => Object.keys(barColoursOf(html, 0)).length === 3);
  const bar3 = barColoursOf(after, 0);
  t.equal(bar3[old], bar[old], `${first} sorts first, and ${old} keeps its colour`);
  t.equal(bar3[twin], bar[twin], `and so does ${twin}`);
  t.equal(new Set(Object.values(bar3)).size, 3, `three shards on GPU 0, three colours: ${JSON.stringify(bar3)}`);
  t.same(tableColoursOf(after), bar3);
  t.match(after, `.c${hue(old)}{background:`, 'its colour is defined');
});

t.test('[N/A] memory: foreign is "up to" on the bar, in the legend and in text; a GPU without memory figures draws no scale', async (t) => {
  const [na, mig] = await Promise.all([spawnShardProcess(t, 1), spawnShardProcess(t, 1)]);
  const node = eightGpuNode();
  const [g0, g1] = node.gpus;
  // GPU 0: the shard's process reports [N/A] (WSL2, vGPU), so its memory reads as foreign: an upper bound.
  node.processes = node.processes.filter((p) => p.gpuUuid !== g1!.uuid);
  node.processes.push({ gpuUuid: g0!.uuid, pid: na.members[0]!, name: 'llama-server', usedMiB: '[N/A]' });
  // GPU 1: MIG, memory figures withheld from an unprivileged pod; its shard's process reports 20 GiB.
  // Its process runs on a MIG device (NVML lists it there; nvidia-smi under the parent GPU).
  const migDevice = { profile: '7g.141gb', uuid: 'MIG-5f2c8a1e-0c6b-5d0e-9a57-2d1f3c4b5a69', gpuInstanceId: 0, computeInstanceId: 0 };
  Object.assign(g1!, { migMode: 'Enabled', migDevices: [migDevice], totalMiB: '[Insufficient Permissions]', usedMiB: '[Insufficient Permissions]', freeMiB: '[Insufficient Permissions]', reservedMiB: '[Insufficient Permissions]' });
  node.processes.push({ gpuUuid: g1!.uuid, pid: mig.members[0]!, name: 'python3', usedMiB: 20480, gpuInstanceId: 0, computeInstanceId: 0 });
  const { app } = await buildTestApp(t, { scenario: node, deps: { now: manualClock().now }, config: { smiTimeoutMs: 60_000 } });
  await register(t, app, 'na-shard', { pid: na.pid, gpus: [0] });
  await register(t, app, 'mig-shard', { pid: mig.pid, gpus: [1] });
  const html = await pageWhere(app, BROWSER_ACCEPT, (body) => body.includes('mig-shard <b>'));
  const gpu0 = gpuBlock(html, 0);
  t.match(gpu0, /<div class="seg foreign" style="flex-grow:130013" title="foreign: up to 127\.0 GiB \(it includes the memory of 1 shard process\(es\) the GPU driver does not report\)/);
  t.match(gpu0, '<span>foreign up to 127.0 GiB</span>', 'the label on the bar');
  t.match(gpu0, 'foreign <b>up&nbsp;to&nbsp;127.0&nbsp;GiB</b>', 'the legend');
  t.match(gpu0, 'aria-label="GPU 0 memory: na-shard memory not reported, foreign up to 127.0 GiB, reserved 614 MiB, free');
  t.match(gpu0, 'na-shard <b>memory&nbsp;not&nbsp;reported</b>');
  const gpu1 = gpuBlock(html, 1);
  t.match(gpu1, '<div class="bar unknown">The GPU driver reports no memory figures for this GPU</div>', 'no scale: not a white, free-looking bar');
  t.notMatch(gpu1, 'class="seg', 'no segment drawn');
  t.match(gpu1, 'mig-shard <b>20.0&nbsp;GiB</b>', 'the legend still names what the shard holds');
  t.match(gpu1, '<span class="gpu-mig"');
  t.notMatch(gpuBlock(html, 2), 'up to', 'a GPU whose shard processes report their memory gives an exact figure');
  const text = await pageWhere(app, undefined, (body) => body.includes('mig-shard 20.0 GiB'));
  t.match(lineOf(text, '0 '), /na-shard memory not reported, foreign up to 127\.0 GiB$/);
  t.match(lineOf(text, '1 '), new RegExp(`^1\\s+NVIDIA H200 \\(MIG\\)\\s+\\[\\?{${TEXT_BAR_WIDTH}}\\]\\s+\\? / \\? GiB\\s+mig-shard 20\\.0 GiB$`));
  t.match(lineOf(text, '2 '), /foreign 103\.4 GiB$/);
});

t.test('a cgroup shard is named by its cgroup', async (t) => {
  const state: ShardState = {
    shard: {
      id: 'pod-a',
      pid: null,
      cgroup: 'f00dfeedcafe',
      gpus: [0],
      engine: 'vllm',
      graceMs: 0,
      registeredAt: 0,
      identity: { pid: 1, pgid: 1, startTime: 1, name: 'x' },
    },
    readiness: { ready: true, state: 'unverified', cause: 'nvidia-smi-unavailable', reason: null, warnings: [] },
    compute: null,
    observedAt: null,
  };
  const model = statusModel({ states: [state], view: null as SnapshotView<NodeSnapshot> | null, node: null, error: 'boom', unreachable: [], host: 'h', version: '0', now: 0 });
  t.match(renderHtml(model), 'vllm · cgroup f00dfeedcafe');
  t.match(renderText(model), /^pod-a\s+unverified\s+0\s+unknown\s+-\s+-\s+-$/m);
});

t.test('a stopped shard: its own badge and count, its reason in the row; the outage banner says /proc still shows it', async (t) => {
  const reason = 'process 4242 (llama-server) is stopped (state T: it was sent SIGSTOP, ...). The verdict changes by itself once it runs again.';
  const state: ShardState = {
    shard: { id: 'paused', pid: 4242, cgroup: null, gpus: [0], engine: 'llama.cpp', graceMs: 0, registeredAt: 0, identity: { pid: 4242, pgid: 4242, startTime: 1, name: 'llama-server' } },
    readiness: { ready: false, state: 'stopped', cause: 'process-stopped', reason, warnings: ['the GPU driver cannot be asked, so which GPU memory it holds is unverified: boom'] },
    compute: null,
    observedAt: null,
  };
  const model = statusModel({ states: [state], view: null as SnapshotView<NodeSnapshot> | null, node: null, error: 'boom', unreachable: [], host: 'h', version: '0', now: 0 });
  const html = renderHtml(model);
  t.match(html, '.badge.stopped{background:#8250df;color:#fff}', 'a colour of its own, white on it readable (4.7:1)');
  t.match(html, '<li><span class="badge stopped">1 stopped</span></li>');
  t.match(html, '<td data-label="State"><span class="badge stopped">stopped</span></td>');
  t.match(html, '/proc still shows exits and stops');
  const text = renderText(model);
  t.match(text, /^nodecompute 0 on h: 1 stopped$/m);
  t.match(text, '/proc still shows exits and stops');
  const row = lineOf(text, 'paused');
  t.match(row, /^paused\s+stopped\s+0\s+unknown\s+-\s+-\s+process 4242 \(llama-server\) is stopped /);
  t.ok(row.endsWith(`${reason} | warning: the GPU driver cannot be asked, so which GPU memory it holds is unverified (the GPU driver's message is at the top of the page)`), 'the reason, then the warning, pointing at the banner');
});

// In CI chromium must be there (.ci/run installs it): a missing one fails the test instead of skipping it.
const withoutChromium = !existsSync(CHROMIUM) && !process.env.CI ? `${CHROMIUM} is not installed (apt-get install chromium); CI runs this test` : false;

t.test('headless Chromium renders the page: every GPU and shard in the DOM, and a screenshot', { skip: withoutChromium }, async (t) => {
  const { app } = await buildNode(t);
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  const url = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}/`;
  const chromium = async (...args: string[]) => {
    const profile = t.testdir({});
    const { stdout } = await execFileAsync(
      CHROMIUM,
      [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--hide-scrollbars',
        `--user-data-dir=${profile}`,
        ...args,
        url,
      ],
      { timeout: 90_000, maxBuffer: 16 * 1024 * 1024 },
    );
    return stdout;
  };
  const dom = await chromium('--dump-dom');
  t.match(dom, /<html lang="en">/);
  for (let index = 0; index < 8; index += 1) t.match(dom, `<span class="gpu-index">GPU ${index}</span>`);
  for (const [id, state] of Object.entries(EXPECTED)) {
    t.match(dom, new RegExp(`<span class="id">${id}</span>.*?<span class="badge ${state}">${state}</span>`, 's'), id);
  }
  t.notMatch(dom, /<script>alert/, 'the HTML process name stayed text');
  t.match(dom, '&lt;script&gt;alert("x")&lt;/script&gt; &amp;');
  mkdirSync(ARTIFACTS, { recursive: true });
  const png = join(ARTIFACTS, 'status-page.png');
  await chromium(`--screenshot=${png}`, '--window-size=1280,900');
  t.ok(existsSync(png) && statSync(png).size > 10_000, `screenshot written to ${png}`);
  const phone = join(ARTIFACTS, 'status-page-375.png');
  await chromium(`--screenshot=${phone}`, '--window-size=375,1600');
  t.ok(existsSync(phone) && statSync(phone).size > 10_000, `a phone-width screenshot written to ${phone}`);
});
