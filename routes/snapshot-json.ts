// Owns the fast path of the big snapshot answers (/gpus, /gpus/foreign-memory): their `gpus` part
// is the same for every request that sees the same node view, so it is serialised once per view and
// only the few per-request fields (age, staleness) are written per request. The bodies are exactly
// what the route schemas describe; tests compare them field by field.
import type { FastifyReply } from 'fastify';
import { snapshotMeta, type NodeView } from '../src/node-state/node-view.js';
import type { SnapshotView } from '../src/node-state/snapshot.js';

export function createSnapshotJson(build: (node: NodeView) => unknown) {
  const serialised = new WeakMap<NodeView, string>();
  return (reply: FastifyReply, view: SnapshotView<unknown>, node: NodeView) => {
    let gpus = serialised.get(node);
    if (gpus === undefined) {
      gpus = JSON.stringify(build(node));
      serialised.set(node, gpus);
    }
    const meta = JSON.stringify(snapshotMeta(view));
    return reply.type('application/json; charset=utf-8').send(`${meta.slice(0, -1)},"gpus":${gpus}}`);
  };
}
