// `nodecompute doctor`: builds the readers from the settings, runs the checks once, prints the table
// and exits non-zero when any failed. A start's settings warnings and token-file refusal are rows.
import type { Writable } from 'node:stream';
import { pino } from 'pino';
import type { Config } from '../config.js';
import { chooseDriver } from '../system/driver-choice.js';
import { exitNow } from '../system/exit-now.js';
import { nvmlCallsUnderWay } from '../system/nvml/nvml-library.js';
import { createModelFileReader } from '../system/model-files.js';
import { createProcReader } from '../system/procfs.js';
import { createStateFile } from '../system/state-file.js';
import { VERSION } from '../version.js';
import { formatDoctorReport, runDoctor } from './doctor.js';

/** settingsWarnings: ResolvedCli.warnings; tokenFileRefused: readStartTokens's message, null when it reads the file. */
export type DoctorCliOptions = { settingsWarnings: readonly string[]; tokenFileRefused: string | null };

export async function runDoctorCli(config: Config, out: Writable, options: DoctorCliOptions): Promise<number> {
  // The table is the output; reader warnings would only repeat it.
  const log = pino({ level: 'silent' });
  const { driver, why } = await chooseDriver(config, log);
  // The tokens read from the token file at start (readStartTokens refuses to start without one).
  const { tokenFile: path, fileTokens } = config;
  const report = await runDoctor({
    driver,
    driverWhy: why,
    proc: createProcReader({ root: config.proc, log }),
    modelFiles: createModelFileReader(config.proc),
    stateFile: createStateFile(config.stateFile, { log, timeoutMs: config.stateTimeoutMs }),
    tokenConfigured: config.token !== null,
    tokenFile: path === null ? null : async () => ({ path, tokens: fileTokens.length, problem: null }),
    tokenFileRefused: options.tokenFileRefused,
    settingsWarnings: options.settingsWarnings,
    version: VERSION,
    now: Date.now,
  });
  out.write(formatDoctorReport(report));
  const code = report.ok ? 0 : 1;
  // A stuck NVML call would keep the process from ending. Proven by test/e2e/nvml-backend.test.ts;
  // _exit ends the process before coverage is written.
  /* c8 ignore next */
  if (nvmlCallsUnderWay() > 0) exitNow(code);
  return code;
}
