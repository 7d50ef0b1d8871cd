// Owns the shard resources: registration (PUT/GET/DELETE /shards/:id, GET /shards), where a shard
// computes (/compute), its readiness probe (/ready) and the engine's output (/engine-output).
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { snapshotMeta } from '../src/node-state/node-view.js';
import type { SnapshotView } from '../src/node-state/snapshot.js';
import { errorResponses } from '../src/schemas/common.js';
import {
  ComputeResponseSchema,
  EngineOutputResponseSchema,
  ReadyResponseSchema,
  RegisterShardSchema,
  ShardListSchema,
  ShardParamsSchema,
  ShardRecordSchema,
  ShardResponseSchema,
} from '../src/schemas/shards.js';
import { shardBody, type ShardState } from '../src/shards/shard-service.js';
import { conditional, shardsTag, writePrecondition } from '../src/http/conditional.js';
import { requireContentType } from '../src/http/content-type.js';

/** Which snapshot a shard answer comes from; when there is none, why (nvidia-smi's failure). */
function snapshotHeader(view: SnapshotView<unknown> | null, error: string | null) {
  return view ? snapshotMeta(view) : { observedAt: null, ageMs: null, stale: true, staleReason: `no snapshot: ${error}` };
}

function statusBody(state: ShardState) {
  return { ...shardBody(state.shard), status: { ...state.readiness }, compute: state.compute };
}

function readyBody(state: ShardState) {
  return { shard: state.shard.id, ...state.readiness, observedAt: state.observedAt === null ? null : new Date(state.observedAt).toISOString() };
}

/** The most engine output one POST may carry. */
const ENGINE_OUTPUT_MAX_MIB = 1;

const shardsRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { shards, probeBudgetMs, authorise, stateFile } = app.services;
  // Engine output reaches its handler as bytes, read on each shard's stream (engine-output.ts): a
  // character a log shipper cut between two posts, decoded post by post, would be kept as two U+FFFD.
  app.removeContentTypeParser('text/plain');
  app.addContentTypeParser('text/plain', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));
  /** What a change's 503 means: the state file could not take it within its timeout (registry.ts). */
  const stateWriteAnswers =
    `503 NODECOMPUTE_STATE_WRITE_FAILED when the state file cannot be written (nothing was changed); 503 NODECOMPUTE_STATE_WRITE_PENDING when the change was not stored ${stateFile.timeoutMs / 1000} s ` +
    'after the request came (a slow volume, or one that does not answer): not acknowledged, yet it may still be stored once its write lands. Repeating the same request is safe either way (a repeated DELETE that answers 404 means the first one was stored).';

  app.put(
    '/shards/:id',
    {
      schema: {
        operationId: 'registerShard',
        tags: ['shards'],
        summary: 'Register (201) or replace (200) a shard: a PID (and its process group) or a cgroup, placed on some GPUs.',
        description:
          'Needs "Authorization: Bearer <token>" when a token is configured; loopback only otherwise. Stored durably before the answer. ' +
          'The body is UTF-8 JSON, sent as it is: a Content-Encoding other than identity (gzip, say) or a charset other than UTF-8 or US-ASCII is refused (415). ' +
          'A replacement for the same process (PID and start time, in the same boot of the node) or cgroup and the same GPUs keeps registeredAt, and so the grace clock; another target or other GPUs restart it. ' +
          'If-None-Match: * registers only a shard not yet registered, If-Match: * replaces only a registered one (412 otherwise, decided with the write). ' +
          '409 when another id already holds the same process or cgroup, a cgroup the process runs in, a process the cgroup holds, or, for a PID, a process it descends from or that descends from it (within 4 generations), a member of the process group it leads, or the leader of the group it is in (a PID shard\'s descendants and the group it leads are part of it). ' +
          stateWriteAnswers,
        params: ShardParamsSchema,
        body: RegisterShardSchema,
        response: {
          200: { ...ShardRecordSchema, description: 'Replaced: the shard as stored now.' },
          201: { ...ShardRecordSchema, description: 'Registered: the shard as stored.' },
          ...errorResponses(400, 401, 403, 409, 412, 413, 415, 422, 503),
        },
      },
      // Before the body is parsed: any other type, one the server has no parser for included, is told what to send.
      onRequest: [authorise, requireContentType('application/json', `curl -X PUT -H 'Content-Type: application/json' -d '{"pid": 1234, "gpus": [0]}' ...`)],
    },
    async (request, reply) => {
      const { created, shard } = await shards.register(request.params.id, request.body, writePrecondition(request, request.params.id));
      return reply.status(created ? 201 : 200).send(shardBody(shard));
    },
  );

  app.get(
    '/shards',
    {
      schema: {
        operationId: 'listShards',
        tags: ['shards'],
        summary: 'Every shard with its state, reason and compute, from one snapshot: what a control plane polls.',
        description: 'Carries an ETag; send it back in If-None-Match to get 304 until a registration, a verdict, the number of warnings, what a shard holds or the engine account changes, or the GPU driver starts failing (or becomes far slower than usual).',
        response: { 200: ShardListSchema, 304: {} },
      },
    },
    async (request, reply) => {
      const { states, view, error } = await shards.states(probeBudgetMs);
      if (view && conditional(app.services, request, reply, view, shardsTag(states))) return reply.status(304).send();
      return { ...snapshotHeader(view, error), shards: states.map(statusBody) };
    },
  );

  app.get(
    '/shards/:id',
    {
      schema: {
        operationId: 'getShard',
        tags: ['shards'],
        summary: 'One shard with its state, reason and compute, and the snapshot they come from (as in GET /shards).',
        description: 'Carries an ETag, as GET /shards does, for this shard alone.',
        params: ShardParamsSchema,
        response: { 200: ShardResponseSchema, 304: {}, ...errorResponses(400, 404) },
      },
    },
    async (request, reply) => {
      const { state, view, error } = await shards.state(request.params.id, probeBudgetMs);
      if (view && conditional(app.services, request, reply, view, shardsTag([state]))) return reply.status(304).send();
      return { ...statusBody(state), ...snapshotHeader(view, error) };
    },
  );

  app.delete(
    '/shards/:id',
    {
      schema: {
        operationId: 'deregisterShard',
        tags: ['shards'],
        summary: 'Remove a shard (204); its series and verdicts disappear.',
        description: `412 with If-None-Match: * or an If-Match naming tags (If-Match: * removes a registered shard); 404 for an id not registered, whatever If-Match or If-None-Match: * say. ${stateWriteAnswers}`,
        params: ShardParamsSchema,
        response: { 204: Type.Null({ description: 'Removed.' }), ...errorResponses(400, 401, 403, 404, 412, 503) },
      },
      onRequest: authorise,
    },
    async (request, reply) => {
      await shards.remove(request.params.id, writePrecondition(request, request.params.id));
      return reply.status(204).send(null);
    },
  );

  app.get(
    '/shards/:id/compute',
    {
      schema: {
        operationId: 'getShardCompute',
        tags: ['shards'],
        summary: 'Where the shard computes as the GPU driver sees it: the GPUs its processes hold memory on, strays, and the engine\'s own account.',
        params: ShardParamsSchema,
        response: { 200: ComputeResponseSchema, ...errorResponses(400, 404, 503) },
      },
    },
    async (request) => {
      const { view, compute } = await shards.compute(request.params.id);
      return { shard: request.params.id, ...snapshotMeta(view), ...compute };
    },
  );

  app.get(
    '/shards/:id/ready',
    {
      schema: {
        operationId: 'probeShardReadiness',
        tags: ['shards'],
        summary: 'Readiness probe: 200 when ready (or unverified: the GPU driver cannot be asked, and last saw it ready), 503 when starting, on-cpu, gpu-lost, stopped or exited.',
        description: 'Answers from the cached snapshot within a probe budget well under Kubernetes\' 1 s default timeout.',
        params: ShardParamsSchema,
        response: { 200: ReadyResponseSchema, 503: ReadyResponseSchema, ...errorResponses(400, 404) },
      },
    },
    async (request, reply) => {
      const state = await shards.probe(request.params.id, probeBudgetMs);
      return reply.status(state.readiness.ready ? 200 : 503).send(readyBody(state));
    },
  );

  app.post(
    '/shards/:id/engine-output',
    {
      bodyLimit: ENGINE_OUTPUT_MAX_MIB * 1024 * 1024,
      schema: {
        operationId: 'postEngineOutput',
        tags: ['shards'],
        summary: `Feed what the engine printed (text/plain, up to ${ENGINE_OUTPUT_MAX_MIB} MiB a call); answers the engine's account of where it computes.`,
        description:
          'A bounded tail is kept per shard. Posts are appended as one stream, as the engine wrote it: a post that does not end with a newline is continued by the next one, so post whole lines or the chunks of the log in order. ' +
          "Lines may keep the prefixes a log pipeline adds: Kubernetes' container log files (`<time> stderr F `), docker compose's `name-1  | `, journald, timestamps, ANSI colours. " +
          'For llama.cpp, an account that says CPU while the shard was given GPUs makes it on-cpu at once. ' +
          'The body is UTF-8 text, sent as it is: a Content-Encoding other than identity (gzip, say) or a charset other than UTF-8 or US-ASCII is refused (415), since it would be kept mangled. ' +
          'Posts are one stream of bytes: a character cut between two posts is read whole; bytes that are not UTF-8 are kept as U+FFFD, not refused.',
        // No body schema: Fastify would refuse the bytes as not a string. The OpenAPI document has it (openapi-document.ts).
        params: ShardParamsSchema,
        response: { 200: EngineOutputResponseSchema, ...errorResponses(400, 401, 403, 404, 413, 415) },
      },
      onRequest: [authorise, requireContentType('text/plain', "curl --data-binary @server.log -H 'Content-Type: text/plain' ...")],
    },
    async (request) => {
      // A Buffer from the parser above: requireContentType lets only text/plain through.
      const state = shards.appendEngineOutput(request.params.id, request.body as Buffer);
      return { shard: request.params.id, account: state.account, tailBytes: Buffer.byteLength(state.tail), note: state.note };
    },
  );
};

export default shardsRoutes;
