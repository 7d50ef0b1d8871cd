// The state file on a filesystem that does not answer: a FIFO stands in for the file an operation
// opens (open() blocks until its other end is opened). Past its bound a write makes the directory
// unwritable and nothing else is started there; once it returns, its own outcome counts. A read past
// its bound rejects, saying so.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { loadRegistry } from '../../src/shards/registry.js';
import { createStateFile } from '../../src/system/state-file.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { blockedOpeningFifo, fifoTestdir, releaseBlockedWriter, releaseFifo } from '../helpers/fifo.js';
import { captureLog } from '../helpers/log-capture.js';

t.test('a write that does not answer: unwritable past its bound, nothing else started meanwhile; its own outcome counts once it returns', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  const path = join(dir, 's.json');
  const { lines, log } = captureLog('info');
  const state = createStateFile(path, { log, timeoutMs: 100 });
  const temp = fifo(`.s.json.${process.pid}.1.tmp`);

  let outcome: Error | 'stored' | null = null;
  void state.write('{"a":1}\n').then(
    () => (outcome = 'stored'),
    (err: Error) => (outcome = err),
  );
  await waitUntil(() => state.stuck() !== null, { what: 'the write to pass its bound' });
  const reason = `writing the state file (its temp file ${temp}) did not finish within 100 ms: its filesystem does not answer (a hung network mount?)`;
  t.same(await state.writable(100), { ok: false, reason }, 'the directory is answered unwritable');
  t.match(lines, [{ level: 50, reason, msg: `Registrations cannot be stored in ${path}: ${reason}.` }], 'and that is said');
  t.equal(lines.length, 1, 'once');

  const stuck = `${reason}; that is still pending, and nothing else is written there until it returns`;
  t.equal(state.stuck(), stuck, 'the state file says why nothing can be written now');
  await t.rejects(state.write('{"b":2}\n'), { message: stuck }, 'another write fails at once');
  t.notOk(existsSync(join(dir, `.s.json.${process.pid}.2.tmp`)), 'without opening a file');
  t.same(await state.checkWritable(), { ok: false, reason: stuck }, "the doctor's look answers why at once, without a probe file of its own");
  t.equal(outcome, null, 'the write is still pending');

  // The filesystem answers: the write's open() goes on, and a FIFO without a reader takes no bytes.
  await waitUntil(
    () => {
      releaseBlockedWriter(temp);
      return outcome !== null;
    },
    { what: 'the write to return' },
  );
  t.match(outcome, { code: /^(EPIPE|EINVAL)$/ }, 'its own outcome: failed');
  t.equal(state.stuck(), null, 'nothing is stuck any more');
  t.notOk(existsSync(temp), 'its temp file removed');
  t.match(await state.writable(100), { ok: false, reason: /^cannot write in / });

  await state.write('{"c":3}\n');
  t.equal(readFileSync(path, 'utf8'), '{"c":3}\n', 'writes work again');
  t.same(await state.writable(100), { ok: true, warning: null });
  t.match(lines.at(-1), { level: 30, msg: `Registrations can be stored in ${path} again.` });
});

t.test('an operation that lands fine while another is stuck does not make the directory writable', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  const path = join(dir, 's.json');
  const { lines, log } = captureLog('info');
  let syncs = 0;
  let landLook = (): void => undefined;
  // The look's directory fsync waits for the test; so it outlasts the bound, and lands when told.
  const syncDirectory = () => new Promise<void>((resolve) => (syncs += 1) === 1 ? (landLook = resolve) : resolve());
  const state = createStateFile(path, { log, timeoutMs: 100, syncDirectory });
  const temp = fifo(`.s.json.${process.pid}.1.tmp`);

  // Both start now, so both bounds run from here whatever the machine's load.
  const look = state.writable(60_000);
  let written: unknown = null;
  void state.write('{"a":1}\n').catch((err: Error) => (written = err));
  await waitUntil(() => syncs === 1 && state.stuck() !== null, { what: 'both to pass their bound, the look at its directory fsync' });
  await new Promise((resolve) => setTimeout(resolve, 20));
  landLook();
  const stuck = `writing the state file (its temp file ${temp}) did not finish within 100 ms: its filesystem does not answer (a hung network mount?); that is still pending, and nothing else is written there until it returns`;
  t.same(await look, { ok: false, reason: stuck }, 'the look found the directory writable, but a write there is still stuck');
  t.same(await state.writable(100), { ok: false, reason: stuck });
  t.notOk(lines.some((line) => line.level === 30), 'no recovery is said');

  await waitUntil(
    () => {
      releaseBlockedWriter(temp);
      return written !== null;
    },
    { what: 'the write to return' },
  );
  t.equal(state.stuck(), null);
});

t.test('a read that does not answer at start: the load fails past its bound, naming the file', async (t) => {
  const path = fifoTestdir(t).fifo('s.json');
  const log = pino({ level: 'silent' });

  await t.rejects(loadRegistry({ stateFile: createStateFile(path, { log, timeoutMs: 100 }), log }), {
    code: 'NODECOMPUTE_STATE_FILE_INVALID',
    message: `Cannot read the state file ${path}: reading ${path} did not finish within 100 ms: its filesystem does not answer (a hung network mount?). Check its permissions and the volume it lives on, or point NODECOMPUTE_STATE_FILE elsewhere.`,
  });
  await waitUntil(() => releaseFifo(path), { what: 'the read to wait in open()' });
  await waitUntil(() => !blockedOpeningFifo(process.pid), { what: 'the read to return' });
});
