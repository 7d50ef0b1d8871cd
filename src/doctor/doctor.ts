// The node check behind GET /doctor and `nodecompute doctor`: each thing nodecompute's answers rely
// on, what was found and what to do. It asks nvidia-smi afresh and fails where a start would; while
// shutting down a query's own coded error (a 503) is thrown, not a report blaming nvidia-smi.
import { formatDuration } from '../duration.js';
import { gpuNoLongerListed, gpuUnreachable, LOST_GPU_FIX, LOST_GPU_MEANING, saidOfBusId, UNREACHABLE_GPU_MEANING, type LostGpu } from '../node-state/gpu-roster.js';
import type { NodeSnapshot } from '../node-state/node-snapshot.js';
import { busyGpus, hiddenProcessesWarning } from '../node-state/node-view.js';
import { listedAs } from '../node-state/placement.js';
import { readRegistryFile } from '../shards/registry-file.js';
import type { ShardRecord } from '../shards/shard.js';
import { unreachableOf, type GpuListing, type GpuRecord, type UnreachableGpu } from '../system/nvidia-smi.js';
import type { GpuDriver } from '../system/gpu-driver.js';
import type { ModelFileReader } from '../system/model-files.js';
import { childrenKept } from '../system/model-runners.js';
import type { ProcReader } from '../system/procfs.js';
import type { StateFile } from '../system/state-file.js';
import type { TokenFileState } from '../auth.js';

export type CheckStatus = 'ok' | 'warn' | 'fail';

/** fix: what to do; null when nothing needs doing, or when the detail ends with it (nvidia-smi's failures, the settings' warnings). */
export type DoctorCheck = { name: string; status: CheckStatus; detail: string; fix: string | null };

export type DoctorReport = { ok: boolean; version: string; checkedAt: string; checks: DoctorCheck[] };

/** What the service's latest snapshot knows of the GPUs. */
export type KnownGpus = Pick<NodeSnapshot, 'takenAt' | 'gpus' | 'lostGpus'>;

export interface DoctorDeps {
  driver: GpuDriver;
  proc: ProcReader;
  /** The service's reader of model files, so that a stuck read is not started again; the CLI makes its own. */
  modelFiles: ModelFileReader;
  stateFile: StateFile;
  /** Why this backend serves (driver-choice.ts). */
  driverWhy: string;
  tokenConfigured: boolean;
  /** The token file looked at now (the CLI: as read at start); null or absent without one. */
  tokenFile?: (() => Promise<TokenFileState>) | null;
  /** Why a start would refuse the token file (readStartTokens's message): the CLI's, which reads it as a start does. */
  tokenFileRefused?: string | null;
  /** The warnings a start logs about the settings (config.ts): the CLI's own, the service's from its start. */
  settingsWarnings?: readonly string[];
  /** The running service's latest snapshot (null before the first), for its lost GPUs; absent in the CLI. */
  snapshot?: KnownGpus | null;
  version: string;
  now: () => number;
  /** A query slower than this gets a warning. */
  slowQueryMs?: number;
}

const SLOW_QUERY_MS = 1000;

function check(name: string, status: CheckStatus, detail: string, fix: string | null = null): DoctorCheck {
  return { name, status, detail, fix };
}

/** A failed query's check (its message ends with the fix); throws the query's error while shutting down. */
function queryFailed(deps: DoctorDeps, err: unknown, name: string, context = ''): DoctorCheck {
  if (deps.driver.stopped) throw err;
  return check(name, 'fail', `${context}${(err as Error).message}`);
}

async function timed<T>(run: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now();
  const value = await run();
  return { value, ms: Math.round(performance.now() - started) };
}

/** pids, gpus: what the process and GPU queries list (null: not asked); unreachable: the GPUs a query said it cannot reach. */
type SmiFindings = { checks: DoctorCheck[]; pids: number[] | null; busy: number[]; gpus: GpuRecord[] | null; unreachable: UnreachableGpu[] };

/** How each backend's queries are named in the checks' details. */
const QUERY_NAMES = {
  'nvidia-smi': { answers: 'nvidia-smi answers --version', gpus: 'its GPU query (--query-gpu)', apps: 'its process query (--query-compute-apps)' },
  nvml: { answers: 'NVML answers', gpus: 'its GPU query (device calls)', apps: 'its process query (nvmlDeviceGetComputeRunningProcesses)' },
} as const;

async function driverChecks(deps: DoctorDeps): Promise<SmiFindings> {
  const { backend, source } = deps.driver;
  const named = QUERY_NAMES[backend];
  const checks: DoctorCheck[] = [check('backend', 'ok', `GPU figures come from ${backend} (${source}): ${deps.driverWhy}`)];
  try {
    const version = await deps.driver.queryVersion();
    const known = (value: string | null) => value ?? 'unknown';
    const tool = backend === 'nvidia-smi' ? `nvidia-smi ${known(version.smiVersion)}, ` : '';
    const versions = `${tool}driver ${known(version.driverVersion)}, CUDA ${known(version.cudaVersion)}`;
    checks.push(check(backend, 'ok', `${source} answers: ${versions}`));
  } catch (err) {
    checks.push(queryFailed(deps, err, backend));
    // Whether --version fails naming unreachable GPUs is not known; reading it costs nothing.
    return { checks, pids: null, busy: [], gpus: null, unreachable: unreachableOf(err) };
  }
  let listing: { value: GpuListing; ms: number };
  try {
    listing = await timed(() => deps.driver.queryGpus());
  } catch (err) {
    checks.push(queryFailed(deps, err, 'gpus', `${named.answers}, but ${named.gpus}, which every GPU answer needs, fails: `));
    return { checks, pids: null, busy: [], gpus: null, unreachable: unreachableOf(err) };
  }
  // The GPUs it said it cannot reach while it listed the others: the lost-gpus check names them.
  const { gpus, unreachable } = listing.value;
  let apps: { value: { pid: number }[]; ms: number };
  try {
    // Without a utilization sample: taking one would leave the next snapshot's SM figures a window of milliseconds.
    apps = await timed(() => deps.driver.queryComputeApps({ utilization: false }));
  } catch (err) {
    const context = `${named.answers} and its GPU query (${gpus.length} GPU(s)), but ${named.apps}, `;
    checks.push(queryFailed(deps, err, 'gpus', `${context}which tells whose memory is whose, fails: `));
    return { checks, pids: null, busy: [], gpus, unreachable };
  }
  // With no GPU visible nvidia-smi fails ("No devices were found", exit 6): that is a catch above.
  checks.push(check('gpus', 'ok', `${gpus.length} GPU(s) visible: ${gpus.map((gpu) => `GPU ${gpu.index} ${gpu.name}`).join(', ')}`));
  const mig = gpus.filter((gpu) => gpu.migMode === 'Enabled');
  const migGpus = mig.map((gpu) => `GPU ${gpu.index}`).join(', ');
  if (mig.some((gpu) => gpu.migDevices == null)) {
    const detail = `MIG is on for ${migGpus}: nodecompute's memory figures there (free, foreign, per shard) are for the whole GPU, not per MIG device`;
    checks.push(check('mig', 'warn', detail, MIG_FIX));
  } else if (mig.length > 0) {
    const devices = mig.map((gpu) => `GPU ${gpu.index}: ${gpu.migDevices!.length} MIG device(s)`).join(', ');
    const unseen = mig.some((gpu) => gpu.migDevices!.length === 0);
    const detail = `MIG is on for ${migGpus}, with figures per MIG device (${devices})`;
    // No MIG device at all: none made yet, or this container is not let see them.
    checks.push(unseen ? check('mig', 'warn', `${detail}; one with none lists no process either`, MIG_UNSEEN_FIX) : check('mig', 'ok', detail));
  }
  const took = `GPU query took ${listing.ms} ms, process query ${apps.ms} ms`;
  const slow = deps.slowQueryMs ?? SLOW_QUERY_MS;
  const slowest = Math.max(listing.ms, apps.ms);
  checks.push(slowest > slow ? check('query-time', 'warn', `${took} (slower than ${slow} ms)`, SLOW_FIX) : check('query-time', 'ok', took));
  return { checks, pids: [...new Set(apps.value.map((app) => app.pid))], busy: busyGpus(gpus), gpus, unreachable };
}

const MIG_FIX =
  'Use the NVML backend (NODECOMPUTE_BACKEND=auto or nvml, with libnvidia-ml.so.1 in the container), which gives figures per MIG device; until then place work there by MIG device (nvidia-smi -L, nvidia-smi -q), not by whole-GPU free or foreign memory.';
const MIG_UNSEEN_FIX =
  'Check `nvidia-smi -L` on the host: a GPU with MIG on and no MIG device made runs nothing. If it lists MIG devices, this container may not see them: give it NVIDIA_MIG_MONITOR_DEVICES=all, which the NVIDIA container toolkit honours with CAP_SYS_ADMIN (deploy/kubernetes/README.md).';
const SLOW_FIX =
  'Enable persistence mode (nvidia-smi -pm 1, or nvidia-persistenced) so no query starts the driver up; raise NODECOMPUTE_SMI_TIMEOUT_MS if it stays slow.';

/** The GPUs lost: the roster's, those the snapshot listed that `listed` (null: failed) does not, and those it cannot reach. */
function lostGpusCheck(snapshot: KnownGpus | null, listed: readonly GpuRecord[] | null, unreachable: readonly UnreachableGpu[], now: number): DoctorCheck {
  if (snapshot == null && unreachable.length === 0) return check('lost-gpus', 'ok', 'nodecompute has no snapshot of the GPUs yet, so it knows of no GPU to miss');
  const lost = new Map<string, LostGpu>(snapshot?.lostGpus.map((gpu) => [gpu.uuid, gpu]));
  if (snapshot != null && listed !== null) {
    for (const { index, uuid, name, busId } of snapshot.gpus) if (!lost.has(uuid)) lost.set(uuid, { index, uuid, name, busId, lastListedAt: snapshot.takenAt, lostAt: now });
    for (const gpu of listed) lost.delete(gpu.uuid);
  }
  // A GPU the roster has lost already is said once, as lost.
  const cut = listedAs(unreachable, snapshot ?? null).filter(({ listed: known }) => known === null || !lost.has(known.uuid));
  if (lost.size === 0 && cut.length === 0) return check('lost-gpus', 'ok', 'every GPU nodecompute has listed since it started is still listed');
  const parts: string[] = [];
  if (lost.size > 0) {
    // What this check's own query said of a lost GPU's bus id, where it listed the others.
    const saidOf = new Map<string | null, string>(unreachable.map((gpu) => [gpu.busId, gpu.said]));
    const lines = [...lost.values()].sort((a, b) => a.index - b.index).map((gpu) => {
      const said = saidOf.get(gpu.busId);
      const says = said === undefined ? '' : `; ${saidOfBusId(gpu.busId, said)}`;
      return `${gpuNoLongerListed(gpu)} (last listed ${new Date(gpu.lastListedAt).toISOString()}, ${formatDuration(now - gpu.lastListedAt)} ago${says})`;
    });
    parts.push(`${lines.join('\n')}:\n${LOST_GPU_MEANING}`);
  }
  if (cut.length > 0) parts.push(`${cut.map(gpuUnreachable).join('\n')}:\n${UNREACHABLE_GPU_MEANING}`);
  const fix = lost.size > 0 ? `${LOST_GPU_FIX} If it was detached on purpose, restart nodecompute to forget it.` : LOST_GPU_FIX;
  return check('lost-gpus', 'fail', parts.join('\n'), fix);
}

/** The host-pid-namespace check with no GPU process listed (and no memory in use hidden from it). */
export const NO_GPU_PROCESS = 'no GPU process is running, so there is nothing to compare';

/** What the PIDs nvidia-smi lists look like in `root`: shared with /readyz?verbose, so both say the same. */
export function describeListedPids(listed: number, missing: readonly number[], root: string): string {
  if (missing.length === 0) return `all ${listed} PID(s) the GPU driver lists exist in ${root}`;
  const shown = missing.slice(0, 10).join(', ') + (missing.length > 10 ? ', ...' : '');
  const found = `${missing.length} of ${listed} PID(s) the GPU driver lists do not exist in ${root} (${shown})`;
  if (missing.length === listed) return found;
  return `${found}; the other ${listed - missing.length} do, so this is the host's PID namespace and the missing ones most likely exited since listed. ` +
    'PIDs that stay missing live in another PID namespace (a VM or nested container), and their memory reads as foreign';
}

/** What to do about some (not all) of the listed PIDs missing: the doctor's fix, and what /readyz?verbose points to. */
export const SOME_PIDS_MISSING_FIX =
  "Run the doctor again in a minute: a process that exited is no longer listed by then. PIDs that stay missing belong to processes nodecompute cannot see (another PID namespace): find them with `nvidia-smi` on the host, and run their work where nodecompute's /proc sees it.";

async function pidNamespaceCheck(proc: ProcReader, pids: number[], busy: number[], procReadable: boolean): Promise<DoctorCheck> {
  const name = 'host-pid-namespace';
  if (pids.length > 0 && !procReadable) {
    // Every PID would read as missing: that says nothing about the PID namespace.
    const detail = `could not be checked: the GPU driver lists ${pids.length} PID(s), but ${proc.root} cannot be read (see the proc check)`;
    return check(name, 'warn', detail, 'Fix the proc check first, then run the doctor again.');
  }
  if (pids.length === 0 && busy.length > 0) {
    const fix = "Run nodecompute in the host's PID namespace (--pid=host / hostPID: true); if it is, a GPU-sharing layer hides processes (unverified).";
    return check(name, 'fail', hiddenProcessesWarning(busy), fix);
  }
  if (pids.length === 0) return check(name, 'ok', `${NO_GPU_PROCESS} (re-run under load to check)`);
  const stats = await proc.readStats(pids);
  const missing = pids.filter((pid) => stats.get(pid) == null);
  const detail = describeListedPids(pids.length, missing, proc.root);
  if (missing.length === 0) return check(name, 'ok', detail);
  if (missing.length < pids.length) return check(name, 'warn', detail, SOME_PIDS_MISSING_FIX);
  return check(name, 'fail', detail, "Not the host's PID namespace: run it with --pid=host or hostPID: true, or set NODECOMPUTE_PROC to the host's /proc.");
}

/** Whether the GPU processes' memory maps can be read: without them no shard's weights are judged, and a zero offload reads ready. */
async function weightsCheck(pids: number[], reader: ModelFileReader): Promise<DoctorCheck> {
  if (pids.length === 0) return check('weights', 'ok', `${NO_GPU_PROCESS} (re-run under load to check that their memory maps can be read)`);
  const refused: string[] = [];
  for (const pid of pids) {
    const answer = await reader.read(pid);
    if (answer?.unreadable != null) refused.push(answer.unreadable);
  }
  if (refused.length === 0) return check('weights', 'ok', `the memory maps of the ${pids.length} GPU process(es) can be read, so where shards' weights are is judged`);
  const detail = `${refused.length} of ${pids.length} GPU process(es): ${refused[0]}. Their shards' weights are not judged: a zero offload (-ngl 0) reads ready`;
  return check('weights', 'warn', detail, 'Run nodecompute as root with CAP_SYS_PTRACE (deploy/kubernetes/README.md, "Seeing where weights are").');
}

// Opening, reading and closing a stat file costs about three times what re-reading a kept one does.
function openFilesCheck(proc: ProcReader, gpuProcesses: number | null): DoctorCheck {
  const { keepLimit, openFilesLimit } = proc.keeping();
  if (keepLimit === null) return check('open-files', 'ok', `${proc.root} is not a proc filesystem, so no stat file is kept open`);
  const limit = openFilesLimit === null ? 'no open-file limit' : `an open-file limit of ${openFilesLimit}`;
  const processes = gpuProcesses === null ? '' : ` (${gpuProcesses} GPU process(es) now)`;
  if (gpuProcesses !== null && gpuProcesses > keepLimit) {
    const detail = `${gpuProcesses} GPU processes, but with ${limit} at most ${keepLimit} /proc stat files stay open: the rest cost 3 times as much a refresh`;
    return check('open-files', 'warn', detail, "Raise the container's open-file limit (nofile), for example to 65536.");
  }
  return check('open-files', 'ok', `${limit}: up to ${keepLimit} /proc stat files kept open between snapshots${processes}`);
}

/** Whether the state directory is writable and, only then (else it may be a hung mount), whether a start could read the file. */
async function stateFileCheck(stateFile: StateFile): Promise<{ check: DoctorCheck; shards: ShardRecord[] | null }> {
  const writable = await stateFile.checkWritable();
  if (!writable.ok) return { check: check('state-file', 'fail', writable.reason, writable.fix ?? 'Make the state directory writable (a volume or hostPath), or set NODECOMPUTE_STATE_FILE.'), shards: null };
  const read = await readRegistryFile(stateFile);
  if (!read.ok) return { check: check('state-file', 'fail', `${read.problem} nodecompute stops at start on it (exit 1): the service cannot start, or restart, until it is fixed.`, read.fix), shards: null };
  const holds = read.shards === null ? 'does not exist yet (a first start: no shards)' : `holds ${read.shards.length} shard registration(s)`;
  const found = `${stateFile.path} ${holds} and can be written`;
  const { warning } = writable;
  const result = warning === null ? check('state-file', 'ok', found) : check('state-file', 'warn', `${found}, but the ${warning.problem}`, warning.fix);
  return { check: result, shards: read.shards ?? [] };
}

/** The GPUs registrations name by UUID that neither this query nor the service has listed: only the registrations remember them. */
function registeredGpusCheck(shards: readonly ShardRecord[], listed: readonly GpuRecord[], known: KnownGpus | null | undefined): DoctorCheck {
  const seen = new Set([...listed, ...(known?.gpus ?? []), ...(known?.lostGpus ?? [])].map((gpu) => gpu.uuid));
  const byUuid = shards.filter((shard) => (shard.gpuUuids?.length ?? 0) > 0);
  if (byUuid.length === 0) return check('registered-gpus', 'ok', 'no stored shard registration names a GPU by UUID, so none can be missing');
  const missing = byUuid.flatMap((shard) =>
    shard.gpuUuids!.flatMap((uuid, i) => (seen.has(uuid) ? [] : [`shard "${shard.id}" was given ${uuid} (GPU ${shard.gpus[i]} when it was registered)`])),
  );
  if (missing.length === 0) return check('registered-gpus', 'ok', `the GPU driver lists every GPU the ${byUuid.length} shard registration(s) naming GPUs by UUID name`);
  const [it, each] = missing.length === 1 ? ['it', 'it'] : ['them', 'each'];
  const since = known === undefined ? '' : `, and this service has not listed ${it} since it started`;
  const detail =
    `the GPU driver does not list ${it}${since}: ${each} fell off the bus, was reset or was detached (or the state file came from another node). ` +
    'Such a shard reads gpu-lost.';
  const fix = `${LOST_GPU_FIX} Start such a shard's engine on GPUs the GPU driver lists and PUT it with them, or DELETE a shard that is gone.`;
  return check('registered-gpus', 'fail', `${missing.join('\n')}:\n${detail}`, fix);
}

/** With an Ollama shard stored by PID: whether its model runners can be found (its children), so that one with no model loaded reads ready. */
async function ollamaRunnersCheck(root: string, shards: readonly ShardRecord[]): Promise<DoctorCheck[]> {
  // A cgroup shard's runners are among its processes, which need no children files.
  const ollama = shards.filter((shard) => shard.engine === 'ollama' && shard.cgroup === null).length;
  if (ollama === 0) return [];
  if (await childrenKept(root)) return [check('ollama-runners', 'ok', `${root} keeps children files, so the model runners of the ${ollama} Ollama shard(s) registered by PID can be found`)];
  const detail =
    `${root} has no children files (/proc/PID/task/TID/children; a kernel built without CONFIG_PROC_CHILDREN): the model runners of the ${ollama} Ollama shard(s) registered by PID ` +
    'cannot be found, so one with no model loaded (Ollama unloads it after OLLAMA_KEEP_ALIVE idle) reads on-cpu, and its probe keeps away the request that would load it';
  return [check('ollama-runners', 'warn', detail, 'Register such a shard by cgroup (its pod UID or container id), or keep its model loaded: OLLAMA_KEEP_ALIVE=-1 and a postStart hook that loads it (docs/troubleshooting.md).')];
}

export async function runDoctor(deps: DoctorDeps): Promise<DoctorReport> {
  const [smi, procReadable, stateFile] = await Promise.all([driverChecks(deps), deps.proc.checkReadable(), stateFileCheck(deps.stateFile)]);
  const checks: DoctorCheck[] = [];
  // Each warning says what to do.
  const warnings = deps.settingsWarnings;
  if (warnings?.length === 0) checks.push(check('settings', 'ok', 'no setting looks mistyped or at odds with another'));
  else if (warnings !== undefined) checks.push(check('settings', 'warn', warnings.join('\n')));
  checks.push(...smi.checks);
  if (deps.snapshot !== undefined) checks.push(lostGpusCheck(deps.snapshot, smi.gpus, smi.unreachable, deps.now()));
  if (smi.pids !== null) checks.push(await pidNamespaceCheck(deps.proc, smi.pids, smi.busy, procReadable.ok));
  if (smi.pids !== null && procReadable.ok) checks.push(await weightsCheck(smi.pids, deps.modelFiles));
  const proc = procReadable.ok
    ? check('proc', 'ok', `${deps.proc.root} is readable`)
    : check('proc', 'fail', procReadable.reason, "Mount the host's /proc and set NODECOMPUTE_PROC to it.");
  checks.push(proc, openFilesCheck(deps.proc, smi.pids === null ? null : smi.pids.length), stateFile.check);
  if (smi.gpus !== null && stateFile.shards !== null) checks.push(registeredGpusCheck(stateFile.shards, smi.gpus, deps.snapshot));
  if (procReadable.ok && stateFile.shards !== null) checks.push(...(await ollamaRunnersCheck(deps.proc.root, stateFile.shards)));
  checks.push(await tokenCheck(deps));
  return { ok: checks.every((c) => c.status !== 'fail'), version: deps.version, checkedAt: new Date(deps.now()).toISOString(), checks };
}

/** Whether writes can be authorised, and by which tokens: the token file is looked at now. */
async function tokenCheck(deps: DoctorDeps): Promise<DoctorCheck> {
  if (deps.tokenFileRefused) {
    const fix = 'Fix the token file (or NODECOMPUTE_TOKEN_FILE): until then `nodecompute serve` stops at start (exit 2); a running one keeps its tokens.';
    return check('token', 'fail', deps.tokenFileRefused, fix);
  }
  if (!deps.tokenConfigured) {
    const detail = 'no token is configured: any local process, and only a local process, may write (from loopback; a web page on the node may not)';
    const fix = 'Set NODECOMPUTE_TOKEN_FILE (a Kubernetes Secret) or NODECOMPUTE_TOKEN so a control plane can register shards; local processes need it too.';
    return check('token', 'warn', detail, fix);
  }
  if (!deps.tokenFile) return check('token', 'ok', 'a bearer token is configured for writes (NODECOMPUTE_TOKEN)');
  const file = await deps.tokenFile();
  if (file.problem !== null) return check('token', 'warn', file.problem, 'Fix the token file; until then a token rotated into it is not accepted.');
  return check('token', 'ok', `${file.tokens} token(s) from ${file.path} are in force for writes`);
}

export function formatDoctorReport(report: DoctorReport): string {
  const mark = { ok: 'OK  ', warn: 'WARN', fail: 'FAIL' } as const;
  const width = Math.max(...report.checks.map((c) => c.name.length));
  const indent = ' '.repeat(width + 8);
  // A detail or fix of several lines (nvidia-smi's own words can be) keeps to its column.
  const continued = (text: string) => text.replace(/\n/g, `\n${indent}`);
  const lines = report.checks.flatMap((c) => {
    const row = `${mark[c.status]}  ${c.name.padEnd(width)}  ${continued(c.detail)}`;
    return c.fix ? [row, `${indent}fix: ${continued(c.fix)}`] : [row];
  });
  const verdict = report.ok ? 'nodecompute doctor: this node is fine.' : 'nodecompute doctor: something is wrong (see FAIL above).';
  return `${lines.join('\n')}\n\n${verdict}\n`;
}
