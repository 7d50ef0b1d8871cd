// Owns the fake nvidia-smi as the benchmarks use it: the node's scenario (8 H200s whose compute
// processes are real PIDs, some of them shard children), a /bin/sh wrapper that points the fake
// executable (test/fixtures/bin/nvidia-smi, plain JS, found relative to dist/bench at run time) at
// this bench's scenario file and invocation log, and the count of its runs from that log. Written
// here rather than imported from test/, which is not compiled. Also renders the same node as the CSV
// the real tool prints, for the in-process measurements.
import { chmodSync, existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ShardGroup } from './processes.js';

export const FAKE_BIN = fileURLToPath(new URL('../../test/fixtures/bin/nvidia-smi', import.meta.url));

const UUIDS = [
  'GPU-a44622e3-2296-6285-0a86-84d0f6c67900',
  'GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb',
  'GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90',
  'GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092',
  'GPU-cb449822-5571-be90-8303-e7558da3ea66',
  'GPU-8e137fa6-c3d9-6980-7733-0d8df296756e',
  'GPU-d9337494-6060-1440-039f-4654245b5764',
  'GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72',
] as const;
export const GPU_COUNT = UUIDS.length;
const TOTAL_MIB = 143771;
const RESERVED_MIB = 614;
/** What nvidia-smi counts as used beyond the listed processes (DESIGN.md §5: 16-20 MiB on H200). */
const UNLISTED_MIB = 18;

export interface NodeGpu {
  index: number;
  uuid: string;
  name: string;
  totalMiB: number;
  usedMiB: number;
  freeMiB: number;
  reservedMiB: number;
}

export interface NodeProcess {
  gpuUuid: string;
  pid: number;
  name: string;
  usedMiB: number;
}

export interface NodeLayout {
  gpus: NodeGpu[];
  processes: NodeProcess[];
  /** Shard i is placed on GPU shardGpu[i]; its child holds memory there. */
  shardGpu: number[];
}

/**
 * `total` GPU processes over 8 GPUs: the children of the first `holders` shard groups (shard i on
 * GPU i % 8), then foreign PIDs from the pool. Shards beyond `holders` hold nothing (they are only
 * read and matched against).
 */
export function nodeLayout(total: number, shards: ShardGroup[], holders: number, foreign: number[]): NodeLayout {
  if (holders > shards.length || holders > total) throw new Error(`cannot place ${holders} shard children among ${total} processes of ${shards.length} shards`);
  if (total - holders > foreign.length) throw new Error(`need ${total - holders} foreign PIDs, have ${foreign.length}`);
  const processes: NodeProcess[] = [];
  const shardGpu = shards.map((_, i) => i % GPU_COUNT);
  for (let i = 0; i < holders; i += 1) {
    processes.push({ gpuUuid: UUIDS[shardGpu[i]!]!, pid: shards[i]!.child, name: '/opt/llama.cpp/bin/llama-server', usedMiB: 12_000 });
  }
  for (let i = 0; i < total - holders; i += 1) {
    processes.push({ gpuUuid: UUIDS[i % GPU_COUNT]!, pid: foreign[i]!, name: '/usr/local/bin/python3.10', usedMiB: 256 + (i % 7) * 32 });
  }
  const gpus = UUIDS.map((uuid, index) => {
    const listed = processes.filter((p) => p.gpuUuid === uuid).reduce((sum, p) => sum + p.usedMiB, 0);
    const usedMiB = Math.min(TOTAL_MIB - RESERVED_MIB, listed + UNLISTED_MIB);
    return { index, uuid, name: 'NVIDIA H200', totalMiB: TOTAL_MIB, usedMiB, freeMiB: TOTAL_MIB - RESERVED_MIB - usedMiB, reservedMiB: RESERVED_MIB };
  });
  return { gpus, processes, shardGpu };
}

/** The CSV nvidia-smi prints for GPU_QUERY_FIELDS and COMPUTE_APPS_FIELDS (header, units). */
export function nodeCsv(layout: NodeLayout): { gpus: string; apps: string } {
  const gpus = [
    'index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB]',
    ...layout.gpus.map((g) => `${g.index}, ${g.uuid}, ${g.name}, ${g.totalMiB} MiB, ${g.usedMiB} MiB, ${g.freeMiB} MiB, ${g.reservedMiB} MiB`),
  ];
  const apps = ['gpu_uuid, pid, process_name, used_gpu_memory [MiB]'];
  for (const gpu of layout.gpus) {
    for (const p of layout.processes) if (p.gpuUuid === gpu.uuid) apps.push(`${p.gpuUuid}, ${p.pid}, ${p.name}, ${p.usedMiB} MiB`);
  }
  return { gpus: `${gpus.join('\n')}\n`, apps: `${apps.join('\n')}\n` };
}

export interface FakeScenario {
  gpus: NodeGpu[];
  processes: NodeProcess[];
  delayMs?: number;
}

export interface Invocation {
  argv: string[];
  at: number;
}

export interface FakeSmi {
  path: string;
  setScenario(scenario: FakeScenario): void;
  invocations(): Invocation[];
}

function shellQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

/** Writes the scenario, log and wrapper into `dir` (which must exist). */
export function createFakeSmi(dir: string, scenario: FakeScenario): FakeSmi {
  const path = join(dir, 'nvidia-smi');
  const scenarioPath = join(dir, 'scenario.json');
  const logPath = join(dir, 'invocations.jsonl');
  let writes = 0;
  const setScenario = (next: FakeScenario) => {
    // temp + rename: a fake run reading concurrently never sees half a file.
    writes += 1;
    const temp = `${scenarioPath}.${writes}.tmp`;
    writeFileSync(temp, JSON.stringify(next));
    renameSync(temp, scenarioPath);
  };
  setScenario(scenario);
  writeFileSync(
    path,
    [
      '#!/bin/sh',
      '# Written by bench/fake-smi.ts: points the fake nvidia-smi at this bench run\'s scenario and log.',
      'unset NODE_OPTIONS',
      `FAKE_NVIDIA_SMI_SCENARIO=${shellQuote(scenarioPath)}; export FAKE_NVIDIA_SMI_SCENARIO`,
      `FAKE_NVIDIA_SMI_LOG=${shellQuote(logPath)}; export FAKE_NVIDIA_SMI_LOG`,
      `exec ${shellQuote(process.execPath)} ${shellQuote(FAKE_BIN)} "$@"`,
      '',
    ].join('\n'),
  );
  chmodSync(path, 0o755);
  return {
    path,
    setScenario,
    invocations() {
      if (!existsSync(logPath)) return [];
      return readFileSync(logPath, 'utf8')
        .split('\n')
        .filter((line) => line !== '')
        .map((line) => JSON.parse(line) as { type: string; argv: string[]; at: number })
        .filter((entry) => entry.type === 'invocation')
        .map(({ argv, at }) => ({ argv, at }));
    },
  };
}

export function queryKind(invocation: Invocation): 'gpu' | 'compute-apps' | 'other' {
  const flags = invocation.argv.map((arg) => arg.split('=')[0]);
  if (flags.includes('--query-gpu')) return 'gpu';
  if (flags.includes('--query-compute-apps')) return 'compute-apps';
  return 'other';
}
