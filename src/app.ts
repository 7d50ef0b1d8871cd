// The composition of the service: wires the services (services.ts builds them from a Config) into
// Fastify with one error shape, one auth rule, the routes and their 405s. It never listens
// (main.ts does); tests pass `deps` to swap the clock, the logger or a reader. openapi.yaml is
// generated from the same app, so the file equals what /openapi.json serves.
import type { Socket } from 'node:net';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Fastify, { LogController, type FastifyReply } from 'fastify';
import { pino } from 'pino';
import type { OpenAPIV3_1 } from 'openapi-types';
import { defaultConfig, type Config } from './config.js';
import { handleErrors } from './http/error-handler.js';
import { fastifyErrorBody, errorBody, writeClientError } from './http/errors.js';
import { DOCS_CSP, setHtmlHeaders } from './http/html-headers.js';
import { requireOneHost } from './http/host-header.js';
import { answerOtherMethods } from './http/method-not-allowed.js';
import { completeOpenApi } from './openapi-document.js';
import { createServices, type App, type AppDeps } from './services.js';
import { registerSchemas } from './schemas/index.js';
import { VERSION } from './version.js';
import doctorRoutes from '../routes/doctor.js';
import gpusRoutes from '../routes/gpus.js';
import healthRoutes from '../routes/health.js';
import metricsRoutes from '../routes/metrics.js';
import openapiRoutes from '../routes/openapi.js';
import shardsRoutes from '../routes/shards.js';
import statusPageRoutes from '../routes/status-page.js';

export type { App, AppDeps, Services } from './services.js';

/** How long a request may take to arrive whole, headers and body (http/errors.ts's 408 says so). */
const REQUEST_TIMEOUT_MS = 30_000;

/** While closing, how long a keep-alive connection may idle after its last answer (Fastify's default is 72 s). */
const CLOSING_KEEP_ALIVE_MS = 1;

async function registerOpenApi(app: App): Promise<void> {
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
}

export async function buildApp(config: Config, deps: AppDeps = {}): Promise<App> {
  const log = deps.logger ?? pino({ level: config.logLevel });
  const requestTimeoutMs = deps.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
  const app = Fastify({
    loggerInstance: log,
    // Probes come every few seconds from every pod: answered requests are logged at debug level only.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: 64 * 1024,
    forceCloseConnections: 'idle',
    // A request that arrives while stopping is answered as any other (with Connection: close), not an uncoded 503.
    return503OnClosing: false,
    // A client that stops sending its headers or the body it promised must not hold a connection
    // forever. Given to Node's server at its creation, as Node reads them then; checked every second
    // (Node's default, 30 s, answered a 30 s timeout after up to 60 s).
    requestTimeout: requestTimeoutMs,
    // requireHostHeader: false: http/host-header.ts answers a missing Host with a coded 400, not Node's empty one.
    http: { requestTimeout: requestTimeoutMs, headersTimeout: requestTimeoutMs, connectionsCheckingInterval: 1000, requireHostHeader: false },
    // Ids may be 128 characters; a longer segment gets a coded 400, not the router's bare 414.
    routerOptions: { maxParamLength: 256 },
    frameworkErrors: (err, request, reply: FastifyReply) => {
      const body = fastifyErrorBody(err, request) ?? errorBody(400, 'NODECOMPUTE_BAD_REQUEST', err.message);
      void reply.status(body.statusCode).send(body);
    },
    clientErrorHandler: writeClientError,
    ajv: { customOptions: { removeAdditional: false, coerceTypes: false, allErrors: false } },
  }).withTypeProvider<TypeBoxTypeProvider>() as unknown as App;

  // Node hands CONNECT to a 'connect' listener, and with none closes the socket unanswered.
  app.server.on('connect', (_request, socket: Socket) => writeClientError(Object.assign(new Error('CONNECT'), { code: 'CONNECT' }), socket));

  const services = await createServices(config, deps, log);
  app.decorate('services', services);
  // The Host check first: a request without exactly one Host is a 400 whatever its path (the 404's hook comes after).
  app.addHook('onRequest', requireOneHost);
  handleErrors(app, log);
  if (log.isLevelEnabled('debug')) {
    app.addHook('onResponse', async (request, reply) => {
      request.log.debug({ method: request.method, url: request.url, statusCode: reply.statusCode, ms: Math.round(reply.elapsedTime) }, 'Request answered');
    });
  }

  await registerOpenApi(app);
  // Before the first route (/docs is one): a known path asked with another method is a 405.
  const addMethodNotAllowed = answerOtherMethods(app);
  await app.register(async (docs) => {
    docs.addHook('onSend', async (_request, reply) => setHtmlHeaders(reply, DOCS_CSP));
    await docs.register(swaggerUi, { routePrefix: '/docs' });
  });
  for (const routes of [healthRoutes, gpusRoutes, shardsRoutes, doctorRoutes, metricsRoutes, openapiRoutes, statusPageRoutes]) await app.register(routes);
  addMethodNotAllowed();
  // preClose: requests waiting on nvidia-smi must finish (with an error) for close to complete.
  app.addHook('preClose', async () => {
    services.driver.killAll();
    app.server.keepAliveTimeout = CLOSING_KEEP_ALIVE_MS;
  });
  app.addHook('onClose', async () => services.proc.release());
  return app;
}

/** openapi.yaml as /openapi.json serves it, built without listening or touching nvidia-smi (`npm run openapi`). */
export async function generateOpenApiYaml(): Promise<string> {
  // The registry only reads its file at start; a path that does not exist means "no shards".
  const config = defaultConfig({ stateFile: '/nonexistent/nodecompute-openapi/shards.json', logLevel: 'silent' });
  const app = await buildApp(config, { logger: pino({ level: 'silent' }) });
  try {
    await app.ready();
    return app.swagger({ yaml: true });
  } finally {
    await app.close();
  }
}
