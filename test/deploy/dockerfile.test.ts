// Owns the checks of the Dockerfile and .dockerignore, since `docker build` cannot run in CI: the
// text is parsed and held against what the service relies on (its settings table, its default
// port, its state file, its routes, the build's output path), and the HEALTHCHECK command itself
// is run against a live app.
import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join, posix } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';
import { resolveConfig, SETTINGS } from '../../src/config.js';
import { buildTestApp } from '../helpers/app.js';
import { eightGpuNode } from '../helpers/fake-nvidia-smi.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const run = promisify(execFile);

interface Instruction {
  keyword: string;
  args: string;
  line: number;
}

interface Stage {
  from: string;
  name: string | null;
  instructions: Instruction[];
}

/** Instructions by stage, with line continuations joined and comments (parser directives too) dropped. */
function parseDockerfile(text: string): { globalArgs: Map<string, string>; stages: Stage[] } {
  const globalArgs = new Map<string, string>();
  const stages: Stage[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i += 1) {
    const start = i;
    if (/^\s*(#|$)/.test(lines[i] as string)) continue;
    let joined = (lines[i] as string).trimEnd();
    while (joined.endsWith('\\') && i + 1 < lines.length) {
      i += 1;
      const next = lines[i] as string;
      joined = joined.slice(0, -1) + (/^\s*#/.test(next) ? '' : ` ${next.trim()}`);
      joined = joined.trimEnd();
    }
    const match = /^\s*([A-Za-z]+)\s+(.*)$/.exec(joined);
    if (!match) throw new Error(`Dockerfile line ${start + 1} is not an instruction: ${joined}`);
    const keyword = (match[1] as string).toUpperCase();
    const args = (match[2] as string).trim();
    if (keyword === 'FROM') {
      const from = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      if (!from) throw new Error(`Dockerfile line ${start + 1}: cannot read FROM ${args}`);
      stages.push({ from: from[1] as string, name: from[2] ?? null, instructions: [] });
    } else if (stages.length === 0) {
      if (keyword !== 'ARG') throw new Error(`Dockerfile line ${start + 1}: only ARG may come before FROM`);
      const [name, value = ''] = args.split('=');
      globalArgs.set(name as string, value);
    } else {
      (stages.at(-1) as Stage).instructions.push({ keyword, args, line: start + 1 });
    }
  }
  return { globalArgs, stages };
}

/** KEY=VALUE pairs of ENV, LABEL or ARG, values unquoted. */
function pairs(args: string): Map<string, string> {
  const found = new Map<string, string>();
  for (const match of args.matchAll(/([A-Za-z_][A-Za-z0-9_.-]*)=("(?:[^"\\]|\\.)*"|'[^']*'|\S+)/g)) {
    const raw = match[2] as string;
    found.set(match[1] as string, /^["']/.test(raw) ? raw.slice(1, -1).replace(/\\(.)/g, '$1') : raw);
  }
  return found;
}

function all(stage: Stage, keyword: string): Instruction[] {
  return stage.instructions.filter((instruction) => instruction.keyword === keyword);
}

function one(stage: Stage, keyword: string): Instruction {
  const found = all(stage, keyword);
  if (found.length !== 1) throw new Error(`expected one ${keyword} in the runtime stage, found ${found.length}`);
  return found[0] as Instruction;
}

function execForm(args: string): string[] {
  const parsed: unknown = JSON.parse(args);
  if (!Array.isArray(parsed) || !parsed.every((item) => typeof item === 'string')) throw new Error(`not an exec form: ${args}`);
  return parsed;
}

const dockerfile = parseDockerfile(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'));
const build = dockerfile.stages[0] as Stage;
const runtime = dockerfile.stages.at(-1) as Stage;
const env = new Map(all(runtime, 'ENV').flatMap((instruction) => [...pairs(instruction.args)]));
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
  license: string;
  engines: { node: string };
  bin: Record<string, string>;
};

t.test('multi-stage, both stages on a glibc slim Node LTS', async (t) => {
  t.ok(dockerfile.stages.length >= 2, 'a build stage and a runtime stage');
  t.equal(build.name, 'build');
  t.not(runtime, build);
  const image = dockerfile.globalArgs.get('NODE_IMAGE');
  const match = /^node:(\d+)-(bookworm|trixie)-slim$/.exec(image ?? '');
  t.ok(match, `NODE_IMAGE ${image} is a Debian (glibc) slim Node image: the NVIDIA runtime injects a glibc nvidia-smi`);
  const major = Number(match?.[1]);
  t.equal(major % 2, 0, `Node ${major} is an LTS line (even)`);
  t.ok(major >= Number(/\d+/.exec(pkg.engines.node)?.[0]), `Node ${major} satisfies engines.node ${pkg.engines.node}`);
  for (const stage of dockerfile.stages) t.equal(stage.from, '${NODE_IMAGE}', `stage ${stage.name} is FROM the NODE_IMAGE argument`);
});

t.test('the build stage installs everything and compiles', async (t) => {
  const runs = all(build, 'RUN').map((instruction) => instruction.args);
  const copies = all(build, 'COPY').map((instruction) => instruction.args);
  t.ok(runs.some((command) => /\bnpm ci\b/.test(command) && !/--omit=dev/.test(command)), 'npm ci with dev dependencies (tsc)');
  t.ok(runs.some((command) => /\bnpm run build\b/.test(command)), 'npm run build');
  t.match(copies[0], /^package\.json package-lock\.json /, 'the lockfile is copied before the sources, so npm ci stays cached');
});

t.test('the runtime stage has production dependencies and dist/ only', async (t) => {
  const runs = all(runtime, 'RUN').map((instruction) => instruction.args);
  const install = runs.find((command) => /\bnpm ci\b/.test(command));
  t.match(install, /--omit=dev/, 'npm ci --omit=dev');
  t.match(install, /--ignore-scripts/, 'npm ci --ignore-scripts');
  t.notOk(runs.some((command) => /\bnpm (run build|install|i)\b/.test(command)), 'nothing is built or installed otherwise');
  const fromBuild = all(runtime, 'COPY').filter((instruction) => /--from=/.test(instruction.args));
  t.ok(fromBuild.length > 0, 'copies from the build stage');
  for (const copy of fromBuild) {
    t.notMatch(copy.args, /node_modules/, `line ${copy.line} does not copy node_modules (with dev dependencies) from the build`);
    t.match(copy.args, /^--from=build \/app\/dist(\/\S*)? \.\/dist(\/\S*)?$/, `line ${copy.line} copies build output only`);
  }
});

t.test('runs as a numeric non-root user that owns the state volume', async (t) => {
  const user = one(runtime, 'USER').args;
  const match = /^(\d+)(?::(\d+))?$/.exec(user);
  t.ok(match, `USER ${user} is numeric, so Kubernetes' runAsNonRoot can verify it`);
  const uid = Number(match?.[1]);
  t.not(uid, 0, 'not root');
  t.not(uid, 1000, "not the node image's user 1000, often a real user on the host");
  const volume = one(runtime, 'VOLUME').args;
  const runs = all(runtime, 'RUN').map((instruction) => instruction.args).join('\n');
  t.match(runs, new RegExp(`chown ${uid}(:\\d+)? ${volume}(\\s|$)`), `the state directory ${volume} is chowned to ${uid}`);
  const userLine = one(runtime, 'USER').line;
  t.ok(all(runtime, 'RUN').every((instruction) => instruction.line < userLine), 'USER comes after every RUN that needs root');
});

t.test('ENV names are settings of the service, and their values are accepted', async (t) => {
  const known = new Set<string>(Object.values(SETTINGS).map((setting) => setting.env));
  const ours = [...env.keys()].filter((name) => name.startsWith('NODECOMPUTE_'));
  t.ok(ours.length > 0);
  for (const name of ours) t.ok(known.has(name), `${name} is in SETTINGS`);
  t.equal(env.get('NVIDIA_VISIBLE_DEVICES'), 'all');
  t.match(env.get('NVIDIA_DRIVER_CAPABILITIES'), /(^|,)(utility|all)(,|$)/, 'utility: the runtime mounts nvidia-smi');
  const { config } = resolveConfig(Object.fromEntries(env), ['serve']);
  t.equal(config.stateFile, env.get('NODECOMPUTE_STATE_FILE'));
  t.ok(isAbsolute(config.stateFile), 'the state file path is absolute (WORKDIR must not matter)');
});

t.test('NODE_OPTIONS caps the heap in the image as npm start does', async (t) => {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { config: { nodeOptions: string }; scripts: { start: string } };
  t.equal(env.get('NODE_OPTIONS'), pkg.config.nodeOptions, 'the image runs with package.json config.nodeOptions');
  t.match(pkg.config.nodeOptions, /--max-old-space-size=\d+/);
  t.match(pkg.scripts.start, /NODE_OPTIONS="\$npm_package_config_nodeOptions \$NODE_OPTIONS"/, 'npm start uses them too, the caller\'s own options last (they win)');
});

t.test('MALLOC_ARENA_MAX bounds glibc malloc\'s arenas in the image as npm start does', async (t) => {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { config: { mallocArenaMax: string }; scripts: { start: string } };
  t.equal(env.get('MALLOC_ARENA_MAX'), pkg.config.mallocArenaMax, 'the image runs with package.json config.mallocArenaMax');
  t.match(pkg.config.mallocArenaMax, /^[1-9]\d*$/, 'a positive count: glibc ignores anything else');
  t.match(pkg.scripts.start, /MALLOC_ARENA_MAX="\$\{MALLOC_ARENA_MAX:-\$npm_package_config_mallocArenaMax\}"/, 'npm start sets it too, unless the caller has');
});

t.test('UV_THREADPOOL_SIZE leaves libuv threads for the state file beside stuck driver calls, in the image as npm start does', async (t) => {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { config: { uvThreadpoolSize: string }; scripts: { start: string } };
  t.equal(env.get('UV_THREADPOOL_SIZE'), pkg.config.uvThreadpoolSize, 'the image runs with package.json config.uvThreadpoolSize');
  t.ok(Number(pkg.config.uvThreadpoolSize) >= 8, 'room for 5 stuck calls (NVML queries, maps reads) and the state file');
  t.match(pkg.scripts.start, /UV_THREADPOOL_SIZE="\$\{UV_THREADPOOL_SIZE:-\$npm_package_config_uvThreadpoolSize\}"/, 'npm start sets it too, unless the caller has');
});

t.test('EXPOSE is the default port and VOLUME is the state file directory', async (t) => {
  t.equal(Number(one(runtime, 'EXPOSE').args), SETTINGS.port.default);
  t.notOk(env.has('NODECOMPUTE_PORT'), 'the port is left at its default');
  t.equal(one(runtime, 'VOLUME').args, posix.dirname(env.get('NODECOMPUTE_STATE_FILE') as string));
});

t.test('ENTRYPOINT runs the built main, CMD serves', async (t) => {
  t.same(execForm(one(runtime, 'ENTRYPOINT').args), ['node', '/app/dist/src/main.js']);
  t.equal(one(runtime, 'WORKDIR').args, '/app');
  const tsconfig = JSON.parse(readFileSync(join(ROOT, 'tsconfig.json'), 'utf8')) as { compilerOptions: { outDir: string; rootDir: string } };
  t.equal(posix.join('/app', tsconfig.compilerOptions.outDir, 'src/main.js'), '/app/dist/src/main.js', 'tsc puts src/main.ts there');
  t.ok(existsSync(join(ROOT, tsconfig.compilerOptions.rootDir, 'src/main.ts')));
  t.equal(posix.normalize(Object.values(pkg.bin)[0] as string), 'dist/src/main.js', 'the same entry as package.json bin');
  const cmd = execForm(one(runtime, 'CMD').args);
  t.same(cmd, ['serve']);
  t.same(resolveConfig({}, cmd).positionals, ['serve'], 'serve is a command, not a setting');
});

t.test('`nodecompute` is on the image\'s PATH, as package.json bin installs it, and runs (`nodecompute doctor` in the messages is true)', async (t) => {
  const [, script] = execForm(one(runtime, 'ENTRYPOINT').args) as [string, string];
  const copied = all(runtime, 'COPY').find((instruction) => /^--from=build /.test(instruction.args)) as Instruction;
  const commands = all(runtime, 'RUN')
    .filter((instruction) => instruction.line > copied.line)
    .flatMap((instruction) => instruction.args.split(/\s*&&\s*/));
  const link = commands.map((command) => /^ln -sf? (\S+) (\S+)$/.exec(command)).find(Boolean);
  t.ok(link, 'a RUN after dist/ is copied links the command');
  const [, target, bin] = link as RegExpExecArray as unknown as [string, string, string];
  t.equal(target, script, 'to the script the ENTRYPOINT runs');
  t.equal(posix.basename(bin), Object.keys(pkg.bin)[0], "named as package.json's bin");
  t.equal(posix.dirname(bin), '/usr/local/bin');
  t.notOk(env.has('PATH'), "PATH is the base image's, which has /usr/local/bin (node itself is there)");
  const chmod = commands.map((command) => /^chmod (\S+) (\S+)$/.exec(command)).find(Boolean);
  t.ok(chmod, 'the script is made executable (tsc writes 0644)');
  const [, mode, chmodded] = chmod as RegExpExecArray as unknown as [string, string, string];
  t.equal(chmodded, script);
  t.equal(Number.parseInt(mode, 8) & 0o555, 0o555, `mode ${mode} lets every user read and run it (docker exec runs as ${one(runtime, 'USER').args})`);
  const docs = ['README.md', 'deploy/kubernetes/README.md', 'Dockerfile'].map((file) => readFileSync(join(ROOT, file), 'utf8')).join('\n');
  const execs = [...docs.matchAll(/\b(?:docker|kubectl)\b[^\n`]*\bexec\b[^\n`]*? (\S+) doctor\b/g)].map((match) => match[1]);
  t.ok(execs.length >= 3, `the docs say how to run the doctor in a container: ${execs.join(', ')}`);
  for (const program of execs) t.equal(program, posix.basename(bin), 'what they exec is the command the image puts on PATH');
  const shebang = '#!/usr/bin/env node';
  t.equal(readFileSync(join(ROOT, 'src/main.ts'), 'utf8').split('\n')[0], shebang, 'src/main.ts starts with the shebang');
  t.equal(readFileSync(join(ROOT, 'dist/src/main.js'), 'utf8').split('\n')[0], shebang, 'and tsc keeps it in the build');

  // The same steps on a copy of the build laid out as the image's /app, run through PATH by name.
  const root = mkdtempSync(join(tmpdir(), 'nodecompute-image-'));
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  cpSync(join(ROOT, 'dist'), join(root, 'app/dist'), { recursive: true });
  symlinkSync(join(ROOT, 'node_modules'), join(root, 'app/node_modules'));
  mkdirSync(join(root, posix.dirname(bin)), { recursive: true });
  await run('chmod', [mode, join(root, chmodded)]);
  symlinkSync(join(root, target), join(root, bin));
  const imageEnv = {
    PATH: `${join(root, posix.dirname(bin))}:${dirname(process.execPath)}:/usr/bin:/bin`,
    NODE_OPTIONS: env.get('NODE_OPTIONS') as string,
    MALLOC_ARENA_MAX: env.get('MALLOC_ARENA_MAX') as string,
    UV_THREADPOOL_SIZE: env.get('UV_THREADPOOL_SIZE') as string,
    NODECOMPUTE_STATE_FILE: join(root, 'state', 'shards.json'),
    NODECOMPUTE_NVIDIA_SMI: join(root, 'no-nvidia-smi'),
  };
  const version = await run('sh', ['-c', 'nodecompute --version'], { env: imageEnv, timeout: 30_000 });
  t.equal(version.stdout, `${pkg.version}\n`);
  const doctor = await run('sh', ['-c', 'nodecompute doctor'], { env: imageEnv, timeout: 60_000 }).then(
    () => ({ code: 0, stdout: '' }),
    (err: { code?: number; stdout?: string }) => ({ code: err.code, stdout: err.stdout ?? '' }),
  );
  t.equal(doctor.code, 1, 'the doctor ran, and exits 1 without nvidia-smi');
  t.match(doctor.stdout, /^FAIL  nvidia-smi .*no-nvidia-smi/m);
  t.match(doctor.stdout, /nodecompute doctor: something is wrong/);
});

t.test('OCI labels', async (t) => {
  const labels = new Map(all(runtime, 'LABEL').flatMap((instruction) => [...pairs(instruction.args)]));
  t.equal(labels.get('org.opencontainers.image.title'), 'nodecompute');
  t.equal(labels.get('org.opencontainers.image.licenses'), pkg.license);
  t.equal(labels.get('org.opencontainers.image.version'), '${VERSION}', 'the version comes from --build-arg VERSION');
  t.ok(labels.get('org.opencontainers.image.description'));
  const stageArgs = all(runtime, 'ARG').map((instruction) => instruction.args.split('=')[0]);
  t.ok(stageArgs.includes('VERSION') && stageArgs.includes('NODE_IMAGE'), 'the labels\' ARGs are declared in the stage');
});

t.test('HEALTHCHECK asks /livez with node itself, and its command works', async (t) => {
  const healthcheck = one(runtime, 'HEALTHCHECK').args;
  const match = /^((?:--\S+\s+)*)CMD\s+(\[.*\])$/.exec(healthcheck);
  t.ok(match, 'options then CMD in exec form');
  const command = execForm(match?.[2] as string);
  t.equal(command[0], 'node', 'no curl or wget in a slim image');
  t.equal(command[1], '-e');
  t.match(command[2], /\/livez'/);
  t.match(command[2], new RegExp(`\\|\\|${SETTINGS.port.default}\\)`), 'falls back to the default port');
  t.match(match?.[1], /--timeout=\d+s/);

  const { app } = await buildTestApp(t, { scenario: eightGpuNode() });
  t.ok(app.hasRoute({ method: 'GET', url: '/livez' }), '/livez is a route');
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as { port: number };
  const childEnv = { PATH: process.env.PATH, NODECOMPUTE_PORT: String(port) };
  await t.resolves(run(process.execPath, command.slice(1), { env: childEnv, timeout: 20_000 }), 'exit 0 while /livez answers');
  await app.close();
  const down = await run(process.execPath, command.slice(1), { env: childEnv, timeout: 20_000 }).then(
    () => 0,
    (err: { code?: number }) => err.code,
  );
  t.equal(down, 1, 'exit 1 when nothing answers');
});

t.test('.dockerignore keeps host builds and local output out of the context', async (t) => {
  const entries = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'));
  for (const required of ['node_modules', '.git', 'dist', '.tap', 'test-artifacts', '.cache', '.smoke-pack']) {
    t.ok(entries.includes(required), `${required} is ignored`);
  }
  t.notOk(entries.some((entry) => ['package-lock.json', 'src', 'routes', 'tsconfig.json'].includes(entry)), 'the build inputs are kept');
  t.ok(existsSync(join(ROOT, 'package-lock.json')), 'npm ci has its lockfile');
});
