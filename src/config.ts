// Owns every setting of the service: one table naming each setting's environment variable, flag,
// accepted values, default and meaning. `resolveConfig` turns env + argv into a validated Config
// once, at start, and does no I/O; a bad value stops the start with a message naming the setting and
// what it accepts, and a value that works but will likely hurt comes back as a warning for main.ts
// to log. `readStartTokens` then reads the token file, the one setting that names something to read
// before the service can start: asynchronously and within a bound (through the reader auth.ts uses
// while running), because a file on a hung mount would otherwise hang the start, silently.
// It also owns what a write token may be (tokenProblem, parseTokenFile), so the token file that
// auth.ts re-reads while running is held to the same rules as at start. The help text is generated
// from the same table, so it cannot drift from the code.
import { parseArgs } from 'node:util';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { ConfigInvalidError } from './errors.js';
import { STATE_FILE_TIMEOUT_MS } from './system/state-file.js';
import { createTokenFileReader, type FileOwner, type TokenFileReaderOptions } from './system/token-file.js';

interface Setting {
  env: string;
  flag: string;
  schema: TSchema;
  default: string | number | null;
  accepts: string;
  description: string;
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

/**
 * How long the token file may take to answer at start. Longer than the second a write waits for it
 * while running (TOKEN_FILE_READ_TIMEOUT_MS): a write has the tokens last read to fall back on, a
 * start has none, and a network mount's first access after boot can be slow without being hung.
 */
export const TOKEN_FILE_START_TIMEOUT_MS = 5000;

function milliseconds(min: number, max: number, description: string) {
  return Type.Integer({ minimum: min, maximum: max, description });
}

export const SETTINGS = {
  host: {
    env: 'NODECOMPUTE_HOST',
    flag: 'host',
    schema: Type.String({ minLength: 1, description: 'Address to listen on' }),
    default: '::',
    accepts: 'an IP address or host name',
    description:
      'Address the HTTP server listens on. The default, ::, takes IPv6 and IPv4 alike (one dual-stack socket), so probes reach it in IPv4, dual-stack and IPv6-only clusters; ' +
      'on a kernel without IPv6 it listens on 0.0.0.0 instead, and its start-up line says which. A host that is set is used as given.',
  },
  port: {
    env: 'NODECOMPUTE_PORT',
    flag: 'port',
    schema: Type.Integer({ minimum: 0, maximum: 65535, description: 'TCP port' }),
    default: 9470,
    accepts: 'an integer from 0 to 65535 (0 picks a free port)',
    description: 'TCP port the HTTP server listens on.',
  },
  nvidiaSmi: {
    env: 'NODECOMPUTE_NVIDIA_SMI',
    flag: 'nvidia-smi',
    schema: Type.String({ minLength: 1, description: 'nvidia-smi executable' }),
    default: 'nvidia-smi',
    accepts: 'a program name found on PATH or a path to the executable',
    description: 'The nvidia-smi executable to query.',
  },
  proc: {
    env: 'NODECOMPUTE_PROC',
    flag: 'proc',
    schema: Type.String({ minLength: 1, description: 'proc root' }),
    default: '/proc',
    accepts: 'a directory path',
    description: "Where the host's /proc is mounted (the container must share the host PID namespace).",
  },
  cacheTtlMs: {
    env: 'NODECOMPUTE_CACHE_TTL_MS',
    flag: 'cache-ttl-ms',
    schema: milliseconds(0, 3_600_000, 'cache TTL'),
    default: 1000,
    accepts: 'an integer number of milliseconds from 0 to 3600000',
    description: 'How long a node snapshot is fresh; at most one nvidia-smi run per query per TTL.',
  },
  maxStaleMs: {
    env: 'NODECOMPUTE_MAX_STALE_MS',
    flag: 'max-stale-ms',
    schema: milliseconds(0, 86_400_000, 'max stale'),
    default: 30_000,
    accepts: 'an integer number of milliseconds from 0 to 86400000',
    description: 'How old a snapshot may be and still be served (marked stale) while nvidia-smi is slow or failing.',
  },
  smiTimeoutMs: {
    env: 'NODECOMPUTE_SMI_TIMEOUT_MS',
    flag: 'smi-timeout-ms',
    schema: milliseconds(100, 600_000, 'nvidia-smi timeout'),
    default: 5000,
    accepts: 'an integer number of milliseconds from 100 to 600000',
    description: 'Hard limit for one nvidia-smi run; past it the run and its process group are killed.',
  },
  probeWaitMs: {
    env: 'NODECOMPUTE_PROBE_WAIT_MS',
    flag: 'probe-wait-ms',
    schema: milliseconds(0, 600_000, 'probe wait'),
    default: 800,
    accepts: 'an integer number of milliseconds from 0 to 600000',
    description:
      "Longest a probe (/readyz, /shards/:id/ready) or a poller (/shards, /shards/:id, /metrics, the status page /) waits for a snapshot it needs before answering without one; keep it under the probe's timeout (Kubernetes' default is 1 s).",
  },
  logLevel: {
    env: 'NODECOMPUTE_LOG_LEVEL',
    flag: 'log-level',
    schema: Type.Union(
      LOG_LEVELS.map((level) => Type.Literal(level)),
      { description: 'log level' },
    ),
    default: 'info',
    accepts: LOG_LEVELS.join(', '),
    description: 'Log level (JSON logs on stdout; pretty on a terminal).',
  },
  stateFile: {
    env: 'NODECOMPUTE_STATE_FILE',
    flag: 'state-file',
    schema: Type.String({ minLength: 1, description: 'state file' }),
    default: 'state/nodecompute-shards.json',
    accepts: 'a file path (its directory must be writable)',
    description: 'Where shard registrations are persisted (written atomically before each 2xx).',
  },
  stateTimeoutMs: {
    env: 'NODECOMPUTE_STATE_TIMEOUT_MS',
    flag: 'state-timeout-ms',
    schema: milliseconds(100, 600_000, 'state file timeout'),
    default: STATE_FILE_TIMEOUT_MS,
    accepts: 'an integer number of milliseconds from 100 to 600000',
    description:
      'How long a read or write of the state file may take before its volume is taken for one that does not answer (a hung network mount): the change is then answered 503, and nothing else is started there until the operation returns.',
  },
  gpuGraceMs: {
    env: 'NODECOMPUTE_GPU_GRACE_MS',
    flag: 'gpu-grace-ms',
    schema: milliseconds(0, 3_600_000, 'GPU grace'),
    default: 15_000,
    accepts: 'an integer number of milliseconds from 0 to 3600000',
    description: 'Default time a new shard may take before holding memory on its GPUs (starting, not yet on-cpu).',
  },
  token: {
    env: 'NODECOMPUTE_TOKEN',
    flag: 'token',
    // Checked by tokenProblem, with the lines of the token file.
    schema: Type.Union([Type.Null(), Type.String()]),
    default: null,
    accepts: 'a secret of at least 16 characters, printable ASCII without spaces, such as `openssl rand -hex 32` makes',
    description: 'Bearer token required for writes. Without a token, writes are accepted from loopback only.',
  },
  tokenFile: {
    env: 'NODECOMPUTE_TOKEN_FILE',
    flag: 'token-file',
    schema: Type.Union([Type.Null(), Type.String({ minLength: 1 })]),
    default: null,
    accepts:
      'a path to a file holding one or more tokens, one a line, each at least 16 characters, printable ASCII without spaces, with "#" starting a comment line (so no token there starts with "#"; e.g. a mounted Kubernetes Secret)',
    description:
      'Read the bearer tokens from this file instead of NODECOMPUTE_TOKEN; any of them is accepted. ' +
      `It is read at start, which fails if the file cannot be read, holds no usable token or does not answer within ${TOKEN_FILE_START_TIMEOUT_MS / 1000} s (a hung mount). ` +
      'It is re-read when it changes (checked at most once a second, on writes and GET /doctor), so a Secret can be rotated without a restart: roll out "old + new", then "new".',
  },
} as const satisfies Record<string, Setting>;

type SettingKey = keyof typeof SETTINGS;

export interface Config {
  host: string;
  port: number;
  nvidiaSmi: string;
  proc: string;
  cacheTtlMs: number;
  maxStaleMs: number;
  smiTimeoutMs: number;
  probeWaitMs: number;
  logLevel: (typeof LOG_LEVELS)[number];
  stateFile: string;
  stateTimeoutMs: number;
  gpuGraceMs: number;
  /**
   * The bearer token for writes: NODECOMPUTE_TOKEN, or the first token NODECOMPUTE_TOKEN_FILE held
   * at start (filled in by readStartTokens; null until then); null when neither is set (writes from
   * loopback only).
   */
  token: string | null;
  tokenFile: string | null;
  /**
   * Every token NODECOMPUTE_TOKEN_FILE held at start (readStartTokens; none without it, or before it);
   * auth.ts re-reads the file.
   */
  fileTokens: string[];
}

export type LogLevel = Static<(typeof SETTINGS)['logLevel']['schema']>;

/** Every setting at its default: the base that tests and the demo override. */
export function defaultConfig(overrides: Partial<Config> = {}): Config {
  const base = Object.fromEntries(
    Object.entries(SETTINGS).map(([key, setting]) => [key, setting.default]),
  ) as unknown as Config;
  return { ...base, fileTokens: [], ...overrides };
}

/**
 * How a refused token is named: a token goes to stderr, and from there to a log store, so its length
 * (as checked, without the whitespace around it), never its value.
 */
function describeSecret(raw: unknown): string {
  const text = String(raw);
  const secret = text.trim();
  if (text === '') return 'an empty value';
  if (secret === '') return 'only whitespace';
  return `a secret of ${secret.length} characters, not shown`;
}

/**
 * Refuses a setting's value. `accepts`: what the setting takes, said after `why`; null when the value
 * is in its range and only its combination with another setting is wrong (`why` says how).
 */
function invalid(setting: Setting, raw: unknown, why?: string, accepts: string | null = setting.accepts): never {
  const got = setting === SETTINGS.token ? describeSecret(raw) : JSON.stringify(raw);
  throw new ConfigInvalidError(
    `Invalid setting ${setting.env} (--${setting.flag}): got ${got}${why ? ` (${why})` : ''}` +
      `${accepts === null ? '.' : `; it accepts ${accepts}.`} Fix the environment variable or flag and start again.`,
  );
}

/**
 * What Kubernetes sets in every container of a namespace for each Service with a cluster IP
 * (enableServiceLinks, on by default), for a Service named nodecompute or nodecompute-<anything>
 * (the name upper-cased, "-" as "_"): <NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT (and _<PORT NAME> per
 * named port), <NAME>_PORT=tcp://IP:PORT and <NAME>_PORT_<N>_<PROTO> with _PROTO, _PORT and _ADDR;
 * Docker's legacy links set the same. Only NODECOMPUTE_PORT is also a setting; the others are not
 * unknown settings to warn about.
 */
const SERVICE_LINK_VARIABLE = /^NODECOMPUTE_([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$/;
const SERVICE_LINK_PORT = /^(tcp|udp|sctp):\/\//;

function coerce(setting: Setting, raw: string | number | null): unknown {
  if (raw === null) return null;
  const isNumeric = setting.schema.type === 'integer';
  if (isNumeric && typeof raw === 'string') {
    if (setting === SETTINGS.port && SERVICE_LINK_PORT.test(raw.trim())) {
      invalid(
        setting,
        raw,
        'the value Kubernetes sets in every pod of a namespace with a Service named nodecompute that has a cluster IP, as Docker does for a link to a container named nodecompute. ' +
          'Set enableServiceLinks: false in the pod spec (deploy/kubernetes/daemonset.yaml does), or set NODECOMPUTE_PORT in the container\'s env, which wins',
      );
    }
    if (!/^-?\d+$/.test(raw.trim())) invalid(setting, raw, 'not an integer');
    return Number(raw.trim());
  }
  return raw;
}

function validate(setting: Setting, raw: string | number | null): unknown {
  const value = coerce(setting, raw);
  if (!Value.Check(setting.schema, value)) invalid(setting, raw);
  return value;
}

/** Values that start so are placeholders of the examples (deploy/kubernetes/secret.example.yaml), known to anyone. */
const PLACEHOLDER = /^REPLACE-ME/i;

/**
 * Why `token` (already trimmed) can never authorise a write, or null when it can. Never says the token.
 * Any printable ASCII is taken, not only RFC 6750's b64token (letters, digits, - . _ ~ + / and a
 * trailing =): HTTP clients send a token with "!" or "$" as it is and it matches, and a password
 * manager makes such tokens; refusing them would stop a node that used one at its next start.
 */
export function tokenProblem(token: string): string | null {
  if (token === '') return 'it is blank';
  // The bearer header ends at the first whitespace, so such a token could never be presented.
  if (/\s/.test(token)) return 'it contains whitespace, which an "Authorization: Bearer" header cannot carry';
  // Node reads header bytes as Latin-1, the token file as UTF-8: such a token can never match.
  const foreign = token.search(/[^\x21-\x7e]/);
  if (foreign >= 0) {
    return `character ${foreign + 1} of it is not printable ASCII, so it can never match: HTTP reads header bytes as Latin-1, not as the UTF-8 of the file. Use a token of letters and digits (openssl rand -hex 32)`;
  }
  // Shapes a random token almost never has, and a hand-edited Secret often does: kept, the quotes or
  // the name would be part of the token, and every caller would be refused.
  if (/^(["']).+\1$/.test(token)) return 'it is wrapped in quotes, which would be part of the token: write the token without them';
  if (/^\w*token\w*=/i.test(token)) return 'it looks like an assignment (NAME=token): put only the token there, without the name and "="';
  if (token.length < 16) return `it is ${token.length} characters long, and a token needs at least 16`;
  if (PLACEHOLDER.test(token)) {
    return 'it is the placeholder of the example Secret (deploy/kubernetes/secret.example.yaml), which anyone can read. Put a random token in the Secret instead: kubectl -n nodecompute create secret generic nodecompute-token --from-literal=token="$(openssl rand -hex 32)"';
  }
  return null;
}

export type TokenFileContent = { tokens: string[]; problem: null } | { tokens: null; problem: string };

/**
 * The tokens of a token file: one a line; blank lines, lines starting with "#" (comments, such as
 * who rotated it when) and whitespace around a token are ignored. So a token kept in a file cannot
 * start with "#": such a line is a comment (the README says so).
 */
export function parseTokenFile(text: string): TokenFileContent {
  const tokens: string[] = [];
  const lines = text.split('\n');
  for (const [index, line] of lines.entries()) {
    const token = line.trim();
    if (token === '' || token.startsWith('#')) continue;
    const problem = tokenProblem(token);
    if (problem !== null) return { tokens: null, problem: `the token on line ${index + 1} cannot work: ${problem}` };
    if (!tokens.includes(token)) tokens.push(token);
  }
  if (tokens.length === 0) return { tokens: null, problem: 'it holds no token (it is empty, blank or only comments)' };
  return { tokens, problem: null };
}

/**
 * What is said of a token file this process may not read (EACCES, EPERM): the setting is right, the
 * file's mode or owner is not, so it names the user the service runs as and the file's owner and
 * mode (`file`, when its stat worked; else a directory on the way to it is what is closed). Null for
 * another failure.
 */
export function unreadableTokenFile(path: string, err: Error, file: FileOwner | null): string | null {
  const code = (err as NodeJS.ErrnoException).code;
  if (code !== 'EACCES' && code !== 'EPERM') return null;
  /* c8 ignore next -- process.getuid exists on every POSIX system; nodecompute reads /proc, so it runs on Linux. */
  const user = process.getuid ? `uid ${process.getuid()}, gid ${process.getgid!()}, groups ${process.getgroups!().join(',')}` : 'this user';
  const whose =
    file === null
      ? 'a directory on the way to it does not let that user through'
      : `it is owned by uid ${file.uid}, gid ${file.gid}, with mode 0${file.mode.toString(8)}, which does not let that user read it`;
  return (
    `The token file ${path} cannot be read by nodecompute (${code}): nodecompute runs as ${user}, and ${whose}. ` +
    'Make it readable to that user: in Kubernetes, the Secret volume\'s defaultMode (0440) with the pod\'s fsGroup set to the group the service runs as; ' +
    'with Docker or systemd, chown the file (or its directory) to that uid, or chmod it'
  );
}

/** Unstable reads at start before giving up: one is a rewrite caught in the act, the next reads the finished file. */
const START_LOOKS = 3;
const START_LOOK_PAUSE_MS = 100;

/**
 * The config with the tokens of its token file (`token` and `fileTokens`), read once through the
 * reader auth.ts uses while running: asynchronously, within `timeoutMs` (TOKEN_FILE_START_TIMEOUT_MS),
 * taking only a content that was stable while read. The config as it is without a token file.
 * Throws ConfigInvalidError saying which file, what happened and what to do: it cannot be read, holds
 * no usable token, keeps changing while read, or does not answer in time (a hung mount). In the last
 * case the read stays pending (it cannot be cancelled) and is listed in stuck-io.ts.
 */
export async function readStartTokens(config: Config, options: TokenFileReaderOptions = {}): Promise<Config> {
  const path = config.tokenFile;
  if (path === null) return config;
  const timeoutMs = options.timeoutMs ?? TOKEN_FILE_START_TIMEOUT_MS;
  const reader = createTokenFileReader(path, { ...options, timeoutMs });
  let look = await reader.look();
  for (let looks = 1; look.kind === 'unstable' && looks < START_LOOKS; looks += 1) {
    await new Promise((resolve) => setTimeout(resolve, START_LOOK_PAUSE_MS));
    look = await reader.look();
  }
  if (look.kind === 'read') {
    const content = parseTokenFile(look.text);
    if (content.problem !== null) invalid(SETTINGS.tokenFile, path, content.problem);
    return { ...config, token: content.tokens[0]!, fileTokens: content.tokens };
  }
  if (look.kind === 'failed') {
    // The setting is right; the file's mode or owner is not.
    const denied = unreadableTokenFile(path, look.err, look.file);
    if (denied !== null) throw new ConfigInvalidError(`${denied}, then start again.`);
    invalid(SETTINGS.tokenFile, path, `cannot read it: ${look.err.message}`);
  }
  if (look.kind === 'unstable') {
    invalid(
      SETTINGS.tokenFile,
      path,
      `it was not stable while it was read, ${START_LOOKS} times in a row (${look.detail}): it is not a regular file (a pipe, a /proc or /sys file), or something keeps rewriting it in place. ` +
        'Point it at a regular file that is replaced with a rename (write a temporary file beside it, then rename it over the token file, as the kubelet does for a Secret)',
    );
  }
  // Late: a fresh reader never answers "unchanged".
  throw new ConfigInvalidError(
    `The token file ${path} (NODECOMPUTE_TOKEN_FILE, --token-file) did not answer within ${timeoutMs} ms, and its read is still pending: ` +
      'the filesystem that holds it likely hangs (a network or FUSE mount that stopped answering), or it is a pipe nobody writes to. ' +
      `nodecompute does not start without the write tokens it names. Check that filesystem (does \`cat ${path}\` return?), ` +
      'or mount the token from a Kubernetes Secret (a tmpfs, which does not hang), then start again.',
  );
}

function fixedToken(raw: string): string {
  // Surrounding whitespace (a Secret created with `echo`) could never be sent in a header either.
  const token = raw.trim();
  const problem = tokenProblem(token);
  if (problem !== null) invalid(SETTINGS.token, raw, problem);
  return token;
}

/** Kubernetes gives up on a probe after timeoutSeconds, 1 s unless the manifest says otherwise. */
const KUBERNETES_PROBE_TIMEOUT_MS = 1000;

function checkCombinations(config: Config): string[] {
  if (config.maxStaleMs < config.cacheTtlMs) {
    invalid(
      SETTINGS.maxStaleMs,
      config.maxStaleMs,
      `it is below NODECOMPUTE_CACHE_TTL_MS (${config.cacheTtlMs}): a snapshot only turns stale once it is older than the TTL, so stale answers could never be served. ` +
        `Set NODECOMPUTE_MAX_STALE_MS to at least ${config.cacheTtlMs} (the default is ${SETTINGS.maxStaleMs.default}), or lower NODECOMPUTE_CACHE_TTL_MS`,
      null,
    );
  }
  const warnings: string[] = [];
  if (config.probeWaitMs > KUBERNETES_PROBE_TIMEOUT_MS) {
    warnings.push(
      `NODECOMPUTE_PROBE_WAIT_MS is ${config.probeWaitMs} ms, longer than Kubernetes' default probe timeout of 1 s: a probe that waits that long is counted as failed before it is answered. ` +
        `Raise the probes' timeoutSeconds to at least ${Math.ceil((config.probeWaitMs + 500) / 1000)} (readiness, liveness and the shards' probes on /shards/:id/ready), or lower NODECOMPUTE_PROBE_WAIT_MS below 1000.`,
    );
  }
  return warnings;
}

export interface ResolvedCli {
  config: Config;
  /** Arguments that are not settings: the sub-command and --help/--version. */
  positionals: string[];
  help: boolean;
  version: boolean;
  /** Settings that are accepted but will likely hurt: main.ts logs each once its logger exists. */
  warnings: string[];
  /**
   * True when neither NODECOMPUTE_HOST nor --host was given: the host is then the default ::, which
   * main.ts replaces with 0.0.0.0 where the kernel has no IPv6 (listen.ts). A host that was given
   * is used as given, even when it is ::.
   */
  defaultHost: boolean;
}

/** Every flag: one per setting, then --help (-h) and --version (-v). */
const FLAGS = {
  ...(Object.fromEntries(Object.values(SETTINGS).map((setting) => [setting.flag, { type: 'string' as const }])) as Record<string, { type: 'string' }>),
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean', short: 'v' },
} as const;

/** Edit distance with adjacent transpositions counted as one edit ("prot" is one edit from "port"). */
function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i += 1) {
    for (let j = 1; j <= b.length; j += 1) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, d[i - 2]![j - 2]! + 1);
      d[i]![j] = best;
    }
  }
  return d[a.length]![b.length]!;
}

/**
 * The candidate a mistyped word most likely meant: the same word in another spelling (case, `_` for
 * `-`, the NODECOMPUTE_ prefix of the variable), the one candidate it names without its first words
 * (ttl-ms for cache-ttl-ms), or the nearest within two edits; null when none is that near.
 */
export function nearestWord(typed: string, candidates: readonly string[]): string | null {
  const word = typed.toLowerCase().replace(/^nodecompute[-_]/, '').replace(/_/g, '-');
  // The unit left out (cache-ttl for cache-ttl-ms) is three edits away, yet the likeliest meaning.
  const withUnit = candidates.find((candidate) => candidate === `${word}-ms`);
  if (withUnit !== undefined) return withUnit;
  // So is a name cut short at the front (TTL_MS, GRACE_MS), when only one candidate ends that way.
  const endingSo = candidates.filter((candidate) => candidate.endsWith(`-${word}`) || candidate.endsWith(`-${word}-ms`));
  if (endingSo.length === 1) return endingSo[0]!;
  let best: { candidate: string; distance: number } | null = null;
  for (const candidate of candidates) {
    const distance = editDistance(word, candidate);
    if (distance <= 2 && distance < candidate.length / 2 && (best === null || distance < best.distance)) best = { candidate, distance };
  }
  return best?.candidate ?? null;
}

/**
 * Says which argument is not a flag of nodecompute, and the flag it likely meant. parseArgs' own
 * message is about passing positionals after `--`, which a mistyped flag never needs.
 */
function unknownFlag(argv: string[]): string | null {
  const { tokens } = parseArgs({ args: argv, options: FLAGS, allowPositionals: true, strict: false, tokens: true });
  const unknown = tokens.find((token) => token.kind === 'option' && !Object.hasOwn(FLAGS, token.name));
  if (unknown === undefined) return null;
  // -port is read as the short flags -p -o -r -t: name the argument as it was typed.
  const typed = argv[unknown.index]!.split('=')[0]!;
  const word = typed.replace(/^-+/, '');
  const guess = word.length > 1 ? nearestWord(word, Object.keys(FLAGS)) : null;
  return (
    `unknown flag ${typed}${guess === null ? '' : ` (did you mean --${guess}?)`}. ` +
    'Run `nodecompute --help` for the flags and the environment variable of each.'
  );
}

/** A warning for each NODECOMPUTE_ variable that is no setting (a typo is silently a default otherwise). */
function unknownVariables(env: NodeJS.ProcessEnv): string[] {
  const settings = Object.values(SETTINGS) as Setting[];
  const known = new Set(settings.map((setting) => setting.env));
  return Object.keys(env)
    .filter((name) => name.startsWith('NODECOMPUTE_') && !known.has(name) && !SERVICE_LINK_VARIABLE.test(name))
    .sort()
    .map((name) => {
      const guess = nearestWord(name, settings.map((setting) => setting.flag));
      const meant = settings.find((setting) => setting.flag === guess);
      return (
        `The environment variable ${name} is not a setting of nodecompute and is ignored${meant === undefined ? '' : ` (did you mean ${meant.env}?)`}. ` +
        'Run `nodecompute --help` for the settings and the variable of each.'
      );
    });
}

/**
 * Reads argv flags over environment variables over defaults; throws ConfigInvalidError. Reads no
 * file: the tokens of a token file are readStartTokens's.
 */
export function resolveConfig(env: NodeJS.ProcessEnv, argv: string[]): ResolvedCli {
  const unknown = unknownFlag(argv);
  if (unknown !== null) throw new ConfigInvalidError(unknown);
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: FLAGS, allowPositionals: true, strict: true });
  } catch (err) {
    // What is left is a flag without its value, or --help/--version given one.
    throw new ConfigInvalidError(`${(err as Error).message}. Run \`nodecompute --help\` for the settings.`, {
      cause: err,
    });
  }
  const values = parsed.values as Record<string, string | boolean | undefined>;
  const config: Record<string, unknown> = {};
  const given = new Set<SettingKey>();
  for (const [key, setting] of Object.entries(SETTINGS) as [SettingKey, Setting][]) {
    const fromFlag = values[setting.flag];
    const fromEnv = env[setting.env];
    const value = typeof fromFlag === 'string' ? fromFlag : fromEnv !== undefined && fromEnv !== '' ? fromEnv : undefined;
    if (value !== undefined) given.add(key);
    config[key] = validate(setting, value ?? setting.default);
  }
  const resolved = config as unknown as Config;
  resolved.fileTokens = [];
  if (resolved.tokenFile !== null) {
    if (resolved.token !== null) {
      invalid(SETTINGS.tokenFile, resolved.tokenFile, 'NODECOMPUTE_TOKEN is set too; set only one of them');
    }
  } else if (resolved.token !== null) {
    resolved.token = fixedToken(resolved.token);
  }
  const warnings = [...unknownVariables(env), ...checkCombinations(resolved)];
  return {
    config: resolved,
    positionals: parsed.positionals,
    help: values.help === true,
    version: values.version === true,
    warnings,
    defaultHost: !given.has('host'),
  };
}

/** The settings part of `nodecompute --help`. */
export function settingsHelp(): string {
  const rows = Object.values(SETTINGS).map((setting: Setting) => {
    const dflt = setting.default === null ? '(unset)' : String(setting.default);
    return `  --${setting.flag} <value>\n      ${setting.env} (default: ${dflt})\n      ${setting.description}\n      Accepts ${setting.accepts}.`;
  });
  return rows.join('\n');
}
