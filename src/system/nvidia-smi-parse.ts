// The pure readers of nvidia-smi's output: its CSV (a header, when there, must name the fields
// asked, in order), --version and "Unable to determine the device handle" lines. A line they cannot
// read throws NvidiaSmiUnparsableError saying what to run by hand.
import { NvidiaSmiUnparsableError } from '../errors.js';
import type { ComputeAppRecord, GpuRecord, NvidiaSmiVersion, UnreachableGpu } from './gpu-driver.js';

export const GPU_QUERY_FIELDS =
  ['index', 'uuid', 'name', 'memory.total', 'memory.used', 'memory.free', 'memory.reserved', 'mig.mode.current', 'pci.bus_id', 'utilization.gpu'] as const;
export const COMPUTE_APPS_FIELDS = ['gpu_uuid', 'pid', 'process_name', 'used_gpu_memory'] as const;

/** Every "no value" nvidia-smi writes ([N/A], [Not Supported], [Unknown Error], ..., N/A): all read as null. */
const NO_VALUE = /^\[.*\]$|^N\/A$/;
const MIB_VALUE = /^(\d+)(?: MiB)?$/;
const INTEGER = /^\d+$/;
const PERCENT = /^(\d{1,3})(?: %)?$/;
const REQUIRED_GPU_FIELDS = ['index', 'uuid', 'name'] as const;

export const COMPUTE_APPS_COMMAND = `nvidia-smi --query-compute-apps=${COMPUTE_APPS_FIELDS.join(',')} --format=csv`;

export function gpuCommand(fields: readonly string[]): string {
  return `nvidia-smi --query-gpu=${fields.join(',')} --format=csv`;
}

function unparsable(line: string, reason: string, command: string) {
  return new NvidiaSmiUnparsableError(
    `nvidia-smi printed a line nodecompute cannot read: ${JSON.stringify(line)} (${reason}): a new output format, or something else wrote into it. ` +
      `Run \`${command}\` by hand, and report what it prints with the driver version.`,
  );
}

/** `parse`, refusing an empty stdout: nvidia-smi always prints the header, and "no GPUs" would mark every GPU lost. */
export function csvAnswer<T>(parse: (stdout: string) => T, command: string): (stdout: string) => T {
  return (stdout) => {
    if (contentLines(stdout).length === 0) {
      throw new NvidiaSmiUnparsableError(
        'nvidia-smi exited 0 but printed nothing, not even the CSV header; nodecompute does not read that as "no GPUs" and serves the last snapshot. ' +
          `Something cut its output: check which nvidia-smi is on PATH (a wrapper, a runtime hook) and run \`${command}\` by hand.`,
      );
    }
    return parse(stdout);
  };
}

function contentLines(text: string): string[] {
  return text.split(/\r?\n/).filter((line) => line.trim() !== '');
}

/** The CSV lines of an answer: not those saying a GPU cannot be reached (the others are still listed). */
function csvLines(text: string): string[] {
  return contentLines(text).filter((line) => !DEVICE_HANDLE_LINE.test(line));
}

function cellsOf(line: string): string[] {
  return line.split(',').map((cell) => cell.trim());
}

function withoutUnit(headerCell: string): string {
  return headerCell.replace(/ \[[^\]]*\]$/, '');
}

/** Only the first line can be a header: one whose first cell names the first field asked; it must name them all. */
function dropHeader(lines: string[], fields: readonly string[], command: string): void {
  const cells = cellsOf(lines[0] ?? '');
  if (withoutUnit(cells[0]!) !== fields[0]) return;
  lines.shift();
  if (cells.length !== fields.length || cells.some((cell, i) => withoutUnit(cell) !== fields[i])) {
    throw unparsable(cells.join(', '), `the header does not match the fields asked: ${fields.join(', ')}`, command);
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
  if (cells.length !== fields.length) throw unparsable(line, `expected ${fields.length} values (${fields.join(', ')}), found ${cells.length}`, command);
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
    // Only to match errors with a GPU: another form reads as null rather than failing the listing.
    busId: fields.includes('pci.bus_id') ? canonicalBusId(cell('pci.bus_id')) : null,
    utilizationPct: fields.includes('utilization.gpu') ? percentOf(cell('utilization.gpu')) : null,
  };
}

/** "87 %" (or 87 with nounits) as 87; null for [N/A] and any other form: a figure to show, not worth failing the listing. */
function percentOf(cell: string): number | null {
  const match = PERCENT.exec(cell);
  return match === null ? null : Number(match[1]);
}

const BUS_ID = /^([0-9a-f]{1,8}):([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$/i;

/** A PCI bus id in the query's form (00000000:83:00.0) from any form nvidia-smi or dmesg writes; null when not one. */
export function canonicalBusId(text: string): string | null {
  const match = BUS_ID.exec(text.trim());
  if (match === null) return null;
  const [, domain, bus, device, fn] = match as unknown as [string, string, string, string, string];
  return `${domain.padStart(8, '0')}:${bus.padStart(2, '0')}:${device.padStart(2, '0')}.${fn}`.toUpperCase();
}

// "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. ...", also written
// "for GPU0000:07:00.0", "for gpu ..." and "for GPU0: 0000:23:00.0"; what it said is read to the line's end.
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

/** Reads `--query-gpu=<fields>` output; `fields` are those asked, in order, and one not asked reads as null. */
export function parseGpuCsv(text: string, fields: readonly string[]): GpuRecord[] {
  const missing = REQUIRED_GPU_FIELDS.filter((field) => !fields.includes(field));
  if (missing.length > 0) throw new TypeError(`parseGpuCsv needs the fields ${missing.join(', ')}`);
  const command = gpuCommand(fields);
  const lines = csvLines(text);
  dropHeader(lines, fields, command);
  return lines.map((line) => parseGpuLine(line, fields, command));
}

// nvidia-smi does not quote CSV and a process name may hold ", ": two cells are taken from the
// left, one from the right, and the name is what lies between.
function parseComputeAppLine(line: string): ComputeAppRecord {
  const first = line.indexOf(',');
  const second = line.indexOf(',', first + 1);
  const last = line.lastIndexOf(',');
  if (second < 0 || last === second) throw unparsable(line, `expected ${COMPUTE_APPS_FIELDS.join(', ')}`, COMPUTE_APPS_COMMAND);
  return {
    gpuUuid: requireText(line.slice(0, first).trim(), 'gpu_uuid', line, COMPUTE_APPS_COMMAND),
    pid: parseInteger(line.slice(first + 1, second).trim(), 'pid', line, COMPUTE_APPS_COMMAND),
    name: line.slice(second + 1, last).trim(),
    usedMiB: parseMiB(line.slice(last + 1).trim(), line, COMPUTE_APPS_COMMAND),
  };
}

/** Reads `--query-compute-apps` output; a header alone, or nothing, means no compute process. */
export function parseComputeAppsCsv(text: string): ComputeAppRecord[] {
  const lines = csvLines(text);
  dropHeader(lines, COMPUTE_APPS_FIELDS, COMPUTE_APPS_COMMAND);
  return lines.map(parseComputeAppLine);
}

// Drivers from 610 on deprecate "DRIVER version" and "CUDA version" for "KMD version" and "CUDA UMD
// version": the new lines win, and a value that is not a version number is not taken for one.
const VERSION_NUMBER = /^\d+(?:\.\d+)*$/;

/** Reads `nvidia-smi --version` ("KEY version : VALUE" lines); keys it does not know are ignored. */
export function parseVersion(text: string): NvidiaSmiVersion {
  const said = new Map<string, string>();
  for (const line of contentLines(text)) {
    const [key, ...rest] = line.split(':');
    const value = rest.join(':').trim();
    if (VERSION_NUMBER.test(value)) said.set(key!.trim().toLowerCase(), value);
  }
  const version: NvidiaSmiVersion = {
    smiVersion: said.get('nvidia-smi version') ?? null,
    driverVersion: said.get('kmd version') ?? said.get('driver version') ?? null,
    cudaVersion: said.get('cuda umd version') ?? said.get('cuda version') ?? null,
  };
  if (Object.values(version).some((v) => v !== null)) return version;
  throw unparsable(text.trim().split(/\r?\n/)[0] as string, 'no version number found', 'nvidia-smi --version');
}
