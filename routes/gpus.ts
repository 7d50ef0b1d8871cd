// Owns the GPU resources: GET /gpus (every GPU, its memory and processes, each attributed to its
// shard) and GET /gpus/foreign-memory (per GPU, memory that is not a registered shard's); both name
// the GPUs lost since nodecompute started, and mark those nvidia-smi has said since that it cannot reach.
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Current } from '../src/node-state/node-service.js';
import { foreignMemory } from '../src/node-state/foreign-memory.js';
import { gpusResponse, lostGpusJson, unreachableSaid } from '../src/node-state/node-view.js';
import { errorResponses } from '../src/schemas/common.js';
import { GpusResponseSchema } from '../src/schemas/gpus.js';
import { ForeignMemoryResponseSchema } from '../src/schemas/shards.js';
import { conditional } from './conditional.js';
import { createSnapshotJson, type SnapshotJson } from './snapshot-json.js';

const gpusRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { node } = app.services;
  const sendGpus = createSnapshotJson(gpusResponse);
  const sendForeign = createSnapshotJson((current, unreachable) => ({
    gpus: foreignMemory(current).map((gpu) => ({ ...gpu, unreachable: unreachableSaid(gpu.uuid, unreachable) })),
    lostGpus: lostGpusJson(current),
  }));
  /** A handler that answers at once from a cached snapshot, and waits (a promise) only when it must. */
  const answer = (json: SnapshotJson) => (request: FastifyRequest, reply: FastifyReply) => {
    const respond = (current: Current) => {
      const unreachable = node.unreachable();
      if (conditional(app.services, request, reply, current.view, json.tag(current.node, unreachable))) void reply.status(304).send();
      else json.send(reply, current.view, current.node, unreachable);
    };
    const now = node.available();
    if (now) return respond(now);
    // Otherwise answered when the refresh lands: the handler returns nothing, so Fastify waits for
    // reply.send (no promise of ours for Fastify to send a second time).
    node.current().then(respond, (err: Error) => void reply.send(err));
  };
  app.get(
    '/gpus',
    {
      schema: {
        operationId: 'listGpus',
        tags: ['gpus'],
        summary: 'Every GPU of this node, its memory, and the compute processes on it with the shard each belongs to.',
        response: { 200: GpusResponseSchema, 304: {}, ...errorResponses(503) },
      },
    },
    answer(sendGpus),
  );
  app.get(
    '/gpus/foreign-memory',
    {
      schema: {
        operationId: 'getForeignMemory',
        tags: ['gpus'],
        summary: 'Per GPU, the memory held by anything that is not a registered shard: what placement must not hand out.',
        response: { 200: ForeignMemoryResponseSchema, 304: {}, ...errorResponses(503) },
      },
    },
    answer(sendForeign),
  );
};

export default gpusRoutes;
