// Owns the node check behind GET /doctor and `nodecompute doctor`: everything that must hold for
// nodecompute's answers to be true, each check saying what it found and, when it fails, what to
// do. It asks nvidia-smi afresh (the doctor is about now, not the cache) and reads /proc through
// the readers it is given. An nvidia-smi query that fails while the service is shutting down (the
// shutdown kills it) says nothing about the node: the check then rejects with the query's own coded
// error, so that GET /doctor answers it as every request the shutdown cuts off is answered (a coded
// 503), instead of a report that blames nvidia-smi and advises fixing it. `nodecompute doctor` does
// not shut down under a check, and always reports.
import { busyGpus, hiddenProcessesWarning } from '../node-state/node-view.js';
import type { NvidiaSmi } from '../system/nvidia-smi.js';
import type { ProcReader } from '../system/procfs.js';
import type { StateFile } from '../system/state-file.js';
import type { TokenFileState } from '../auth.js';

export type CheckStatus = 'ok' | 'warn' | 'fail';

export interface DoctorCheck {
  name: string;
  status: CheckStatus;
  detail: string;
  /** What to do; null when nothing needs doing. */
  fix: string | null;
}

export interface DoctorReport {
  ok: boolean;
  version: string;
  checkedAt: string;
  checks: DoctorCheck[];
}

export interface DoctorDeps {
  nvidiaSmi: NvidiaSmi;
  proc: ProcReader;
  stateFile: StateFile;
  nvidiaSmiPath: string;
  tokenConfigured: boolean;
  /**
   * The token file, looked at now: how many tokens are in force and what is wrong with it, as the
   * running service sees it (the CLI: what it read at start). Null or absent without a token file.
   */
  tokenFile?: (() => Promise<TokenFileState>) | null;
  version: string;
  now: () => number;
  /** A query slower than this gets a warning. */
  slowQueryMs?: number;
}

const SLOW_QUERY_MS = 1000;

function check(name: string, status: CheckStatus, detail: string, fix: string | null = null): DoctorCheck {
  return { name, status, detail, fix };
}

/** A failed nvidia-smi query's check; while the service is shutting down, the query's error itself (see the header). */
function queryFailed(deps: DoctorDeps, err: unknown, name: string, fix: string): DoctorCheck {
  if (deps.nvidiaSmi.stopped) throw err;
  return check(name, 'fail', (err as Error).message, fix);
}

async function timed<T>(run: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now();
  const value = await run();
  return { value, ms: Math.round(performance.now() - started) };
}

async function nvidiaSmiChecks(deps: DoctorDeps): Promise<{ checks: DoctorCheck[]; pids: number[] | null; busy: number[] }> {
  const checks: DoctorCheck[] = [];
  try {
    const version = await deps.nvidiaSmi.queryVersion();
    const known = (value: string | null) => value ?? 'unknown';
    checks.push(
      check('nvidia-smi', 'ok', `${deps.nvidiaSmiPath} answers: nvidia-smi ${known(version.smiVersion)}, driver ${known(version.driverVersion)}, CUDA ${known(version.cudaVersion)}`),
    );
  } catch (err) {
    checks.push(queryFailed(deps, err, 'nvidia-smi', 'Fix nvidia-smi first: every GPU answer depends on it.'));
    return { checks, pids: null, busy: [] };
  }
  try {
    const gpus = await timed(() => deps.nvidiaSmi.queryGpus());
    const apps = await timed(() => deps.nvidiaSmi.queryComputeApps());
    const visible = gpus.value.map((gpu) => `GPU ${gpu.index} ${gpu.name}`).join(', ');
    // With no GPU visible nvidia-smi fails ("No devices were found", exit 6): that is the catch below.
    checks.push(check('gpus', 'ok', `${gpus.value.length} GPU(s) visible: ${visible}`));
    const mig = gpus.value.filter((gpu) => gpu.migMode === 'Enabled').map((gpu) => `GPU ${gpu.index}`);
    if (mig.length > 0) {
      checks.push(
        check(
          'mig',
          'warn',
          `MIG is enabled on ${mig.join(', ')}: nodecompute's memory figures there (free, foreign, per shard) are for the whole GPU, not per MIG instance`,
          'Place work on these GPUs by MIG instance (nvidia-smi -L, nvidia-smi -q lists each process\'s GPU and compute instance), not by their whole-GPU free or foreign memory.',
        ),
      );
    }
    const slowest = Math.max(gpus.ms, apps.ms);
    const slow = deps.slowQueryMs ?? SLOW_QUERY_MS;
    checks.push(
      slowest > slow
        ? check(
            'query-time',
            'warn',
            `GPU query took ${gpus.ms} ms, process query ${apps.ms} ms (slower than ${slow} ms)`,
            'Enable persistence mode (nvidia-smi -pm 1, or the nvidia-persistenced service) so each query does not initialise the driver; raise NODECOMPUTE_SMI_TIMEOUT_MS if it stays slow.',
          )
        : check('query-time', 'ok', `GPU query took ${gpus.ms} ms, process query ${apps.ms} ms`),
    );
    return { checks, pids: [...new Set(apps.value.map((app) => app.pid))], busy: busyGpus(gpus.value) };
  } catch (err) {
    checks.push(queryFailed(deps, err, 'gpus', 'nvidia-smi answers --version but not the queries nodecompute uses; see the message.'));
    return { checks, pids: null, busy: [] };
  }
}

/** The host-pid-namespace check with no GPU process listed (and no memory in use hidden from it). */
export const NO_GPU_PROCESS = 'no GPU process is running, so there is nothing to compare';

/**
 * What the PIDs nvidia-smi lists look like in `root`: the words of the host-pid-namespace check, in
 * the doctor and in /readyz?verbose alike, so the two never tell an operator different stories.
 */
export function describeListedPids(listed: number, missing: readonly number[], root: string): string {
  if (missing.length === 0) return `all ${listed} PID(s) nvidia-smi lists exist in ${root}`;
  const shown = missing.slice(0, 10).join(', ') + (missing.length > 10 ? ', ...' : '');
  return `${missing.length} of ${listed} PID(s) nvidia-smi lists do not exist in ${root} (${shown})`;
}

async function pidNamespaceCheck(proc: ProcReader, pids: number[], busy: number[]): Promise<DoctorCheck> {
  if (pids.length === 0 && busy.length > 0) {
    return check(
      'host-pid-namespace',
      'fail',
      hiddenProcessesWarning(busy),
      "Run nodecompute in the host's PID namespace (--pid=host / hostPID: true). If it already is, the GPU-sharing layer hides processes from nvidia-smi and shard verdicts stay unverified.",
    );
  }
  if (pids.length === 0) {
    return check('host-pid-namespace', 'ok', `${NO_GPU_PROCESS} (re-run under load to check)`);
  }
  const stats = await proc.readStats(pids);
  const missing = pids.filter((pid) => stats.get(pid) == null);
  if (missing.length === 0) return check('host-pid-namespace', 'ok', describeListedPids(pids.length, missing, proc.root));
  const status = missing.length === pids.length ? 'fail' : 'warn';
  return check(
    'host-pid-namespace',
    status,
    describeListedPids(pids.length, missing, proc.root),
    status === 'fail'
      ? "nodecompute is not in the host's PID namespace: run it with --pid=host (Docker) or hostPID: true (Kubernetes), or set NODECOMPUTE_PROC to the host's /proc."
      : 'Some processes may have exited between the two reads; re-run. If it persists, they live in another PID namespace (a VM or a nested container).',
  );
}

// Opening, reading and closing a stat file costs about three times what re-reading a kept one does.
function openFilesCheck(proc: ProcReader, gpuProcesses: number | null): DoctorCheck {
  const { keepLimit, openFilesLimit } = proc.keeping();
  if (keepLimit === null) return check('open-files', 'ok', `${proc.root} is not a proc filesystem, so no stat file is kept open`);
  const limit = openFilesLimit === null ? 'no open-file limit' : `an open-file limit of ${openFilesLimit}`;
  const processes = gpuProcesses === null ? '' : ` (${gpuProcesses} GPU process(es) now)`;
  if (gpuProcesses !== null && gpuProcesses > keepLimit) {
    return check(
      'open-files',
      'warn',
      `${gpuProcesses} GPU processes, but with ${limit} nodecompute keeps at most ${keepLimit} /proc stat files open between snapshots: the others are opened afresh at every refresh, about three times the cost`,
      "Raise the container's open-file limit (nofile), for example to 65536.",
    );
  }
  return check('open-files', 'ok', `${limit}: up to ${keepLimit} /proc stat files kept open between snapshots${processes}`);
}

export async function runDoctor(deps: DoctorDeps): Promise<DoctorReport> {
  const [smi, procReadable, writable] = await Promise.all([
    nvidiaSmiChecks(deps),
    deps.proc.checkReadable(),
    deps.stateFile.checkWritable(),
  ]);
  const checks = [...smi.checks];
  if (smi.pids !== null) checks.push(await pidNamespaceCheck(deps.proc, smi.pids, smi.busy));
  checks.push(
    procReadable.ok
      ? check('proc', 'ok', `${deps.proc.root} is readable`)
      : check('proc', 'fail', procReadable.reason, "Mount the host's /proc and set NODECOMPUTE_PROC to it."),
  );
  checks.push(openFilesCheck(deps.proc, smi.pids === null ? null : smi.pids.length));
  checks.push(
    !writable.ok
      ? check('state-file', 'fail', writable.reason, 'Make the state directory writable (a volume or hostPath), or set NODECOMPUTE_STATE_FILE.')
      : writable.warning === null
        ? check('state-file', 'ok', `${deps.stateFile.path} can be written`)
        : check('state-file', 'warn', `${deps.stateFile.path} can be written, but the ${writable.warning.problem}`, writable.warning.fix),
  );
  checks.push(await tokenCheck(deps));
  return {
    ok: checks.every((c) => c.status !== 'fail'),
    version: deps.version,
    checkedAt: new Date(deps.now()).toISOString(),
    checks,
  };
}

/** Whether writes can be authorised, and by which tokens: the token file is looked at now. */
async function tokenCheck(deps: DoctorDeps): Promise<DoctorCheck> {
  if (!deps.tokenConfigured) {
    return check('token', 'warn', 'no token is configured: writes are accepted from loopback only', 'Set NODECOMPUTE_TOKEN or NODECOMPUTE_TOKEN_FILE (a Kubernetes Secret) so a control plane can register shards.');
  }
  if (!deps.tokenFile) return check('token', 'ok', 'a bearer token is configured for writes (NODECOMPUTE_TOKEN)');
  const file = await deps.tokenFile();
  if (file.problem !== null) {
    return check('token', 'warn', file.problem, 'Fix the token file as the detail says; until then a token rotated into it is not accepted.');
  }
  return check('token', 'ok', `${file.tokens} token(s) from ${file.path} are in force for writes`);
}

/** The human table of `nodecompute doctor`. */
export function formatDoctorReport(report: DoctorReport): string {
  const mark = { ok: 'OK  ', warn: 'WARN', fail: 'FAIL' } as const;
  const width = Math.max(...report.checks.map((c) => c.name.length));
  const lines = report.checks.flatMap((c) => {
    const row = `${mark[c.status]}  ${c.name.padEnd(width)}  ${c.detail}`;
    return c.fix ? [row, `${' '.repeat(width + 8)}fix: ${c.fix}`] : [row];
  });
  const verdict = report.ok ? 'nodecompute doctor: this node is fine.' : 'nodecompute doctor: something is wrong (see FAIL above).';
  return `${lines.join('\n')}\n\n${verdict}\n`;
}
