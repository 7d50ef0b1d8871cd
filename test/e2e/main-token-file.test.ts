// The real process (dist/src/main.js) and its token file at the ends of its life: at start, a file
// that does not answer (a FIFO without a writer stands in for a hung network mount) stops `serve` and
// `doctor` within a bound with a message saying what to check, where it used to hang them silently
// before they listened; at shutdown, a read of it stuck on such a mount does not keep the process
// alive (Node's exit waits for every read it started): it ends by SIGTERM, saying why, with every
// line it logged written out first.
import { spawnSync } from 'node:child_process';
import { chmodSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { createFakeNvidiaSmi, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { hangTokenFile, isStuckReadWarning, mkfifo, releaseFifo, startWithTokenFile } from '../helpers/fifo.js';
import { runToEnd, within } from '../helpers/server.js';

const TOKEN = 'a-token-of-enough-length';
/** Far beyond what a working start or shutdown takes, even on a loaded machine: a process still there then hangs. */
const HANG_MS = 45_000;

/** Runs main.js to its end (killed if it is still running after HANG_MS). */
const run = (args: string[], env: Record<string, string>) => runToEnd(args, env, HANG_MS);

t.test('a token file that does not answer at start stops serve and doctor within a bound, by SIGTERM, saying what to check', async (t) => {
  const dir = t.testdir({ state: {} });
  const fifos = [join(dir, 'serve-token'), join(dir, 'doctor-token')];
  for (const fifo of fifos) {
    mkfifo(fifo);
    t.teardown(() => void releaseFifo(fifo));
  }
  const env = { NODECOMPUTE_HOST: '127.0.0.1', NODECOMPUTE_PORT: '0', NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi', NODECOMPUTE_STATE_FILE: join(dir, 'state', 's.json') };
  const [serve, doctor] = await Promise.all([
    run(['serve'], { ...env, NODECOMPUTE_TOKEN_FILE: fifos[0]! }),
    run(['doctor'], { ...env, NODECOMPUTE_TOKEN_FILE: fifos[1]! }),
  ]);
  for (const [name, result, fifo] of [['serve', serve, fifos[0]!], ['doctor', doctor, fifos[1]!]] as const) {
    t.equal(result.end, 'SIGTERM', `${name}: ended (exit status 143), not left hanging`);
    // serve says it on stderr; the doctor as its token check, among the others.
    const said = name === 'serve' ? result.stderr : result.stdout;
    t.match(
      said,
      `The token file ${fifo} (NODECOMPUTE_TOKEN_FILE, --token-file) did not answer within 5000 ms, and its read is still pending: the filesystem that holds it likely hangs`,
      `${name}: what happened, and what to do`,
    );
    t.match(said, `Check that filesystem (does \`cat ${fifo}\` return?), or mount the token from a Kubernetes Secret`);
    t.match(result.stderr, `nodecompute: A read of the token file ${fifo} is still pending (its filesystem does not answer), and Node cannot exit before it returns: ending the process with SIGTERM instead (exit status 143).`);
  }
  t.match(serve.stderr, /^nodecompute: The token file /m);
  t.match(doctor.stdout, /^FAIL  token +The token file /m);
  t.match(doctor.stdout, /^FAIL  nvidia-smi /m, 'the doctor ran its other checks');
  t.notMatch(serve.stdout, /listening/, 'the service never listened');
});

t.test('a token file that cannot be read or holds no usable token stops the start with exit code 2; --help does not read it; doctor reads it, and fails its token check', async (t) => {
  const dir = t.testdir({ short: 'short\n', good: `${TOKEN}\n`, smi: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), idleEightGpuNode());
  const start = (args: string[], tokenFile: string) => run(args, { NODECOMPUTE_TOKEN_FILE: tokenFile, NODECOMPUTE_STATE_FILE: join(dir, 'state', 's.json') });
  const missing = join(dir, 'missing');
  const [unreadable, short, help, doctor] = await Promise.all([
    start([], missing),
    start(['doctor'], join(dir, 'short')),
    start(['--help'], missing),
    start(['doctor', '--nvidia-smi', fake.path], join(dir, 'good')),
  ]);
  t.equal(unreadable.end, 2);
  t.match(unreadable.stderr, `nodecompute: Invalid setting NODECOMPUTE_TOKEN_FILE (--token-file): got ${JSON.stringify(missing)} (cannot read it: ENOENT: no such file or directory`);
  t.equal(short.end, 1, 'the doctor: a failed check');
  t.match(short.stdout, /^FAIL  token +Invalid setting NODECOMPUTE_TOKEN_FILE .*\(the token on line 1 cannot work: it is 5 characters long, and a token needs at least 16\); it accepts a path to a file holding one or more tokens/m);
  t.equal(help.end, 0, '--help answers whatever the token file');
  t.match(help.stdout, 'NODECOMPUTE_TOKEN_FILE');
  t.equal(doctor.end, 0, doctor.stdout + doctor.stderr);
  t.match(doctor.stdout, new RegExp(`OK\\s+token\\s+1 token\\(s\\) from ${join(dir, 'good')} are in force for writes`), 'the doctor sees the tokens read from the file');
});

t.test('SIGTERM while a read of the token file hangs: the service ends within its grace, by SIGTERM, saying why', async (t) => {
  const { server, path } = await startWithTokenFile(t, t.testdir(), TOKEN);
  t.equal((await server.fetch('/shards/none', { method: 'DELETE', headers: { authorization: `Bearer ${TOKEN}` } })).status, 404, 'authorised, then no such shard');

  // The mount hangs: the next look at the file (a second later, on a write) waits in open() for good.
  const statuses = await hangTokenFile(server, path, TOKEN, HANG_MS);
  t.ok(statuses.length > 0 && statuses.every((status) => status === 404), `writes are judged by the tokens last read: ${statuses.join(', ')}`);
  t.ok(server.logs().some(isStuckReadWarning), 'a read of the token file is stuck');

  server.child.kill('SIGTERM');
  // close-with-grace gives the shutdown 10 s; a process still there long after that will never end.
  t.equal(await within(server.exited, HANG_MS), 'SIGTERM', 'ended (exit status 143), not left hanging until the kubelet SIGKILLs it');
  const logs = server.logs();
  t.ok(logs.some((entry) => entry.signal === 'SIGTERM' && String(entry.msg).startsWith('Shutting down')), 'after the graceful shutdown');
  t.match(
    logs.at(-1),
    {
      level: 40,
      file: path,
      msg: `A read of the token file ${path} is still pending (its filesystem does not answer), and Node cannot exit before it returns: ending the process with SIGTERM instead (exit status 143).`,
    },
    'the last line says why, and every line logged before it is out',
  );
});

t.test('a token file the service user may not read stops the start naming the uid it runs as and the file\'s owner and mode, not "invalid setting"', async (t) => {
  const dir = t.testdir({ token: `${TOKEN}\n` });
  const path = join(dir, 'token');
  // As root, the service is started as nobody (root reads any file); as another user, the file is closed to it.
  const root = process.getuid!() === 0;
  const uid = root ? 65534 : process.getuid!();
  chmodSync(path, root ? 0o600 : 0o000);
  // Only the settings, and through a shell that drops the NODE_OPTIONS tap adds to every child it
  // spawns: tap's process-info and coverage hooks could not write their files as another user.
  const main = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url));
  // `serve`, which stops at start on it (`doctor` reports it as a failed check: doctor-cli.test.ts).
  const result = spawnSync('sh', ['-c', 'unset NODE_OPTIONS; exec "$0" "$@"', process.execPath, main, 'serve'], {
    env: { PATH: String(process.env.PATH), NODECOMPUTE_TOKEN_FILE: path, NODECOMPUTE_HOST: '127.0.0.1', NODECOMPUTE_PORT: '0' },
    encoding: 'utf8',
    timeout: HANG_MS,
    ...(root ? { uid, gid: uid } : {}),
  });
  t.equal(result.status, 2, result.stderr);
  t.match(result.stderr, `nodecompute: The token file ${path} cannot be read by nodecompute (EACCES): nodecompute runs as uid ${uid}, gid `);
  t.match(result.stderr, new RegExp(`it is owned by uid ${statSync(path).uid}, gid ${statSync(path).gid}, with mode 0${root ? '600' : ''}, which does not let that user read it`));
  t.match(result.stderr, "the Secret volume's defaultMode (0440) with the pod's fsGroup");
  t.notMatch(result.stderr, /Invalid setting/, 'the setting is right; the file is not');
});
