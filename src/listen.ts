// Owns where the service listens. The default host, ::, takes IPv6 and IPv4 on one socket: Node
// (libuv) clears IPV6_V6ONLY on every IPv6 listener, whatever net.ipv6.bindv6only says, so IPv4
// clients arrive as IPv4-mapped addresses (::ffff:10.1.2.3; auth.ts counts ::ffff:127.x as
// loopback). One default thus serves IPv4-only, dual-stack and IPv6-only clusters; the former
// 0.0.0.0 took no IPv6 connection, so in an IPv6-only cluster the kubelet's probes to the pod IP
// failed. Fastify hands :: straight to Node (only `localhost` makes it bind several addresses).
// A kernel without IPv6 (booted with ipv6.disable=1) refuses :: with EAFNOSUPPORT, some sandboxes
// with EADDRNOTAVAIL: only then, and only for the default, the service listens on 0.0.0.0. A host
// the operator set is used as given; when it cannot be listened on (a name that does not resolve
// included), the start fails saying why. A
// port already taken (a second nodecompute, or another program) fails the start too, saying what to
// do rather than only Node's "listen EADDRINUSE". main.ts passes Fastify's listen; tests pass one
// that fails as such a kernel would.
import { ConfigInvalidError } from './errors.js';

export const DUAL_STACK_HOST = '::';
export const IPV4_HOST = '0.0.0.0';

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

export interface Listening {
  /** The URL Fastify reports, e.g. http://[::]:9470. */
  url: string;
  /** The address it listens on: the host asked for, or 0.0.0.0 after the fallback. */
  host: string;
  /** The start-up line: which address, and which families that takes. */
  message: string;
}

function families(host: string): string {
  if (host === DUAL_STACK_HOST) return ' (IPv6 and IPv4)';
  if (host === IPV4_HOST) return ' (IPv4 only)';
  return '';
}

/** Node's "listen EADDRINUSE: address already in use :::9470", with what it means and what to do. */
function explainPortInUse(err: unknown, port: number): unknown {
  if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') return err;
  return Object.assign(
    new Error(
      `port ${port} is already taken (${(err as Error).message}): another nodecompute, or another program, is listening on it on this machine ` +
        '(in a container: in its network namespace). ' +
        `Stop that one if it should not run (\`ss -ltnp 'sport = :${port}'\` names it), or give this one a free port with NODECOMPUTE_PORT (--port).`,
      { cause: err },
    ),
    { code: 'EADDRINUSE' },
  );
}

/**
 * Listens on `host`; when it is the default :: and the kernel has no IPv6, on 0.0.0.0 instead.
 * A port in use is thrown with its explanation; any other failure as it came, so the start fails
 * with it.
 */
export async function listenOn(listen: Listen, options: { host: string; port: number; defaultHost: boolean }): Promise<Listening> {
  const { port } = options;
  return listenOrFallBack((asked) => listen(asked).catch((err: unknown) => Promise.reject(explainPortInUse(err, port))), options);
}

async function listenOrFallBack(listen: Listen, { host, port, defaultHost }: { host: string; port: number; defaultHost: boolean }): Promise<Listening> {
  try {
    const url = await listen({ host, port });
    return { url, host, message: `nodecompute is listening on ${host}${families(host)}` };
  } catch (err) {
    const code = String((err as NodeJS.ErrnoException).code);
    const unavailable = UNAVAILABLE[code];
    const why = unavailable ?? UNRESOLVED[code];
    if (why === undefined) throw err;
    if (unavailable !== undefined && defaultHost && host === DUAL_STACK_HOST) {
      const url = await listen({ host: IPV4_HOST, port });
      return {
        url,
        host: IPV4_HOST,
        message:
          `nodecompute is listening on ${IPV4_HOST} (IPv4 only): the default :: (IPv6 and IPv4) was refused with ${code}, ${why}. ` +
          'IPv6 clients (an IPv6-only cluster\'s probes) cannot reach it; enable IPv6 on this node if they must.',
      };
    }
    throw new ConfigInvalidError(
      `NODECOMPUTE_HOST (--host) is "${host}", which this machine cannot listen on (${code}: ${why}). ` +
        `Set it to an address of this machine, or unset it to listen on every address (:: with IPv6, ${IPV4_HOST} without).`,
      { cause: err },
    );
  }
}
