// Owns how NVML is called: initialisation (once at a time; again after UNINITIALIZED, a driver
// reload), one deadline per query, and the calls a timed-out query left behind. The rule: a query
// past its deadline is answered at once and makes no further call, and while one of its calls has
// not returned no other query starts (a wedged driver would pile them up), as with nvidia-smi.
import type { Logger } from 'pino';
import { settleWithin } from '../../deadline.js';
import { NvmlFailedError, NvmlTimeoutError } from '../../errors.js';
import { observed, type QueryName, type QueryObservation } from '../gpu-driver.js';
import { NVML, type NvmlFunction, type NvmlLibrary } from './nvml-library.js';

/** What a code means for the operator, where NVML's own words need it. */
const CODE_MEANINGS: Partial<Record<number, string>> = {
  [NVML.ERROR_UNINITIALIZED]: 'NVML stayed uninitialised after a re-initialisation: the driver is being reloaded. Check `dmesg`.',
  [NVML.ERROR_NO_PERMISSION]: 'this user may not access the GPUs. Give it access to /dev/nvidia* (in a container: run it with the NVIDIA runtime).',
  [NVML.ERROR_DRIVER_NOT_LOADED]: 'the NVIDIA driver is not loaded. Install or load it (`modprobe nvidia`); in a container, run with the NVIDIA runtime.',
  [NVML.ERROR_LIB_RM_VERSION_MISMATCH]:
    'the NVIDIA kernel module and libnvidia-ml are different versions (upgraded, not rebooted). Reboot the node, or reload the nvidia kernel modules.',
};

/** A call of a query past its deadline: the query makes no further call. */
class Abandoned extends Error {}
/** A call answered UNINITIALIZED: NVML is initialised again and the query asked once more. */
class Uninitialised extends Error {}
/** A device call said its GPU cannot be reached. */
export class Unreachable extends Error {
  constructor(readonly code: number) {
    super(`NVML code ${code}`);
  }
}

/** One query's calls: abandoned once its deadline has passed. */
export type Run = { abandoned: boolean };
type Pending = { fn: NvmlFunction; since: number; run: Run };

/** onInitialised: called after each successful initialisation (what was read under the last one is no longer valid). */
export type NvmlSessionOptions = {
  library: NvmlLibrary;
  timeoutMs: number;
  log: Logger;
  onQuery?: (o: QueryObservation) => void;
  onInitialised: () => void;
};

export function createNvmlSession(options: NvmlSessionOptions) {
  const { library, timeoutMs, log, onQuery, onInitialised } = options;
  let initialised = false;
  let initialising: Promise<void> | null = null;
  let stopped = false;
  let running = 0;
  const pending = new Set<Pending>();

  function failed(what: string, code: number): Error {
    const meaning = CODE_MEANINGS[code];
    return new NvmlFailedError(`NVML ${what} failed: "${library.errorString(code)}" (NVML code ${code}).${meaning ? ` This means ${meaning}` : ''}`);
  }

  /** One NVML call of `run`; its return code. */
  async function call(run: Run, fn: NvmlFunction, ...args: unknown[]): Promise<number> {
    if (run.abandoned) throw new Abandoned();
    const entry: Pending = { fn, since: Date.now(), run };
    pending.add(entry);
    try {
      const code = await library.call(fn, ...args);
      if (code === NVML.ERROR_UNINITIALIZED && fn !== 'init') throw new Uninitialised();
      return code;
    } finally {
      pending.delete(entry);
      if (run.abandoned) log.info({ fn: library.symbol(fn), stuckMs: Date.now() - entry.since }, 'The NVML call past its deadline has returned; nodecompute calls NVML again');
    }
  }

  /** A call on a device; a code saying the GPU cannot be reached throws Unreachable. */
  async function deviceCall(run: Run, fn: NvmlFunction, ...args: unknown[]): Promise<number> {
    const code = await call(run, fn, ...args);
    if (code === NVML.ERROR_GPU_IS_LOST || code === NVML.ERROR_UNKNOWN) throw new Unreachable(code);
    return code;
  }

  function stuckError(): Error | null {
    const first = [...pending].find((entry) => entry.run.abandoned);
    if (first === undefined) return null;
    return new NvmlTimeoutError(
      `NVML call ${library.symbol(first.fn)} has not returned since ${new Date(first.since).toISOString()} (timeout ${timeoutMs} ms): a wedged driver, so nodecompute makes ` +
        'no other NVML call until it returns. Check `dmesg` (NVRM/Xid); drain the node, then reset the GPU or reboot.',
    );
  }

  async function init(run: Run): Promise<void> {
    const code = await call(run, 'init');
    if (code !== NVML.SUCCESS) throw failed(`initialisation (${library.symbol('init')} of ${library.path})`, code);
    initialised = true;
    onInitialised();
  }

  /** One initialisation at a time: the GPU and process queries run together, and a second would drop what the first read. */
  function initialise(run: Run): Promise<void> {
    if (initialised) return Promise.resolve();
    initialising ??= init(run).finally(() => {
      initialising = null;
    });
    return initialising;
  }

  async function initialisedFor<T>(run: Run, body: (run: Run) => Promise<T>): Promise<T> {
    await initialise(run);
    try {
      return await body(run);
    } catch (err) {
      if (!(err instanceof Uninitialised)) throw err;
      log.warn('NVML says it is not initialised (the driver was reloaded?): initialising it again');
      initialised = false;
      await initialise(run);
      return body(run).catch((again: unknown) => {
        throw again instanceof Uninitialised ? failed('a call right after initialising again', NVML.ERROR_UNINITIALIZED) : again;
      });
    }
  }

  /** Runs `body` as one query, initialised, within the deadline. */
  function query<T>(name: QueryName, body: (run: Run) => Promise<T>): Promise<T> {
    const refused = stopped ? new NvmlFailedError('NVML was not called: nodecompute is shutting down.') : stuckError();
    return observed({ query: name, what: 'NVML', log, onQuery }, refused, () => {
      const run: Run = { abandoned: false };
      const work = initialisedFor(run, body);
      work.catch(() => undefined);
      running += 1;
      const abandon = () => {
        run.abandoned = true;
        throw new NvmlTimeoutError(
          `NVML did not answer the ${name} query within ${timeoutMs} ms. A wedged driver? Check \`dmesg\` (NVRM/Xid); enable persistence mode ` +
            '(nvidia-smi -pm 1); raise NODECOMPUTE_SMI_TIMEOUT_MS only if the node is merely slow.',
        );
      };
      return settleWithin(work, timeoutMs, abandon).finally(() => {
        running -= 1;
      });
    });
  }

  return {
    call,
    deviceCall,
    failed,
    query,
    stop: () => {
      stopped = true;
    },
    /** Queries under way, and calls of abandoned queries that have not returned. */
    get running() {
      return running + [...pending].filter((entry) => entry.run.abandoned).length;
    },
    get stopped() {
      return stopped;
    },
  };
}
