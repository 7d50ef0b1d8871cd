// The checkout is all the tests need: no tracked file reads or cites the sample folder that once lay
// beside the checkout (shared/samples one level up, on one machine only), where a fresh clone has nothing.
// The samples the tests read are in test/fixtures/samples, read through test/helpers/samples.ts;
// that folder's INDEX.md may name where they were copied from. Skipped outside a git checkout
// (an unpacked tarball, an image without .git), where there are no tracked files to look at.
import { spawnSync } from 'node:child_process';
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const repoRoot = realpathSync(fileURLToPath(new URL('..', import.meta.url)));
const THIS_FILE = 'test/self-contained.test.ts';
const INDEX = 'test/fixtures/samples/INDEX.md';

/** The folder one level up, `shared/samples`, and the same path built from segments (join('..', 'shared', 'samples')). */
const OUTSIDE_PATTERNS = ['\\.\\./shared', 'shared/samples', `['"]\\.\\.['"] *, *['"]shared['"]`, `['"]shared['"] *, *['"]samples['"]`];

function git(...args: string[]) {
  return spawnSync('git', args, { cwd: repoRoot, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
}

function notACheckout(): string | false {
  const top = git('rev-parse', '--show-toplevel');
  if (top.error) return `git cannot be run (${top.error.message})`;
  if (top.status !== 0) return `not a git checkout (${top.stderr.trim().split('\n')[0]})`;
  const root = realpathSync(top.stdout.trim());
  return root === repoRoot ? false : `the package is not the root of its git checkout (${root})`;
}

t.test('no tracked file reads or cites the shared folder beside the checkout', { skip: notACheckout() }, async (t) => {
  const patterns = OUTSIDE_PATTERNS.flatMap((pattern) => ['-e', pattern]);
  const found = git('grep', '-n', '-I', '-E', ...patterns, '--', '.', `:(exclude)${THIS_FILE}`, `:(exclude)${INDEX}`);
  // git grep: 0 = lines found, 1 = none, anything else = it failed.
  t.ok(found.status === 0 || found.status === 1, found.stderr.trim() || 'git grep ran');
  const lines = found.stdout.split('\n').filter((line) => line !== '');
  t.same(lines, [], 'copy what a test reads into test/fixtures/samples (a row in its INDEX.md) and read it through test/helpers/samples.ts');
});

t.test('the patterns catch each way the folder was named', async (t) => {
  const matches = (text: string) => OUTSIDE_PATTERNS.some((pattern) => new RegExp(pattern).test(text));
  // Written with `up` so that this file itself names no such path: a grep of the tree finds none here.
  const up = '..';
  for (const text of [
    `new URL('${up}/${up}/${up}/shared/samples/', import.meta.url)`,
    `// see ${up}/${up}/${up}/${up}/shared/samples and INDEX.md`,
    `// samples in ${up}/shared/samples/llamacpp-*`,
    '// real captured output (shared/samples)',
    "join(repoRoot, '..', 'shared', 'samples')",
    'join(root, "..", "shared")',
  ]) {
    t.ok(matches(text), text);
  }
  for (const text of ['test/fixtures/samples/nvsmi-err_*', 'one shared, reused buffer', "the 'shared' option", 'a shared group']) {
    t.notOk(matches(text), text);
  }
});
