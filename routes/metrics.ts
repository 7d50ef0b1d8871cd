// Owns GET /metrics, the Prometheus scrape. It reads the cached snapshot like every other answer,
// so a scrape never causes more nvidia-smi runs than the cache allows, and it answers (with
// nodecompute_nvidia_smi_up 0) even when nvidia-smi cannot be asked. A rendering also looks at the
// token file as a write does (at most once a second, waiting 1 s at most for a hung mount), so
// nodecompute_token_file_ok says within a scrape that a Secret was deleted or broken.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { sendLateError } from './late-error.js';

const RENDER_REUSE_MS = 1000;

const metricsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, metrics, probeBudgetMs, registry, now } = app.services;
  const { snapshots } = app.services.node;
  /**
   * What a rendering depends on besides time (the snapshot, the registry and the engine output),
   * and the rendering, encoded once: scrapes that share it only write bytes.
   */
  let cached: { generation: number; failing: boolean; version: number; engineVersion: number; at: number; body: Buffer } | null = null;
  const failing = () => snapshots.peek()?.failing ?? false;
  const reusable = (at: number) =>
    cached !== null &&
    at - cached.at < RENDER_REUSE_MS &&
    cached.generation === snapshots.generation &&
    cached.failing === failing() &&
    cached.version === registry.version &&
    cached.engineVersion === registry.engineVersion;
  const render = async (at: number): Promise<Buffer> => {
    const [{ states, node }, tokenFile] = await Promise.all([shards.states(probeBudgetMs), app.services.tokenFile?.() ?? null]);
    const lastGood = app.services.node.peek();
    const nvidiaSmiUp = lastGood !== null && !lastGood.view.failing;
    const unreachable = app.services.node.unreachable().flatMap(({ listed }) => (listed === null ? [] : [listed]));
    const lostGpus = [...(lastGood?.view.snapshot.lostGpus ?? []), ...unreachable];
    metrics.update({ node, ageMs: lastGood ? lastGood.view.ageMs : null, nvidiaSmiUp, lostGpus, shards: states, tokenFile });
    // Keyed after the wait: the refresh it may have waited for is what was rendered.
    const body = Buffer.from(await metrics.registry.metrics());
    cached = { generation: snapshots.generation, failing: failing(), version: registry.version, engineVersion: registry.engineVersion, at, body };
    return body;
  };
  app.get(
    '/metrics',
    {
      schema: {
        operationId: 'getMetrics',
        tags: ['operators'],
        summary: 'Prometheus metrics: GPU memory (total, used, free, reserved, foreign), shard memory, readiness and state, nvidia-smi timings and failures, process metrics.',
        produces: ['text/plain'],
        response: { 200: Type.String({ description: 'Prometheus text exposition format 0.0.4.' }) },
      },
    },
    // Not async: a scrape the last rendering can answer is sent at once, without a promise between.
    // Rendering ~600 series costs milliseconds; scrapes within a second of the last rendering that
    // see the same snapshot and registry share it (verdicts and process metrics are then at most
    // 1 s old). Past that second, the scrape asks for the snapshot as any answer does.
    // The reply is typed loosely: the schema's string is what the cached bytes are.
    (_request: FastifyRequest, reply: FastifyReply) => {
      const at = now();
      if (reusable(at)) return void reply.type(metrics.registry.contentType).send(cached!.body);
      render(at).then(
        (body) => reply.type(metrics.registry.contentType).send(body),
        (err: Error) => sendLateError(reply, err),
      );
    },
  );
};

export default metricsRoutes;
