// Owns the state file's format (nodecompute-shards/v1) and reading it as a start does: the one way
// to, for loadRegistry and for the doctor, which must fail exactly where a start would. A file that
// cannot be used is left untouched.
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import type { StateFile } from '../system/state-file.js';
import { ENGINES, type ShardRecord } from './shard.js';

const PersistedShardSchema = Type.Object({
  id: Type.String({ minLength: 1 }),
  pid: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
  cgroup: Type.Union([Type.String({ minLength: 1 }), Type.Null()]),
  gpus: Type.Array(Type.Integer({ minimum: 0 })),
  gpuUuids: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
  migDevices: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
  engine: Type.Union(ENGINES.map((engine) => Type.Literal(engine))),
  graceMs: Type.Integer({ minimum: 0 }),
  minGpuWeightsShare: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  registeredAt: Type.Integer({ minimum: 0 }),
  identity: Type.Object({
    pid: Type.Integer({ minimum: 1 }),
    pgid: Type.Integer({ minimum: 0 }),
    startTime: Type.Integer({ minimum: 0 }),
    name: Type.String(),
    bootId: Type.Optional(Type.String({ minLength: 1 })),
  }),
});

const StateSchema = Type.Object({
  format: Type.Literal('nodecompute-shards/v1'),
  shards: Type.Array(PersistedShardSchema),
});
type State = Static<typeof StateSchema>;

export function serialiseShards(shards: Map<string, ShardRecord>): string {
  const state: State = { format: 'nodecompute-shards/v1', shards: [...shards.values()] };
  return `${JSON.stringify(state, null, 2)}\n`;
}

/** Its registrations (null: no file yet, a first start), or why a start cannot use it: what is wrong, and what to do. */
export type StateFileRead = { ok: true; shards: ShardRecord[] | null } | { ok: false; problem: string; fix: string; cause?: unknown };

/** A file a start cannot use, left untouched. */
function unusable(problem: string, fix: string, cause?: unknown): StateFileRead {
  const refused = { ok: false as const, problem: `${problem} It was left untouched.`, fix };
  return cause === undefined ? refused : { ...refused, cause };
}

function parseState(path: string, text: string): StateFileRead {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    const fix = 'Restore it from a backup, fix it by hand, or move it away to start with no shards (the control plane must then register them again).';
    return unusable(`The state file ${path} is not valid JSON (${(err as Error).message}).`, fix, err);
  }
  if (!Value.Check(StateSchema, data)) {
    const first = Value.Errors(StateSchema, data).First()!;
    const problem = `The state file ${path} is not a nodecompute shard registry: ${first.path} ${first.message}.`;
    return unusable(problem, 'Fix it by hand, or move it away to start with no shards.');
  }
  const mismatched = data.shards.find((shard) => shard.gpuUuids !== undefined && shard.gpuUuids.length !== shard.gpus.length);
  if (mismatched !== undefined) {
    const { id, gpus, gpuUuids } = mismatched;
    const problem = `The state file ${path} gives shard "${id}" ${gpus.length} GPU(s) but ${gpuUuids!.length} GPU UUID(s)`;
    const fix = 'Fix it by hand (remove "gpuUuids" to have the shard judged by index), or move it away to start with no shards.';
    return unusable(`${problem}: each GPU index needs its UUID, in the same order.`, fix);
  }
  return { ok: true, shards: data.shards };
}

const permissionDenied = (err: unknown): boolean => ['EACCES', 'EPERM'].includes(String((err as NodeJS.ErrnoException).code));

export async function readRegistryFile(stateFile: StateFile): Promise<StateFileRead> {
  let text: string | null;
  try {
    text = await stateFile.read();
  } catch (err) {
    return {
      ok: false,
      problem: `Cannot read the state file ${stateFile.path}: ${(err as Error).message}.`,
      fix: permissionDenied(err)
        ? `nodecompute runs as uid ${process.getuid!()}, gid ${process.getgid!()}: make the file and its directory theirs (\`chown -R\` the state directory: a file written by an earlier run as another user stays unreadable), or point NODECOMPUTE_STATE_FILE elsewhere.`
        : 'Check its permissions and the volume it lives on, or point NODECOMPUTE_STATE_FILE elsewhere.',
      cause: err,
    };
  }
  return text === null ? { ok: true, shards: null } : parseState(stateFile.path, text);
}
