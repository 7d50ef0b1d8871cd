// Owns how often a failure that repeats is logged as a warning: the first time, then at most once a
// minute while it goes on, its repeats at debug level. Pollers and controllers retry every second, so
// a failure that lasts (nvidia-smi down, a caller with a stale token) would otherwise flood the log,
// and a flood hides the one line that matters. Used by app.ts (coded 5xx answers) and auth.ts
// (refused writes), each with its own memory.

/** How often the same failure is logged as a warning while it repeats. */
export const REPEATED_WARNING_MS = 60_000;
/** Distinct failures remembered; past it the memory starts afresh (keys may carry ids and addresses). */
export const DISTINCT_FAILURES_KEPT = 100;

/** The level to log a failure at, by its key: 'warn' the first time and once a minute after, else 'debug'. */
export type RepeatLimit = (key: string) => 'warn' | 'debug';

export function createRepeatLimit(now: () => number): RepeatLimit {
  const warnedAt = new Map<string, number>();
  return (key) => {
    const last = warnedAt.get(key);
    if (last !== undefined && now() - last < REPEATED_WARNING_MS) return 'debug';
    if (warnedAt.size >= DISTINCT_FAILURES_KEPT) warnedAt.clear();
    warnedAt.set(key, now());
    return 'warn';
  };
}
