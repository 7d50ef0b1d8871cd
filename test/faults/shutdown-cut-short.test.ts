// A graceful shutdown of the real server (dist/src/main.js) that cannot finish: a client keeps a
// request open (its body stops short), so the close waits for it. The shutdown is cut short when its
// 10 s grace runs out, or at once on a second signal or an uncaught error; either way the process
// says so and exits 1.
// An uncaught error comes from a module preloaded into the server, which throws one on each SIGWINCH
// (a signal the service leaves alone): nothing in the service should ever let one through.
import { once } from 'node:events';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t from 'tap';
import { waitUntil } from '../helpers/fake-nvidia-smi.js';
import { startWithTokenFile } from '../helpers/fifo.js';
import { within, type RunningServer } from '../helpers/server.js';

const TOKEN = 'a-token-of-enough-length';
/** Far beyond the 10 s grace, even on a loaded machine: a process still there then hangs. */
const HANG_MS = 45_000;
const GRACE_MS = 10_000;

/**
 * Starts a PUT whose body never ends. The server answers `Expect: 100-continue` once it has the
 * headers, so the request is known to be in flight (not an idle connection a close would drop)
 * before this resolves; it stays in flight until Node's 30 s request timeout.
 */
async function holdRequestOpen(server: RunningServer): Promise<Socket> {
  const { hostname, port } = new URL(server.url);
  const socket = connect(Number(port), hostname);
  await once(socket, 'connect');
  socket.write(
    `PUT /shards/held HTTP/1.1\r\nHost: ${hostname}\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Type: application/json\r\n` +
      'Content-Length: 64\r\nExpect: 100-continue\r\n\r\n',
  );
  const [first] = (await once(socket, 'data')) as [Buffer];
  if (!first.toString().startsWith('HTTP/1.1 100 Continue')) throw new Error(`expected 100 Continue, got ${first.toString()}`);
  socket.write('{"pid":');
  socket.on('error', () => {}); // reset when the process ends: expected
  return socket;
}

/** What starts the shutdown, or cuts it short: a SIGTERM, or an uncaught error. */
type Blow = 'SIGTERM' | 'error';

interface Case {
  name: string;
  first: Blow;
  /** What cuts the shutdown short; none: its grace runs out. */
  second: Blow | null;
}

const CASES: Case[] = [
  { name: 'a second SIGTERM', first: 'SIGTERM', second: 'SIGTERM' },
  { name: 'the grace runs out', first: 'SIGTERM', second: null },
  { name: 'an uncaught error, then another', first: 'error', second: 'error' },
  { name: 'a SIGTERM, then an uncaught error', first: 'SIGTERM', second: 'error' },
];

const INJECTED = 'injected by the test';
const THROW_ON_SIGWINCH = `process.on('SIGWINCH', () => setImmediate(() => { throw new Error('${INJECTED}'); }));\n`;

const A_BUG = 'a bug in nodecompute: please report it with this line and the ones before it';
const CUT: Record<Blow | 'grace', RegExp> = {
  SIGTERM: /^A second SIGTERM came while shutting down: the requests still in flight are cut off, and the process ends now\.$/,
  error: new RegExp(`^An uncaught error came while shutting down \\(${A_BUG}\\): the requests still in flight are cut off, and the process ends now\\.$`),
  grace: /^Shutting down took longer than its 10 s grace: the requests still in flight are cut off, and the process ends now\. A client holding a request open gets a reset connection and should retry\.$/,
};
const SHUTTING_DOWN_AFTER_ERROR = `Shutting down after an uncaught error (${A_BUG}): finishing in-flight requests, stopping GPU queries, then exiting 1 for the restart policy to start the service again.`;

const isInjected = (entry: Record<string, unknown>): boolean => (entry.err as { message?: string } | undefined)?.message === INJECTED;

t.test('a shutdown held up by a request that never ends is cut short by its grace, a second signal or an uncaught error: exit 1', async (t) => {
  const root = t.testdir({ 'throw-on-sigwinch.mjs': THROW_ON_SIGWINCH, ...Object.fromEntries(CASES.map((_, index) => [String(index), {}])) });
  const preload = { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import=${pathToFileURL(join(root, 'throw-on-sigwinch.mjs')).href}` };
  // They run side by side: two of them wait out the whole grace.
  await Promise.all(
    CASES.map(async ({ name, first, second }, index) => {
      const { server } = await startWithTokenFile(t, join(root, String(index)), TOKEN, preload);
      const strike = (blow: Blow) => server.child.kill(blow === 'SIGTERM' ? 'SIGTERM' : 'SIGWINCH');
      const held = await holdRequestOpen(server);
      t.teardown(() => void held.destroy());

      const signalledAt = Date.now();
      strike(first);
      if (second !== null) {
        const closing = () => server.logs().some((entry) => String(entry.msg).startsWith('Shutting down'));
        await waitUntil(closing, { timeoutMs: HANG_MS, what: `${name}: the shutdown to begin` });
        strike(second);
      }
      const end = await within(server.exited, HANG_MS);
      const tookMs = Date.now() - signalledAt;
      t.equal(end, 1, `${name}: ended (exit code 1), not left hanging`, {
        stderr: server.stderr(),
        lines: server.lines().slice(-4),
      });

      const logs = server.logs();
      const shuttingDown = logs.filter((entry) => String(entry.msg).startsWith('Shutting down') && !String(entry.msg).includes('grace'));
      t.equal(shuttingDown.length, 1, `${name}: one line says the shutdown begins`);
      if (first === 'error') {
        t.match(shuttingDown[0], { level: 50, msg: SHUTTING_DOWN_AFTER_ERROR }, `${name}: the error that began it is a bug, at error level`);
        t.ok(isInjected(shuttingDown[0]!), `${name}: and that line carries it`);
      } else {
        t.match(shuttingDown[0], { level: 30, signal: 'SIGTERM' }, `${name}: the signal that began it`);
      }
      // The shutdown's own lines carry no component; a reader's (the state file's probe, late on a
      // loaded machine) are not about the shutdown.
      const cut = logs.filter((entry) => entry.level === 50 && entry !== shuttingDown[0] && entry.component === undefined);
      t.equal(cut.length, 1, `${name}: one line says the shutdown was cut short: ${JSON.stringify(cut)}`);
      t.match(cut[0]?.msg, CUT[second ?? 'grace'], `${name}: what happened, and what it means`);
      t.equal(isInjected(cut[0]!), second === 'error', `${name}: the line carries the error that cut it short, if one did`);
      if (second === null) t.ok(tookMs >= GRACE_MS, `${name}: after the whole grace (${tookMs} ms)`);
    }),
  );
});
