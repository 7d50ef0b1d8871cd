// Owns how a memory size reads for people (the compute devices, the status page, its tooltips and
// captions): one way, so a page never names one unit two ways (GB beside GiB). Units are
// binary and say so: nvidia-smi reports MiB, a GiB is 1024 of them, and the label is "GiB", never
// "GB" (10000 MiB is 9.8 GiB, which would be 10.5 GB). The JSON API keeps its numbers in MiB; only
// these strings are for reading.

const MIB_PER_GIB = 1024;

/** The GiB figure alone, one decimal: 10000 MiB -> "9.8". */
function gibDigits(mib: number): string {
  return (mib / MIB_PER_GIB).toFixed(1);
}

/**
 * "9.8 GiB" from 1 GiB up, one decimal; "512 MiB" below, whole as nvidia-smi reports it (the
 * driver's own few MiB are not "0.0 GiB").
 */
export function formatMemory(mib: number): string {
  return mib >= MIB_PER_GIB ? `${gibDigits(mib)} GiB` : `${mib} MiB`;
}

/** What a process or shard holds: formatMemory, or "memory not reported" where nvidia-smi says [N/A]. */
export function formatHeldMemory(mib: number | null): string {
  return mib === null ? 'memory not reported' : formatMemory(mib);
}

/**
 * A GPU's use of its memory, "127.0 / 140.4 GiB"; below 1 GiB used, in MiB as formatMemory says it
 * ("614 MiB / 140.4 GiB", as its segments read); "?" for a figure nvidia-smi did not report.
 */
export function formatMemoryUse(usedMiB: number | null, totalMiB: number | null): string {
  const total = totalMiB === null ? '?' : gibDigits(totalMiB);
  if (usedMiB !== null && usedMiB < MIB_PER_GIB) return `${formatMemory(usedMiB)} / ${total} GiB`;
  return `${usedMiB === null ? '?' : gibDigits(usedMiB)} / ${total} GiB`;
}
