// Owns the composition of the service: it builds the readers, the registry, the snapshot cache and
// the domain services from a Config, wires them into Fastify with one error shape and one auth
// rule, and registers the routes (and, after them, the 405s of the methods each path lacks). It
// never listens; main.ts does. Tests pass `deps` to swap the clock, the logger or a reader without
// touching anything else.
import { STATUS_CODES } from 'node:http';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Fastify, { type FastifyBaseLogger, type FastifyError, type FastifyReply, type FastifyInstance } from 'fastify';
import { pino, type Logger } from 'pino';
import type { OpenAPIV3_1 } from 'openapi-types';
import type { Config } from './config.js';
import {
  BadRequestError,
  ForbiddenError,
  InternalError,
  NotFoundError,
  PreconditionFailedError,
  RangeNotSatisfiableError,
  StateWriteFailedError,
  StateWritePendingError,
  isCodedError,
  type CodedError,
} from './errors.js';
import { createAuth, type Auth } from './auth.js';
import { unreachableListedIn } from './node-state/gpu-roster.js';
import { createNodeService, type NodeService } from './node-state/node-service.js';
import { createSnapshotTaker, type NodeSnapshot } from './node-state/node-snapshot.js';
import { createSnapshotSource, retryAfterSeconds } from './node-state/snapshot.js';
import { createShardService, type ShardService } from './shards/shard-service.js';
import { loadRegistry, type Registry } from './shards/registry.js';
import { createNvidiaSmi, type NvidiaSmi } from './system/nvidia-smi.js';
import { createProcReader, type ProcReader } from './system/procfs.js';
import { createStateFile, type StateFile } from './system/state-file.js';
import { registerSchemas } from './schemas/index.js';
import { createMetrics, type Metrics } from './metrics.js';
import { createRepeatLimit } from './repeat-limit.js';
import { VERSION } from './version.js';
import { completeOpenApi } from './openapi-document.js';
import { keepTickObjectShape } from './tick-shape.js';
import { spareUnflushedAnswers } from './unflushed-answers.js';
import { requestFields, ServiceLogController } from './fastify-log.js';
import gpusRoutes from '../routes/gpus.js';
import healthRoutes from '../routes/health.js';
import shardsRoutes from '../routes/shards.js';
import doctorRoutes from '../routes/doctor.js';
import metricsRoutes from '../routes/metrics.js';
import openapiRoutes from '../routes/openapi.js';
import statusPageRoutes from '../routes/status-page.js';
import { answerOtherMethods } from '../routes/method-not-allowed.js';

export interface Services {
  config: Config;
  node: NodeService;
  shards: ShardService;
  registry: Registry;
  nvidiaSmi: NvidiaSmi;
  proc: ProcReader;
  stateFile: StateFile;
  metrics: Metrics;
  now: () => number;
  /** Longest a probe waits for a refresh it needs: well inside Kubernetes' 1 s default. */
  probeBudgetMs: number;
  /** The onRequest hook of every write route. */
  authorise: Auth['authorise'];
  /** Looks at the token file now (throttled and bounded as for writes): for the doctor. */
  tokenFile: Auth['tokenFile'];
  /** The warnings the start logged about the settings: the doctor repeats them. */
  settingsWarnings: readonly string[];
}

export interface AppDeps {
  logger?: Logger;
  now?: () => number;
  nvidiaSmi?: NvidiaSmi;
  proc?: ProcReader;
  stateFile?: StateFile;
  /** The warnings the start logged about the settings (config.ts), for GET /doctor's settings row; none by default. */
  settingsWarnings?: readonly string[];
}

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
  }
}

export type App = FastifyInstance<
  import('node:http').Server,
  import('node:http').IncomingMessage,
  import('node:http').ServerResponse,
  FastifyBaseLogger,
  TypeBoxTypeProvider
>;

function errorBody(statusCode: number, code: string, message: string) {
  return { statusCode, code, error: String(STATUS_CODES[statusCode]), message };
}

/** What a field takes, said after the schema's complaint, by field and failing keyword. */
const FIELD_RULES: Record<string, string> = {
  'params/id minLength': 'the id is empty: a shard id goes between "/shards/" and the next "/"; GET /shards, without the trailing slash, lists them',
  'params/id pattern': 'a shard id is 1 to 128 letters, digits, ".", "_" or "-", starting with a letter or digit',
  // GET answers null for the one a shard was not registered with; a PUT leaves it out.
  'body/pid type': 'the host PID of the shard\'s main process, a whole number; to register a cgroup instead, leave "pid" out (null is not accepted)',
  'body/cgroup type': 'a container id or pod UID, as a string; to register a PID instead, leave "cgroup" out (null is not accepted)',
  'body/cgroup pattern':
    'a container id, 12 to 64 hex digits as `docker ps --no-trunc` or `crictl ps` show it, or a pod UID like 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0 (its metadata.uid); ' +
    "it is matched inside /proc/PID/cgroup, so a looser string would claim other workloads' processes",
};

/** Names the offending field and what it accepts, in the words of the schema's first complaint. */
function describeValidation(err: FastifyError): string {
  // Fastify stops at the first failing keyword (allErrors is off), so there is exactly one.
  const first = err.validation![0]!;
  const where = `${err.validationContext}${first.instancePath}`;
  const params = first.params as Record<string, unknown>;
  if (typeof params.additionalProperty === 'string') {
    return `${where} has an unknown field "${params.additionalProperty}" (fields are case-sensitive; remove it or fix its spelling)`;
  }
  if (Array.isArray(params.allowedValues)) return `${where} must be one of: ${params.allowedValues.join(', ')}`;
  // ajv's own words here are "items ## 2 and 0 are identical".
  if (first.keyword === 'uniqueItems') {
    const [earlier, later] = [Number(params.i), Number(params.j)].sort((a, b) => a - b);
    return `${where} must not list the same value twice: items ${earlier} and ${later} are equal (counting from 0)`;
  }
  const rule = FIELD_RULES[`${where} ${first.keyword}`];
  return `${where} ${first.message}${rule ? ` (${rule})` : ''}`;
}

/**
 * A 4xx raised without a code, by status: the ones the /docs files' server (@fastify/static) gives
 * for a ".." path, a NUL byte, or an If-Match or Range the file does not fit. `where` is the method
 * and path asked.
 */
const UNCODED_CLIENT_ERRORS: Record<number, (where: string, detail: string) => CodedError> = {
  400: (where, detail) =>
    new BadRequestError(
      `${where} is malformed (${detail}): a path may hold no NUL byte (%00), and its percent-encoding must be valid. Fix the URL; the API is listed at /docs and /openapi.json.`,
    ),
  403: (where) =>
    new ForbiddenError(
      `${where} is refused: a path that climbs out of its folder with ".." (percent-encoded or not) is never served. Ask for the file by its own path; the API is listed at /docs and /openapi.json.`,
    ),
  412: (where) =>
    new PreconditionFailedError(
      `${where}: the file is not the copy the If-Match or If-Unmodified-Since header names (it changed, or nodecompute was upgraded), so the condition fails. Fetch it again without that header.`,
    ),
  416: (where) =>
    new RangeNotSatisfiableError(
      `${where}: the Range header asks for bytes the file does not have. Fetch it without Range, or ask for a range within its size (the Content-Length of a HEAD request).`,
    ),
};

/**
 * The code of any other 4xx raised without one: its status text, as the codes of errors.ts are
 * named (403 is NODECOMPUTE_FORBIDDEN, 416 NODECOMPUTE_RANGE_NOT_SATISFIABLE).
 */
function codeOfStatus(status: number): string {
  return `NODECOMPUTE_${String(STATUS_CODES[status]).toUpperCase().replace(/[^A-Z0-9]+/g, '_')}`;
}

/** Fastify's own errors keep their status but get our codes and a message that says how to fix it. */
function fastifyErrorBody(err: FastifyError, request: { method: string; url: string }) {
  const status = err.statusCode ?? 500;
  if (err.validation) {
    return errorBody(400, 'NODECOMPUTE_BAD_REQUEST', `Invalid request: ${describeValidation(err)}. See /docs for the expected shape.`);
  }
  const known: Record<string, [number, string, string]> = {
    FST_ERR_CTP_BODY_TOO_LARGE: [413, 'NODECOMPUTE_PAYLOAD_TOO_LARGE', 'The request body is larger than this endpoint accepts: a registration takes at most 64 KiB of JSON, engine output at most 1 MiB a call (post the rest in further calls). Send less.'],
    FST_ERR_CTP_INVALID_MEDIA_TYPE: [415, 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE', `${err.message}. Registrations are application/json; engine output is text/plain.`],
    FST_ERR_CTP_INVALID_CONTENT_LENGTH: [400, 'NODECOMPUTE_BAD_REQUEST', 'The Content-Length header does not match the body that was sent.'],
    FST_ERR_CTP_EMPTY_JSON_BODY: [400, 'NODECOMPUTE_BAD_REQUEST', 'The JSON body is empty. Send a JSON object (see /docs).'],
    FST_ERR_BAD_URL: [400, 'NODECOMPUTE_BAD_REQUEST', `${err.message}: the URL is not validly percent-encoded.`],
    FST_ERR_MAX_PARAM_LENGTH: [400, 'NODECOMPUTE_BAD_REQUEST', 'A path segment is too long: shard ids are at most 128 characters.'],
  };
  const mapped = err.code ? known[err.code] : undefined;
  if (mapped) return errorBody(...mapped);
  if (status >= 400 && status < 500) {
    const where = `${request.method} ${request.url.split('?')[0]}`;
    const uncoded = UNCODED_CLIENT_ERRORS[status]?.(where, err.message);
    if (uncoded) return errorBody(status, uncoded.code, uncoded.message);
    return errorBody(status, codeOfStatus(status), `${where} was refused (${err.message}). Check it against the API at /docs and /openapi.json.`);
  }
  return null;
}

/**
 * Fastify's JSON parser says the same "not valid JSON" for a syntax error and for a "__proto__" key
 * it refuses: this says which, and for a syntax error where (JSON.parse's own words).
 */
function whyNotJson(err: FastifyError, body: string): Error {
  if (err.code !== 'FST_ERR_CTP_INVALID_JSON_BODY') return err;
  try {
    JSON.parse(body);
  } catch (syntax) {
    return new BadRequestError(`The body is not valid JSON: ${(syntax as Error).message}. Send one JSON object (see /docs).`);
  }
  return new BadRequestError(
    'The body has a "__proto__" key, which is refused: it could change the prototype of the objects it is read into. Remove it; no field of the API has that name.',
  );
}

/** Node's client errors that get an answer of their own, with the status Node itself would give them. */
const CLIENT_ERRORS: Record<string, { status: number; code: string; message: string }> = {
  HPE_HEADER_OVERFLOW: {
    status: 431,
    code: 'NODECOMPUTE_HEADERS_TOO_LARGE',
    message: 'The request headers are larger than this server accepts (16 KiB in all, Node\'s limit): send fewer or shorter headers.',
  },
  ERR_HTTP_REQUEST_TIMEOUT: {
    status: 408,
    code: 'NODECOMPUTE_REQUEST_TIMEOUT',
    message: 'The request was not completed within 30 s: send the whole body its Content-Length promised, or retry.',
  },
  HPE_INVALID_METHOD: {
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: 'The request method is not an HTTP method this server knows (methods are upper-case, such as GET or PUT). The API is listed at /docs and /openapi.json.',
  },
};

/** Malformed HTTP (a lying Content-Length, say) never reaches a route: answer it on the socket, coded. */
export function writeClientError(err: NodeJS.ErrnoException, socket: import('node:net').Socket): void {
  if (!socket.writable) return;
  const known = CLIENT_ERRORS[String(err.code)];
  const { status, code, message } = known ?? {
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: `The request is not valid HTTP (${err.code}): check Content-Length and Transfer-Encoding, and send the whole body.`,
  };
  const body = JSON.stringify(errorBody(status, code, message));
  socket.end(
    [`HTTP/1.1 ${status} ${STATUS_CODES[status]}`, 'Connection: close', 'Content-Type: application/json; charset=utf-8', `Content-Length: ${Buffer.byteLength(body)}`, '', body].join(
      '\r\n',
    ),
  );
}

/** While closing, how long a keep-alive connection may stay idle after its last answer. */
const CLOSING_KEEP_ALIVE_MS = 1;
/** While closing, how long an answer already ended may take to reach a slow reader (main.ts's grace is 10 s). */
const CLOSING_ANSWER_WAIT_MS = 5_000;

export async function buildApp(config: Config, deps: AppDeps = {}): Promise<App> {
  // First, so that V8 keeps process.nextTick on its fast path in this process (see tick-shape.ts).
  // Not awaited: the entry is held from the next tick on, and nothing here depends on it.
  void keepTickObjectShape();
  const log = deps.logger ?? pino({ level: config.logLevel });
  // Fastify gets no logger: given one, it builds a child logger for every request and attaches
  // response listeners to it, request logging off or not, which took 7 to 13% more CPU per probe in
  // interleaved A/Bs (Node 24). The service logs through `log` itself: failures in the error
  // handler (with the request id), answered requests only at debug level, and what Fastify itself
  // reports about failed answers through a LogController (fastify-log.ts).
  const app = Fastify({
    logController: new ServiceLogController(log),
    bodyLimit: 64 * 1024,
    forceCloseConnections: 'idle',
    // A request that arrives while the service stops (on a keep-alive connection whose request was in
    // flight) is answered as any other, with Connection: close, instead of Fastify's uncoded 503 that
    // says only "Service Unavailable": cached answers are still true, and what needs nvidia-smi gets
    // its coded 503 saying it was not run because nodecompute is shutting down.
    return503OnClosing: false,
    // A client that promises a body and stops sending must not hold a connection forever.
    requestTimeout: 30_000,
    // Ids may be 128 characters; a longer segment gets a coded 400 below, not the router's bare 414.
    routerOptions: { maxParamLength: 256 },
    frameworkErrors: (err, request, reply: FastifyReply) => {
      const body = fastifyErrorBody(err as FastifyError, request) ?? errorBody(400, 'NODECOMPUTE_BAD_REQUEST', err.message);
      void reply.status(body.statusCode).send(body);
    },
    clientErrorHandler: writeClientError,
    ajv: { customOptions: { removeAdditional: false, coerceTypes: false, allErrors: false } },
  }).withTypeProvider<TypeBoxTypeProvider>() as unknown as App;
  spareUnflushedAnswers(app.server, {
    maxWaitMs: CLOSING_ANSWER_WAIT_MS,
    onCut: (bytesLeft) =>
      log.warn(
        { bytesLeft },
        `Stopping: a client had not taken its whole answer ${CLOSING_ANSWER_WAIT_MS / 1000} s after shutdown began, so its connection was closed and the answer cut short. ` +
          'A client that reads this slowly is likely stuck; it should retry.',
      ),
  });

  const now = deps.now ?? Date.now;
  const metrics = createMetrics();
  const nvidiaSmi =
    deps.nvidiaSmi ??
    createNvidiaSmi({
      path: config.nvidiaSmi,
      timeoutMs: config.smiTimeoutMs,
      log: log.child({ component: 'nvidia-smi' }),
      onQuery: metrics.observeQuery,
    });
  const proc = deps.proc ?? createProcReader({ root: config.proc, log: log.child({ component: 'procfs' }) });
  const stateFile = deps.stateFile ?? createStateFile(config.stateFile, { log: log.child({ component: 'state-file' }), now, timeoutMs: config.stateTimeoutMs });
  const registry = await loadRegistry({ stateFile, log });
  const snapshots = createSnapshotSource<NodeSnapshot>({
    take: createSnapshotTaker({ nvidiaSmi, proc, log, interest: () => registry.interest(proc.bootId()), now }),
    ttlMs: config.cacheTtlMs,
    maxStaleMs: config.maxStaleMs,
    log,
    now,
  });
  const node = createNodeService(snapshots, registry, log);
  const shards = createShardService({ registry, node, proc, defaultGraceMs: config.gpuGraceMs, log, now });
  const services: Services = {
    config,
    node,
    shards,
    registry,
    nvidiaSmi,
    proc,
    stateFile,
    metrics,
    now,
    probeBudgetMs: Math.min(config.probeWaitMs, config.smiTimeoutMs),
    settingsWarnings: deps.settingsWarnings ?? [],
    ...createAuth(config, log, now, metrics.countRefusedWrite),
  };
  app.decorate('services', services);

  // A coded failure (nvidia-smi down, an unwritable state file) repeats on every request while it
  // lasts, and pollers ask every second: each distinct one is a warning at most once a minute, and
  // its repeats are debug lines.
  // Such a failure is expected, not a bug: its code and message say it all. pino's error serializer
  // would add "type":"Object" and an empty stack to them, so these lines get their own.
  const failureLog = log.child({}, { serializers: { err: (err: CodedError) => ({ code: err.code, message: err.message }) } });
  const failureLevel = createRepeatLimit(now);
  // A change refused because the state file cannot take it (the volume unwritable, or a write stuck on
  // one that does not answer, which refuses every other change at once) is refused again if retried
  // at once, and a controller's loop would spin on it. Such a write is given stateTimeoutMs before its
  // volume is taken for one that does not answer: a retry sooner most likely meets the same fault,
  // and one that waits this long (5 s by default) loses at most that much once the volume is back.
  const stateRetryAfter = Math.ceil(config.stateTimeoutMs / 1000);
  // Many HTTP clients send Content-Type: application/json on every request, and a DELETE carries no
  // body: that is no body, not an empty JSON document. Everything else is Fastify's own JSON parser,
  // with its defaults (a __proto__ key refused, constructor keys kept).
  const parseJson = app.getDefaultJsonParser('error', 'ignore');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    if (request.method === 'DELETE' && body === '') return done(null, undefined);
    return parseJson(request, body as string, (err, value) => done(err ? whyNotJson(err as FastifyError, body as string) : null, value));
  });
  app.setErrorHandler((err: FastifyError, request, reply) => {
    if (isCodedError(err)) {
      if (err.statusCode >= 500) {
        failureLog[failureLevel(`${err.code}: ${err.message}`)]({ ...requestFields(request), err }, 'Request failed');
      }
      // The snapshots' own failure, nvidia-smi's (not, say, the doctor's query): within its back-off
      // window nvidia-smi is not run again, so asking sooner gets this same answer; and its bus ids can be named.
      const snapshotFailure = err === node.snapshots.lastError;
      const stateFailure = err instanceof StateWriteFailedError || err instanceof StateWritePendingError;
      const retryAfter = retryAfterSeconds(node.snapshots, err) ?? (stateFailure ? stateRetryAfter : null);
      if (retryAfter !== null) void reply.header('retry-after', String(retryAfter));
      const message = snapshotFailure ? err.message + unreachableListedIn(err.message, node.unreachable()) : err.message;
      return reply.status(err.statusCode).send(errorBody(err.statusCode, err.code, message));
    }
    const mapped = fastifyErrorBody(err, request);
    if (mapped) {
      // Headers the error carries stay, as Fastify's own handler keeps them: the /docs files' 416
      // names the file's size (Content-Range: bytes */SIZE), which a client needs to ask again.
      const { headers } = err as { headers?: Record<string, string> };
      if (headers !== undefined) void reply.headers(headers);
      return reply.status(mapped.statusCode).send(mapped);
    }
    log.error({ ...requestFields(request), err }, 'Unexpected error while answering a request; this is a bug in nodecompute, please report it');
    const internal = new InternalError(
      'nodecompute hit an unexpected error while answering; the details are in its log. Retry; if it persists, report it with the log lines.',
    );
    return reply.status(500).send(errorBody(500, internal.code, internal.message));
  });
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?')[0]!;
    // A trailing slash is the likeliest slip: say the path it meant, where the router has a route for
    // it. findRoute matches a concrete path as a request would (hasRoute compares route patterns, and
    // so never knew /shards/s1/ready); every method finds one on a path that exists (405s included).
    // Not the /docs files' wildcard, which matches any path below it, files or not.
    const trimmed = path.slice(0, -1);
    const route = path.length > 1 && path.endsWith('/') ? app.findRoute({ method: request.method as 'GET', url: trimmed }) : null;
    const meant = route && !('*' in route.params) ? ` Did you mean ${trimmed}, without the trailing slash?` : '';
    const err = new NotFoundError(`No route ${request.method} ${path}.${meant} The API is listed at /docs and /openapi.json.`);
    return reply.status(404).send(errorBody(404, err.code, err.message));
  });
  // Probes arrive every few seconds from every pod: answered requests are logged at debug level only,
  // and below it not even the hook exists. A 503 verdict is an answer, not a failure: the shard
  // service logs each verdict change once, and failures log where they happen.
  if (log.isLevelEnabled('debug')) {
    app.addHook('onResponse', (request, reply, done) => {
      log.debug({ ...requestFields(request), statusCode: reply.statusCode, ms: Math.round(reply.elapsedTime) }, 'Request answered');
      done();
    });
  }

  registerSchemas(app);
  await app.register(swagger, {
    refResolver: { buildLocalReference: (json, _baseUri, _fragment, i) => (typeof json.$id === 'string' ? json.$id : `def-${i}`) },
    transformObject: (document) => completeOpenApi((document as { openapiObject: OpenAPIV3_1.Document }).openapiObject),
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'nodecompute',
        version: VERSION,
        description:
          'Where GPU work really runs on this node: GPUs and their processes, shards and the GPUs they hold, foreign memory, and readiness probes that catch a shard silently computing on the CPU.',
      },
      tags: [
        { name: 'gpus', description: 'GPUs and foreign memory' },
        { name: 'shards', description: 'Shard registration, compute and readiness' },
        { name: 'health', description: "nodecompute's own health" },
        { name: 'operators', description: 'Metrics, status page and doctor' },
      ],
    },
  });
  // Before the first route (/docs is one): a known path asked with another method is a 405.
  const addMethodNotAllowed = answerOtherMethods(app);
  await app.register(swaggerUi, { routePrefix: '/docs' });
  await app.register(healthRoutes);
  await app.register(gpusRoutes);
  await app.register(shardsRoutes);
  await app.register(doctorRoutes);
  await app.register(metricsRoutes);
  await app.register(openapiRoutes);
  await app.register(statusPageRoutes);
  addMethodNotAllowed();
  // preClose, not onClose: in-flight requests waiting on nvidia-smi must finish (with an error) for
  // close to complete, and their keep-alive connections must not hold the server open afterwards.
  app.addHook('preClose', async () => {
    // A request that sees its nvidia-smi killed knows why from nvidiaSmi.stopped (the doctor does).
    nvidiaSmi.killAll();
    // A keep-alive connection whose request was in flight goes idle after its answer, and Node would
    // keep it open for the keep-alive timeout (Fastify's 72 s). Node arms that timeout only once an
    // answer has been written out in full, so a short one closes such a connection right after its
    // last byte (Node 24 adds a 1 s buffer) and never cuts a body itself (nor does the idle sweep:
    // unflushed-answers.ts).
    app.server.keepAliveTimeout = CLOSING_KEEP_ALIVE_MS;
  });
  app.addHook('onClose', async () => {
    proc.release();
  });
  return app;
}
