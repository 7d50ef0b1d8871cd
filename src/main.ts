#!/usr/bin/env node
// Owns the process: the only place that reads process.env and argv (through config.ts), listens
// (on :: by default, 0.0.0.0 on a kernel without IPv6: listen.ts), and handles signals.
// `nodecompute` and `nodecompute serve` run the service; `nodecompute doctor` checks the node;
// --help and --version say what they say. `serve` and `doctor` first read the token file within a
// bound (config.ts's readStartTokens), so a file on a hung mount fails the start instead of hanging
// it; the doctor reports a file a start refuses as a failed check and goes on. On SIGTERM/SIGINT
// the server stops accepting, finishes in-flight requests, kills running nvidia-smi children and
// exits 0 (1 after an uncaught error, or when it is cut short: after 10 s, on a second signal or
// another uncaught error); or, while a read or write of the token file or the state file is stuck
// on a hung mount, ends by SIGTERM (endIfIoStuck): Node cannot exit before that operation returns.
import closeWithGrace from 'close-with-grace';
import { inspect } from 'node:util';
import { destination, pino, symbols, type Logger } from 'pino';
import { buildApp } from './app.js';
import { describeWriteAccess } from './auth.js';
import { nearestWord, readStartTokens, resolveConfig, settingsHelp, type Config, type ResolvedCli } from './config.js';
import { runDoctorCli } from './doctor/doctor-cli.js';
import { listenOn, type Listening } from './listen.js';
import { operationsKnown, operationsUnderWay, stuckOperations, type StuckOperation } from './system/stuck-io.js';
import { VERSION } from './version.js';

const COMMANDS = ['serve', 'doctor'];

/** How long a shutdown may take before it is cut short (close-with-grace's delay). */
const SHUTDOWN_GRACE_MS = 10_000;

/** How long a file operation under way when a shutdown is cut short has taken before it is taken for one that may hang. */
const SUSPECT_OPERATION_MS = 1000;

/** The SIGTERM handlers there before this module installed any: a preloaded tool's exit hooks, if any. */
const SIGTERM_HANDLERS_AT_START = process.listeners('SIGTERM');

const USAGE = `nodecompute ${VERSION}: where GPU work really runs on this node.

Usage:
  nodecompute [serve] [settings]   run the HTTP service (default)
  nodecompute doctor [settings]    check this node (nvidia-smi, host PID namespace, /proc, state file);
                                   exits non-zero when something is wrong
  nodecompute --help | --version

Settings (each flag has an environment variable; flags win):
${settingsHelp()}
`;

/**
 * Logs to stdout, one JSON line each, written synchronously: a process that ends by a signal (a
 * file operation stuck, below) has every line it logged out first, in order, with nothing
 * left queued. Lines are few (requests are logged only when they fail, or at debug level). The
 * price: a log reader that stops reading (a full pipe) stalls the service until it reads again,
 * where an asynchronous logger would grow its queue without bound instead. On a terminal, lines go
 * through pino-pretty's worker, which may lose the last ones when the process ends by a signal.
 */
function createLogger(config: Config): Logger {
  if (process.stdout.isTTY) {
    return pino({ level: config.logLevel, transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l' } } });
  }
  return pino({ level: config.logLevel }, destination({ fd: 1, sync: true }));
}

/**
 * Takes the first snapshot, so that the log says at once whether nvidia-smi answers. When it does
 * not, the snapshot cache has already logged the failure with what it means for the answers (one
 * warning when failing starts or its reason changes): saying it again here would log it twice.
 * Looks at the state directory too: one that takes no writes is logged (by state-file.ts) now,
 * not at the first registration.
 */
async function warmUp(app: Awaited<ReturnType<typeof buildApp>>, log: Logger): Promise<void> {
  const { node, stateFile, probeBudgetMs } = app.services;
  const [current] = await Promise.all([node.current().catch(() => null), stateFile.writable(probeBudgetMs)]);
  if (current === null) return;
  const { snapshot } = current.view;
  log.info({ gpus: snapshot.gpus.length, nvidiaSmiMs: Math.round(snapshot.timings.nvidiaSmiMs) }, 'nvidia-smi answers; GPU answers are live');
}

/** Returns once every line logged so far is written out (on a terminal: taken by pino-pretty's worker). */
function flushLog(log: Logger): void {
  (log as unknown as Record<symbol, { flushSync(): void }>)[symbols.streamSym]!.flushSync();
}

/** What is said when a file operation stuck on a hung mount (or, `underWay`, one slow and not yet past its bound) keeps the process from exiting. */
function stuckMessage({ what, file, fix }: StuckOperation, underWay = false): string {
  const pending = underWay ? 'is still under way (its bound has not passed yet)' : 'is still pending (its filesystem does not answer)';
  return `${what} ${file} ${pending}, and Node cannot exit before it returns: ending the process with SIGTERM instead (exit status 143). ${fix}`;
}

/**
 * Ends the process by SIGTERM's default action (exit status 143, what a process without a handler
 * shows), which the kernel carries out whatever a read waits on. close-with-grace's handlers would
 * answer the signal with process.exit(), which hangs: the handlers installed since start go. Those
 * there before (exit hooks, as signal-exit's, which raise the signal again once they have run) are
 * run first, here and now, as the signal would run them: the callers go on to an exit (close-with-
 * grace's process.exit()) without giving the event loop another turn. The signal then ends the
 * process before process.kill returns: nothing runs after it.
 */
function raiseSigterm(): void {
  for (const handler of process.listeners('SIGTERM')) {
    if (!SIGTERM_HANDLERS_AT_START.includes(handler)) process.off('SIGTERM', handler);
  }
  process.emit('SIGTERM', 'SIGTERM');
  // One that ran without ending the process would catch the signal below, and the exit would hang.
  process.removeAllListeners('SIGTERM');
  process.kill(process.pid, 'SIGTERM');
}

/**
 * Ends the process, by SIGTERM, when a file operation is stuck (still pending past its bound:
 * stuck-io.ts), after saying why in the log (on stderr before there is one); returns when none is.
 * Node's exit waits for every file operation it started to return (libuv joins its threadpool
 * threads), and one stuck on a hung mount never does: neither process.exit() nor an event loop left
 * to empty would end the process, and it would hang until the kubelet's SIGKILL. Called before
 * every exit, after operationsKnown() where there is time to wait for it; a shutdown cut short has
 * none (`cutShort`), so an operation under way for a second already ends it the same way.
 */
function endIfIoStuck(log: Logger | null, cutShort = false): void {
  const [stuck] = stuckOperations();
  // Cut short, there is no time to wait for one under way to return or pass its bound: one that has
  // taken a second already is no healthy disk's, and is taken for one that may hang.
  const [underWay] = cutShort ? operationsUnderWay(SUSPECT_OPERATION_MS) : [];
  const operation = stuck ?? underWay;
  if (operation === undefined) return;
  const message = stuckMessage(operation, stuck === undefined);
  try {
    if (log === null) {
      process.stderr.write(`nodecompute: ${message}\n`);
    } else {
      log.warn({ file: operation.file }, message);
      flushLog(log);
    }
  } finally {
    raiseSigterm();
  }
}

/**
 * The shutdown is cut short (its grace ran out, a second signal came, or an uncaught error, which
 * `fields` carry): says so, and ends the process at once. close-with-grace calls process.exit(1)
 * right after this returns, so where a file operation is stuck or still under way (that exit would
 * or could hang) the process ends here, by SIGTERM.
 */
function cutShutdownShort(log: Logger, why: string, fields: object = {}): void {
  log.error(fields, why);
  endIfIoStuck(log, true);
}

/**
 * What an uncaught error's log line carries: the error, or, for a falsy value (a promise rejected
 * with no reason, `throw ''`), that value as JavaScript writes it, which pino would leave out.
 */
const thrownFields = (err: unknown): { err: unknown } | { thrown: string } => (err ? { err } : { thrown: inspect(err) });

/** Said of an uncaught error, which nothing in nodecompute should let through. */
const A_BUG = 'a bug in nodecompute: please report it with this line and the ones before it';

async function serve(config: Config, cli: ResolvedCli): Promise<void> {
  const log = createLogger(config);
  for (const warning of cli.warnings) log.warn(warning);
  const app = await buildApp(config, { logger: log, settingsWarnings: cli.warnings });
  let listening: Listening;
  try {
    listening = await listenOn((options) => app.listen(options), { host: config.host, port: config.port, defaultHost: cli.defaultHost });
  } catch (err) {
    await app.close();
    throw err;
  }
  // Installed once listening: close-with-grace ends the process with code 0 when the event loop
  // empties, which would hide a start that failed (a port in use) from restart policies.
  // On an uncaught error it calls the shutdown with the error (and no signal); the shutdown then
  // exits 1 itself, as close-with-grace exits 0 when the value thrown is falsy.
  closeWithGrace(
    {
      delay: SHUTDOWN_GRACE_MS,
      logger: log,
      onTimeout: () =>
        cutShutdownShort(
          log,
          `Shutting down took longer than its ${SHUTDOWN_GRACE_MS / 1000} s grace: the requests still in flight are cut off, and the process ends now. ` +
            'A client that keeps a request open (a body it never finishes, an answer it does not read) holds a shutdown up; it gets a reset connection and should retry.',
        ),
      onSecondSignal: (signal) =>
        cutShutdownShort(log, `A second ${signal} came while shutting down: the requests still in flight are cut off, and the process ends now.`),
      onSecondError: (err) =>
        cutShutdownShort(log, `An uncaught error came while shutting down (${A_BUG}): the requests still in flight are cut off, and the process ends now.`, thrownFields(err)),
    },
    async (closing) => {
      const { signal, err } = closing;
      // An uncaught error is told by its key, not its value: a promise rejected with no reason (or
      // `throw undefined`) comes as { err: undefined }, and close-with-grace would then exit 0.
      const failed = 'err' in closing;
      if (failed) {
        log.error(
          thrownFields(err),
          `Shutting down after an uncaught error (${A_BUG}): finishing in-flight requests, stopping nvidia-smi runs, then exiting 1 for the restart policy to start the service again.`,
        );
      } else {
        log.info({ signal }, 'Shutting down: finishing in-flight requests, stopping nvidia-smi runs');
      }
      try {
        await app.close();
      } finally {
        await operationsKnown();
        endIfIoStuck(log);
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
  if (cli.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (cli.version) {
    process.stdout.write(`${VERSION}\n`);
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
  let config: Config;
  try {
    config = await readStartTokens(cli.config);
  } catch (err) {
    // The doctor reports a token file a start refuses as a failed check, among the others.
    if (command === 'doctor') return runDoctorCli(cli.config, process.stdout, { settingsWarnings: cli.warnings, tokenFileRefused: (err as Error).message });
    process.stderr.write(`nodecompute: ${(err as Error).message}\n`);
    return 2;
  }
  if (command === 'doctor') return runDoctorCli(config, process.stdout, { settingsWarnings: cli.warnings, tokenFileRefused: null });
  try {
    await serve(config, cli);
  } catch (err) {
    process.stderr.write(`nodecompute: cannot start: ${(err as Error).message}\n`);
    return 1;
  }
  return null;
}

const code = await main(process.argv.slice(2));
if (code !== null) {
  process.exitCode = code;
  // A token file or state file that did not answer at start leaves its read pending: the process would never end.
  await operationsKnown();
  endIfIoStuck(null);
}
