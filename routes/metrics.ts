// Owns GET /metrics, the Prometheus scrape. It reads the cached snapshot like every other answer,
// so a scrape never causes more nvidia-smi runs than the cache allows, and it answers (with
// nodecompute_nvidia_smi_up 0) even when nvidia-smi cannot be asked.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';

const metricsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, metrics, probeBudgetMs } = app.services;
  app.get(
    '/metrics',
    {
      schema: {
        tags: ['operators'],
        summary: 'Prometheus metrics: GPU memory (total, used, free, reserved, foreign), shard memory, readiness and state, nvidia-smi timings and failures, process metrics.',
        produces: ['text/plain'],
        response: { 200: Type.String({ description: 'Prometheus text exposition format 0.0.4.' }) },
      },
    },
    async (_request, reply) => {
      const { states, node } = await shards.states(probeBudgetMs);
      const lastGood = app.services.node.peek();
      metrics.update({ node, ageMs: lastGood ? lastGood.view.ageMs : null, shards: states });
      return reply.type(metrics.registry.contentType).send(await metrics.registry.metrics());
    },
  );
};

export default metricsRoutes;
