// The README is the door to the operator's manual (docs/): every setting and every route it promises
// must exist, and every link it and docs/ hold must lead somewhere.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import t from 'tap';
import { SETTINGS } from '../src/config.js';
import { deviceLabel } from '../src/shards/compute.js';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
const spec = readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8');

t.test('every setting is documented with its flag and default', async (t) => {
  for (const setting of Object.values(SETTINGS)) {
    const row = readme.split('\n').find((line) => line.startsWith(`| \`${setting.env}\` |`));
    t.ok(row, `${setting.env} has a row`);
    t.match(row, `\`--${setting.flag}\``);
    t.match(row, setting.default === null ? '(unset)' : `\`${setting.default}\``);
  }
});

t.test('the two set-up commands are the ones package.json runs', async (t) => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { scripts: Record<string, string> };
  t.match(readme, 'npm ci && npm start');
  t.match(readme, 'npm ci && npm test');
  t.ok(pkg.scripts.start && pkg.scripts.test && pkg.scripts.demo && pkg.scripts.bench);
});

t.test('every path in the API table is in the OpenAPI document', async (t) => {
  const paths = [...readme.matchAll(/`(?:GET|PUT|POST|DELETE) (\/[^`\s]*)`/g)].map((match) => match[1]!.replace(/:(\w+)/g, '{$1}'));
  t.ok(paths.length >= 8);
  // /openapi.json serves the document itself and is hidden from it.
  for (const path of paths.filter((p) => p !== '/openapi.json')) t.match(spec, new RegExp(`^  ${path.replace(/[{}]/g, '\\$&')}:$`, 'm'), path);
});

t.test('the compute example labels its devices as the service does, from its own gpus', async (t) => {
  const example = readme.split('\n').find((line) => line.startsWith('# {"shard":') && line.includes('"devices":'));
  t.ok(example, 'the README shows a compute answer');
  const devices = JSON.parse(/"devices":(\[[^\]]*\])/.exec(example!)![1]!) as string[];
  const gpus = JSON.parse(/"gpus":(\[[^\]]*\])/.exec(example!)![1]!) as Array<{ index: number; usedMiB: number }>;
  t.same(devices, gpus.map(deviceLabel), `${JSON.stringify(gpus)} reads ${JSON.stringify(devices)}`);
});

t.test('the README stays a door: under 300 lines', async (t) => {
  t.ok(readme.split('\n').length < 300, `${readme.split('\n').length} lines`);
});

t.test('every relative link of the README and docs/ names a file there, and a heading where it names one', async (t) => {
  const root = new URL('../', import.meta.url);
  const docs = readdirSync(new URL('docs/', root)).filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`);
  t.ok(docs.length >= 5, `docs/ holds the manual: ${docs.join(', ')}`);
  t.ok(docs.every((doc) => readme.includes(`](${doc})`)), 'the README links every one of them');
  // GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens.
  const prose = (text: string) => text.replace(/^```[\s\S]*?^```$/gm, '');
  const anchors = (text: string) => [...prose(text).matchAll(/^#+ (.+)$/gm)].map((m) => m[1]!.toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, '').replace(/ /g, '-'));
  for (const from of ['README.md', ...docs]) {
    const text = prose(readFileSync(new URL(from, root), 'utf8'));
    for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue;
      const [path, fragment] = target!.split('#') as [string, string | undefined];
      const file = path === '' ? new URL(from, root) : new URL(path, new URL(from, root));
      t.ok(existsSync(file), `${from}: ${target} exists`);
      if (fragment && file.pathname.endsWith('.md')) t.ok(anchors(readFileSync(file, 'utf8')).includes(fragment), `${from}: ${target} names a heading`);
    }
  }
});
