// Owns `npm run demo`: starts the demo node (scripts/demo-node.ts: the real service on a simulated
// 8x H200 node with real shard processes in every state), says what to open and what each shard
// shows, and on Ctrl-C (or SIGTERM) kills every process it started and exits. Listens on
// 127.0.0.1 only (writes need no token from loopback), on NODECOMPUTE_PORT or 9470.
import { pino } from 'pino';
import { resolveConfig } from '../src/config.js';
import { startDemoNode, type DemoNode } from './demo-node.js';

const { config } = resolveConfig(process.env, []);
const log = pino({ level: process.env.NODECOMPUTE_LOG_LEVEL ? config.logLevel : 'warn' });

// The handlers come first: a Ctrl-C or SIGTERM while the demo starts (its shard processes spawned, in
// sessions of their own) would otherwise end Node at once and leave them running for a day. Such a
// signal stops the demo as soon as it is up.
let demo: DemoNode | undefined;
let stopping = false;
function stop(): void {
  if (demo === undefined) return;
  process.stdout.write('\nStopping: killing the demo shard processes and removing the temp dir.\n');
  demo.stop().then(
    () => process.exit(0),
    (err: Error) => {
      process.stderr.write(`nodecompute demo: stopping failed: ${err.message}\n`);
      process.exit(1);
    },
  );
}
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    stop();
  });
}

try {
  demo = await startDemoNode({ host: '127.0.0.1', port: config.port, logger: log });
} catch (err) {
  const code = (err as { code?: string }).code;
  const hint = code === 'EADDRINUSE' ? ` Port ${config.port} is taken: run NODECOMPUTE_PORT=${config.port + 1} npm run demo.` : '';
  process.stderr.write(`nodecompute demo: could not start: ${(err as Error).message}.${hint}\n`);
  process.exit(1);
}

const started = demo;
process.on('exit', () => started.killProcesses());
if (stopping) stop();
else printGuide(started);

function printGuide(demo: DemoNode): void {
  const { url } = demo;
  const width = Math.max(...demo.shards.map((shard) => shard.id.length));
  const lines = [
    '',
    `nodecompute demo: a simulated 8x NVIDIA H200 node, served at ${url}`,
    '',
    `  status page      ${url}/            (curl ${url}/ prints it as text)`,
    `  shards (JSON)    ${url}/shards`,
    `  foreign memory   ${url}/gpus/foreign-memory`,
    `  metrics          ${url}/metrics`,
    `  API docs         ${url}/docs`,
    '',
    'Shards (each one a real process group on this machine; GPUs from the fake nvidia-smi):',
    ...demo.shards.map((shard) => `  ${shard.id.padEnd(width)}  ${shard.state.padEnd(8)}  ${shard.explanation}`),
    '',
    'Foreign memory: a notebook (a real process, not registered) holds 24 GiB of GPU 4, and a process of',
    'another PID namespace ([Not Found]) holds 57 GiB of GPU 7.',
    '',
    '"unverified" shows when nvidia-smi cannot be asked, on the shards it last saw ready (the others keep their verdict). To see it, add',
    '  "failures": { "all": { "kind": "driver-unreachable" } }',
    `to ${demo.scenarioPath} (the fake nvidia-smi reads it at every call); remove it to recover.`,
    '',
    ...(demo.settled ? [] : ['Note: not every shard reached its state yet (a slow machine); reload the status page in a few seconds.', '']),
    'Ctrl-C stops the demo and every process it started.',
    '',
  ];
  process.stdout.write(lines.join('\n'));
}
