// Owns conditional GETs for pollers: an answer derived from a snapshot carries a weak ETag, a digest
// of what it says (not of when it was observed, nor of the rates that move at every snapshot),
// marked while nvidia-smi fails or is slow, and Cache-Control: max-age of the snapshot's remaining
// freshness. A matching If-None-Match gets 304.
import { createHash } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Services } from '../services.js';
import { withoutDurations } from '../duration.js';
import type { SnapshotView } from '../node-state/snapshot.js';
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
