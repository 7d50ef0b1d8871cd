// Owns the snapshot cache every answer derives from: at most one refresh per TTL, shared by all
// callers; within max-stale the cached snapshot is served (stale) while one refreshes in the
// background; a failure is remembered for a window that doubles up to 30 s; a registry change makes
// every earlier snapshot stale. Stale is routine: only a failing or slow refresh is worth a warning.
import type { Logger } from 'pino';
import { settleWithin } from '../deadline.js';
import { formatDuration } from '../duration.js';
import { NvidiaSmiTimeoutError } from '../errors.js';

export interface SnapshotView<S> {
  snapshot: S;
  /** When the snapshot was taken (ms since the epoch); ages count from here. */
  observedAt: number;
  /** When its refresh began: time-bound verdicts (a grace window) judge the evidence by this. */
  startedAt: number;
  ageMs: number;
  /** Older than the TTL or the registry; `failing`: the last refresh failed; `slow`: the one under way runs long. */
  stale: boolean;
  staleReason: string | null;
  failing: boolean;
  slow: boolean;
}

/** `maxWaitMs`: the longest this caller waits for a refresh; past it the call fails with a timeout error, saying `late` when given. */
export type GetOptions = { maxWaitMs?: number; late?: string };

export type SnapshotSource<S> = ReturnType<typeof createSnapshotSource<S>>;

/** A 503's Retry-After (whole seconds) for `err` while the snapshots' own failure is waited out; else null. */
export function retryAfterSeconds(snapshots: Pick<SnapshotSource<unknown>, 'lastError' | 'backOffMs'>, err: Error): number | null {
  const backOffMs = err === snapshots.lastError ? snapshots.backOffMs : null;
  return backOffMs === null ? null : Math.ceil(backOffMs / 1000);
}

/** Why a view's staleness is worth a warning (failing or slow); null when it is routine or fresh. */
export function staleNews(view: SnapshotView<unknown>): string | null {
  return view.failing || view.slow ? view.staleReason : null;
}

/** Slow: 3 times as long as the last good refresh took (usual differs by node), and at least the doctor's 1 s mark. */
export function slowAfterMs(lastRefreshMs: number): number {
  return Math.max(1000, 3 * lastRefreshMs);
}

const MAX_FAILURE_WINDOW_MS = 30_000;

/** `epoch`: the invalidation epoch its refresh started in. */
type Good<S> = { snapshot: S; observedAt: number; startedAt: number; epoch: number };

/** `since`: when this run of identical failures began; `count`: failures in a row, whatever their reason. */
type Failure = { error: Error; at: number; epoch: number; since: number; count: number };

type Options<S> = { take: () => Promise<S>; ttlMs: number; maxStaleMs: number; log: Logger; now: () => number };

export function createSnapshotSource<S>({ take, ttlMs, maxStaleMs, log, now }: Options<S>) {
  let good: Good<S> | null = null;
  let lastFailure: Failure | null = null;
  let inFlight: Promise<Good<S>> | null = null;
  let inFlightSince = 0;
  let epoch = 0;
  let generation = 0;
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
            : 'No snapshot yet: GPU answers are 503 with this error until it is fixed, and shards registered since the start read starting.';
          const fields = { code: (error as { code?: string }).code, lastGoodAgeMs: good ? now() - good.observedAt : null };
          log.warn(fields, `Node snapshot refresh failed: ${error.message} ${consequence}`);
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

  function view(current: Good<S>): SnapshotView<S> {
    const ageMs = Math.max(0, now() - current.observedAt);
    const stale = ageMs > ttlMs || current.epoch !== epoch;
    const running = inFlight ? now() - inFlightSince : 0;
    const slow = stale && running > slowAfterMs(lastRefreshMs);
    return {
      snapshot: current.snapshot,
      observedAt: current.observedAt,
      startedAt: current.startedAt,
      ageMs,
      stale,
      staleReason: stale ? staleReason(current, ageMs, slow ? running : null) : null,
      failing: lastFailure !== null,
      slow,
    };
  }

  function staleReason(current: Good<S>, ageMs: number, slowFor: number | null): string {
    if (lastFailure) return `the last refresh failed: ${lastFailure.error.message}`;
    if (slowFor !== null) {
      const running = `a refresh has been running for ${formatDuration(slowFor)} (the last one took ${formatDuration(lastRefreshMs)})`;
      const persists = 'If this persists, check dmesg for Xid errors and run `nodecompute doctor`.';
      return `the GPU driver is slow: ${running}, so answers come from a snapshot ${formatDuration(ageMs)} old until it lands or times out. ${persists}`;
    }
    if (current.epoch !== epoch) return 'the shard registry changed since it was taken; a refresh is under way';
    if (inFlight) return `refreshing: this snapshot is ${formatDuration(ageMs)} old and a newer one is being taken`;
    return 'a refresh is due';
  }

  // Within a failure's window (one TTL, doubling per failure in a row) the failure is the answer: a
  // wedged driver leaves nvidia-smi stuck where SIGKILL cannot end it, and each retry adds more.
  function backOffLeft(): number | null {
    if (!lastFailure || lastFailure.epoch !== epoch) return null;
    const window = Math.min(Math.max(ttlMs, 1) * 2 ** (lastFailure.count - 1), MAX_FAILURE_WINDOW_MS);
    const left = lastFailure.at + window - now();
    return left > 0 ? left : null;
  }

  /** What get() answers without waiting: the cached snapshot within max-stale (refreshing it when stale); null otherwise. */
  function available(): SnapshotView<S> | null {
    if (good === null) return null;
    const age = now() - good.observedAt;
    if (age > ttlMs || good.epoch !== epoch) {
      if (age > maxStaleMs) return null;
      if (!inFlight && backOffLeft() === null) refresh();
    }
    return view(good);
  }

  async function waitForRefresh({ maxWaitMs, late }: GetOptions): Promise<Good<S>> {
    // With nothing to serve, a failure within its window, or while the retry after it runs, is answered
    // at once: only the caller that starts the retry waits for it.
    if (lastFailure && (backOffLeft() !== null || inFlight)) throw lastFailure.error;
    const pending = refresh();
    if (maxWaitMs === undefined) return pending;
    const unanswered = `the GPU driver has not answered within this request's ${maxWaitMs} ms and no snapshot younger than max-stale is cached`;
    const message = late ?? `${unanswered}; if this persists, check dmesg and run \`nodecompute doctor\`.`;
    return settleWithin(pending, maxWaitMs, () => {
      throw new NvidiaSmiTimeoutError(message);
    });
  }

  return {
    async get(getOptions: GetOptions = {}): Promise<SnapshotView<S>> {
      return available() ?? view(await waitForRefresh(getOptions));
    },
    /** The cached snapshot as it is, without refreshing; null before the first success. */
    peek: (): SnapshotView<S> | null => (good ? view(good) : null),
    /** The shard registry changed: every snapshot whose refresh started before now is stale. */
    invalidate() {
      epoch += 1;
    },
    get refreshing() {
      return inFlight !== null;
    },
    /** Bumped on every successful refresh; part of ETags. */
    get generation() {
      return generation;
    },
    /** The latest refresh's error until one succeeds. */
    get lastError(): Error | null {
      return lastFailure?.error ?? null;
    },
    /** Ms until a request may start the next refresh after a failure (a 503's Retry-After); null when one may start or runs. */
    get backOffMs() {
      return inFlight ? null : backOffLeft();
    },
  };
}
