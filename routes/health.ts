// Owns nodecompute's own health: /livez (and /healthz) say the event loop runs and never depend on
// nvidia-smi; /readyz says whether the service can answer truthfully (a snapshot within max-stale,
// the GPU processes visible, registrations storable), with a Kubernetes-style checklist on ?verbose.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { describeListedPids, NO_GPU_PROCESS, SOME_PIDS_MISSING_FIX } from '../src/doctor/doctor.js';
import { formatDuration } from '../src/duration.js';
import { BadRequestError, cannotStoreMessage, isCodedError } from '../src/errors.js';
import { errorBody } from '../src/http/errors.js';
import type { NodeSnapshot } from '../src/node-state/node-snapshot.js';
import { snapshotMeta, type SnapshotMeta } from '../src/node-state/node-view.js';
import { retryAfterSeconds, type SnapshotView } from '../src/node-state/snapshot.js';
import { ErrorSchema, Ref, SnapshotMetaComponent } from '../src/schemas/common.js';

const LiveSchema = Type.Object({ status: Type.Literal('ok', { description: 'Always ok while the process answers.' }) }, { description: 'The process answers.' });
const ReadySchema = Type.Intersect([
  Type.Object({ status: Type.Literal('ok', { description: 'ok: the GPU driver answers, its PIDs are visible in /proc, and registrations can be stored.' }) }),
  Ref(SnapshotMetaComponent),
]);

// ?verbose values: without a value, empty, true or 1: the checklist; false or 0: JSON (what a monitor writing
// ?verbose=false means, though kube-apiserver takes the key alone). Anything else is a 400 rather than a guess.
const CHECKLIST = new Map(Object.entries({ '': true, true: true, 1: true, false: false, 0: false }));

/**
 * `warning`: passes, yet the doctor warns about the same (the checklist says so, in the doctor's words).
 * `retryAfter`: the seconds nvidia-smi's failure is waited out before it runs again (as /gpus's 503 says it).
 */
type Check = { name: string; detail: string } & ({ ok: true; warning?: boolean } | { ok: false; code: string; retryAfter?: number | null });

const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { node, probeBudgetMs, proc, config, stateFile } = app.services;
  // Made afresh for each path: one object used twice comes out of the OpenAPI YAML as an alias.
  const live = (operationId: string, summary: string) => ({ schema: { operationId, tags: ['health'], summary, response: { 200: LiveSchema } } });
  app.get('/livez', live('getLivez', 'Liveness: 200 while the event loop runs; never depends on the GPU driver.'), async () => ({ status: 'ok' as const }));
  app.get('/healthz', live('getHealthz', 'Same as /livez.'), async () => ({ status: 'ok' as const }));

  /** The nvidia-smi line of the checklist: how old the snapshot is and, on the last good one, why. */
  function snapshotDetail(view: SnapshotView<NodeSnapshot>): string {
    const gpus = view.snapshot.gpus.length;
    if (view.failing) {
      // A failed refresh is only ever tried on a stale snapshot, so its reason is there.
      const reason = `${view.staleReason!.charAt(0).toUpperCase()}${view.staleReason!.slice(1)}`;
      const limit = `${formatDuration(config.maxStaleMs)} old (NODECOMPUTE_MAX_STALE_MS)`;
      const until = `it is served until it is ${limit}, then this check fails until the GPU driver answers again`;
      return `serving the last good snapshot (${formatDuration(view.ageMs)} old, ${gpus} GPUs) because refreshing it fails; ${until}. ${reason}`;
    }
    return `snapshot ${formatDuration(view.ageMs)} old, ${gpus} GPUs${view.stale ? ` (stale: ${view.staleReason})` : ''}`;
  }

  /**
   * The host-pid-namespace check when it passes: in the doctor's words, never "all" when some are
   * missing, and a warning where the doctor warns (it fails where all are missing: it has no previous
   * snapshot to tell processes that exited from another namespace's).
   */
  function listedPidsCheck(snapshot: NodeSnapshot): Check {
    const name = 'host-pid-namespace';
    const listed = [...new Set(snapshot.gpus.flatMap((gpu) => gpu.processes.map((process) => process.pid)))];
    if (listed.length === 0) return { name, ok: true, detail: NO_GPU_PROCESS };
    const missing = listed.filter((pid) => snapshot.proc.get(pid) == null);
    const found = describeListedPids(listed.length, missing, proc.root);
    if (missing.length === 0) return { name, ok: true, detail: found };
    const detail =
      missing.length === listed.length
        ? `${found}; none of them was missing from the previous snapshot, so they most likely exited since the GPU driver listed them. ` +
          'If they are still listed and missing at the next refresh, this check fails: nodecompute is then not in their PID namespace.'
        : `${found}. Readiness does not depend on it; what to do: ${SOME_PIDS_MISSING_FIX}`;
    return { name, ok: true, warning: true, detail };
  }

  /** Whether a registration can be stored: the last answer, looked at again in the background (state-file.ts). */
  async function stateFileCheck(): Promise<Check> {
    const answer = await stateFile.writable(probeBudgetMs);
    if (!answer.ok) return { name: 'state-file', ok: false, detail: cannotStoreMessage(stateFile.path, answer), code: 'NODECOMPUTE_STATE_WRITE_FAILED' };
    const stored = `registrations are stored in ${stateFile.path}`;
    return { name: 'state-file', ok: true, detail: answer.warning ? `${stored}, but ${answer.warning.problem} ${answer.warning.fix}` : stored };
  }

  /** The nvidia-smi and PID namespace checks, from the snapshot; the details of passing ones only for the checklist. */
  async function gpuChecks(checklist: boolean): Promise<{ checks: Check[]; meta: SnapshotMeta | null }> {
    try {
      const { view, node: nodeView } = await node.current({ maxWaitMs: probeBudgetMs });
      return {
        checks: [
          { name: 'nvidia-smi', ok: true, detail: checklist ? snapshotDetail(view) : '' },
          nodeView.processesHidden !== null
            ? { name: 'host-pid-namespace', ok: false, detail: nodeView.processesHidden, code: 'NODECOMPUTE_PID_NAMESPACE' }
            : checklist
              ? listedPidsCheck(nodeView.snapshot)
              : { name: 'host-pid-namespace', ok: true, detail: '' },
        ],
        meta: snapshotMeta(view),
      };
    } catch (err) {
      if (!isCodedError(err)) throw err;
      return { checks: [{ name: 'nvidia-smi', ok: false, detail: err.message, code: err.code, retryAfter: retryAfterSeconds(node.snapshots, err) }], meta: null };
    }
  }

  app.get(
    '/readyz',
    {
      schema: {
        operationId: 'getReadyz',
        tags: ['health'],
        summary: 'Readiness: 200 when the GPU driver answers (from the cache), its PIDs are visible and registrations can be stored; 503 with the reason otherwise.',
        description:
          "With ?verbose (or ?verbose=true, ?verbose=1), a plain-text checklist in the style of Kubernetes' own /readyz?verbose; ?verbose=false or 0 is JSON, as without it. " +
          'Within NODECOMPUTE_MAX_STALE_MS of the last good snapshot readiness holds while the GPU driver fails: `staleReason` (and the checklist) say so.',
        querystring: Type.Object({
          verbose: Type.Optional(
            Type.String({ description: 'Empty (?verbose), true or 1 for the plain-text checklist; false or 0 for JSON, as without it. Any other value is a 400.' }),
          ),
        }),
        response: {
          200: {
            description: 'The service can answer: a snapshot within max-stale, the GPU processes visible in this /proc, registrations storable.',
            content: { 'application/json': { schema: ReadySchema }, 'text/plain': { schema: Type.String({ description: 'The checklist (?verbose).' }) } },
          },
          400: ErrorSchema,
          503: {
            description: 'The service cannot answer truthfully: the error body (or the checklist) says which check failed and what to do.',
            content: { 'application/json': { schema: ErrorSchema }, 'text/plain': { schema: Type.String({ description: 'The checklist (?verbose).' }) } },
          },
        },
      },
    },
    async (request, reply) => {
      const { verbose } = request.query;
      const checklist = verbose === undefined ? false : CHECKLIST.get(verbose);
      if (checklist === undefined) {
        throw new BadRequestError(`Invalid request: querystring/verbose is ${JSON.stringify(verbose)}; none, true or 1: the checklist; false or 0: JSON.`);
      }
      const [gpu, stored] = await Promise.all([gpuChecks(checklist), stateFileCheck()]);
      const checks = [...gpu.checks, stored];
      const failed = checks.find((check): check is Extract<Check, { ok: false }> => !check.ok);
      // nvidia-smi's check comes first: while its failure is waited out, asking sooner gets this answer.
      if (failed?.retryAfter != null) void reply.header('retry-after', String(failed.retryAfter));
      if (checklist) {
        const lines = checks.map((check) =>
          check.ok ? `[+]${check.name} ok${check.warning ? ', with a warning' : ''}: ${check.detail}` : `[-]${check.name} failed: ${check.detail}`,
        );
        lines.push(failed ? 'readyz check failed' : 'readyz check passed');
        return reply.status(failed ? 503 : 200).type('text/plain; charset=utf-8').send(`${lines.join('\n')}\n`);
      }
      if (failed) return reply.status(503).send(errorBody(503, failed.code, failed.detail));
      // Every check passed, so the snapshot they read is there.
      return { status: 'ok' as const, ...gpu.meta! };
    },
  );
};

export default healthRoutes;
