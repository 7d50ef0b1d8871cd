// keepTickObjectShape holds a real process.nextTick entry, and later entries keep its hidden class
// through garbage collections: what keeps V8's fast path for nextTick (see src/tick-shape.ts).
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';
import { keepTickObjectShape } from '../src/tick-shape.js';

const BUILT = fileURLToPath(new URL('../dist/src/tick-shape.js', import.meta.url));

t.test('the object held is a nextTick entry, and the same one on every call', async (t) => {
  const kept = await keepTickObjectShape();
  // If a Node release builds tick entries differently, this says the workaround needs a new look.
  t.same(
    Object.getOwnPropertySymbols(kept).map((symbol) => symbol.description),
    ['async_id_symbol', 'trigger_async_id_symbol'],
    'keyed by the async id symbols, first',
  );
  t.same(Object.keys(kept), ['callback', 'args']);
  t.equal(await keepTickObjectShape(), kept);
});

t.test('later tick entries keep the held entry\'s hidden class through full garbage collections', async (t) => {
  // V8 intrinsics (%HaveSameMap) exist only behind --allow-natives-syntax, so this runs in a child.
  // The script is a string passed to Function so that this file stays plain TypeScript.
  const script = `
    const { executionAsyncResource } = await import('node:async_hooks');
    const { keepTickObjectShape } = await import(${JSON.stringify(BUILT)});
    const sameMap = new Function('a', 'b', 'return %HaveSameMap(a, b)');
    const kept = await keepTickObjectShape();
    const results = [];
    for (let i = 0; i < 5; i += 1) {
      globalThis.gc();
      const later = await new Promise((resolve) => process.nextTick(() => resolve(executionAsyncResource())));
      results.push(later !== kept && sameMap(kept, later));
    }
    console.log(JSON.stringify(results));
  `;
  const { stdout } = await promisify(execFile)(process.execPath, ['--allow-natives-syntax', '--expose-gc', '--input-type=module', '--eval', script]);
  t.same(JSON.parse(stdout), [true, true, true, true, true]);
});
