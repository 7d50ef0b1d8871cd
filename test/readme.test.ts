// The README is the operator's manual: every setting and every route it promises must exist.
import { readFileSync } from 'node:fs';
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
