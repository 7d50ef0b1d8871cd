#!/usr/bin/env node
// Owns the process: the only place that reads process.env and argv (through config.ts), listens,
// and handles signals. `nodecompute` and `nodecompute serve` run the service; `nodecompute doctor`
// checks the node; --help and --version say what they say. On SIGTERM/SIGINT the server stops
// accepting, finishes in-flight requests, kills running nvidia-smi children and exits 0.
import closeWithGrace from 'close-with-grace';
import { pino, type Logger } from 'pino';
import { buildApp } from './app.js';
import { resolveConfig, settingsHelp, type Config, type ResolvedCli } from './config.js';
import { runDoctorCli } from './doctor/doctor-cli.js';
import { VERSION } from './version.js';

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

async function warmUp(app: Awaited<ReturnType<typeof buildApp>>, log: Logger): Promise<void> {
  try {
    const { view } = await app.services.node.current();
    log.info({ gpus: view.snapshot.gpus.length, nvidiaSmiMs: Math.round(view.snapshot.timings.nvidiaSmiMs) }, 'nvidia-smi answers; GPU answers are live');
  } catch (err) {
    const { code, message } = err as { code?: string; message: string };
    log.error(
      { code },
      `${message} Until this is fixed, /gpus, /readyz and the shard probes answer 503 (${code}) or unverified; /livez stays 200.`,
    );
  }
}

async function serve(cli: ResolvedCli): Promise<void> {
  const { config } = cli;
  const log = createLogger(config);
  for (const warning of cli.warnings) log.warn(warning);
  const app = await buildApp(config, { logger: log });
  let url: string;
  try {
    url = await app.listen({ host: config.host, port: config.port });
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
  log.info({ url, version: VERSION, nvidiaSmi: config.nvidiaSmi, proc: config.proc, stateFile: config.stateFile }, 'nodecompute is listening');
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
  if (extra.length > 0 || !['serve', 'doctor'].includes(command)) {
    process.stderr.write(`nodecompute: unknown command "${cli.positionals.join(' ')}". Run \`nodecompute --help\`.\n`);
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
