// Owns how often a repeating failure is logged as a warning: the first time, then at most once a
// minute, its repeats at debug level, so callers retrying every second do not flood the log.

/** How often the same failure is logged as a warning while it repeats. */
export const REPEATED_WARNING_MS = 60_000;
/** Distinct failures remembered; past it the memory starts afresh (keys may carry ids and addresses). */
const DISTINCT_FAILURES_KEPT = 100;

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
