// Owns the list of components: the schemas with an `$id` that the OpenAPI document names once,
// under components/schemas, and every other schema names by reference (Ref in common.ts). Fastify
// must know each before a route names it: fast-json-stringify follows the references to them, and
// @fastify/swagger writes them out in this order.
import type { TSchema } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { ErrorComponent, SnapshotMetaComponent } from './common.js';
import { GpuComponent, GpuEventsComponent, GpuProcessComponent, GpuUnreachableComponent, LostGpuComponent, LostGpusComponent, MigDeviceComponent } from './gpus.js';
import {
  EngineAccountComponent,
  ForeignMemoryGpuComponent,
  ModelFileComponent,
  ReadinessComponent,
  ReadinessProbeComponent,
  ShardComputeComponent,
  ShardGpuUsageComponent,
  ShardRecordComponent,
  ShardSnapshotComponent,
  ShardStatusComponent,
  ShardWeightsComponent,
} from './shards.js';

export const COMPONENTS: readonly TSchema[] = [
  ErrorComponent,
  SnapshotMetaComponent,
  GpuComponent,
  GpuProcessComponent,
  GpuUnreachableComponent,
  GpuEventsComponent,
  MigDeviceComponent,
  LostGpuComponent,
  LostGpusComponent,
  ForeignMemoryGpuComponent,
  ShardRecordComponent,
  ShardStatusComponent,
  ShardSnapshotComponent,
  ReadinessComponent,
  ReadinessProbeComponent,
  ShardComputeComponent,
  ShardGpuUsageComponent,
  ShardWeightsComponent,
  ModelFileComponent,
  EngineAccountComponent,
];

/** Adds every component to the app, once, before the routes that name them. */
export function registerSchemas(app: Pick<FastifyInstance, 'addSchema'>): void {
  for (const schema of COMPONENTS) app.addSchema(schema);
}
