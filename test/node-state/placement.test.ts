// Where a shard's given GPUs are in one listing: by UUID where the registration kept them (an index
// nvidia-smi gave another device since does not count), by index where it did not.
import t from 'tap';
import { placedIndices, placementOf, unreachableGiven, type UnreachableListedGpu } from '../../src/node-state/placement.js';
import { gpuState } from '../helpers/gpu-state.js';
import { shardRecord } from '../helpers/hand-made-view.js';

/** A listed GPU at `index` that is the device `uuid`. */
const device = (index: number, uuid: string) => ({ ...gpuState(index, []), uuid });

t.test('by UUID: a device under a new index keeps the shard, a lost one is unlisted even when its index is taken', async (t) => {
  const shard = shardRecord(0, { gpus: [1, 2], gpuUuids: ['GPU-b', 'GPU-c'] });
  const renumbered = [device(0, 'GPU-a'), device(1, 'GPU-c')];
  t.same(placementOf(shard, renumbered), {
    indices: [1],
    unlisted: [{ index: 1, uuid: 'GPU-b' }],
    renumbered: [{ registered: 2, now: 1, uuid: 'GPU-c' }],
  });
  t.same(placedIndices(shard, renumbered), [1]);
  t.same(placementOf(shard, [device(0, 'GPU-a'), device(1, 'GPU-b'), device(2, 'GPU-c')]), { indices: [1, 2], unlisted: [], renumbered: [] }, 'as registered');
});

t.test('by index without UUIDs (taken on trust, or stored by an older version); as registered without a listing', async (t) => {
  const shard = shardRecord(0, { gpus: [1, 2] });
  t.same(placementOf(shard, [device(0, 'GPU-a'), device(1, 'GPU-c')]), { indices: [1], unlisted: [{ index: 2, uuid: undefined }], renumbered: [] });
  t.same(placedIndices(shard, null), [1, 2]);
  t.same(placementOf(shardRecord(0, { gpus: [] }), [device(0, 'GPU-a')]), { indices: [], unlisted: [], renumbered: [] }, 'a CPU shard');
});

t.test('an unreachable GPU is matched with a shard by UUID: after a renumbering, not with the shard registered under its index now', async (t) => {
  // GPU-a went: GPU-b (registered as 1) is 0 now, GPU-c (registered as 2) is 1; then nvidia-smi cannot reach GPU-c.
  const gpuC: UnreachableListedGpu = { busId: '00000000:03:00.0', said: 'GPU is lost', listed: { index: 1, uuid: 'GPU-c', name: 'NVIDIA H200' } };
  t.same(unreachableGiven(shardRecord(0, { gpus: [1], gpuUuids: ['GPU-b'] }), [gpuC]), [], "GPU-b's shard is not on it, though it was registered as GPU 1");
  t.same(unreachableGiven(shardRecord(0, { gpus: [2], gpuUuids: ['GPU-c'] }), [gpuC]), [gpuC], "GPU-c's shard is, registered as GPU 2");
  t.same(unreachableGiven(shardRecord(0, { gpus: [1] }), [gpuC]), [gpuC], 'without UUIDs, by index');
});
