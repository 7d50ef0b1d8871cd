// Where the service listens. The default, ::, takes IPv6 and IPv4 on one socket (IPv4 clients
// arrive as ::ffff:a.b.c.d); only where the kernel refuses it does the default fall back to 0.0.0.0.
// A host that was set is used as given; one or a port that cannot be listened on fails the start.
import { ConfigInvalidError } from './errors.js';

const DUAL_STACK_HOST = '::';
const IPV4_HOST = '0.0.0.0';
const FAMILIES = new Map([[DUAL_STACK_HOST, ' (IPv6 and IPv4)'], [IPV4_HOST, ' (IPv4 only)']]);

/** Why a listen on an address failed, for the errors that say the machine cannot have it. */
const UNAVAILABLE: Record<string, string> = {
  EAFNOSUPPORT: 'this kernel does not support its address family: IPv6 is disabled (ipv6.disable=1) or absent',
  EADDRNOTAVAIL: 'no network interface of this machine has that address',
};

/** Why a host that is a name could not be listened on: Node's getaddrinfo codes for a name that does not resolve. */
const UNRESOLVED: Record<string, string> = {
  ENOTFOUND: 'it is not an IP address, and no address was found for that name',
  EAI_AGAIN: 'it is not an IP address, and resolving that name failed for now (the DNS server did not answer)',
};

export type Listen = (options: { host: string; port: number }) => Promise<string>;

/** Node's "listen EADDRINUSE: address already in use :::9470", with what it means and what to do. */
function explainPortInUse(err: unknown, port: number): unknown {
  if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') return err;
  const message = `port ${port} is already taken (${(err as Error).message}) by another program on this machine or network namespace: ` +
    `stop it (\`ss -ltnp 'sport = :${port}'\` names it), or give this one a free port with NODECOMPUTE_PORT (--port).`;
  return Object.assign(new Error(message, { cause: err }), { code: 'EADDRINUSE' });
}

/**
 * Listens on `host`, or on 0.0.0.0 where the default :: is refused; a failure is thrown, explained where it can be.
 * Gives url (as Fastify reports it), host (the one asked for, or 0.0.0.0 after the fallback) and message (the start-up line).
 */
export async function listenOn(given: Listen, options: { host: string; port: number; defaultHost: boolean }) {
  const { host, port, defaultHost } = options;
  const listen: Listen = (asked) => given(asked).catch((err: unknown) => Promise.reject(explainPortInUse(err, port)));
  try {
    const url = await listen({ host, port });
    return { url, host, message: `nodecompute is listening on ${host}${FAMILIES.get(host) ?? ''}` };
  } catch (err) {
    const code = String((err as NodeJS.ErrnoException).code);
    const unavailable = UNAVAILABLE[code];
    const why = unavailable ?? UNRESOLVED[code];
    if (why === undefined) throw err;
    if (unavailable !== undefined && defaultHost && host === DUAL_STACK_HOST) {
      const message = `nodecompute is listening on ${IPV4_HOST} (IPv4 only): the default :: (IPv6 and IPv4) was refused with ${code}, ${why}. ` +
        'IPv6 clients (an IPv6-only cluster\'s probes) cannot reach it; enable IPv6 on this node if they must.';
      return { url: await listen({ host: IPV4_HOST, port }), host: IPV4_HOST, message };
    }
    const message = `NODECOMPUTE_HOST (--host) is "${host}", which this machine cannot listen on (${code}: ${why}). ` +
      `Set it to an address of this machine, or unset it to listen on every address (:: with IPv6, ${IPV4_HOST} without).`;
    throw new ConfigInvalidError(message, { cause: err });
  }
}
