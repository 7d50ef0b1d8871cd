// GET / through the real app and the fake nvidia-smi while a GPU drops out of its listing: the page
// keeps a row for it (HTML and text) with the shard placed on it (gpu-lost, and a PUT naming the GPU
// is refused, saying it was lost), keeps it past max-stale while nvidia-smi cannot be asked, and
// drops it once nvidia-smi lists the GPU again. nvidia-smi only: a listing that skips a GPU's index
// is its shape; NVML renumbers when it enumerates again (gpu-renumbering.test.ts) or says a handle is
// lost (nvml-agreement.test.ts).
import t from 'tap';
import type { App } from '../../src/app.js';
import { buildTestApp, manualClock, settle, spawnShardProcess } from '../helpers/app.js';
import { failDriver } from '../helpers/backend.js';
import { idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';

const BROWSER_ACCEPT = 'text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8';

/** The page once `done` holds for it (a refresh may still be running behind the first answers). */
async function pageWhere(app: App, accept: string, done: (body: string) => boolean): Promise<string> {
  let body = '';
  for (let i = 0; i < 300; i += 1) {
    body = (await app.inject({ method: 'GET', url: '/', headers: { accept } })).body;
    if (done(body)) return body;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`the page never got there; the last one:\n${body}`);
}

/** The indices of the GPU rows in page order, a lost one marked. */
const htmlRows = (html: string) => [...html.matchAll(/<div class="gpu( lost)?">\n<div class="gpu-id"><span class="gpu-index">GPU (\d+)<\/span>/g)].map((m) => `${m[2]}${m[1] ? ' lost' : ''}`);
const textRows = (text: string) => text.split('\n').filter((line) => /^\d+ /.test(line));

t.test('a GPU that drops out of the listing keeps its row, with the shard placed on it, in HTML and text, past max-stale too, until it is listed again', async (t) => {
  const shard = await spawnShardProcess(t, 1);
  // An idle node but for the shard on GPU 6: the sample's other processes are of no PID here, and
  // with the shard's gone from the listing they alone would read as another PID namespace.
  const scenario = idleEightGpuNode();
  const gpu6 = scenario.gpus[6]!;
  Object.assign(gpu6, { usedMiB: 106139, freeMiB: 143771 - 614 - 106139 + 1 });
  scenario.processes = [{ gpuUuid: gpu6.uuid, pid: shard.members[0]!, name: 'python3', usedMiB: 106130 }];
  const clock = manualClock(Date.parse('2026-11-29T12:00:00Z'));
  const { app, fake } = await buildTestApp(t, { scenario, backend: 'nvidia-smi', deps: { now: clock.now }, config: { smiTimeoutMs: 60_000 } });
  t.equal((await app.inject({ method: 'PUT', url: '/shards/llama-6', payload: { pid: shard.pid, gpus: [6], graceMs: 0 } })).statusCode, 201);
  const before = await pageWhere(app, BROWSER_ACCEPT, (html) => html.includes('<span class="badge ready">ready</span>'));
  t.same(htmlRows(before), ['0', '1', '2', '3', '4', '5', '6', '7']);
  t.notMatch(before, 'class="gpu lost"');
  t.match(before, /<title>[^<]*nodecompute · 1 ready<\/title>/);

  // GPU 6 falls off the bus: nvidia-smi lists the other seven, and no process on it. A refresh the
  // requests above began must land first: one running across the change would read the GPUs before
  // it and the processes after (GPU 6 busy, no process: hidden), and the manual clock never expires it.
  await settle(app);
  fake.update((s) => ({ ...s, gpus: s.gpus.filter((gpu) => gpu.uuid !== gpu6.uuid), processes: s.processes.filter((process) => process.gpuUuid !== gpu6.uuid) }));
  clock.advance(2000);
  const html = await pageWhere(app, BROWSER_ACCEPT, (body) => body.includes('class="gpu lost"') && body.includes('<span class="badge gpu-lost">gpu-lost</span></li>'));
  t.same(htmlRows(html), ['0', '1', '2', '3', '4', '5', '6 lost', '7'], 'eight rows: GPU 6 where it was');
  t.match(html, /<title>[^<]*nodecompute · 1 GPU LOST · 1 gpu-lost<\/title>/, 'the tab title says it first, for a wall of dashboards');
  const lost = html.split('<div class="gpu lost">')[1]!.split('\n</div>')[0]!;
  t.match(lost, '<span class="gpu-name">NVIDIA H200</span><span class="badge gpu-lost">lost</span>');
  t.match(lost, `<span class="gpu-uuid" title="${gpu6.uuid}">${gpu6.uuid}</span>`);
  t.match(lost, '<span class="gpu-used">unknown</span>');
  t.notMatch(lost, 'class="seg', 'no memory drawn');
  t.match(lost, /<li>missing since 2026-11-29 12:00:0\d UTC \([^)]+ ago\), last listed 2026-11-29 12:00:0\d UTC<\/li>/);
  t.match(lost, /llama-6: placed on it, <span class="badge gpu-lost">gpu-lost<\/span><\/li>/);
  t.match(html, new RegExp(`<span class="id">llama-6</span>.*placed on GPU 6, but GPU 6 \\(${gpu6.uuid}, NVIDIA H200\\) is no longer listed by the GPU driver \\(missing since 2026-11-29T12:00:0\\d`, 's'), "the shard's verdict says why");
  const probe = await app.inject({ method: 'GET', url: '/shards/llama-6/ready' });
  t.same([probe.statusCode, probe.json().state, probe.json().cause], [503, 'gpu-lost', 'gpu-not-listed'], 'the probe fails: the shard cannot serve as placed');
  t.equal((await app.inject({ method: 'GET', url: '/shards/llama-6/compute' })).json().backend, null, 'not CPU: nothing says where it computes now');
  const again = await app.inject({ method: 'PUT', url: '/shards/llama-6', payload: { pid: shard.pid, gpus: [6], graceMs: 0 } });
  t.same([again.statusCode, again.json().gpuUuids], [200, [gpu6.uuid]], "a controller's repeat of the shard's spec keeps its device: nothing to refuse, nothing changes");
  const other = await spawnShardProcess(t, 0);
  const fresh = await app.inject({ method: 'PUT', url: '/shards/llama-6b', payload: { pid: other.pid, gpus: [6] } });
  t.equal(fresh.statusCode, 422, 'a new registration cannot name a GPU that is not listed');
  t.match(
    fresh.json().message,
    new RegExp(`^GPU 6 does not exist on this node; it has GPU 0, 1, 2, 3, 4, 5, 7 \\(as the GPU driver numbers them\\)\\. GPU 6 \\(${gpu6.uuid}, NVIDIA H200\\) is no longer listed by the GPU driver since 2026-11-29T12:00:0\\d\\.\\d{3}Z: it fell off the bus`),
    'and says it was lost',
  );
  const renumbered = await app.inject({ method: 'PUT', url: '/shards/llama-6b', payload: { pid: other.pid, gpus: [8] } });
  t.match(
    renumbered.json().message,
    new RegExp(`^GPU 8 does not exist on this node; it has GPU 0, 1, 2, 3, 4, 5, 7 \\(as the GPU driver numbers them\\)\\. GPU 6 \\(${gpu6.uuid}, NVIDIA H200\\) is no longer listed by the GPU driver since 2026-11-29T12:00:0\\d\\.\\d{3}Z, and the GPUs after it usually moved down one index\\. GET /gpus gives each GPU's index and UUID now\\. Fix "gpus" in the registration\\.$`),
    'an index past the end, once a GPU is lost, is most likely one from before the renumbering: the 422 says so',
  );
  t.equal((await app.inject({ method: 'GET', url: '/shards/llama-6/ready' })).json().state, 'gpu-lost', 'the repeat left the verdict as it was');
  const text = await pageWhere(app, '*/*', (body) => body.includes('(LOST)'));
  t.match(text, /^nodecompute \S+ on .+: 1 GPU LOST · 1 gpu-lost\n/, 'and the text view its first line');
  t.same(textRows(text).map((line) => line.split(' ')[0]), ['0', '1', '2', '3', '4', '5', '6', '7']);
  t.match(textRows(text)[6]!, /^6\s+NVIDIA H200 \(LOST\)\s+\[-+ lost: memory unknown -+\]\s+unknown\s+placed on it: llama-6 \(gpu-lost\)$/);
  t.match(text, new RegExp(`!!   GPU 6 \\(${gpu6.uuid}, NVIDIA H200\\), last listed 2026-11-29 12:00:0\\d UTC, missing since 2026-11-29 12:00:0\\d UTC`));

  // nvidia-smi cannot be asked any more, and the last good snapshot (which had lost GPU 6) ages past max-stale (30 s).
  // A refresh the requests above began must land first: one still running would date the last
  // good snapshot after the clock moves, and keep it within max-stale.
  await settle(app);
  failDriver(fake, { kind: 'driver-unreachable' });
  clock.advance(31_000);
  const staleHtml = await pageWhere(app, BROWSER_ACCEPT, (body) => body.includes('past max-stale'));
  t.same(htmlRows(staleHtml), ['6 lost'], 'no figures now, but the lost GPU still shown');
  t.match(staleHtml, /No GPU figures: .*last good snapshot no longer listed/);
  t.match(staleHtml, /<strong>The GPU driver no longer lists GPUs it listed earlier.<\/strong> As of the last good snapshot, of 2026-11-29 12:00:0\d UTC/);
  t.match(staleHtml, /llama-6: placed on it, <span class="badge gpu-lost">gpu-lost<\/span><\/li>/, "still gpu-lost: nvidia-smi's last word holds against the shard");
  const staleText = await pageWhere(app, '*/*', (body) => body.includes('past max-stale'));
  t.match(textRows(staleText)[0]!, /^6\s+NVIDIA H200 \(LOST\)\s.*placed on it: llama-6 \(gpu-lost\)$/);
  t.match(staleText, /!! The GPU driver no longer lists GPUs .*As of the last good snapshot, of 2026-11-29 12:00:0\d UTC/);

  // GPU 6 is back (after a reset), with the shard's memory on it; past any back-off after the failures.
  fake.update(() => scenario);
  clock.advance(30_000);
  const back = await pageWhere(app, BROWSER_ACCEPT, (body) => !body.includes('past max-stale') && !body.includes('class="gpu lost"') && body.includes('<span class="badge ready">ready</span>'));
  t.same(htmlRows(back), ['0', '1', '2', '3', '4', '5', '6', '7']);
  t.notMatch(back, 'no longer lists GPUs');
  t.notMatch(await pageWhere(app, '*/*', (body) => !body.includes('(LOST)')), 'no longer lists GPUs');
});
