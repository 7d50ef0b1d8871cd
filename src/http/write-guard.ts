// Owns what keeps a web page in a browser on the node from writing. A write naming another origin
// (Origin, or Sec-Fetch-Site cross-site or same-site) is refused, token or not. A write trusted for
// coming from loopback must also name a loopback Host or an allowed one, so DNS rebinding cannot
// borrow that trust. curl, control planes and the Kubernetes hooks send no Origin and a Host that passes.
import type { IncomingHttpHeaders } from 'node:http';
import { CrossOriginError, HostNotAllowedError } from '../errors.js';

type WriteHeaders = Pick<IncomingHttpHeaders, 'host' | 'origin' | 'sec-fetch-site'>;

/** The hostname of a Host header or an origin's authority, lower-case, without port or IPv6 brackets. */
export function hostnameOf(authority: string): string {
  const name = authority.trim().toLowerCase();
  if (name.startsWith('[')) return name.slice(1, name.indexOf(']'));
  return name.replace(/:\d*$/, '');
}

function isLoopbackName(name: string): boolean {
  return name === 'localhost' || name === '::1' || /^127(\.\d{1,3}){3}$/.test(name);
}

/** Why this write names another origin; null when it names none or this server's own. */
function crossOrigin(headers: WriteHeaders): string | null {
  const site = headers['sec-fetch-site'];
  if (site === 'cross-site' || site === 'same-site') return `Sec-Fetch-Site: ${site}`;
  const { origin, host } = headers;
  if (origin === undefined) return null;
  let authority: string;
  try {
    authority = new URL(origin).host;
  } catch {
    return `Origin: ${origin}`; // "null" (a sandboxed frame, a file: page) or garbage
  }
  return host !== undefined && authority === host.trim().toLowerCase() ? null : `Origin: ${origin}`;
}

/**
 * The refusal of a write a browser could have sent on a page's behalf; null for one it could not.
 * `loopbackTrust`: the write is accepted for coming from loopback (no token is configured).
 */
export function browserRefusal(headers: WriteHeaders, loopbackTrust: boolean, allowedHosts: readonly string[]) {
  const named = crossOrigin(headers);
  if (named !== null) {
    return {
      reason: 'cross-origin' as const,
      error: new CrossOriginError(
        `This write came from a web page of another origin (${named}), and no web page may change shards: send it from a program (curl, a controller).`,
      ),
    };
  }
  if (!loopbackTrust || headers.host === undefined) return null;
  const name = hostnameOf(headers.host);
  if (isLoopbackName(name) || allowedHosts.includes(name)) return null;
  return {
    reason: 'foreign-host' as const,
    error: new HostNotAllowedError(
      `This write came from loopback but names the host "${headers.host}", not localhost, 127.0.0.1 or [::1] (no token is configured: DNS rebinding). ` +
        "Send it to localhost, add the name to NODECOMPUTE_ALLOWED_HOSTS (--allowed-hosts) if it is this node's, or configure NODECOMPUTE_TOKEN_FILE.",
    ),
  };
}
