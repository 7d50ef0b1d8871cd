// Owns the fake nvidia-smi as the benchmarks use it: the node's scenario (8 H200s whose compute
// processes are real PIDs, some of them shard children), installed through scripts/fake-nvidia-smi.ts,
// and the count of its runs from its log. Also renders the same node as the CSV the real tool prints,
// for the in-process measurements.
import { H200_UUIDS, installFakeNvidiaSmi } from '../scripts/fake-nvidia-smi.js';
import type { ShardGroup } from './processes.js';


const UUIDS: readonly string[] = H200_UUIDS;
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
    'index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB], mig.mode.current, pci.bus_id, utilization.gpu [%]',
    ...layout.gpus.map(
      (g) =>
        `${g.index}, ${g.uuid}, ${g.name}, ${g.totalMiB} MiB, ${g.usedMiB} MiB, ${g.freeMiB} MiB, ${g.reservedMiB} MiB, Disabled, ` +
        `00000000:${(0x18 + 0x10 * g.index).toString(16).toUpperCase()}:00.0, 100 %`,
    ),
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

/** Installs the fake in `dir` (which must exist), answering from `scenario`. */
export function createFakeSmi(dir: string, scenario: FakeScenario): FakeSmi {
  const fake = installFakeNvidiaSmi(dir, scenario);
  return {
    path: fake.path,
    setScenario: fake.setScenario,
    invocations: () =>
      fake
        .log()
        .filter((entry) => entry.type === 'invocation')
        .map(({ argv, at }) => ({ argv, at }) as Invocation),
  };
}

export function queryKind(invocation: Invocation): 'gpu' | 'compute-apps' | 'other' {
  const flags = invocation.argv.map((arg) => arg.split('=')[0]);
  if (flags.includes('--query-gpu')) return 'gpu';
  if (flags.includes('--query-compute-apps')) return 'compute-apps';
  return 'other';
}
