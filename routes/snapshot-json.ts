// Owns the fast path of the big snapshot answers (/gpus, /gpus/foreign-memory): their fields after
// the snapshot header (`gpus`, and for /gpus `lostGpus`) are the same for every request that sees
// the same node view, so they are serialised once per view;
// the whole body (with the per-request age and staleness) is encoded once per distinct header, so
// the requests of one millisecond share one buffer. The bodies are exactly what the route schemas
// describe; tests compare them field by field. The digest of those fields is the answer's ETag
// content (conditional.ts), computed once per view too.
import type { FastifyReply } from 'fastify';
import { contentTag } from './conditional.js';
import { snapshotMeta, type NodeView } from '../src/node-state/node-view.js';
import type { SnapshotView } from '../src/node-state/snapshot.js';

interface Encoded {
  node: NodeView;
  observedAt: number;
  ageMs: number;
  stale: boolean;
  staleReason: string | null;
  body: Buffer;
}

export interface SnapshotJson {
  /** Sends the answer for this view of this node. */
  send(reply: FastifyReply, view: SnapshotView<unknown>, node: NodeView): void;
  /** The digest of what the answer says about this node, for its ETag. */
  tag(node: NodeView): string;
}

/** `build` answers the body's fields after the snapshot header, at least one. */
export function createSnapshotJson(build: (node: NodeView) => Record<string, unknown>): SnapshotJson {
  const serialised = new WeakMap<NodeView, { fields: string; tag: string }>();
  const serialise = (node: NodeView) => {
    let entry = serialised.get(node);
    if (entry === undefined) {
      // Without its braces, to follow the header's fields in one object.
      const fields = JSON.stringify(build(node)).slice(1, -1);
      entry = { fields, tag: contentTag(fields) };
      serialised.set(node, entry);
    }
    return entry;
  };
  let last: Encoded | null = null;
  return {
    tag: (node) => serialise(node).tag,
    send(reply, view, node) {
      const ageMs = Math.round(view.ageMs);
      if (
        last === null ||
        last.node !== node ||
        last.observedAt !== view.observedAt ||
        last.ageMs !== ageMs ||
        last.stale !== view.stale ||
        last.staleReason !== view.staleReason
      ) {
        const meta = JSON.stringify(snapshotMeta(view));
        const body = Buffer.from(`${meta.slice(0, -1)},${serialise(node).fields}}`);
        last = { node, observedAt: view.observedAt, ageMs, stale: view.stale, staleReason: view.staleReason, body };
      }
      void reply.type('application/json; charset=utf-8').send(last.body);
    },
  };
}
