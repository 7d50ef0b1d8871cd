// Owns the OpenAPI document as a file: it is generated from the route schemas by building the app
// (without listening or touching nvidia-smi), so openapi.yaml can be kept equal to what the service
// serves at /openapi.json. `npm run openapi` rewrites the file; a test fails when they differ.
import { pino } from 'pino';
import { buildApp } from './app.js';
import { defaultConfig } from './config.js';

export async function generateOpenApiYaml(): Promise<string> {
  // The registry only reads its file at start; a path that does not exist means "no shards".
  const config = defaultConfig({ stateFile: '/nonexistent/nodecompute-openapi/shards.json', logLevel: 'silent' });
  const app = await buildApp(config, { logger: pino({ level: 'silent' }) });
  try {
    await app.ready();
    return app.swagger({ yaml: true });
  } finally {
    await app.close();
  }
}
