// Property-based fuzzing of every parser with fast-check: thousands of inputs generated from and
// mutated out of the real samples in test/fixtures/samples (read at test time), plus free text.
// Each parser either returns a well-formed result (numbers finite, integers, never negative where
// they count memory, pids or indices) or throws its own coded parse error (NvidiaSmiUnparsableError /
// ProcParseError); parseCgroup and parseLlamaLog never throw. Fixed seeds make every run the same;
// a failure prints fast-check's counterexample and the seed to replay it.
import { readdirSync, readFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import fc from 'fast-check';
import t, { type Test } from 'tap';
import { NvidiaSmiUnparsableError } from '../../src/errors.js';
import { appendTail, ENGINE_TAIL_MAX_BYTES } from '../../src/shards/engine-output.js';
import type { EngineAccount } from '../../src/shards/llama-account.js';
import { parseLlamaLog } from '../../src/shards/llama-log.js';
import {
  COMPUTE_APPS_FIELDS,
  GPU_QUERY_FIELDS,
  parseComputeAppsCsv,
  parseGpuCsv,
  parseVersion,
  type ComputeAppRecord,
  type GpuRecord,
  type NvidiaSmiVersion,
} from '../../src/system/nvidia-smi.js';
import { parseCgroup, parseProcStat, ProcParseError, type ProcStat } from '../../src/system/procfs.js';
import { readSample as sample, sampleNames } from '../helpers/samples.js';

const SEED = 20_260_517;
const sampleFiles = sampleNames();
const matching = (re: RegExp) => sampleFiles.filter((name) => re.test(name));

// ---------------------------------------------------------------------------------------------------
// Seeds cut from the samples

const WITHOUT_RESERVED = GPU_QUERY_FIELDS.filter((field) => field !== 'memory.reserved');
const stripUnit = (cell: string) => cell.replace(/ \[[^\]]*\]$/, '');
const aliases: Record<string, string> = { used_memory: 'used_gpu_memory', name: 'process_name' };

/** The sample's CSV cut to `fields` (header with its units, rows), as nvidia-smi prints it for them. */
function cut(csv: string, fields: readonly string[], canonical: (name: string) => string = (n) => n): string[] {
  const [header = '', ...rows] = csv.split('\n').filter((line) => line.trim() !== '');
  const names = header.split(', ');
  const positions = fields.map((field) => names.findIndex((name) => canonical(stripUnit(name)) === field));
  if (positions.some((p) => p < 0)) return [];
  const pick = (line: string) => {
    const cells = line.split(', ');
    return cells.length === names.length ? positions.map((p) => cells[p]).join(', ') : null;
  };
  const body = rows.map(pick).filter((line): line is string => line !== null);
  const withHeader = [positions.map((p) => names[p]).join(', '), ...body].map((line) => `${line}\n`).join('');
  const noHeader = body.map((line) => `${line}\n`).join('');
  const noUnits = noHeader.replace(/ MiB\b/g, '');
  return [withHeader, noHeader, noUnits, withHeader.replace(/\n/g, '\r\n')];
}

function gpuSeeds(): Array<{ text: string; fields: readonly string[] }> {
  const seeds: Array<{ text: string; fields: readonly string[] }> = [];
  for (const file of matching(/query-gpu-ALLFIELDS\.csv$/)) {
    for (const fields of [GPU_QUERY_FIELDS, WITHOUT_RESERVED]) for (const text of cut(sample(file), fields)) seeds.push({ text, fields });
  }
  // The noheader HAMi rows were asked for index,name,uuid,driver_version,memory.total,mig.mode.current.
  for (const file of matching(/query-gpu_noheader/)) {
    seeds.push({ text: sample(file), fields: ['index', 'name', 'uuid', 'driver_version', 'memory.total', 'mig.mode.current'] });
  }
  return seeds;
}

function computeAppsSeeds(): string[] {
  const seeds: string[] = [];
  for (const file of matching(/query-compute-apps.*\.csv$/)) seeds.push(...cut(sample(file), COMPUTE_APPS_FIELDS, (n) => aliases[n] ?? n));
  // The 8x H200 notes hold a 4-column compute-apps block after each GPU block.
  for (const file of matching(/^nvsmi-8xH200/)) {
    for (const block of sample(file).split(/\n\s*\n/)) if (block.trimStart().startsWith('gpu_uuid')) seeds.push(`${block.trim()}\n`);
  }
  for (const file of matching(/^nvsmi-compute-apps_header-only/)) seeds.push(sample(file));
  return seeds;
}

/** Lines of every sample (short ones), for splicing foreign lines into a seed. */
function linePool(): string[] {
  const lines = new Set<string>();
  for (const file of sampleFiles) for (const line of sample(file).split('\n')) if (line.length > 0 && line.length <= 300) lines.add(line);
  return [...lines].slice(0, 4000);
}

function liveProcTexts(file: 'stat' | 'cgroup'): string[] {
  const texts: string[] = [];
  for (const entry of readdirSync('/proc').filter((name) => /^\d+$/.test(name)).slice(0, 40)) {
    try {
      texts.push(readFileSync(`/proc/${entry}/${file}`, 'utf8'));
    } catch {
      // exited during the scan
    }
  }
  return texts;
}

// ---------------------------------------------------------------------------------------------------
// Mutations

const TOKENS = [
  '', ' ', ',', ', ', ',,', '\n', '\r\n', '\r', '\t', '[N/A]', 'N/A', '[Not Supported]', '[Insufficient Permissions]', '[Not Found]',
  '[Unknown Error]', '[', ']', '0', '-1', '1.5', '1e3', '0x1F', 'NaN', 'Infinity', '12 MiB', '12 GiB', '12MiB', ' MiB', 'MiB', ' [MiB]',
  'index', 'uuid', 'name', 'gpu_uuid', 'pid', 'process_name', 'used_gpu_memory [MiB]', 'memory.total [MiB]', 'memory.reserved',
  '99999999999999999999', '9'.repeat(400), `${'9'.repeat(400)} MiB`, 'GPU-00000000-0000-0000-0000-000000000000', '"', "'", '\u0000',
  '\ufeff', '\u00e9', '\u{1F600}', '\ud800', '(', ')', ') (', ':', ' : ', 'NVIDIA-SMI version  : ', 'DRIVER version      : ',
  'CUDA Version        : ', 'Z', 'S', '\u001b[31m', '\u001b[0m',
  'load_tensors:        CUDA0 model buffer size =   603.87 MiB', 'load_tensors:   CPU_Mapped model buffer size =  4685.30 MiB',
  'llm_load_tensors: offloaded 33/33 layers to GPU', 'llm_load_tensors: offloaded 0/33 layers to GPU',
  'ggml_cuda_init: found 1 CUDA devices:', '  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes',
  'ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected', 'warning: no usable GPU found',
  'device_info:', '  - CUDA0   : NVIDIA H200 (143771 MiB, 142000 MiB free)', '  - CPU     : AMD EPYC (515000 MiB, 500000 MiB free)',
  'Available devices:', '  CUDA0: NVIDIA H200 (143771 MiB, 142000 MiB free)', 'llm_load_tensors: VRAM used: 9999999999999 MiB',
  'ggml_cuda_init: found 9999 CUDA devices:', 'Jan 30 09:13:15 host ollama[5307]: ', '2024-10-11T12:45:53.660Z ',
];

const token = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...TOKENS) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 12 }) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 400 }).map((n) => '9'.repeat(n)) },
);

type Mutation =
  | { kind: 'insert'; at: number; text: string }
  | { kind: 'delete'; at: number; length: number }
  | { kind: 'replace'; at: number; length: number; text: string }
  | { kind: 'cell'; line: number; cell: number; text: string }
  | { kind: 'dup-line' | 'drop-line'; line: number }
  | { kind: 'swap-lines'; a: number; b: number }
  | { kind: 'truncate'; at: number }
  | { kind: 'splice'; line: number; from: number };

function mutation(pool: string[]): fc.Arbitrary<Mutation> {
  const n = fc.nat(100_000);
  return fc.oneof(
    fc.record({ kind: fc.constant('insert' as const), at: n, text: token }),
    fc.record({ kind: fc.constant('delete' as const), at: n, length: fc.integer({ min: 1, max: 24 }) }),
    fc.record({ kind: fc.constant('replace' as const), at: n, length: fc.integer({ min: 1, max: 12 }), text: token }),
    fc.record({ kind: fc.constant('cell' as const), line: n, cell: n, text: token }),
    fc.record({ kind: fc.constantFrom('dup-line' as const, 'drop-line' as const), line: n }),
    fc.record({ kind: fc.constant('swap-lines' as const), a: n, b: n }),
    fc.record({ kind: fc.constant('truncate' as const), at: n }),
    fc.record({ kind: fc.constant('splice' as const), line: n, from: fc.nat(Math.max(0, pool.length - 1)) }),
  );
}

function apply(text: string, m: Mutation, pool: string[]): string {
  const at = (i: number) => i % (text.length + 1);
  const lines = text.split('\n');
  const li = (i: number) => i % lines.length;
  switch (m.kind) {
    case 'insert':
      return text.slice(0, at(m.at)) + m.text + text.slice(at(m.at));
    case 'delete':
      return text.slice(0, at(m.at)) + text.slice(at(m.at) + m.length);
    case 'replace':
      return text.slice(0, at(m.at)) + m.text + text.slice(at(m.at) + m.length);
    case 'truncate':
      return text.slice(0, at(m.at));
    case 'cell': {
      const cells = lines[li(m.line)]!.split(', ');
      cells[m.cell % cells.length] = m.text;
      lines[li(m.line)] = cells.join(', ');
      return lines.join('\n');
    }
    case 'dup-line':
      lines.splice(li(m.line), 0, lines[li(m.line)]!);
      return lines.join('\n');
    case 'drop-line':
      lines.splice(li(m.line), 1);
      return lines.join('\n');
    case 'swap-lines': {
      const [a, b] = [li(m.a), li(m.b)];
      [lines[a], lines[b]] = [lines[b]!, lines[a]!];
      return lines.join('\n');
    }
    case 'splice':
      lines.splice(li(m.line), 0, pool[m.from % Math.max(1, pool.length)] ?? '');
      return lines.join('\n');
  }
}

/** A seed with up to `max` mutations, or free text, or a soup of sample lines and tokens. */
function inputs(seeds: string[], pool: string[], max = 6): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 6, arbitrary: fc.tuple(fc.constantFrom(...seeds), fc.array(mutation(pool), { maxLength: max })).map(([seed, ms]) => ms.reduce((text, m) => apply(text, m, pool), seed)) },
    { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 300 }) },
    { weight: 2, arbitrary: fc.array(fc.oneof(fc.constantFrom(...pool), token), { maxLength: 30 }).map((lines) => lines.join('\n')) },
  );
}

// ---------------------------------------------------------------------------------------------------
// What "well-formed" means

const count = (n: unknown) => typeof n === 'number' && Number.isFinite(n) && Number.isInteger(n) && n >= 0;
const mib = (n: unknown) => n === null || count(n);
const text = (s: unknown) => typeof s === 'string';

function gpuProblem(gpu: GpuRecord): string | null {
  if (!count(gpu.index)) return `index ${gpu.index}`;
  if (!text(gpu.uuid) || gpu.uuid === '' || gpu.uuid !== gpu.uuid.trim()) return `uuid ${JSON.stringify(gpu.uuid)}`;
  if (!text(gpu.name)) return 'name';
  for (const key of ['totalMiB', 'usedMiB', 'freeMiB', 'reservedMiB'] as const) if (!mib(gpu[key])) return `${key} ${gpu[key]}`;
  if (gpu.busId !== null && !/^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$/.test(gpu.busId)) return `busId ${JSON.stringify(gpu.busId)}`;
  return null;
}

function appProblem(app: ComputeAppRecord): string | null {
  if (!text(app.gpuUuid) || app.gpuUuid === '') return `gpuUuid ${JSON.stringify(app.gpuUuid)}`;
  if (!count(app.pid)) return `pid ${app.pid}`;
  if (!text(app.name)) return 'name';
  if (!mib(app.usedMiB)) return `usedMiB ${app.usedMiB}`;
  return null;
}

function versionProblem(v: NvidiaSmiVersion): string | null {
  const values = [v.smiVersion, v.driverVersion, v.cudaVersion];
  if (!values.every((x) => x === null || text(x))) return 'a value that is neither a string nor null';
  if (values.every((x) => x === null)) return 'no version at all, yet no error';
  return null;
}

function statProblem(s: ProcStat): string | null {
  for (const key of ['pid', 'ppid', 'pgrp', 'session', 'startTime'] as const) if (!count(s[key]) || !Number.isSafeInteger(s[key])) return `${key} ${s[key]}`;
  if (!/^[A-Za-z]$/.test(s.state)) return `state ${JSON.stringify(s.state)}`;
  if (!text(s.comm)) return 'comm';
  return null;
}

function accountProblem(a: EngineAccount | null): string | null {
  if (a === null) return null;
  if (a.backend !== 'CUDA' && a.backend !== 'CPU') return `backend ${a.backend}`;
  if (!Array.isArray(a.devices) || !a.devices.every(text)) return 'devices';
  if (a.backend === 'CPU' && a.devices.length > 0) return 'CPU with devices';
  if (!mib(a.layersOffloaded) || !mib(a.layersTotal)) return `layers ${a.layersOffloaded}/${a.layersTotal}`;
  if (!text(a.evidence) || a.evidence === '' || !text(a.summary) || a.summary === '') return 'no evidence or summary';
  return null;
}

/** Runs `parse`; true when it returned something well-formed or threw the allowed error. */
function holds<R>(parse: () => R, problem: (r: R) => string | null, allowed: (err: unknown) => boolean, failures: string[]): boolean {
  let result: R;
  try {
    result = parse();
  } catch (err) {
    if (allowed(err)) return true;
    failures.push(`threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
    return false;
  }
  const why = problem(result);
  if (why !== null) failures.push(`returned a bad result: ${why}`);
  return why === null;
}

const smiError = (err: unknown) =>
  err instanceof NvidiaSmiUnparsableError &&
  (err as { code?: string }).code === 'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE' &&
  (err as { statusCode?: number }).statusCode === 503;
const procError = (err: unknown) => err instanceof ProcParseError;

/** True when parseProcStat answers the bytes as it answers their text: the same fields, or the same error. */
function sameAsText(bytes: Buffer, failures: string[]): boolean {
  const outcome = (input: Buffer | string) => {
    try {
      return { value: parseProcStat(input) };
    } catch (err) {
      return { error: `${(err as Error).name}: ${(err as Error).message}` };
    }
  };
  const fromBytes = outcome(bytes);
  const fromText = outcome(bytes.toString('utf8'));
  if (isDeepStrictEqual(fromBytes, fromText)) return true;
  failures.push(`bytes gave ${JSON.stringify(fromBytes)}, text gave ${JSON.stringify(fromText)}`);
  return false;
}
const never = () => false;

function check<T>(t: Test, name: string, arbitrary: fc.Arbitrary<T>, predicate: (value: T, failures: string[]) => boolean, numRuns: number): void {
  const failures: string[] = [];
  const result = fc.check(
    fc.property(arbitrary, (value) => predicate(value, failures)),
    { seed: SEED, numRuns },
  );
  t.notOk(result.failed, result.failed ? `${name}: ${failures.at(-1)}\n${fc.defaultReportMessage(result)}` : `${name}: ${numRuns} inputs`);
}

// ---------------------------------------------------------------------------------------------------

t.test('fuzzing the parsers with inputs built from the real samples', async (t) => {
  const pool = linePool();
  t.ok(pool.length > 100, `${pool.length} sample lines to splice from`);

  t.test('parseGpuCsv', async (t) => {
    const seeds = gpuSeeds();
    t.ok(seeds.length >= 8, `${seeds.length} seeds cut from the query-gpu samples`);
    const unreadable = seeds.filter((seed) => !holds(() => parseGpuCsv(seed.text, seed.fields), (rows) => rows.map(gpuProblem).find((p) => p) ?? null, never, []));
    t.same(unreadable, [], 'every seed parses as it is');
    const byFields = new Map(seeds.map((s) => [s.text, s.fields]));
    const arbitrary = fc.tuple(inputs([...byFields.keys()], pool), fc.constantFrom(GPU_QUERY_FIELDS, WITHOUT_RESERVED, ...new Set(byFields.values())));
    check(t, 'parseGpuCsv', arbitrary, ([input, fields], failures) => holds(() => parseGpuCsv(input, fields), (rows) => rows.map(gpuProblem).find((p) => p) ?? null, smiError, failures), 6000);
  });

  t.test('parseComputeAppsCsv', async (t) => {
    const seeds = computeAppsSeeds();
    t.ok(seeds.length >= 8, `${seeds.length} seeds cut from the compute-apps samples`);
    const unreadable = seeds.filter((seed) => !holds(() => parseComputeAppsCsv(seed), (rows) => rows.map(appProblem).find((p) => p) ?? null, never, []));
    t.same(unreadable, [], 'every seed parses as it is');
    check(t, 'parseComputeAppsCsv', inputs(seeds, pool), (input, failures) => holds(() => parseComputeAppsCsv(input), (rows) => rows.map(appProblem).find((p) => p) ?? null, smiError, failures), 6000);
  });

  t.test('parseVersion', async (t) => {
    const seeds = matching(/_version\.txt$/).map(sample);
    t.ok(seeds.length >= 1, 'the --version sample');
    check(t, 'parseVersion', inputs(seeds, pool), (input, failures) => holds(() => parseVersion(input), versionProblem, smiError, failures), 3000);
  });

  t.test('parseProcStat', async (t) => {
    const seeds = [...matching(/^proc-pid-stat_/).map(sample), ...liveProcTexts('stat')];
    check(t, 'parseProcStat', inputs(seeds, pool), (input, failures) => holds(() => parseProcStat(input), statProblem, procError, failures), 4000);
    // The snapshot hands the parser the bytes it read, which it scans in place: they must read as their text does.
    check(t, 'parseProcStat on bytes', inputs(seeds, pool), (input, failures) => sameAsText(Buffer.from(input), failures), 4000);
  });

  t.test('parseCgroup', async (t) => {
    const seeds = [
      ...liveProcTexts('cgroup'),
      '0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-abc.scope\n',
      '12:memory:/docker/3f5a7c\n11:cpu,cpuacct:/docker/3f5a7c\n1:name=systemd:/docker/3f5a7c\n0::/\n',
    ];
    const problem = (paths: string[]) =>
      !Array.isArray(paths) || !paths.every((p) => text(p) && p !== '' && !p.includes('\n')) ? 'not a list of paths' : new Set(paths).size !== paths.length ? 'duplicates' : null;
    check(t, 'parseCgroup', inputs(seeds, pool), (input, failures) => holds(() => parseCgroup(input), problem, never, failures), 3000);
  });

  t.test('parseLlamaLog', async (t) => {
    const seeds = matching(/^llamacpp-/).map(sample);
    t.ok(seeds.length >= 10, `${seeds.length} llama.cpp logs`);
    t.same(seeds.filter((seed) => !holds(() => parseLlamaLog(seed), accountProblem, never, [])), [], 'every sample reads');
    check(t, 'parseLlamaLog', inputs(seeds, pool, 10), (input, failures) => holds(() => parseLlamaLog(input), accountProblem, never, failures), 3000);
  });

  t.test('appendTail keeps a suffix of at most maxBytes of UTF-8', async (t) => {
    const piece = fc.oneof(fc.string({ unit: 'binary', maxLength: 200 }), fc.string({ unit: fc.constantFrom('a', '\n', '\u00e9', '\u{1F600}', '\ud800', '\r\n'), maxLength: 200 }));
    check(
      t,
      'appendTail',
      fc.tuple(piece, piece, fc.integer({ min: 0, max: 300 })),
      ([previous, chunk, max], failures) => {
        const tail = appendTail(previous, chunk, max);
        const ok = (previous + chunk).endsWith(tail) && Buffer.byteLength(tail) <= max;
        if (!ok) failures.push(`tail of ${Buffer.byteLength(tail)} bytes for max ${max}`);
        return ok;
      },
      2000,
    );
    t.ok(Buffer.byteLength(appendTail('', 'x'.repeat(ENGINE_TAIL_MAX_BYTES + 10))) <= ENGINE_TAIL_MAX_BYTES, 'the default bound');
  });
});

t.test('named extremes: numbers too large to be numbers are parse errors, never Infinity', async (t) => {
  const huge = '9'.repeat(400);
  const gpuHeader = 'index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB], mig.mode.current, pci.bus_id, utilization.gpu [%]';
  const gpus = (rows: GpuRecord[]) => rows.map(gpuProblem).find((p) => p) ?? null;
  const apps = (rows: ComputeAppRecord[]) => rows.map(appProblem).find((p) => p) ?? null;
  const cases: Array<[string, (failures: string[]) => boolean]> = [
    ['a 400-digit memory.used', (f) => holds(() => parseGpuCsv(`${gpuHeader}\n0, GPU-1, NVIDIA H200, 143771 MiB, ${huge} MiB, 0 MiB, 614 MiB, Disabled, 00000000:18:00.0, 0 %\n`, GPU_QUERY_FIELDS), gpus, smiError, f)],
    ['a 400-digit GPU index', (f) => holds(() => parseGpuCsv(`${gpuHeader}\n${huge}, GPU-1, NVIDIA H200, 1 MiB, 1 MiB, 0 MiB, 0 MiB, Disabled, 00000000:18:00.0, 0 %\n`, GPU_QUERY_FIELDS), gpus, smiError, f)],
    ['a 400-digit pid', (f) => holds(() => parseComputeAppsCsv(`GPU-1, ${huge}, python3, 100 MiB\n`), apps, smiError, f)],
    ['a 400-digit used_gpu_memory', (f) => holds(() => parseComputeAppsCsv(`GPU-1, 42, python3, ${huge} MiB\n`), apps, smiError, f)],
  ];
  for (const [name, holdsFor] of cases) {
    const failures: string[] = [];
    t.ok(holdsFor(failures), `${name}: ${failures[0] ?? 'a parse error or a finite number'}`);
  }
});
