// Owns the list of components: the schemas with an `$id` that the OpenAPI document names once,
// under components/schemas, and every other schema names by reference (Ref in common.ts). Fastify
// must know each before a route names it: fast-json-stringify follows the references to them, and
// @fastify/swagger writes them out in this order.
import type { TSchema } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import * as common from './common.js';
import * as gpus from './gpus.js';
import * as shards from './shards.js';

export const COMPONENTS: readonly TSchema[] = [
  common.ErrorComponent,
  common.SnapshotMetaComponent,
  gpus.GpuComponent,
  gpus.GpuProcessComponent,
  gpus.GpuUnreachableComponent,
  gpus.GpuEventsComponent,
  gpus.MigDeviceComponent,
  gpus.LostGpuComponent,
  gpus.LostGpusComponent,
  shards.ForeignMemoryGpuComponent,
  shards.ShardRecordComponent,
  shards.ShardStatusComponent,
  shards.ShardSnapshotComponent,
  shards.ReadinessComponent,
  shards.ReadinessProbeComponent,
  shards.ShardComputeComponent,
  shards.ShardGpuUsageComponent,
  shards.ShardWeightsComponent,
  shards.ModelFileComponent,
  shards.EngineAccountComponent,
];

/** Adds every component to the app, once, before the routes that name them. */
export function registerSchemas(app: Pick<FastifyInstance, 'addSchema'>): void {
  for (const schema of COMPONENTS) app.addSchema(schema);
}
