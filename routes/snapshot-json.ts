// Owns the fast path of the big snapshot answers (/gpus, /gpus/foreign-memory): their fields after
// the snapshot header (`gpus`, and `lostGpus`) are the same for every request that sees the same
// node view and the same unreachable GPUs (NodeService.unreachable(), one array until it changes),
// so they are serialised once per pair;
// the whole body (with the per-request age and staleness) is encoded once per distinct header, so
// the requests of one millisecond share one buffer. The bodies are exactly what the route schemas
// describe; tests compare them field by field. The digest of those fields is the answer's ETag
// content (conditional.ts), computed once per pair too.
import type { FastifyReply } from 'fastify';
import { contentTag } from './conditional.js';
import { snapshotMeta, type NodeView } from '../src/node-state/node-view.js';
import type { UnreachableListedGpu } from '../src/node-state/placement.js';
import type { SnapshotView } from '../src/node-state/snapshot.js';

type Unreachable = readonly UnreachableListedGpu[];

interface Encoded {
  node: NodeView;
  unreachable: Unreachable;
  observedAt: number;
  ageMs: number;
  stale: boolean;
  staleReason: string | null;
  body: Buffer;
}

export interface SnapshotJson {
  /** Sends the answer for this view of this node, with these GPUs unreachable. */
  send(reply: FastifyReply, view: SnapshotView<unknown>, node: NodeView, unreachable: Unreachable): void;
  /** The digest of what the answer says about this node, for its ETag. */
  tag(node: NodeView, unreachable: Unreachable): string;
}

/** `build` answers the body's fields after the snapshot header, at least one. */
export function createSnapshotJson(build: (node: NodeView, unreachable: Unreachable) => Record<string, unknown>): SnapshotJson {
  const serialised = new WeakMap<NodeView, { unreachable: Unreachable; fields: string; tag: string }>();
  const serialise = (node: NodeView, unreachable: Unreachable) => {
    let entry = serialised.get(node);
    if (entry?.unreachable !== unreachable) {
      // Without its braces, to follow the header's fields in one object.
      const fields = JSON.stringify(build(node, unreachable)).slice(1, -1);
      entry = { unreachable, fields, tag: contentTag(fields) };
      serialised.set(node, entry);
    }
    return entry;
  };
  let last: Encoded | null = null;
  return {
    tag: (node, unreachable) => serialise(node, unreachable).tag,
    send(reply, view, node, unreachable) {
      const ageMs = Math.round(view.ageMs);
      if (
        last === null ||
        last.node !== node ||
        last.unreachable !== unreachable ||
        last.observedAt !== view.observedAt ||
        last.ageMs !== ageMs ||
        last.stale !== view.stale ||
        last.staleReason !== view.staleReason
      ) {
        const meta = JSON.stringify(snapshotMeta(view));
        const body = Buffer.from(`${meta.slice(0, -1)},${serialise(node, unreachable).fields}}`);
        last = { node, unreachable, observedAt: view.observedAt, ageMs, stale: view.stale, staleReason: view.staleReason, body };
      }
      void reply.type('application/json; charset=utf-8').send(last.body);
    },
  };
}
