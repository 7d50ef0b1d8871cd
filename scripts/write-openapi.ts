// Rewrites openapi.yaml at the repository root from the route schemas (`npm run openapi`).
import { writeFileSync } from 'node:fs';
import { generateOpenApiYaml } from '../src/app.js';

const target = new URL('../../openapi.yaml', import.meta.url);
writeFileSync(target, await generateOpenApiYaml());
process.stdout.write(`wrote ${target.pathname}\n`);
