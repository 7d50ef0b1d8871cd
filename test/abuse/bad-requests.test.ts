// The abuse suite: a table of named bad requests, each expecting a specific 4xx status, a NODECOMPUTE_
// code and a message that says what is wrong, in the one error body shape. After every request the
// registry (GET /shards: ids and records) and the state file on disk (bytes) must be as they were:
// a rejected write changes nothing. Most requests go through app.inject; the few that inject cannot
// express (a lying Content-Length, raw `..` segments, contradicting framing headers) go over a raw
// loopback socket. The writes "from the network" only set inject's remoteAddress: no traffic leaves
// the machine.
import { existsSync, readFileSync } from 'node:fs';
import { STATUS_CODES } from 'node:http';
import { gzipSync } from 'node:zlib';
import type { AddressInfo } from 'node:net';
import t, { type Test } from 'tap';
import type { InjectOptions } from 'fastify';
import type { App } from '../../src/app.js';
import { ENGINE_TAIL_MAX_BYTES } from '../../src/shards/engine-output.js';
import { buildTestApp, spawnShardProcess } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';
import { rawHttp, type RawResponse } from '../helpers/raw-http.js';

const TOKEN = 'abuse-suite-token-0123456789abcdef';

interface Ctx {
  /** A live process (a shard leader) that registrations may name. */
  pid: number;
  /** A PID no process has. */
  missingPid: number;
}

interface BadRequest {
  name: string;
  request: (c: Ctx) => InjectOptions;
  status: number;
  code: string;
  /** A distinctive fragment of a message that says what is wrong. */
  message: RegExp;
  /** The Allow header a 405 must carry: the methods the path answers. */
  allow?: string;
  /** The Content-Range header a 416 must carry (RFC 9110 15.5.17): the size the file has. */
  contentRange?: RegExp;
}

interface Answer {
  statusCode: number;
  headers: Record<string, unknown>;
  body: string;
}

const json = { 'content-type': 'application/json' };
const text = { 'content-type': 'text/plain' };
const good = (c: Ctx) => ({ pid: c.pid, gpus: [1] });
const put = (url: string, payload: (c: Ctx) => unknown, headers: Record<string, string> = {}) => (c: Ctx): InjectOptions => ({
  method: 'PUT',
  url,
  payload: payload(c) as InjectOptions['payload'],
  headers,
});
const putRaw = (url: string, body: string, headers: Record<string, string> = json) => (): InjectOptions => ({ method: 'PUT', url, payload: body, headers });
const register = (payload: (c: Ctx) => unknown) => put('/shards/new-shard', payload);
const badId = (encodedId: string) => put(`/shards/${encodedId}`, good);
const ID_PATTERN = /params\/id must match pattern/;
const METHOD = 'NODECOMPUTE_METHOD_NOT_ALLOWED';

function findMissingPid(): number {
  for (let pid = 4_194_304; pid > 1; pid -= 1) if (!existsSync(`/proc/${pid}`)) return pid;
  throw new Error('every PID is taken');
}

/** The one error body: exactly {statusCode, code, error, message}, coded, never a 5xx. */
function checkError(t: Test, res: Answer, status: number, code: string, message: RegExp): void {
  t.equal(res.statusCode, status, `status ${status}`);
  t.ok(res.statusCode >= 400 && res.statusCode < 500, `a 4xx, never a 5xx (got ${res.statusCode})`);
  t.match(String(res.headers['content-type']), /^application\/json/, 'a JSON body');
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(res.body) as Record<string, unknown>;
  } catch {
    t.fail(`the body is not JSON: ${res.body.slice(0, 200)}`);
    return;
  }
  t.same(Object.keys(body).sort(), ['code', 'error', 'message', 'statusCode'], `exactly {statusCode, code, error, message}: ${res.body.slice(0, 300)}`);
  t.equal(body.statusCode, res.statusCode, 'statusCode repeats the status');
  t.equal(body.code, code, 'code');
  t.equal(body.error, STATUS_CODES[res.statusCode], 'error is the status text');
  t.match(body.message, message, 'the message says what is wrong');
}

interface Observed {
  shards: unknown[];
  stateFile: Buffer;
}

async function observe(app: App, stateFile: string): Promise<Observed> {
  const res = await app.inject({ method: 'GET', url: '/shards' });
  if (res.statusCode !== 200) throw new Error(`GET /shards answered ${res.statusCode}: ${res.body}`);
  // The records as registered; status and compute move with the node, not with writes.
  const shards = (res.json().shards as Array<Record<string, unknown>>).map(({ status: _s, compute: _c, ...record }) => record);
  return { shards, stateFile: readFileSync(stateFile) };
}

async function checkUnchanged(t: Test, app: App, stateFile: string, before: Observed): Promise<void> {
  const after = await observe(app, stateFile);
  t.same(after.shards, before.shards, 'GET /shards: the same ids and records');
  t.ok(after.stateFile.equals(before.stateFile), 'the state file holds the same bytes');
}

// ---------------------------------------------------------------------------------------------------

const table: BadRequest[] = [
  // Bad ids (and path traversal through ids).
  { name: 'id: empty', request: badId(''), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /params\/id must NOT have fewer than 1 characters \(the id is empty/ },
  { name: 'id: 129 characters', request: badId('a'.repeat(129)), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /id/ },
  { name: "id: starts with '.'", request: badId('.hidden'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: "id: starts with '-'", request: badId('-rf'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: "id: contains '/' (no such route)", request: badId('a/b'), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /No route PUT \/shards\/a\/b/ },
  { name: "id: contains '%2F'", request: badId('a%2Fb'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: 'id: ..%2F..%2Fetc%2Fpasswd', request: badId('..%2F..%2Fetc%2Fpasswd'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: 'id: a space', request: badId('a%20b'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: 'id: unicode', request: badId('caf%C3%A9'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: 'id: an encoded null byte', request: badId('a%00b'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: "id: ':'", request: badId('a:b'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  { name: 'id: broken percent-encoding', request: badId('%E0%A4%A'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /%E0%A4%A/ },
  { name: 'DELETE with a bad id', request: () => ({ method: 'DELETE', url: '/shards/.hidden' }), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  {
    name: 'engine-output to a bad id',
    request: () => ({ method: 'POST', url: '/shards/..%2Fx/engine-output', payload: 'hello', headers: text }),
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: ID_PATTERN,
  },
  { name: 'GET with a bad id', request: () => ({ method: 'GET', url: '/shards/-x/ready' }), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: ID_PATTERN },
  {
    name: 'the list asked with a trailing slash (an empty id)',
    request: () => ({ method: 'GET', url: '/shards/' }),
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: /^Invalid request: params\/id must NOT have fewer than 1 characters \(the id is empty: a shard id goes between "\/shards\/" and the next "\/"; GET \/shards, without the trailing slash, lists them\)\. See \/docs/,
  },
  { name: 'an empty id before /ready', request: () => ({ method: 'GET', url: '/shards//ready' }), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /params\/id must NOT have fewer than 1 characters \(the id is empty/ },

  // Sizes.
  {
    name: 'JSON body over 64 KiB',
    request: (c) => ({ method: 'PUT', url: '/shards/big', headers: json, payload: JSON.stringify({ pid: c.pid, gpus: [1], pad: 'x'.repeat(70_000) }) }),
    status: 413,
    code: 'NODECOMPUTE_PAYLOAD_TOO_LARGE',
    message: /larger than this endpoint accepts: a registration takes at most 64 KiB/,
  },
  {
    name: 'engine output over 1 MiB',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', headers: text, payload: 'x'.repeat(1024 * 1024 + 1) }),
    status: 413,
    code: 'NODECOMPUTE_PAYLOAD_TOO_LARGE',
    message: /at most 1 MiB a call/,
  },

  // Content types.
  { name: 'text/plain to PUT', request: (c) => putRaw('/shards/new-shard', JSON.stringify(good(c)), text)(), status: 415, code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE', message: /application\/json/ },
  {
    name: 'form-urlencoded to PUT',
    request: putRaw('/shards/new-shard', 'pid=1&gpus=1', { 'content-type': 'application/x-www-form-urlencoded' }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /^This endpoint takes application\/json, not "application\/x-www-form-urlencoded"\. Example: curl -X PUT/,
  },
  { name: 'no content type on PUT', request: (c) => putRaw('/shards/new-shard', JSON.stringify(good(c)), {})(), status: 415, code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE', message: /application\/json/ },
  {
    name: 'application/jsonx to PUT',
    request: (c) => putRaw('/shards/new-shard', JSON.stringify(good(c)), { 'content-type': 'application/jsonx' })(),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /application\/json/,
  },
  {
    name: 'application/json to engine-output',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', headers: json, payload: '{"log": "x"}' }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /takes text\/plain, not "application\/json"/,
  },
  {
    name: 'no content type on engine-output',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', payload: 'ggml_cuda_init: found 1 CUDA devices' }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /text\/plain/,
  },
  // Bodies that would be read wrong: compressed (nothing decodes them) or in another charset than UTF-8.
  {
    name: 'a gzipped registration',
    request: (c) => ({ method: 'PUT', url: '/shards/new-shard', headers: { ...json, 'content-encoding': 'gzip' }, payload: gzipSync(JSON.stringify(good(c))) }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /^This body is encoded \("Content-Encoding: gzip"\).* send it uncompressed, without a Content-Encoding header\. Example: curl -X PUT/,
  },
  {
    name: 'gzipped engine output',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', headers: { ...text, 'content-encoding': 'GZIP' }, payload: gzipSync('ggml_cuda_init: found 1 CUDA devices\n') }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /"Content-Encoding: GZIP"\).*read the encoded bytes as text\/plain: send it uncompressed/,
  },
  {
    name: 'engine output encoded twice, identity among them',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', headers: { ...text, 'content-encoding': 'identity, br' }, payload: 'x' }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /"Content-Encoding: br"/,
  },
  {
    name: 'engine output in Latin-1',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', headers: { 'content-type': 'text/plain; charset=iso-8859-1' }, payload: Buffer.from('caf\xe9\n', 'latin1') }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /^This endpoint reads text\/plain as UTF-8, not "iso-8859-1": convert it \(iconv -f iso-8859-1 -t UTF-8\) and send "Content-Type: text\/plain; charset=utf-8", or no charset\./,
  },
  {
    name: 'a Content-Type with an empty charset',
    request: (c) => ({ method: 'PUT', url: '/shards/new-shard', headers: { 'content-type': 'application/json; charset=' }, payload: JSON.stringify(good(c)) }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /^This Content-Type header cannot be read \("application\/json; charset="\): send "Content-Type: application\/json"/,
  },
  {
    name: 'a registration in UTF-16 (quoted charset)',
    request: (c) => ({ method: 'PUT', url: '/shards/new-shard', headers: { 'content-type': 'application/json; charset="UTF-16"' }, payload: Buffer.from(JSON.stringify(good(c)), 'utf16le') }),
    status: 415,
    code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE',
    message: /reads application\/json as UTF-8, not "UTF-16"/,
  },

  // Bodies that are not a registration.
  { name: 'malformed JSON', request: putRaw('/shards/new-shard', '{"pid": 1,'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /^The body is not valid JSON: .*JSON.*\. Send one JSON object/ },
  { name: 'empty JSON body', request: putRaw('/shards/new-shard', ''), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /empty/ },
  { name: 'no body at all', request: () => ({ method: 'PUT', url: '/shards/new-shard' }), status: 415, code: 'NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE', message: /takes application\/json, not "no content type"/ },
  { name: 'JSON array', request: putRaw('/shards/new-shard', '[{"pid": 1, "gpus": [1]}]'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body must be an object/ },
  { name: 'JSON string', request: putRaw('/shards/new-shard', '"pid=1"'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body must be an object/ },
  { name: 'JSON null', request: putRaw('/shards/new-shard', 'null'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body must be an object/ },
  { name: 'prototype poisoning (__proto__)', request: putRaw('/shards/new-shard', '{"pid": 1, "gpus": [1], "__proto__": {"admin": true}}'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /^The body has a "__proto__" key, which is refused: .*Remove it/ },

  // Wrong types and ranges.
  { name: 'pid as a string', request: register(() => ({ pid: '123', gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be a whole number or null/ },
  { name: 'pid as a float', request: register((c) => ({ pid: c.pid + 0.5, gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be a whole number or null/ },
  { name: 'pid as a string, told that null or leaving it out registers a cgroup', request: register(() => ({ pid: '123', cgroup: '0123456789ab', gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be a whole number or null.*leave "pid" out or null/ },
  { name: 'cgroup as a number, told that null or leaving it out registers a PID', request: register((c) => ({ pid: c.pid, cgroup: 123, gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/cgroup must be a string or null.*leave "cgroup" out or null/ },
  // A null, as GET writes an absent field, is taken as absent: what refuses these is the rest of the body.
  { name: 'pid null beside a cgroup no process is in', request: register(() => ({ pid: null, cgroup: '0123456789ab', gpus: [1] })), status: 422, code: 'NODECOMPUTE_PROCESS_NOT_FOUND', message: /cgroup containing "0123456789ab"/ },
  { name: 'cgroup null beside the pid of shard "existing"', request: register((c) => ({ pid: c.pid, cgroup: null, gpus: [1] })), status: 409, code: 'NODECOMPUTE_SHARD_CONFLICT', message: /already registered as shard "existing"/ },
  { name: 'pid and cgroup both null', request: register(() => ({ pid: null, cgroup: null, gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /Give "pid".*or "cgroup"/ },
  {
    name: 'migDevices empty',
    request: register((c) => ({ ...good(c), migDevices: [] })),
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: /body\/migDevices must NOT have fewer than 1 items \(leave "migDevices" out, or null, for a shard on whole GPUs\)/,
  },
  { name: 'migDevices as a string', request: register((c) => ({ ...good(c), migDevices: 'MIG-1' })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/migDevices must be an array/ },
  { name: 'minGpuWeightsShare as a string', request: register((c) => ({ ...good(c), minGpuWeightsShare: '0.8' })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/minGpuWeightsShare must be a number or null/ },
  { name: 'pid negative', request: register(() => ({ pid: -5, gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be >= 1/ },
  { name: 'pid zero', request: register(() => ({ pid: 0, gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be >= 1/ },
  { name: 'pid above 4194304', request: register(() => ({ pid: 4_194_305, gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be <= 4194304/ },
  { name: 'pid 1e20', request: putRaw('/shards/new-shard', '{"pid": 1e20, "gpus": [1]}'), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/pid must be <= 4194304/ },
  { name: 'gpus as a string', request: register((c) => ({ pid: c.pid, gpus: '1' })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/gpus must be an array\. / },
  { name: 'gpus with a float', request: register((c) => ({ pid: c.pid, gpus: [1.5] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/gpus\/0 must be a whole number\. / },
  { name: 'gpus with a negative index', request: register((c) => ({ pid: c.pid, gpus: [-1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/gpus\/0 must be >= 0/ },
  { name: 'gpus with an index above 63', request: register((c) => ({ pid: c.pid, gpus: [64] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/gpus\/0 must be <= 63/ },
  { name: 'gpus with a duplicate', request: register((c) => ({ pid: c.pid, gpus: [1, 2, 1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /^Invalid request: body\/gpus must not list the same value twice: items 0 and 2 are equal \(counting from 0\)\. / },
  { name: 'gpus missing', request: register((c) => ({ pid: c.pid })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /required property 'gpus'/ },
  { name: 'engine not in the list', request: register((c) => ({ ...good(c), engine: 'tgi' })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/engine must be one of: llama\.cpp, ollama, vllm, other/ },
  { name: 'graceMs negative', request: register((c) => ({ ...good(c), graceMs: -1 })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/graceMs must be >= 0/ },
  { name: 'graceMs huge', request: register((c) => ({ ...good(c), graceMs: 1e12 })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/graceMs must be <= 3600000/ },
  { name: 'minGpuWeightsShare above 1 (a percentage)', request: register((c) => ({ ...good(c), minGpuWeightsShare: 80 })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/minGpuWeightsShare must be <= 1/ },
  { name: 'minGpuWeightsShare negative', request: register((c) => ({ ...good(c), minGpuWeightsShare: -0.5 })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/minGpuWeightsShare must be >= 0/ },
  { name: 'graceMs a float', request: register((c) => ({ ...good(c), graceMs: 10.5 })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/graceMs must be a whole number\. / },

  // Unknown fields: the message must name the field the caller got wrong.
  { name: 'unknown field: "gpu" instead of "gpus"', request: register((c) => ({ pid: c.pid, gpu: [0] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /gpu/ },
  { name: 'unknown field: "gpu" beside "gpus"', request: register((c) => ({ pid: c.pid, gpus: [1], gpu: [0] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /unknown field "gpu"/ },
  { name: 'unknown field: "pgid"', request: register((c) => ({ ...good(c), pgid: c.pid })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body has an unknown field "pgid"/ },

  // GET's read-only fields are taken, so a GET body can be PUT back, but a body read from another shard is not.
  {
    name: 'the GET body of shard "existing" PUT to another id',
    request: register((c) => ({ id: 'existing', pid: c.pid, cgroup: null, gpus: [1], migDevices: null, minGpuWeightsShare: null, registeredAt: '2026-01-01T00:00:00.000Z', status: {} })),
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: /"id" is "existing" but the path names shard "new-shard"/,
  },
  { name: 'id that is no shard id', request: register((c) => ({ ...good(c), id: 'a/b' })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/id must match pattern/ },

  // pid / cgroup.
  { name: 'both pid and cgroup', request: register((c) => ({ ...good(c), cgroup: 'abcdef0123456789' })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /not both/ },
  { name: 'neither pid nor cgroup', request: register(() => ({ gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /Give "pid".*or "cgroup"/ },
  { name: 'cgroup too short', request: register(() => ({ cgroup: 'abc', gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/cgroup must match pattern .*\(a container id, 12 to 64 hex digits/ },
  {
    name: 'cgroup that is neither a container id nor a pod UID',
    request: register(() => ({ cgroup: 'kubepods', gpus: [1] })),
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: /body\/cgroup must match pattern .*\(a container id, 12 to 64 hex digits .* or a pod UID like .*a looser string would claim other workloads' processes\)/,
  },
  {
    name: 'pod UID mixing "-" and "_"',
    request: register(() => ({ cgroup: '0f1e2d3c_4b5a-6978-8796-a5b4c3d2e1f0', gpus: [1] })),
    status: 400,
    code: 'NODECOMPUTE_BAD_REQUEST',
    message: /body\/cgroup must match pattern/,
  },
  { name: "cgroup with '/'", request: register(() => ({ cgroup: 'kubepods/../../etc', gpus: [1] })), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /body\/cgroup must match pattern/ },
  {
    name: 'cgroup no process is in',
    request: register(() => ({ cgroup: 'deadbeef-0000-4000-8000-0000000abc00', gpus: [1] })),
    status: 422,
    code: 'NODECOMPUTE_PROCESS_NOT_FOUND',
    message: /No process in \/proc has a cgroup containing "deadbeef-0000-4000-8000-0000000abc00"/,
  },
  { name: 'pid with no process', request: register((c) => ({ pid: c.missingPid, gpus: [1] })), status: 422, code: 'NODECOMPUTE_PROCESS_NOT_FOUND', message: /No process with PID \d+ exists/ },
  {
    name: "pid 1 (a container's main process, as the container sees it; init on the host)",
    request: register(() => ({ pid: 1, gpus: [1] })),
    status: 422,
    code: 'NODECOMPUTE_NOT_A_SHARD_PROCESS',
    message: /^PID 1 in \/proc is init \(.*\), not a shard: .*Register its host PID .*or register the pod by its cgroup/,
  },
  {
    name: 'the process of shard "existing" under another id',
    request: register(good),
    status: 409,
    code: 'NODECOMPUTE_SHARD_CONFLICT',
    message: /^Process \d+ \(.*, started at tick \d+\) is already registered as shard "existing"\. .*DELETE \/shards\/existing first; to change its GPUs, grace or engine, PUT \/shards\/existing instead\.$/,
  },
  {
    name: 'the process of shard "existing" under another id, with other GPUs, engine and grace',
    request: register((c) => ({ pid: c.pid, gpus: [2, 3], engine: 'vllm', graceMs: 0 })),
    status: 409,
    code: 'NODECOMPUTE_SHARD_CONFLICT',
    message: /already registered as shard "existing"/,
  },
  {
    name: 'a GPU this node does not have',
    request: register((c) => ({ pid: c.pid, gpus: [1, 8] })),
    status: 422,
    code: 'NODECOMPUTE_UNKNOWN_GPU',
    message: /GPU 8 does not exist on this node; it has GPU 0, 1, 2, 3, 4, 5, 6, 7/,
  },

  // Writes from the network with no token configured (a header-level simulation: inject's remoteAddress).
  { name: 'PUT from 10.1.2.3 with no token configured', request: (c) => ({ ...register(good)(c), remoteAddress: '10.1.2.3' }), status: 403, code: 'NODECOMPUTE_FORBIDDEN', message: /loopback only/ },
  { name: 'DELETE from 10.1.2.3 with no token configured', request: () => ({ method: 'DELETE', url: '/shards/existing', remoteAddress: '10.1.2.3' }), status: 403, code: 'NODECOMPUTE_FORBIDDEN', message: /loopback only/ },
  {
    name: 'engine-output from 10.1.2.3 with no token configured',
    request: () => ({ method: 'POST', url: '/shards/existing/engine-output', headers: text, payload: 'x', remoteAddress: '10.1.2.3' }),
    status: 403,
    code: 'NODECOMPUTE_FORBIDDEN',
    message: /NODECOMPUTE_TOKEN/,
  },
  { name: 'PUT from ::ffff:10.1.2.3', request: (c) => ({ ...register(good)(c), remoteAddress: '::ffff:10.1.2.3' }), status: 403, code: 'NODECOMPUTE_FORBIDDEN', message: /loopback only/ },
  { name: 'PUT from 2001:db8::7', request: (c) => ({ ...register(good)(c), remoteAddress: '2001:db8::7' }), status: 403, code: 'NODECOMPUTE_FORBIDDEN', message: /loopback only/ },
  { name: 'PUT from 0.0.0.0', request: (c) => ({ ...register(good)(c), remoteAddress: '0.0.0.0' }), status: 403, code: 'NODECOMPUTE_FORBIDDEN', message: /loopback only/ },

  // Unknown routes, wrong methods, unknown shards.
  { name: 'unknown route', request: () => ({ method: 'GET', url: '/nope' }), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /No route GET \/nope/ },
  { name: 'unknown route: /nope/ (a trailing slash, and nothing without it either)', request: () => ({ method: 'GET', url: '/nope/' }), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /^No route GET \/nope\/\. The API is listed/ },
  {
    name: 'unknown route with a broken JSON body: the path is wrong, whatever the body',
    request: () => ({ method: 'PUT', url: '/shard/x', headers: { 'content-type': 'application/json' }, payload: '{"pid":1,' }),
    status: 404,
    code: 'NODECOMPUTE_NOT_FOUND',
    message: /^No route PUT \/shard\/x\./,
  },
  {
    name: 'unknown route with an oversized body',
    request: () => ({ method: 'POST', url: '/shards/x/engine-outpt', headers: text, payload: 'x'.repeat(2 * 1024 * 1024) }),
    status: 404,
    code: 'NODECOMPUTE_NOT_FOUND',
    message: /^No route POST \/shards\/x\/engine-outpt\./,
  },
  { name: '/gpus/ (a trailing slash)', request: () => ({ method: 'GET', url: '/gpus/?x=1' }), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /^No route GET \/gpus\/\. Did you mean \/gpus, without the trailing slash\? / },
  {
    name: "a shard's probe with a trailing slash",
    request: () => ({ method: 'GET', url: '/shards/existing/ready/' }),
    status: 404,
    code: 'NODECOMPUTE_NOT_FOUND',
    message: /^No route GET \/shards\/existing\/ready\/\. Did you mean \/shards\/existing\/ready, without the trailing slash\? /,
  },
  // The /docs files' server raises these uncoded: each gets the code of its status and what to do.
  { name: 'a /docs file with a NUL byte in its path', request: () => ({ method: 'GET', url: '/docs/static/a%00b.css' }), status: 400, code: 'NODECOMPUTE_BAD_REQUEST', message: /^GET \/docs\/static\/a%00b\.css is malformed \(Bad Request\): a path may hold no NUL byte \(%00\)/ },
  {
    name: 'a /docs file asked If-Match a copy it is not',
    request: () => ({ method: 'GET', url: '/docs/static/swagger-ui.css', headers: { 'if-match': '"not-this-copy"' } }),
    status: 412,
    code: 'NODECOMPUTE_PRECONDITION_FAILED',
    message: /^GET \/docs\/static\/swagger-ui\.css: the file is not the copy the If-Match .* Fetch it again without that header\.$/,
  },
  {
    name: 'a /docs file asked for a Range past its end',
    request: () => ({ method: 'GET', url: '/docs/static/swagger-ui.css', headers: { range: 'bytes=999999999-' } }),
    status: 416,
    code: 'NODECOMPUTE_RANGE_NOT_SATISFIABLE',
    message: /^GET \/docs\/static\/swagger-ui\.css: the Range header is not a bytes range within the file .*Fetch it without Range/,
    contentRange: /^bytes \*\/[1-9][0-9]*$/,
  },
  {
    name: 'a /docs file asked for a Range that is no range (refused as RFC 9110 allows, saying so)',
    request: () => ({ method: 'GET', url: '/docs/static/swagger-ui.css', headers: { range: 'bytes=abc' } }),
    status: 416,
    code: 'NODECOMPUTE_RANGE_NOT_SATISFIABLE',
    message: /the Range header is not a bytes range within the file \(bytes=FIRST-LAST/,
    contentRange: /^bytes \*\/[1-9][0-9]*$/,
  },
  { name: 'unknown route under /shards', request: () => ({ method: 'GET', url: '/shards/existing/secrets' }), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /No route GET \/shards\/existing\/secrets/ },
  { name: 'traversal to /etc/passwd (encoded, whole URL)', request: () => ({ method: 'GET', url: '/%2e%2e/%2e%2e/etc/passwd' }), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /No route GET/ },
  { name: 'PATCH /shards/a/b (no such path, whatever the method)', request: () => ({ method: 'PATCH', url: '/shards/a/b', headers: json, payload: '{}' }), status: 404, code: 'NODECOMPUTE_NOT_FOUND', message: /No route PATCH \/shards\/a\/b/ },
  // A path that exists asked with a method it lacks: 405 with Allow, before any body is read or any token asked for.
  { name: 'PATCH /shards/existing', request: () => ({ method: 'PATCH', url: '/shards/existing', headers: json, payload: '{"gpus": [2]}' }), status: 405, code: METHOD, message: /PATCH \/shards\/existing is not allowed: this path answers DELETE, GET, HEAD, OPTIONS, PUT .*\/docs/, allow: 'DELETE, GET, HEAD, OPTIONS, PUT' },
  { name: 'POST /gpus', request: () => ({ method: 'POST', url: '/gpus', headers: json, payload: '{}' }), status: 405, code: METHOD, message: /POST \/gpus is not allowed: this path answers GET, HEAD, OPTIONS/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'PUT /gpus/foreign-memory', request: () => ({ method: 'PUT', url: '/gpus/foreign-memory', headers: json, payload: '{}' }), status: 405, code: METHOD, message: /PUT \/gpus\/foreign-memory is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'DELETE /shards (all of them)', request: () => ({ method: 'DELETE', url: '/shards' }), status: 405, code: METHOD, message: /DELETE \/shards is not allowed: this path answers GET, HEAD, OPTIONS/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'POST /shards/existing (not PUT)', request: (c) => ({ method: 'POST', url: '/shards/existing', payload: good(c) }), status: 405, code: METHOD, message: /POST \/shards\/existing is not allowed/, allow: 'DELETE, GET, HEAD, OPTIONS, PUT' },
  { name: 'GET of engine-output (POST only)', request: () => ({ method: 'GET', url: '/shards/existing/engine-output' }), status: 405, code: METHOD, message: /GET \/shards\/existing\/engine-output is not allowed: this path answers OPTIONS, POST/, allow: 'OPTIONS, POST' },
  { name: 'PUT /shards/existing/ready (a probe is read-only)', request: (c) => ({ method: 'PUT', url: '/shards/existing/ready', payload: good(c) }), status: 405, code: METHOD, message: /PUT \/shards\/existing\/ready is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'TRACE /livez', request: () => ({ method: 'TRACE', url: '/livez' }), status: 405, code: METHOD, message: /TRACE \/livez is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'PROPFIND /shards/existing (a WebDAV scanner)', request: () => ({ method: 'PROPFIND' as InjectOptions['method'], url: '/shards/existing', headers: { 'content-type': 'application/xml' }, payload: '<propfind/>' }), status: 405, code: METHOD, message: /PROPFIND \/shards\/existing is not allowed/, allow: 'DELETE, GET, HEAD, OPTIONS, PUT' },
  { name: 'DELETE /metrics', request: () => ({ method: 'DELETE', url: '/metrics' }), status: 405, code: METHOD, message: /DELETE \/metrics is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'POST / (the status page)', request: () => ({ method: 'POST', url: '/', headers: text, payload: 'x' }), status: 405, code: METHOD, message: /POST \/ is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'POST /docs/json', request: () => ({ method: 'POST', url: '/docs/json', headers: json, payload: '{}' }), status: 405, code: METHOD, message: /POST \/docs\/json is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'PATCH with a bad id (the method is wrong whatever the id)', request: () => ({ method: 'PATCH', url: '/shards/..%2Fetc', headers: json, payload: '{}' }), status: 405, code: METHOD, message: /PATCH \/shards\/..%2Fetc is not allowed/, allow: 'DELETE, GET, HEAD, OPTIONS, PUT' },
  { name: 'POST /gpus with broken JSON', request: () => ({ method: 'POST', url: '/gpus', headers: json, payload: '{"pid": ' }), status: 405, code: METHOD, message: /POST \/gpus is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'POST /gpus over the body limit', request: () => ({ method: 'POST', url: '/gpus', headers: json, payload: JSON.stringify({ pad: 'x'.repeat(70_000) }) }), status: 405, code: METHOD, message: /POST \/gpus is not allowed/, allow: 'GET, HEAD, OPTIONS' },
  { name: 'PATCH /shards/existing from 10.1.2.3 (405, not 403: no method here writes that way)', request: () => ({ method: 'PATCH', url: '/shards/existing', headers: json, payload: '{}', remoteAddress: '10.1.2.3' }), status: 405, code: METHOD, message: /PATCH \/shards\/existing is not allowed/, allow: 'DELETE, GET, HEAD, OPTIONS, PUT' },
  { name: 'DELETE an unknown shard', request: () => ({ method: 'DELETE', url: '/shards/nope' }), status: 404, code: 'NODECOMPUTE_SHARD_NOT_FOUND', message: /^No shard "nope" is registered on this node .*GET \/shards/ },
  {
    name: 'engine-output to an unknown shard',
    request: () => ({ method: 'POST', url: '/shards/nope/engine-output', headers: text, payload: 'hello' }),
    status: 404,
    code: 'NODECOMPUTE_SHARD_NOT_FOUND',
    message: /No shard "nope" is registered/,
  },
  { name: 'GET an unknown shard', request: () => ({ method: 'GET', url: '/shards/nope' }), status: 404, code: 'NODECOMPUTE_SHARD_NOT_FOUND', message: /No shard "nope"/ },
  { name: 'readiness of an unknown shard', request: () => ({ method: 'GET', url: '/shards/nope/ready' }), status: 404, code: 'NODECOMPUTE_SHARD_NOT_FOUND', message: /No shard "nope"/ },
  { name: 'compute of an unknown shard', request: () => ({ method: 'GET', url: '/shards/nope/compute' }), status: 404, code: 'NODECOMPUTE_SHARD_NOT_FOUND', message: /No shard "nope"/ },
];

// With a token configured: the bearer scheme, and only it, with exactly the token.
const bearerTable: Array<{ name: string; authorization?: string; remoteAddress?: string; method?: 'PUT' | 'DELETE'; message: RegExp }> = [
  { name: 'no Authorization header', message: /needs "Authorization: Bearer <token>"/ },
  { name: 'Basic scheme with the token as password', authorization: `Basic ${Buffer.from(`user:${TOKEN}`).toString('base64')}`, message: /needs "Authorization: Bearer <token>"/ },
  { name: 'Basic scheme carrying the token verbatim', authorization: `Basic ${TOKEN}`, message: /needs "Authorization: Bearer <token>"/ },
  { name: 'Bearer with no value', authorization: 'Bearer ', message: /needs "Authorization: Bearer <token>"/ },
  { name: 'Bearer alone', authorization: 'Bearer', message: /needs "Authorization: Bearer <token>"/ },
  { name: 'the token with trailing garbage', authorization: `Bearer ${TOKEN}x`, message: /does not match/ },
  { name: 'the token followed by a second word', authorization: `Bearer ${TOKEN} extra`, message: /Bearer/ },
  { name: 'a prefix of the token', authorization: `Bearer ${TOKEN.slice(0, -1)}`, message: /does not match/ },
  { name: 'the token without a scheme', authorization: TOKEN, message: /needs "Authorization: Bearer <token>"/ },
  { name: 'a wrong token', authorization: 'Bearer not-the-token-at-all-000000', message: /does not match/ },
  { name: 'the token in another case', authorization: `Bearer ${TOKEN.toUpperCase()}`, message: /does not match/ },
  { name: 'DELETE with a wrong token', authorization: 'Bearer not-the-token-at-all-000000', method: 'DELETE', message: /does not match/ },
  { name: 'from 10.1.2.3 with no token: 401, not 403', remoteAddress: '10.1.2.3', message: /needs "Authorization: Bearer <token>"/ },
];

// ---------------------------------------------------------------------------------------------------

t.test('bad requests without a token configured', async (t) => {
  const { app, config } = await buildTestApp(t, { scenario: eightGpuNode() });
  const shard = await spawnShardProcess(t, 1);
  const ctx: Ctx = { pid: shard.pid, missingPid: findMissingPid() };
  const created = await app.inject({ method: 'PUT', url: '/shards/existing', payload: { pid: shard.pid, gpus: [1], engine: 'llama.cpp' } });
  t.equal(created.statusCode, 201, 'a shard is registered before the abuse starts');
  t.ok(table.length >= 45, `${table.length} named bad requests`);
  const before = await observe(app, config.stateFile);
  t.equal(before.shards.length, 1);

  for (const c of table) {
    t.test(c.name, async (t) => {
      const res = await app.inject(c.request(ctx));
      checkError(t, res, c.status, c.code, c.message);
      t.equal(res.headers.allow, c.allow, c.allow === undefined ? 'no Allow header' : 'Allow lists the methods the path answers');
      if (c.contentRange === undefined) t.notOk('content-range' in res.headers, 'no Content-Range header');
      else t.match(res.headers['content-range'], c.contentRange, 'Content-Range names the size the file has');
      await checkUnchanged(t, app, config.stateFile, before);
    });
  }

  t.test('over a raw socket', async (t) => {
    await app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.server.address() as AddressInfo;
    const body = JSON.stringify(good(ctx));
    const head = (path: string, extra: string) => `PUT ${path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n${extra}\r\n`;
    const checkAll = (t: Test, responses: RawResponse[], status: number, code: string, message: RegExp) => {
      t.ok(responses.length >= 1, 'the server answered');
      const [first, ...rest] = responses;
      if (first) checkError(t, { statusCode: first.status, headers: first.headers, body: first.body }, status, code, message);
      for (const other of rest) {
        t.ok(other.status >= 400 && other.status < 500, `a later answer on the same connection is a 4xx too (${other.status})`);
        t.match(other.body, /"code":"NODECOMPUTE_/, 'and coded');
      }
    };

    const rawCases: Array<{ name: string; chunks: string[]; halfClose?: boolean; status: number; code: string; message: RegExp }> = [
      {
        name: 'Content-Length larger than the body, then the client stops sending',
        chunks: [head('/shards/raw-a', 'Content-Length: 1000\r\n'), body],
        halfClose: true,
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /Content-Length|HTTP|incomplete|truncated|malformed/i,
      },
      {
        name: 'Content-Length smaller than the body (the rest is not a request)',
        chunks: [`${head('/shards/raw-b', 'Content-Length: 5\r\nConnection: close\r\n')}${body}`],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /JSON|Content-Length|HTTP|malformed/i,
      },
      {
        name: 'Content-Length and Transfer-Encoding together (a smuggling shape)',
        chunks: [`${head('/shards/raw-c', `Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n`)}${body}`],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /Content-Length|Transfer-Encoding|HTTP|malformed/i,
      },
      {
        name: 'a Content-Length that is not a number',
        chunks: [`${head('/shards/raw-d', 'Content-Length: twelve\r\nConnection: close\r\n')}${body}`],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /Content-Length|HTTP|malformed/i,
      },
      {
        name: 'headers over 16 KiB',
        chunks: [`GET /livez HTTP/1.1\r\nHost: localhost\r\nX-Padding: ${'x'.repeat(20_000)}\r\nConnection: close\r\n\r\n`],
        status: 431,
        code: 'NODECOMPUTE_HEADERS_TOO_LARGE',
        message: /request line and headers are larger than this server accepts \(16 KiB.*shorten the URL/,
      },
      {
        name: "id '..' as a raw path segment",
        chunks: [`${head('/shards/..', `Content-Length: ${body.length}\r\nConnection: close\r\n`)}${body}`],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: ID_PATTERN,
      },
      {
        name: "id '%2e%2e' as a raw path segment",
        chunks: [`${head('/shards/%2e%2e', `Content-Length: ${body.length}\r\nConnection: close\r\n`)}${body}`],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: ID_PATTERN,
      },
      {
        name: '/shards/../../etc/passwd as a raw path',
        chunks: ['GET /shards/../../etc/passwd HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'],
        status: 404,
        code: 'NODECOMPUTE_NOT_FOUND',
        message: /No route GET/,
      },
      {
        name: "a /docs file path climbing out with '%2e%2e'",
        chunks: ['GET /docs/static/%2e%2e/package.json HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'],
        status: 403,
        code: 'NODECOMPUTE_FORBIDDEN',
        message: /^GET \/docs\/static\/%2e%2e\/package\.json is refused: .*climbing out of its folder with "\.\.".* Ask for the file by its own path/,
      },
      {
        name: 'a method HTTP does not define',
        chunks: ['FETCH /shards/existing HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /^The request method is not an HTTP method this server knows \(methods are upper-case, such as GET or PUT\)/,
      },
      {
        name: 'a request target that is no path',
        chunks: ['GET shards HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /^The request target is not a path: it starts with "\/"/,
      },
      {
        name: 'GET with the asterisk-form target, which only OPTIONS may use',
        chunks: ['GET * HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /^The request target \* is only for OPTIONS/,
      },
      {
        name: 'CONNECT (a client taking nodecompute for its proxy)',
        chunks: ['CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n'],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /^CONNECT asks for a tunnel, and nodecompute is no proxy/,
      },
      {
        name: 'an HTTP/1.1 request without Host',
        chunks: ['GET /shards HTTP/1.1\r\nConnection: close\r\n\r\n'],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /HTTP\/1\.1 request names no Host: send exactly one/,
      },
      {
        name: 'an HTTP/1.1 request without Host, to a path that does not exist: the Host first',
        chunks: ['GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n'],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /HTTP\/1\.1 request names no Host: send exactly one/,
      },
      {
        name: 'a write naming two Hosts, the first loopback',
        chunks: [`PUT /shards/raw-h HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`],
        status: 400,
        code: 'NODECOMPUTE_BAD_REQUEST',
        message: /names 2 Host headers/,
      },
      {
        name: 'DELETE /shards/../shards/existing as a raw path',
        chunks: ['DELETE /shards/../shards/existing HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n'],
        status: 404,
        code: 'NODECOMPUTE_NOT_FOUND',
        message: /No route DELETE/,
      },
    ];
    for (const c of rawCases) {
      t.test(c.name, async (t) => {
        const exchange = await rawHttp(port, c.chunks, { halfClose: c.halfClose ?? false });
        t.not(exchange.error, 'ECONNRESET', 'not a connection reset');
        checkAll(t, exchange.responses, c.status, c.code, c.message);
        await checkUnchanged(t, app, config.stateFile, before);
      });
    }

    t.test('OPTIONS * asks about the server as a whole and is answered', async (t) => {
      const exchange = await rawHttp(port, ['OPTIONS * HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n']);
      t.same(exchange.responses.map((res) => res.status), [204]);
    });

    t.test('an HTTP/1.0 request may name no Host', async (t) => {
      const exchange = await rawHttp(port, ['GET /livez HTTP/1.0\r\n\r\n']);
      t.same(exchange.responses.map((res) => res.status), [200]);
    });

    t.test('a 405 answered before its body is read: the body is skipped, never taken for the next request', async (t) => {
      // The unread body looks like a DELETE: were it parsed as a request, the shard would go.
      const smuggled = 'DELETE /shards/existing HTTP/1.1\r\nHost: localhost\r\n\r\n';
      const exchange = await rawHttp(port, [
        `POST /gpus HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`,
        'GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n',
      ]);
      t.same(
        exchange.responses.map((res) => res.status),
        [405, 200],
        'two answers: the 405, then the next real request on the same connection',
      );
      const [refused] = exchange.responses;
      if (refused) checkError(t, { statusCode: refused.status, headers: refused.headers, body: refused.body }, 405, METHOD, /POST \/gpus is not allowed/);
      t.equal(refused?.headers.allow, 'GET, HEAD, OPTIONS');
      await checkUnchanged(t, app, config.stateFile, before);
    });
  });

  t.test('a flood of engine output: every post answered, the tail bounded', async (t) => {
    const line = (i: number) => `srv  log_server_r: request: POST /completion 127.0.0.1 200 (line ${String(i).padStart(8, '0')})\n`;
    const lineBytes = Buffer.byteLength(line(0));
    const chunk = (post: number) => {
      const lines: string[] = [];
      for (let i = 0; lines.length * lineBytes < 64 * 1024 - lineBytes; i += 1) lines.push(line(post * 1000 + i));
      return lines.join('').padEnd(64 * 1024, '.');
    };
    let maxTail = 0;
    for (let post = 1; post <= 300; post += 1) {
      const res = await app.inject({ method: 'POST', url: '/shards/existing/engine-output', headers: text, payload: chunk(post) });
      if (res.statusCode !== 200) {
        t.fail(`post ${post} answered ${res.statusCode}: ${res.body.slice(0, 300)}`);
        break;
      }
      const { tailBytes, shard } = res.json() as { tailBytes: number; shard: string };
      if (shard !== 'existing' || tailBytes > ENGINE_TAIL_MAX_BYTES || (post >= 4 && tailBytes < ENGINE_TAIL_MAX_BYTES - 2 * lineBytes - 64 * 1024)) {
        t.fail(`post ${post}: tailBytes ${tailBytes} is outside (0, ${ENGINE_TAIL_MAX_BYTES}]`);
        break;
      }
      maxTail = Math.max(maxTail, tailBytes);
    }
    t.ok(maxTail <= ENGINE_TAIL_MAX_BYTES, `the tail never grew past ENGINE_TAIL_MAX_BYTES (largest ${maxTail})`);
    t.ok(maxTail > ENGINE_TAIL_MAX_BYTES / 2, 'and it did fill up');
    const kept = app.services.registry.engine('existing');
    t.ok(kept && Buffer.byteLength(kept.tail) <= ENGINE_TAIL_MAX_BYTES, 'the registry holds no more than the bounded tail');
    t.match(kept?.tail ?? '', /\(line 00300\d{3}\)\n\.*$/, 'and it is the newest output');
    await checkUnchanged(t, app, config.stateFile, before);
  });
});

t.test('bad requests with a token configured: the bearer scheme only, exactly the token', async (t) => {
  const { app, config } = await buildTestApp(t, { scenario: eightGpuNode(), config: { token: TOKEN } });
  const shard = await spawnShardProcess(t, 0);
  const authorised = { authorization: `Bearer ${TOKEN}` };
  const created = await app.inject({ method: 'PUT', url: '/shards/existing', headers: authorised, payload: { pid: shard.pid, gpus: [2] } });
  t.equal(created.statusCode, 201, 'the right token registers');
  const before = await observe(app, config.stateFile);

  for (const c of bearerTable) {
    t.test(c.name, async (t) => {
      const res = await app.inject({
        method: c.method ?? 'PUT',
        url: c.method === 'DELETE' ? '/shards/existing' : '/shards/other',
        ...(c.method === 'DELETE' ? {} : { payload: { pid: shard.pid, gpus: [3] } }),
        headers: c.authorization === undefined ? {} : { authorization: c.authorization },
        ...(c.remoteAddress ? { remoteAddress: c.remoteAddress } : {}),
      });
      checkError(t, res, 401, 'NODECOMPUTE_UNAUTHORIZED', c.message);
      t.match(res.headers['www-authenticate'], /^Bearer realm="nodecompute"(, error="invalid_token")?$/, 'WWW-Authenticate names the scheme');
      await checkUnchanged(t, app, config.stateFile, before);
    });
  }

  t.test('control: the right token works, from the network too, and reads need none', async (t) => {
    t.equal((await app.inject({ method: 'GET', url: '/shards/existing' })).statusCode, 200);
    // Another process: one process is registered under one id only.
    const other = await spawnShardProcess(t, 0);
    const remote = await app.inject({ method: 'PUT', url: '/shards/other', headers: authorised, payload: { pid: other.pid, gpus: [3] }, remoteAddress: '10.1.2.3' });
    t.equal(remote.statusCode, 201, remote.body);
    t.notOk(remote.headers['www-authenticate'], 'no challenge on success');
    t.equal((await app.inject({ method: 'DELETE', url: '/shards/other', headers: authorised })).statusCode, 204);
  });
});

t.test('ids up to the documented 128 characters are accepted (the limit is the schema, not the router)', async (t) => {
  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  const shard = await spawnShardProcess(t, 0);
  for (const length of [100, 101, 128]) {
    const id = `s${'0123456789'.repeat(13)}`.slice(0, length);
    const res = await app.inject({ method: 'PUT', url: `/shards/${id}`, payload: { pid: shard.pid, gpus: [0] } });
    t.equal(res.statusCode, 201, `a ${length}-character id registers: ${res.body.slice(0, 200)}`);
    if (res.statusCode === 201) {
      t.equal((await app.inject({ method: 'GET', url: `/shards/${id}` })).statusCode, 200, `and can be read back (${length})`);
      t.equal((await app.inject({ method: 'DELETE', url: `/shards/${id}` })).statusCode, 204, `and removed (${length})`);
    }
  }
});
