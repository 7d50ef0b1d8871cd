// Owns every conversation with nvidia-smi: which questions are asked, how the program is run, and how
// its CSV is read. It is the only code that runs nvidia-smi, so the rules that keep the service alive
// on a sick node live here in one place: every run has a hard deadline, a run that overstays it has
// its whole process group killed, and a caller is answered at the deadline even if the child cannot
// die (D state) or a grandchild keeps its output open. While a killed run is still alive a second
// after SIGKILL, no other is started: on a wedged driver each would get stuck too, and pile up; nor
// is one once shutdown has killed the runs (killAll), as it could only hold the shutdown up. The
// parsers are pure so they can be tested against real captured output (shared/samples) without a
// GPU.
//
// Format: we ask for `--format=csv` (header and units). The header lets the parser check that the
// columns came back in the order asked (nvidia-smi's output is "not guaranteed to be backwards
// compatible"), and the ` MiB` unit on each value proves the unit instead of assuming it. The parsers
// still accept noheader and nounits output, so captured output in any of those forms can be read.
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import {
  NvidiaSmiFailedError,
  NvidiaSmiNotFoundError,
  NvidiaSmiTimeoutError,
  NvidiaSmiUnparsableError,
  type NvidiaSmiFailure,
} from '../errors.js';

export const GPU_QUERY_FIELDS = [
  'index',
  'uuid',
  'name',
  'memory.total',
  'memory.used',
  'memory.free',
  'memory.reserved',
  'mig.mode.current',
  'pci.bus_id',
] as const;
export const COMPUTE_APPS_FIELDS = ['gpu_uuid', 'pid', 'process_name', 'used_gpu_memory'] as const;

export interface GpuRecord {
  index: number;
  uuid: string;
  name: string;
  totalMiB: number | null;
  usedMiB: number | null;
  freeMiB: number | null;
  reservedMiB: number | null;
  /**
   * mig.mode.current: "Enabled" or "Disabled"; null where the GPU has no MIG mode ([N/A]) or it was
   * not asked (a driver that does not know the field).
   */
  migMode: string | null;
  /**
   * pci.bus_id, as the query prints it (00000000:83:00.0); null where nvidia-smi has no value or it
   * was not asked. nvidia-smi's error lines and the kernel's (dmesg) name a GPU by it.
   */
  busId: string | null;
}

export interface ComputeAppRecord {
  gpuUuid: string;
  pid: number;
  name: string;
  usedMiB: number | null;
}

export interface NvidiaSmiVersion {
  smiVersion: string | null;
  driverVersion: string | null;
  cudaVersion: string | null;
}

export type QueryName = 'gpus' | 'compute-apps' | 'version';

export interface QueryObservation {
  query: QueryName;
  /** null when nvidia-smi was not run at all (a killed run is still stuck). */
  durationMs: number | null;
  /** 'ok', or the code of the error the query failed with. */
  outcome: 'ok' | string;
}

export interface NvidiaSmiOptions {
  path: string;
  timeoutMs: number;
  log: Logger;
  onQuery?: (o: QueryObservation) => void;
  /**
   * Kills the process group of a run that overstayed its deadline (default: SIGKILL to the group).
   * Tests put a no-op here to stand for a wedged driver, which keeps nvidia-smi alive after SIGKILL.
   */
  killTimedOut?: (pid: number) => void;
}

/** What the GPU query answered: the GPUs it listed, and those it said, beside them, it cannot reach. */
export interface GpuListing {
  gpus: GpuRecord[];
  /** Its "Unable to determine the device handle" lines, by bus id; empty when it printed none. */
  unreachable: UnreachableGpu[];
}

export interface NvidiaSmi {
  queryGpus(): Promise<GpuListing>;
  queryComputeApps(): Promise<ComputeAppRecord[]>;
  queryVersion(): Promise<NvidiaSmiVersion>;
  /** SIGKILL every running nvidia-smi process group and start no other (used at shutdown). */
  killAll(): void;
  /** True once killAll has run: a query that fails from then on failed because of the shutdown. */
  readonly stopped: boolean;
  /** How many nvidia-smi children are alive now. */
  readonly running: number;
}

// ---------------------------------------------------------------------------------------------------
// Pure parsers

/** nvidia-smi writes every "no value" in brackets ([N/A], [Not Supported], [Insufficient Permissions],
 *  [Unknown Error], ...) and a few without (N/A). None of them is a size, so all read as null. */
const NO_VALUE = /^\[.*\]$|^N\/A$/;
const MIB_VALUE = /^(\d+)(?: MiB)?$/;
const INTEGER = /^\d+$/;
const REQUIRED_GPU_FIELDS = ['index', 'uuid', 'name'] as const;

const COMPUTE_APPS_COMMAND = `nvidia-smi --query-compute-apps=${COMPUTE_APPS_FIELDS.join(',')} --format=csv`;

function gpuCommand(fields: readonly string[]): string {
  return `nvidia-smi --query-gpu=${fields.join(',')} --format=csv`;
}

function unparsable(line: string, reason: string, command: string) {
  return new NvidiaSmiUnparsableError(
    `nvidia-smi printed a line nodecompute cannot read: ${JSON.stringify(line)} (${reason}). ` +
      `Its output format may have changed with this driver, or something else wrote into its output. ` +
      `Run \`${command}\` by hand to see what it prints, and report it with the driver version.`,
  );
}

/**
 * `parse` for a CSV query's stdout, refusing an empty one: with `--format=csv` nvidia-smi always
 * prints the header (only it when no process runs), and on a node without GPUs it exits 6. An empty
 * answer that exited 0 is a cut or replaced output, and read as "no GPUs" it would mark every GPU lost.
 */
function csvAnswer<T>(parse: (stdout: string) => T, command: string): (stdout: string) => T {
  return (stdout) => {
    if (contentLines(stdout).length === 0) {
      throw new NvidiaSmiUnparsableError(
        `nvidia-smi exited 0 but printed nothing, not even the CSV header it always prints (on a node without GPUs it fails with "No devices were found" instead). ` +
          'nodecompute does not read that as "no GPUs": it keeps the last good snapshot while it is younger than max-stale. Something cut or replaced its output: ' +
          `check which nvidia-smi is on PATH (a wrapper script, a container runtime hook) and run \`${command}\` by hand to see what it prints.`,
      );
    }
    return parse(stdout);
  };
}

function contentLines(text: string): string[] {
  return text.split(/\r?\n/).filter((line) => line.trim() !== '');
}

/**
 * The lines of a CSV answer that are CSV: not those in which nvidia-smi says it cannot reach a GPU.
 * Where the driver has lost one GPU of several, nvidia-smi says so and lists the others (public
 * transcripts of plain `nvidia-smi` on drivers 525 to 610 show it; a monitoring tool's notes say the
 * query forms do the same with exit 0), so the rows it did print are read, and the runner keeps its
 * words (GpuListing.unreachable).
 */
function csvLines(text: string): string[] {
  return contentLines(text).filter((line) => !DEVICE_HANDLE_LINE.test(line));
}

function cellsOf(line: string): string[] {
  return line.split(',').map((cell) => cell.trim());
}

function withoutUnit(headerCell: string): string {
  return headerCell.replace(/ \[[^\]]*\]$/, '');
}

/** Only the first line can be a header: it is one when its first cell names the first field asked. */
function splitHeader(lines: string[], firstField: string): string[] | null {
  const first = lines[0];
  if (first === undefined || withoutUnit(cellsOf(first)[0] as string) !== firstField) return null;
  lines.shift();
  return cellsOf(first);
}

function checkHeader(header: string[] | null, fields: readonly string[], command: string): void {
  if (header === null) return;
  const matches =
    header.length === fields.length && header.every((cell, i) => withoutUnit(cell) === fields[i]);
  if (!matches) {
    throw unparsable(header.join(', '), `the header does not match the fields asked: ${fields.join(', ')}`, command);
  }
}

function parseMiB(cell: string, line: string, command: string): number | null {
  if (NO_VALUE.test(cell)) return null;
  const match = MIB_VALUE.exec(cell);
  if (match === null) throw unparsable(line, `${JSON.stringify(cell)} is not a size in MiB`, command);
  const mib = Number(match[1]);
  if (!Number.isSafeInteger(mib)) throw unparsable(line, `${JSON.stringify(cell)} is not a plausible size in MiB`, command);
  return mib;
}

function parseInteger(cell: string, what: string, line: string, command: string): number {
  const value = Number(cell);
  if (!INTEGER.test(cell) || !Number.isSafeInteger(value)) throw unparsable(line, `${what} ${JSON.stringify(cell)} is not a whole number`, command);
  return value;
}

function requireText(cell: string, what: string, line: string, command: string): string {
  if (cell === '') throw unparsable(line, `${what} is empty`, command);
  return cell;
}

function parseGpuLine(line: string, fields: readonly string[], command: string): GpuRecord {
  const cells = cellsOf(line);
  if (cells.length !== fields.length) {
    throw unparsable(line, `expected ${fields.length} values (${fields.join(', ')}), found ${cells.length}`, command);
  }
  // The cell count matches the fields asked, so every asked field has a cell.
  const cell = (field: string) => cells[fields.indexOf(field)] as string;
  const memory = (field: string) => (fields.includes(field) ? parseMiB(cell(field), line, command) : null);
  return {
    index: parseInteger(cell('index'), 'index', line, command),
    uuid: requireText(cell('uuid'), 'uuid', line, command),
    name: cell('name'),
    totalMiB: memory('memory.total'),
    usedMiB: memory('memory.used'),
    freeMiB: memory('memory.free'),
    reservedMiB: memory('memory.reserved'),
    migMode: fields.includes('mig.mode.current') && !NO_VALUE.test(cell('mig.mode.current')) ? cell('mig.mode.current') : null,
    // Only to match nvidia-smi's errors with a GPU: a value of another form reads as null rather than failing the listing.
    busId: fields.includes('pci.bus_id') ? canonicalBusId(cell('pci.bus_id')) : null,
  };
}

const BUS_ID = /^([0-9a-f]{1,8}):([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$/i;

/**
 * A PCI bus id in the form nvidia-smi's query prints (an 8-digit domain, upper case: 00000000:83:00.0),
 * from any form nvidia-smi or the kernel writes (its error lines give a 4-digit domain, dmesg lower
 * case); null when `text` is not one.
 */
export function canonicalBusId(text: string): string | null {
  const match = BUS_ID.exec(text.trim());
  if (match === null) return null;
  const [, domain, bus, device, fn] = match as unknown as [string, string, string, string, string];
  return `${domain.padStart(8, '0')}:${bus.padStart(2, '0')}:${device.padStart(2, '0')}.${fn}`.toUpperCase();
}

/** A GPU nvidia-smi could not reach, in its own words. */
export interface UnreachableGpu {
  /** Its PCI bus id, in canonicalBusId's form. */
  busId: string;
  /** What nvidia-smi said of it ("GPU is lost. Reboot the system to recover this GPU", "Unknown Error"). */
  said: string;
}

// nvidia-smi names a GPU it cannot get a handle on by bus id: "Unable to determine the device handle
// for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU" (exit 15), or "...for
// GPU0000:07:00.0: Unknown Error" (samples). Public reports show other forms of the same line: "for
// gpu 0000:23:00.0" (-L, lower case), "for GPU0: 0000:23:00.0" (--query-gpu, with the index), and
// the line broken after "GPU is lost." (what it said is then read up to the break).
const DEVICE_HANDLE_FAILURE = /Unable to determine the device handle for gpu\s*(?:\d+:\s*)?([0-9a-f]+:[0-9a-f]+:[0-9a-f]+\.[0-9a-f]):\s*([^\n"]*)/gi;
const DEVICE_HANDLE_LINE = new RegExp(DEVICE_HANDLE_FAILURE.source, 'i');

/** The GPUs nvidia-smi's output (or a failure message quoting it) says it cannot reach, once each. */
export function unreachableGpusIn(text: string): UnreachableGpu[] {
  const found = new Map<string, UnreachableGpu>();
  for (const [, bus, said] of text.matchAll(DEVICE_HANDLE_FAILURE)) {
    const busId = canonicalBusId(bus as string);
    if (busId !== null && !found.has(busId)) found.set(busId, { busId, said: (said as string).trim() });
  }
  return [...found.values()];
}

/**
 * Reads `--query-gpu=<fields>` output, with or without header and units. `fields` are the names that
 * were asked, in order (GPU_QUERY_FIELDS, possibly without the optional ones); a field that was not
 * asked reads as null.
 */
export function parseGpuCsv(text: string, fields: readonly string[]): GpuRecord[] {
  const missing = REQUIRED_GPU_FIELDS.filter((field) => !fields.includes(field));
  if (missing.length > 0) throw new TypeError(`parseGpuCsv needs the fields ${missing.join(', ')}`);
  const command = gpuCommand(fields);
  const lines = csvLines(text);
  checkHeader(splitHeader(lines, fields[0] as string), fields, command);
  return lines.map((line) => parseGpuLine(line, fields, command));
}

/**
 * nvidia-smi does not quote CSV and process names may contain ", ". With the fields asked in the order
 * gpu_uuid, pid, process_name, used_gpu_memory, the first two cells are taken from the left, the last
 * from the right, and the name is whatever lies between.
 */
function parseComputeAppLine(line: string): ComputeAppRecord {
  const first = line.indexOf(',');
  const second = line.indexOf(',', first + 1);
  const last = line.lastIndexOf(',');
  if (second < 0 || last === second) {
    throw unparsable(line, `expected ${COMPUTE_APPS_FIELDS.join(', ')}`, COMPUTE_APPS_COMMAND);
  }
  return {
    gpuUuid: requireText(line.slice(0, first).trim(), 'gpu_uuid', line, COMPUTE_APPS_COMMAND),
    pid: parseInteger(line.slice(first + 1, second).trim(), 'pid', line, COMPUTE_APPS_COMMAND),
    name: line.slice(second + 1, last).trim(),
    usedMiB: parseMiB(line.slice(last + 1).trim(), line, COMPUTE_APPS_COMMAND),
  };
}

/** Reads `--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory` output, with or without
 *  header and units. A header alone, or nothing, means no process holds a compute context. */
export function parseComputeAppsCsv(text: string): ComputeAppRecord[] {
  const lines = csvLines(text);
  checkHeader(splitHeader(lines, COMPUTE_APPS_FIELDS[0]), COMPUTE_APPS_FIELDS, COMPUTE_APPS_COMMAND);
  return lines.map(parseComputeAppLine);
}

// Drivers from 610 on write `DRIVER version      : Deprecated, see "KMD version" instead` (and the
// same of `CUDA version`, pointing at `CUDA UMD version`) and give the numbers on the new lines
// (public outputs of 610.57.04 to 616.56; shared/samples has no capture of one yet). The new lines win
// over the old ones, and a value that is not a version number is not taken for one.
const VERSION_KEYS = new Map<string, { field: keyof NvidiaSmiVersion; renamed: boolean }>([
  ['nvidia-smi version', { field: 'smiVersion', renamed: false }],
  ['driver version', { field: 'driverVersion', renamed: false }],
  ['kmd version', { field: 'driverVersion', renamed: true }],
  ['cuda version', { field: 'cudaVersion', renamed: false }],
  ['cuda umd version', { field: 'cudaVersion', renamed: true }],
]);
const VERSION_NUMBER = /^\d+(?:\.\d+)*$/;

/** Reads `nvidia-smi --version` ("KEY version : VALUE" lines); keys it does not know are ignored. */
export function parseVersion(text: string): NvidiaSmiVersion {
  const version: NvidiaSmiVersion = { smiVersion: null, driverVersion: null, cudaVersion: null };
  const fromRenamed = new Set<keyof NvidiaSmiVersion>();
  for (const line of contentLines(text)) {
    const [key, ...rest] = line.split(':');
    const target = VERSION_KEYS.get((key as string).trim().toLowerCase());
    const value = rest.join(':').trim();
    if (target === undefined || !VERSION_NUMBER.test(value) || (fromRenamed.has(target.field) && !target.renamed)) continue;
    version[target.field] = value;
    if (target.renamed) fromRenamed.add(target.field);
  }
  if (Object.values(version).every((v) => v === null)) {
    throw unparsable(text.trim().split(/\r?\n/)[0] as string, 'no version number found', 'nvidia-smi --version');
  }
  return version;
}

// ---------------------------------------------------------------------------------------------------
// Runner

/** What nvidia-smi's exit codes mean (nvidia-smi(1), RETURN VALUE; 18 is what a driver/library
 *  mismatch exits with in practice) and what an operator should do about each. */
const EXIT_MEANINGS: Record<number, string> = {
  2: 'nvidia-smi rejected an argument: this driver is probably older than the fields nodecompute asks for. Check the driver version.',
  3: 'the requested operation is not available on this device.',
  4: 'the user running nodecompute may not access the GPUs. Give it access to /dev/nvidia* (in a container: run it with the NVIDIA runtime).',
  6: 'no GPU was found. Check that the GPUs are visible here (in a container: --gpus all or NVIDIA_VISIBLE_DEVICES), that `lspci | grep -i nvidia` lists them, and that the driver is bound to them.',
  8: "a GPU's external power cables are not properly attached.",
  9: 'the NVIDIA driver is not loaded. Install or load it (`modprobe nvidia`); in a container, run with the NVIDIA runtime.',
  10: 'the NVIDIA kernel driver detected an interrupt problem with a GPU. Check `dmesg` for NVRM/Xid errors.',
  12: 'the NVML library (libnvidia-ml.so) could not be found or loaded. In a container, set NVIDIA_DRIVER_CAPABILITIES=utility (or all) and run with the NVIDIA runtime.',
  13: 'this NVML library does not implement a function nvidia-smi needs: nvidia-smi and the driver libraries come from different driver versions.',
  14: "a GPU's infoROM is corrupted. The GPU needs service; check `dmesg` and the vendor's tools.",
  15: 'a GPU has fallen off the bus or is otherwise inaccessible. Check `dmesg` for Xid 79; the GPU needs a reset or the node a reboot. Drain the node first.',
  18: 'the NVIDIA kernel module and the user-space driver libraries are different versions, usually after a driver upgrade without a reboot. Reboot the node, or unload and reload the nvidia kernel modules.',
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
    // ESRCH: the group is already gone. Nothing else can be done about a group we may not signal.
    log.debug({ nvidiaSmiPid: pid, err }, 'could not signal the nvidia-smi process group');
  }
}

/** Whether `path` is a directory; false when it cannot be told (it cannot be looked at: a parent this user may not search). */
export function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

const CANNOT_SEE_GPUS =
  'Without it nodecompute cannot see the GPUs. Install the NVIDIA driver utilities on the host; in a ' +
  'container, run with the NVIDIA runtime (docker --gpus all, or runtimeClassName: nvidia) and ' +
  'NVIDIA_DRIVER_CAPABILITIES=utility so nvidia-smi is mounted; or set NODECOMPUTE_NVIDIA_SMI to its full path.';

/**
 * Why nvidia-smi could not be started (ENOENT or EACCES), in the terms of what was given: a bare
 * name is looked up on PATH (the environment the child inherits, shown as it is), a path is a file,
 * and a directory is not a program (exec says EACCES of it, which would read as a permission problem).
 */
function notFoundError(path: string, result: Completed): Error {
  const code = String(result.code);
  const onPath = !path.includes('/');
  let said: string;
  if (onPath) {
    const searched = `PATH is ${JSON.stringify(process.env.PATH)}`;
    said =
      code === 'ENOENT'
        ? `no program of that name was found on PATH (${code}; ${searched}). ${CANNOT_SEE_GPUS}`
        : `a file of that name on PATH may not be executed by this user, or is a directory (${code}; ${searched}). ${CANNOT_SEE_GPUS}`;
  } else if (code === 'ENOENT') {
    said = `there is no such file (${code}). ${CANNOT_SEE_GPUS}`;
  } else if (isDirectory(path)) {
    said =
      `it is a directory, not the nvidia-smi executable (${code}). ` +
      `Set NODECOMPUTE_NVIDIA_SMI (--nvidia-smi) to the executable's full path (${JSON.stringify(join(path, 'nvidia-smi'))}, if it is in there), or leave it unset to find nvidia-smi on PATH.`;
  } else {
    said = `the file exists but this user may not execute it (${code}). Check its mode (\`ls -l ${path}\`: it needs an x bit this user has). ${CANNOT_SEE_GPUS}`;
  }
  return new NvidiaSmiNotFoundError(`nvidia-smi could not be run from ${JSON.stringify(path)}: ${said}`, { cause: result });
}

function failedError(result: Completed): Error {
  const said = String(result.all).trim() || '(nothing)';
  const exitCode = result.exitCode as number;
  return new NvidiaSmiFailedError(
    `nvidia-smi exited with code ${exitCode} and said: "${said}". ` +
      `This means ${EXIT_MEANINGS[exitCode] ?? UNKNOWN_EXIT}`,
    { cause: result },
  );
}

function abnormalEndError(result: Completed, stopped: boolean): Error {
  const why = stopped
    ? 'nodecompute stopped it because nodecompute is shutting down.'
    : 'Something outside nodecompute killed it (the OOM killer?) or it crashed; check `dmesg`.';
  return new NvidiaSmiFailedError(`nvidia-smi did not finish normally: ${String(result.shortMessage)}. ${why}`, { cause: result });
}

/** How long a killed run may take to exit before it counts as stuck (it is being reaped, not wedged). */
const STUCK_AFTER_MS = 1_000;

/** The same text for every refusal while the same run is stuck, so the failure is logged once. */
function stuckError(pid: number, killedAt: number, timeoutMs: number): Error {
  return new NvidiaSmiTimeoutError(
    `nvidia-smi (pid ${pid}) did not answer within ${timeoutMs} ms and is still alive although it was killed with SIGKILL at ${new Date(killedAt).toISOString()}: ` +
      'it is stuck in uninterruptible sleep (state D), waiting on a wedged NVIDIA driver. nodecompute starts no other ' +
      'nvidia-smi until that one exits, so stuck processes do not pile up on this node. Check `dmesg` for NVRM/Xid ' +
      `errors and \`ps -o pid,stat,wchan -p ${pid}\`; a wedged GPU usually needs a reset or the node a reboot: drain it first.`,
  );
}

function timeoutError(timeoutMs: number, args: string[]): Error {
  return new NvidiaSmiTimeoutError(
    `nvidia-smi did not answer within ${timeoutMs} ms (nvidia-smi ${args.join(' ')}), so its process group was killed. ` +
      'nvidia-smi hangs like this when the NVIDIA driver is wedged: it sits in uninterruptible sleep (state D in ps) ' +
      'waiting on the kernel. Check `dmesg` for NVRM/Xid errors and whether a GPU needs a reset; enable persistence ' +
      'mode (nvidia-persistenced, or nvidia-smi -pm 1) so each call does not re-initialise the GPUs; raise the ' +
      'nvidia-smi timeout only if the node is merely slow.',
  );
}

/** The deadline passed after nvidia-smi itself exited: something it started still holds its output open. */
function outputHeldError(path: string, timeoutMs: number, args: string[]): Error {
  return new NvidiaSmiTimeoutError(
    `nvidia-smi (nvidia-smi ${args.join(' ')}) exited, but its output was still open ${timeoutMs} ms after it started: a process it ` +
      'started holds it, so nodecompute stopped waiting and killed its process group (a process that left the group outlives that). ' +
      `nvidia-smi does not do this itself; a wrapper at ${JSON.stringify(path)} (NODECOMPUTE_NVIDIA_SMI) that leaves a background process with its stdout does. ` +
      `Find the holder with \`fuser -v\` or \`lsof\` on the wrapper's output and make the wrapper \`exec\` nvidia-smi, or redirect its ` +
      "background processes' output away from stdout.",
  );
}

/** What a run that exited 0 printed: stdout, and both streams in the order they were written. */
interface Answered {
  stdout: string;
  all: string;
}

/** What a run that exited 0 printed, or the coded error that says why it did not. */
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

export function createNvidiaSmi(options: NvidiaSmiOptions): NvidiaSmi {
  const { path, timeoutMs, log, onQuery } = options;
  const killTimedOut = options.killTimedOut ?? ((pid: number) => killGroup(pid, log));
  const alive = new Set<number>();
  /** Runs killed at their deadline that had not exited: pid -> when they were killed (Date.now()). */
  const killedAt = new Map<number, number>();
  // Older drivers do not know the optional fields; once one says so of a field, stop asking for it
  // for the life of the reader.
  let gpuFields: readonly string[] = GPU_QUERY_FIELDS;
  let stopped = false;

  /** The refusal to run while a killed run has outlived SIGKILL by STUCK_AFTER_MS; null when none has. */
  function stuckRun(): Error | null {
    for (const [pid, at] of killedAt) {
      if (Date.now() - at >= STUCK_AFTER_MS) return stuckError(pid, at, timeoutMs);
    }
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
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        // A run that could not be spawned (no pid) has nothing to kill and settles by itself, at
        // once, with why (ENOENT, EACCES): it must not be taken for a run stuck past SIGKILL. The
        // group is killed even when nvidia-smi itself has exited: a child of it may hold its output.
        if (pid === undefined) return;
        killTimedOut(pid);
        if (!exited) killedAt.set(pid, Date.now());
        reject(exited ? outputHeldError(path, timeoutMs, args) : timeoutError(timeoutMs, args));
      }, Math.max(0, deadline - performance.now()));
      child.then((result) => {
        clearTimeout(timer);
        try {
          resolve(answerOf(path, result, stopped));
        } catch (err) {
          reject(err);
        }
      }, reject);
    });
  }

  function report(query: QueryName, started: number, err?: unknown): void {
    const durationMs = Math.round(performance.now() - started);
    if (err === undefined) {
      log.debug({ query, durationMs }, 'nvidia-smi answered');
    } else {
      // The snapshot cache logs each failure once, when it starts; the doctor shows its own.
      log.debug({ query, durationMs, err }, 'nvidia-smi query failed');
    }
    onQuery?.({ query, durationMs, outcome: err === undefined ? 'ok' : (err as NvidiaSmiFailure).code });
  }

  async function run<T>(query: QueryName, args: string[], parse: (answer: Answered) => T, deadline: number): Promise<T> {
    // Once shutdown has killed the runs, a new one would only hold the shutdown up to its deadline.
    const refused = stopped ? new NvidiaSmiFailedError('nvidia-smi was not run: nodecompute is shutting down.') : stuckRun();
    if (refused) {
      onQuery?.({ query, durationMs: null, outcome: (refused as NvidiaSmiFailure).code });
      throw refused;
    }
    const started = performance.now();
    try {
      const value = parse(await execute(args, deadline));
      report(query, started);
      return value;
    } catch (err) {
      report(query, started, err);
      throw err;
    }
  }

  const computeAppsAnswer = csvAnswer(parseComputeAppsCsv, COMPUTE_APPS_COMMAND);

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
    queryGpus,
    queryComputeApps: () =>
      run(
        'compute-apps',
        [`--query-compute-apps=${COMPUTE_APPS_FIELDS.join(',')}`, '--format=csv'],
        ({ stdout }) => computeAppsAnswer(stdout),
        performance.now() + timeoutMs,
      ),
    queryVersion: () => run('version', ['--version'], ({ stdout }) => parseVersion(stdout), performance.now() + timeoutMs),
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
