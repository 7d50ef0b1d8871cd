// The pre-serialised /gpus body (routes/snapshot-json.ts): serialised once per node view and set of
// unreachable GPUs, and its ETag content with it, so that a GPU nvidia-smi turns out unable to reach,
// on the same snapshot, changes both the body and the tag, and the same answer keeps both.
import t from 'tap';
import type { FastifyReply } from 'fastify';
import { createSnapshotJson } from '../../routes/snapshot-json.js';
import { gpusResponse } from '../../src/node-state/node-view.js';
import type { UnreachableListedGpu } from '../../src/node-state/placement.js';
import type { SnapshotView } from '../../src/node-state/snapshot.js';
import { gpuState } from '../helpers/gpu-state.js';
import { handMadeView } from '../helpers/hand-made-view.js';

const NOW = Date.parse('2026-12-02T12:00:00Z');
const LOST = 'GPU is lost. Reboot the system to recover this GPU';

/** A reply that keeps what is sent: snapshot-json only sets the type and sends a buffer. */
function capture(): { reply: FastifyReply; body: () => { gpus: Array<{ index: number; unreachable: string | null }> } } {
  let sent: Buffer | null = null;
  const reply = {
    type: () => reply,
    send: (body: Buffer) => {
      sent = body;
    },
  };
  return { reply: reply as unknown as FastifyReply, body: () => JSON.parse(String(sent)) };
}

t.test('one snapshot, then GPU 1 unreachable: another body and another tag; the same unreachable GPUs, the same tag', async (t) => {
  const node = handMadeView({ now: NOW, gpus: [gpuState(0, []), gpuState(1, [])] }, []);
  const view: SnapshotView<unknown> = { snapshot: node.snapshot, observedAt: NOW, startedAt: NOW, ageMs: 5000, stale: true, staleReason: 'the last refresh failed', failing: true, slow: false };
  const json = createSnapshotJson(gpusResponse);
  const none: readonly UnreachableListedGpu[] = [];
  const gpu1: readonly UnreachableListedGpu[] = [{ busId: '00000000:02:00.0', said: LOST, listed: { index: 1, uuid: 'GPU-1', name: 'NVIDIA H200' } }];

  const reachable = capture();
  json.send(reachable.reply, view, node, none);
  t.same(reachable.body().gpus.map((gpu) => gpu.unreachable), [null, null]);
  const unreachable = capture();
  json.send(unreachable.reply, view, node, gpu1);
  t.same(unreachable.body().gpus.map((gpu) => gpu.unreachable), [null, LOST], 'the same view, sent again with GPU 1 unreachable, says so');
  t.not(json.tag(node, gpu1), json.tag(node, none), 'and its ETag content differs');

  t.equal(json.tag(node, [...gpu1]), json.tag(node, gpu1), 'the content decides the tag, not which array says it');
  const again = capture();
  json.send(again.reply, view, node, none);
  t.same(again.body().gpus.map((gpu) => gpu.unreachable), [null, null], 'reachable again: the first answer once more');
});
