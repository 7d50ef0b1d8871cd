// Runs nvidia-smi, the only code that does. Past its deadline a run's process group is killed and
// the caller answered, even if the child cannot die (state D). While a killed run outlives SIGKILL,
// and after killAll (shutdown), no other run starts: on a wedged driver they would pile up.
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import { settleWithin } from '../deadline.js';
import { NvidiaSmiFailedError, NvidiaSmiNotFoundError, NvidiaSmiTimeoutError } from '../errors.js';
import { COMPUTE_APPS_COMMAND, COMPUTE_APPS_FIELDS, csvAnswer, GPU_QUERY_FIELDS, gpuCommand, parseComputeAppsCsv, parseGpuCsv } from './nvidia-smi-parse.js';
import { parseVersion, unreachableGpusIn } from './nvidia-smi-parse.js';
import { observed, type GpuDriver, type GpuListing, type QueryName, type QueryObservation } from './gpu-driver.js';
import type { UnreachableGpu } from './gpu-driver.js';

export { canonicalBusId, COMPUTE_APPS_FIELDS, GPU_QUERY_FIELDS, parseComputeAppsCsv, parseGpuCsv } from './nvidia-smi-parse.js';
export { parseVersion, unreachableGpusIn } from './nvidia-smi-parse.js';
export type { ComputeAppRecord, GpuListing, GpuRecord, NvidiaSmiVersion } from './gpu-driver.js';
export type { QueryName, QueryObservation, UnreachableGpu } from './gpu-driver.js';

/** killTimedOut: kills an overdue run's process group (default SIGKILL); a no-op stands for a wedged driver in tests. */
export type NvidiaSmiOptions = { path: string; timeoutMs: number; log: Logger; onQuery?: (o: QueryObservation) => void; killTimedOut?: (pid: number) => void };

/** What each exit code means (nvidia-smi(1), RETURN VALUE; 18: a driver/library mismatch) and what to do. */
const EXIT_MEANINGS: Record<number, string> = {
  2: 'nvidia-smi rejected an argument: this driver is probably older than the fields nodecompute asks for. Check the driver version.',
  3: 'the requested operation is not available on this device.',
  4: 'the user running nodecompute may not access the GPUs. Give it access to /dev/nvidia* (in a container: run it with the NVIDIA runtime).',
  6: 'no GPU was found. Check that the GPUs are visible here (--gpus all, NVIDIA_VISIBLE_DEVICES), in `lspci | grep -i nvidia`, and bound to the driver.',
  8: "a GPU's external power cables are not properly attached.",
  9: 'the NVIDIA driver is not loaded. Install or load it (`modprobe nvidia`); in a container, run with the NVIDIA runtime.',
  10: 'the NVIDIA kernel driver detected an interrupt problem with a GPU. Check `dmesg` for NVRM/Xid errors.',
  12: 'the NVML library (libnvidia-ml.so) could not be loaded. In a container, set NVIDIA_DRIVER_CAPABILITIES=utility (or all) and use the NVIDIA runtime.',
  13: 'this NVML library does not implement a function nvidia-smi needs: nvidia-smi and the driver libraries come from different driver versions.',
  14: "a GPU's infoROM is corrupted. The GPU needs service; check `dmesg` and the vendor's tools.",
  15: 'a GPU has fallen off the bus or is otherwise inaccessible. Check `dmesg` for Xid 79; the GPU needs a reset or the node a reboot. Drain the node first.',
  18: 'the NVIDIA kernel module and driver libraries are different versions (upgraded, not rebooted). Reboot the node, or reload the nvidia kernel modules.',
  255: 'nvidia-smi hit another error or an internal driver error. Check `dmesg` for NVRM/Xid errors.',
};

const UNKNOWN_EXIT = 'an error nodecompute has no specific advice for; see RETURN VALUE in nvidia-smi(1).';
/** Fields newer than the oldest drivers: one a driver rejects is not asked again (it then reads as null). */
const OPTIONAL_GPU_FIELDS: readonly string[] = ['memory.reserved', 'mig.mode.current'];
const FIELD_REJECTED = /Field "([^"]+)" is not a valid field to query/;

type Completed = Awaited<ReturnType<typeof spawnNvidiaSmi>>;

function spawnNvidiaSmi(path: string, args: string[]) {
  // detached: its own process group, so a timeout can kill nvidia-smi together with anything it started.
  return execa(path, args, { detached: true, reject: false, all: true, stdin: 'ignore', encoding: 'utf8' });
}

function killGroup(pid: number, log: Logger): void {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch (err) {
    log.debug({ nvidiaSmiPid: pid, err }, 'could not signal the nvidia-smi process group');
  }
}

export function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

const CANNOT_SEE_GPUS = 'Without it nodecompute cannot see the GPUs. Install the NVIDIA driver utilities; in a container, run with the NVIDIA runtime ' +
  '(docker --gpus all, or runtimeClassName: nvidia) and NVIDIA_DRIVER_CAPABILITIES=utility; or set NODECOMPUTE_NVIDIA_SMI to its full path.';

/** Why nvidia-smi could not be started (ENOENT, EACCES): a name on PATH, a file, or a directory. */
function notFoundError(path: string, result: Completed): Error {
  const code = String(result.code);
  let said = `the file exists but this user may not execute it (${code}): it needs an x bit this user has (\`ls -l ${path}\`). ${CANNOT_SEE_GPUS}`;
  if (!path.includes('/')) {
    const what =
      code === 'ENOENT' ? 'no program of that name was found on PATH' : 'a file of that name on PATH may not be executed by this user, or is a directory';
    said = `${what} (${code}; PATH is ${JSON.stringify(process.env.PATH)}). ${CANNOT_SEE_GPUS}`;
  } else if (code === 'ENOENT') {
    said = `there is no such file (${code}). ${CANNOT_SEE_GPUS}`;
  } else if (isDirectory(path)) {
    said = `it is a directory, not the executable (${code}). Set NODECOMPUTE_NVIDIA_SMI (--nvidia-smi) to its full path, such as ` +
      `${JSON.stringify(join(path, 'nvidia-smi'))}, or leave it unset to look on PATH.`;
  }
  return new NvidiaSmiNotFoundError(`nvidia-smi could not be run from ${JSON.stringify(path)}: ${said}`, { cause: result });
}

function failedError(result: Completed): Error {
  const said = String(result.all).trim() || '(nothing)';
  const exitCode = result.exitCode as number;
  const meaning = EXIT_MEANINGS[exitCode] ?? UNKNOWN_EXIT;
  const error = new NvidiaSmiFailedError(`nvidia-smi exited with code ${exitCode} and said: "${said}". This means ${meaning}`, { cause: result });
  return Object.assign(error, { unreachable: unreachableGpusIn(said) });
}

/** The GPUs a failed run said it cannot reach ("Unable to determine the device handle"), carried on its error; none for any other error. */
export function unreachableOf(err: unknown): UnreachableGpu[] {
  return (err as { unreachable?: UnreachableGpu[] } | null)?.unreachable ?? [];
}

function abnormalEndError(result: Completed, stopped: boolean): Error {
  const why = stopped ? 'nodecompute stopped it because nodecompute is shutting down.' : 'Something killed it (the OOM killer?) or it crashed; check `dmesg`.';
  return new NvidiaSmiFailedError(`nvidia-smi did not finish normally: ${String(result.shortMessage)}. ${why}`, { cause: result });
}

/** How long a killed run may take to exit before it counts as stuck (it is being reaped, not wedged). */
const STUCK_AFTER_MS = 1_000;

/** The same text for every refusal while the same run is stuck, so the failure is logged once. */
function stuckError(pid: number, killedAt: number, timeoutMs: number): Error {
  return new NvidiaSmiTimeoutError(
    `nvidia-smi (pid ${pid}) did not answer within ${timeoutMs} ms and is still alive although it was killed with SIGKILL at ${new Date(killedAt).toISOString()}: ` +
      `stuck in state D on a wedged driver; nodecompute starts no other nvidia-smi until it exits. Check \`dmesg\` and \`ps -o pid,stat,wchan -p ${pid}\`; ` +
      'drain the node, then reset the GPU or reboot.',
  );
}

function timeoutError(timeoutMs: number, args: string[]): Error {
  return new NvidiaSmiTimeoutError(
    `nvidia-smi did not answer within ${timeoutMs} ms (nvidia-smi ${args.join(' ')}), so its process group was killed. A wedged driver (state D in ps)? ` +
      'Check `dmesg` (NVRM/Xid); enable persistence mode (nvidia-smi -pm 1); raise NODECOMPUTE_SMI_TIMEOUT_MS only if the node is merely slow.',
  );
}

/** The deadline passed after nvidia-smi itself exited: something it started still holds its output open. */
function outputHeldError(path: string, timeoutMs: number, args: string[]): Error {
  return new NvidiaSmiTimeoutError(
    `nvidia-smi (nvidia-smi ${args.join(' ')}) exited, but its output was still open ${timeoutMs} ms after it started: a process it started holds it, ` +
      `so its group was killed. Make the wrapper at ${JSON.stringify(path)} (NODECOMPUTE_NVIDIA_SMI) \`exec\` nvidia-smi, or find the holder: \`fuser -v\`.`,
  );
}

/** What a run that exited 0 printed (all: both streams, in order), or the coded error that says why it did not. */
type Answered = { stdout: string; all: string };
function answerOf(path: string, result: Completed, stopped: boolean): Answered {
  if (result.code === 'ENOENT' || result.code === 'EACCES') throw notFoundError(path, result);
  if (result.exitCode === undefined) throw abnormalEndError(result, stopped);
  if (result.exitCode !== 0) throw failedError(result);
  return { stdout: result.stdout, all: String(result.all) };
}

/** The optional field among `fields` that nvidia-smi rejected in `err`; null when it rejected none of them. */
function rejectedOptionalField(err: unknown, fields: readonly string[]): string | null {
  if (!(err instanceof NvidiaSmiFailedError)) return null;
  const field = FIELD_REJECTED.exec(err.message)?.[1];
  return field !== undefined && OPTIONAL_GPU_FIELDS.includes(field) && fields.includes(field) ? field : null;
}

export function createNvidiaSmi(options: NvidiaSmiOptions): GpuDriver {
  const { path, timeoutMs, log, onQuery } = options;
  const killTimedOut = options.killTimedOut ?? ((pid: number) => killGroup(pid, log));
  const alive = new Set<number>();
  /** Runs killed at their deadline that had not exited: pid -> when they were killed (Date.now()). */
  const killedAt = new Map<number, number>();
  let gpuFields: readonly string[] = GPU_QUERY_FIELDS;
  let stopped = false;

  /** The refusal to run while a killed run has outlived SIGKILL by STUCK_AFTER_MS; null when none has. */
  function stuckRun(): Error | null {
    for (const [pid, at] of killedAt) if (Date.now() - at >= STUCK_AFTER_MS) return stuckError(pid, at, timeoutMs);
    return null;
  }

  /** Runs nvidia-smi once; settles by `deadline` (performance.now() time) whatever the child does. */
  function execute(args: string[], deadline: number): Promise<Answered> {
    const child = spawnNvidiaSmi(path, args);
    const pid = child.pid;
    let exited = false;
    if (pid !== undefined) {
      alive.add(pid);
      child.once('exit', () => {
        exited = true;
        alive.delete(pid);
        const at = killedAt.get(pid);
        killedAt.delete(pid);
        if (at !== undefined && Date.now() - at >= STUCK_AFTER_MS) {
          log.info({ nvidiaSmiPid: pid, stuckMs: Date.now() - at, stillStuck: killedAt.size }, 'The stuck nvidia-smi has exited at last; nodecompute runs nvidia-smi again');
        }
      });
    }
    const answered = child.then((result) => answerOf(path, result, stopped));
    // A run never spawned (no pid) settles by itself with why; it is not a stuck run.
    if (pid === undefined) return answered;
    const killLate = () => {
      // The group is killed even when nvidia-smi has exited: a child of it may hold its output.
      killTimedOut(pid);
      if (!exited) killedAt.set(pid, Date.now());
      throw exited ? outputHeldError(path, timeoutMs, args) : timeoutError(timeoutMs, args);
    };
    return settleWithin(answered, Math.max(0, deadline - performance.now()), killLate);
  }

  function run<T>(query: QueryName, args: string[], parse: (answer: Answered) => T, deadline = performance.now() + timeoutMs): Promise<T> {
    // Once shutdown has killed the runs, a new one would only hold the shutdown up to its deadline.
    const refused = stopped ? new NvidiaSmiFailedError('nvidia-smi was not run: nodecompute is shutting down.') : stuckRun();
    return observed({ query, what: 'nvidia-smi', log, onQuery }, refused, async () => parse(await execute(args, deadline)));
  }

  const computeAppsAnswer = csvAnswer(parseComputeAppsCsv, COMPUTE_APPS_COMMAND);
  const computeAppsArgs = [`--query-compute-apps=${COMPUTE_APPS_FIELDS.join(',')}`, '--format=csv'];

  function askGpus(fields: readonly string[], deadline: number): Promise<GpuListing> {
    const args = [`--query-gpu=${fields.join(',')}`, '--format=csv'];
    const parse = csvAnswer((stdout) => parseGpuCsv(stdout, fields), gpuCommand(fields));
    // Its words of a GPU it cannot reach, on whichever stream it wrote them.
    return run('gpus', args, ({ stdout, all }) => ({ gpus: parse(stdout), unreachable: unreachableGpusIn(all) }), deadline);
  }

  async function queryGpus(): Promise<GpuListing> {
    // One deadline for the whole call, retry included: a caller never waits longer than timeoutMs.
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      try {
        return await askGpus(gpuFields, deadline);
      } catch (err) {
        const field = rejectedOptionalField(err, gpuFields);
        if (field === null) throw err;
        gpuFields = gpuFields.filter((asked) => asked !== field);
        log.info({ field }, `this driver does not know ${field}; asking without it from now on (it reads as null)`);
      }
    }
  }

  return {
    backend: 'nvidia-smi',
    source: path,
    queryGpus,
    queryComputeApps: () => run('compute-apps', computeAppsArgs, ({ stdout }) => computeAppsAnswer(stdout)),
    queryVersion: () => run('version', ['--version'], ({ stdout }) => parseVersion(stdout)),
    killAll: () => {
      stopped = true;
      for (const pid of alive) killGroup(pid, log);
    },
    get running() {
      return alive.size;
    },
    get stopped() {
      return stopped;
    },
  };
}
