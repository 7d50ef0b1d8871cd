// Owns GET /metrics, the Prometheus scrape. It reads the cached snapshot like every other answer, so
// a scrape never adds nvidia-smi runs, and it answers (nodecompute_nvidia_smi_up 0) when nvidia-smi
// cannot be asked. It looks at the token file as a write does, so nodecompute_token_file_ok says
// within a scrape that a Secret was deleted or broken. Scrapes within a second that see the same
// snapshot and registry share one rendering.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';

const RENDER_REUSE_MS = 1000;

const metricsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, metrics, probeBudgetMs, registry, now } = app.services;
  const { snapshots } = app.services.node;
  /** What a rendering depends on besides time. */
  const inputs = () =>
    `${snapshots.generation} ${snapshots.peek()?.failing ?? false} ${registry.version} ${registry.engineVersion}`;
  let cached: { inputs: string; at: number; body: string } | null = null;
  const render = async (at: number): Promise<string> => {
    const [{ states, node }, tokenFile] = await Promise.all([shards.states(probeBudgetMs), app.services.tokenFile?.() ?? null]);
    const lastGood = app.services.node.peek();
    const nvidiaSmiUp = lastGood !== null && !lastGood.view.failing;
    const unreachable = app.services.node.unreachable().flatMap(({ listed }) => (listed === null ? [] : [listed]));
    const lostGpus = [...(lastGood?.view.snapshot.lostGpus ?? []), ...unreachable];
    metrics.update({ node, ageMs: lastGood ? lastGood.view.ageMs : null, nvidiaSmiUp, lostGpus, shards: states, tokenFile });
    // Keyed after the wait: the refresh it may have waited for is what was rendered.
    const body = await metrics.registry.metrics();
    cached = { inputs: inputs(), at, body };
    return body;
  };
  app.get(
    '/metrics',
    {
      schema: {
        operationId: 'getMetrics',
        tags: ['operators'],
        summary: 'Prometheus metrics: GPU memory (total, used, free, reserved, foreign), shard memory, readiness and state, GPU driver query timings and failures, process metrics.',
        produces: ['text/plain'],
        response: { 200: Type.String({ description: 'Prometheus text exposition format 0.0.4.' }) },
      },
    },
    async (_request, reply) => {
      const at = now();
      const reusable = cached !== null && at - cached.at < RENDER_REUSE_MS && cached.inputs === inputs();
      const body = reusable ? cached!.body : await render(at);
      return reply.type(metrics.registry.contentType).send(body);
    },
  );
};

export default metricsRoutes;
