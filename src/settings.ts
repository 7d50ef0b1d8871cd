// The table of nodecompute's settings: each one's environment variable, flag, schema, default,
// what it accepts and what it means. config.ts validates against it and writes the help from it.
import { Type, type TSchema } from '@sinclair/typebox';
import { BACKENDS } from './system/driver-choice.js';
import { STATE_FILE_TIMEOUT_MS } from './system/state-file.js';

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

/** How long the token file may take at start: longer than a write waits, since a start has no tokens to fall back on. */
export const TOKEN_FILE_START_TIMEOUT_MS = 5000;

/** A span in milliseconds: its schema and what it accepts, said from the same bounds. */
function milliseconds(min: number, max: number) {
  const accepts = `an integer number of milliseconds from ${min} to ${max}`;
  return { schema: Type.Integer({ minimum: min, maximum: max }), accepts };
}

/** A setting read from --<flag> and the variable NODECOMPUTE_<FLAG>; its schema's type is kept for Config. */
function setting<S extends TSchema>(
  flag: string,
  rest: { schema: S; default: string | number | null; accepts: string; description: string },
) {
  return { env: `NODECOMPUTE_${flag.toUpperCase().replaceAll('-', '_')}`, flag, ...rest };
}

export type Setting = ReturnType<typeof setting<TSchema>>;

export const SETTINGS = {
  host: setting('host', {
    schema: Type.String({ minLength: 1, description: 'Address to listen on' }),
    default: '::',
    accepts: 'an IP address or host name',
    description:
      'Address to listen on. The default, ::, takes IPv6 and IPv4 (dual-stack); on a kernel without IPv6 it listens on 0.0.0.0 instead, and says so at start.',
  }),
  port: setting('port', {
    schema: Type.Integer({ minimum: 0, maximum: 65535, description: 'TCP port' }),
    default: 9470,
    accepts: 'an integer from 0 to 65535 (0 picks a free port)',
    description: 'TCP port the HTTP server listens on.',
  }),
  backend: setting('backend', {
    schema: Type.Union(BACKENDS.map((backend) => Type.Literal(backend)), { description: 'GPU backend' }),
    default: 'auto',
    accepts: BACKENDS.join(', '),
    description: 'Where GPU figures come from: NVML (libnvidia-ml.so.1, microseconds a query), nvidia-smi, or auto: NVML when it loads and initialises, else nvidia-smi.',
  }),
  nvmlLibrary: setting('nvml-library', {
    schema: Type.Union([Type.Null(), Type.String({ minLength: 1 })]),
    default: null,
    accepts: 'a path to libnvidia-ml.so.1',
    description: 'The NVML library to load; unset, libnvidia-ml.so.1 is found by the dynamic loader (LD_LIBRARY_PATH, the ld.so cache).',
  }),
  nvidiaSmi: setting('nvidia-smi', {
    schema: Type.String({ minLength: 1, description: 'nvidia-smi executable' }),
    default: 'nvidia-smi',
    accepts: 'a program name found on PATH or a path to the executable',
    description: 'The nvidia-smi executable to query.',
  }),
  proc: setting('proc', {
    schema: Type.String({ minLength: 1, description: 'proc root' }),
    default: '/proc',
    accepts: 'a directory path',
    description: "Where the host's /proc is mounted (the container must share the host PID namespace).",
  }),
  cacheTtlMs: setting('cache-ttl-ms', {
    ...milliseconds(0, 3_600_000),
    default: 1000,
    description: 'How long a node snapshot is fresh; at most one run of each GPU driver query per TTL.',
  }),
  maxStaleMs: setting('max-stale-ms', {
    ...milliseconds(0, 86_400_000),
    default: 30_000,
    description: 'How old a snapshot may be and still be served (marked stale) while the GPU driver is slow or failing.',
  }),
  smiTimeoutMs: setting('smi-timeout-ms', {
    ...milliseconds(100, 600_000),
    default: 5000,
    description: 'Hard limit for one GPU query: an nvidia-smi run (past it, its process group is killed) or the NVML calls of one query.',
  }),
  probeWaitMs: setting('probe-wait-ms', {
    ...milliseconds(0, 600_000),
    default: 800,
    description: "Longest a probe or poller (/readyz, /shards, /metrics, /) waits for a snapshot it needs; keep it under the probe's timeout (1 s by default).",
  }),
  logLevel: setting('log-level', {
    schema: Type.Union(LOG_LEVELS.map((level) => Type.Literal(level)), { description: 'log level' }),
    default: 'info',
    accepts: LOG_LEVELS.join(', '),
    description: 'Log level (JSON logs on stdout; pretty on a terminal).',
  }),
  stateFile: setting('state-file', {
    schema: Type.String({ minLength: 1, description: 'state file' }),
    default: 'state/nodecompute-shards.json',
    accepts: 'a file path (its directory must be writable)',
    description: 'Where shard registrations are persisted (written atomically before each 2xx).',
  }),
  stateTimeoutMs: setting('state-timeout-ms', {
    ...milliseconds(100, 600_000),
    default: STATE_FILE_TIMEOUT_MS,
    description: 'Longest a state file read or write may take before its volume is taken as hung (then a 503; nothing else starts there until it returns).',
  }),
  gpuGraceMs: setting('gpu-grace-ms', {
    ...milliseconds(0, 3_600_000),
    default: 15_000,
    description: 'Default time a new shard may take before holding memory on its GPUs (starting, not yet on-cpu).',
  }),
  token: setting('token', {
    // Checked by config.ts's tokenProblem, as the token file's lines are.
    schema: Type.Union([Type.Null(), Type.String()]),
    default: null,
    accepts: 'a secret of at least 16 characters, printable ASCII without spaces, such as `openssl rand -hex 32` makes',
    description: 'Bearer token required for writes. Without a token, writes are accepted from loopback only.',
  }),
  tokenFile: setting('token-file', {
    schema: Type.Union([Type.Null(), Type.String({ minLength: 1 })]),
    default: null,
    accepts:
      'a path to a file holding one or more tokens, one a line, each at least 16 characters, printable ASCII without spaces, with "#" starting a comment line (so no token there starts with "#"; e.g. a mounted Kubernetes Secret)',
    description:
      `Bearer tokens (any is accepted) read from this file; a start fails if it is unusable or late (${TOKEN_FILE_START_TIMEOUT_MS / 1000} s). ` +
      'It is re-read when it changes (at most once a second), so a Secret can be rotated without a restart: roll out "old + new", then "new".',
  }),
  allowedHosts: setting('allowed-hosts', {
    schema: Type.Union([Type.Null(), Type.String({ pattern: '^\\s*[A-Za-z0-9.:\\[\\]-]+(\\s*,\\s*[A-Za-z0-9.:\\[\\]-]+)*\\s*$' })]),
    default: null,
    accepts: 'host names separated by commas, such as gpu-node-7,gpu-node-7.example.com',
    description: 'Without a token, the Host names a loopback write may give besides localhost, 127.0.0.1 and [::1] (any other is refused: DNS rebinding).',
  }),
};
