// Owns who may change the registry: the onRequest hook of every write route (PUT, DELETE, POST);
// reads stay open (probes, dashboards, Prometheus) and pay nothing for it. Writes need
// `Authorization: Bearer <token>` when a token is configured, compared in constant time; with no
// token configured they are accepted from loopback only, so a node that forgot its Secret is not
// writable from the network.
// It also owns the token file while the service runs: NODECOMPUTE_TOKEN_FILE may hold several
// tokens (any one is accepted) and is re-read when it changes, so a Secret rotated in place ("old +
// new", then "new") never locks out shard pods that already carry the new token. The file is looked
// at lazily, by writes, at most once a second: no timer, and nothing at all on a node nobody writes to.
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import type { Logger } from 'pino';
import { parseTokenFile, type Config } from './config.js';
import { ForbiddenError, UnauthorizedError } from './errors.js';

/** How often, at most, writes look at the token file: a burst of writes or of wrong tokens costs one stat a second. */
export const TOKEN_FILE_CHECK_MS = 1000;

/** Hashing first makes both sides the same length, so the comparison time says nothing about the token. */
function digest(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest();
}

/** Compares against every accepted token, never stopping at a match, so the time says nothing about which one. */
function matchesAny(digests: readonly Buffer[], presented: string): boolean {
  const presentedDigest = digest(presented);
  let matched = false;
  for (const expected of digests) matched = timingSafeEqual(expected, presentedDigest) || matched;
  return matched;
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

/** The tokens accepted for writes now, and the setting an operator changes to change them. */
export interface TokenSource {
  setting: 'NODECOMPUTE_TOKEN' | 'NODECOMPUTE_TOKEN_FILE';
  /** Digests of the tokens in force; may look at the token file first. */
  current(): readonly Buffer[];
}

function fixedToken(token: string): TokenSource {
  const digests = [digest(token)];
  return { setting: 'NODECOMPUTE_TOKEN', current: () => digests };
}

/** Changes when the file is replaced (a kubelet symlink swap gives a new inode) or rewritten in place. */
function fileIdentity(path: string): string {
  const stats = statSync(path); // follows symlinks: the identity of the file the tokens are read from
  return `${stats.dev}:${stats.ino}:${stats.size}:${stats.mtimeMs}`;
}

function sameTokens(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((token) => b.includes(token));
}

export interface TokenFileOptions {
  path: string;
  /** The tokens read from the file at start (config.ts refuses to start without one). */
  initial: string[];
  log: Logger;
  now: () => number;
}

/**
 * The tokens of NODECOMPUTE_TOKEN_FILE, re-read when the file changes. A file that becomes
 * unreadable, empty or unusable keeps the tokens last read in force: refusing every write because a
 * Secret was briefly wrong would take the whole node's registrations down with it.
 */
export function createTokenFileSource(options: TokenFileOptions): TokenSource {
  const { path, log, now } = options;
  let tokens = options.initial;
  let digests = tokens.map(digest);
  // The identity of the file last read; null: read it at the next check.
  let readIdentity: string | null = null;
  let checkedAt: number | null = null;
  let inTrouble = false;

  function trouble(what: string): void {
    if (inTrouble) return;
    inTrouble = true;
    log.warn(
      { file: path, tokens: tokens.length },
      `The token file ${path} ${what}. The ${tokens.length} token(s) last read from it stay in force, so writes that present one keep working, but a rotated token is not picked up. ` +
        'Check the Secret (its key must hold one token a line, each at least 16 characters) and its mount; the file is re-read within a second of the next write once it is fixed.',
    );
  }

  function use(next: string[]): void {
    if (inTrouble) {
      inTrouble = false;
      log.info({ file: path }, `The token file ${path} is readable again; its tokens are used from now on.`);
    }
    if (sameTokens(next, tokens)) return;
    tokens = next;
    digests = next.map(digest);
    log.info({ file: path, tokens: next.length }, `Write tokens changed: ${next.length} token(s) from ${path} are in force now.`);
  }

  function check(): void {
    let identity: string;
    let text: string;
    try {
      // Stat before reading: a file caught mid-write was stat'd no later than it was read, so its
      // final version has another identity and is read at the next check.
      identity = fileIdentity(path);
      if (identity === readIdentity) return;
      text = readFileSync(path, 'utf8');
    } catch (err) {
      // Not remembered as read: a permission fix changes neither size nor mtime.
      readIdentity = null;
      return trouble(`cannot be read (${(err as Error).message})`);
    }
    readIdentity = identity;
    const content = parseTokenFile(text);
    if (content.problem !== null) return trouble(`cannot be used: ${content.problem}`);
    use(content.tokens);
  }

  return {
    setting: 'NODECOMPUTE_TOKEN_FILE',
    current() {
      const at = now();
      const elapsed = checkedAt === null ? Infinity : at - checkedAt;
      // A clock set back must not stop the checks until it catches up again.
      if (elapsed >= TOKEN_FILE_CHECK_MS || elapsed < 0) {
        checkedAt = at;
        check();
      }
      return digests;
    },
  };
}

function tokenSource(config: Config, log: Logger, now: () => number): TokenSource | null {
  if (config.tokenFile !== null) return createTokenFileSource({ path: config.tokenFile, initial: config.fileTokens, log, now });
  return config.token === null ? null : fixedToken(config.token);
}

export function createAuth(config: Config, log: Logger, now: () => number = Date.now) {
  const source = tokenSource(config, log, now);
  return function authorise(request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction): void {
    if (source === null) {
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
      return done(new UnauthorizedError(`This write needs "Authorization: Bearer <token>" with a token configured on this node (${source.setting}).`));
    }
    // Every write with a token looks at the token file first (at most once a second), so a rotated
    // token works from the first write that presents it, and a token taken out stops working.
    if (!matchesAny(source.current(), presented)) {
      log.warn({ remoteAddress: request.socket.remoteAddress, url: request.url }, 'Refused a write with a wrong bearer token');
      return done(
        new UnauthorizedError(
          `The bearer token does not match any token configured on this node (${source.setting}). Check the Secret the caller uses` +
            (source.setting === 'NODECOMPUTE_TOKEN_FILE'
              ? "; after a rotation, this node takes the new token within a second once the kubelet has updated its mounted file (a minute or two after the Secret changes)."
              : '.'),
        ),
      );
    }
    reply.removeHeader('www-authenticate');
    done();
  };
}
