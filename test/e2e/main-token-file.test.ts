// The real process (dist/src/main.js) and its token file at start: a file that cannot be read or
// holds no usable token stops `serve` with exit code 2 and says what to fix; `doctor` reports it.
import { spawnSync } from 'node:child_process';
import { chmodSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { createFakeNvidiaSmi, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { runToEnd } from '../helpers/server.js';

const TOKEN = 'a-token-of-enough-length';
/** Far beyond what a working start or shutdown takes, even on a loaded machine: a process still there then hangs. */
const HANG_MS = 45_000;

/** Runs main.js to its end (killed if it is still running after HANG_MS). */
const run = (args: string[], env: Record<string, string>) => runToEnd(args, env, HANG_MS);

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

// As root, the service is started as nobody (root reads any file); as another user, the file is closed to it.
const root = process.getuid!() === 0;
const uid = root ? 65534 : process.getuid!();
const main = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url));
// nobody must reach the checkout, which a folder of mode 0700 on the way (mktemp -d, /root) closes.
const nobodyShutOut = root && spawnSync('test', ['-r', main], { uid, gid: uid }).status !== 0;

t.test('a token file the service user may not read stops the start naming the uid it runs as and the file\'s owner and mode, not "invalid setting"', {
  skip: nobodyShutOut && `as root this starts the service as nobody (uid ${uid}), who cannot reach ${main}: run the tests from a checkout every user may traverse`,
}, async (t) => {
  const dir = t.testdir({ token: `${TOKEN}\n` });
  const path = join(dir, 'token');
  chmodSync(path, root ? 0o600 : 0o000);
  // Only the settings, and through a shell that drops the NODE_OPTIONS tap adds to every child it
  // spawns: tap's process-info and coverage hooks could not write their files as another user.
  // `serve`, which stops at start on it (`doctor` reports it as a failed check: doctor-cli.test.ts).
  const result = spawnSync('sh', ['-c', 'unset NODE_OPTIONS; exec "$0" "$@"', process.execPath, main, 'serve'], {
    env: { PATH: String(process.env.PATH), NODECOMPUTE_TOKEN_FILE: path, NODECOMPUTE_HOST: '127.0.0.1', NODECOMPUTE_PORT: '0' },
    encoding: 'utf8',
    timeout: HANG_MS,
    ...(root ? { uid, gid: uid } : {}),
  });
  t.equal(result.status, 2, result.stderr);
  t.match(result.stderr, `nodecompute: The token file ${path} is unreadable (EACCES) to nodecompute, which runs as uid ${uid}, gid `);
  t.match(result.stderr, new RegExp(`it is owned by uid ${statSync(path).uid}, gid ${statSync(path).gid}, mode 0${root ? '600' : ''}`));
  t.match(result.stderr, /defaultMode \(0440\).*fsGroup/);
  t.notMatch(result.stderr, /Invalid setting/, 'the setting is right; the file is not');
});
