// Builds the GPU states of hand-made node snapshots, for tests that judge views without nvidia-smi.
import type { GpuState } from '../../src/node-state/node-snapshot.js';

/** An H200 at `index` (uuid `GPU-<index>`) using `usedMiB`, listing `processes` as [pid, MiB] pairs. */
export function gpuState(index: number, processes: Array<[pid: number, usedMiB: number | null]>, usedMiB: number | null = 1000): GpuState {
  const uuid = `GPU-${index}`;
  return {
    index,
    uuid,
    name: 'NVIDIA H200',
    totalMiB: 143771,
    usedMiB,
    freeMiB: 1,
    reservedMiB: 614,
    migMode: 'Disabled',
    busId: `00000000:${(index + 1).toString(16).toUpperCase().padStart(2, '0')}:00.0`,
    utilizationPct: null,
    processes: processes.map(([pid, mib]) => ({ pid, name: 'p', usedMiB: mib, gpuIndex: index, gpuUuid: uuid })),
  };
}
