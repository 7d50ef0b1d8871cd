// Owns the dry run of scripts/pack-smoke.sh: the travel pack must run the GPU smoke check with
// nothing of the checkout. It is unpacked outside the checkout (so Node cannot find the checkout's
// node_modules by walking up), with python3's tarfile, the unpacker the instructions name for a
// machine without xz, and run against the fake nvidia-smi as gpu-smoke.test.ts runs the checkout's.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { createFakeNvidiaSmi } from '../helpers/fake-nvidia-smi.js';
import { CHECKS, GPU0, node, ROOT, rows, runSmoke } from '../helpers/gpu-smoke-run.js';

t.setTimeout(420_000);

const python = spawnSync('python3', ['--version'], { encoding: 'utf8' });
const noPython = python.status === 0 ? false : 'python3 is not installed here';

t.test('the travel pack (scripts/pack-smoke.sh) runs the check away from the checkout', { skip: noPython }, async (t) => {
  const away = mkdtempSync(join(tmpdir(), 'nodecompute-pack-test-'));
  t.teardown(() => rmSync(away, { recursive: true, force: true }));
  const archive = join(away, 'nodecompute-smoke.tar.xz');
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.NODE_OPTIONS;
  delete env.NODE_V8_COVERAGE;
  const pack = spawnSync('bash', [join(ROOT, 'scripts', 'pack-smoke.sh'), archive], { cwd: ROOT, env, encoding: 'utf8', timeout: 240_000 });
  t.equal(pack.status, 0, 'pack-smoke.sh exits 0', { stderr: pack.stderr });
  t.equal(pack.stdout, `${archive}\n`, 'it prints the archive it wrote');
  const unpack = spawnSync('python3', ['-m', 'tarfile', '-e', archive, away], { encoding: 'utf8', timeout: 120_000 });
  t.equal(unpack.status, 0, 'python3 -m tarfile unpacks it', { stderr: unpack.stderr });
  const packed = join(away, 'nodecompute-smoke');
  t.same(readdirSync(packed).sort(), ['dist', 'node_modules', 'package-lock.json', 'package.json', 'scripts'], 'the built service, its dependencies and the scripts');
  t.ok(existsSync(join(packed, 'node_modules', 'fastify', 'package.json')), 'with the production dependencies');
  t.notOk(existsSync(join(packed, 'node_modules', 'tap')), 'without the dev dependencies');
  t.ok(existsSync(join(packed, 'scripts', 'cuda-hold.py')), "with the CUDA process's script");
  // What --with-node adds (node/bin/node), without fetching a Node here: gpu-smoke.sh must pick it.
  mkdirSync(join(packed, 'node', 'bin'), { recursive: true });
  symlinkSync(process.execPath, join(packed, 'node', 'bin', 'node'));

  mkdirSync(join(away, 'smi'));
  const fake = createFakeNvidiaSmi(join(away, 'smi'), node());
  const run = await runSmoke(
    t,
    fake,
    ['--record', join(away, 'recorded')],
    { NODE: '' },
    (pid) =>
      fake.update((s) => {
        s.processes.push({ gpuUuid: GPU0, pid, name: 'python3', usedMiB: 1100 });
      }),
    join(packed, 'scripts', 'gpu-smoke.sh'),
  );
  const table = rows(run.stdout);
  t.equal(run.code, 0, 'exit 0', { stdout: run.stdout, stderr: run.stderr });
  t.same([...table.keys()], CHECKS, 'every check ran');
  for (const [name, row] of table) t.equal(row.result, 'PASS', `${name}: ${row.detail}`);
  t.match(run.stdout, new RegExp(`node ${packed}/node/bin/node v\\d+\\.`), "the pack's Node ran the check");
  t.equal(readdirSync(join(away, 'recorded')).length, 6, 'and recorded the queries and the doctor');
});

t.test('pack-smoke.sh refuses what it cannot write, before building anything', async (t) => {
  const pack = (...args: string[]) => spawnSync('bash', [join(ROOT, 'scripts', 'pack-smoke.sh'), ...args], { cwd: ROOT, encoding: 'utf8', timeout: 30_000 });
  const unknown = pack('--bogus');
  t.equal(unknown.status, 2, 'an unknown option is a usage error');
  t.match(unknown.stderr, /unknown option "--bogus"/);
  const zip = pack(join(t.testdirName, 'pack.zip'));
  t.equal(zip.status, 2, 'an archive name without .tar.xz is a usage error');
  t.match(zip.stderr, /"[^"]*pack\.zip" must end in \.tar\.xz/);
  const two = pack('a.tar.xz', 'b.tar.xz');
  t.equal(two.status, 2, 'two archives are a usage error');
  t.match(two.stderr, /one archive at a time/);
  t.notOk(existsSync(t.testdirName), 'nothing was written');
});
