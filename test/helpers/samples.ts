// Reads the real outputs in ../shared/samples (nvidia-smi, llama.cpp; sources in its INDEX.md) that
// the parsers and verdicts are checked against.
import { readFileSync } from 'node:fs';

/** The samples folder. */
export const SAMPLES = new URL('../../../shared/samples/', import.meta.url);

/** The text of the sample `file`. */
export function readSample(file: string): string {
  return readFileSync(new URL(file, SAMPLES), 'utf8');
}
