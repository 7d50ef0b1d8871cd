// Owns one workaround for V8, found by profiling the probe path. Node builds each process.nextTick
// entry as an object literal with two symbol keys (async ids) and two named ones, several times per
// HTTP request. V8 defines those keys fast while the literal keeps meeting the hidden class (map) it
// was tuned for; one change of that map and V8 marks the site megamorphic for good, after which every
// nextTick defines its keys through V8's runtime. In this service (not in a bare Fastify app) the map
// changes once during start-up, most likely because a garbage collection finds no tick object alive
// and drops it. Measured with perf on the probe path: about 6% of the server's CPU time per request
// went to that runtime work. Holding one tick object for the life of the process keeps its map
// alive, and the fast path with it: the runtime calls were gone in every profiled run.
import { executionAsyncResource } from 'node:async_hooks';

let kept: Promise<object> | null = null;

/**
 * Holds one process.nextTick entry until the process exits. Call it early: once the site has gone
 * megamorphic, nothing brings it back. Later calls return the same object.
 */
export function keepTickObjectShape(): Promise<object> {
  // Inside a nextTick callback the current async resource is that tick's own entry.
  kept ??= new Promise((resolve) => process.nextTick(() => resolve(executionAsyncResource())));
  return kept;
}
