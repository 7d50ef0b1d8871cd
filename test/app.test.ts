// buildApp's defaults: with no deps it makes its own logger and readers from the config alone.
import { join } from 'node:path';
import t from 'tap';
import { buildApp } from '../src/app.js';
import { defaultConfig } from '../src/config.js';

t.test('buildApp(config) needs nothing else', async (t) => {
  const dir = t.testdir({});
  const app = await buildApp(defaultConfig({ stateFile: join(dir, 's.json'), nvidiaSmi: join(dir, 'missing'), logLevel: 'silent' }));
  t.teardown(() => app.close());
  t.equal((await app.inject({ method: 'GET', url: '/livez' })).statusCode, 200);
  const gpus = await app.inject({ method: 'GET', url: '/gpus' });
  t.equal(gpus.json().code, 'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND');
  t.equal(app.services.proc.root, '/proc');
});
