// The composition of the service: builds the readers and domain services from a Config and wires
// them into Fastify with one error shape, one auth rule, the routes and their 405s. It never
// listens (main.ts does); tests pass `deps` to swap the clock, the logger or a reader.
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Fastify, { LogController, type FastifyReply } from 'fastify';
import { pino, type Logger } from 'pino';
import type { OpenAPIV3_1 } from 'openapi-types';
import { createAuth } from './auth.js';
import type { Config } from './config.js';
import { handleErrors } from './http/error-handler.js';
import { fastifyErrorBody, errorBody, writeClientError } from './http/errors.js';
import { DOCS_CSP, setHtmlHeaders } from './http/html-headers.js';
import { answerOtherMethods } from './http/method-not-allowed.js';
import { createMetrics } from './metrics.js';
import { createNodeService } from './node-state/node-service.js';
import { createSnapshotTaker, type NodeSnapshot } from './node-state/node-snapshot.js';
import { createSnapshotSource } from './node-state/snapshot.js';
import { completeOpenApi } from './openapi-document.js';
import type { App, Services } from './services.js';
import { createShardService } from './shards/shard-service.js';
import { loadRegistry } from './shards/registry.js';
import { chooseDriver } from './system/driver-choice.js';
import type { GpuDriver } from './system/gpu-driver.js';
import { createProcReader, type ProcReader } from './system/procfs.js';
import { createStateFile, type StateFile } from './system/state-file.js';
import { registerSchemas } from './schemas/index.js';
import { VERSION } from './version.js';
import doctorRoutes from '../routes/doctor.js';
import gpusRoutes from '../routes/gpus.js';
import healthRoutes from '../routes/health.js';
import metricsRoutes from '../routes/metrics.js';
import openapiRoutes from '../routes/openapi.js';
import shardsRoutes from '../routes/shards.js';
import statusPageRoutes from '../routes/status-page.js';

export type { App, Services } from './services.js';

export interface AppDeps {
  logger?: Logger;
  now?: () => number;
  /** The GPU backend (default: as config.backend picks it). */
  driver?: GpuDriver;
  proc?: ProcReader;
  stateFile?: StateFile;
  /** The warnings the start logged about the settings, for the doctor's settings row. */
  settingsWarnings?: readonly string[];
}

/** While closing, how long a keep-alive connection may idle after its last answer (Fastify's default is 72 s). */
const CLOSING_KEEP_ALIVE_MS = 1;

async function createServices(config: Config, deps: AppDeps, log: Logger): Promise<Services> {
  const now = deps.now ?? Date.now;
  const metrics = createMetrics();
  const chosen = deps.driver ? { driver: deps.driver, why: 'given by the caller' } : await chooseDriver(config, log, metrics.observeQuery);
  const { driver } = chosen;
  metrics.setBackend(driver.backend);
  log.info({ backend: driver.backend, source: driver.source }, `GPU figures come from ${driver.backend} (${driver.source}): ${chosen.why}`);
  const proc = deps.proc ?? createProcReader({ root: config.proc, log: log.child({ component: 'procfs' }) });
  const stateFile = deps.stateFile ?? createStateFile(config.stateFile, { log: log.child({ component: 'state-file' }), now, timeoutMs: config.stateTimeoutMs });
  const registry = await loadRegistry({ stateFile, log });
  const take = createSnapshotTaker({ driver, proc, log, interest: () => registry.interest(proc.bootId()), now });
  const snapshots = createSnapshotSource<NodeSnapshot>({ take, ttlMs: config.cacheTtlMs, maxStaleMs: config.maxStaleMs, log, now });
  const node = createNodeService(snapshots, registry, log);
  const shards = createShardService({ registry, node, proc, defaultGraceMs: config.gpuGraceMs, log, now });
  return {
    config, node, shards, registry, driver, driverWhy: chosen.why, proc, stateFile, metrics, now,
    probeBudgetMs: Math.min(config.probeWaitMs, config.smiTimeoutMs),
    settingsWarnings: deps.settingsWarnings ?? [],
    ...createAuth(config, log, now, metrics.countRefusedWrite),
  };
}

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
  const app = Fastify({
    loggerInstance: log,
    // Probes come every few seconds from every pod: answered requests are logged at debug level only.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: 64 * 1024,
    forceCloseConnections: 'idle',
    // A request that arrives while stopping is answered as any other (with Connection: close), not an uncoded 503.
    return503OnClosing: false,
    // A client that promises a body and stops sending must not hold a connection forever.
    requestTimeout: 30_000,
    // Ids may be 128 characters; a longer segment gets a coded 400, not the router's bare 414.
    routerOptions: { maxParamLength: 256 },
    frameworkErrors: (err, request, reply: FastifyReply) => {
      const body = fastifyErrorBody(err, request) ?? errorBody(400, 'NODECOMPUTE_BAD_REQUEST', err.message);
      void reply.status(body.statusCode).send(body);
    },
    clientErrorHandler: writeClientError,
    ajv: { customOptions: { removeAdditional: false, coerceTypes: false, allErrors: false } },
  }).withTypeProvider<TypeBoxTypeProvider>() as unknown as App;

  const services = await createServices(config, deps, log);
  app.decorate('services', services);
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
