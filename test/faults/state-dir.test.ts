// The state file's directory stops being writable while the service runs. Tests run as root, whom
// chmod does not stop, so the directory is replaced by a regular file of the same name: mkdir and
// open then fail (EEXIST / ENOTDIR) as they would on a read-only or vanished volume. A change is
// then refused with a coded 503 naming the file and what to do, is not acknowledged, and loses
// nothing already stored; once the directory is back, writes work again and a restarted service
// finds every shard that was acknowledged. A directory that takes no new file (one on procfs, which
// refuses to create any) fails each write at its temp file instead: that failure, repeated, is one
// error line when the directory turns and one warning a minute, in the same words every time.
import { existsSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import t from 'tap';
import { pino } from 'pino';
import { buildApp } from '../../src/app.js';
import { buildTestApp, manualClock, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { captureLog } from '../helpers/log-capture.js';
import { killLeftovers } from '../helpers/process-scan.js';

t.test('the state directory replaced by a file: writes refused with STATE_WRITE_FAILED, nothing stored is lost', async (t) => {
  // One process per id: a process is registered under one id only.
  const [second, third, ...stormers] = await Promise.all(Array.from({ length: 22 }, () => spawnShardProcess(t, 0)));
  const shard = await spawnShardProcess(t, 1);
  const { app, config, fake } = await buildTestApp(t, { scenario: eightGpuNode() });
  t.teardown(() => killLeftovers(fake));
  const stateDir = dirname(config.stateFile);
  const ids = async () => ((await app.inject({ method: 'GET', url: '/shards' })).json().shards as Array<{ id: string }>).map((s) => s.id);

  t.equal((await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [0] } })).statusCode, 201);
  t.equal((await app.inject({ method: 'PUT', url: '/shards/b', payload: { pid: second!.pid, gpus: [1] } })).statusCode, 201);
  const original = readFileSync(config.stateFile);

  renameSync(stateDir, `${stateDir}.moved`);
  writeFileSync(stateDir, 'not a directory\n');
  t.teardown(() => {
    // Put the directory back whatever happened (a failing assertion must not leave the file).
    if (existsSync(`${stateDir}.moved`)) {
      rmSync(stateDir, { force: true, recursive: true });
      renameSync(`${stateDir}.moved`, stateDir);
    }
  });

  const refused = await app.inject({ method: 'PUT', url: '/shards/c', payload: { pid: third!.pid, gpus: [2] } });
  t.equal(refused.statusCode, 503, refused.body.slice(0, 300));
  const body = refused.json();
  t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode']);
  t.equal(body.code, 'NODECOMPUTE_STATE_WRITE_FAILED');
  t.match(body.message, config.stateFile, 'names the file');
  t.match(body.message, /not stored/, 'says the registration was not stored');
  t.match(body.message, /Nothing already registered was lost/);
  t.match(body.message, /Make the state directory writable/, 'says what to do');
  t.equal((await app.inject({ method: 'GET', url: '/shards/c' })).statusCode, 404, 'not acknowledged, not served');

  // A replacement and a removal are refused the same way and leave the shard as it was.
  const replace = await app.inject({ method: 'PUT', url: '/shards/a', payload: { pid: shard.pid, gpus: [5] } });
  t.equal(replace.statusCode, 503);
  t.equal(replace.json().code, 'NODECOMPUTE_STATE_WRITE_FAILED');
  t.same((await app.inject({ method: 'GET', url: '/shards/a' })).json().gpus, [0], 'a keeps its stored GPUs');
  const remove = await app.inject({ method: 'DELETE', url: '/shards/b' });
  t.equal(remove.statusCode, 503);
  t.equal(remove.json().code, 'NODECOMPUTE_STATE_WRITE_FAILED');
  t.same(await ids(), ['a', 'b'], 'the earlier shards are still listed');

  // Concurrent writes while it fails: each refused, none acknowledged.
  const storm = await Promise.all(
    stormers.map((stormer, i) => app.inject({ method: 'PUT', url: `/shards/storm-${i}`, payload: { pid: stormer.pid, gpus: [i % 8] } })),
  );
  t.ok(storm.every((res) => res.statusCode === 503 && res.json().code === 'NODECOMPUTE_STATE_WRITE_FAILED'), 'every concurrent write refused');
  t.same(await ids(), ['a', 'b'], 'and none acknowledged');

  // The directory comes back: the stored file is intact, and writes work again.
  rmSync(stateDir);
  renameSync(`${stateDir}.moved`, stateDir);
  t.ok(readFileSync(config.stateFile).equals(original), 'the state file is byte for byte what was acknowledged');
  t.same(
    readdirSync(stateDir).filter((name) => name.endsWith('.tmp')),
    [],
    'no temp file was left behind',
  );
  t.equal((await app.inject({ method: 'PUT', url: '/shards/c', payload: { pid: third!.pid, gpus: [2] } })).statusCode, 201, 'writes work again');
  t.same(await ids(), ['a', 'b', 'c']);

  // A restarted service from the state file as acknowledged before the failure finds a and b.
  writeFileSync(config.stateFile, original);
  const restarted = await buildApp(config, { logger: pino({ level: 'silent' }) });
  t.teardown(() => restarted.close());
  const listed = (await restarted.inject({ method: 'GET', url: '/shards' })).json().shards as Array<{ id: string; gpus: number[] }>;
  t.same(listed.map((s) => [s.id, s.gpus]), [['a', [0]], ['b', [1]]], 'every acknowledged shard, as acknowledged');
});

t.test('a state file whose parent path is a regular file: the first write is refused, clearly', async (t) => {
  const dir = t.testdir({ 'a-file': 'I am not a directory\n' });
  const stateFile = `${dir}/a-file/state/shards.json`;
  // Start-up reads the state file first; ENOTDIR there is not "no file yet", so the start fails loudly.
  const built = buildTestApp(t, { scenario: eightGpuNode(), config: { stateFile } });
  await t.rejects(built, { code: 'NODECOMPUTE_STATE_FILE_INVALID', message: /a-file\/state\/shards\.json/ }, 'refuses to start, naming the file');
});

t.test('writes refused the same way again and again: one error line when the directory turns, one warning a minute, the same words each time', async (t) => {
  const [first, ...others] = await Promise.all(Array.from({ length: 6 }, () => spawnShardProcess(t, 0)));
  const { log: logger, lines } = captureLog();
  const clock = manualClock();
  const { app, config, fake } = await buildTestApp(t, { scenario: eightGpuNode(), deps: { logger, now: clock.now } });
  t.teardown(() => killLeftovers(fake));
  const stateDir = dirname(config.stateFile);
  const put = (id: string, pid: number) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus: [0] } });
  t.equal((await put('a', first!.pid)).statusCode, 201);

  // procfs takes no new file, so each write fails at its own temp file, which the system's message names.
  renameSync(stateDir, `${stateDir}.moved`);
  symlinkSync('/proc', stateDir);
  t.teardown(() => {
    if (existsSync(`${stateDir}.moved`)) {
      rmSync(stateDir, { force: true });
      renameSync(`${stateDir}.moved`, stateDir);
    }
  });
  const since = lines.length;
  const refused = [];
  for (const [i, shard] of others.slice(0, 3).entries()) refused.push(await put(`s${i}`, shard.pid));
  t.same(refused.map((res) => [res.statusCode, res.json().code]), Array(3).fill([503, 'NODECOMPUTE_STATE_WRITE_FAILED']), 'each write refused');
  const message = refused[0]!.json().message as string;
  t.ok(
    message.startsWith(`The change was not stored: writing the state file ${config.stateFile} failed (ENOENT: no such file or directory). `),
    `names the state file and the system's error: ${message}`,
  );
  t.notMatch(message, /\.tmp|\/proc/, 'not the temp file the write made');
  t.same(refused.map((res) => res.json().message), Array(3).fill(message), 'the same words every time');

  const logged = () => lines.slice(since);
  const failed = () => logged().filter((line) => line.msg === 'Request failed').map((line) => line.level);
  t.same(failed(), [40, 20, 20], 'the 503 is one warning, its repeats debug lines');
  t.match(
    logged().filter((line) => line.level >= 50),
    [{ stateFile: config.stateFile, msg: /^Registrations cannot be stored in .*: cannot write in .*: ENOENT: no such file or directory\. Every registration/ }],
  );
  t.equal(logged().filter((line) => line.level >= 50).length, 1, 'one error line: the directory turned unwritable; none per refused write');
  t.same(
    logged().filter((line) => line.level > 20 && JSON.stringify(line).includes('"stack"')),
    [],
    'no stack above debug: the failure is expected, and its words say it all',
  );

  clock.advance(60_000);
  t.equal((await put('s3', others[3]!.pid)).statusCode, 503);
  t.same(failed(), [40, 20, 20, 40], 'a minute on, the same failure is a warning again');

  rmSync(stateDir);
  renameSync(`${stateDir}.moved`, stateDir);
  t.equal((await put('s4', others[4]!.pid)).statusCode, 201, 'writes work again');
  t.match(logged().filter((line) => line.level >= 30 && line.msg !== 'Request failed'), [
    { level: 50, msg: /^Registrations cannot be stored in / },
    { level: 30, msg: `Registrations can be stored in ${config.stateFile} again.` },
  ]);
});

t.test('two services given one state file: the second writer is refused, loudly, and no acknowledged registration is lost', async (t) => {
  const [a, b, c] = await Promise.all([spawnShardProcess(t, 0), spawnShardProcess(t, 0), spawnShardProcess(t, 0)]);
  const { log: logger, lines } = captureLog();
  // An idle node: /readyz then fails for the state file alone.
  const first = await buildTestApp(t, { scenario: idleEightGpuNode() });
  t.teardown(() => killLeftovers(first.fake));
  const put = (app: typeof first.app, id: string, pid: number) => app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid, gpus: [0] } });
  t.equal((await put(first.app, 'a', a!.pid)).statusCode, 201);
  // A copy started by hand (or a second DaemonSet) with the same NODECOMPUTE_STATE_FILE: it reads a.
  const second = await buildApp(first.config, { logger });
  t.teardown(() => second.close());
  t.same(((await second.inject({ method: 'GET', url: '/shards' })).json().shards as Array<{ id: string }>).map((s) => s.id), ['a']);

  // The first writes again after the second read the file: the second's next write would throw b away.
  t.equal((await put(first.app, 'b', b!.pid)).statusCode, 201);
  const refused = await put(second, 'c', c!.pid);
  t.equal(refused.statusCode, 503, refused.body);
  t.equal(refused.json().code, 'NODECOMPUTE_STATE_WRITE_FAILED');
  const { message } = refused.json() as { message: string };
  t.match(message, `The change was not stored: writing the state file ${first.config.stateFile} failed (${first.config.stateFile} was changed by another process `);
  t.match(message, /a second nodecompute, or an edit by hand.*\)\. Nothing already registered was lost\. Only one nodecompute may use a state file: stop the other/);
  t.match(message, /NODECOMPUTE_STATE_FILE.*restart this one to read the file again\.$/);
  t.same(
    (JSON.parse(readFileSync(first.config.stateFile, 'utf8')) as { shards: Array<{ id: string }> }).shards.map((s) => s.id),
    ['a', 'b'],
    'the file keeps every registration the first acknowledged',
  );
  t.match(
    lines.filter((line) => line.level >= 50),
    [{ msg: /^Registrations cannot be stored in .*: .* was changed by another process .* Only one nodecompute may use a state file: stop the other one/ }],
    'the second says so in its log, once, with what to do',
  );
  const readyz = await second.inject({ method: 'GET', url: '/readyz' });
  t.equal(readyz.statusCode, 503, 'the second is not ready: it cannot store a registration');
  t.match(readyz.body, /was changed by another process.*restart this one to read the file again/);
  t.equal((await second.inject({ method: 'DELETE', url: '/shards/a' })).statusCode, 503, 'nor a removal');
  const doctor = (await second.inject({ method: 'GET', url: '/doctor' })).json() as { checks: Array<{ name: string }> };
  t.match(
    doctor.checks.find((check) => check.name === 'state-file'),
    { status: 'fail', detail: / was changed by another process .*since this one read or wrote it/, fix: /^Only one nodecompute may use a state file/ },
    "the doctor's state-file check fails, with what to do",
  );
  t.equal((await second.inject({ method: 'PUT', url: '/shards/c', payload: { pid: c!.pid, gpus: [0] } })).statusCode, 503, "the doctor's read of the file does not make it the second's");

  // The first goes on: its own writes are what the file holds.
  t.equal((await put(first.app, 'c', c!.pid)).statusCode, 201, 'the first still stores');
  // A restart of the second reads the file again and stores once more (the first stopped first).
  await first.app.close();
  await second.close();
  const restarted = await buildApp(first.config, { logger: pino({ level: 'silent' }) });
  t.teardown(() => restarted.close());
  t.equal((await restarted.inject({ method: 'DELETE', url: '/shards/c' })).statusCode, 204, 'a restarted one writes again');
});
