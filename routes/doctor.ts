// Owns GET /doctor: the node check as JSON, 503 when a check failed (as `nodecompute doctor` exits
// non-zero), so `curl -f` tells a sick node by its status. A check a shutdown cut off answers the
// coded 503 of any request cut off then. Concurrent requests share one check and its report is
// reused for a few seconds: an open endpoint must not start nvidia-smi without bound.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { runDoctor, type DoctorReport } from '../src/doctor/doctor.js';
import { ErrorSchema, Nullable, StringEnum } from '../src/schemas/common.js';
import { VERSION } from '../src/version.js';

export const REPORT_REUSE_MS = 5000;

/** Made afresh for each status: one object used twice would come out of the OpenAPI YAML as an alias. */
const doctorSchema = (description: string) => Type.Object(
  {
    ok: Type.Boolean({ description: 'False when any check failed.' }),
    version: Type.String({ description: 'nodecompute version.' }),
    checkedAt: Type.String({ format: 'date-time', description: 'When the checks ran.' }),
    checks: Type.Array(
      Type.Object({
        name: Type.String({
          description: 'Check name: settings, backend, nvidia-smi or nvml (whichever GPU driver serves), gpus, mig (only where MIG is enabled), query-time, lost-gpus, host-pid-namespace, weights, proc, open-files, state-file, registered-gpus, token.',
        }),
        status: StringEnum(['ok', 'warn', 'fail'], 'ok, warn or fail.'),
        detail: Type.String({ description: 'What was found.' }),
        fix: Nullable(Type.String(), "What to do; null when nothing needs doing, or when the detail ends with it (the GPU driver's failures)."),
      }),
      { description: 'Each check, in order.' },
    ),
  },
  { description },
);

const doctorRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { config, now, node } = app.services;
  let running: Promise<DoctorReport> | null = null;
  let last: { at: number; report: DoctorReport } | null = null;
  function check(): Promise<DoctorReport> {
    // The services carry the driver and why it serves, the readers, the token file and the settings warnings under the doctor's names.
    running ??= runDoctor({
      ...app.services,
      tokenConfigured: config.token !== null,
      snapshot: node.peek()?.view.snapshot ?? null,
      version: VERSION,
      now,
    })
      .then((report) => {
        last = { at: now(), report };
        return report;
      })
      .finally(() => {
        running = null;
      });
    return running;
  }
  app.get(
    '/doctor',
    {
      schema: {
        operationId: 'runDoctor',
        tags: ['operators'],
        summary: 'Check this node: the settings, the GPU driver (nvidia-smi or NVML) and its version, GPUs, query time, lost GPUs, host PID namespace, /proc, open files, state file, registered GPUs, token.',
        description:
          'Asks the GPU driver afresh (not from the cache). 200 when no check failed (warnings allowed), 503 with the same report when one did, ' +
          `as \`nodecompute doctor\` exits non-zero; each check says what it found and what to do. A report is reused for ${REPORT_REUSE_MS / 1000} s. ` +
          'A check that a shutdown of nodecompute cut off answers 503 with the error body instead (the code of the GPU driver query it cut off), as other requests do then.',
        response: {
          200: doctorSchema('The node check, the same as `nodecompute doctor`: no check failed (`ok` is true; some may warn).'),
          503: Type.Union(
            [
              doctorSchema('The node check, the same as `nodecompute doctor`: at least one check failed (`ok` is false); its `fix` says what to do.'),
              ErrorSchema,
            ],
            { description: 'The node check with at least one check failed; or, when a shutdown of nodecompute cut the check off, the error body.' },
          ),
        },
      },
    },
    async (_request, reply) => {
      const report = last && now() - last.at < REPORT_REUSE_MS ? last.report : await check();
      return reply.status(report.ok ? 200 : 503).send(report);
    },
  );
};

export default doctorRoutes;
