// A write token rotated without a restart: the token file holds one token a line and is re-read
// when it changes (a kubelet symlink swap or an in-place rewrite), at most once a second on the
// test's clock, lazily by writes. A file that goes bad keeps the tokens last read, with a warning
// when its problem starts or changes (the doctor says the latest); so does one caught half-rewritten,
// and one that does not answer (a hung mount: a FIFO without a writer stands in for it), which never
// holds a write up for longer than the read's bound.
import { createHash } from 'node:crypto';
import { chmodSync, mkdirSync, renameSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { pino } from 'pino';
import { createTokenFileSource, TOKEN_FILE_CHECK_MS, type TokenSource } from '../../src/auth.js';
import { readStartTokens, resolveConfig } from '../../src/config.js';
import type { DoctorReport } from '../../src/doctor/doctor.js';
import { REPORT_REUSE_MS } from '../../routes/doctor.js';
import { buildTestApp, manualClock } from '../helpers/app.js';
import { eightGpuNode, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { blockedOpeningFifo, fifoTestdir, releaseFifo, repoint } from '../helpers/fifo.js';
import { captureLog } from '../helpers/log-capture.js';

const OLD = 'old-token-0123456789abcdef';
const NEW = 'new-token-0123456789abcdef';

function capturingLogger() {
  const { log: logger, lines } = captureLog('info');
  // Only the token file's lines: the app logs other things too (no state file yet, refused writes).
  return { logger, lines, at: (level: number) => lines.filter((line) => line.level === level && 'file' in line) };
}

/**
 * A Secret volume as the kubelet lays it out: `token -> ..data/token`, `..data -> ..<version>`.
 * An update writes a new version directory and swaps `..data` with one rename.
 */
function secretVolume(t: Test, content: string) {
  const dir = t.testdir({});
  let version = 0;
  const publish = (text: string) => {
    version += 1;
    const versionDir = `..2025_01_01_00_00_0${version}`;
    mkdirSync(join(dir, versionDir));
    writeFileSync(join(dir, versionDir, 'token'), text);
    symlinkSync(versionDir, join(dir, '..data_tmp'));
    renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
    if (version > 1) rmSync(join(dir, `..2025_01_01_00_00_0${version - 1}`), { recursive: true });
  };
  publish(content);
  symlinkSync('..data/token', join(dir, 'token'));
  return { path: join(dir, 'token'), publish };
}

/** Which of `tokens` a source accepts now (looking at its file first when a look is due). */
async function accepted(source: TokenSource, ...tokens: string[]): Promise<string[]> {
  const digests = await source.current();
  return tokens.filter((token) => digests.some((d) => d.equals(createHash('sha256').update(token, 'utf8').digest())));
}

async function tokenFileApp(t: Test, path: string) {
  const clock = manualClock();
  const log = capturingLogger();
  const { token, tokenFile, fileTokens } = await readStartTokens(resolveConfig({ NODECOMPUTE_TOKEN_FILE: path }, []).config);
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: { token, tokenFile, fileTokens }, deps: { now: clock.now, logger: log.logger } });
  // A write that passes auth reaches the route: 404, since no shard is registered.
  const write = async (bearer?: string) => {
    const res = await app.inject({ method: 'DELETE', url: '/shards/none', headers: bearer ? { authorization: `Bearer ${bearer}` } : {}, remoteAddress: '10.0.0.7' });
    return res.statusCode === 404 ? 'accepted' : res.statusCode === 401 ? 'refused' : `unexpected ${res.statusCode}`;
  };
  return { app, clock, log, write };
}

t.test('a kubelet rotation ("old + new", then "new") takes effect without a restart, at most one look a second', async (t) => {
  const secret = secretVolume(t, `${OLD}\n`);
  const { clock, log, write } = await tokenFileApp(t, secret.path);
  t.equal(await write(OLD), 'accepted');
  t.equal(await write(NEW), 'refused', 'not yet in the file');

  secret.publish(`${OLD}\n${NEW}\n`);
  t.equal(await write(NEW), 'refused', 'the file was looked at less than a second ago');
  clock.advance(TOKEN_FILE_CHECK_MS - 1);
  t.equal(await write(NEW), 'refused', 'still less than a second');
  clock.advance(1);
  t.equal(await write(NEW), 'accepted', 'the first write a second later sees the new token');
  t.equal(await write(OLD), 'accepted', 'and the old one still works: shard pods move over at their pace');
  t.same(log.at(30).map((line) => [line.msg, line.tokens]), [[`Write tokens changed: 2 token(s) from ${secret.path} are in force now.`, 2]]);

  secret.publish(`${NEW}\n`);
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(OLD), 'refused', 'the old token is retired by the first write that looks');
  t.equal(await write(NEW), 'accepted');
  t.equal(log.at(30).at(-1)!.msg, `Write tokens changed: 1 token(s) from ${secret.path} are in force now.`);
  t.equal(log.at(30).length, 2, 'one line per change, none for writes that find the file unchanged');
  t.notMatch(JSON.stringify(log.lines), /token-0123/, 'the tokens themselves are never logged');
  t.same(log.at(40), [], 'no warning about the file');
});

t.test('the refusals name the token file and say how a rotation reaches the node', async (t) => {
  const secret = secretVolume(t, `${OLD}\n`);
  const { app } = await tokenFileApp(t, secret.path);
  const missing = await app.inject({ method: 'DELETE', url: '/shards/none' });
  t.equal(missing.statusCode, 401);
  t.match(missing.json().message, 'with a token configured on this node (NODECOMPUTE_TOKEN_FILE)');
  const wrong = await app.inject({ method: 'DELETE', url: '/shards/none', headers: { authorization: `Bearer ${NEW}` } });
  t.match(wrong.json().message, 'does not match any token configured on this node (NODECOMPUTE_TOKEN_FILE)');
  t.ok(
    wrong.json().message.endsWith(`within a second of ${secret.path} changing (a Secret's mounted file lags the Secret by a minute or two).`),
    'it names the file to change, without assuming a kubelet',
  );
});

t.test('a token file rewritten in place (same inode) is noticed by its size and mtime', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  const { clock, write } = await tokenFileApp(t, path);
  t.equal(await write(OLD), 'accepted');
  writeFileSync(path, `${NEW}\n\n`);
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(NEW), 'accepted');
  t.equal(await write(OLD), 'refused');
});

t.test('a file whose identity (inode, size, mtime) is unchanged is not read again', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  const SOME_TIME = 1_700_000_000;
  utimesSync(path, SOME_TIME, SOME_TIME);
  const { clock, write } = await tokenFileApp(t, path);
  t.equal(await write(OLD), 'accepted');
  // Same inode, same size, mtime put back: only a read could tell, and none happens.
  writeFileSync(path, `${NEW}\n`);
  utimesSync(path, SOME_TIME, SOME_TIME);
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(OLD), 'accepted', 'the tokens read before are still in force');
  t.equal(await write(NEW), 'refused');
});

t.test('a token file that goes empty, missing or bad keeps the tokens last read, with a warning each time its problem changes, until it is fixed', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  const { app, clock, log, write } = await tokenFileApp(t, path);
  t.equal(await write(OLD), 'accepted');
  const later = async (bearer: string) => {
    clock.advance(TOKEN_FILE_CHECK_MS);
    return write(bearer);
  };

  writeFileSync(path, '\n');
  t.equal(await later(OLD), 'accepted', 'empty: the old token stays in force');
  rmSync(path);
  t.equal(await later(OLD), 'accepted', 'missing: still in force');
  mkdirSync(path);
  t.equal(await later(OLD), 'accepted', 'a directory (stat works, reading does not): still in force');
  t.equal(await later(OLD), 'accepted', 'and again: no warning for a problem already said');
  const warnings = log.at(40);
  t.equal(warnings.length, 3, 'one warning per problem, as it changes');
  t.match(warnings[0]!.msg, `The token file ${path} cannot be used: it holds no token (it is empty, blank or only comments). The 1 token(s) last read from it stay in force`);
  t.match(warnings[0]!.msg, /Check the Secret .* and its mount; it is re-read within a second of the next write\./);
  t.same([warnings[0]!.file, warnings[0]!.tokens], [path, 1]);
  t.match(warnings[1]!.msg, `The token file ${path} cannot be read (ENOENT: no such file or directory`);
  t.match(warnings[2]!.msg, `The token file ${path} cannot be read (EISDIR: illegal operation on a directory`);

  rmSync(path, { recursive: true });
  writeFileSync(path, `${OLD}\n`);
  t.equal(await later(OLD), 'accepted');
  t.same(
    log.at(30).map((line) => line.msg),
    [`The token file ${path} can be used again (what was wrong with it is fixed); tokens are read from it again from now on.`],
    'readable again, and the same tokens: no change to announce',
  );

  writeFileSync(path, `${OLD}\nnew token with spaces\n`);
  t.equal(await later(OLD), 'accepted', 'a bad line: the whole file is ignored, the old tokens stay');
  t.match(log.at(40).at(-1)!.msg, `The token file ${path} cannot be used: the token on line 2 cannot work: it contains whitespace`);
  // The doctor says so too, for as long as it lasts: rotation is stuck, though writes still work.
  const tokenCheck = async () => ((await app.inject({ method: 'GET', url: '/doctor' })).json() as DoctorReport).checks.find((check) => check.name === 'token')!;
  const stuck = await tokenCheck();
  t.equal(stuck.status, 'warn');
  t.equal(stuck.detail, log.at(40).at(-1)!.msg, 'the same words as the log line');
  t.match(stuck.fix, 'a token rotated into it is not accepted');
  writeFileSync(path, `${NEW}\n`);
  t.equal(await later(NEW), 'accepted');
  clock.advance(REPORT_REUSE_MS);
  t.match(await tokenCheck(), { status: 'ok', detail: `1 token(s) from ${path} are in force for writes` }, 'and no more once the file is fixed');
  t.same(log.at(30).slice(-2).map((line) => line.msg), [
    `The token file ${path} can be used again (what was wrong with it is fixed); tokens are read from it again from now on.`,
    `Write tokens changed: 1 token(s) from ${path} are in force now.`,
  ]);
});

t.test('GET /doctor looks at the token file itself: a Secret deleted or rotated reads as it is now, with no write', async (t) => {
  const secret = secretVolume(t, `${OLD}\n`);
  const { app, clock, log } = await tokenFileApp(t, secret.path);
  const tokenCheck = async () => {
    clock.advance(REPORT_REUSE_MS);
    return ((await app.inject({ method: 'GET', url: '/doctor' })).json() as DoctorReport).checks.find((check) => check.name === 'token')!;
  };
  t.same(await tokenCheck(), { name: 'token', status: 'ok', detail: `1 token(s) from ${secret.path} are in force for writes`, fix: null });

  secret.publish(`${OLD}\n${NEW}\n`);
  t.match(await tokenCheck(), { status: 'ok', detail: `2 token(s) from ${secret.path} are in force for writes` }, 'mid-rotation: both are in force');
  t.same(log.at(30).map((line) => line.msg), [`Write tokens changed: 2 token(s) from ${secret.path} are in force now.`], 'the look is the one writes make, with its log line');

  rmSync(join(secret.path, '..', '..data'));
  const deleted = await tokenCheck();
  t.equal(deleted.status, 'warn', 'a deleted Secret is seen without any write');
  t.match(deleted.detail, `The token file ${secret.path} cannot be read (ENOENT`);
  t.match(deleted.detail, 'The 2 token(s) last read from it stay in force');
  t.match(log.at(40).at(-1)!.msg, /cannot be read \(ENOENT/, 'and warned about');
});

/** A gauge's value in a /metrics text; undefined when the series is absent. */
function gaugeValue(text: string, name: string, labels: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

t.test('each scrape looks at the token file: nodecompute_token_file_ok turns 0 when the Secret is deleted, with no write, and the tokens in force are counted', async (t) => {
  const secret = secretVolume(t, `${OLD}\n`);
  const { app, clock } = await tokenFileApp(t, secret.path);
  const scrape = async () => {
    clock.advance(TOKEN_FILE_CHECK_MS);
    const text = (await app.inject({ method: 'GET', url: '/metrics' })).body;
    const file = `{file="${secret.path}"}`;
    return { ok: gaugeValue(text, 'nodecompute_token_file_ok', file), tokens: gaugeValue(text, 'nodecompute_token_file_tokens', file) };
  };
  t.same(await scrape(), { ok: 1, tokens: 1 });
  secret.publish(`${OLD}\n${NEW}\n`);
  t.same(await scrape(), { ok: 1, tokens: 2 }, 'mid-rotation: both are in force');
  rmSync(join(secret.path, '..', '..data'));
  t.same(await scrape(), { ok: 0, tokens: 2 }, 'a deleted Secret reads 0; the tokens last read stay in force');
  secret.publish(`"${NEW}"\n`);
  t.same(await scrape(), { ok: 0, tokens: 2 }, 'a hand-edited Secret with the token in quotes reads 0 too: the quotes would be part of it');
  secret.publish(`${NEW}\n`);
  t.same(await scrape(), { ok: 1, tokens: 1 }, 'and 1 again once the Secret is back');

  const { app: withoutFile } = await buildTestApp(t, { scenario: eightGpuNode(), config: { token: OLD } });
  const text = (await withoutFile.inject({ method: 'GET', url: '/metrics' })).body;
  t.notMatch(text, /^nodecompute_token_file_\w+[{ ]/m, 'no samples without a token file (a token from the environment cannot break)');
});

t.test('a token file changed to tokens that can never work (non-ASCII, the example placeholder) or that this user may not read keeps the tokens in force, saying why', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  const clock = manualClock();
  const log = capturingLogger();
  let deny = false;
  // As root no mode stops a read: the open fails as it would for another user (the stat is real).
  const beforeRead = () => {
    if (deny) throw Object.assign(new Error(`EACCES: permission denied, open '${path}'`), { code: 'EACCES' });
  };
  const source = createTokenFileSource({ path, initial: [OLD], log: log.logger, now: clock.now, beforeRead });
  const look = async (content: string | null) => {
    if (content !== null) writeFileSync(path, content);
    clock.advance(TOKEN_FILE_CHECK_MS);
    return accepted(source, OLD, NEW);
  };
  t.same(await look(`${OLD}\npässwörtpässwört01\n`), [OLD]);
  t.match(source.problem(), `The token file ${path} cannot be used: the token on line 2 cannot work: character 2 is not printable ASCII`);
  t.same(await look('REPLACE-ME-with-at-least-16-random-characters\n'), [OLD]);
  t.match(source.problem(), /cannot be used: the token on line 1 cannot work: .*placeholder of deploy\/kubernetes\/secret\.example\.yaml/);
  t.same(await look(`# rotated by ops\n${OLD}\n${NEW}\n`), [OLD, NEW], 'a comment line is no token');
  t.equal(source.problem(), null);

  chmodSync(path, 0o600);
  deny = true;
  t.same(await look(`${NEW}\n`), [OLD, NEW], 'unreadable: the tokens last read stay');
  const { uid, gid } = statSync(path);
  t.match(source.problem(), `The token file ${path} cannot be read (EACCES: permission denied`);
  t.match(source.problem(), `runs as uid ${process.getuid!()}, gid ${process.getgid!()}`);
  t.match(source.problem(), `it is owned by uid ${uid}, gid ${gid}, mode 0600`);
  t.match(source.problem(), /defaultMode \(0440\).*fsGroup.*; it is read again within a second of the next write\.$/);
  t.equal(log.at(40).length, 3, 'each problem warned about once');
  deny = false;
  t.same(await look(null), [NEW], 'readable again: its tokens are taken');
});

t.test('a token file missing after start: the tokens read at start stay until it appears', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  const clock = manualClock();
  const log = capturingLogger();
  const source = createTokenFileSource({ path: join(dir, 'absent'), initial: [OLD], log: log.logger, now: clock.now });
  t.equal((await source.current()).length, 1, 'the tokens read at start stay');
  t.match(log.at(40)[0]!.msg, /cannot be read \(ENOENT/);
  symlinkSync(path, join(dir, 'absent'));
  t.equal((await source.current()).length, 1);
  clock.advance(TOKEN_FILE_CHECK_MS);
  writeFileSync(path, `${OLD}\n${NEW}\n`);
  t.equal((await source.current()).length, 2);
  t.equal(log.at(30).length, 2, 'readable again, then the change');
});

t.test('a clock set back does not stop the checks', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  const clock = manualClock();
  const source = createTokenFileSource({ path, initial: [OLD], log: pino({ level: 'silent' }), now: clock.now });
  t.equal((await source.current()).length, 1);
  writeFileSync(path, `${OLD}\n${NEW}\n`);
  clock.advance(-60_000);
  t.equal((await source.current()).length, 2, 'looked again at once');
});

t.test('without tokens read at start (a Config built in code), the first write reads the file', async (t) => {
  const dir = t.testdir({ token: `${NEW}\n` });
  const clock = manualClock();
  const { app } = await buildTestApp(t, { scenario: eightGpuNode(), config: { tokenFile: join(dir, 'token') }, deps: { now: clock.now } });
  const res = await app.inject({ method: 'DELETE', url: '/shards/none', headers: { authorization: `Bearer ${NEW}` } });
  t.equal(res.statusCode, 404, 'authorised, then no such shard');
});

t.test('a token file caught half-rewritten in place: its partial tokens never replace the good ones', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n` });
  const path = join(dir, 'token');
  // An mtime of long ago: the rewrite changes it even within one tick of the filesystem's clock.
  utimesSync(path, 1_700_000_000, 1_700_000_000);
  const clock = manualClock();
  const log = capturingLogger();
  let reads = 0;
  const source = createTokenFileSource({
    path,
    initial: [OLD],
    log: log.logger,
    now: clock.now,
    // Between the stat and the read, the rewrite of "old" into "new + old" has written its first line only.
    beforeRead: () => {
      if (reads++ === 0) writeFileSync(path, `${NEW}\n`);
    },
  });
  t.same(await accepted(source, OLD, NEW), [OLD], 'the old token stays in force: "new" alone was never the file');
  t.same(log.lines, [], 'one rewrite caught in the act is not worth a line');

  writeFileSync(path, `${NEW}\n${OLD}\n`);
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.same(await accepted(source, OLD, NEW), [OLD, NEW], 'the next look reads the finished file');
  t.same(log.at(30).map((line) => line.msg), [`Write tokens changed: 2 token(s) from ${path} are in force now.`]);
  t.equal(reads, 2);
});

t.test('a token file that is never stable while read (a /proc file, which says size 0) keeps the tokens, with one warning', async (t) => {
  const dir = t.testdir({ token: `${NEW}\n` });
  const path = join(dir, 'current');
  // boot_id holds a token-like text (36 characters, no whitespace): read without the size check, it would be taken.
  symlinkSync('/proc/sys/kernel/random/boot_id', path);
  const clock = manualClock();
  const log = capturingLogger();
  const source = createTokenFileSource({ path, initial: [OLD], log: log.logger, now: clock.now });
  t.equal((await source.current()).length, 1);
  t.same(await accepted(source, OLD), [OLD]);
  t.same(log.at(40), [], 'one unstable read: no warning yet');
  for (let i = 0; i < 3; i += 1) {
    clock.advance(TOKEN_FILE_CHECK_MS);
    t.same(await accepted(source, OLD), [OLD]);
  }
  const warnings = log.at(40);
  t.equal(warnings.length, 1, 'one warning for the whole episode');
  t.match(
    warnings[0]!.msg,
    `The token file ${path} was not stable while it was read, 2 times in a row (37 bytes were read from it, but its size says 0). The 1 token(s) last read from it stay in force`,
  );
  t.match(source.problem(), `The token file ${path} was not stable while it was read, 4 times in a row`, 'the doctor says how long it lasts, the log said it once');
  t.match(warnings[0]!.msg, /rewritten in place, or not a regular file: replace it by a rename/);

  repoint(path, 'token');
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.same(await accepted(source, OLD, NEW), [NEW]);
  t.same(log.at(30).map((line) => line.msg), [
    `The token file ${path} can be used again (what was wrong with it is fixed); tokens are read from it again from now on.`,
    `Write tokens changed: 1 token(s) from ${path} are in force now.`,
  ]);
});

t.test('writes that arrive while the file is looked at wait for that look, and start none', async (t) => {
  const dir = t.testdir({ token: `${OLD}\n${NEW}\n` });
  const clock = manualClock();
  let reads = 0;
  const source = createTokenFileSource({ path: join(dir, 'token'), initial: [OLD], log: pino({ level: 'silent' }), now: clock.now, beforeRead: () => void reads++ });
  const [first, second] = await Promise.all([accepted(source, NEW), accepted(source, NEW)]);
  t.same([first, second], [[NEW], [NEW]], 'both are judged by what the look found');
  t.equal(reads, 1);
});

/**
 * An app whose token file is a symlink to `good` (holding OLD) beside a FIFO with no writer, the
 * stand-in for a hung mount: repoint the symlink at 'fifo' to make the file hang.
 */
async function hangableTokenFileApp(t: Test, files: Record<string, string> = {}) {
  const { dir, fifo: makeFifo } = fifoTestdir(t, { good: `${OLD}\n`, ...files });
  const path = join(dir, 'token');
  const fifo = makeFifo('fifo');
  symlinkSync('good', path);
  return { dir, path, fifo, ...(await tokenFileApp(t, path)) };
}

t.test('a token file that does not answer (a hung mount) holds a write up for a second at most, never the probes, and is warned about once', async (t) => {
  const { dir, path, fifo, app, clock, log, write } = await hangableTokenFileApp(t);
  t.equal(await write(OLD), 'accepted');

  repoint(path, 'fifo');
  clock.advance(TOKEN_FILE_CHECK_MS);
  const held = write(OLD);
  t.equal((await app.inject({ method: 'GET', url: '/livez' })).statusCode, 200, 'a probe answers while the write waits for the file');
  t.equal(await held, 'accepted', 'the write is judged by the tokens last read');
  t.equal(await write(NEW), 'refused');
  // Each of these would block one more of libuv's 4 threadpool threads if it started a read.
  for (let i = 0; i < 6; i += 1) {
    clock.advance(TOKEN_FILE_CHECK_MS);
    t.equal(await write(OLD), 'accepted');
  }
  t.equal(await readFile(join(dir, 'good'), 'utf8'), `${OLD}\n`, 'the process still reads files: a single read is stuck');
  const warnings = log.at(40);
  t.equal(warnings.length, 1, 'one warning while it hangs');
  t.match(
    warnings[0]!.msg,
    `The token file ${path} did not answer within 1000 ms (its read is still pending: a hung network filesystem?). The 1 token(s) last read from it stay in force`,
  );
  t.match(warnings[0]!.msg, /nor is another read started.*`cat .*` returns.*a Secret \(tmpfs\)/);

  // The mount comes back: the stuck read returns, and the file (rotated meanwhile) is read again.
  writeFileSync(join(dir, 'good'), `${OLD}\n${NEW}\n`);
  await waitUntil(() => releaseFifo(fifo), { what: 'the read to wait in open() on the FIFO' });
  repoint(path, 'good');
  // Until the stuck read has returned, a look answers "late" at once: wait (on the real clock, the
  // read's completion is I/O) and try again.
  while ((await write(NEW)) !== 'accepted') {
    await new Promise((resolve) => setTimeout(resolve, 20));
    clock.advance(TOKEN_FILE_CHECK_MS);
  }
  t.same(log.at(30).map((line) => line.msg), [
    `The token file ${path} can be used again (what was wrong with it is fixed); tokens are read from it again from now on.`,
    `Write tokens changed: 2 token(s) from ${path} are in force now.`,
  ]);
});

t.test('a token file that hangs, then answers with a bad content, reports the bad content: the latest problem, in the log and the doctor', async (t) => {
  const { path, fifo, app, clock, log, write } = await hangableTokenFileApp(t, { short: 'short\n', spaced: `${OLD}\nnew token with spaces\n` });
  const tokenCheck = async () => {
    clock.advance(REPORT_REUSE_MS);
    return ((await app.inject({ method: 'GET', url: '/doctor' })).json() as DoctorReport).checks.find((check) => check.name === 'token')!;
  };
  t.equal(await write(OLD), 'accepted');

  repoint(path, 'fifo');
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(OLD), 'accepted', 'the write is judged by the tokens last read');
  t.match(log.at(40).at(-1)!.msg, `The token file ${path} did not answer within 1000 ms`);
  t.match((await tokenCheck()).detail, `The token file ${path} did not answer within 1000 ms`);

  // The mount answers again, with a content that cannot be used.
  repoint(path, 'short');
  await waitUntil(() => releaseFifo(fifo), { what: 'the read to wait in open() on the FIFO' });
  await waitUntil(() => !blockedOpeningFifo(process.pid), { what: 'the stuck read to return' });
  await new Promise((resolve) => setTimeout(resolve, 50));
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(OLD), 'accepted', 'the tokens last read stay in force');
  const unusable = `The token file ${path} cannot be used: the token on line 1 cannot work: it is 5 characters long, and a token needs at least 16.`;
  t.match(log.at(40).at(-1)!.msg, unusable, 'the new problem is warned about');
  const check = await tokenCheck();
  t.match(check, { status: 'warn', detail: unusable }, 'and the doctor says it, not the hang that is over');

  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(OLD), 'accepted');
  t.equal(log.at(40).length, 2, 'the same problem again: no new warning');

  // Bad in another way.
  repoint(path, 'spaced');
  clock.advance(TOKEN_FILE_CHECK_MS);
  t.equal(await write(OLD), 'accepted');
  const spaced = `The token file ${path} cannot be used: the token on line 2 cannot work: it contains whitespace`;
  t.equal(log.at(40).length, 3);
  t.match(log.at(40).at(-1)!.msg, spaced);
  t.match((await tokenCheck()).detail, spaced);
});
