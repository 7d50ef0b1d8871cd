// The layout's rules, checked over the source: no import circle among src/ and routes/ (type-only
// imports count: they tie modules as tightly), and the dependency direction routes -> domain ->
// system readers: routes never import src/system, execa or node:fs, and system readers never import
// Fastify.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const root = fileURLToPath(new URL('..', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith('.ts'))
    .map((entry) => relative(root, join(entry.parentPath, entry.name)));
}

/** The specifiers a module imports or re-exports, type-only ones included. */
export function importsOf(text: string): string[] {
  return [...text.matchAll(/^\s*(?:import|export)\b[^'"]*?from\s+['"]([^'"]+)['"]/gm), ...text.matchAll(/^\s*import\s+['"]([^'"]+)['"]/gm)].map((match) => match[1]!);
}

const files = [...sources('src'), ...sources('routes')];
const graph = new Map(
  files.map((file) => {
    const local = importsOf(readFileSync(join(root, file), 'utf8'))
      .filter((spec) => spec.startsWith('.'))
      .map((spec) => relative(root, resolve(root, dirname(file), spec)).replace(/\.js$/, '.ts'));
    return [file, local] as const;
  }),
);

/** Every cycle reachable in the graph, each as the path that closes it. */
function cycles(): string[][] {
  const found: string[][] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (file: string): void => {
    state.set(file, 'open');
    stack.push(file);
    for (const next of graph.get(file) ?? []) {
      if (state.get(next) === 'open') found.push([...stack.slice(stack.indexOf(next)), next]);
      else if (!state.has(next)) visit(next);
    }
    stack.pop();
    state.set(file, 'done');
  };
  for (const file of graph.keys()) if (!state.has(file)) visit(file);
  return found;
}

t.test('the import parser sees type-only imports and re-exports', async (t) => {
  t.same(importsOf("import type { A } from './a.js';\nexport { B } from './b.js';\nimport {\n  C,\n} from './c.js';\nimport './d.js';\n"), ['./a.js', './b.js', './c.js', './d.js']);
});

t.test('no import circle among src/ and routes/', async (t) => {
  t.ok(graph.size > 40, `${graph.size} modules read`);
  t.same(cycles().map((cycle) => cycle.join(' -> ')), []);
});

t.test('routes never reach the OS; system readers never know Fastify', async (t) => {
  for (const [file, text] of files.map((file) => [file, readFileSync(join(root, file), 'utf8')] as const)) {
    const specs = importsOf(text);
    if (file.startsWith('routes/')) {
      t.notOk(specs.some((spec) => spec.includes('/system/') || spec === 'execa' || /^(node:)?fs(\/promises)?$/.test(spec)), `${file} imports no system reader`);
    }
    if (file.startsWith('src/system/')) t.notOk(specs.some((spec) => spec.startsWith('fastify') || spec.startsWith('@fastify/')), `${file} imports no Fastify`);
  }
});
