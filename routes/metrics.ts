// Owns GET /metrics, the Prometheus scrape. It reads the cached snapshot like every other answer,
// so a scrape never causes more nvidia-smi runs than the cache allows, and it answers (with
// nodecompute_nvidia_smi_up 0) even when nvidia-smi cannot be asked.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';

const RENDER_REUSE_MS = 1000;

const metricsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, metrics, probeBudgetMs, registry, now } = app.services;
  const { snapshots } = app.services.node;
  let cached: { key: string; at: number; text: string } | null = null;
  /** What a rendering depends on besides time: the snapshot, the registry and the engine output. */
  const renderKey = () => `${snapshots.generation}-${registry.version}-${registry.engineVersion}`;
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
      // Rendering ~600 series costs milliseconds; scrapes within a second of the last rendering that
      // see the same snapshot and registry share it (verdicts and process metrics are then at most
      // 1 s old). Past that second, the scrape asks for the snapshot as any answer does.
      const at = now();
      if (!cached || cached.key !== renderKey() || at - cached.at >= RENDER_REUSE_MS) {
        const { states, node } = await shards.states(probeBudgetMs);
        const lastGood = app.services.node.peek();
        metrics.update({ node, ageMs: lastGood ? lastGood.view.ageMs : null, shards: states });
        // Keyed after the wait: the refresh it may have waited for is what was rendered.
        cached = { key: renderKey(), at, text: await metrics.registry.metrics() };
      }
      return reply.type(metrics.registry.contentType).send(cached.text);
    },
  );
};

export default metricsRoutes;
