// The real server process and its settings: a start-up warning for a probe wait Kubernetes would
// cut short, refusals (exit 2) for tokens no header can carry and a max-stale below the TTL, and a
// write token rotated in a mounted Secret without a restart.
import { spawnSync } from 'node:child_process';
import { mkdirSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { MAIN, startServer } from '../helpers/server.js';

const OLD = 'old-token-0123456789abcdef';
const NEW = 'new-token-0123456789abcdef';

t.test('bad token and staleness settings stop the start with exit code 2, naming the setting', async (t) => {
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ NODECOMPUTE_TOKEN: ' '.repeat(20) }, /Invalid setting NODECOMPUTE_TOKEN \(--token\): got a secret of 20 characters \(not shown\) \(it is blank\)/],
    [{ NODECOMPUTE_CACHE_TTL_MS: '60000' }, /Invalid setting NODECOMPUTE_MAX_STALE_MS \(--max-stale-ms\).*stale answers could never be served/],
  ];
  for (const [env, message] of cases) {
    const result = spawnSync(process.execPath, [MAIN], { env: { ...process.env, ...env }, encoding: 'utf8' });
    t.equal(result.status, 2, JSON.stringify(env));
    t.match(result.stderr, message);
  }
});

t.test('a Secret rotated in place reaches the running server; a long probe wait is warned about once', async (t) => {
  const dir = t.testdir({ '..v1': { token: `${OLD}\n` } });
  symlinkSync('..v1', join(dir, '..data'));
  symlinkSync('..data/token', join(dir, 'token'));
  const server = await startServer(t, {
    NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi',
    NODECOMPUTE_STATE_FILE: join(dir, 'shards.json'),
    NODECOMPUTE_TOKEN_FILE: join(dir, 'token'),
    NODECOMPUTE_PROBE_WAIT_MS: '1500',
  });
  const warnings = server.logs().filter((entry) => entry.level === 40);
  t.equal(warnings.length, 1, 'one warning at start');
  t.match(warnings[0]!.msg, /NODECOMPUTE_PROBE_WAIT_MS is 1500 ms.*Raise the probes' timeoutSeconds/);

  const write = async (token: string) =>
    (await fetch(`${server.url}/shards/none`, { method: 'DELETE', headers: { authorization: `Bearer ${token}` } })).status;
  t.equal(await write(OLD), 404, 'authorised, then no such shard');
  t.equal(await write(NEW), 401);

  // What the kubelet does: a new version directory, then `..data` swapped with one rename.
  mkdirSync(join(dir, '..v2'));
  writeFileSync(join(dir, '..v2', 'token'), `${NEW}\n`);
  symlinkSync('..v2', join(dir, '..data_tmp'));
  renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
  // The server looks at the file at most once a second, on its own clock.
  const giveUpAt = Date.now() + 10_000;
  let status = await write(NEW);
  while (status !== 404 && Date.now() < giveUpAt) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    status = await write(NEW);
  }
  t.equal(status, 404, 'the new token is accepted without a restart');
  t.equal(await write(OLD), 401, 'and the old one is not');
  t.ok(server.logs().some((entry) => entry.msg === `Write tokens changed: 1 token(s) from ${join(dir, 'token')} are in force now.`));
  server.child.kill('SIGTERM');
  t.equal(await server.exited, 0);
});
