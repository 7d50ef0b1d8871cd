// Owns the one way a wait is bounded: a piece of work raced against a timer. Whichever settles first
// answers; the timer ends with the work, and the work is never cancelled (what it does once late is
// the caller's to decide, through what onLate records).

/**
 * Settles as `work` does, or, if `ms` pass first, as `onLate` does (its value, or what it throws).
 * `unref`: the timer alone does not keep the process alive (a look a shutdown need not wait for).
 */
export function settleWithin<T, L>(work: Promise<T>, ms: number, onLate: () => L, options: { unref?: boolean } = {}): Promise<T | L> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, ms);
    if (options.unref) timer.unref();
  }).then(onLate);
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
