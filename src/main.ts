#!/usr/bin/env node
// The process: the only reader of process.env and argv, the listener and the signal handler. On
// SIGTERM/SIGINT it finishes in-flight requests, kills running nvidia-smi children (or leaves a stuck NVML call) and exits 0; 1
// after an uncaught error, or when cut short (10 s, a second signal).
import closeWithGrace from 'close-with-grace';
import { inspect } from 'node:util';
import { destination, pino, type Logger } from 'pino';
import { buildApp } from './app.js';
import { describeWriteAccess } from './auth.js';
import { nearestWord, readStartTokens, resolveConfig, settingsHelp, type Config, type ResolvedCli } from './config.js';
import { runDoctorCli } from './doctor/doctor-cli.js';
import { listenOn } from './listen.js';
import { exitNow } from './system/exit-now.js';
import { nvmlCallsUnderWay } from './system/nvml/nvml-library.js';
import { VERSION } from './version.js';

const COMMANDS = ['serve', 'doctor'];

/** How long a shutdown may take before it is cut short (close-with-grace's delay). */
const SHUTDOWN_GRACE_MS = 10_000;

const USAGE = `nodecompute ${VERSION}: where GPU work really runs on this node.

Usage:
  nodecompute [serve] [settings]   run the HTTP service (default)
  nodecompute doctor [settings]    check this node (the GPU driver, host PID namespace, /proc, state file);
                                   exits non-zero when something is wrong
  nodecompute --help | --version

Settings (each flag has an environment variable; flags win):
${settingsHelp()}
`;

/** JSON lines to stdout, written synchronously so none is lost at exit; pretty on a terminal. */
function createLogger(config: Config): Logger {
  if (process.stdout.isTTY) {
    return pino({ level: config.logLevel, transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l' } } });
  }
  return pino({ level: config.logLevel }, destination({ fd: 1, sync: true }));
}

/** Takes the first snapshot and looks at the state directory, so the log says at once whether both work. */
async function warmUp(app: Awaited<ReturnType<typeof buildApp>>, log: Logger): Promise<void> {
  const { node, stateFile, probeBudgetMs } = app.services;
  const [current] = await Promise.all([node.current().catch(() => null), stateFile.writable(probeBudgetMs)]);
  if (current === null) return;
  const { snapshot } = current.view;
  log.info({ gpus: snapshot.gpus.length, driverMs: Math.round(snapshot.timings.driverMs) }, `${app.services.driver.backend} answers; GPU answers are live`);
}

/** An uncaught error's log fields: a falsy one (`throw ''`), which pino would leave out, as JavaScript writes it. */
const thrownFields = (err: unknown): { err: unknown } | { thrown: string } => (err ? { err } : { thrown: inspect(err) });

/** Said of an uncaught error, which nothing in nodecompute should let through. */
const A_BUG = 'a bug in nodecompute: please report it with this line and the ones before it';
const CUT_OFF = 'the requests still in flight are cut off, and the process ends now.';
const RESET = 'gets a reset connection and should retry.';

async function serve(config: Config, cli: ResolvedCli): Promise<void> {
  const log = createLogger(config);
  for (const warning of cli.warnings) log.warn(warning);
  const app = await buildApp(config, { logger: log, settingsWarnings: cli.warnings });
  const where = { host: config.host, port: config.port, defaultHost: cli.defaultHost };
  const listening = await listenOn((options) => app.listen(options), where).catch(async (err: unknown) => {
    await app.close();
    throw err;
  });
  // Installed once listening: else a start that failed (a port in use) would exit 0 when the event
  // loop empties. After an uncaught error the shutdown exits 1 itself (close-with-grace: 0 if falsy).
  closeWithGrace(
    {
      delay: SHUTDOWN_GRACE_MS,
      logger: log,
      onTimeout: () =>
        log.error(`Shutting down took longer than its ${SHUTDOWN_GRACE_MS / 1000} s grace: ${CUT_OFF} A client holding a request open ${RESET}`),
      onSecondSignal: (signal) => log.error(`A second ${signal} came while shutting down: ${CUT_OFF}`),
      onSecondError: (err) => log.error(thrownFields(err), `An uncaught error came while shutting down (${A_BUG}): ${CUT_OFF}`),
    },
    async (closing) => {
      const { signal, err } = closing;
      // By its key, not its value: a promise rejected with no reason comes as { err: undefined }.
      const failed = 'err' in closing;
      const stopping = 'finishing in-flight requests, stopping GPU queries';
      const afterError = `Shutting down after an uncaught error (${A_BUG}): ${stopping}, then exiting 1 for the restart policy to start the service again.`;
      if (failed) log.error(thrownFields(err), afterError);
      else log.info({ signal }, `Shutting down: ${stopping}`);
      await app.close();
      // Proven by test/e2e/nvml-backend.test.ts; _exit ends the process before coverage is written.
      /* c8 ignore next 4 */
      if (nvmlCallsUnderWay() > 0) {
        log.warn('An NVML call is still stuck in the driver: the process ends now without waiting for it (it could wait forever).');
        exitNow(failed ? 1 : 0);
      }
      if (failed) process.exit(1);
    },
  );
  const { url, host, message } = listening;
  log.info({ url, host, version: VERSION, nvidiaSmi: config.nvidiaSmi, proc: config.proc, stateFile: config.stateFile }, message);
  log.info({ tokenFile: config.tokenFile }, describeWriteAccess(config));
  await warmUp(app, log);
}

async function main(argv: string[]): Promise<number | null> {
  let cli: ResolvedCli;
  try {
    cli = resolveConfig(process.env, argv);
  } catch (err) {
    process.stderr.write(`nodecompute: ${(err as Error).message}\n`);
    return 2;
  }
  if (cli.help || cli.version) {
    process.stdout.write(cli.help ? USAGE : `${VERSION}\n`);
    return 0;
  }
  const [command = 'serve', ...extra] = cli.positionals;
  if (extra.length > 0 || !COMMANDS.includes(command)) {
    const guess = extra.length === 0 ? nearestWord(command, COMMANDS) : null;
    process.stderr.write(
      `nodecompute: unknown command "${cli.positionals.join(' ')}"${guess === null ? '' : ` (did you mean ${guess}?)`}. The commands are serve (the default) and doctor; run \`nodecompute --help\`.\n`,
    );
    return 2;
  }
  const { config, refused } = await readStartTokens(cli.config).then(
    (config) => ({ config, refused: null }),
    (err: Error) => ({ config: cli.config, refused: err.message }),
  );
  // The doctor reports a token file a start refuses as a failed check, among the others.
  if (command === 'doctor') return runDoctorCli(config, process.stdout, { settingsWarnings: cli.warnings, tokenFileRefused: refused });
  if (refused !== null) {
    process.stderr.write(`nodecompute: ${refused}\n`);
    return 2;
  }
  try {
    await serve(config, cli);
  } catch (err) {
    process.stderr.write(`nodecompute: cannot start: ${(err as Error).message}\n`);
    return 1;
  }
  return null;
}

const code = await main(process.argv.slice(2));
if (code !== null) process.exitCode = code;
