// Owns GET /metrics, the Prometheus scrape. It reads the cached snapshot like every other answer,
// so a scrape never causes more nvidia-smi runs than the cache allows, and it answers (with
// nodecompute_nvidia_smi_up 0) even when nvidia-smi cannot be asked.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { verdictsTag } from './conditional.js';

const RENDER_REUSE_MS = 1000;

const metricsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, metrics, probeBudgetMs, registry, now } = app.services;
  let cached: { key: string; at: number; text: string } | null = null;
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
      const { states, view, node } = await shards.states(probeBudgetMs);
      const key = `${view?.observedAt ?? 'none'}-${registry.version}-${verdictsTag(states)}`;
      const at = now();
      // Rendering ~600 series costs milliseconds; scrapes that see the same snapshot, registry and
      // verdicts within a second share one rendering (process metrics are then up to 1 s old).
      if (!cached || cached.key !== key || at - cached.at >= RENDER_REUSE_MS) {
        const lastGood = app.services.node.peek();
        metrics.update({ node, ageMs: lastGood ? lastGood.view.ageMs : null, shards: states });
        cached = { key, at, text: await metrics.registry.metrics() };
      }
      return reply.type(metrics.registry.contentType).send(cached.text);
    },
  );
};

export default metricsRoutes;
