// The state file's volume stops answering, as a real process sees it: a FIFO stands in for the temp
// file the next write opens (open() on one blocks until its other end is opened). The registration
// is answered 503 within the state file's bound instead of hanging, the next is refused at once and
// /readyz fails.
import { join } from 'node:path';
import t from 'tap';
import { STATE_FILE_TIMEOUT_MS } from '../../src/system/state-file.js';
import { spawnShardProcess } from '../helpers/app.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { mkfifo, releaseBlockedWriter } from '../helpers/fifo.js';
import { startServer, within } from '../helpers/server.js';

/** Far beyond the state file's bound, even on a loaded machine: what is still waiting then hangs. */
const HANG_MS = 45_000;
const NO_NVIDIA_SMI = { NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi' };

t.test('a write that hangs: answered 503 within the bound, the next change refused, /readyz failing; once it returns, SIGTERM ends the process', async (t) => {
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
    message: `The change is not acknowledged: ${bound} after it came, the state file ${stateFile} had not finished writing it (a hung network mount?).`,
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

  // The volume answers again (a FIFO without a reader takes no bytes: the write fails), then a graceful stop.
  await waitUntil(() => releaseBlockedWriter(temp), { what: 'the write to wait in open()' });
  server.child.kill('SIGTERM');
  t.equal(await within(server.exited, HANG_MS), 0, 'exit 0');
});
