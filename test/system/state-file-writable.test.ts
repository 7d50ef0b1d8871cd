// StateFile.writable(): whether the state directory takes writes, as /readyz asks it every few
// seconds. Real directories, a real FIFO for a filesystem that does not answer (its open for
// writing blocks until a reader comes), a manual clock for how long a look stands.
import { execFileSync } from 'node:child_process';
import { closeSync, constants, existsSync, openSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { createStateFile, WRITABLE_LOOK_MS } from '../../src/system/state-file.js';
import { manualClock } from '../helpers/app.js';

function recordingLog() {
  const lines: Array<{ level: number; msg: string; reason?: string }> = [];
  return { lines, log: pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) }) };
}

t.test('writable: looked at once per WRITABLE_LOOK_MS; turning unwritable and back is logged once each way', async (t) => {
  const dir = t.testdir({ state: {} });
  const stateDir = join(dir, 'state');
  const clock = manualClock();
  const { lines, log } = recordingLog();
  const stateFile = createStateFile(join(stateDir, 'shards.json'), { log, now: clock.now });

  t.same(await stateFile.writable(5_000), { ok: true, warning: null });
  t.same(readdirSync(stateDir), [], 'the probe file is gone');
  t.same(lines, [], 'a writable directory at the first look says nothing');

  // The volume goes away (tests run as root, whom chmod does not stop: a file takes its place).
  renameSync(stateDir, `${stateDir}.moved`);
  writeFileSync(stateDir, 'not a directory\n');
  t.same(await stateFile.writable(5_000), { ok: true, warning: null }, 'within a look, the last answer stands');
  clock.advance(WRITABLE_LOOK_MS);
  const refused = { ok: false, reason: `cannot write in ${stateDir}: EEXIST: file already exists, mkdir '${stateDir}'` };
  t.same(await stateFile.writable(5_000), refused);
  clock.advance(WRITABLE_LOOK_MS);
  t.same(await stateFile.writable(5_000), refused, 'looked at again, still refused');
  t.match(lines, [{ level: 50, reason: refused.reason, msg: `Registrations cannot be stored in ${join(stateDir, 'shards.json')}: ${refused.reason}. Every registration and removal is refused (503)` }]);
  t.equal(lines.length, 1, 'logged once, not at every look');

  rmSync(stateDir);
  renameSync(`${stateDir}.moved`, stateDir);
  clock.advance(WRITABLE_LOOK_MS);
  t.same(await stateFile.writable(5_000), { ok: true, warning: null });
  t.match(lines.slice(1), [{ level: 30, msg: `Registrations can be stored in ${join(stateDir, 'shards.json')} again.` }]);
  t.equal(lines.length, 2);
});

t.test('writable: a directory that cannot be fsynced takes writes, with the warning', async (t) => {
  const dir = t.testdir({});
  const syncDirectory = async () => {
    throw Object.assign(new Error('EINVAL: invalid argument, fsync'), { code: 'EINVAL' });
  };
  const answer = await createStateFile(join(dir, 'shards.json'), { log: pino({ level: 'silent' }), syncDirectory }).writable(5_000);
  t.match(answer, { ok: true, warning: { problem: /fsync of .* failed \(EINVAL/, fix: /put NODECOMPUTE_STATE_FILE on a local disk/ } });
});

t.test('writable: a look that does not finish within the wait reads as not writable; one look at a time, and its answer counts once it lands', async (t) => {
  const dir = t.testdir({});
  const { lines, log } = recordingLog();
  const stateFile = createStateFile(join(dir, 'shards.json'), { log });
  // The probe file is a FIFO with no reader: opening it for writing blocks, as a hung mount does.
  const probe = join(dir, `.shards.json.${process.pid}.probe`);
  execFileSync('mkfifo', [probe]);
  let reader: number | null = null;
  t.teardown(() => {
    // Whatever happened, the blocked open must end, or this process could not exit.
    if (reader === null && existsSync(probe)) closeSync(openSync(probe, constants.O_RDONLY | constants.O_NONBLOCK));
  });

  const unanswered = { ok: false, reason: `writing a probe file in ${dir} did not finish within 50 ms: its filesystem does not answer (a hung network mount?)` };
  t.same(await stateFile.writable(50), unanswered);
  t.same(await stateFile.writable(50), unanswered, 'asked again, it waits on the same look');

  reader = openSync(probe, constants.O_RDONLY | constants.O_NONBLOCK);
  t.teardown(() => closeSync(reader!));
  // The look lands: the probe (the FIFO) is removed and the directory is writable after all.
  t.same(await stateFile.writable(5_000), { ok: true, warning: null });
  t.notOk(existsSync(probe), 'the look removed its probe');
  t.same(lines, [], 'a look that lands writable says nothing');
});
