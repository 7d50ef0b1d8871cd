// stuck-io.ts: an operation is listed as stuck only once its bound passes, until it returns; an exit
// waits for the operations under way to return or be listed, and no longer.
import t from 'tap';
import { operationsKnown, operationsUnderWay, stuckOperations, watch } from '../../src/system/stuck-io.js';

const about = { what: 'A read of a test file', file: '/nowhere/file', fix: 'Nothing to do.' };

/** A promise the test settles. */
function gate() {
  let open = (): void => undefined;
  const promise = new Promise<string>((resolve) => {
    open = () => resolve('done');
  });
  return { promise, open };
}

/** Whether `promise` has settled by the time already-queued work has run. */
async function settledNow(promise: Promise<unknown>): Promise<boolean> {
  let settled = false;
  void promise.then(() => (settled = true));
  await new Promise((resolve) => setImmediate(resolve));
  return settled;
}

t.test('an operation that returns within its bound is never listed; an exit waits for it to return', async (t) => {
  const operation = gate();
  let stuck = 0;
  const watched = watch(operation.promise, 60_000, about, () => void stuck++);
  t.same(operationsUnderWay(0), [about], 'under way');
  t.same(operationsUnderWay(60_000), [], 'not for a minute yet');
  const known = operationsKnown();
  t.notOk(await settledNow(known), 'the exit waits while it is under way');
  operation.open();
  t.equal(await watched, 'done', 'it settles as the operation does');
  await known;
  t.same(operationsUnderWay(0), []);
  t.same(stuckOperations(), []);
  t.equal(stuck, 0);
  t.ok(await settledNow(operationsKnown()), 'nothing under way: an exit waits for nothing');
});

t.test('an operation pending past its bound is listed, once, until it returns; an exit waits for it to be listed, not to return', async (t) => {
  const operation = gate();
  // A real operation holds the event loop open (its bound's timer does not): so must the test.
  const held = setInterval(() => undefined, 1000);
  t.teardown(() => clearInterval(held));
  let stuck = 0;
  const watched = watch(operation.promise, 50, about, () => void stuck++);
  await operationsKnown();
  t.same(stuckOperations(), [about], 'listed once the bound passed: an exit then knows');
  t.same(operationsUnderWay(0), [], 'no longer counted as under way');
  t.equal(stuck, 1);
  t.ok(await settledNow(operationsKnown()), 'a listed operation holds no exit up');
  operation.open();
  await watched;
  t.same(stuckOperations(), [], 'off the list once it returns');
  t.equal(stuck, 1);
});
