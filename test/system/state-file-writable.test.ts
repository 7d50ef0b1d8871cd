// StateFile.writable(): whether the state directory takes writes, as /readyz asks it every few
// seconds: the last answer at once, looked at again in the background, writes counting as answers.
// Real directories, a real FIFO for a filesystem that does not answer (its open for writing blocks
// until a reader comes), a manual clock for how old an answer is.
import { closeSync, constants, existsSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { createStateFile, STATE_FILE_CHANGED, STATE_FILE_CHANGED_FIX, WRITABLE_LOOK_MS } from '../../src/system/state-file.js';
import { manualClock } from '../helpers/app.js';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { fifoTestdir } from '../helpers/fifo.js';
import { captureLog } from '../helpers/log-capture.js';

/** Puts a file where the directory was (tests run as root, whom chmod does not stop); returns the undo. */
function replaceDirectoryByFile(dir: string): () => void {
  renameSync(dir, `${dir}.moved`);
  writeFileSync(dir, 'not a directory\n');
  return () => {
    rmSync(dir);
    renameSync(`${dir}.moved`, dir);
  };
}

t.test('writable: the last answer at once, looked at again in the background once old; turning unwritable and back is logged once each way', async (t) => {
  const dir = t.testdir({ state: {} });
  const stateDir = join(dir, 'state');
  const stateFile = join(stateDir, 'shards.json');
  const clock = manualClock();
  const { lines, log } = captureLog('info');
  const state = createStateFile(stateFile, { log, now: clock.now });

  t.same(await state.writable(5_000), { ok: true, warning: null }, 'the first answer is waited for');
  t.same(readdirSync(stateDir), [], 'the probe file is gone');
  t.same(lines, [], 'a writable directory at the first look says nothing');

  const restore = replaceDirectoryByFile(stateDir);
  t.same(await state.writable(5_000), { ok: true, warning: null }, 'until it is old, the last answer stands');
  clock.advance(WRITABLE_LOOK_MS);
  t.same(await state.writable(5_000), { ok: true, warning: null }, 'once old, it is still the answer while a look runs');
  await waitUntil(() => lines.length === 1, { what: 'the look to land' });
  const reason = `cannot write in ${stateDir}: ${stateDir} exists and is not a directory`;
  t.same(await state.writable(5_000), { ok: false, reason });
  t.match(lines, [{ level: 50, reason, msg: `Registrations cannot be stored in ${stateFile}: ${reason}. Every registration and removal is refused (503)` }]);

  restore();
  // A write is an answer too: it counts at once, without waiting for a look.
  await state.write('{}');
  t.same(await state.writable(5_000), { ok: true, warning: null });
  t.match(lines.slice(1), [{ level: 30, msg: `Registrations can be stored in ${stateFile} again.` }]);
  t.equal(lines.length, 2);
});

t.test('writable: one look at a time, however many ask while it runs', async (t) => {
  const dir = t.testdir({});
  const clock = manualClock();
  let looks = 0;
  const syncDirectory = async () => {
    looks += 1;
  };
  const state = createStateFile(join(dir, 'shards.json'), { log: pino({ level: 'silent' }), now: clock.now, syncDirectory });
  await Promise.all([state.writable(5_000), state.writable(5_000), state.writable(5_000)]);
  t.equal(looks, 1, 'the first answer: one look for three questions');
  clock.advance(WRITABLE_LOOK_MS);
  await Promise.all([state.writable(5_000), state.writable(5_000), state.writable(5_000)]);
  await waitUntil(() => looks === 2, { what: 'the background look' });
  await new Promise((resolve) => setTimeout(resolve, 100));
  t.equal(looks, 2, 'once old: one look in the background for three questions');
});

t.test('writable: a failed write answers at once, and logs it', async (t) => {
  const dir = t.testdir({ state: {} });
  const stateDir = join(dir, 'state');
  const { lines, log } = captureLog('info');
  const state = createStateFile(join(stateDir, 'shards.json'), { log });
  t.same(await state.writable(5_000), { ok: true, warning: null });
  const restore = replaceDirectoryByFile(stateDir);
  await t.rejects(state.write('{}'), { code: 'ENOTDIR' });
  t.same(await state.writable(5_000), { ok: false, reason: `cannot write in ${stateDir}: ${stateDir} exists and is not a directory` });
  t.match(lines, [{ level: 50, msg: /^Registrations cannot be stored in / }]);
  restore();
});

t.test('one writer: the file is what this process first read or last wrote, or the write is refused and the directory reads not writable', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'shards.json');
  const { lines, log } = captureLog('info');
  const mine = createStateFile(path, { log });
  const other = createStateFile(path, { log: pino({ level: 'silent' }) });
  t.equal(await mine.read(), null, 'no file yet: that is what mine expects to find');
  await other.write('{"theirs":1}');
  const changed = new RegExp(`^${path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} was changed by another process .*since this one read or wrote it`);
  await t.rejects(mine.write('{"mine":1}'), { code: STATE_FILE_CHANGED, message: changed });
  t.equal(readFileSync(path, 'utf8'), '{"theirs":1}', "the other's file is kept");
  const unwritable = await mine.writable(5_000);
  t.same(Object.keys(unwritable), ['ok', 'reason', 'fix']);
  t.match(unwritable, { ok: false, reason: changed, fix: STATE_FILE_CHANGED_FIX });
  t.match(lines, [{ level: 50, msg: /^Registrations cannot be stored in .*: .* was changed by another process .*the shards already stored are kept and served\. Only one nodecompute may use a state file/ }]);
  t.equal(await mine.read(), '{"theirs":1}', 'a later read sees the file as it is');
  await t.rejects(mine.write('{"mine":2}'), { code: STATE_FILE_CHANGED }, 'and does not make it mine');
  t.match(await mine.checkWritable(), { ok: false, fix: STATE_FILE_CHANGED_FIX }, 'a look says the same');

  writeFileSync(path, '{"mine":0}');
  const restarted = createStateFile(path, { log: pino({ level: 'silent' }) });
  t.equal(await restarted.read(), '{"mine":0}');
  await restarted.write('{"mine":1}');
  await restarted.write('{"mine":2}');
  t.equal(readFileSync(path, 'utf8'), '{"mine":2}', 'its own writes follow one another');
  rmSync(path);
  mkdirSync(path);
  await t.rejects(restarted.write('{"mine":3}'), { code: 'EISDIR' }, 'a file that cannot be read fails the write with its own error');
  t.match(await restarted.writable(5_000), { ok: false, reason: `cannot write in ${dir}: EISDIR: illegal operation on a directory` });
});

t.test('writable: a directory that cannot be fsynced takes writes, with the warning', async (t) => {
  const dir = t.testdir({});
  const syncDirectory = async () => {
    throw Object.assign(new Error('EINVAL: invalid argument, fsync'), { code: 'EINVAL' });
  };
  const answer = await createStateFile(join(dir, 'shards.json'), { log: pino({ level: 'silent' }), syncDirectory }).writable(5_000);
  t.match(answer, { ok: true, warning: { problem: /fsync of .* failed \(EINVAL/, fix: /put NODECOMPUTE_STATE_FILE on a local disk/ } });
});

t.test('writable: a look not landed within its budget is an answer of its own, logged only past the state file\'s bound; the look\'s own answer counts once it lands', async (t) => {
  const { dir, fifo } = fifoTestdir(t);
  const clock = manualClock();
  const { lines, log } = captureLog('info');
  let looks = 0;
  const syncDirectory = async () => {
    looks += 1;
  };
  const state = createStateFile(join(dir, 'shards.json'), { log, now: clock.now, syncDirectory, timeoutMs: 200 });
  // The probe file is a FIFO with no reader: opening it for writing blocks, as on a hung mount.
  const probe = fifo(`.shards.json.${process.pid}.probe`);
  let reader: number | null = null;
  t.teardown(() => {
    if (reader !== null) closeSync(reader);
  });

  const unanswered = { ok: false, reason: `writing a probe file in ${dir} did not finish within 50 ms: its filesystem does not answer (a hung network mount?)` };
  t.same(await state.writable(50), unanswered, "answered within the probe's budget");
  t.same(lines, [], "a caller's budget passing says nothing of the directory: not logged");
  await waitUntil(() => state.stuck() !== null, { what: "the look to pass the state file's own bound" });
  const stuck = { ok: false, reason: `writing a probe file in ${dir} did not finish within 200 ms: its filesystem does not answer (a hung network mount?)` };
  t.match(lines, [{ level: 50, reason: stuck.reason }], "said when the state file's own bound passes");
  t.same(await state.writable(50), stuck, 'the answer says so');
  await t.rejects(state.write('{}\n'), { message: `${stuck.reason}; that is still pending, and nothing else is written there until it returns` }, 'a write meanwhile fails at once');
  clock.advance(WRITABLE_LOOK_MS);
  t.same(await state.writable(50), stuck, 'asked again once old: the same answer, at once');
  t.equal(lines.length, 1, 'said once');

  reader = openSync(probe, constants.O_RDONLY | constants.O_NONBLOCK);
  // The look lands. A FIFO takes no fsync (EINVAL): that is its answer, still not writable. Asking
  // meanwhile starts nothing new: the answer is fresh, or the look is still under way.
  const landed = /^cannot write in .*: EINVAL: invalid argument, fsync$/;
  const giveUpAt = Date.now() + 10_000;
  let answer = await state.writable(50);
  while (!landed.test(answer.ok ? '' : answer.reason) && Date.now() < giveUpAt) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    answer = await state.writable(50);
  }
  t.match(answer, { ok: false, reason: landed });
  t.notOk(existsSync(probe), 'the look removed its probe');
  t.equal(state.stuck(), null, 'nothing is stuck any more');
  t.equal(lines.length, 1, 'still not writable: nothing more said');

  // Looked at again with the FIFO gone: writable, and said so.
  clock.advance(WRITABLE_LOOK_MS);
  await state.writable(50);
  await waitUntil(() => lines.length === 2, { what: 'the next look to land' });
  t.same(await state.writable(50), { ok: true, warning: null });
  t.equal(looks, 1);
  t.match(lines[1], { level: 30, msg: /can be stored in .* again/ });
});
