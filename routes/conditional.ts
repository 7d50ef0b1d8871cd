// Owns conditional GETs for pollers: answers derived from a snapshot carry an ETag made of the
// snapshot's identity, the registry version, the snapshot's freshness (fresh, stale while a refresh
// runs, stale because refreshes fail) and, where time alone can change the answer, the verdicts;
// and Cache-Control: max-age of the snapshot's remaining freshness (0 once it is stale). A matching
// If-None-Match gets 304 with no body, so a control plane polling many nodes moves almost nothing,
// yet sees at once that nvidia-smi started failing. The ETag is weak (W/): the body's ageMs moves
// with every answer while what it says stays the same.
import { createHash } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Services } from '../src/app.js';
import type { SnapshotView } from '../src/node-state/snapshot.js';
import type { ShardState } from '../src/shards/shard-service.js';

/** A short digest of every shard's verdict: time alone (a grace window ending) can change them. */
export function verdictsTag(states: ShardState[]): string {
  const hash = createHash('sha1');
  for (const state of states) hash.update(`${state.shard.id}:${state.readiness.state}:${state.readiness.warnings.length};`);
  return hash.digest('base64url').slice(0, 10);
}

/** f: fresh; r: stale, a refresh is due or running; x: stale, the last refresh failed. */
function freshness(view: SnapshotView<unknown>): string {
  if (!view.stale) return 'f';
  return view.failing ? 'x' : 'r';
}

/** The opaque tag, quoted, without the weak prefix. */
export function etagFor(services: Services, view: SnapshotView<unknown>, extra = ''): string {
  return `"${view.observedAt.toString(36)}-${services.registry.version.toString(36)}-${freshness(view)}${extra ? `-${extra}` : ''}"`;
}

/** Weak comparison (RFC 9110 13.1.2), the one If-None-Match uses. */
function matches(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  if (header.trim() === '*') return true;
  return header.split(',').some((candidate) => candidate.trim().replace(/^W\//, '') === etag);
}

/** Sets ETag and Cache-Control; true when the client's copy is current (answer 304). */
export function conditional(services: Services, request: FastifyRequest, reply: FastifyReply, view: SnapshotView<unknown>, extra = ''): boolean {
  const etag = etagFor(services, view, extra);
  // A stale view (expired, or taken before the registry changed) is worth no caching at all.
  const remainingMs = view.stale ? 0 : Math.max(0, services.config.cacheTtlMs - view.ageMs);
  reply.header('etag', `W/${etag}`);
  reply.header('cache-control', `max-age=${Math.floor(remainingMs / 1000)}`);
  return matches(request.headers['if-none-match'], etag);
}
