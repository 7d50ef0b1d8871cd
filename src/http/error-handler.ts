// Owns the app's answers outside the routes: the error handler (coded errors as they are, with
// Retry-After where retrying sooner cannot help; Fastify's mapped; anything else a logged 500), the
// 404 of a path that does not exist, the 400 of a target that is no path (*), and the JSON body
// parser. A coded 5xx repeats on every request while it lasts, so each distinct one is a warning at
// most once a minute (repeat-limit.ts).
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { BadRequestError, InternalError, NotFoundError, StateWriteFailedError, StateWritePendingError, isCodedError, type CodedError } from '../errors.js';
import { unreachableListedIn } from '../node-state/gpu-roster.js';
import { retryAfterSeconds } from '../node-state/snapshot.js';
import { createRepeatLimit } from '../repeat-limit.js';
import type { App } from '../services.js';
import { errorBody, fastifyErrorBody, whyNotJson } from './errors.js';

const ASTERISK_FORM = 'The request target * is only for OPTIONS (RFC 9110, 7.1): ask a path, such as GET /shards; see /docs.';

export function handleErrors(app: App, log: Logger): void {
  const { node, config, now } = app.services;
  // Expected failures: their code and message say it all, without pino's type and stack.
  const failureLog = log.child({}, { serializers: { err: (err: CodedError) => ({ code: err.code, message: err.message }) } });
  const failureLevel = createRepeatLimit(now);
  // A change the state file could not take is refused again if retried at once: wait out a write's bound.
  const stateRetryAfter = Math.ceil(config.stateTimeoutMs / 1000);

  // A DELETE with Content-Type: application/json and no body (many clients send it) has no body, not an empty document.
  const parseJson = app.getDefaultJsonParser('error', 'ignore');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    if (request.method === 'DELETE' && body === '') return done(null, undefined);
    return parseJson(request, body as string, (err, value) => done(err ? whyNotJson(err as FastifyError, body as string) : null, value));
  });

  app.setErrorHandler((err: FastifyError, request, reply) => {
    if (isCodedError(err)) {
      if (err.statusCode >= 500) failureLog[failureLevel(`${err.code}: ${err.message}`)]({ reqId: request.id, method: request.method, url: request.url, err }, 'Request failed');
      const snapshotFailure = err === node.snapshots.lastError;
      const stateFailure = err instanceof StateWriteFailedError || err instanceof StateWritePendingError;
      const retryAfter = retryAfterSeconds(node.snapshots, err) ?? (stateFailure ? stateRetryAfter : null);
      if (retryAfter !== null) void reply.header('retry-after', String(retryAfter));
      const message = snapshotFailure ? err.message + unreachableListedIn(err, node.unreachable()) : err.message;
      return reply.status(err.statusCode).send(errorBody(err.statusCode, err.code, message));
    }
    const mapped = fastifyErrorBody(err, request);
    if (mapped) {
      // Headers the error carries stay (the /docs files' 416 names the file's size in Content-Range).
      const { headers } = err as { headers?: Record<string, string> };
      if (headers !== undefined) void reply.headers(headers);
      return reply.status(mapped.statusCode).send(mapped);
    }
    request.log.error({ method: request.method, url: request.url, err }, 'Unexpected error while answering a request; this is a bug in nodecompute, please report it');
    const internal = new InternalError(
      'nodecompute hit an unexpected error while answering; the details are in its log. Retry; if it persists, report it with the log lines.',
    );
    return reply.status(500).send(errorBody(500, internal.code, internal.message));
  });

  const notFound = (request: FastifyRequest, reply: FastifyReply) => {
    const path = request.url.split('?')[0]!;
    // A trailing slash is the likeliest slip: name the path meant where a route matches it (not the /docs wildcard).
    const trimmed = path.slice(0, -1);
    const route = path.length > 1 && path.endsWith('/') ? app.findRoute({ method: request.method as 'GET', url: trimmed }) : null;
    const meant = route && !('*' in route.params) ? ` Did you mean ${trimmed}, without the trailing slash?` : '';
    const err = new NotFoundError(`No route ${request.method} ${path}.${meant} The API is listed at /docs and /openapi.json.`);
    return reply.status(404).send(errorBody(404, err.code, err.message));
  };
  // Answered before any body is read or parsed, as the 405s are: a broken or oversized body to a path
  // that does not exist is still told the path is wrong.
  app.addHook('onRequest', async (request, reply) => {
    // The router takes the asterisk-form target for /, which would answer the status page.
    if (request.raw.url === '*' && request.method !== 'OPTIONS') throw new BadRequestError(ASTERISK_FORM);
    if (request.is404) return notFound(request, reply);
  });
  app.setNotFoundHandler(notFound);
}
