// Where the service listens, on this machine's real sockets: the default :: takes IPv4 and IPv6 on
// one socket (and the loopback rule for writes holds over both); a kernel without IPv6 makes the
// default, and only the default, fall back to 0.0.0.0; a host that was set is used as given, and a
// failure that is not about IPv6 (a port in use) stops the start as it came.
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { constants, networkInterfaces } from 'node:os';
import t, { type Test } from 'tap';
import type { App } from '../src/app.js';
import { listenOn, type Listen } from '../src/listen.js';
import { buildTestApp } from './helpers/app.js';
import { eightGpuNode } from './helpers/fake-nvidia-smi.js';

/** An address that no interface of any machine has (RFC 3849, documentation only). */
const NOT_HERE = '2001:db8::1';

/**
 * The error Node raises when the kernel refuses a listen (UVExceptionWithHostPort in Node's
 * lib/internal/errors.js): what `listen` on :: gives on a kernel booted with ipv6.disable=1, which
 * this machine is not, so it is built here; EADDRNOTAVAIL below comes from the real kernel.
 */
function refusedByKernel(code: 'EAFNOSUPPORT', host: string, port: number): NodeJS.ErrnoException {
  return Object.assign(new Error(`listen ${code}: address family not supported ${host}:${port}`), {
    code,
    errno: -constants.errno[code],
    syscall: 'listen',
    address: host,
    port,
  });
}

interface Answer {
  status: number;
  code: string | undefined;
}

function request(host: string, port: number, method: string, path: string, localAddress?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host, port, method, path, localAddress, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode!, code: body ? (JSON.parse(body) as { code?: string }).code : undefined }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** Fastify's listen, with every host asked for recorded, and :: refused by `refuse` when given. */
function recordingListen(app: App, refuse?: (options: { host: string; port: number }) => Promise<string>) {
  const hosts: string[] = [];
  const listen: Listen = (options) => {
    hosts.push(options.host);
    return refuse && options.host === '::' ? refuse(options) : app.listen(options);
  };
  return { hosts, listen };
}

async function remoteAddresses(t: Test) {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const seen: string[] = [];
  app.addHook('onRequest', async (request) => {
    seen.push(request.socket.remoteAddress!);
  });
  return { app, seen };
}

t.test('the default :: takes IPv4 and IPv6 on one socket; writes from loopback over either family count as loopback', async (t) => {
  const { app, seen } = await remoteAddresses(t);
  const { hosts, listen } = recordingListen(app);
  const listening = await listenOn(listen, { host: '::', port: 0, defaultHost: true });
  const { address, port } = app.server.address() as AddressInfo;
  t.same(hosts, ['::']);
  t.equal(address, '::', 'one socket on ::');
  t.same(listening, { url: `http://[::]:${port}`, host: '::', message: 'nodecompute is listening on :: (IPv6 and IPv4)' });
  for (const client of ['127.0.0.1', '::1']) {
    t.equal((await request(client, port, 'GET', '/livez')).status, 200, `GET /livez over ${client}`);
    // No token is configured: writes are accepted from loopback only. 404 (no such shard) means the
    // write got past that rule; 403 would mean the loopback client was taken for the network.
    t.same(await request(client, port, 'DELETE', '/shards/nope'), { status: 404, code: 'NODECOMPUTE_SHARD_NOT_FOUND' }, `a write over ${client} is from loopback`);
  }
  t.same([...new Set(seen)], ['::ffff:127.0.0.1', '::1'], 'IPv4 clients arrive as IPv4-mapped addresses');
});

const external = Object.values(networkInterfaces())
  .flat()
  .find((entry) => entry !== undefined && entry.family === 'IPv4' && !entry.internal)?.address;

t.test('on the dual-stack socket a client from another IPv4 address of this machine is not loopback', { skip: external === undefined && 'this machine has no non-loopback IPv4 address' }, async (t) => {
  const { app, seen } = await remoteAddresses(t);
  await listenOn((options) => app.listen(options), { host: '::', port: 0, defaultHost: true });
  const { port } = app.server.address() as AddressInfo;
  t.same(await request(external!, port, 'DELETE', '/shards/nope', external), { status: 403, code: 'NODECOMPUTE_FORBIDDEN' });
  t.same(seen, [`::ffff:${external}`]);
});

t.test('a kernel without IPv6: the default falls back to 0.0.0.0, on the same app, and says so', async (t) => {
  const refusals: Array<[string, (app: App) => (options: { host: string; port: number }) => Promise<string>, RegExp]> = [
    // Built as Node builds it: this kernel has IPv6.
    ['EAFNOSUPPORT', () => (options) => Promise.reject(refusedByKernel('EAFNOSUPPORT', options.host, options.port)), /IPv6 is disabled/],
    // The real kernel's refusal, through Fastify: the same app must then listen again.
    ['EADDRNOTAVAIL', (app) => (options) => app.listen({ ...options, host: NOT_HERE }), /no network interface of this machine has that address/],
  ];
  for (const [code, refuse, why] of refusals) {
    await t.test(code, async (t) => {
      const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
      const { hosts, listen } = recordingListen(app, refuse(app));
      const listening = await listenOn(listen, { host: '::', port: 0, defaultHost: true });
      const { address, port } = app.server.address() as AddressInfo;
      t.same(hosts, ['::', '0.0.0.0'], 'tried ::, then 0.0.0.0');
      t.equal(address, '0.0.0.0');
      t.equal(listening.host, '0.0.0.0');
      t.equal(listening.url, `http://127.0.0.1:${port}`);
      t.match(listening.message, new RegExp(`^nodecompute is listening on 0\\.0\\.0\\.0 \\(IPv4 only\\): the default :: \\(IPv6 and IPv4\\) was refused with ${code}, `));
      t.match(listening.message, why);
      t.match(listening.message, /IPv6 clients .* cannot reach it; enable IPv6 on this node if they must\.$/);
      t.equal((await request('127.0.0.1', port, 'GET', '/livez')).status, 200, 'and it answers');
    });
  }
});

t.test('a host that was set is used as given: no fallback, and a start that cannot listen says why', async (t) => {
  await t.test(':: set explicitly on a kernel without IPv6', async (t) => {
    const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
    const refusal = refusedByKernel('EAFNOSUPPORT', '::', 9470);
    const { hosts, listen } = recordingListen(app, () => Promise.reject(refusal));
    const err = (await listenOn(listen, { host: '::', port: 9470, defaultHost: false }).catch((e: unknown) => e)) as Error;
    t.same(hosts, ['::'], 'no second try');
    t.match(err, {
      code: 'NODECOMPUTE_CONFIG_INVALID',
      message:
        'NODECOMPUTE_HOST (--host) is "::", which this machine cannot listen on (EAFNOSUPPORT: this kernel does not support its address family: IPv6 is disabled (ipv6.disable=1) or absent). ' +
        'Set it to an address of this machine, or unset it to listen on every address (:: with IPv6, 0.0.0.0 without).',
    });
    t.equal(err.cause, refusal, 'the cause is kept');
    t.equal(app.server.listening, false);
  });

  await t.test('an address this machine does not have (the real kernel refusal)', async (t) => {
    const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
    const { hosts, listen } = recordingListen(app);
    await t.rejects(listenOn(listen, { host: NOT_HERE, port: 0, defaultHost: false }), {
      code: 'NODECOMPUTE_CONFIG_INVALID',
      message: /^NODECOMPUTE_HOST \(--host\) is "2001:db8::1", which this machine cannot listen on \(EADDRNOTAVAIL: no network interface of this machine has that address\)\. Set it to/,
    });
    t.same(hosts, [NOT_HERE]);
  });

  for (const [code, why] of [
    ['ENOTFOUND', 'no address was found for that name'],
    ['EAI_AGAIN', 'resolving that name failed for now (the DNS server did not answer)'],
  ] as const) {
    await t.test(`a name that does not resolve (${code})`, async (t) => {
      // As Node's net.Server.listen rejects it after dns.lookup (a real lookup's answer depends on the machine's DNS).
      const unresolved = Object.assign(new Error(`getaddrinfo ${code} notahost`), { code, syscall: 'getaddrinfo', hostname: 'notahost' });
      const hosts: string[] = [];
      const listen: Listen = ({ host }) => {
        hosts.push(host);
        return Promise.reject(unresolved);
      };
      await t.rejects(listenOn(listen, { host: 'notahost', port: 9470, defaultHost: false }), {
        code: 'NODECOMPUTE_CONFIG_INVALID',
        message: `NODECOMPUTE_HOST (--host) is "notahost", which this machine cannot listen on (${code}: it is not an IP address, and ${why}). Set it to an address of this machine, or unset it to listen on every address (:: with IPv6, 0.0.0.0 without).`,
      });
      t.same(hosts, ['notahost'], 'no second try');
    });
  }

  const given: Array<[string, string]> = [
    ['127.0.0.1', 'nodecompute is listening on 127.0.0.1'],
    ['0.0.0.0', 'nodecompute is listening on 0.0.0.0 (IPv4 only)'],
    ['::1', 'nodecompute is listening on ::1'],
  ];
  for (const [host, message] of given) {
    await t.test(host, async (t) => {
      const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
      const listening = await listenOn((options) => app.listen(options), { host, port: 0, defaultHost: false });
      t.equal(listening.host, host);
      t.equal(listening.message, message);
      t.equal((app.server.address() as AddressInfo).address, host);
    });
  }
});

/** Listens on a free port of `host` until the test ends, as another program holding it would. */
async function holdPort(t: Test, host: string): Promise<number> {
  const holder = net.createServer();
  await new Promise<void>((resolve) => holder.listen({ host, port: 0 }, resolve));
  t.teardown(() => new Promise<void>((resolve) => holder.close(() => resolve())));
  return (holder.address() as AddressInfo).port;
}

t.test('a failure that is not about IPv6 is not papered over: a port in use on :: stops the start, saying what it means and what to do', async (t) => {
  const port = await holdPort(t, '::');
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const { hosts, listen } = recordingListen(app);
  const err = (await listenOn(listen, { host: '::', port, defaultHost: true }).catch((caught: unknown) => caught)) as Error & { code: string; cause: NodeJS.ErrnoException };
  t.equal(err.code, 'EADDRINUSE');
  t.match(err.message, `port ${port} is already taken (listen EADDRINUSE: address already in use :::${port})`);
  t.match(err.message, /another program .*network namespace/);
  t.match(err.message, `\`ss -ltnp 'sport = :${port}'\``);
  t.match(err.message, /free port with NODECOMPUTE_PORT \(--port\)\.$/);
  t.match(err.cause, { code: 'EADDRINUSE', syscall: 'listen' }, "Node's own error is kept as the cause");
  t.same(hosts, ['::'], 'no fallback to 0.0.0.0 (which the dual-stack holder blocks too)');
  t.equal(app.server.listening, false);
});

t.test('the fallback to 0.0.0.0 meeting a port in use says so the same way', async (t) => {
  const port = await holdPort(t, '0.0.0.0');
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const { hosts, listen } = recordingListen(app, async (options) => Promise.reject(refusedByKernel('EAFNOSUPPORT', options.host, options.port)));
  await t.rejects(listenOn(listen, { host: '::', port, defaultHost: true }), {
    code: 'EADDRINUSE',
    message: new RegExp(`^port ${port} is already taken \\(listen EADDRINUSE: address already in use 0\\.0\\.0\\.0:${port}\\) by another program`),
  });
  t.same(hosts, ['::', '0.0.0.0']);
});
