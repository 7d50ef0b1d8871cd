// Settings: env and flags over defaults, validated once, with messages naming the setting and what
// it accepts; the help lists every setting. The token file is read at start by readStartTokens,
// within a bound: a file that does not answer (a FIFO without a writer stands in for a hung mount)
// fails the start with a message saying what to check, instead of hanging it.
import { chmodSync, mkdirSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import {
  defaultConfig,
  nearestWord,
  parseTokenFile,
  readStartTokens,
  resolveConfig,
  SETTINGS,
  settingsHelp,
  TOKEN_FILE_START_TIMEOUT_MS,
  tokenProblem,
  unreadableTokenFile,
} from '../src/config.js';
import { TOKEN_FILE_READ_TIMEOUT_MS } from '../src/system/token-file.js';
import { waitUntil } from './helpers/fake-nvidia-smi.js';
import { blockedOpeningFifo, fifoTestdir, releaseFifo } from './helpers/fifo.js';

t.test('defaults', async (t) => {
  const { config, positionals, help, version } = resolveConfig({}, []);
  t.same(config, defaultConfig());
  t.same(
    { host: config.host, port: config.port, nvidiaSmi: config.nvidiaSmi, proc: config.proc, ttl: config.cacheTtlMs, stale: config.maxStaleMs, timeout: config.smiTimeoutMs, log: config.logLevel, grace: config.gpuGraceMs, token: config.token },
    { host: '::', port: 9470, nvidiaSmi: 'nvidia-smi', proc: '/proc', ttl: 1000, stale: 30000, timeout: 5000, log: 'info', grace: 15000, token: null },
  );
  t.equal(resolveConfig({}, []).defaultHost, true, 'the host is the default, so main.ts may fall back to 0.0.0.0');
  t.same(positionals, []);
  t.equal(help, false);
  t.equal(version, false);
  t.same(resolveConfig({}, []).warnings, [], 'the defaults warn about nothing');
});

t.test('flags win over environment variables, which win over defaults', async (t) => {
  const { config, positionals } = resolveConfig(
    { NODECOMPUTE_PORT: '8000', NODECOMPUTE_CACHE_TTL_MS: '250', NODECOMPUTE_LOG_LEVEL: 'debug', NODECOMPUTE_HOST: '' },
    ['serve', '--port', '9000', '--nvidia-smi=/opt/bin/nvidia-smi'],
  );
  t.equal(config.port, 9000);
  t.equal(config.cacheTtlMs, 250);
  t.equal(config.logLevel, 'debug');
  t.equal(config.nvidiaSmi, '/opt/bin/nvidia-smi');
  t.equal(config.host, '::', 'an empty variable counts as unset');
  t.same(positionals, ['serve']);
  t.equal(resolveConfig({}, ['--help']).help, true);
  t.equal(resolveConfig({}, ['-v']).version, true);
});

t.test('a host that is given, even the default ::, is used as given: only the default may fall back', async (t) => {
  const cases: Array<[Record<string, string>, string[], string, boolean]> = [
    [{}, [], '::', true],
    [{ NODECOMPUTE_HOST: '' }, [], '::', true],
    [{ NODECOMPUTE_HOST: '::' }, [], '::', false],
    [{}, ['--host', '::'], '::', false],
    [{ NODECOMPUTE_HOST: '0.0.0.0' }, [], '0.0.0.0', false],
    [{ NODECOMPUTE_HOST: '::' }, ['--host=127.0.0.1'], '127.0.0.1', false],
  ];
  for (const [env, argv, host, defaultHost] of cases) {
    const cli = resolveConfig(env, argv);
    t.same([cli.config.host, cli.defaultHost], [host, defaultHost], JSON.stringify({ env, argv }));
  }
  t.match(settingsHelp(), /NODECOMPUTE_HOST \(default: ::\)\n.*takes IPv6 and IPv4.*without IPv6 it listens on 0\.0\.0\.0 instead/);
});

t.test('bad values stop the start with the setting, the value and what it accepts', async (t) => {
  const cases: Array<[Record<string, string>, string[], RegExp]> = [
    [{ NODECOMPUTE_PORT: 'abc' }, [], /NODECOMPUTE_PORT \(--port\): got "abc" \(not an integer\); it accepts an integer from 0 to 65535/],
    [{}, ['--port', '70000'], /NODECOMPUTE_PORT \(--port\): got "70000"; it accepts/],
    [{ NODECOMPUTE_SMI_TIMEOUT_MS: '5' }, [], /NODECOMPUTE_SMI_TIMEOUT_MS.*from 100 to 600000/],
    [{ NODECOMPUTE_LOG_LEVEL: 'loud' }, [], /NODECOMPUTE_LOG_LEVEL.*fatal, error, warn, info, debug, trace, silent/],
    [{ NODECOMPUTE_TOKEN: 'short' }, [], /NODECOMPUTE_TOKEN.*at least 16 characters/],
    [{ NODECOMPUTE_CACHE_TTL_MS: '1.5' }, [], /NODECOMPUTE_CACHE_TTL_MS.*not an integer/],
    [{}, ['--bogus'], /^unknown flag --bogus\. Run `nodecompute --help` for the flags/],
    [{}, ['--port'], /^Option '--port <value>' argument missing\. Run `nodecompute --help` for the settings\.$/],
    // 20 spaces: accepted before, and then no bearer header could ever match.
    [{ NODECOMPUTE_TOKEN: ' '.repeat(20) }, [], /NODECOMPUTE_TOKEN \(--token\).*\(it is blank\); it accepts a secret of at least 16 characters, printable ASCII without spaces/],
    [{}, ['--token', ''], /NODECOMPUTE_TOKEN \(--token\): got an empty value \(it is blank\)/],
    [{}, ['--token', 's3cret-token 0123456789'], /NODECOMPUTE_TOKEN \(--token\): got a secret of 23 characters, not shown \(it contains whitespace/],
    [{ NODECOMPUTE_TOKEN: 's3cret-token\t0123456789' }, [], /NODECOMPUTE_TOKEN.*contains whitespace, which an "Authorization: Bearer" header cannot carry/],
    [{ NODECOMPUTE_TOKEN: '  short-token  ' }, [], /NODECOMPUTE_TOKEN \(--token\): got a secret of 11 characters, not shown \(it is 11 characters long, and a token needs at least 16\); it accepts/],
    [
      { NODECOMPUTE_CACHE_TTL_MS: '60000' },
      [],
      /NODECOMPUTE_MAX_STALE_MS \(--max-stale-ms\): got 30000 \(below NODECOMPUTE_CACHE_TTL_MS \(60000\).*no stale answer.*at least 60000/,
    ],
    [
      {},
      ['--cache-ttl-ms', '2000', '--max-stale-ms', '1999'],
      // In its own range, so no "it accepts 0 to ..." that the value already meets.
      /^Invalid setting NODECOMPUTE_MAX_STALE_MS \(--max-stale-ms\): got 1999 \(below NODECOMPUTE_CACHE_TTL_MS \(2000\).* or lower NODECOMPUTE_CACHE_TTL_MS\)\. Fix the environment variable or flag and start again\.$/,
    ],
  ];
  for (const [env, argv, message] of cases) {
    t.throws(() => resolveConfig(env, argv), { code: 'NODECOMPUTE_CONFIG_INVALID', message }, JSON.stringify({ env, argv }));
  }
});

t.test('an unknown flag is named as typed, with the flag it most likely meant, and nothing about positionals or --', async (t) => {
  const help = 'Run `nodecompute --help` for the flags and the environment variable of each.';
  const cases: Array<[string[], string]> = [
    [['--bogus', '1'], `unknown flag --bogus. ${help}`],
    [['serve', '--bogus=1'], `unknown flag --bogus. ${help}`],
    [['--prot', '9000'], `unknown flag --prot (did you mean --port?). ${help}`],
    [['--statefile', 's.json'], `unknown flag --statefile (did you mean --state-file?). ${help}`],
    [['--nvidia_smi', '/usr/bin/nvidia-smi'], `unknown flag --nvidia_smi (did you mean --nvidia-smi?). ${help}`],
    [['--NODECOMPUTE_PORT', '9000'], `unknown flag --NODECOMPUTE_PORT (did you mean --port?). ${help}`],
    [['--verison'], `unknown flag --verison (did you mean --version?). ${help}`],
    [['--cache-ttl', '500'], `unknown flag --cache-ttl (did you mean --cache-ttl-ms?). ${help}`],
    // One dash reads as the short flags -p -o -r -t: the argument is named as it was typed.
    [['-port', '9000'], `unknown flag -port (did you mean --port?). ${help}`],
    [['-x'], `unknown flag -x. ${help}`],
    [['--toString'], `unknown flag --toString. ${help}`],
  ];
  for (const [argv, message] of cases) {
    const err = t.throws(() => resolveConfig({}, argv), { code: 'NODECOMPUTE_CONFIG_INVALID' }, argv.join(' ')) as Error;
    t.equal(err.message, message, argv.join(' '));
    t.notMatch(err.message, /positional|'--'/, `${argv.join(' ')}: no advice about positionals`);
  }
  t.same(resolveConfig({}, ['-h', '--', '--bogus']).positionals, ['--bogus'], 'after --, nothing is a flag');
});

t.test('nearestWord: another spelling of a word, or a near one, else nothing', async (t) => {
  const words = ['serve', 'doctor'];
  t.equal(nearestWord('docter', words), 'doctor');
  t.equal(nearestWord('DOCTOR', words), 'doctor');
  t.equal(nearestWord('srvee', words), 'serve', 'a transposition and an edit');
  t.equal(nearestWord('fly', words), null);
  t.equal(nearestWord('do', words), null, 'too short to tell');
  const settings = ['cache-ttl-ms', 'smi-timeout-ms', 'state-timeout-ms', 'gpu-grace-ms', 'state-file', 'token-file'];
  t.equal(nearestWord('NODECOMPUTE_TTL_MS', settings), 'cache-ttl-ms', 'the name cut short at the front');
  t.equal(nearestWord('grace', settings), 'gpu-grace-ms', 'cut short at the front, the unit left out');
  t.equal(nearestWord('timeout-ms', settings), null, 'two settings end so: neither is guessed');
  t.equal(nearestWord('file', settings), null, 'nor here');
  t.equal(nearestWord('ms', settings), null, 'a unit alone names no setting');
});

t.test('a refused token is never echoed: its length is enough to find it', async (t) => {
  const secret = 'my real secret 0123456789';
  const err = t.throws(() => resolveConfig({ NODECOMPUTE_TOKEN: secret }, [])) as Error;
  t.match(err.message, 'got a secret of 25 characters, not shown');
  t.notMatch(err.message, 'secret 0123');
});

t.test('a token from the variable or flag: whitespace around it is ignored, one token only', async (t) => {
  const { config } = resolveConfig({ NODECOMPUTE_TOKEN: '  s3cret-token-0123456789\n' }, []);
  t.equal(config.token, 's3cret-token-0123456789', 'a Secret made with echo still works');
  t.same(config.fileTokens, [], 'the file tokens are for the file only');
  t.equal(resolveConfig({}, ['--token', 'aZ09-._~+/bcdefgh==']).config.token, 'aZ09-._~+/bcdefgh==', "RFC 6750's characters, = at the end");
  t.throws(() => resolveConfig({}, ['--token', 'pässwörtpässwört01']), {
    message: /^Invalid setting NODECOMPUTE_TOKEN \(--token\): got a secret of 18 characters, not shown \(character 2 is not printable ASCII/,
  }, 'a character no header can carry is refused, without echoing the token');
});

t.test('stale answers need max-stale of at least the TTL; equal turns them off and is accepted', async (t) => {
  const { config } = resolveConfig({ NODECOMPUTE_CACHE_TTL_MS: '0', NODECOMPUTE_MAX_STALE_MS: '0' }, []);
  t.same([config.cacheTtlMs, config.maxStaleMs], [0, 0]);
  t.equal(resolveConfig({}, ['--cache-ttl-ms', '5000', '--max-stale-ms', '5000']).config.maxStaleMs, 5000);
});

t.test('a NODECOMPUTE_ variable that is no setting is ignored with a warning naming the setting it likely meant; those Kubernetes sets for a Service named nodecompute or nodecompute-* are not warned about', async (t) => {
  const { config, warnings } = resolveConfig(
    {
      NODECOMPUTE_PROT: '19480',
      NODECOMPUTE_TOKENFILE: '/run/secrets/token',
      NODECOMPUTE_COLOUR: 'blue',
      NODECOMPUTE_SERVICE_HOST: '10.96.0.5',
      NODECOMPUTE_SERVICE_PORT: '9470',
      NODECOMPUTE_SERVICE_PORT_HTTP: '9470',
      NODECOMPUTE_PORT_9470_TCP: 'tcp://10.96.0.5:9470',
      NODECOMPUTE_PORT_9470_TCP_PROTO: 'tcp',
      NODECOMPUTE_PORT_9470_TCP_PORT: '9470',
      NODECOMPUTE_PORT_9470_TCP_ADDR: '10.96.0.5',
      NODECOMPUTE_METRICS_SERVICE_HOST: '10.96.0.6',
      NODECOMPUTE_METRICS_SERVICE_PORT_HTTP_METRICS: '9470',
      NODECOMPUTE_METRICS_PORT: 'tcp://10.96.0.6:9470',
      NODECOMPUTE_METRICS_PORT_9470_TCP_PROTO: 'tcp',
      NODECOMPUTE_LOG_LEVEL: 'debug',
      NODECOMPUTE_CACHE_TTL: '500',
      NODE_OPTIONS: '--max-old-space-size=128',
    },
    [],
  );
  t.same([config.port, config.tokenFile, config.logLevel], [9470, null, 'debug'], 'the typos change nothing; the setting is read');
  t.equal(warnings.length, 4);
  const expected: Array<[string, string | null]> = [
    ['NODECOMPUTE_CACHE_TTL', 'NODECOMPUTE_CACHE_TTL_MS'],
    ['NODECOMPUTE_COLOUR', null],
    ['NODECOMPUTE_PROT', 'NODECOMPUTE_PORT'],
    ['NODECOMPUTE_TOKENFILE', 'NODECOMPUTE_TOKEN_FILE'],
  ];
  for (const [index, [name, meant]] of expected.entries()) {
    t.match(warnings[index], new RegExp(`^${name} is not a setting .*ignored.*nodecompute --help`), name);
    if (meant === null) t.notMatch(warnings[index], 'did you mean', name);
    else t.match(warnings[index], `(did you mean ${meant}?)`, name);
  }
});

t.test("NODECOMPUTE_PORT as a Kubernetes service link sets it (tcp://IP:PORT) stops the start, saying where it comes from", async (t) => {
  const err = t.throws(() => resolveConfig({ NODECOMPUTE_PORT: 'tcp://10.96.0.5:9470' }, []), { code: 'NODECOMPUTE_CONFIG_INVALID' }) as Error;
  t.match(err.message, /^Invalid setting NODECOMPUTE_PORT \(--port\): got "tcp:\/\/10\.96\.0\.5:9470" \(.*service link.*Kubernetes.*Docker/);
  t.match(err.message, /enableServiceLinks: false.*deploy\/kubernetes\/daemonset\.yaml.*NODECOMPUTE_PORT in the container's env/);
  t.match(err.message, /it accepts an integer from 0 to 65535/);
  t.equal(resolveConfig({ NODECOMPUTE_PORT: 'tcp://10.96.0.5:9470' }, ['--port', '9471']).config.port, 9471, 'a --port flag wins over it');
  t.throws(() => resolveConfig({ NODECOMPUTE_PORT: 'http://x' }, []), { message: /got "http:\/\/x" \(not an integer\)/ }, 'any other scheme is just not a port');
});

t.test("a probe wait over 1 s starts, with one warning about Kubernetes' 1 s probe timeout", async (t) => {
  t.same(resolveConfig({ NODECOMPUTE_PROBE_WAIT_MS: '1000' }, []).warnings, [], 'up to 1 s: no warning');
  const { config, warnings } = resolveConfig({ NODECOMPUTE_PROBE_WAIT_MS: '2500' }, []);
  t.equal(config.probeWaitMs, 2500, 'accepted');
  t.equal(warnings.length, 1);
  t.match(warnings[0], /NODECOMPUTE_PROBE_WAIT_MS is 2500 ms.*probe timeout of 1 s/);
  t.match(warnings[0], /timeoutSeconds .*to at least 3,.*below 1000/);
  t.match(resolveConfig({}, ['--probe-wait-ms', '1001']).warnings[0], /timeoutSeconds .*to at least 2,/);
});

t.test('what a token may be: the same rules for the variable, the flag and each line of the file', async (t) => {
  const cases: Array<[string, RegExp | null]> = [
    ['s3cret-token-0123456789', null],
    ['x'.repeat(16), null],
    ['x'.repeat(15), /\b15 characters long.*at least 16$/],
    ['', /^it is blank$/],
    ['s3cret token 0123456789', /whitespace.*"Authorization: Bearer" header/],
    ['s3cret\u00a0token-0123456789', /whitespace.*"Authorization: Bearer" header/],
    // Node reads header bytes as Latin-1: a UTF-8 token from the file could never be matched.
    ['pässwörtpässwört01', /^character 2 is not printable ASCII.*openssl rand -hex 32/],
    ['control\u0001character-0123', /^character 8 is not printable ASCII.*openssl rand -hex 32/],
    // Beyond RFC 6750's b64token: what a password manager makes, which clients send as it is.
    ['pa$$w0rd!from-a-vault', null],
    ['a,b;c:d"e\'f-0123456789', null],
    ['base64-with=inside-0123', null],
    // A hand-edited Secret's mistakes, which the quotes or the name would make part of the token.
    ['"quoted-token-0123456789"', /wrapped in quotes/],
    ["'quoted-token-0123456789'", /wrapped in quotes/],
    ['"half-quoted-token-0123456789', null],
    ['NODECOMPUTE_TOKEN="0123456789abcdef0123"', /an assignment \(NAME=token\)/],
    ['token=0123456789abcdef0123', /an assignment \(NAME=token\)/],
    ['Xk2=9f!Qz$0123456789', null],
    ['aGVsbG8gd29ybGQhIQ+/==', null],
    ['REPLACE-ME-with-at-least-16-random-characters', /placeholder of deploy\/kubernetes\/secret\.example\.yaml.*kubectl -n nodecompute create secret generic nodecompute-token/],
    ['replace-me-0123456789abcdef', /placeholder of deploy\/kubernetes\/secret\.example\.yaml.*kubectl -n nodecompute create secret generic nodecompute-token/],
  ];
  for (const [token, problem] of cases) {
    if (problem === null) t.equal(tokenProblem(token), null, JSON.stringify(token));
    else t.match(tokenProblem(token), problem, JSON.stringify(token));
  }
});

t.test('a token file holds one token a line; blank lines and surrounding whitespace are ignored', async (t) => {
  const old = 'old-token-0123456789';
  const next = 'new-token-0123456789';
  t.same(parseTokenFile(`${old}\n`), { tokens: [old], problem: null });
  t.same(parseTokenFile(`\n  ${old}  \r\n\n\t${next}\r\n\n`), { tokens: [old, next], problem: null }, 'CRLF, tabs and blank lines');
  t.same(parseTokenFile(`${old}\n${old}\n`), { tokens: [old], problem: null }, 'a token twice counts once');
  t.same(parseTokenFile(''), { tokens: null, problem: 'it holds no token (it is empty, blank or only comments)' });
  t.same(parseTokenFile(' \n\n  \n'), { tokens: null, problem: 'it holds no token (it is empty, blank or only comments)' });
  t.same(parseTokenFile(`# rotated 2026-12-01 by ops\n${old}\n  #next one:\n${next}\n`), { tokens: [old, next], problem: null }, '"#" starts a comment line, spaces or not');
  t.same(parseTokenFile('# nothing yet\n'), { tokens: null, problem: 'it holds no token (it is empty, blank or only comments)' });
  t.same(parseTokenFile(`${old}\n${next}#not-a-comment\n`), { tokens: [old, `${next}#not-a-comment`], problem: null }, 'only a whole line is a comment: a "#" inside a token is part of it');
  t.match(parseTokenFile(`${old}\n\nnew token 0123456789\n`).problem, /^the token on line 3 cannot work: it contains whitespace/);
  t.match(parseTokenFile(`${old}\nshort\n`).problem, /^the token on line 2 cannot work: it is 5 characters long, and a token needs at least 16$/);
});

/** The start-up tokens of the token file at `path`, as main.ts reads them. */
async function startTokens(path: string, options: Parameters<typeof readStartTokens>[1] = {}) {
  return readStartTokens(resolveConfig({ NODECOMPUTE_TOKEN_FILE: path }, []).config, options);
}

t.test('the token can come from a file (a mounted Secret), not from both places', async (t) => {
  const dir = t.testdir({
    token: '  s3cret-token-0123456789\n',
    short: 'abc\n',
    rotating: 'old-token-0123456789\nnew-token-0123456789\n',
    empty: '',
    blank: '\n   \n',
    spaced: 'old-token-0123456789\nnew token 0123456789\n',
  });
  t.equal((await startTokens(join(dir, 'token'))).token, 's3cret-token-0123456789');
  await t.rejects(startTokens(join(dir, 'short')), { code: 'NODECOMPUTE_CONFIG_INVALID', message: /the token on line 1 cannot work: it is 3 characters long, and a token needs at least 16/ });
  const rotating = await startTokens(join(dir, 'rotating'));
  t.same(rotating.fileTokens, ['old-token-0123456789', 'new-token-0123456789'], 'several tokens, any of them accepted');
  t.equal(rotating.token, 'old-token-0123456789', 'a token is configured (the doctor says so)');
  for (const name of ['empty', 'blank']) {
    const path = join(dir, name);
    await t.rejects(startTokens(path), { message: `Invalid setting NODECOMPUTE_TOKEN_FILE (--token-file): got ${JSON.stringify(path)} (it holds no token` }, name);
  }
  await t.rejects(readStartTokens(resolveConfig({}, ['--token-file', join(dir, 'spaced')]).config), { message: /NODECOMPUTE_TOKEN_FILE.*the token on line 2 cannot work: it contains whitespace/ });
  writeFileSync(join(dir, 'other'), 'another-token-0123456789');
  t.throws(() => resolveConfig({ NODECOMPUTE_TOKEN_FILE: join(dir, 'other'), NODECOMPUTE_TOKEN: 'x'.repeat(20) }, []), { message: /set only one of them/ });
});

t.test('resolveConfig reads no file: the token file is named, its tokens are read by readStartTokens', async (t) => {
  // A path that cannot be read: resolving the settings (and --help) does not care.
  const cli = resolveConfig({ NODECOMPUTE_TOKEN_FILE: '/nonexistent/token' }, ['--help']);
  t.equal(cli.help, true, '--help answers whatever the token file');
  t.same([cli.config.tokenFile, cli.config.token, cli.config.fileTokens], ['/nonexistent/token', null, []], 'named, not read yet');
  const plain = defaultConfig({ token: 'a-token-of-enough-length' });
  t.equal(await readStartTokens(plain), plain, 'without a token file, the config as it is');
});

t.test('a token file that cannot be read, or is never stable while read, stops the start naming it', async (t) => {
  const dir = t.testdir({ token: 'a-token-of-enough-length\n' });
  mkdirSync(join(dir, 'directory'));
  symlinkSync('/proc/sys/kernel/random/boot_id', join(dir, 'proc-file'));
  const missing = join(dir, 'missing');
  await t.rejects(startTokens(missing), {
    code: 'NODECOMPUTE_CONFIG_INVALID',
    message: `Invalid setting NODECOMPUTE_TOKEN_FILE (--token-file): got ${JSON.stringify(missing)} (cannot read it: ENOENT: no such file or directory, stat '${missing}'); it accepts a path to a file holding one or more tokens`,
  });
  await t.rejects(startTokens(join(dir, 'directory')), { code: 'NODECOMPUTE_CONFIG_INVALID', message: /\(cannot read it: EISDIR: illegal operation on a directory/ });
  // boot_id holds a token-like text, but says size 0: what a pipe or a /proc file looks like.
  await t.rejects(startTokens(join(dir, 'proc-file')), {
    code: 'NODECOMPUTE_CONFIG_INVALID',
    message:
      /\(it was not stable while it was read, 3 times in a row \(37 bytes were read from it, but its size says 0\): not a regular file, or rewritten in place.*rename/,
  });
});

t.test('a token file this user may not read (EACCES) stops the start saying whose it is and who runs, not "invalid setting"', async (t) => {
  const dir = t.testdir({ token: 'a-token-of-enough-length\n' });
  const path = join(dir, 'token');
  chmodSync(path, 0o640);
  const { uid, gid } = statSync(path);
  // The test may run as root, whom no mode stops: the open fails as it would for another user (the
  // stat before it is real). test/e2e/main-token-file.test.ts has a real one, as another uid.
  const denied = () => {
    throw Object.assign(new Error(`EACCES: permission denied, open '${path}'`), { code: 'EACCES' });
  };
  const err = (await startTokens(path, { beforeRead: denied }).catch((e: unknown) => e)) as Error;
  t.match(err, { code: 'NODECOMPUTE_CONFIG_INVALID' });
  t.match(err.message, `The token file ${path} is unreadable (EACCES)`);
  t.match(err.message, `runs as uid ${process.getuid!()}, gid ${process.getgid!()}, groups ${process.getgroups!().join(',')}; it is owned by uid ${uid}, gid ${gid}, mode 0640`);
  t.match(err.message, /defaultMode \(0440\).*fsGroup.*chown or chmod.*then start again\.$/);
  const eperm = Object.assign(new Error('EPERM: operation not permitted'), { code: 'EPERM' });
  t.match(unreadableTokenFile(path, eperm, null), /\(EPERM\).*runs as uid \d+.*; a directory on the way to it is closed\./, 'a closed directory, where the file cannot even be stat\'d');
  t.equal(unreadableTokenFile(path, Object.assign(new Error('ENOENT'), { code: 'ENOENT' }), null), null, 'another failure is said as before');
});

t.test('a token file caught half-rewritten at start is read again, and its finished content is taken', async (t) => {
  const dir = t.testdir({ token: 'old-token-0123456789\n' });
  const path = join(dir, 'token');
  // An mtime of long ago: the rewrite (of the same length) changes it even within one tick of the filesystem's clock.
  utimesSync(path, 1_700_000_000, 1_700_000_000);
  let reads = 0;
  const config = await startTokens(path, {
    // Between the stat and the first read, a rewrite in place has written its first line only.
    beforeRead: () => {
      if (reads++ === 0) writeFileSync(path, 'new-token-0123456789\n');
      else if (reads === 2) writeFileSync(path, 'new-token-0123456789\nold-token-0123456789\n');
    },
  });
  t.same(config.fileTokens, ['new-token-0123456789', 'old-token-0123456789'], 'the finished file, not its first line');
  t.equal(reads, 3, 'the third look found it stable');
});

t.test('a token file that does not answer at start (a hung mount) stops the start within the bound, and its read stays pending', async (t) => {
  t.ok(TOKEN_FILE_START_TIMEOUT_MS > TOKEN_FILE_READ_TIMEOUT_MS, 'a start waits longer than a write: it has no tokens to fall back on');
  const fifo = fifoTestdir(t).fifo('token');
  const err = (await startTokens(fifo, { timeoutMs: 300 }).catch((e: unknown) => e)) as Error;
  t.match(err, { code: 'NODECOMPUTE_CONFIG_INVALID' });
  t.match(err.message, `The token file ${fifo} (NODECOMPUTE_TOKEN_FILE) did not answer within 300 ms`);
  t.match(err.message, /network or FUSE mount.*a pipe/);
  t.match(err.message, `\`cat ${fifo}\``);
  t.match(err.message, /Kubernetes Secret.*then start again\.$/);
  await waitUntil(() => releaseFifo(fifo), { what: 'the read to wait in open() on the FIFO' });
  await waitUntil(() => !blockedOpeningFifo(process.pid), { what: 'the read to return once the FIFO has a writer' });
});

t.test('the help lists every setting with its variable, flag and default', async (t) => {
  const help = settingsHelp();
  for (const setting of Object.values(SETTINGS)) {
    t.match(help, `--${setting.flag} <value>`);
    t.match(help, setting.env);
  }
  t.match(help, 'NODECOMPUTE_PORT (default: 9470)');
  t.match(help, 'NODECOMPUTE_TOKEN (default: (unset))');
});

t.test('allowed hosts: a list of names, lower-case and without ports; anything else is refused', async (t) => {
  t.same(resolveConfig({}, []).config.allowedHosts, [], 'none by default');
  t.same(resolveConfig({ NODECOMPUTE_ALLOWED_HOSTS: 'GPU-Node-7, gpu-node-7.example.com:9470,[fd00::7]' }, []).config.allowedHosts, ['gpu-node-7', 'gpu-node-7.example.com', 'fd00::7']);
  t.throws(() => resolveConfig({}, ['--allowed-hosts', 'http://evil.example/']), { code: 'NODECOMPUTE_CONFIG_INVALID', message: /NODECOMPUTE_ALLOWED_HOSTS \(--allowed-hosts\)/ });
});
