// Settings: env and flags over defaults, validated once, with messages naming the setting and what
// it accepts; the help lists every setting.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { defaultConfig, resolveConfig, SETTINGS, settingsHelp } from '../src/config.js';

t.test('defaults', async (t) => {
  const { config, positionals, help, version } = resolveConfig({}, []);
  t.same(config, defaultConfig());
  t.same(
    { host: config.host, port: config.port, nvidiaSmi: config.nvidiaSmi, proc: config.proc, ttl: config.cacheTtlMs, stale: config.maxStaleMs, timeout: config.smiTimeoutMs, log: config.logLevel, grace: config.gpuGraceMs, token: config.token },
    { host: '0.0.0.0', port: 9470, nvidiaSmi: 'nvidia-smi', proc: '/proc', ttl: 1000, stale: 30000, timeout: 5000, log: 'info', grace: 15000, token: null },
  );
  t.same(positionals, []);
  t.equal(help, false);
  t.equal(version, false);
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
  t.equal(config.host, '0.0.0.0', 'an empty variable counts as unset');
  t.same(positionals, ['serve']);
  t.equal(resolveConfig({}, ['--help']).help, true);
  t.equal(resolveConfig({}, ['-v']).version, true);
});

t.test('bad values stop the start with the setting, the value and what it accepts', async (t) => {
  const cases: Array<[Record<string, string>, string[], RegExp]> = [
    [{ NODECOMPUTE_PORT: 'abc' }, [], /NODECOMPUTE_PORT \(--port\): got "abc" \(not an integer\); it accepts an integer from 0 to 65535/],
    [{}, ['--port', '70000'], /NODECOMPUTE_PORT \(--port\): got "70000"; it accepts/],
    [{ NODECOMPUTE_SMI_TIMEOUT_MS: '5' }, [], /NODECOMPUTE_SMI_TIMEOUT_MS.*from 100 to 600000/],
    [{ NODECOMPUTE_LOG_LEVEL: 'loud' }, [], /NODECOMPUTE_LOG_LEVEL.*fatal, error, warn, info, debug, trace, silent/],
    [{ NODECOMPUTE_TOKEN: 'short' }, [], /NODECOMPUTE_TOKEN.*at least 16 characters/],
    [{ NODECOMPUTE_CACHE_TTL_MS: '1.5' }, [], /NODECOMPUTE_CACHE_TTL_MS.*not an integer/],
    [{}, ['--bogus'], /Unknown option '--bogus'.*nodecompute --help/],
    [{ NODECOMPUTE_TOKEN_FILE: '/nonexistent/token' }, [], /NODECOMPUTE_TOKEN_FILE.*cannot read it/],
  ];
  for (const [env, argv, message] of cases) {
    t.throws(() => resolveConfig(env, argv), { code: 'NODECOMPUTE_CONFIG_INVALID', message }, JSON.stringify({ env, argv }));
  }
});

t.test('the token can come from a file (a mounted Secret), not from both places', async (t) => {
  const dir = t.testdir({ token: '  s3cret-token-0123456789\n', short: 'abc\n' });
  t.equal(resolveConfig({ NODECOMPUTE_TOKEN_FILE: join(dir, 'token') }, []).config.token, 's3cret-token-0123456789');
  t.throws(() => resolveConfig({ NODECOMPUTE_TOKEN_FILE: join(dir, 'short') }, []), { message: /fewer than 16 characters/ });
  writeFileSync(join(dir, 'other'), 'another-token-0123456789');
  t.throws(() => resolveConfig({ NODECOMPUTE_TOKEN_FILE: join(dir, 'other'), NODECOMPUTE_TOKEN: 'x'.repeat(20) }, []), { message: /set only one of them/ });
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
