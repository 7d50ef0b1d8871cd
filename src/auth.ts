// Owns who may change the registry: the onRequest hook of every write route (PUT, DELETE, POST);
// reads stay open (probes, dashboards, Prometheus) and pay nothing for it. Writes need
// `Authorization: Bearer <token>` when a token is configured, compared in constant time; with no
// token configured they are accepted from loopback only, so a node that forgot its Secret is not
// writable from the network.
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from './config.js';
import { ForbiddenError, UnauthorizedError } from './errors.js';

/** Hashing first makes both sides the same length, so the comparison time says nothing about the token. */
function digest(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest();
}

export function tokensMatch(expected: string, presented: string): boolean {
  return timingSafeEqual(digest(expected), digest(presented));
}

export function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
  return v4.startsWith('127.') || address === '::1';
}

function bearer(header: string | undefined): string | null {
  const match = header?.match(/^Bearer\s+(\S+)\s*$/i);
  return match?.[1] ?? null;
}

export function createAuth(config: Config, log: Logger) {
  const token = config.token;
  return function authorise(request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction): void {
    if (token === null) {
      if (isLoopback(request.socket.remoteAddress)) return done();
      log.warn({ remoteAddress: request.socket.remoteAddress, url: request.url }, 'Refused a write from the network: no token is configured');
      return done(
        new ForbiddenError(
          'Writes are accepted from loopback only because no token is configured on this node. Set NODECOMPUTE_TOKEN (or NODECOMPUTE_TOKEN_FILE) and send "Authorization: Bearer <token>".',
        ),
      );
    }
    const presented = bearer(request.headers.authorization);
    reply.header('www-authenticate', 'Bearer realm="nodecompute"');
    if (presented === null) {
      return done(new UnauthorizedError('This write needs "Authorization: Bearer <token>" with the token configured on this node (NODECOMPUTE_TOKEN).'));
    }
    if (!tokensMatch(token, presented)) {
      log.warn({ remoteAddress: request.socket.remoteAddress, url: request.url }, 'Refused a write with a wrong bearer token');
      return done(new UnauthorizedError('The bearer token does not match the one configured on this node (NODECOMPUTE_TOKEN). Check the Secret the caller uses.'));
    }
    reply.removeHeader('www-authenticate');
    done();
  };
}
