// SIGTERM to the real server (dist/src/main.js; `npm test` builds it first) while several slow
// requests wait on nvidia-smi: every one of them gets an HTTP answer (a coded one), none a
// connection reset; the process exits 0 and leaves no nvidia-smi process behind.
import { request } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { createFakeNvidiaSmi, eightGpuNode, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { killLeftovers, leftoversOf } from '../helpers/process-scan.js';
import { startServer } from '../helpers/server.js';

interface Outcome {
  path: string;
  status?: number;
  body?: string;
  error?: string;
}

/** A GET on its own connection; `connected` resolves once the TCP connection is up. */
function slowGet(url: string, path: string): { connected: Promise<void>; done: Promise<Outcome> } {
  let onConnect!: () => void;
  const connected = new Promise<void>((resolve) => (onConnect = resolve));
  const done = new Promise<Outcome>((resolve) => {
    const req = request(`${url}${path}`, { agent: false, headers: { connection: 'close' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ path, status: res.statusCode!, body }));
      res.on('error', (err) => resolve({ path, error: (err as NodeJS.ErrnoException).code ?? err.message }));
    });
    req.on('socket', (socket) => socket.once('connect', onConnect));
    req.on('error', (err) => {
      onConnect();
      resolve({ path, error: (err as NodeJS.ErrnoException).code ?? err.message });
    });
    req.end();
  });
  return { connected, done };
}

t.test('SIGTERM with slow requests in flight: all answered, exit 0, no nvidia-smi left', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-sigterm-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const fake = createFakeNvidiaSmi(dir, eightGpuNode());
  t.teardown(() => killLeftovers(fake));
  const server = await startServer(t, {
    NODECOMPUTE_NVIDIA_SMI: fake.path,
    NODECOMPUTE_STATE_FILE: join(dir, 'state', 'shards.json'),
    // Every request needs a fresh snapshot, so each one waits on the slow nvidia-smi.
    NODECOMPUTE_CACHE_TTL_MS: '0',
    NODECOMPUTE_MAX_STALE_MS: '0',
    NODECOMPUTE_SMI_TIMEOUT_MS: '60000',
  });
  await waitUntil(() => server.logs().some((entry) => /nvidia-smi answers/.test(String(entry.msg))), { timeoutMs: 30_000, what: 'warm-up' });
  fake.update((s) => ({ ...s, delayMs: 30_000 }));
  const before = fake.invocations().length;

  const paths = ['/gpus', '/gpus', '/gpus/foreign-memory', '/gpus', '/gpus/foreign-memory', '/doctor'];
  const inFlight = paths.map((path) => slowGet(server.url, path));
  await Promise.all(inFlight.map((r) => r.connected));
  await waitUntil(() => fake.invocations().length > before, { timeoutMs: 20_000, what: 'the requests to start nvidia-smi' });
  // Give the server a moment to read every request's headers (they are all connected already).
  await new Promise((resolve) => setTimeout(resolve, 500));
  t.ok(fake.invocations().length - before >= 1, 'nvidia-smi is running for them');
  const signalledAt = Date.now();
  server.child.kill('SIGTERM');

  const outcomes = await Promise.all(inFlight.map((r) => r.done));
  for (const outcome of outcomes) {
    t.notOk(outcome.error, `${outcome.path}: an answer, not ${outcome.error}`);
    if (outcome.status === undefined) continue;
    t.ok(outcome.status === 200 || outcome.status === 503, `${outcome.path}: ${outcome.status} ${outcome.body!.slice(0, 400)}`);
    const body = JSON.parse(outcome.body!) as Record<string, unknown>;
    if (outcome.status === 503) {
      // /doctor too: a check the shutdown cut off is no report about the node.
      t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode'], `${outcome.path}: the one error shape`);
      t.match(body.code, /^NODECOMPUTE_/);
    }
  }
  t.equal(await server.exited, 0, 'exit code 0');
  t.ok(Date.now() - signalledAt < 15_000, 'shutdown did not wait for the 30 s nvidia-smi runs');
  await waitUntil(() => leftoversOf(fake).length === 0, { timeoutMs: 15_000, what: 'every nvidia-smi process to be gone' });
  t.same(leftoversOf(fake), [], 'no nvidia-smi process is left');
  t.notOk(server.stderr().includes('Error'), `nothing on stderr: ${server.stderr().slice(0, 300)}`);
});
