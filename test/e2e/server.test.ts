// The real server process: start-up without nvidia-smi, bad settings, restarts that keep shards, a
// SIGKILL in the middle of a registration storm, graceful shutdown with requests in flight, and the
// exit code an uncaught error leaves.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t, { type Test } from 'tap';
import { createFakeNvidiaSmi, eightGpuNode, livePidsInGroup, waitUntil } from '../helpers/fake-nvidia-smi.js';
import { MAIN, startServer, within } from '../helpers/server.js';
import { spawnShardProcess } from '../helpers/app.js';
import { livePidsWithEnv } from '../helpers/process-scan.js';

function tempDir(t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'nodecompute-e2e-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

t.test('without nvidia-smi the service starts, says so once and plainly, and answers 503 naming the path', async (t) => {
  const dir = tempDir(t);
  const server = await startServer(t, { NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi', NODECOMPUTE_STATE_FILE: join(dir, 's.json') });
  await waitUntil(() => server.logs().some((entry) => entry.code === 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND'), { what: 'the start-up line about nvidia-smi' });
  t.equal((await server.fetch('/livez')).status, 200);
  for (const path of ['/readyz', '/gpus']) {
    const res = await server.fetch(path);
    t.equal(res.status, 503, path);
    const body = (await res.json()) as { code: string; message: string };
    t.equal(body.code, 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND');
    t.match(body.message, '/opt/missing/nvidia-smi');
  }
  server.child.kill('SIGTERM');
  t.equal(await server.exited, 0);

  // Every line is in by now: the start-up's, then the one of the /gpus request that failed.
  const startUp = server.logs().filter((entry) => entry.msg !== 'Request failed' && /nvidia-smi could not be run/.test(String(entry.msg)));
  t.equal(startUp.length, 1, `one start-up line about it, not two: ${startUp.map((entry) => entry.msg).join(' | ')}`);
  t.match(startUp[0], { level: 40, code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND', msg: /nvidia-smi could not be run from "\/opt\/missing\/nvidia-smi"/ });
  t.notMatch(startUp[0]!.msg, /shard probes answer 503/, 'the shard probes answer 200 unverified, and it says nothing else');
  const failed = server.lines().filter((line) => line.includes('"msg":"Request failed"'));
  t.equal(failed.length, 1, '/gpus failed once; /readyz answers its 503 itself');
  const entry = JSON.parse(failed[0]!) as { level: number; url: string; err: Record<string, unknown> };
  t.match(entry, { level: 40, url: '/gpus' });
  t.same(Object.keys(entry.err), ['code', 'message'], 'the coded error as its code and message: no "type":"Object", no empty stack');
  t.match(entry.err, { code: 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND', message: /could not be run from "\/opt\/missing\/nvidia-smi"/ });
});

t.test('a mistyped variable is warned about at start, and GET /doctor says it again, far from the start-up log', async (t) => {
  const dir = tempDir(t);
  const server = await startServer(t, { NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi', NODECOMPUTE_STATE_FILE: join(dir, 's.json'), NODECOMPUTE_TOKEN_FIEL: '/x' });
  const warning = server.logs().find((entry) => /NODECOMPUTE_TOKEN_FIEL/.test(String(entry.msg)));
  t.match(warning, { level: 40, msg: /did you mean NODECOMPUTE_TOKEN_FILE\?/ });
  const report = (await (await server.fetch('/doctor')).json()) as { checks: Array<{ name: string; status: string; detail: string }> };
  t.same(report.checks[0], { name: 'settings', status: 'warn', detail: warning!.msg, fix: null }, 'the same words, as the first row');
});

t.test('a state directory that cannot be made is an error in the start-up log and fails /readyz; the service still answers', async (t) => {
  // Under /proc, mkdir answers ENOENT: the service must say so, not spin (Node's recursive mkdir does).
  const stateFile = '/proc/nodecompute-no-such-dir/state/s.json';
  const server = await startServer(t, { NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi', NODECOMPUTE_STATE_FILE: stateFile });
  await waitUntil(() => server.logs().some((entry) => entry.level === 50), { what: 'the start-up line about the state directory' });
  t.match(server.logs().find((entry) => entry.level === 50), {
    stateFile,
    msg: `Registrations cannot be stored in ${stateFile}: cannot write in /proc/nodecompute-no-such-dir/state: ENOENT: no such file or directory, mkdir '/proc/nodecompute-no-such-dir'`,
  });
  const verbose = await (await server.fetch('/readyz?verbose')).text();
  t.match(verbose, /\n\[-\]state-file failed: Registrations cannot be stored in .*\nreadyz check failed\n$/);
  t.equal((await server.fetch('/livez')).status, 200);
  t.equal(server.logs().filter((entry) => entry.level === 50).length, 1, 'said once, not at every look');
  server.child.kill('SIGTERM');
  t.equal(await server.exited, 0, 'and it stops promptly');
});

t.test('a bad setting stops the start with a message naming it', async (t) => {
  const result = spawnSync(process.execPath, [MAIN], { env: { ...process.env, NODECOMPUTE_PORT: 'eighty' }, encoding: 'utf8' });
  t.equal(result.status, 2);
  t.match(result.stderr, /Invalid setting NODECOMPUTE_PORT \(--port\): got "eighty"/);
  const help = spawnSync(process.execPath, [MAIN, '--help'], { encoding: 'utf8' });
  t.equal(help.status, 0);
  t.match(help.stdout, /nodecompute doctor/);
  t.match(help.stdout, /NODECOMPUTE_SMI_TIMEOUT_MS/);
  const version = spawnSync(process.execPath, [MAIN, '--version'], { encoding: 'utf8' });
  t.match(version.stdout, /^\d+\.\d+\.\d+\n$/);
  const unknown = spawnSync(process.execPath, [MAIN, 'fly'], { encoding: 'utf8' });
  t.equal(unknown.status, 2);
  t.equal(unknown.stderr, 'nodecompute: unknown command "fly". The commands are serve (the default) and doctor; run `nodecompute --help`.\n');
  const typo = spawnSync(process.execPath, [MAIN, 'docter'], { encoding: 'utf8' });
  t.equal(typo.status, 2);
  t.match(typo.stderr, /^nodecompute: unknown command "docter" \(did you mean doctor\?\)\./);
  const two = spawnSync(process.execPath, [MAIN, 'serve', 'doctor'], { encoding: 'utf8' });
  t.equal(two.status, 2);
  t.match(two.stderr, /^nodecompute: unknown command "serve doctor"\. The commands are/, 'one command at a time');
  const flag = spawnSync(process.execPath, [MAIN, '--bogus', '1'], { encoding: 'utf8' });
  t.equal(flag.status, 2);
  t.equal(flag.stderr, 'nodecompute: unknown flag --bogus. Run `nodecompute --help` for the flags and the environment variable of each.\n', 'nothing about positionals and --');
  const near = spawnSync(process.execPath, [MAIN, 'doctor', '--nvidia_smi', '/usr/bin/nvidia-smi'], { encoding: 'utf8' });
  t.equal(near.status, 2);
  t.match(near.stderr, /^nodecompute: unknown flag --nvidia_smi \(did you mean --nvidia-smi\?\)\. Run `nodecompute --help`/);
});

t.test('a port already in use stops the start with exit code 1, so restart policies see the failure', async (t) => {
  const dir = tempDir(t);
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => holder.close(() => resolve())));
  const { port } = holder.address() as AddressInfo;
  const result = spawnSync(process.execPath, [MAIN], {
    env: { ...process.env, NODECOMPUTE_STATE_FILE: join(dir, 's.json'), NODECOMPUTE_PORT: String(port), NODECOMPUTE_HOST: '127.0.0.1' },
    encoding: 'utf8',
    timeout: 30_000,
  });
  t.equal(result.status, 1);
  t.ok(result.stderr.startsWith(`nodecompute: cannot start: port ${port} is already taken (listen EADDRINUSE: address already in use 127.0.0.1:${port})`), result.stderr);
  t.match(result.stderr, new RegExp(`ss -ltnp 'sport = :${port}'.*NODECOMPUTE_PORT \\(--port\\)\\.\n$`));
});

t.test('by default it listens on :: (IPv6 and IPv4) and says so; a host this machine cannot have stops the start saying why', async (t) => {
  const dir = tempDir(t);
  // NODECOMPUTE_HOST empty counts as unset: the default.
  const server = await startServer(t, { NODECOMPUTE_HOST: '', NODECOMPUTE_NVIDIA_SMI: '/opt/missing/nvidia-smi', NODECOMPUTE_STATE_FILE: join(dir, 's.json') });
  const line = server.logs().find((entry) => typeof entry.url === 'string');
  t.match(line, { level: 30, msg: 'nodecompute is listening on :: (IPv6 and IPv4)', host: '::', url: /^http:\/\/\[::\]:\d+$/ });
  const { port } = new URL(server.url);
  for (const host of ['127.0.0.1', '[::1]']) t.equal((await fetch(`http://${host}:${port}/livez`)).status, 200, `reachable over ${host}`);
  server.child.kill('SIGTERM');
  t.equal(await server.exited, 0);

  const refused = spawnSync(process.execPath, [MAIN], {
    env: { ...process.env, NODECOMPUTE_STATE_FILE: join(dir, 's.json'), NODECOMPUTE_PORT: '0', NODECOMPUTE_HOST: '2001:db8::1' },
    encoding: 'utf8',
    timeout: 30_000,
  });
  t.equal(refused.status, 1);
  t.match(refused.stderr, /^nodecompute: cannot start: NODECOMPUTE_HOST \(--host\) is "2001:db8::1", which this machine cannot listen on \(EADDRNOTAVAIL: .*\)\. Set it to an address of this machine, or unset it/);
});

t.test('a corrupt state file stops the start naming the file, and is never overwritten', async (t) => {
  const dir = t.testdir({ 'shards.json': '{"format": "nodecompute-shards/v1", "shards": [' });
  const result = spawnSync(process.execPath, [MAIN], {
    env: { ...process.env, NODECOMPUTE_STATE_FILE: join(dir, 'shards.json'), NODECOMPUTE_PORT: '0', NODECOMPUTE_HOST: '127.0.0.1' },
    encoding: 'utf8',
    timeout: 30_000,
  });
  t.equal(result.status, 1);
  t.match(result.stderr, /cannot start: The state file .*shards\.json is not valid JSON/);
  t.equal(readFileSync(join(dir, 'shards.json'), 'utf8'), '{"format": "nodecompute-shards/v1", "shards": [');
});

t.test('a restarted server keeps its shards; a SIGKILL mid-storm loses no acknowledged registration', async (t) => {
  const dir = tempDir(t);
  const fake = createFakeNvidiaSmi(dir, eightGpuNode());
  const shard = await spawnShardProcess(t, 1);
  const env = { NODECOMPUTE_NVIDIA_SMI: fake.path, NODECOMPUTE_STATE_FILE: join(dir, 'state', 'shards.json') };
  const first = await startServer(t, env);
  const put = (url: string, id: string, gpus: number[]) =>
    fetch(`${url}/shards/${id}`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pid: shard.pid, gpus }) });
  t.equal((await put(first.url, 'keep-me', [3])).status, 201);
  first.child.kill('SIGTERM');
  t.equal(await first.exited, 0);
  const registered = first.lines().find((line) => line.includes('"Shard registered"'));
  t.match(registered, `"shardPid":${shard.pid}`);
  t.same(
    first.lines().filter((line) => line.split('"pid":').length > 2),
    [],
    "no log line writes pino's own pid key twice (log tools would keep either value)",
  );

  const second = await startServer(t, env);
  const kept = (await (await second.fetch('/shards/keep-me')).json()) as { gpus: number[]; identity: { pid: number } };
  t.same(kept.gpus, [3]);
  t.equal(kept.identity.pid, shard.pid);

  // One process a shard (a process is one shard's only): 8 workers, each registering its 8 shards
  // and re-registering them on other GPUs until the server is killed.
  const stormProcesses = await Promise.all(Array.from({ length: 64 }, () => spawnShardProcess(t, 0)));
  const acknowledged = new Set<string>();
  let stop = false;
  const storm = Array.from({ length: 8 }, async (_, worker) => {
    for (let i = 0; !stop && i < 400; i += 1) {
      const id = `storm-${worker}-${i % 8}`;
      try {
        const res = await second.fetch(`/shards/${id}`, {
          method: 'PUT',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ pid: stormProcesses[worker * 8 + (i % 8)]!.pid, gpus: [i % 8] }),
        });
        if (res.status === 201 || res.status === 200) acknowledged.add(id);
      } catch {
        return; // the server died under us: this request was never acknowledged
      }
    }
  });
  await waitUntil(() => acknowledged.size >= 40, { timeoutMs: 60_000, what: '40 acknowledged registrations' });
  second.child.kill('SIGKILL');
  await second.exited;
  await t.rejects(
    second.fetch('/livez'),
    { message: /^GET \/livez got no answer \(ECONNREFUSED\); the server \(pid \d+\) had exited \(SIGKILL\)\. Its stderr: .*Its last log lines:\n\{/s },
    'a request that gets no answer says what became of the server',
  );
  stop = true;
  await Promise.all(storm);

  const state = JSON.parse(readFileSync(join(dir, 'state', 'shards.json'), 'utf8')) as { shards: Array<{ id: string }> };
  const stored = new Set(state.shards.map((s) => s.id));
  t.same([...acknowledged.keys()].filter((id) => !stored.has(id)), [], 'every acknowledged registration is in the state file');
  t.ok(stored.has('keep-me'));

  const third = await startServer(t, env);
  const listed = (await (await third.fetch('/shards')).json()) as { shards: Array<{ id: string }> };
  const ids = new Set(listed.shards.map((s) => s.id));
  t.same([...acknowledged.keys()].filter((id) => !ids.has(id)), [], 'and the restarted server serves them all');
  third.child.kill('SIGTERM');
  t.equal(await third.exited, 0);
});

t.test('SIGTERM finishes in-flight requests, kills nvidia-smi children and exits 0', async (t) => {
  const dir = tempDir(t);
  const fake = createFakeNvidiaSmi(dir, { ...eightGpuNode(), delayMs: 1500 });
  const server = await startServer(t, { NODECOMPUTE_NVIDIA_SMI: fake.path, NODECOMPUTE_STATE_FILE: join(dir, 's.json'), NODECOMPUTE_SMI_TIMEOUT_MS: '20000' });
  // The start-up warm-up run may still be going; wait for it so the next request starts its own.
  await waitUntil(() => server.logs().some((entry) => /nvidia-smi answers/.test(String(entry.msg))), { timeoutMs: 30_000, what: 'warm-up' });
  fake.update((s) => ({ ...s, delayMs: 60_000 }));
  const before = fake.invocations().length;
  const inFlight = server.fetch('/doctor').then(async (res) => ({ status: res.status, body: (await res.json()) as Record<string, unknown> }));
  await waitUntil(() => fake.invocations().length > before, { what: 'the doctor to start nvidia-smi' });
  server.child.kill('SIGTERM');
  const answer = await inFlight;
  t.equal(answer.status, 503, 'the in-flight request got its answer');
  // Not a report blaming nvidia-smi (a monitor would count a sick node at every rolling restart):
  // the coded error every request whose nvidia-smi the shutdown killed gets.
  t.same(Object.keys(answer.body).sort(), ['code', 'error', 'message', 'statusCode'], 'the one error shape');
  t.equal(answer.body.code, 'NODECOMPUTE_NVIDIA_SMI_FAILED');
  t.match(answer.body.message, /nodecompute stopped it because nodecompute is shutting down\.$/, 'says the shutdown stopped it');
  t.equal(await server.exited, 0);
  const smiPids = fake.invocations().map((invocation) => invocation.pid);
  await waitUntil(() => smiPids.every((pid) => livePidsInGroup(pid).length === 0), { what: 'every nvidia-smi group to be gone' });
  t.pass('no nvidia-smi process is left');
});

t.test('an uncaught error closes the service and exits 1, whatever was thrown, a promise rejected with no reason included', async (t) => {
  const dir = tempDir(t);
  // Preloaded into the server: on SIGWINCH (a signal the service leaves alone), throws what the test asks for.
  const preload = join(dir, 'throw-on-sigwinch.mjs');
  writeFileSync(
    preload,
    "process.on('SIGWINCH', () => setImmediate(() => {\n" +
      "  if (process.env.THROWN === 'error') throw new Error('injected by the test');\n" +
      "  if (process.env.THROWN === 'an empty string') throw '';\n" +
      '  void Promise.reject();\n' +
      '}));\n',
  );
  const cases = [
    { thrown: 'error', fields: { err: { message: 'injected by the test' } } },
    { thrown: 'nothing', fields: { thrown: 'undefined' } },
    { thrown: 'an empty string', fields: { thrown: "''" } },
  ];
  for (const { thrown, fields } of cases) {
    const server = await startServer(t, {
      NODECOMPUTE_NVIDIA_SMI: join(dir, 'missing-nvidia-smi'),
      NODECOMPUTE_STATE_FILE: join(dir, `${thrown.replaceAll(' ', '-')}.json`),
      NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import=${pathToFileURL(preload).href}`,
      THROWN: thrown,
    });
    server.child.kill('SIGWINCH');
    t.equal(await within(server.exited, 30_000), 1, `${thrown}: exit code 1, so the restart policy sees a failure`);
    const shuttingDown = server.logs().filter((entry) => String(entry.msg).startsWith('Shutting down'));
    t.equal(shuttingDown.length, 1, `${thrown}: one line says the shutdown begins`);
    t.match(
      shuttingDown[0],
      { level: 50, msg: /^Shutting down after an uncaught error \(a bug in nodecompute: .*then exiting 1 for the restart policy/, ...fields },
      `${thrown}: at error level, saying what was thrown`,
    );
  }
});

t.test('on a terminal the log is pretty; elsewhere it is JSON', async (t) => {
  const dir = tempDir(t);
  const command = `${process.execPath} ${MAIN} --host 127.0.0.1 --port 0 --nvidia-smi /nonexistent/nvidia-smi --state-file ${join(dir, 's.json')}`;
  // `script` runs the service in a session of its own on a new terminal, outside the process group
  // killed below; a marker in its environment finds it. Left behind, it spins on its closed terminal.
  const marker = `E2E_TERMINAL_RUN=${dir}`;
  const child = spawn('script', ['-qfec', command, '/dev/null'], {
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, NO_COLOR: '1', E2E_TERMINAL_RUN: dir },
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise((resolve) => child.on('exit', resolve));
  // Everything started under `script` (the service, and a shell if one stays), not `script` itself.
  const service = () => livePidsWithEnv(marker).filter((pid) => pid !== child.pid);
  t.teardown(async () => {
    const signal = (pids: number[], name: NodeJS.Signals) => {
      for (const pid of pids) {
        try {
          process.kill(pid, name);
        } catch {
          // already gone
        }
      }
    };
    // The service first, while its terminal is still there: it exits 0 and writes its coverage.
    signal(service(), 'SIGTERM');
    for (let waited = 0; service().length > 0 && waited < 10_000; waited += 50) await new Promise((resolve) => setTimeout(resolve, 50));
    signal([-child.pid!, ...livePidsWithEnv(marker)], 'SIGKILL');
    await exited;
  });
  await waitUntil(() => output.includes('nodecompute is listening'), { timeoutMs: 30_000, what: 'the pretty start-up line' });
  const running = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(MAIN);
  t.ok(service().some(running), 'the service on the terminal is found by its marker');
  t.match(output, /INFO.*nodecompute is listening/);
  t.notMatch(output, /^\{"level"/m, 'not JSON lines');
});
