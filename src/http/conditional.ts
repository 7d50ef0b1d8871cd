// Owns conditional GETs for pollers: an answer derived from a snapshot carries a weak ETag, a digest
// of what it says (not of when it was observed, nor of the rates that move at every snapshot),
// marked while nvidia-smi fails or is slow, and Cache-Control: max-age of the snapshot's remaining
// freshness. A matching If-None-Match gets 304. A write (PUT, DELETE) keeps If-Match and
// If-None-Match: * (RFC 9110 13.1) against the shard as registered when the change is decided.
import { createHash } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Services } from '../services.js';
import { withoutDurations } from '../duration.js';
import type { SnapshotView } from '../node-state/snapshot.js';
import { BadRequestError } from '../errors.js';
import type { Precondition } from '../shards/registry.js';
import type { ShardState } from '../shards/shard-service.js';

/** Rates that move at every snapshot (CPU cores, SM and GPU utilization): a weak ETag names equivalent answers, so they are left out of it. */
const RATES: ReadonlySet<string> = new Set(['cpuCores', 'smUtilPct', 'utilizationPct']);
const withoutRates = (key: string, value: unknown): unknown => (RATES.has(key) ? undefined : value);

/** A short, stable digest of an answer's content, its rates left out. */
export function contentTag(content: unknown): string {
  return createHash('sha1').update(JSON.stringify(content, withoutRates)).digest('base64url').slice(0, 16);
}

/** What a poller of GET /shards acts on: registrations, verdicts (their spans of time left out: they move at every snapshot) and compute. */
export function shardsTag(states: ShardState[]): string {
  return contentTag(
    states.map(({ shard, readiness, compute }) => [
      shard,
      readiness.state,
      readiness.ready,
      readiness.cause,
      readiness.reason === null ? null : withoutDurations(readiness.reason),
      readiness.warnings.map(withoutDurations),
      compute,
    ]),
  );
}

/** Weak comparison (RFC 9110 13.1.2), the one If-None-Match uses. */
function matches(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  if (header.trim() === '*') return true;
  return header.split(',').some((candidate) => candidate.trim().replace(/^W\//, '') === etag);
}

/** Sets ETag and Cache-Control; true when the client's copy is current (answer 304). */
export function conditional(services: Services, request: FastifyRequest, reply: FastifyReply, view: SnapshotView<unknown>, content: string): boolean {
  // Quoted, without the weak prefix: "-x" marks it while refreshes fail, "-s" while one is far slower than usual.
  const etag = `"${content}${!view.stale ? '' : view.failing ? '-x' : view.slow ? '-s' : ''}"`;
  // A stale view (expired, or taken before the registry changed) is worth no caching at all.
  const remainingMs = view.stale ? 0 : Math.max(0, services.config.cacheTtlMs - view.ageMs);
  reply.header('etag', `W/${etag}`);
  reply.header('cache-control', `max-age=${Math.floor(remainingMs / 1000)}`);
  return matches(request.headers['if-none-match'], etag);
}

/** A write's If-Match and If-None-Match as a Precondition on shard `id`; undefined without either. */
export function writePrecondition(request: FastifyRequest, id: string): Precondition | undefined {
  const { 'if-match': ifMatch, 'if-none-match': ifNoneMatch } = request.headers;
  if (ifMatch === undefined && ifNoneMatch === undefined) return undefined;
  if (ifMatch !== undefined && ifMatch.trim() === '') throw new BadRequestError('If-Match is empty: send If-Match: * (only while the shard is registered), or leave it out.');
  if (ifNoneMatch !== undefined && ifNoneMatch.trim() !== '*') {
    throw new BadRequestError('If-None-Match on a write takes only "*" (only while the shard is not registered); tags serve conditional GETs. Send If-None-Match: *, or leave it out.');
  }
  const nothing = 'nothing was changed';
  return (current) => {
    if (ifMatch !== undefined && current === undefined) return `If-Match asks for a registered shard "${id}" and there is none: ${nothing}. PUT without If-Match to register it.`;
    if (ifMatch !== undefined && ifMatch.trim() !== '*') {
      // Strong comparison (13.1.1) never matches a weak tag, and shard answers carry only weak ones.
      return `If-Match names entity tags, and the shard's are weak (W/"..."), which If-Match never matches: ${nothing}. Send If-Match: * to change only a registered shard.`;
    }
    if (ifNoneMatch !== undefined && current !== undefined) return `If-None-Match: * asks that shard "${id}" not be registered, and it is: ${nothing}. GET /shards/${id} shows it.`;
    return null;
  };
}
