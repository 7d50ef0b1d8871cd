// Owns the shape of what the routes are given: the services buildApp composes (app.ts) and the typed
// Fastify instance they are registered on. Routes and HTTP plumbing import this, never app.ts.
import type { Server, IncomingMessage, ServerResponse } from 'node:http';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { FastifyBaseLogger, FastifyInstance } from 'fastify';
import type { Auth } from './auth.js';
import type { Config } from './config.js';
import type { Metrics } from './metrics.js';
import type { NodeService } from './node-state/node-service.js';
import type { Registry } from './shards/registry.js';
import type { ShardService } from './shards/shard-service.js';
import type { GpuDriver } from './system/gpu-driver.js';
import type { ProcReader } from './system/procfs.js';
import type { StateFile } from './system/state-file.js';

export interface Services {
  config: Config;
  node: NodeService;
  shards: ShardService;
  registry: Registry;
  driver: GpuDriver;
  /** Why this backend serves (NODECOMPUTE_BACKEND, and what auto found): the log and the doctor say it. */
  driverWhy: string;
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

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
  }
}

export type App = FastifyInstance<Server, IncomingMessage, ServerResponse, FastifyBaseLogger, TypeBoxTypeProvider>;
