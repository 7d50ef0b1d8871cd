// Who may write (reads stay open): a bearer token, compared in constant time, else loopback only.
// The token file is looked at by writes at most once a second and re-read when it changes, so a
// Secret rotated in place locks no one out; a file gone bad keeps the tokens last read in force.
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify';
import type { Logger } from 'pino';
import { parseTokenFile, unreadableTokenFile, type Config } from './config.js';
import { ForbiddenError, UnauthorizedError } from './errors.js';
import { browserRefusal } from './http/write-guard.js';
import { createRepeatLimit } from './repeat-limit.js';
import { createTokenFileReader, type TokenFileLook, type TokenFileReaderOptions } from './system/token-file.js';

/** How often, at most, writes look at the token file: a burst of writes or of wrong tokens costs one stat a second. */
export const TOKEN_FILE_CHECK_MS = 1000;

/** Hashing first makes both sides the same length, so the comparison time says nothing about the token. */
function digest(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest();
}

/** Compares against every accepted token, never stopping at a match, so the time says nothing about which one. */
function matchesAny(digests: readonly Buffer[], presented: string): boolean {
  const presentedDigest = digest(presented);
  return digests.reduce((matched, expected) => timingSafeEqual(expected, presentedDigest) || matched, false);
}

/** An IPv4 client of a dual-stack socket shows as ::ffff:a.b.c.d. */
export function isLoopback(address: string | undefined): boolean {
  return address !== undefined && (address.replace(/^::ffff:/, '').startsWith('127.') || address === '::1');
}

/** The tokens accepted for writes now, and the setting that names them. */
export interface TokenSource {
  setting: 'NODECOMPUTE_TOKEN' | 'NODECOMPUTE_TOKEN_FILE';
  /** Digests of the tokens in force; a promise while the token file is looked at (the write waits for it). */
  current(): readonly Buffer[] | Promise<readonly Buffer[]>;
}

/** Unstable reads in a row before they are warned about: one alone is a rewrite caught in the act. */
const UNSTABLE_LOOKS_WARNED = 2;

const FIX_THE_SECRET =
  'Check the Secret (one token a line, each at least 16 characters; "#" starts a comment) and its mount; it is re-read within a second of the next write.';

/** initial: the tokens read at start (readStartTokens refuses to start without one); beforeRead: for tests (see createTokenFileReader). */
type TokenFileOptions = { path: string; initial: string[]; log: Logger; now: () => number; beforeRead?: TokenFileReaderOptions['beforeRead'] };

/**
 * The token file's tokens, re-read when it changes; a file gone bad keeps the tokens last read in force.
 * problem: what is wrong with the file now, null when nothing is.
 */
export function createTokenFileSource(options: TokenFileOptions): TokenSource & { problem(): string | null } {
  const { path, log, now } = options;
  const reader = createTokenFileReader(path, { beforeRead: options.beforeRead });
  let tokens = options.initial;
  let digests = tokens.map(digest);
  let checkedAt = -Infinity;
  let checking: Promise<readonly Buffer[]> | null = null;
  let unstableInARow = 0;
  let problem: string | null = null;
  // The problem's kind and cause, without counts: warned when it changes, not at every write.
  let warnedOf: string | null = null;

  function trouble(which: string, what: string, fix = FIX_THE_SECRET): void {
    problem = `The token file ${path} ${what}. The ${tokens.length} token(s) last read from it stay in force; a rotated token is not picked up. ${fix}`;
    if (which === warnedOf) return;
    warnedOf = which;
    log.warn({ file: path, tokens: tokens.length }, problem);
  }

  function use(next: string[]): void {
    if (problem !== null) {
      problem = null;
      warnedOf = null;
      log.info({ file: path }, `The token file ${path} can be used again (what was wrong with it is fixed); tokens are read from it again from now on.`);
    }
    if (next.length === tokens.length && next.every((token) => tokens.includes(token))) return;
    tokens = next;
    digests = next.map(digest);
    log.info({ file: path, tokens: next.length }, `Write tokens changed: ${next.length} token(s) from ${path} are in force now.`);
  }

  function apply(look: TokenFileLook): void {
    unstableInARow = look.kind === 'unstable' ? unstableInARow + 1 : 0;
    switch (look.kind) {
      case 'unchanged':
        return;
      case 'failed': {
        // Denied: its mode or owner, not its content, needs fixing, and the message names the user.
        const denied = unreadableTokenFile(path, look.err, look.file);
        const fix = denied === null ? undefined : `${denied}; it is read again within a second of the next write.`;
        return trouble(`failed: ${look.err.message}`, `cannot be read (${look.err.message})`, fix);
      }
      case 'late':
        return trouble(
          'late',
          `did not answer within ${look.timeoutMs} ms (its read is still pending: a hung network filesystem?)`,
          `No write waits for it, nor is another read started, until it returns. Check that \`cat ${path}\` returns, or mount the token from a Secret (tmpfs).`,
        );
      case 'unstable':
        // One is a rewrite caught in the act: the next look reads the finished file.
        if (unstableInARow < UNSTABLE_LOOKS_WARNED) return;
        return trouble(
          'unstable',
          `was not stable while it was read, ${unstableInARow} times in a row (${look.detail})`,
          'It is rewritten in place, or not a regular file: replace it by a rename, as the kubelet does for a Secret; it is re-read at the next write.',
        );
      case 'read': {
        const content = parseTokenFile(look.text);
        if (content.problem !== null) return trouble(`unusable: ${content.problem}`, `cannot be used: ${content.problem}`);
        return use(content.tokens);
      }
    }
  }

  return {
    setting: 'NODECOMPUTE_TOKEN_FILE',
    problem: () => problem,
    current() {
      // A write that comes while the file is being looked at waits for that look, and starts none.
      if (checking !== null) return checking;
      const at = now();
      // A clock set back must not stop the checks until it catches up again.
      if (at - checkedAt < TOKEN_FILE_CHECK_MS && at >= checkedAt) return digests;
      checkedAt = at;
      checking = reader.look().then((look) => {
        checking = null;
        apply(look);
        return digests;
      });
      return checking;
    },
  };
}

/** The token file as the service sees it; problem: what is wrong with it (the tokens last read stay in force), null when nothing is. */
export type TokenFileState = { path: string; tokens: number; problem: string | null };

/** Why a write was refused before it was looked at: the label of nodecompute_writes_refused_total. */
export const WRITE_REFUSALS = [
  'missing-token', // a token is configured, and no "Authorization: Bearer" header came
  'wrong-token',
  'not-loopback', // no token configured, and the write came from the network
  'cross-origin', // from a web page of another origin (Origin, Sec-Fetch-Site)
  'foreign-host', // no token configured, from loopback naming a Host not loopback's (DNS rebinding)
] as const;
export type WriteRefusal = (typeof WRITE_REFUSALS)[number];

/** How writes are authorised, as the start-up log says it: from the config, with the tokens read at start. */
export function describeWriteAccess(config: Config): string {
  if (config.tokenFile !== null) {
    return `Writes need a bearer token: ${config.fileTokens.length} token(s) from ${config.tokenFile} (re-read when it changes).`;
  }
  if (config.token !== null) return 'Writes need a bearer token: 1 token from NODECOMPUTE_TOKEN.';
  return 'No token is configured: writes are accepted from loopback only (127.0.0.1, ::1), from any local process. Writes from the network, ' +
    "Docker's -p or a proxy are refused: set NODECOMPUTE_TOKEN_FILE (or NODECOMPUTE_TOKEN) to accept them with a bearer token.";
}

/**
 * authorise: the onRequest hook of every write route. tokenFile: looks at the token file as a write
 * does and says what it found (the doctor's view); null without one.
 */
export function createAuth(config: Config, log: Logger, now: () => number, onRefused: (reason: WriteRefusal) => void) {
  const path = config.tokenFile;
  const fileSource = path === null ? null : createTokenFileSource({ path, initial: config.fileTokens, log, now });
  const fixed = config.token === null ? null : [digest(config.token)];
  const source: TokenSource | null = fileSource ?? (fixed && { setting: 'NODECOMPUTE_TOKEN', current: () => fixed });
  const tokenFile = fileSource === null || path === null ? null
    : async (): Promise<TokenFileState> => ({
      path, tokens: (await fileSource.current()).length, problem: fileSource.problem(),
    });
  const rotationHint = path === null ? '.'
    : `; after a rotation, this node takes the new token within a second of ${path} changing (a Secret's mounted file lags the Secret by a minute or two).`;
  // A caller retrying with a stale token would log a line a second: warn once a minute per reason and address.
  const level = createRepeatLimit(now);
  function refused(reason: WriteRefusal, request: FastifyRequest, msg: string): void {
    onRefused(reason);
    const remoteAddress = request.socket.remoteAddress;
    log[level(`${reason} ${remoteAddress}`)]({ reason, remoteAddress, method: request.method, url: request.url }, `${msg} (repeats from this address are logged at debug level for a minute)`);
  }

  function authorise(request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction): void {
    const remoteAddress = request.socket.remoteAddress;
    const browser = browserRefusal(request.headers, source === null && isLoopback(remoteAddress), config.allowedHosts);
    if (browser !== null) {
      refused(browser.reason, request, `Refused a write a web page could have sent: ${browser.error.message}`);
      return done(browser.error);
    }
    if (source === null) {
      if (isLoopback(remoteAddress)) return done();
      refused('not-loopback', request, 'Refused a write from the network: no token is configured, so only loopback may write');
      const message =
        `No token is configured here, so writes are accepted from loopback only (127.0.0.1, ::1); this one came from ${String(remoteAddress).replace(/^::ffff:/, '')}. ` +
        "Behind Docker's -p (its bridge: 172.17.0.1) or a proxy, set NODECOMPUTE_TOKEN_FILE or NODECOMPUTE_TOKEN, and send \"Authorization: Bearer <token>\".";
      return done(new ForbiddenError(message));
    }
    const presented = request.headers.authorization?.match(/^Bearer\s+(\S+)\s*$/i)?.[1] ?? null;
    reply.header('www-authenticate', 'Bearer realm="nodecompute"');
    if (presented === null) {
      refused('missing-token', request, 'Refused a write without "Authorization: Bearer <token>"');
      const sent = request.headers.authorization === undefined ? '' : ' The Authorization header sent is not that: "Bearer", a space, then the token alone.';
      return done(new UnauthorizedError(`This write needs "Authorization: Bearer <token>" with a token configured on this node (${source.setting}).${sent}`));
    }
    const judge = (digests: readonly Buffer[]): void => {
      if (!matchesAny(digests, presented)) {
        refused('wrong-token', request, 'Refused a write with a wrong bearer token');
        // RFC 6750 3.1: a token presented and refused is invalid_token.
        reply.header('www-authenticate', 'Bearer realm="nodecompute", error="invalid_token"');
        const said = `The bearer token does not match any token configured on this node (${source.setting}). Check the Secret the caller uses`;
        return done(new UnauthorizedError(said + rotationHint));
      }
      reply.removeHeader('www-authenticate');
      done();
    };
    // The file is looked at first, so a rotated token works from the first write that presents it.
    const digests = source.current();
    if (digests instanceof Promise) digests.then(judge, done);
    else judge(digests);
  }
  return { authorise, tokenFile };
}
