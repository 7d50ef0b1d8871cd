// Owns one workaround for V8, found by profiling the probe path on Node 20 (V8 11.3). Node builds
// each process.nextTick entry as an object literal keyed by async-id symbols, `callback` and `args`,
// several times per HTTP request. V8 defines those keys fast while the literal keeps meeting the
// hidden class (map) it was tuned for; one change of that map and V8 marks the site megamorphic for
// good, after which every nextTick defines its keys through V8's runtime. In this service (not in a
// bare Fastify app) the map changes once during start-up, most likely because a garbage collection
// finds no tick entry alive and drops it. Measured with perf: about 6% of the server's CPU per probe
// went to that runtime work; an interleaved A/B without the workaround took 8% more CPU per probe.
// Holding one entry for the life of the process keeps its map alive, and the fast path with it: the
// runtime calls were gone in every profiled run. Node 24 (V8 13.6, the image's runtime) is the same:
// without the workaround perf shows the runtime path, and an interleaved A/B took 23% more CPU per
// /shards/:id/ready probe (10% per /gpus/foreign-memory). It adds a key (the async context frame).
//
// A module preloaded with --import can make Node build its first tick entries differently: under
// tap's coverage loader, Node 24 gives the first ones small-integer async ids and later ones heap
// numbers, and V8 replaces the held entry's map once. One profiled server under that loader showed
// no runtime path all the same.
//
// Side effect: calling executionAsyncResource() tells Node that async resources are looked at, so
// callbacks from native code pass through its async-resource trampoline from then on. Capturing the
// entry with a one-shot async_hooks init hook instead measured the same per probe; this way needs
// no hook.
import { executionAsyncResource } from 'node:async_hooks';

let kept: Promise<object> | null = null;

/**
 * Holds one process.nextTick entry until the process exits, from the next tick on. Call it early:
 * once the site has gone megamorphic, nothing brings it back. Later calls return the same entry.
 */
export function keepTickObjectShape(): Promise<object> {
  // Inside a nextTick callback the current async resource is that tick's own entry.
  kept ??= new Promise((resolve) => process.nextTick(() => resolve(executionAsyncResource())));
  return kept;
}
