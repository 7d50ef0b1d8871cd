// Owns GET /, the status page: HTML for a browser, an aligned plain-text table for curl and
// terminals (curl's `*/*` gets text: only a client that prefers text/html over text/plain gets
// HTML). It answers from the same cached snapshot as every probe, within the probe budget, so
// opening or auto-reloading it never adds nvidia-smi runs, and it still answers when nvidia-smi
// cannot be asked (with a banner, each shard's verdict as readiness.ts gives it then, and, once the
// last good snapshot is past max-stale, when that one was taken and which GPUs it had lost).
import { hostname } from 'node:os';
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import Negotiator from 'negotiator';
import { setHtmlHeaders, STATUS_PAGE_CSP } from '../src/http/html-headers.js';
import { ErrorSchema, StringEnum } from '../src/schemas/common.js';
import { renderHtml } from '../src/status-page/html.js';
import { statusModel } from '../src/status-page/model.js';
import { renderText } from '../src/status-page/text.js';
import { VERSION } from '../src/version.js';

/** Only a client that prefers text/html strictly over text/plain (a browser) gets HTML; ties, no Accept, curl: text. */
export function prefersHtml(accept: string | undefined): boolean {
  return !!accept && new Negotiator({ headers: { accept } }).mediaType(['text/plain', 'text/html']) === 'text/html';
}

const statusPageRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, probeBudgetMs, now, config, node } = app.services;
  const host = hostname();
  app.get(
    '/',
    {
      schema: {
        operationId: 'getStatusPage',
        tags: ['operators'],
        summary: 'Status page: every GPU\'s memory split by shard, foreign and free, and every shard\'s state, reason and the GPUs it holds.',
        description:
          'HTML (reloading every 5 s, no script, no external asset) when the client prefers text/html, as browsers do; an aligned plain-text table otherwise (curl). `?format=html|text` overrides the Accept header. Answers from the cached snapshot; when the GPU driver cannot be asked it still answers 200 with a banner saying why.',
        querystring: Type.Object({
          format: Type.Optional(StringEnum(['html', 'text'], 'Force HTML or plain text regardless of Accept.')),
        }),
        produces: ['text/html', 'text/plain'],
        response: {
          200: {
            description: 'The status page.',
            content: {
              'text/html': { schema: Type.String({ description: 'A self-contained HTML page.' }) },
              'text/plain': { schema: Type.String({ description: 'The same as aligned plain text.' }) },
            },
          },
          // JSON whatever the page's types: `produces` would otherwise claim them for the error too.
          400: { description: 'A ?format other than html or text.', content: { 'application/json': { schema: ErrorSchema } } },
        },
      },
    },
    async (request, reply) => {
      const result = await shards.states(probeBudgetMs);
      // Without a snapshot to serve, the one cached (past max-stale) still dates the outage and names the lost GPUs: a look, not a run.
      const lastGood = result.view === null ? node.snapshots.peek() : null;
      const model = statusModel({ ...result, unreachable: node.unreachable(), lastGood, maxStaleMs: config.maxStaleMs, host, version: VERSION, now: now() });
      const html = request.query.format === undefined ? prefersHtml(request.headers.accept) : request.query.format === 'html';
      reply.header('vary', 'Accept').header('cache-control', 'no-store');
      setHtmlHeaders(reply, STATUS_PAGE_CSP);
      return reply.type(`${html ? 'text/html' : 'text/plain'}; charset=utf-8`).send(html ? renderHtml(model) : renderText(model));
    },
  );
};

export default statusPageRoutes;
