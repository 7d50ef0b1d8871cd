// Owns the GPU resources: GET /gpus (every GPU, its memory and processes, each attributed to its
// shard) and GET /gpus/foreign-memory (per GPU, memory that is not a registered shard's); both name
// the GPUs lost since nodecompute started, and mark those nvidia-smi has since said it cannot reach.
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { conditional, contentTag } from '../src/http/conditional.js';
import { foreignMemory } from '../src/node-state/foreign-memory.js';
import { gpusResponse, lostGpusJson, snapshotMeta, unreachableSaid, type NodeView } from '../src/node-state/node-view.js';
import type { UnreachableListedGpu } from '../src/node-state/placement.js';
import { errorResponses } from '../src/schemas/common.js';
import { GpusResponseSchema } from '../src/schemas/gpus.js';
import { ForeignMemoryResponseSchema } from '../src/schemas/shards.js';

type Unreachable = readonly UnreachableListedGpu[];
type Fields = Record<string, unknown>;

const gpusRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { node } = app.services;
  // A handler: the body's fields after the snapshot header, with their ETag content, are derived once
  // per node view and unreachable GPUs.
  const answer = (build: (node: NodeView, unreachable: Unreachable) => Fields) => {
    const derived = new WeakMap<NodeView, { unreachable: Unreachable; fields: Fields; tag: string }>();
    return async (request: FastifyRequest, reply: FastifyReply) => {
      const current = await node.current();
      const unreachable = node.unreachable();
      let entry = derived.get(current.node);
      if (entry?.unreachable !== unreachable) {
        const fields = build(current.node, unreachable);
        entry = { unreachable, fields, tag: contentTag(fields) };
        derived.set(current.node, entry);
      }
      if (conditional(app.services, request, reply, current.view, entry.tag)) return reply.status(304).send();
      return { ...snapshotMeta(current.view), ...entry.fields };
    };
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
    answer(gpusResponse),
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
    answer((current, unreachable) => ({
      gpus: foreignMemory(current).map((gpu) => ({ ...gpu, unreachable: unreachableSaid(gpu.uuid, unreachable) })),
      lostGpus: lostGpusJson(current),
    })),
  );
};

export default gpusRoutes;
