// Owns how every failure is answered: one body shape, { statusCode, code, error, message }, with a
// stable NODECOMPUTE_* code and a message that says what to do. Coded errors keep their own;
// Fastify's and Node's (validation, body limits, malformed HTTP) are mapped onto codes here, and
// anything else is a logged 500 that never leaks a stack.
import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyError } from 'fastify';
import { BadRequestError } from '../errors.js';

export function errorBody(statusCode: number, code: string, message: string) {
  return { statusCode, code, error: String(STATUS_CODES[statusCode]), message };
}

/** What a field takes, said after the schema's complaint, by field and failing keyword. */
const FIELD_RULES: Record<string, string> = {
  'params/id minLength': 'the id is empty: a shard id goes between "/shards/" and the next "/"; GET /shards, without the trailing slash, lists them',
  'params/id pattern': 'a shard id is 1 to 128 letters, digits, ".", "_" or "-", starting with a letter or digit',
  'body/pid type': 'the host PID of the shard\'s main process; to register a cgroup instead, leave "pid" out or null',
  'body/cgroup type': 'a container id or pod UID; to register a PID instead, leave "cgroup" out or null',
  'body/migDevices minItems': 'leave "migDevices" out, or null, for a shard on whole GPUs',
  'body/cgroup pattern':
    'a container id, 12 to 64 hex digits as `docker ps --no-trunc` or `crictl ps` show it, or a pod UID like 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0 (its metadata.uid); ' +
    "it is matched inside /proc/PID/cgroup, so a looser string would claim other workloads' processes",
};

/** JSON types as Ajv names them ("integer,null" for a nullable field), in words. */
const TYPE_WORDS: Record<string, string> = { integer: 'a whole number', number: 'a number', string: 'a string', boolean: 'true or false', array: 'an array', object: 'an object' };

/** Names the offending field and what it accepts (Fastify stops at the first failing keyword). */
function describeValidation(err: FastifyError): string {
  const first = err.validation![0]!;
  const where = `${err.validationContext}${first.instancePath}`;
  const params = first.params as Record<string, unknown>;
  if (typeof params.additionalProperty === 'string') {
    return `${where} has an unknown field "${params.additionalProperty}" (fields are case-sensitive; remove it or fix its spelling)`;
  }
  if (Array.isArray(params.allowedValues)) return `${where} must be one of: ${params.allowedValues.join(', ')}`;
  if (first.keyword === 'uniqueItems') {
    const [earlier, later] = [Number(params.i), Number(params.j)].sort((a, b) => a - b);
    return `${where} must not list the same value twice: items ${earlier} and ${later} are equal (counting from 0)`;
  }
  const rule = FIELD_RULES[`${where} ${first.keyword}`];
  const types = first.keyword === 'type' ? String(params.type).split(',').map((type) => TYPE_WORDS[type] ?? type) : null;
  return `${where} ${types ? `must be ${types.join(' or ')}` : first.message}${rule ? ` (${rule})` : ''}`;
}

/** The messages of the 4xx that the /docs files' server raises without a code, by status; `where` is the method and path. */
const UNCODED_CLIENT_ERRORS: Record<number, (where: string, detail: string) => string> = {
  400: (where, detail) => `${where} is malformed (${detail}): a path may hold no NUL byte (%00), and its percent-encoding must be valid. Fix the URL.`,
  403: (where) => `${where} is refused: a path climbing out of its folder with ".." (encoded or not) is never served. Ask for the file by its own path.`,
  412: (where) => `${where}: the file is not the copy the If-Match or If-Unmodified-Since header names. Fetch it again without that header.`,
  416: (where) => `${where}: the Range header is not a bytes range within the file (bytes=FIRST-LAST, FIRST-, or -SUFFIX). Fetch it without Range, or within its Content-Length.`,
};

/** A Fastify error as a coded body; null for a 5xx, which is a bug of ours. */
export function fastifyErrorBody(err: FastifyError, request: { method: string; url: string }) {
  const status = err.statusCode ?? 500;
  if (err.validation) {
    return errorBody(400, 'NODECOMPUTE_BAD_REQUEST', `Invalid request: ${describeValidation(err)}. See /docs for the expected shape.`);
  }
  const known: Record<string, [number, string, string]> = {
    FST_ERR_CTP_BODY_TOO_LARGE: [413, 'NODECOMPUTE_PAYLOAD_TOO_LARGE', 'The request body is larger than this endpoint accepts: a registration takes at most 64 KiB of JSON, engine output at most 1 MiB a call (post the rest in further calls). Send less.'],
    FST_ERR_CTP_INVALID_MEDIA_TYPE: [415, 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE', `${err.message}. Registrations are application/json; engine output is text/plain.`],
    FST_ERR_CTP_INVALID_CONTENT_LENGTH: [400, 'NODECOMPUTE_BAD_REQUEST', 'The Content-Length header does not match the body that was sent.'],
    FST_ERR_CTP_EMPTY_JSON_BODY: [400, 'NODECOMPUTE_BAD_REQUEST', 'The JSON body is empty. Send a JSON object (see /docs).'],
    FST_ERR_BAD_URL: [400, 'NODECOMPUTE_BAD_REQUEST', `${err.message}: the URL is not validly percent-encoded.`],
    FST_ERR_MAX_PARAM_LENGTH: [400, 'NODECOMPUTE_BAD_REQUEST', 'A path segment is too long: shard ids are at most 128 characters.'],
  };
  const mapped = err.code ? known[err.code] : undefined;
  if (mapped) return errorBody(...mapped);
  if (status < 400 || status >= 500) return null;
  const where = `${request.method} ${request.url.split('?')[0]}`;
  // The code is the status text, as errors.ts names codes (416: NODECOMPUTE_RANGE_NOT_SATISFIABLE).
  const code = `NODECOMPUTE_${String(STATUS_CODES[status]).toUpperCase().replace(/[^A-Z0-9]+/g, '_')}`;
  const message = UNCODED_CLIENT_ERRORS[status]?.(where, err.message);
  return errorBody(status, code, message ?? `${where} was refused (${err.message}). Check it against the API at /docs and /openapi.json.`);
}

/** Fastify says "not valid JSON" both for a syntax error and for a refused "__proto__" key: this says which. */
export function whyNotJson(err: FastifyError, body: string): Error {
  if (err.code !== 'FST_ERR_CTP_INVALID_JSON_BODY') return err;
  try {
    JSON.parse(body);
  } catch (syntax) {
    return new BadRequestError(`The body is not valid JSON: ${(syntax as Error).message}. Send one JSON object (see /docs).`);
  }
  return new BadRequestError(
    'The body has a "__proto__" key, which is refused: it could change the prototype of the objects it is read into. Remove it; no field of the API has that name.',
  );
}

/** Node's client errors that get an answer of their own, with the status Node itself would give them. */
const CLIENT_ERRORS: Record<string, [status: number, code: string, message: string]> = {
  HPE_HEADER_OVERFLOW: [
    431,
    'NODECOMPUTE_HEADERS_TOO_LARGE',
    'The request line and headers are larger than this server accepts (16 KiB in all, Node\'s limit): shorten the URL, or send fewer or shorter headers.',
  ],
  HPE_INVALID_URL: [400, 'NODECOMPUTE_BAD_REQUEST', 'The request target is not a path: it starts with "/" (GET /shards), or is a whole http:// URL; see /docs.'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'NODECOMPUTE_REQUEST_TIMEOUT', 'The request was not completed within 30 s: send its headers and the whole body its Content-Length promised without pausing, or retry.'],
  HPE_INVALID_METHOD: [400, 'NODECOMPUTE_BAD_REQUEST', 'The request method is not an HTTP method this server knows (methods are upper-case, such as GET or PUT); see /docs.'],
  CONNECT: [400, 'NODECOMPUTE_BAD_REQUEST', 'CONNECT asks for a tunnel, and nodecompute is no proxy: check that HTTP_PROXY and HTTPS_PROXY do not name it; see /docs.'],
};

/** Malformed HTTP never reaches a route: it is answered on the socket, coded, and the connection closed. */
export function writeClientError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (!socket.writable) return;
  const [status, code, message] = CLIENT_ERRORS[String(err.code)] ?? [
    400,
    'NODECOMPUTE_BAD_REQUEST',
    `The request is not valid HTTP (${err.code}): check Content-Length and Transfer-Encoding, and send the whole body.`,
  ];
  const body = JSON.stringify(errorBody(status, code, message));
  const head = [`HTTP/1.1 ${status} ${STATUS_CODES[status]}`, 'Connection: close', 'Content-Type: application/json; charset=utf-8', `Content-Length: ${Buffer.byteLength(body)}`];
  socket.end([...head, '', body].join('\r\n'));
}
