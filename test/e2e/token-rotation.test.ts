// The real server process and its settings: a start-up warning for a probe wait Kubernetes would
// cut short, refusals (exit 2) for tokens no header can carry and a max-stale below the TTL, and a
// write token rotated in a mounted Secret without a restart, and a token file that stops answering
// (a hung mount; a FIFO without a writer stands in for it) while the server keeps serving.
import { spawnSync } from 'node:child_process';
import { mkdirSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { isStuckReadWarning, releaseFifo } from '../helpers/fifo.js';
import { MAIN, startServer } from '../helpers/server.js';

const OLD = 'old-token-0123456789abcdef';
// Punctuation beyond RFC 6750's b64token, as a password manager makes: sent as it is, it matches.
const NEW = `new!token$0123"'#,;:?@[]^{|}~\\`;

/** Calls `attempt` every 100 ms until `done` says its answer will do; gives up after 10 s. */
async function retry<T>(attempt: () => Promise<T>, done: (answer: T) => boolean): Promise<T> {
  const giveUpAt = Date.now() + 10_000;
  let answer = await attempt();
  while (!done(answer) && Date.now() < giveUpAt) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    answer = await attempt();
  }
  return answer;
}

t.test('bad token and staleness settings stop the start with exit code 2, naming the setting', async (t) => {
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ NODECOMPUTE_TOKEN: ' '.repeat(20) }, /Invalid setting NODECOMPUTE_TOKEN \(--token\): got only whitespace \(it is blank\); it accepts a secret/],
    [{ NODECOMPUTE_CACHE_TTL_MS: '60000' }, /Invalid setting NODECOMPUTE_MAX_STALE_MS \(--max-stale-ms\).*below NODECOMPUTE_CACHE_TTL_MS \(60000\)/],
  ];
  for (const [env, message] of cases) {
    const result = spawnSync(process.execPath, [MAIN], { env: { ...process.env, ...env }, encoding: 'utf8' });
    t.equal(result.status, 2, JSON.stringify(env));
    t.match(result.stderr, message);
  }
});

t.test('a Secret rotated in place reaches the running server, which keeps serving when the file hangs; a long probe wait is warned about once', async (t) => {
  const dir = t.testdir({ '..v1': { token: `${OLD}\n` } });
  symlinkSync('..v1', join(dir, '..data'));
  symlinkSync('..data/token', join(dir, 'token'));
  const server = await startServer(t, {
    NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi',
    NODECOMPUTE_STATE_FILE: join(dir, 'shards.json'),
    NODECOMPUTE_TOKEN_FILE: join(dir, 'token'),
    NODECOMPUTE_PROBE_WAIT_MS: '1500',
  });
  const access = `Writes need a bearer token: 1 token(s) from ${join(dir, 'token')} (re-read when it changes).`;
  await waitUntil(() => server.logs().some((entry) => entry.msg === access), { what: 'the start-up line saying how writes are authorised' });
  t.match(server.logs().find((entry) => entry.msg === access), { level: 30, tokenFile: join(dir, 'token') }, 'the start says how writes are authorised');
  const warnings = server.logs().filter((entry) => entry.level === 40);
  t.equal(warnings.length, 1, 'one warning at start');
  t.match(warnings[0]!.msg, /NODECOMPUTE_PROBE_WAIT_MS is 1500 ms.*timeoutSeconds/);

  const write = async (token: string) =>
    (await server.fetch('/shards/none', { method: 'DELETE', headers: { authorization: `Bearer ${token}` } })).status;
  t.equal(await write(OLD), 404, 'authorised, then no such shard');
  t.equal(await write(NEW), 401);

  // What the kubelet does: a new version directory, then `..data` swapped with one rename.
  mkdirSync(join(dir, '..v2'));
  writeFileSync(join(dir, '..v2', 'token'), `${NEW}\n`);
  symlinkSync('..v2', join(dir, '..data_tmp'));
  renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
  // The server looks at the file at most once a second, on its own clock.
  t.equal(await retry(() => write(NEW), (status) => status === 404), 404, 'the new token is accepted without a restart');
  t.equal(await write(OLD), 401, 'and the old one is not');
  t.ok(server.logs().some((entry) => entry.msg === `Write tokens changed: 1 token(s) from ${join(dir, 'token')} are in force now.`));

  // The mount hangs: the kubelet's file is swapped for one whose open() never returns.
  const fifo = join(dir, '..v3', 'token');
  mkdirSync(join(dir, '..v3'));
  t.equal(spawnSync('mkfifo', [fifo]).status, 0, 'mkfifo');
  t.teardown(() => void releaseFifo(fifo));
  symlinkSync('..v3', join(dir, '..data_tmp'));
  renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
  t.equal(await retry(() => write(NEW), () => server.logs().some(isStuckReadWarning)), 404, 'writes are judged by the tokens last read');
  t.equal((await server.fetch('/livez')).status, 200, 'probes answer while the read is stuck');
  t.equal(await write(NEW), 404);

  // The mount comes back.
  symlinkSync('..v2', join(dir, '..data_tmp'));
  renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
  await waitUntil(() => releaseFifo(fifo), { what: 'the server to wait in open() on the FIFO' });
  const again = (entry: Record<string, unknown>) => entry.msg === `The token file ${join(dir, 'token')} can be used again (what was wrong with it is fixed); tokens are read from it again from now on.`;
  await retry(() => write(NEW), () => server.logs().some(again));
  t.ok(server.logs().some(again), 'the file is read again once it answers');
  t.equal(server.logs().filter(isStuckReadWarning).length, 1, 'one warning for the whole hang');
  server.child.kill('SIGTERM');
  t.equal(await server.exited, 0);
});
