// The service's configuration: resolveConfig checks env + argv against settings.ts without I/O; a
// bad value stops the start naming the setting and what it accepts, a risky one is a warning.
// readStartTokens reads the token file within a bound, by the same rules auth.ts keeps while running.
import { parseArgs } from 'node:util';
import type { Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import damerauLevenshtein from 'damerau-levenshtein';
import { ConfigInvalidError } from './errors.js';
import { hostnameOf } from './http/write-guard.js';
import { SETTINGS, TOKEN_FILE_START_TIMEOUT_MS, type Setting } from './settings.js';
import { createTokenFileReader, type FileOwner, type TokenFileReaderOptions } from './system/token-file.js';

export { SETTINGS, TOKEN_FILE_START_TIMEOUT_MS };

type SettingKey = keyof typeof SETTINGS;

/**
 * Each setting as validated. token: NODECOMPUTE_TOKEN, or the token file's first token (set by
 * readStartTokens); null: writes from loopback only. allowedHosts: names a loopback write may give
 * besides loopback's own (lower-case, no port). fileTokens: every token the token file held at
 * start (auth.ts re-reads the file).
 */
export type Config = { [K in Exclude<SettingKey, 'allowedHosts'>]: Static<(typeof SETTINGS)[K]['schema']> } & {
  allowedHosts: string[];
  fileTokens: string[];
};

/** Every setting at its default: the base that tests and the demo override. */
export function defaultConfig(overrides: Partial<Config> = {}): Config {
  const base = Object.fromEntries(Object.entries(SETTINGS).map(([key, setting]) => [key, setting.default])) as unknown as Config;
  return { ...base, fileTokens: [], allowedHosts: [], ...overrides };
}

/** A refused token as named in a message (which reaches a log store): its length, never its value. */
function describeSecret(raw: unknown): string {
  const text = String(raw);
  const secret = text.trim();
  if (text === '') return 'an empty value';
  if (secret === '') return 'only whitespace';
  return `a secret of ${secret.length} characters, not shown`;
}

/** Refuses a setting's value; `accepts` null when only its combination with another setting is wrong. */
function invalid(setting: Setting, raw: unknown, why?: string, accepts: string | null = setting.accepts): never {
  const got = setting === SETTINGS.token ? describeSecret(raw) : JSON.stringify(raw);
  throw new ConfigInvalidError(
    `Invalid setting ${setting.env} (--${setting.flag}): got ${got}${why ? ` (${why})` : ''}` +
      `${accepts === null ? '.' : `; it accepts ${accepts}.`} Fix the environment variable or flag and start again.`,
  );
}

// What Kubernetes service links and Docker's legacy links set for a Service named nodecompute[-<name>]:
// not mistyped settings. Only NODECOMPUTE_PORT is also a setting.
const SERVICE_LINK_VARIABLE = /^NODECOMPUTE_([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$/;
const SERVICE_LINK_PORT = /^(tcp|udp|sctp):\/\//;

const SERVICE_LINK_PORT_WHY =
  "a service link that Kubernetes (a Service named nodecompute) or Docker sets: set enableServiceLinks: false in the pod spec (as " +
  "deploy/kubernetes/daemonset.yaml does), or NODECOMPUTE_PORT in the container's env";

function validate(setting: Setting, raw: string | number | null): unknown {
  let value: unknown = raw;
  if (setting.schema.type === 'integer' && typeof raw === 'string') {
    if (setting === SETTINGS.port && SERVICE_LINK_PORT.test(raw.trim())) invalid(setting, raw, SERVICE_LINK_PORT_WHY);
    if (!/^-?\d+$/.test(raw.trim())) invalid(setting, raw, 'not an integer');
    value = Number(raw.trim());
  }
  if (!Value.Check(setting.schema, value)) invalid(setting, raw);
  return value;
}

/** Why `token` (trimmed) can never authorise a write, or null; never says the token. Any printable ASCII is taken. */
export function tokenProblem(token: string): string | null {
  if (token === '') return 'it is blank';
  // The bearer header ends at the first whitespace, so such a token could never be presented.
  if (/\s/.test(token)) return 'it contains whitespace, which an "Authorization: Bearer" header cannot carry';
  // Node reads header bytes as Latin-1, the token file as UTF-8: such a token can never match.
  const foreign = token.search(/[^\x21-\x7e]/);
  if (foreign >= 0) return `character ${foreign + 1} is not printable ASCII, so it never matches a header: use letters and digits (openssl rand -hex 32)`;
  // Shapes a hand-edited Secret often has and a random token almost never does.
  if (/^(["']).+\1$/.test(token)) return 'it is wrapped in quotes, which would be part of the token: remove them';
  if (/^\w*token\w*=/i.test(token)) return 'it looks like an assignment (NAME=token): write only the token';
  if (token.length < 16) return `it is ${token.length} characters long, and a token needs at least 16`;
  if (/^REPLACE-ME/i.test(token)) {
    return 'it is the public placeholder of deploy/kubernetes/secret.example.yaml. Put a random token in the Secret: ' +
      'kubectl -n nodecompute create secret generic nodecompute-token --from-literal=token="$(openssl rand -hex 32)"';
  }
  return null;
}

/** One token a line; blank lines, "#" comment lines and whitespace around a token are ignored. */
export function parseTokenFile(text: string) {
  const tokens: string[] = [];
  for (const [index, line] of text.split('\n').entries()) {
    const token = line.trim();
    if (token === '' || token.startsWith('#')) continue;
    const problem = tokenProblem(token);
    if (problem !== null) return { tokens: null, problem: `the token on line ${index + 1} cannot work: ${problem}` };
    if (!tokens.includes(token)) tokens.push(token);
  }
  if (tokens.length === 0) return { tokens: null, problem: 'it holds no token (it is empty, blank or only comments)' };
  return { tokens, problem: null };
}

/** The message for a token file this process may not read (EACCES, EPERM; `file` null: a closed directory); null for other errors. */
export function unreadableTokenFile(path: string, err: Error, file: FileOwner | null): string | null {
  const code = (err as NodeJS.ErrnoException).code;
  if (code !== 'EACCES' && code !== 'EPERM') return null;
  /* c8 ignore next -- process.getuid exists on every POSIX system; nodecompute reads /proc, so it runs on Linux. */
  const user = process.getuid ? `uid ${process.getuid()}, gid ${process.getgid!()}, groups ${process.getgroups!().join(',')}` : 'this user';
  const whose = file === null ? 'a directory on the way to it is closed' : `it is owned by uid ${file.uid}, gid ${file.gid}, mode 0${file.mode.toString(8)}`;
  return `The token file ${path} is unreadable (${code}) to nodecompute, which runs as ${user}; ${whose}. Make it readable: in Kubernetes, ` +
    "the Secret volume's defaultMode (0440) and the pod's fsGroup set to the service's group; with Docker or systemd, chown or chmod it or its directory";
}

/** Unstable reads at start before giving up: one is a rewrite caught in the act. */
const START_LOOKS = 3;
const START_LOOK_PAUSE_MS = 100;

/** The config with its token file's tokens, read within the start timeout; throws ConfigInvalidError when it is unreadable, unusable, unstable or late. */
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
    const why = `it was not stable while it was read, ${START_LOOKS} times in a row (${look.detail}): not a regular file, or rewritten in place. ` +
      'Point it at a regular file replaced by a rename, as the kubelet does for a Secret';
    invalid(SETTINGS.tokenFile, path, why);
  }
  // Late (a fresh reader never answers "unchanged"): the read is left pending, its timer unref'd.
  throw new ConfigInvalidError(
    `The token file ${path} (NODECOMPUTE_TOKEN_FILE) did not answer within ${timeoutMs} ms: a hung network or FUSE mount, or a pipe nobody writes to. ` +
      `Check that \`cat ${path}\` returns, or mount the token from a Kubernetes Secret (tmpfs), then start again.`,
  );
}

/** Kubernetes gives up on a probe after timeoutSeconds, 1 s unless the manifest says otherwise. */
const KUBERNETES_PROBE_TIMEOUT_MS = 1000;

function checkCombinations(config: Config): string[] {
  if (config.maxStaleMs < config.cacheTtlMs) {
    const why = `below NODECOMPUTE_CACHE_TTL_MS (${config.cacheTtlMs}), so no stale answer could be served: set it to at least ${config.cacheTtlMs} ` +
      `(default ${SETTINGS.maxStaleMs.default}), or lower NODECOMPUTE_CACHE_TTL_MS`;
    invalid(SETTINGS.maxStaleMs, config.maxStaleMs, why, null);
  }
  if (config.probeWaitMs <= KUBERNETES_PROBE_TIMEOUT_MS) return [];
  const seconds = Math.ceil((config.probeWaitMs + 500) / 1000);
  return [
    `NODECOMPUTE_PROBE_WAIT_MS is ${config.probeWaitMs} ms, past Kubernetes' default probe timeout of 1 s: raise the probes' timeoutSeconds ` +
      `(readiness, liveness, /shards/:id/ready) to at least ${seconds}, or lower it below 1000.`,
  ];
}

/**
 * positionals: the arguments that are not settings (the sub-command); warnings: settings accepted but likely to hurt, which main.ts
 * logs once its logger exists; defaultHost: no host was given, so main.ts may fall back to 0.0.0.0 where the kernel has no IPv6.
 */
export type ResolvedCli = { config: Config; positionals: string[]; help: boolean; version: boolean; warnings: string[]; defaultHost: boolean };

/** Every flag: one per setting, then --help (-h) and --version (-v). */
const FLAGS = {
  ...(Object.fromEntries(Object.values(SETTINGS).map((setting) => [setting.flag, { type: 'string' as const }])) as Record<string, { type: 'string' }>),
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean', short: 'v' },
} as const;

/** The candidate a mistyped word most likely meant (any case, `_` for `-`, with or without NODECOMPUTE_); null when none is near. */
export function nearestWord(typed: string, candidates: readonly string[]): string | null {
  const word = typed.toLowerCase().replace(/^nodecompute[-_]/, '').replace(/_/g, '-');
  // The unit left out (cache-ttl for cache-ttl-ms) is three edits away, yet the likeliest meaning.
  const withUnit = candidates.find((candidate) => candidate === `${word}-ms`);
  if (withUnit !== undefined) return withUnit;
  // So is a name cut short at the front (TTL_MS, GRACE_MS), when only one candidate ends that way.
  const endingSo = candidates.filter((candidate) => candidate.endsWith(`-${word}`) || candidate.endsWith(`-${word}-ms`));
  if (endingSo.length === 1) return endingSo[0]!;
  const near = candidates
    .map((candidate) => ({ candidate, distance: damerauLevenshtein(word, candidate).steps })) // a swap is one edit
    .filter(({ candidate, distance }) => distance <= 2 && distance < candidate.length / 2)
    .sort((a, b) => a.distance - b.distance);
  return near[0]?.candidate ?? null;
}

/** Names the unknown flag and the one it likely meant (parseArgs' own message is about `--`). */
function unknownFlag(argv: string[]): string | null {
  const { tokens } = parseArgs({ args: argv, options: FLAGS, allowPositionals: true, strict: false, tokens: true });
  const unknown = tokens.find((token) => token.kind === 'option' && !Object.hasOwn(FLAGS, token.name));
  if (unknown === undefined) return null;
  // -port is read as the short flags -p -o -r -t: name the argument as it was typed.
  const typed = argv[unknown.index]!.split('=')[0]!;
  const word = typed.replace(/^-+/, '');
  const guess = word.length > 1 ? nearestWord(word, Object.keys(FLAGS)) : null;
  const meant = guess === null ? '' : ` (did you mean --${guess}?)`;
  return `unknown flag ${typed}${meant}. Run \`nodecompute --help\` for the flags and the environment variable of each.`;
}

/** A warning for each NODECOMPUTE_ variable that is no setting (a typo is silently a default otherwise). */
function unknownVariables(env: NodeJS.ProcessEnv): string[] {
  const settings = Object.values(SETTINGS) as Setting[];
  const known = new Set(settings.map((setting) => setting.env));
  return Object.keys(env)
    .filter((name) => name.startsWith('NODECOMPUTE_') && !known.has(name) && !SERVICE_LINK_VARIABLE.test(name))
    .sort()
    .map((name) => {
      const meant = settings.find((setting) => setting.flag === nearestWord(name, settings.map(({ flag }) => flag)));
      const guess = meant === undefined ? '' : ` (did you mean ${meant.env}?)`;
      return `${name} is not a setting of nodecompute and is ignored${guess}. Run \`nodecompute --help\` for the settings.`;
    });
}

/** Flags over environment variables over defaults; throws ConfigInvalidError. Reads no file. */
export function resolveConfig(env: NodeJS.ProcessEnv, argv: string[]): ResolvedCli {
  const unknown = unknownFlag(argv);
  if (unknown !== null) throw new ConfigInvalidError(unknown);
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: FLAGS, allowPositionals: true, strict: true });
  } catch (err) {
    // What is left is a flag without its value, or --help/--version given one.
    throw new ConfigInvalidError(`${(err as Error).message}. Run \`nodecompute --help\` for the settings.`, { cause: err });
  }
  const values = parsed.values as Record<string, string | boolean | undefined>;
  // A flag wins over its variable; an empty variable is unset.
  const given = (setting: Setting): string | undefined => {
    const fromFlag = values[setting.flag];
    return typeof fromFlag === 'string' ? fromFlag : env[setting.env] || undefined;
  };
  const config = Object.fromEntries(
    Object.entries(SETTINGS).map(([key, setting]) => [key, validate(setting, given(setting) ?? setting.default)]),
  );
  const resolved = config as unknown as Config;
  resolved.allowedHosts = ((config.allowedHosts as string | null) ?? '').split(',').map((name) => hostnameOf(name)).filter((name) => name !== '');
  resolved.fileTokens = [];
  if (resolved.tokenFile !== null && resolved.token !== null) {
    invalid(SETTINGS.tokenFile, resolved.tokenFile, 'NODECOMPUTE_TOKEN is set too; set only one of them');
  }
  if (resolved.tokenFile === null && resolved.token !== null) {
    // Whitespace around it (a Secret made with `echo`) could never be sent in a header either.
    const problem = tokenProblem(resolved.token.trim());
    if (problem !== null) invalid(SETTINGS.token, resolved.token, problem);
    resolved.token = resolved.token.trim();
  }
  const warnings = [...unknownVariables(env), ...checkCombinations(resolved)];
  const [help, version] = [values.help === true, values.version === true];
  const defaultHost = given(SETTINGS.host) === undefined;
  return { config: resolved, positionals: parsed.positionals, help, version, warnings, defaultHost };
}

export function settingsHelp(): string {
  return Object.values(SETTINGS).map((setting: Setting) => {
    const dflt = setting.default === null ? '(unset)' : String(setting.default);
    return `  --${setting.flag} <value>\n      ${setting.env} (default: ${dflt})\n      ${setting.description}\n      Accepts ${setting.accepts}.`;
  }).join('\n');
}
