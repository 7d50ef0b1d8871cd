// Owns what the process knows of its file operations that may never return: a read or a write on a
// hung network mount. Such an operation cannot be cancelled, and Node's exit waits for it (libuv
// joins the threadpool thread it blocks), so main.ts ends the process by a signal while one is stuck.
// Each is watched with a bound (watch()): past it, the operation is listed as stuck until it returns.
// An exit first waits for the operations under way to return or be listed (operationsKnown()), which
// their bounds keep short: one that started just before the exit and then hangs would otherwise be
// listed only after the exit had begun to wait for it.

export interface StuckOperation {
  /** What is pending, as a log line starts it: "A read of the token file". */
  what: string;
  /** The file it waits on. */
  file: string;
  /** What to check or change so that it does not happen again. */
  fix: string;
}

const stuck = new Set<StuckOperation>();
/** Each operation under way and not listed yet (with when it started), by a promise that settles once it returns or is listed. */
const underWay = new Map<Promise<void>, { operation: StuckOperation; since: number }>();

/**
 * Settles as `operation` does. Once it has been pending `boundMs`, it is listed as stuck (`about`
 * says what it is) and `onStuck` is told; it comes off the list when it returns.
 */
export function watch<T>(operation: Promise<T>, boundMs: number, about: StuckOperation, onStuck: () => void): Promise<T> {
  const entry = { ...about };
  let listed = false;
  let known!: () => void;
  const knownPromise = new Promise<void>((resolve) => {
    known = () => {
      underWay.delete(knownPromise);
      resolve();
    };
  });
  underWay.set(knownPromise, { operation: entry, since: Date.now() });
  const timer = setTimeout(() => {
    listed = true;
    stuck.add(entry);
    known();
    onStuck();
  }, boundMs);
  timer.unref();
  return operation.finally(() => {
    clearTimeout(timer);
    if (listed) stuck.delete(entry);
    known();
  });
}

/** The operations pending past their bound now, in the order they got stuck. */
export function stuckOperations(): StuckOperation[] {
  return [...stuck];
}

/**
 * The operations under way for at least `minAgeMs` whose bound has not passed yet: an exit that
 * cannot wait for them may hang on one.
 */
export function operationsUnderWay(minAgeMs: number): StuckOperation[] {
  const now = Date.now();
  return [...underWay.values()].filter(({ since }) => now - since >= minAgeMs).map(({ operation }) => operation);
}

/** Settles once every operation under way now has returned or been listed as stuck (within its bound). */
export async function operationsKnown(): Promise<void> {
  await Promise.all([...underWay.keys()]);
}
