// Owns the set of registered shards and its persistence. Every change is written to the state file
// before it is acknowledged; concurrent changes are group-committed (one atomic write covers every
// change queued while the previous write ran), so a storm of registrations costs a few fsyncs and
// loses nothing that was acknowledged. Engine output is kept in memory only: it is a bounded tail
// that the engine can post again, and writing it to disk on every post would be a write amplifier.
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import type { Logger } from 'pino';
import { StateFileInvalidError, StateWriteFailedError } from '../errors.js';
import type { StateFile } from '../system/state-file.js';
import { appendTail, type EngineAccount, parseLlamaLog } from './llama-log.js';
import { ENGINES, type ShardRecord } from './shard.js';

const PersistedShardSchema = Type.Object({
  id: Type.String({ minLength: 1 }),
  pid: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
  cgroup: Type.Union([Type.String({ minLength: 1 }), Type.Null()]),
  gpus: Type.Array(Type.Integer({ minimum: 0 })),
  engine: Type.Union(ENGINES.map((engine) => Type.Literal(engine))),
  graceMs: Type.Integer({ minimum: 0 }),
  registeredAt: Type.Integer({ minimum: 0 }),
  identity: Type.Object({
    pid: Type.Integer({ minimum: 1 }),
    pgid: Type.Integer({ minimum: 0 }),
    startTime: Type.Integer({ minimum: 0 }),
    name: Type.String(),
  }),
});

const StateSchema = Type.Object({
  format: Type.Literal('nodecompute-shards/v1'),
  shards: Type.Array(PersistedShardSchema),
});
type State = Static<typeof StateSchema>;

export interface EngineState {
  tail: string;
  account: EngineAccount | null;
  updatedAt: number;
}

export interface Registry {
  list(): ShardRecord[];
  get(id: string): ShardRecord | undefined;
  /** Bumped on every acknowledged registration or removal: keys the per-snapshot views and ETags. */
  readonly version: number;
  /** Bumped on every engine output: it changes verdicts, never attribution. */
  readonly engineVersion: number;
  /** Registers or replaces a shard; resolves once the state file holds it. */
  put(record: ShardRecord): Promise<{ created: boolean }>;
  /** Removes a shard; false when it was not registered. Resolves once the state file agrees. */
  remove(id: string): Promise<boolean>;
  engine(id: string): EngineState | undefined;
  /** Appends engine output to the shard's tail and re-reads the engine's account from it. */
  appendEngineOutput(id: string, text: string, now: number): EngineState | undefined;
  /** PIDs and cgroups the next snapshot must read along with the GPU processes. */
  interest(): { pids: number[]; cgroups: string[] };
}

type Change = (draft: Map<string, ShardRecord>) => unknown;

interface Queued {
  change: Change;
  resolve: (result: unknown) => void;
  reject: (err: Error) => void;
}

function serialise(shards: Map<string, ShardRecord>): string {
  const state: State = { format: 'nodecompute-shards/v1', shards: [...shards.values()] };
  return `${JSON.stringify(state, null, 2)}\n`;
}

function parseState(path: string, text: string): ShardRecord[] {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    throw new StateFileInvalidError(
      `The state file ${path} is not valid JSON (${(err as Error).message}). It was left untouched. ` +
        'Restore it from a backup, fix it by hand, or move it away to start with no shards (the control plane must then register them again).',
      { cause: err },
    );
  }
  if (!Value.Check(StateSchema, data)) {
    const first = Value.Errors(StateSchema, data).First()!;
    throw new StateFileInvalidError(
      `The state file ${path} is not a nodecompute shard registry: ${first.path} ${first.message}. ` +
        'It was left untouched. Fix it by hand, or move it away to start with no shards.',
    );
  }
  return data.shards;
}

export async function loadRegistry(deps: { stateFile: StateFile; log: Logger }): Promise<Registry> {
  const { stateFile, log } = deps;
  let text: string | null;
  try {
    text = await stateFile.read();
  } catch (err) {
    throw new StateFileInvalidError(
      `Cannot read the state file ${stateFile.path}: ${(err as Error).message}. Check its permissions and the volume it lives on, or point NODECOMPUTE_STATE_FILE elsewhere.`,
      { cause: err },
    );
  }
  let committed = new Map<string, ShardRecord>();
  if (text !== null) for (const shard of parseState(stateFile.path, text)) committed.set(shard.id, shard);
  log.info({ stateFile: stateFile.path, shards: committed.size }, text === null ? 'No state file yet; starting with no shards' : 'Loaded shard registrations');

  const engines = new Map<string, EngineState>();
  let version = 1;
  let engineVersion = 0;
  const queue: Queued[] = [];
  let writing = false;

  async function drain(): Promise<void> {
    writing = true;
    while (queue.length > 0) {
      const batch = queue.splice(0);
      const draft = new Map(committed);
      const results = batch.map((item) => item.change(draft));
      try {
        await stateFile.write(serialise(draft));
      } catch (err) {
        log.error({ err, stateFile: stateFile.path, changes: batch.length }, 'Could not write the state file; the changes were refused and nothing stored was lost');
        const failure = new StateWriteFailedError(
          `The change was not stored: writing the state file ${stateFile.path} failed (${(err as Error).message}). ` +
            'Nothing already registered was lost. Make the state directory writable (disk full? read-only volume?) and retry.',
          { cause: err },
        );
        for (const item of batch) item.reject(failure);
        continue;
      }
      committed = draft;
      version += 1;
      batch.forEach((item, i) => item.resolve(results[i]));
    }
    writing = false;
  }

  function enqueue<T>(change: (draft: Map<string, ShardRecord>) => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      queue.push({ change, resolve: resolve as (result: unknown) => void, reject });
      if (!writing) void drain();
    });
  }

  return {
    list: () => [...committed.values()],
    get: (id) => committed.get(id),
    get version() {
      return version;
    },
    get engineVersion() {
      return engineVersion;
    },
    async put(record) {
      const created = await enqueue((draft) => {
        const isNew = !draft.has(record.id);
        draft.set(record.id, record);
        return isNew;
      });
      // A new registration starts without the old one's engine output: verdicts drawn from it are void.
      if (engines.delete(record.id)) engineVersion += 1;
      return { created };
    },
    async remove(id) {
      // Nothing to write when the id is unknown and no change is pending that could add it.
      if (!committed.has(id) && queue.length === 0 && !writing) return false;
      let removed: boolean;
      try {
        removed = await enqueue((draft) => draft.delete(id));
      } catch (err) {
        // The batch it rode in was refused, so the registry is as it was. If that holds no such
        // shard, the removal changed nothing and the answer is "not registered", not a failed write.
        if (committed.has(id)) throw err;
        return false;
      }
      if (removed && engines.delete(id)) engineVersion += 1;
      return removed;
    },
    engine: (id) => engines.get(id),
    appendEngineOutput(id, text, now) {
      const shard = committed.get(id);
      if (!shard) return undefined;
      const tail = appendTail(engines.get(id)?.tail ?? '', text);
      // Only llama.cpp's account is understood; other engines' output is kept for operators.
      const account = shard.engine === 'llama.cpp' ? parseLlamaLog(tail) : null;
      const state: EngineState = { tail, account, updatedAt: now };
      engines.set(id, state);
      engineVersion += 1;
      return state;
    },
    interest() {
      const pids: number[] = [];
      const cgroups: string[] = [];
      for (const shard of committed.values()) {
        if (shard.cgroup !== null) cgroups.push(shard.cgroup);
        else pids.push(shard.identity.pid);
      }
      return { pids, cgroups };
    },
  };
}
