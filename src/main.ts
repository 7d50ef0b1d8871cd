#!/usr/bin/env node
// Owns the process: the only place that reads process.env and argv (through config.ts), listens
// (on :: by default, 0.0.0.0 on a kernel without IPv6: listen.ts), and handles signals. `nodecompute` and `nodecompute serve` run the service; `nodecompute doctor`
// checks the node; --help and --version say what they say. On SIGTERM/SIGINT the server stops
// accepting, finishes in-flight requests, kills running nvidia-smi children and exits 0.
import closeWithGrace from 'close-with-grace';
import { pino, type Logger } from 'pino';
import { buildApp } from './app.js';
import { nearestWord, resolveConfig, settingsHelp, type Config, type ResolvedCli } from './config.js';
import { runDoctorCli } from './doctor/doctor-cli.js';
import { listenOn, type Listening } from './listen.js';
import { VERSION } from './version.js';

const COMMANDS = ['serve', 'doctor'];

const USAGE = `nodecompute ${VERSION}: where GPU work really runs on this node.

Usage:
  nodecompute [serve] [settings]   run the HTTP service (default)
  nodecompute doctor [settings]    check this node (nvidia-smi, host PID namespace, /proc, state file);
                                   exits non-zero when something is wrong
  nodecompute --help | --version

Settings (each flag has an environment variable; flags win):
${settingsHelp()}
`;

function createLogger(config: Config): Logger {
  if (process.stdout.isTTY) {
    return pino({ level: config.logLevel, transport: { target: 'pino-pretty', options: { translateTime: 'SYS:HH:MM:ss.l' } } });
  }
  return pino({ level: config.logLevel });
}

/**
 * Takes the first snapshot, so that the log says at once whether nvidia-smi answers. When it does
 * not, the snapshot cache has already logged the failure with what it means for the answers (one
 * warning when failing starts or its reason changes): saying it again here would log it twice.
 */
async function warmUp(app: Awaited<ReturnType<typeof buildApp>>, log: Logger): Promise<void> {
  const current = await app.services.node.current().catch(() => null);
  if (current === null) return;
  const { snapshot } = current.view;
  log.info({ gpus: snapshot.gpus.length, nvidiaSmiMs: Math.round(snapshot.timings.nvidiaSmiMs) }, 'nvidia-smi answers; GPU answers are live');
}

async function serve(cli: ResolvedCli): Promise<void> {
  const { config } = cli;
  const log = createLogger(config);
  for (const warning of cli.warnings) log.warn(warning);
  const app = await buildApp(config, { logger: log });
  let listening: Listening;
  try {
    listening = await listenOn((options) => app.listen(options), { host: config.host, port: config.port, defaultHost: cli.defaultHost });
  } catch (err) {
    await app.close();
    throw err;
  }
  // Installed once listening: close-with-grace ends the process with code 0 when the event loop
  // empties, which would hide a start that failed (a port in use) from restart policies.
  // It logs an uncaught error itself before calling this.
  closeWithGrace({ delay: 10_000, logger: log }, async ({ signal }) => {
    log.info({ signal }, 'Shutting down: finishing in-flight requests, stopping nvidia-smi runs');
    await app.close();
  });
  const { url, host, message } = listening;
  log.info({ url, host, version: VERSION, nvidiaSmi: config.nvidiaSmi, proc: config.proc, stateFile: config.stateFile }, message);
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
  if (command === 'doctor') return runDoctorCli(cli.config, process.stdout);
  try {
    await serve(cli);
  } catch (err) {
    process.stderr.write(`nodecompute: cannot start: ${(err as Error).message}\n`);
    return 1;
  }
  return null;
}

const code = await main(process.argv.slice(2));
if (code !== null) process.exitCode = code;
