// Owns GET /doctor: the node check as JSON, for operators and scripts that cannot exec into the pod.
// The check runs nvidia-smi three times, so concurrent requests share one check and its report is
// reused for a few seconds: an open endpoint must not let anyone start nvidia-smi without bound.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { runDoctor, type DoctorReport } from '../src/doctor/doctor.js';
import { Nullable, StringEnum } from '../src/schemas/common.js';
import { VERSION } from '../src/version.js';

const REPORT_REUSE_MS = 5000;

const DoctorSchema = Type.Object(
  {
    ok: Type.Boolean({ description: 'False when any check failed.' }),
    version: Type.String({ description: 'nodecompute version.' }),
    checkedAt: Type.String({ format: 'date-time', description: 'When the checks ran.' }),
    checks: Type.Array(
      Type.Object({
        name: Type.String({ description: 'Check name: nvidia-smi, gpus, query-time, host-pid-namespace, proc, open-files, state-file, token.' }),
        status: StringEnum(['ok', 'warn', 'fail'], 'ok, warn or fail.'),
        detail: Type.String({ description: 'What was found.' }),
        fix: Nullable(Type.String(), 'What to do; null when nothing needs doing.'),
      }),
      { description: 'Each check, in order.' },
    ),
  },
  { description: 'The node check; the same as `nodecompute doctor`.' },
);

const doctorRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { nvidiaSmi, proc, stateFile, config, now } = app.services;
  let running: Promise<DoctorReport> | null = null;
  let last: { at: number; report: DoctorReport } | null = null;
  app.get(
    '/doctor',
    {
      schema: {
        tags: ['operators'],
        summary: 'Check this node: nvidia-smi and its version, GPUs, query time, host PID namespace, /proc, open files, state file, token.',
        description: 'Runs nvidia-smi afresh (not from the cache). Always 200; `ok` says whether any check failed.',
        response: { 200: DoctorSchema },
      },
    },
    async () => {
      if (last && now() - last.at < REPORT_REUSE_MS) return last.report;
      running ??= runDoctor({ nvidiaSmi, proc, stateFile, nvidiaSmiPath: config.nvidiaSmi, tokenConfigured: config.token !== null, version: VERSION, now })
        .then((report) => {
          last = { at: now(), report };
          return report;
        })
        .finally(() => {
          running = null;
        });
      return running;
    },
  );
};

export default doctorRoutes;
