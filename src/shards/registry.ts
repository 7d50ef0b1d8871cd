// Owns the set of registered shards and its persistence. Every change is written to the state file
// before it is acknowledged; concurrent changes are group-committed (one atomic write covers every
// change queued while the previous write ran), so a storm of registrations costs a few fsyncs and
// loses nothing that was acknowledged. A change is answered within the state file's bound
// (timeoutMs) even where its filesystem does not answer (a hung network mount): one still queued
// then is withdrawn and answered "not stored"; one whose write is under way is answered "pending"
// (503 either way), and is stored if that write lands later; while the state file says a write is
// stuck, a change is refused at once. Engine output is kept in memory only: it is a bounded tail
// that the engine can post again, and writing it to disk on every post would be a write amplifier.
// It belongs to the run it came from: a registration replaced for the same run (the same PID and
// start time; for a cgroup, the same engine process in it: a new "gpus" or "graceMs") keeps it, one
// for another target or a restarted container starts with only what was posted after the replacing
// PUT arrived.
// A target is registered under one id only: a second id for the same process or cgroup, or for a
// process in a registered cgroup (or a cgroup holding a registered process), is refused (attribution
// would give its memory to one id and leave the other on-cpu). A replacement for the
// same run and the same GPUs keeps the registration time, and with it the grace clock: a control
// plane that re-PUTs its shards periodically must not put an on-cpu shard back into `starting`; a
// restarted container's re-PUT (the example's postStart hook) gives the new run its grace.
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import type { Logger } from 'pino';
import { ShardConflictError, StateFileInvalidError, StateWriteFailedError, StateWritePendingError } from '../errors.js';
import type { StateFile, StateFileFailure } from '../system/state-file.js';
import { appendTail } from './engine-output.js';
import type { EngineAccount } from './llama-account.js';
import { parseLlamaLog } from './llama-log.js';
import { ENGINES, ranInAnotherBoot, sameProcess, type ShardRecord } from './shard.js';

const PersistedShardSchema = Type.Object({
  id: Type.String({ minLength: 1 }),
  pid: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
  cgroup: Type.Union([Type.String({ minLength: 1 }), Type.Null()]),
  gpus: Type.Array(Type.Integer({ minimum: 0 })),
  gpuUuids: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
  engine: Type.Union(ENGINES.map((engine) => Type.Literal(engine))),
  graceMs: Type.Integer({ minimum: 0 }),
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

export interface EngineState {
  tail: string;
  account: EngineAccount | null;
  updatedAt: number;
  /**
   * When it was last posted, in clock ticks since boot (the unit of /proc start times), so that it
   * can be told apart from processes started after it; null when /proc could not say.
   */
  postedAtTicks: number | null;
  /**
   * When this tail was begun (its first post), in the same clock: a cgroup shard whose processes all
   * started after it has restarted since, so the tail is (at least in part) an earlier run's.
   */
  tailStartedAtTicks: number | null;
}

export interface Registry {
  list(): ShardRecord[];
  get(id: string): ShardRecord | undefined;
  /** Bumped on every acknowledged registration or removal: keys the per-snapshot views and ETags. */
  readonly version: number;
  /** Bumped on every engine output: it changes verdicts, never attribution. */
  readonly engineVersion: number;
  /**
   * Registers or replaces a shard; resolves once the state file holds it, with the record stored.
   * Engine output follows the target, and so does the registration time (see the header). Rejects
   * with ShardConflictError when another id holds the same target, or one `overlaps` says covers
   * the same processes (a PID shard's process in a cgroup shard's cgroup: what only /proc can tell).
   * `stored` is told once it is stored, whether or not the caller still waits (a write that landed
   * after its caller was answered 503 pending): what follows a registration belongs there.
   */
  put(record: ShardRecord, overlaps?: Overlaps | null, stored?: (result: PutResult) => void): Promise<PutResult>;
  /**
   * Whether put(record) would now be answered at once as an unchanged repeat (nothing queued or
   * being written, and the same registration stored under its id): it is never a conflict, so the
   * caller need not read what `overlaps` would judge by, and may put it with `overlaps` null. Such a
   * put that is no repeat by the time it is decided (the id was removed or changed meanwhile) is
   * refused with NotARepeatError, and nothing is stored: the caller reads what it skipped and puts again.
   */
  repeats(record: ShardRecord): boolean;
  /** Removes a shard; false when it was not registered. Resolves once the state file agrees; `removed` is told then, as put's `stored`. */
  remove(id: string, removed?: () => void): Promise<boolean>;
  engine(id: string): EngineState | undefined;
  /**
   * Appends engine output to the shard's tail (or, `fresh`, starts a new tail with it: the old one is
   * an earlier run's) and re-reads the engine's account from it. `ticks`: now, in clock ticks since boot.
   */
  appendEngineOutput(id: string, text: string, now: number, ticks: number | null, fresh?: boolean): EngineState | undefined;
  /**
   * PIDs and cgroups the next snapshot must read along with the GPU processes: not the PIDs of shards
   * of another boot than `bootId` (the one /proc names now), which name other processes now.
   */
  interest(bootId: string | null): { pids: number[]; cgroups: string[] };
}

export interface PutResult {
  created: boolean;
  /** The record stored: the one given, with the previous registration time when that was kept. */
  shard: ShardRecord;
  /** A replacement for the same target and GPUs: the registration time, and so the grace clock, was kept. */
  graceKept: boolean;
  /** A replacement identical to the registration it replaced: nothing changed (the previous record stays). */
  unchanged: boolean;
}

/**
 * How another registration covers a process of the one being made, though its target differs (a
 * cgroup against a PID, or a PID shard's descendant or process group against its PID), as the
 * middle of a sentence that starts with the one being made ("runs in the cgroup \"pod-a\"");
 * null when it does not. Decided from /proc when the registration was read.
 */
export type Overlaps = (other: ShardRecord) => string | null;

/** A put made as a repeat (`overlaps` null) that was no repeat when decided: not a client's error, the caller retries. */
export class NotARepeatError extends Error {
  override name = 'NotARepeatError';

  constructor(id: string) {
    super(`shard "${id}" changed since its PUT was read`);
  }
}

type Change = (draft: Map<string, ShardRecord>) => unknown;

/**
 * What became of a change: stored, with what it answered; refused with its batch (the registry is as
 * it was); or not stored for another reason (withdrawn, or refused before it was queued), while a
 * write that may still change the registry is under way.
 */
type Settled<T> = { stored: true; result: T } | { stored: false; batchRefused: boolean };

interface Queued {
  change: Change;
  /** Told what became of the change, whether or not its caller is still waiting. */
  settled: (outcome: Settled<unknown>) => void;
  resolve: (result: unknown) => void;
  reject: (err: Error) => void;
  /** Answers the caller once the state file's bound passes. */
  deadline: NodeJS.Timeout;
  /** The caller was answered "pending" while the change's write was under way. */
  answeredPending: boolean;
}

/** What put() answers for a change its batch stored. */
function putResult(stored: { previous: ShardRecord | undefined; stored: ShardRecord; graceKept: boolean; unchanged: boolean }): PutResult {
  return { created: stored.previous === undefined, shard: stored.stored, graceKept: stored.graceKept, unchanged: stored.unchanged };
}

/** Whether a replacing registration names the same process or the same cgroup. */
function sameTarget(a: ShardRecord, b: ShardRecord): boolean {
  if (a.cgroup !== null || b.cgroup !== null) return a.cgroup === b.cgroup;
  return sameProcess(a.identity, b.identity);
}

/**
 * Whether it is the same run of the target: the same process, or for a cgroup the same engine process
 * (its identity, the oldest process of the cgroup that is not the pod's sandbox, see shard.ts). A
 * restarted container is the same cgroup but another run: its grace starts again and its engine
 * output starts afresh.
 */
function sameRun(a: ShardRecord, b: ShardRecord): boolean {
  return sameTarget(a, b) && sameProcess(a.identity, b.identity);
}

function sameMembers<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((member) => b.includes(member));
}

/**
 * The same GPUs: the same devices where both registrations know their UUIDs (after nvidia-smi
 * renumbers, another index can name the same GPU, and the same index another), else the same indices.
 */
function sameGpus(a: ShardRecord, b: ShardRecord): boolean {
  return a.gpuUuids !== undefined && b.gpuUuids !== undefined ? sameMembers(a.gpuUuids, b.gpuUuids) : sameMembers(a.gpus, b.gpus);
}

/** Every field but the registration time. */
function sameRegistration(a: ShardRecord, b: ShardRecord): boolean {
  return (
    a.id === b.id &&
    a.pid === b.pid &&
    a.cgroup === b.cgroup &&
    sameMembers(a.gpus, b.gpus) &&
    a.gpuUuids?.join() === b.gpuUuids?.join() &&
    a.engine === b.engine &&
    a.graceMs === b.graceMs &&
    a.identity.pid === b.identity.pid &&
    a.identity.pgid === b.identity.pgid &&
    a.identity.startTime === b.identity.startTime &&
    a.identity.name === b.identity.name &&
    a.identity.bootId === b.identity.bootId
  );
}

/** Another id registered for the same target as `record`, or for a target that covers the same processes, and how. */
interface Conflict {
  other: ShardRecord;
  /** How `record` relates to it (Overlaps); null for the same target. */
  relation: string | null;
}

function conflicting(shards: ReadonlyMap<string, ShardRecord>, record: ShardRecord, overlaps: Overlaps): Conflict | undefined {
  for (const shard of shards.values()) {
    if (shard.id === record.id) continue;
    if (sameTarget(shard, record)) return { other: shard, relation: null };
    const relation = overlaps(shard);
    if (relation !== null) return { other: shard, relation };
  }
  return undefined;
}

/** A registration's process, as a conflict names it: "PID (name, started at tick T)". */
export function processOf(record: Pick<ShardRecord, 'identity'>): string {
  return `${record.identity.pid} (${record.identity.name}, started at tick ${record.identity.startTime})`;
}

function conflictError(record: ShardRecord, { other, relation }: Conflict): Error {
  const named = record.cgroup !== null ? `The cgroup "${record.cgroup}"` : `Process ${processOf(record)}`;
  const target = relation === null ? `${named} is` : `${named} ${relation}, which is`;
  const family = record.cgroup === null && other.cgroup === null && relation !== null ? " A PID shard's descendants and the process group it leads are part of it." : '';
  return new ShardConflictError(
    `${target} already registered as shard "${other.id}".${family} One process or cgroup under two ids would split its GPU memory: ` +
      `attribution gives it to one id, and the other reads on-cpu while it computes on the GPU. ` +
      `To register it as "${record.id}", DELETE /shards/${other.id} first; to change its GPUs, grace or engine, PUT /shards/${other.id} instead.`,
  );
}

/**
 * What a replacement stores: the previous record itself when nothing changed; the new one with the
 * previous registration time when the target and the GPUs are the same (a new grace or engine goes
 * on from the same start); otherwise the new one, whose grace starts now.
 */
function replacement(previous: ShardRecord | undefined, record: ShardRecord): { stored: ShardRecord; graceKept: boolean; unchanged: boolean } {
  if (previous === undefined || !sameRun(previous, record) || !sameGpus(previous, record)) return { stored: record, graceKept: false, unchanged: false };
  if (sameRegistration(previous, record)) return { stored: previous, graceKept: true, unchanged: true };
  return { stored: { ...record, registeredAt: previous.registeredAt }, graceKept: true, unchanged: false };
}

/** Engine output posted while a replacing PUT of its shard was in flight. */
interface Posted {
  tail: string;
  updatedAt: number;
  postedAtTicks: number | null;
  tailStartedAtTicks: number | null;
}

function engineState(engine: ShardRecord['engine'], posted: Posted): EngineState {
  // Only llama.cpp's account is understood; other engines' output is kept for operators.
  return { ...posted, account: engine === 'llama.cpp' ? parseLlamaLog(posted.tail) : null };
}

/** `posted` with `text` appended (or begun afresh with it), posted at `ticks`. */
function appended(posted: Posted | undefined, text: string, now: number, ticks: number | null, fresh: boolean): Posted {
  const begun = fresh || posted === undefined || posted.tail === '';
  return {
    tail: appendTail(begun ? '' : posted.tail, text),
    updatedAt: now,
    postedAtTicks: ticks,
    tailStartedAtTicks: begun ? ticks : posted.tailStartedAtTicks,
  };
}

function serialise(shards: Map<string, ShardRecord>): string {
  const state: State = { format: 'nodecompute-shards/v1', shards: [...shards.values()] };
  return `${JSON.stringify(state, null, 2)}\n`;
}

/**
 * What reading the state file found: its registrations (null: no file yet, a first start), or why a
 * start cannot use it, in two parts: what is wrong, and what to do.
 */
export type StateFileRead = { ok: true; shards: ShardRecord[] | null } | { ok: false; problem: string; fix: string; cause?: unknown };

function parseState(path: string, text: string): StateFileRead {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    return {
      ok: false,
      problem: `The state file ${path} is not valid JSON (${(err as Error).message}). It was left untouched.`,
      fix: 'Restore it from a backup, fix it by hand, or move it away to start with no shards (the control plane must then register them again).',
      cause: err,
    };
  }
  if (!Value.Check(StateSchema, data)) {
    const first = Value.Errors(StateSchema, data).First()!;
    return {
      ok: false,
      problem: `The state file ${path} is not a nodecompute shard registry: ${first.path} ${first.message}. It was left untouched.`,
      fix: 'Fix it by hand, or move it away to start with no shards.',
    };
  }
  const mismatched = data.shards.find((shard) => shard.gpuUuids !== undefined && shard.gpuUuids.length !== shard.gpus.length);
  if (mismatched !== undefined) {
    return {
      ok: false,
      problem: `The state file ${path} gives shard "${mismatched.id}" ${mismatched.gpus.length} GPU(s) but ${mismatched.gpuUuids!.length} GPU UUID(s): each GPU index needs its UUID, in the same order. It was left untouched.`,
      fix: 'Fix it by hand (remove "gpuUuids" to have the shard judged by index), or move it away to start with no shards.',
    };
  }
  return { ok: true, shards: data.shards };
}

const permissionDenied = (err: unknown): boolean => ['EACCES', 'EPERM'].includes(String((err as NodeJS.ErrnoException).code));

/**
 * Reads and parses the state file as a start does: the one way to, for loadRegistry and for the
 * doctor, which must fail exactly where a start would.
 */
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

export async function loadRegistry(deps: { stateFile: StateFile; log: Logger }): Promise<Registry> {
  const { stateFile, log } = deps;
  const read = await readRegistryFile(stateFile);
  if (!read.ok) throw new StateFileInvalidError(`${read.problem} ${read.fix}`, { cause: read.cause });
  let committed = new Map<string, ShardRecord>();
  for (const shard of read.shards ?? []) committed.set(shard.id, shard);
  log.info({ stateFile: stateFile.path, shards: committed.size }, read.shards === null ? 'No state file yet; starting with no shards' : 'Loaded shard registrations');

  const engines = new Map<string, EngineState>();
  // Per shard id, what was posted since each of its in-flight PUTs arrived.
  const inFlight = new Map<string, Set<{ now: Posted }>>();
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
      /** How many of the batch's callers were answered 503 pending while it was written. */
      const late = () => batch.filter((item) => item.answeredPending).length;
      try {
        await stateFile.write(serialise(draft));
      } catch (err) {
        // Detail only: each caller gets the failure (a coded 503, which app.ts logs once a minute),
        // and the state file logs its directory turning unwritable, once.
        log.debug({ err, stateFile: stateFile.path, changes: batch.length }, 'Could not write the state file; the changes were refused and nothing stored was lost');
        const fix = (err as StateFileFailure).fix ?? 'Make the state directory writable (disk full? read-only volume? a mount that does not answer?) and retry.';
        const failure = new StateWriteFailedError(
          `The change was not stored: writing the state file ${stateFile.path} failed (${(err as Error).message}). Nothing already registered was lost. ${fix}`,
          { cause: err },
        );
        sayLate(late(), 'were not stored after all: the write failed when it returned');
        for (const item of batch) settle(item, { stored: false, batchRefused: true }, failure);
        continue;
      }
      committed = draft;
      version += 1;
      sayLate(late(), 'are stored after all, as far as they changed anything (GET /shards shows what is stored)');
      batch.forEach((item, i) => settle(item, { stored: true, result: results[i] }));
    }
    writing = false;
  }

  /** Says what became of the changes of a batch whose callers were answered 503 pending (`outcome`), if there were any. */
  function sayLate(changes: number, outcome: string): void {
    if (changes === 0) return;
    log.info(
      { stateFile: stateFile.path, changes },
      `A write of the state file that had not finished in time returned: the ${changes} change(s) answered 503 NODECOMPUTE_STATE_WRITE_PENDING meanwhile ${outcome}.`,
    );
  }

  /** Tells the change's `settled` what became of it, and answers its caller (unless answered already). */
  function settle(item: Queued, outcome: Settled<unknown>, failure?: Error): void {
    clearTimeout(item.deadline);
    try {
      item.settled(outcome);
    } catch (err) {
      log.error({ err }, 'What follows a change to the registry failed; the registry itself is as answered. This is a bug in nodecompute, please report it with this line.');
    }
    if (outcome.stored) item.resolve(outcome.result);
    else item.reject(failure!);
  }

  /** The state file's bound passed before the change was stored or refused: withdraws it if it is still queued, and answers its caller. */
  function answerLate(item: Queued): void {
    const index = queue.indexOf(item);
    const bound = `${stateFile.timeoutMs} ms`;
    if (index !== -1) {
      queue.splice(index, 1);
      settle(
        item,
        { stored: false, batchRefused: false },
        new StateWriteFailedError(
          `The change was not stored: ${bound} after it came, the state file ${stateFile.path} was still being written for earlier changes ` +
            '(its filesystem does not answer: a hung network mount?). It was withdrawn, and nothing was changed. Retry once GET /readyz passes.',
        ),
      );
      return;
    }
    item.answeredPending = true;
    item.reject(
      new StateWritePendingError(
        `The change is not acknowledged: ${bound} after it came, the write of the state file ${stateFile.path} that carries it had not finished ` +
          '(a slow volume, or one that does not answer: a hung network mount?). That write is still pending, so the change may yet be stored when it lands ' +
          '(GET /shards shows what is stored). Retry once GET /readyz passes; repeating the same request is safe (a repeated DELETE that answers 404 means the first one was stored).',
      ),
    );
  }

  /**
   * Queues `change` for the next batch; answers once the state file holds it or its batch is refused,
   * or once the state file's bound passes (answerLate); refuses it at once while an operation on the
   * state file is stuck. `settled` is told what became of it in any case.
   */
  function enqueue<T>(change: (draft: Map<string, ShardRecord>) => T, settled: (outcome: Settled<T>) => void): Promise<T> {
    const stuck = stateFile.stuck();
    if (stuck !== null) {
      // Refused at once, not after waiting out the bound behind a write that does not return.
      settled({ stored: false, batchRefused: false });
      return Promise.reject(
        new StateWriteFailedError(`The change was not stored: the state file ${stateFile.path} cannot be written now (${stuck}). Nothing was changed. Retry once GET /readyz passes.`),
      );
    }
    return new Promise<T>((resolve, reject) => {
      const item: Queued = {
        change,
        settled: settled as (outcome: Settled<unknown>) => void,
        resolve: resolve as (result: unknown) => void,
        reject,
        deadline: setTimeout(() => answerLate(item), stateFile.timeoutMs),
        answeredPending: false,
      };
      queue.push(item);
      if (!writing) void drain();
    });
  }

  /** Moves the engine output to a stored registration of `record`, from the one it `replaced` or from what was `posted` since its PUT came. */
  function carryEngineOutput(record: ShardRecord, replaced: ShardRecord | undefined, posted: Posted): void {
    const kept = engines.get(record.id);
    if (replaced !== undefined && sameRun(replaced, record)) {
      // The same run of the same process or cgroup: its output still describes it (read again if the engine changed).
      if (kept && replaced.engine !== record.engine) {
        engines.set(record.id, engineState(record.engine, kept));
        engineVersion += 1;
      }
    } else if (posted.tail !== '') {
      // Another target: only what was posted after this PUT arrived can be its output.
      engines.set(record.id, engineState(record.engine, posted));
      engineVersion += 1;
    } else if (engines.delete(record.id)) engineVersion += 1;
  }

  const repeats = (record: ShardRecord): boolean => queue.length === 0 && !writing && replacement(committed.get(record.id), record).unchanged;

  return {
    list: () => [...committed.values()],
    get: (id) => committed.get(id),
    get version() {
      return version;
    },
    get engineVersion() {
      return engineVersion;
    },
    repeats,
    async put(record, overlaps = () => null, stored = () => undefined) {
      // With nothing queued, answered at once from what is stored: a registration repeated unchanged
      // (a control plane reconciling its shards), which needs no write, no new registry version and so
      // no new attribution, or a conflict. Otherwise the batch decides, after the changes queued before
      // this one (a DELETE of the other id among them). An unchanged repeat is never a conflict: it
      // changes nothing, and registrations stored before overlaps were refused (a PID in a registered
      // cgroup) must still be reconciled.
      if (queue.length === 0 && !writing) {
        const previous = committed.get(record.id);
        if (previous !== undefined && repeats(record)) {
          const result = { created: false, shard: previous, graceKept: true, unchanged: true };
          stored(result);
          return result;
        }
        if (overlaps === null) throw new NotARepeatError(record.id);
        const conflict = conflicting(committed, record, overlaps);
        if (conflict !== undefined) throw conflictError(record, conflict);
      }
      const posted: { now: Posted } = { now: { tail: '', updatedAt: 0, postedAtTicks: null, tailStartedAtTicks: null } };
      let pending = inFlight.get(record.id);
      if (!pending) inFlight.set(record.id, (pending = new Set()));
      pending.add(posted);
      const outcome = await enqueue(
        (draft): { conflict: Conflict } | { notARepeat: true } | { previous: ShardRecord | undefined; stored: ShardRecord; graceKept: boolean; unchanged: boolean } => {
          const previous = draft.get(record.id);
          const replaced = replacement(previous, record);
          if (!replaced.unchanged) {
            if (overlaps === null) return { notARepeat: true };
            const conflict = conflicting(draft, record, overlaps);
            if (conflict !== undefined) return { conflict };
          }
          draft.set(record.id, replaced.stored);
          return { previous, ...replaced };
        },
        // Whether or not the caller still waits: a write that landed late stored the change all the same.
        (settled) => {
          pending.delete(posted);
          if (pending.size === 0) inFlight.delete(record.id);
          if (!settled.stored || 'conflict' in settled.result || 'notARepeat' in settled.result) return;
          carryEngineOutput(record, settled.result.previous, posted.now);
          stored(putResult(settled.result));
        },
      );
      if ('notARepeat' in outcome) throw new NotARepeatError(record.id);
      if ('conflict' in outcome) throw conflictError(record, outcome.conflict);
      return putResult(outcome);
    },
    async remove(id, removed = () => undefined) {
      // Nothing to write when the id is unknown and no change is pending that could add it.
      if (!committed.has(id) && queue.length === 0 && !writing) return false;
      let batchRefused = false;
      try {
        return await enqueue(
          (draft) => draft.delete(id),
          (settled) => {
            if (!settled.stored) batchRefused = settled.batchRefused;
            else if (settled.result) {
              if (engines.delete(id)) engineVersion += 1;
              removed();
            }
          },
        );
      } catch (err) {
        // The batch it rode in was refused, so the registry is as it was. If that holds no such
        // shard, the removal changed nothing and the answer is "not registered", not a failed write
        // (changes queued after it come after it). Otherwise (withdrawn, or its write pending) a
        // write that may still add the shard is under way: that is not known.
        if (!batchRefused || committed.has(id)) throw err;
        return false;
      }
    },
    engine: (id) => engines.get(id),
    appendEngineOutput(id, text, now, ticks, fresh = false) {
      const shard = committed.get(id);
      if (!shard) return undefined;
      const state = engineState(shard.engine, appended(engines.get(id), text, now, ticks, fresh));
      engines.set(id, state);
      engineVersion += 1;
      for (const posted of inFlight.get(id) ?? []) posted.now = appended(posted.now, text, now, ticks, fresh);
      return state;
    },
    interest(bootId) {
      const pids: number[] = [];
      const cgroups: string[] = [];
      for (const shard of committed.values()) {
        if (shard.cgroup !== null) cgroups.push(shard.cgroup);
        else if (!ranInAnotherBoot(shard.identity, bootId)) pids.push(shard.identity.pid);
      }
      return { pids, cgroups };
    },
  };
}
