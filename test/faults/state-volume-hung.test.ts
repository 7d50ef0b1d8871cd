// The state file's volume stops answering (a hung network mount), as a real process sees it: a FIFO
// stands in for the file, since open() on one blocks until its other end is opened. While the
// service runs, the FIFO is the temp file the next write opens: the registration is answered 503
// within the state file's bound instead of hanging, the next is refused at once, /readyz fails, and
// SIGTERM still ends the process (Node's exit would wait for the stuck write for good): by SIGTERM,
// saying why, whether the write hung before the signal or hangs during the shutdown, and when only
// the start-up look at the directory hangs, with no request to hold the shutdown up. At start, the
// FIFO is the state file itself: the start fails within the bound, saying what to check, instead of
// never listening.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t, { type Test } from 'tap';
import { STATE_FILE_TIMEOUT_MS } from '../../src/system/state-file.js';
import { spawnShardProcess } from '../helpers/app.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { blockedOpeningFifo, mkfifo } from '../helpers/fifo.js';
import { runToEnd, startServer, within, type RunningServer } from '../helpers/server.js';

/** Far beyond the state file's bound and the shutdown's grace, even on a loaded machine: what is still waiting then hangs. */
const HANG_MS = 45_000;
const NO_NVIDIA_SMI = { NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi' };
const STUCK_FIX = 'If this repeats, check the volume that holds it (a hung network mount?), or set NODECOMPUTE_STATE_FILE to a path on a local disk.';
const STUCK = 'is still pending (its filesystem does not answer)';

/** The last line of a process that ends by SIGTERM because `what` on `stateFile` is `pending`: stuck, or under way when the shutdown was cut short. */
const sigtermLine = (what: string, stateFile: string, pending = STUCK) => ({
  level: 40,
  file: stateFile,
  msg: `${what} ${stateFile} ${pending}, and Node cannot exit before it returns: ending the process with SIGTERM instead (exit status 143). ${STUCK_FIX}`,
});

/** The graceful shutdown, within its grace, ended by SIGTERM, its last line saying that `what` is stuck. */
async function endedGracefullyBySigterm(t: Test, server: RunningServer, what: string, stateFile: string): Promise<void> {
  t.equal(await within(server.exited, HANG_MS), 'SIGTERM', 'ended (exit status 143), not left hanging until the kubelet SIGKILLs it');
  const logs = server.logs();
  t.notOk(
    logs.some((entry) => String(entry.msg).startsWith('Shutting down took longer')),
    'within its grace: the shutdown was not cut short',
  );
  t.match(logs.at(-1), sigtermLine(what, stateFile), 'the last line says why, and every line logged before it is out');
}

t.test('a write that hangs: answered 503 within the bound, the next change refused, /readyz failing, and SIGTERM ends the process, saying why', async (t) => {
  const dir = t.testdir({ state: {} });
  const stateFile = join(dir, 'state', 's.json');
  const [first, second] = await Promise.all([spawnShardProcess(t, 0), spawnShardProcess(t, 0)]);
  const server = await startServer(t, { ...NO_NVIDIA_SMI, NODECOMPUTE_STATE_FILE: stateFile });
  // The service's first write of the state file opens this temp file, and blocks there (in the
  // service's process, which ends by the test's end, so nothing stays blocked).
  const temp = join(dir, 'state', `.s.json.${server.child.pid}.1.tmp`);
  mkfifo(temp);
  const put = (id: string, pid: number) =>
    server.fetch(`/shards/${id}`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ pid, gpus: [0] }),
      signal: AbortSignal.timeout(HANG_MS),
    });
  const bound = `${STATE_FILE_TIMEOUT_MS} ms`;

  const pending = await put('a', first.pid);
  t.equal(pending.status, 503, 'answered, not left hanging');
  t.equal(pending.headers.get('retry-after'), String(Math.ceil(STATE_FILE_TIMEOUT_MS / 1000)), 'saying to wait the state timeout before retrying');
  t.match(await pending.json(), {
    code: 'NODECOMPUTE_STATE_WRITE_PENDING',
    message: `The change is not acknowledged: ${bound} after it came, the write of the state file ${stateFile} that carries it had not finished (a slow volume, or one that does not answer: a hung network mount?).`,
  });
  // The state file takes the write for stuck once its own bound passes (about when the PUT was answered).
  await waitUntil(() => server.logs().some((entry) => entry.level === 50 && String(entry.msg).startsWith('Registrations cannot be stored')), {
    what: 'the state file to take its write for stuck',
  });
  const ready = await server.fetch('/readyz?verbose');
  t.equal(ready.status, 503);
  const stuck = `writing the state file (its temp file ${temp}) did not finish within ${bound}: its filesystem does not answer (a hung network mount?)`;
  t.match(await ready.text(), `[-]state-file failed: Registrations cannot be stored in ${stateFile}: ${stuck}.`);

  const refused = await put('b', second.pid);
  t.equal(refused.status, 503);
  t.equal(refused.headers.get('retry-after'), String(Math.ceil(STATE_FILE_TIMEOUT_MS / 1000)), 'refused at once, and told not to retry at once');
  t.match(await refused.json(), {
    code: 'NODECOMPUTE_STATE_WRITE_FAILED',
    message: `The change was not stored: the state file ${stateFile} cannot be written now (${stuck}; that is still pending`,
  }, 'the next change is refused, naming the stuck write');
  const listed = await server.fetch('/shards');
  t.equal(listed.status, 200, 'reads are answered meanwhile');
  t.same(((await listed.json()) as { shards: unknown[] }).shards, [], 'nothing acknowledged, nothing served');

  server.child.kill('SIGTERM');
  await endedGracefullyBySigterm(t, server, 'A write of the state file', stateFile);
});

t.test('a shutdown cut short while a write is under way, its bound not passed yet: ends by SIGTERM, saying why, instead of hanging', async (t) => {
  const dir = t.testdir({ state: {} });
  const stateFile = join(dir, 'state', 's.json');
  const shard = await spawnShardProcess(t, 0);
  // A bound far beyond the test: the write stays under way, never listed as stuck.
  const server = await startServer(t, { ...NO_NVIDIA_SMI, NODECOMPUTE_STATE_FILE: stateFile, NODECOMPUTE_STATE_TIMEOUT_MS: '600000' });
  const pid = server.child.pid!;
  mkfifo(join(dir, 'state', `.s.json.${pid}.1.tmp`));
  const put = server
    .fetch('/shards/a', { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pid: shard.pid, gpus: [0] }) })
    .catch((err: Error) => err);
  await waitUntil(() => blockedOpeningFifo(pid), { what: 'the write to block in open()' });
  // Under way for a second at least: no healthy disk's operation, so a cut-short exit must not wait for it.
  await new Promise((resolve) => setTimeout(resolve, 1000));

  server.child.kill('SIGTERM');
  await waitUntil(() => server.logs().some((entry) => String(entry.msg).startsWith('Shutting down')), { what: 'the shutdown to begin' });
  // The PUT holds the graceful shutdown up; a second signal cuts it short.
  server.child.kill('SIGTERM');
  t.equal(await within(server.exited, HANG_MS), 'SIGTERM', 'ended (exit status 143), not left hanging until the kubelet SIGKILLs it');
  t.match(server.logs().at(-1), sigtermLine('A write of the state file', stateFile, 'is still under way (its bound has not passed yet)'));
  t.type(await put, Error, 'the PUT got no answer: its connection ended with the process');
});

t.test('SIGTERM while a write is under way, its bound not passed yet: the graceful shutdown answers the change, then ends by SIGTERM, saying why', async (t) => {
  const dir = t.testdir({ state: {} });
  const stateFile = join(dir, 'state', 's.json');
  const shard = await spawnShardProcess(t, 0);
  const server = await startServer(t, { ...NO_NVIDIA_SMI, NODECOMPUTE_STATE_FILE: stateFile });
  const pid = server.child.pid!;
  mkfifo(join(dir, 'state', `.s.json.${pid}.1.tmp`));
  const put = server.fetch('/shards/a', {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ pid: shard.pid, gpus: [0] }),
    signal: AbortSignal.timeout(HANG_MS),
  });
  await waitUntil(() => blockedOpeningFifo(pid), { what: 'the write to block in open()' });

  // The volume hangs as the pod is being stopped: one signal, a graceful shutdown. The PUT's own
  // deadline holds the close up about as long as the write's bound, so by the time the close ends
  // the write is listed as stuck.
  server.child.kill('SIGTERM');
  const answer = await put;
  t.equal(answer.status, 503, 'the change in flight is answered during the shutdown, not cut off');
  t.match(await answer.json(), { code: 'NODECOMPUTE_STATE_WRITE_PENDING' });
  await endedGracefullyBySigterm(t, server, 'A write of the state file', stateFile);
});

t.test('SIGTERM while the start-up look at the state directory hangs, its bound not passed yet: the exit waits for the bound, then ends by SIGTERM, saying why', async (t) => {
  // No request holds this shutdown up: the close ends at once, and only the exit's wait for the
  // operations under way (main.ts, operationsKnown) lets the look be listed as stuck before Node's
  // exit would hang on it. The FIFO stands where the look writes its probe file; the service's own
  // process makes it (a preload), as its name holds that process's PID and the look comes right
  // after the start.
  // Within the shutdown's 10 s grace (main.ts), so that the exit's wait ends before the grace does.
  const boundMs = 8000;
  const dir = t.testdir({
    state: {},
    'fifo-for-probe.mjs':
      "import { spawnSync } from 'node:child_process';\n" +
      "import { basename, dirname, join } from 'node:path';\n" +
      'const stateFile = process.env.NODECOMPUTE_STATE_FILE;\n' +
      "const made = spawnSync('mkfifo', [join(dirname(stateFile), `.${basename(stateFile)}.${process.pid}.probe`)], { encoding: 'utf8' });\n" +
      "if (made.status !== 0) throw new Error(`mkfifo failed: ${made.stderr}`);\n",
  });
  const stateFile = join(dir, 'state', 's.json');
  const server = await startServer(t, {
    ...NO_NVIDIA_SMI,
    NODECOMPUTE_STATE_FILE: stateFile,
    NODECOMPUTE_STATE_TIMEOUT_MS: String(boundMs),
    NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import=${pathToFileURL(join(dir, 'fifo-for-probe.mjs')).href}`,
  });
  const pid = server.child.pid!;
  await waitUntil(() => blockedOpeningFifo(pid), { what: 'the look to block in open()' });

  server.child.kill('SIGTERM');
  await endedGracefullyBySigterm(t, server, 'A write of a probe file beside the state file', stateFile);
  // By the service's own clock: the look began after the line that says it listens.
  const logs = server.logs();
  const shuttingDownAt = logs.find((entry) => String(entry.msg).startsWith('Shutting down'))?.time as number;
  const signalledAfterMs = shuttingDownAt - (logs.find((entry) => typeof entry.url === 'string')!.time as number);
  t.ok(signalledAfterMs < boundMs, `signalled ${signalledAfterMs} ms after listening, before the look's bound: it was not listed as stuck yet`);
});

t.test('a state file that does not answer at start: the start fails within the bound, by SIGTERM, saying what to check', async (t) => {
  const dir = t.testdir({});
  const stateFile = join(dir, 's.json');
  mkfifo(stateFile);
  const result = await runToEnd(['serve'], { ...NO_NVIDIA_SMI, NODECOMPUTE_HOST: '127.0.0.1', NODECOMPUTE_PORT: '0', NODECOMPUTE_STATE_FILE: stateFile }, HANG_MS);
  t.equal(result.end, 'SIGTERM', 'ended (exit status 143), not left hanging');
  t.match(
    result.stderr,
    `nodecompute: cannot start: Cannot read the state file ${stateFile}: reading ${stateFile} did not finish within ${STATE_FILE_TIMEOUT_MS} ms: its filesystem does not answer (a hung network mount?).`,
  );
  t.match(result.stderr, `nodecompute: A read of the state file ${stateFile} is still pending (its filesystem does not answer)`);
  t.notMatch(result.stdout, /listening/, 'the service never listened');
});
