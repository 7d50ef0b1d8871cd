// Owns the node snapshot cache: every answer of the service is derived from one snapshot, and this
// module decides when a new one is taken. nvidia-smi is slow (seconds on big nodes) and can hang in
// the kernel, so the cache is
//   - TTL-bound: at most one refresh per TTL window, however many requests arrive;
//   - single-flight: concurrent requests share the one refresh under way;
//   - stale-while-revalidate: past the TTL but within max-stale, requests get the cached snapshot at
//     once (marked stale) while one refresh runs in the background;
//   - failure-aware: a failed refresh is remembered for one TTL window, doubling with each failure
//     in a row up to 30 s (no retry storm); within max-stale the last good snapshot is served with
//     the reason, beyond it callers get the error at once, also while the retry after the window
//     runs (only the caller that starts the retry waits for it);
//   - registry-aware: after a registration or removal, snapshots taken before it are stale and the
//     next request starts a refresh;
//   - fair to nvidia-smi: a stale answer is routine (one refresh period behind while the next runs)
//     and says so neutrally; it blames nvidia-smi only when the last refresh failed or the one under
//     way runs far longer than usual (see slowAfterMs), and only then is it `failing` or `slow`,
//     the two states worth a warning.
// A caller that must wait never waits past the refresh's own hard timeout, and may ask for less
// (probes keep Kubernetes' 1 s limit).
import type { Logger } from 'pino';
import { formatDuration } from '../duration.js';
import { NvidiaSmiTimeoutError } from '../errors.js';

export interface SnapshotView<S> {
  snapshot: S;
  /** When the snapshot was taken (ms since the epoch): ages and the TTL count from here. */
  observedAt: number;
  /**
   * When the refresh that took it began: nothing it shows was read before this. Verdicts that
   * depend on time (a grace window) judge the evidence by this moment, not by when it landed.
   */
  startedAt: number;
  ageMs: number;
  /** Older than the TTL (a refresh is running, is due or has failed), or older than the registry. */
  stale: boolean;
  staleReason: string | null;
  /** The last refresh failed (the snapshot is the last good one). */
  failing: boolean;
  /** The refresh under way has run far longer than usual (see slowAfterMs): nvidia-smi is slow now. */
  slow: boolean;
}

export interface SnapshotSourceOptions<S> {
  /** Takes one snapshot; its own timeouts bound how long it runs. */
  take: () => Promise<S>;
  ttlMs: number;
  maxStaleMs: number;
  log: Logger;
  now: () => number;
}

export interface GetOptions {
  /** Longest this caller will wait for a refresh it needs; past it the call fails with a timeout error. */
  maxWaitMs?: number;
}

export interface SnapshotSource<S> {
  get(options?: GetOptions): Promise<SnapshotView<S>>;
  /**
   * What get() answers when it need not wait (fresh, or within max-stale with a refresh started in
   * the background), at once and without a promise; null when get() would wait. The hot path of
   * probes.
   */
  available(): SnapshotView<S> | null;
  /** The cached snapshot as it is, without refreshing; null before the first success. */
  peek(): SnapshotView<S> | null;
  /**
   * The shard registry changed: every snapshot whose refresh started before now is stale (its /proc
   * reads may miss the new shard), and the next get() starts a refresh.
   */
  invalidate(): void;
  /** Whether a refresh is under way (tests and the benchmarks wait on it). */
  readonly refreshing: boolean;
  /** Bumped on every successful refresh; part of ETags. */
  readonly generation: number;
  /** The error of the latest refresh while none has succeeded since it; null otherwise. */
  readonly lastError: Error | null;
  /**
   * While a recent failure holds nvidia-smi back (its window, see recentFailure) and nothing runs,
   * the ms until a request may start the next refresh; null when one may start now or is under way.
   * What a 503 tells its client to wait (Retry-After).
   */
  readonly backOffMs: number | null;
}

/**
 * The Retry-After, in whole seconds, of a 503 for `err`: while the snapshots' own failure is waited
 * out, nvidia-smi is not run again, so asking sooner gets the same answer. Null for any other error,
 * and while the retry may start now or runs.
 */
export function retryAfterSeconds(snapshots: Pick<SnapshotSource<unknown>, 'lastError' | 'backOffMs'>, err: Error): number | null {
  const backOffMs = err === snapshots.lastError ? snapshots.backOffMs : null;
  return backOffMs === null ? null : Math.ceil(backOffMs / 1000);
}

/**
 * Why a view's staleness is worth a warning: the last refresh failed, or the one under way is slow.
 * Null when it is routine (one refresh period behind, or just behind a registry change) or fresh.
 */
export function staleNews(view: SnapshotView<unknown>): string | null {
  return view.failing || view.slow ? view.staleReason : null;
}

interface Good<S> {
  snapshot: S;
  observedAt: number;
  startedAt: number;
  /** The invalidation epoch its refresh started in: an older one predates a registry change. */
  epoch: number;
}

interface Failure {
  error: Error;
  at: number;
  epoch: number;
  /** When this run of identical failures began. */
  since: number;
  /** Failures in a row, whatever their reason. */
  count: number;
}

const MAX_FAILURE_WINDOW_MS = 30_000;

/**
 * When a refresh under way counts as slow, so that stale answers blame nvidia-smi: once it has run
 * SLOW_REFRESH_FACTOR times as long as the last successful refresh took, and at least
 * SLOW_REFRESH_MIN_MS. Relative to the last refresh rather than to a fixed budget (the probe wait,
 * say), because what is usual differs by node: tens of milliseconds on a small node, seconds on a
 * big one without persistence mode. The doctor reports a node whose queries are always slow, once;
 * repeating it in every answer is noise. A driver in trouble, or a hang on its way to the timeout,
 * shows as a refresh taking several times its usual time. The floor is the doctor's own mark for a
 * slow query (1 s): below it nobody calls nvidia-smi slow, so a node whose refreshes take 5 ms does
 * not blame it for one of 20 ms.
 */
export const SLOW_REFRESH_FACTOR = 3;
export const SLOW_REFRESH_MIN_MS = 1000;

export function slowAfterMs(lastRefreshMs: number): number {
  return Math.max(SLOW_REFRESH_MIN_MS, SLOW_REFRESH_FACTOR * lastRefreshMs);
}

export function createSnapshotSource<S>(options: SnapshotSourceOptions<S>): SnapshotSource<S> {
  const { take, ttlMs, maxStaleMs, log } = options;
  const { now } = options;
  let good: Good<S> | null = null;
  let lastFailure: Failure | null = null;
  let inFlight: Promise<Good<S>> | null = null;
  let inFlightSince = 0;
  let epoch = 0;
  let generation = 0;
  /** How long the last successful refresh took, from its start to its snapshot. */
  let lastRefreshMs = 0;

  function refresh(): Promise<Good<S>> {
    if (inFlight) return inFlight;
    const startedAt = now();
    inFlightSince = startedAt;
    const startedIn = epoch;
    const run = take().then(
      (snapshot) => {
        good = { snapshot, observedAt: now(), startedAt, epoch: startedIn };
        lastRefreshMs = Math.max(0, good.observedAt - startedAt);
        generation += 1;
        if (lastFailure) log.info({ failedForMs: now() - lastFailure.since }, 'Node snapshots work again');
        lastFailure = null;
        return good;
      },
      (error: Error) => {
        // One line when failing starts or its reason changes, not one per attempt.
        const repeated = lastFailure !== null && lastFailure.error.message === error.message;
        lastFailure = { error, at: now(), epoch: startedIn, since: repeated ? lastFailure!.since : now(), count: (lastFailure?.count ?? 0) + 1 };
        if (!repeated) {
          const consequence = good
            ? 'Answers use the last good snapshot while it is younger than max-stale (marked stale), then fail with this error.'
            : 'There is no snapshot yet: GPU answers are 503 with this error until it is fixed, and no shard can be seen on its GPUs (one registered since nodecompute started reads starting; see the README, "While nvidia-smi cannot be asked").';
          log.warn(
            { code: (error as { code?: string }).code, lastGoodAgeMs: good ? now() - good.observedAt : null },
            `Node snapshot refresh failed: ${error.message} ${consequence}`,
          );
        }
        throw error;
      },
    );
    inFlight = run.finally(() => {
      inFlight = null;
    });
    // A background refresh's failure is recorded above; nobody else awaits it.
    inFlight.catch(() => undefined);
    return inFlight;
  }

  /** How long the refresh under way has run when it runs past slowAfterMs; null otherwise. */
  function slowFor(): number | null {
    if (!inFlight) return null;
    const running = now() - inFlightSince;
    return running > slowAfterMs(lastRefreshMs) ? running : null;
  }

  function view(current: Good<S>): SnapshotView<S> {
    const ageMs = Math.max(0, now() - current.observedAt);
    const stale = ageMs > ttlMs || current.epoch !== epoch;
    const slow = stale ? slowFor() : null;
    return {
      snapshot: current.snapshot,
      observedAt: current.observedAt,
      startedAt: current.startedAt,
      ageMs,
      stale,
      staleReason: stale ? staleReason(current, ageMs, slow) : null,
      failing: lastFailure !== null,
      slow: slow !== null,
    };
  }

  function staleReason(current: Good<S>, ageMs: number, slow: number | null): string {
    if (lastFailure) return `the last refresh failed: ${lastFailure.error.message}`;
    if (slow !== null) {
      return (
        `nvidia-smi is slow: a refresh has been running for ${formatDuration(slow)} (the last one took ${formatDuration(lastRefreshMs)}), ` +
        `so answers come from a snapshot ${formatDuration(ageMs)} old until it lands or times out. If this persists, check dmesg for Xid errors and run \`nodecompute doctor\`.`
      );
    }
    if (current.epoch !== epoch) return 'the shard registry changed since it was taken; a refresh is under way';
    if (inFlight) return `refreshing: this snapshot is ${formatDuration(ageMs)} old and a newer one is being taken`;
    return 'a refresh is due';
  }

  /**
   * A recent failure is the answer: no new run until its window passes. The window is one TTL, and
   * doubles with each failure in a row up to 30 s: a wedged driver leaves nvidia-smi processes stuck
   * in the kernel that even SIGKILL cannot end, and each retry would add two more.
   */
  function recentFailure(): Error | null {
    return backOffLeft() === null ? null : lastFailure!.error;
  }

  /** The ms left of the latest failure's window; null when there is none or it has passed. */
  function backOffLeft(): number | null {
    if (!lastFailure || lastFailure.epoch !== epoch) return null;
    const window = Math.min(Math.max(ttlMs, 1) * 2 ** (lastFailure.count - 1), MAX_FAILURE_WINDOW_MS);
    const left = lastFailure.at + window - now();
    return left > 0 ? left : null;
  }

  function maybeRefreshInBackground(): void {
    if (inFlight || recentFailure()) return;
    refresh();
  }

  /**
   * What a caller with no snapshot to serve is answered at once instead of waiting: the latest
   * failure, within its window and also while the retry after it runs. That retry asks a driver that
   * has just failed; joining it would hold every caller up to nvidia-smi's timeout for what is most
   * likely the same answer. The caller that starts the retry waits for it, so the first request
   * after the window sees a fixed nvidia-smi.
   */
  function failureToAnswer(): Error | null {
    return recentFailure() ?? (inFlight && lastFailure ? lastFailure.error : null);
  }

  async function waitForRefresh(maxWaitMs: number | undefined): Promise<Good<S>> {
    const failure = failureToAnswer();
    if (failure) throw failure;
    const pending = refresh();
    if (maxWaitMs === undefined) return pending;
    let timer: NodeJS.Timeout | undefined;
    const budget = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(
          new NvidiaSmiTimeoutError(
            `nvidia-smi has not answered within this request's ${maxWaitMs} ms budget and no snapshot younger than max-stale is cached. ` +
              'The refresh goes on in the background; if this persists, check the driver (dmesg) and run `nodecompute doctor`.',
          ),
        );
      }, maxWaitMs);
    });
    try {
      return await Promise.race([pending, budget]);
    } finally {
      clearTimeout(timer);
    }
  }

  function available(): SnapshotView<S> | null {
    const current = good;
    if (current === null) return null;
    const age = now() - current.observedAt;
    if (age <= ttlMs && current.epoch === epoch) return view(current);
    if (age > maxStaleMs) return null;
    maybeRefreshInBackground();
    return view(current);
  }

  return {
    async get(getOptions: GetOptions = {}) {
      return available() ?? view(await waitForRefresh(getOptions.maxWaitMs));
    },
    available,
    peek() {
      return good ? view(good) : null;
    },
    invalidate() {
      epoch += 1;
    },
    get refreshing() {
      return inFlight !== null;
    },
    get generation() {
      return generation;
    },
    get lastError() {
      return lastFailure?.error ?? null;
    },
    get backOffMs() {
      return inFlight ? null : backOffLeft();
    },
  };
}
