// Owns what the routes are given: createServices builds the readers and domain services from a
// Config (app.ts wires them into Fastify), and App is the typed Fastify instance they are registered
// on. Routes and HTTP plumbing import this, never app.ts.
import type { Server, IncomingMessage, ServerResponse } from 'node:http';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { FastifyBaseLogger, FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { createAuth } from './auth.js';
import type { Config } from './config.js';
import { createMetrics } from './metrics.js';
import { createNodeService } from './node-state/node-view.js';
import { createSnapshotTaker, type NodeSnapshot } from './node-state/node-snapshot.js';
import { createSnapshotSource } from './node-state/snapshot.js';
import { createShardService } from './shards/shard-service.js';
import { loadRegistry } from './shards/registry.js';
import { chooseDriver } from './system/driver-choice.js';
import type { GpuDriver } from './system/gpu-driver.js';
import { createModelFileReader } from './system/model-files.js';
import { createProcReader, type ProcReader } from './system/procfs.js';
import { createStateFile, type StateFile } from './system/state-file.js';

export interface AppDeps {
  logger?: Logger;
  now?: () => number;
  /** The GPU backend (default: as config.backend picks it). */
  driver?: GpuDriver;
  proc?: ProcReader;
  stateFile?: StateFile;
  /** The warnings the start logged about the settings, for the doctor's settings row. */
  settingsWarnings?: readonly string[];
  /** How long a request may take to arrive whole (default 30 s; tests shorten it). */
  requestTimeoutMs?: number;
}

/** How much longer than the driver's deadline a request with no budget of its own waits for a refresh. */
const REFRESH_SLACK_MS = 5_000;

export type Services = Awaited<ReturnType<typeof createServices>>;

export async function createServices(config: Config, deps: AppDeps, log: Logger) {
  const now = deps.now ?? Date.now;
  const metrics = createMetrics();
  const chosen = deps.driver ? { driver: deps.driver, why: 'given by the caller' } : await chooseDriver(config, log, metrics.observeQuery);
  const { driver } = chosen;
  metrics.setBackend(driver.backend);
  log.info({ backend: driver.backend, source: driver.source }, `GPU figures come from ${driver.backend} (${driver.source}): ${chosen.why}`);
  const proc = deps.proc ?? createProcReader({ root: config.proc, log: log.child({ component: 'procfs' }) });
  const stateFile = deps.stateFile ?? createStateFile(config.stateFile, { log: log.child({ component: 'state-file' }), now, timeoutMs: config.stateTimeoutMs });
  const registry = await loadRegistry({ stateFile, log });
  // One reader of model files for snapshots and the doctor: a read stuck on a process's maps is never started twice.
  const modelFiles = createModelFileReader(proc.root);
  const take = createSnapshotTaker({ driver, proc, modelFiles, log, interest: () => registry.interest(proc.bootId()), now });
  const snapshots = createSnapshotSource<NodeSnapshot>({ take, ttlMs: config.cacheTtlMs, maxStaleMs: config.maxStaleMs, log, now });
  // The driver's own deadline bounds its queries; the slack covers the /proc reads of a refresh.
  const node = createNodeService(snapshots, registry, log, config.smiTimeoutMs + REFRESH_SLACK_MS);
  const shards = createShardService({ registry, node, proc, defaultGraceMs: config.gpuGraceMs, log, now });
  return {
    config, node, shards, registry, driver, proc, modelFiles, stateFile, metrics, now,
    /** Why this backend serves (NODECOMPUTE_BACKEND, and what auto found): the log and the doctor say it. */
    driverWhy: chosen.why,
    /** Longest a probe waits for a refresh it needs: well inside Kubernetes' 1 s default. */
    probeBudgetMs: Math.min(config.probeWaitMs, config.smiTimeoutMs),
    /** The warnings the start logged about the settings: the doctor repeats them. */
    settingsWarnings: deps.settingsWarnings ?? [],
    // authorise: the onRequest hook of every write route; tokenFile: the doctor's look at the token file.
    ...createAuth(config, log, now, metrics.countRefusedWrite),
  };
}

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
  }
}

export type App = FastifyInstance<Server, IncomingMessage, ServerResponse, FastifyBaseLogger, TypeBoxTypeProvider>;
