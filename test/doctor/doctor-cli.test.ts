// `nodecompute doctor`, the real process (dist/src/main.js): the table, the exit code, and what a
// start would say of the settings (its warnings, a token file it refuses) among the checks.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import t from 'tap';
import { createFakeNvidiaSmi, idleEightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { MAIN } from '../helpers/server.js';

t.test('`nodecompute doctor` prints the table and exits non-zero when something is wrong', async (t) => {
  const dir = t.testdir({ smi: {} });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), idleEightGpuNode());
  const env = { ...process.env, NODECOMPUTE_STATE_FILE: join(dir, 'state', 's.json'), NODECOMPUTE_TOKEN: 'a-token-of-enough-length' };
  const good = spawnSync(process.execPath, [MAIN, 'doctor', '--nvidia-smi', fake.path], { env, encoding: 'utf8', timeout: 60_000 });
  t.equal(good.status, 0, good.stdout + good.stderr);
  t.match(good.stdout, 'this node is fine');
  const bad = spawnSync(process.execPath, [MAIN, 'doctor', '--nvidia-smi', join(dir, 'nope')], { env, encoding: 'utf8', timeout: 60_000 });
  t.equal(bad.status, 1);
  t.match(bad.stdout, /FAIL  nvidia-smi/);
});

t.test('`nodecompute doctor` says what a start would of the settings: its warnings as a row, a token file it refuses as a failed check among the others', async (t) => {
  const dir = t.testdir({ smi: {}, short: 'short\n' });
  const fake = createFakeNvidiaSmi(join(dir, 'smi'), idleEightGpuNode());
  const env = { ...process.env, NODECOMPUTE_STATE_FILE: join(dir, 'state', 's.json'), NODECOMPUTE_NVIDIA_SMI: fake.path };
  const doctor = (extra: Record<string, string>, args: string[] = []) =>
    spawnSync(process.execPath, [MAIN, 'doctor', ...args], { env: { ...env, ...extra }, encoding: 'utf8', timeout: 60_000 });

  const typo = doctor({ NODECOMPUTE_TOKEN: 'a-token-of-enough-length', NODECOMPUTE_TOKEN_FIEL: '/run/secrets/token' });
  t.equal(typo.status, 0, 'a warning alone');
  t.match(
    typo.stdout,
    /^WARN  settings {12}NODECOMPUTE_TOKEN_FIEL is not a setting .*\(did you mean NODECOMPUTE_TOKEN_FILE\?\)\. Run `nodecompute --help`/m,
  );

  const refused = doctor({ NODECOMPUTE_TOKEN_FILE: join(dir, 'short') });
  t.equal(refused.status, 1, refused.stdout + refused.stderr);
  t.equal(refused.stderr, '');
  t.match(
    refused.stdout,
    /^FAIL  token {15}Invalid setting NODECOMPUTE_TOKEN_FILE \(--token-file\): got ".*short" \(the token on line 1 cannot work: it is 5 characters long, and a token needs at least 16\)/m,
  );
  t.match(refused.stdout, /fix: Fix the token file \(or NODECOMPUTE_TOKEN_FILE\).*`nodecompute serve` stops at start \(exit 2\)/);
  t.match(refused.stdout, /^OK    settings +no setting looks mistyped or at odds with another$/m);
  t.match(refused.stdout, /^OK    nvidia-smi /m, 'the other checks ran');
  t.match(refused.stdout, /^OK    state-file /m);

  const usage = doctor({}, ['--port', 'nope']);
  t.equal(usage.status, 2, 'a usage error is still one');
  t.match(usage.stderr, 'Invalid setting NODECOMPUTE_PORT');
  t.equal(usage.stdout, '');
});
