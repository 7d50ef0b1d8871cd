// Reads the real outputs in test/fixtures/samples (nvidia-smi, llama.cpp, /proc; sources in its
// INDEX.md) that the parsers and verdicts are checked against. The one place that names the folder.
import { readdirSync, readFileSync } from 'node:fs';

/** The samples folder. */
export const SAMPLES = new URL('../fixtures/samples/', import.meta.url);

/** The text of the sample `file`. */
export function readSample(file: string): string {
  return readFileSync(new URL(file, SAMPLES), 'utf8');
}

/** The names of every sample, sorted (not INDEX.md, which says where they came from). */
export function sampleNames(): string[] {
  return readdirSync(SAMPLES)
    .filter((name) => name !== 'INDEX.md')
    .sort();
}
