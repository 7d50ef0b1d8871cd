// keepTickObjectShape holds a real process.nextTick entry for the life of the process, and later
// entries share its hidden class: what keeps V8's fast path for nextTick (see src/tick-shape.ts).
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';
import { keepTickObjectShape } from '../src/tick-shape.js';

const BUILT = fileURLToPath(new URL('../dist/src/tick-shape.js', import.meta.url));

t.test('the entry held is a nextTick entry, and the same one on every call', async (t) => {
  const kept = await keepTickObjectShape();
  // If a Node release builds tick entries differently, this says the workaround needs a new look.
  const symbols = Object.getOwnPropertySymbols(kept).map((symbol) => symbol.description);
  t.ok(symbols.includes('async_id_symbol') && symbols.includes('trigger_async_id_symbol'), `keyed by the async id symbols: ${symbols.join(', ')}`);
  t.same(Object.keys(kept), ['callback', 'args']);
  t.equal(await keepTickObjectShape(), kept);
});

t.test('the module itself holds the entry through full garbage collections, and later entries share its hidden class', async (t) => {
  // gc() and %HaveSameMap exist only behind --expose-gc and --allow-natives-syntax: a child. The
  // script keeps only a WeakRef, so the entry survives the collections only if the module holds it.
  const script = `
    const { executionAsyncResource } = await import('node:async_hooks');
    const { keepTickObjectShape } = await import(${JSON.stringify(BUILT)});
    const ref = new WeakRef(await keepTickObjectShape());
    const survived = [];
    for (let i = 0; i < 3; i += 1) {
      await new Promise((resolve) => setTimeout(resolve, 0));
      globalThis.gc();
      survived.push(ref.deref() !== undefined);
    }
    const later = await new Promise((resolve) => process.nextTick(() => resolve(executionAsyncResource())));
    console.log(JSON.stringify({ survived, sameMap: later !== ref.deref() && %HaveSameMap(later, ref.deref()) }));
  `;
  // The child runs as the service does, without tap's coverage loader. tap puts the loader back into
  // the environment of every child it sees start, so `env -i` clears it after that. Under the loader
  // Node 24 builds the first tick entries with small-integer async ids and later ones with heap
  // numbers, so V8 replaces the held entry's map once, whatever this module does.
  const node = [process.execPath, '--allow-natives-syntax', '--expose-gc', '--input-type=module', '--eval', script];
  const { stdout } = await promisify(execFile)('env', ['-i', `PATH=${process.env.PATH ?? ''}`, ...node]);
  t.same(JSON.parse(stdout), { survived: [true, true, true], sameMap: true });
});
