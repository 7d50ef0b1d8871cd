// Owns the fast path of the big snapshot answers (/gpus, /gpus/foreign-memory): their `gpus` part
// is the same for every request that sees the same node view, so it is serialised once per view;
// the whole body (with the per-request age and staleness) is encoded once per distinct header, so
// the requests of one millisecond share one buffer. The bodies are exactly what the route schemas
// describe; tests compare them field by field. The digest of that `gpus` part is the answer's ETag
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

export function createSnapshotJson(build: (node: NodeView) => unknown): SnapshotJson {
  const serialised = new WeakMap<NodeView, { gpus: string; tag: string }>();
  const serialise = (node: NodeView) => {
    let entry = serialised.get(node);
    if (entry === undefined) {
      const gpus = JSON.stringify(build(node));
      entry = { gpus, tag: contentTag(gpus) };
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
        const body = Buffer.from(`${meta.slice(0, -1)},"gpus":${serialise(node).gpus}}`);
        last = { node, observedAt: view.observedAt, ageMs, stale: view.stale, staleReason: view.staleReason, body };
      }
      void reply.type('application/json; charset=utf-8').send(last.body);
    },
  };
}
