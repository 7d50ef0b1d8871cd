// Owns the fast path of the big snapshot answers (/gpus, /gpus/foreign-memory): their `gpus` part
// is the same for every request that sees the same node view, so it is serialised once per view;
// the whole body (with the per-request age and staleness) is encoded once per distinct header, so
// the requests of one millisecond share one buffer. The bodies are exactly what the route schemas
// describe; tests compare them field by field.
import type { FastifyReply } from 'fastify';
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

export function createSnapshotJson(build: (node: NodeView) => unknown) {
  const serialised = new WeakMap<NodeView, string>();
  let last: Encoded | null = null;
  return (reply: FastifyReply, view: SnapshotView<unknown>, node: NodeView): void => {
    const ageMs = Math.round(view.ageMs);
    if (
      last === null ||
      last.node !== node ||
      last.observedAt !== view.observedAt ||
      last.ageMs !== ageMs ||
      last.stale !== view.stale ||
      last.staleReason !== view.staleReason
    ) {
      let gpus = serialised.get(node);
      if (gpus === undefined) {
        gpus = JSON.stringify(build(node));
        serialised.set(node, gpus);
      }
      const meta = JSON.stringify(snapshotMeta(view));
      const body = Buffer.from(`${meta.slice(0, -1)},"gpus":${gpus}}`);
      last = { node, observedAt: view.observedAt, ageMs, stale: view.stale, staleReason: view.staleReason, body };
    }
    void reply.type('application/json; charset=utf-8').send(last.body);
  };
}
