// Owns how the results are shown: one row per figure (figure, measured, target, pass/fail, or info
// for a row without a target) printed as a plain-text table, and the machine the numbers come from.
import { availableParallelism, cpus, loadavg, release } from 'node:os';
import { readFileSync } from 'node:fs';

export interface Row {
  figure: string;
  measured: string;
  target: string;
  result: 'pass' | 'FAIL' | 'ERROR' | 'info';
}

export interface Machine {
  nproc: number;
  cpu: string;
  node: string;
  kernel: string;
}

export function machine(): Machine {
  let cpu = cpus()[0]?.model ?? 'unknown';
  try {
    cpu = /^model name\s*:\s*(.+)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? cpu;
  } catch {
    // Not Linux: os.cpus() is the answer.
  }
  return { nproc: availableParallelism(), cpu, node: process.version, kernel: release() };
}

/** The 1-minute load average: on a shared machine, how much else ran beside the bench. */
export function loadAverage(): number {
  return Math.round(loadavg()[0]! * 10) / 10;
}

export function formatTable(rows: Row[]): string {
  const header: Row = { figure: 'Figure', measured: 'Measured', target: 'Target', result: 'pass' };
  const cells = (row: Row) => [row.figure, row.measured, row.target, row === header ? 'Result' : row.result];
  const widths = [0, 1, 2, 3].map((i) => Math.max(...[header, ...rows].map((row) => cells(row)[i]!.length)));
  const line = (row: Row) => `| ${cells(row).map((cell, i) => cell.padEnd(widths[i]!)).join(' | ')} |`;
  const rule = `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`;
  return [line(header), rule, ...rows.map(line)].join('\n');
}
