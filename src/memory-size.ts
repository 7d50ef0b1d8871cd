// Owns how a memory size reads for people, one way everywhere: binary units that say so (MiB as
// nvidia-smi reports, GiB of 1024 MiB, never "GB"). The JSON API keeps its numbers in MiB.

const MIB_PER_GIB = 1024;

/** The GiB figure alone, one decimal: 10000 MiB -> "9.8". */
function gibDigits(mib: number): string {
  return (mib / MIB_PER_GIB).toFixed(1);
}

/** "9.8 GiB" from 1 GiB up, one decimal; "512 MiB" below (a few MiB are not "0.0 GiB"). */
export function formatMemory(mib: number): string {
  return mib >= MIB_PER_GIB ? `${gibDigits(mib)} GiB` : `${mib} MiB`;
}

/** What a process or shard holds: formatMemory, or "memory not reported" where nvidia-smi says [N/A]. */
export function formatHeldMemory(mib: number | null): string {
  return mib === null ? 'memory not reported' : formatMemory(mib);
}

/** "127.0 / 140.4 GiB"; "614 MiB / 140.4 GiB" below 1 GiB used; "?" for a figure not reported. */
export function formatMemoryUse(usedMiB: number | null, totalMiB: number | null): string {
  const total = totalMiB === null ? '?' : gibDigits(totalMiB);
  if (usedMiB !== null && usedMiB < MIB_PER_GIB) return `${formatMemory(usedMiB)} / ${total} GiB`;
  return `${usedMiB === null ? '?' : gibDigits(usedMiB)} / ${total} GiB`;
}

/** formatMemory of a size in bytes (a file's), to the nearest MiB. */
export function formatBytes(bytes: number): string {
  return formatMemory(Math.round(bytes / (1024 * 1024)));
}
