// Owns nodecompute's own health: /livez (and /healthz) say the event loop runs and never depend on
// nvidia-smi; /readyz says whether the service can answer, from the cached snapshot within the probe
// budget, with a Kubernetes-style checklist on ?verbose.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { isCodedError } from '../src/errors.js';
import { ErrorSchema } from '../src/schemas/common.js';

const LiveSchema = Type.Object({ status: Type.Literal('ok', { description: 'Always ok while the process answers.' }) });
const ReadySchema = Type.Object({
  status: Type.Literal('ok', { description: 'ok: nvidia-smi answers and its PIDs are visible in /proc.' }),
  observedAt: Type.String({ format: 'date-time', description: 'When the snapshot behind this answer was taken.' }),
  ageMs: Type.Integer({ description: 'Its age in milliseconds.' }),
  stale: Type.Boolean({ description: 'True when it is older than the TTL.' }),
});

type Check = { name: string; detail: string } & ({ ok: true } | { ok: false; code: string });
type FailedCheck = Extract<Check, { ok: false }>;

const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { node, probeBudgetMs } = app.services;
  const live = {
    schema: {
      tags: ['health'],
      summary: 'Liveness: 200 while the event loop runs; never depends on nvidia-smi.',
      response: { 200: LiveSchema },
    },
  } as const;
  app.get('/livez', live, async () => ({ status: 'ok' as const }));
  app.get('/healthz', { ...live, schema: { ...live.schema, summary: 'Same as /livez.' } }, async () => ({ status: 'ok' as const }));

  async function checks(): Promise<{ checks: Check[]; meta: { observedAt: string; ageMs: number; stale: boolean } | null }> {
    try {
      const { view, node: nodeView } = await node.current({ maxWaitMs: probeBudgetMs });
      const stale = view.stale ? ` (stale: ${view.staleReason})` : '';
      return {
        checks: [
          { name: 'nvidia-smi', ok: true, detail: `snapshot ${Math.round(view.ageMs)} ms old, ${nodeView.snapshot.gpus.length} GPUs${stale}` },
          nodeView.processesHidden !== null
            ? { name: 'host-pid-namespace', ok: false, detail: nodeView.processesHidden, code: 'NODECOMPUTE_PID_NAMESPACE' }
            : { name: 'host-pid-namespace', ok: true, detail: 'the PIDs nvidia-smi lists are visible in /proc' },
        ],
        meta: { observedAt: new Date(view.observedAt).toISOString(), ageMs: Math.round(view.ageMs), stale: view.stale },
      };
    } catch (err) {
      if (!isCodedError(err)) throw err;
      return { checks: [{ name: 'nvidia-smi', ok: false, detail: err.message, code: err.code }], meta: null };
    }
  }

  app.get(
    '/readyz',
    {
      schema: {
        tags: ['health'],
        summary: 'Readiness: 200 when nvidia-smi answers (from the cache) and its PIDs are visible; 503 with the reason otherwise.',
        description: 'With ?verbose, a plain-text checklist in the style of Kubernetes\' own /readyz?verbose.',
        querystring: Type.Object({ verbose: Type.Optional(Type.String({ description: 'Present (any value) for the plain-text checklist.' })) }),
        response: {
          200: { content: { 'application/json': { schema: ReadySchema }, 'text/plain': { schema: Type.String({ description: 'The checklist (?verbose).' }) } } },
          503: { content: { 'application/json': { schema: ErrorSchema }, 'text/plain': { schema: Type.String({ description: 'The checklist (?verbose).' }) } } },
        },
      },
    },
    async (request, reply) => {
      const result = await checks();
      const failed = result.checks.find((check): check is FailedCheck => !check.ok);
      if (request.query.verbose !== undefined) {
        const lines = result.checks.map((check) => (check.ok ? `[+]${check.name} ok: ${check.detail}` : `[-]${check.name} failed: ${check.detail}`));
        lines.push(failed ? 'readyz check failed' : 'readyz check passed');
        return reply.status(failed ? 503 : 200).type('text/plain; charset=utf-8').send(`${lines.join('\n')}\n`);
      }
      if (failed) {
        return reply.status(503).send({ statusCode: 503, code: failed.code, error: 'Service Unavailable', message: failed.detail });
      }
      // Every check passed, so the snapshot they read is there.
      return { status: 'ok' as const, ...result.meta! };
    },
  );
};

export default healthRoutes;
