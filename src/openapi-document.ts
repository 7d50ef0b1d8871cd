// What the route schemas cannot say in the OpenAPI document, added once it is built: the bearer
// token of writes, the conditional-GET and write-precondition headers and the Retry-After of 503s (as route schemas,
// Fastify would validate headers on every probe), and the body of a route that reads it as bytes (as
// a route schema, Fastify would refuse bytes as not a string). Each shared one is written once, under
// components, named by $ref; every object is made afresh, as a shared one would come out as YAML anchors.
import type { OpenAPIV3_1 } from 'openapi-types';
import { ErrorComponent } from './schemas/common.js';
import { EngineOutputBodySchema } from './schemas/shards.js';

const BEARER_SCHEME: OpenAPIV3_1.HttpSecurityScheme = {
  type: 'http',
  scheme: 'bearer',
  description:
    'The token of NODECOMPUTE_TOKEN or one of NODECOMPUTE_TOKEN_FILE (re-read when the file changes). With no token configured, writes are accepted from loopback only.',
};

/** An optional request header, as a parameter under components.parameters. */
function headerParameter(name: string, schema: OpenAPIV3_1.ParameterObject['schema'], description: string): OpenAPIV3_1.ParameterObject {
  return { name, in: 'header', required: false, description, schema };
}

const IF_NONE_MATCH = headerParameter('If-None-Match', { type: 'string' }, 'The ETag of an earlier answer: 304 with no body while it is still current.');

/** The preconditions of a write (the operations that can answer 412), by name under components.parameters. */
const WRITE_PRECONDITIONS: Record<string, OpenAPIV3_1.ParameterObject> = {
  IfMatch: headerParameter(
    'If-Match',
    { type: 'string' },
    '"*": only while the shard is registered (else 412). Entity tags: always 412, as shard ETags are weak and If-Match never matches a weak tag.',
  ),
  IfNoneMatchWrite: headerParameter(
    'If-None-Match',
    { type: 'string', enum: ['*'] },
    '"*" only: only while the shard is not registered (else 412), so that a PUT registers and never replaces. Tags are refused (400).',
  ),
};

/** The headers of components.headers, by name there. */
const HEADERS = {
  ETag: {
    description:
      "A weak tag: a digest of what the answer says (every GPU's memory and processes with their shards; for /shards, the registrations, verdicts with their reasons and warnings, what each shard holds and the engine's account), " +
      'not of when it was observed, so it stays the same across snapshots while the node says the same; a suffix marks an answer served while the GPU driver fails or is far slower than usual. Send it back in If-None-Match.',
    schema: { type: 'string' },
  },
  CacheControl: { description: "max-age: the snapshot's remaining freshness in seconds (0 once it is stale).", schema: { type: 'string' } },
  NvidiaSmiRetryAfter: {
    description:
      'With a GPU driver failure that nodecompute is waiting out before it asks the driver again (one TTL after a failure, doubling with each failure in a row up to 30 s): the seconds left. Asking sooner gets the same answer, unless a shard registration or removal comes first (it makes the next request try at once). Absent otherwise.',
    schema: { type: 'integer', minimum: 1 },
  },
  StateRetryAfter: {
    description:
      'With NODECOMPUTE_STATE_WRITE_FAILED or NODECOMPUTE_STATE_WRITE_PENDING: NODECOMPUTE_STATE_TIMEOUT_MS in whole seconds (5 by default), the time a write is given before its volume is taken for one that does not answer. ' +
      'While the state file cannot take a change, one retried sooner is most likely refused again (at once, while a write is stuck). Absent otherwise.',
    schema: { type: 'integer', minimum: 0 },
  },
} satisfies Record<string, OpenAPIV3_1.HeaderObject>;

/** The request bodies routes read as bytes, by operationId. */
const BYTE_BODIES: Record<string, OpenAPIV3_1.RequestBodyObject> = {
  postEngineOutput: { required: true, description: EngineOutputBodySchema.description, content: { 'text/plain': { schema: EngineOutputBodySchema } } },
};

const header = (name: keyof typeof HEADERS): OpenAPIV3_1.ReferenceObject => ({ $ref: `#/components/headers/${name}` });
const conditionalHeaders = () => ({ ETag: header('ETag'), 'Cache-Control': header('CacheControl') });

type Operation = OpenAPIV3_1.OperationObject;

const addParameters = (operation: Operation, names: string[]): void => {
  operation.parameters = [...(operation.parameters ?? []), ...names.map((name) => ({ $ref: `#/components/parameters/${name}` }))];
};

function completeOperation(path: string, method: string, operation: Operation): void {
  const write = ['put', 'post', 'delete'].includes(method);
  if (write) operation.security = [{ bearer: [] }];
  const bytes = BYTE_BODIES[operation.operationId!];
  if (bytes) operation.requestBody = structuredClone(bytes);
  const responses = operation.responses;
  // A read's 503 with the error body is an nvidia-smi failure, and so can /readyz's be (its checklist
  // is another body); a write's is the state file's.
  const unavailable = responses?.['503'] as OpenAPIV3_1.ResponseObject | undefined;
  const smiFailure = (method === 'get' && unavailable?.description === ErrorComponent.description) || path === '/readyz';
  if (unavailable && smiFailure) unavailable.headers = { 'Retry-After': header('NvidiaSmiRetryAfter') };
  if (unavailable && write) unavailable.headers = { 'Retry-After': header('StateRetryAfter') };
  if (responses?.['412']) addParameters(operation, Object.keys(WRITE_PRECONDITIONS));
  if (!responses?.['304']) return;
  addParameters(operation, ['IfNoneMatch']);
  responses['304'] = { description: 'Not Modified: the If-None-Match tag is current. No body.', headers: conditionalHeaders() };
  const ok = responses['200'] as OpenAPIV3_1.ResponseObject | undefined;
  if (ok) ok.headers = { ...ok.headers, ...conditionalHeaders() };
}

/** Adds the bearer scheme to every write, the conditional-GET headers to every answer that can be 304, the preconditions to every write that can be 412, Retry-After to the 503s that carry it, and the bodies read as bytes. */
export function completeOpenApi(document: OpenAPIV3_1.Document): OpenAPIV3_1.Document {
  document.components = {
    ...document.components,
    headers: structuredClone(HEADERS),
    parameters: { IfNoneMatch: structuredClone(IF_NONE_MATCH), ...structuredClone(WRITE_PRECONDITIONS) },
    securitySchemes: { ...document.components?.securitySchemes, bearer: BEARER_SCHEME },
  };
  // @fastify/swagger puts only operations, keyed by method, in each path item.
  for (const [path, item] of Object.entries(document.paths as Record<string, Record<string, Operation>>)) {
    for (const [method, operation] of Object.entries(item)) completeOperation(path, method, operation);
  }
  return document;
}
