// Owns the set of registered shards. Every change is written to the state file before it is
// acknowledged, group-committed (one atomic write covers the changes queued while the last one ran),
// and answered within the state file's bound: a change still queued then is withdrawn, one being
// written is answered "pending" (503 either way) and stored if that write lands; while a write is
// stuck, a change is refused at once. Engine output is kept in memory, with the run it came from.
// A replacement for the same run and GPUs keeps the registration time, and with it the grace clock
// (a control plane re-PUTting its shards must not put an on-cpu shard back into starting); a second
// id for a target, or for one covering the same processes, is a conflict (attribution would give its
// memory to one id and leave the other on-cpu).
import type { Logger } from 'pino';
import { PreconditionFailedError, ShardConflictError, StateFileInvalidError, StateWriteFailedError, StateWritePendingError } from '../errors.js';
import type { RunnerHost } from '../system/model-runners.js';
import type { StateFile, StateFileFailure } from '../system/state-file.js';
import { appended, decodePost, engineState, NO_BYTES, type EngineState, type Posted } from './engine-output.js';
import { readRegistryFile, serialiseShards } from './registry-file.js';
import { ranInAnotherBoot, sameProcess, type ShardRecord } from './shard.js';

/** `shard`: the one given, with the previous registration time (and so grace clock) when `graceKept`; `unchanged`: identical, so kept. */
export type PutResult = { created: boolean; shard: ShardRecord; graceKept: boolean; unchanged: boolean };

/** A put made as a repeat (`overlaps` null) that was no repeat when decided: not a client's error, the caller retries. */
export class NotARepeatError extends Error {
  override name = 'NotARepeatError';

  constructor(id: string) {
    super(`shard "${id}" changed since its PUT was read`);
  }
}

/** A request's If-Match / If-None-Match, judged against the shard as registered when the change is decided: the 412's message, or null to go on. */
export type Precondition = (current: ShardRecord | undefined) => string | null;

/** How `other` covers a process of the registration being made though their targets differ, mid-sentence ("runs in the cgroup \"pod-a\""). */
export type Overlaps = (other: ShardRecord) => string | null;

/** Whether a replacing registration names the same process or the same cgroup. */
function sameTarget(a: ShardRecord, b: ShardRecord): boolean {
  if (a.cgroup !== null || b.cgroup !== null) return a.cgroup === b.cgroup;
  return sameProcess(a.identity, b.identity);
}

/** The same target and process: for a cgroup its engine process, so a restarted container is another run. */
function sameRun(a: ShardRecord, b: ShardRecord): boolean {
  return a.cgroup === b.cgroup && sameProcess(a.identity, b.identity);
}

function sameMembers<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((member) => b.includes(member));
}

/** The same devices where both know their UUIDs (nvidia-smi may renumber), else the same indices. */
function sameGpus(a: ShardRecord, b: ShardRecord): boolean {
  return a.gpuUuids !== undefined && b.gpuUuids !== undefined ? sameMembers(a.gpuUuids, b.gpuUuids) : sameMembers(a.gpus, b.gpus);
}

const FIELDS = ['id', 'pid', 'cgroup', 'engine', 'graceMs', 'minGpuWeightsShare'] as const;
const IDENTITY_FIELDS = ['pid', 'pgid', 'startTime', 'name', 'bootId'] as const;

/** Every field but the registration time. */
function sameRegistration(a: ShardRecord, b: ShardRecord): boolean {
  return (
    FIELDS.every((field) => a[field] === b[field]) &&
    sameMembers(a.gpus, b.gpus) &&
    a.gpuUuids?.join() === b.gpuUuids?.join() &&
    a.migDevices?.join() === b.migDevices?.join() &&
    IDENTITY_FIELDS.every((field) => a.identity[field] === b.identity[field])
  );
}

/** Another id registered for the same target as `record`, or covering the same processes; `relation`: how (Overlaps), null for the same target. */
type Conflict = { other: ShardRecord; relation: string | null };

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
  const split = 'Under two ids its GPU memory would go to one, and the other would read on-cpu while computing on the GPU';
  const fix = `To register it as "${record.id}", DELETE /shards/${other.id} first; to change its GPUs, grace or engine, PUT /shards/${other.id} instead.`;
  return new ShardConflictError(`${target} already registered as shard "${other.id}".${family} ${split}. ${fix}`);
}

/** What a replacement stores: the previous record if unchanged; for the same run and GPUs, the new one at the previous time; else the new one. */
function replacement(previous: ShardRecord | undefined, record: ShardRecord): { stored: ShardRecord; graceKept: boolean; unchanged: boolean } {
  if (previous === undefined || !sameRun(previous, record) || !sameGpus(previous, record)) return { stored: record, graceKept: false, unchanged: false };
  if (sameRegistration(previous, record)) return { stored: previous, graceKept: true, unchanged: true };
  return { stored: { ...record, registeredAt: previous.registeredAt }, graceKept: true, unchanged: false };
}

type Change = (draft: Map<string, ShardRecord>) => unknown;

/** Stored, with what the change answered; or not: refused with its batch, or withdrawn or refused before it was queued. */
type Settled<T> = { stored: true; result: T } | { stored: false; batchRefused: boolean };

/** `settled`: told what became of the change, whether or not its caller still waits; `deadline`: the state file's bound. */
interface Queued {
  change: Change;
  settled: (outcome: Settled<unknown>) => void;
  resolve: (result: unknown) => void;
  reject: (err: Error) => void;
  deadline: NodeJS.Timeout;
  answeredPending: boolean;
}

type Stored = ReturnType<typeof replacement> & { previous: ShardRecord | undefined };

const putResult = ({ previous, stored, graceKept, unchanged }: Stored): PutResult => ({ created: previous === undefined, shard: stored, graceKept, unchanged });

export type Registry = Awaited<ReturnType<typeof loadRegistry>>;

export async function loadRegistry(deps: { stateFile: StateFile; log: Logger }) {
  const { stateFile, log } = deps;
  const read = await readRegistryFile(stateFile);
  if (!read.ok) throw new StateFileInvalidError(`${read.problem} ${read.fix}`, { cause: read.cause });
  let committed = new Map((read.shards ?? []).map((shard) => [shard.id, shard]));
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
      const late = () => batch.filter((item) => item.answeredPending).length;
      try {
        await stateFile.write(serialiseShards(draft));
      } catch (err) {
        // Detail only: each caller gets the failure (a coded 503, which app.ts logs once a minute),
        // and the state file logs its directory turning unwritable, once.
        log.debug({ err, stateFile: stateFile.path, changes: batch.length }, 'Could not write the state file; the changes were refused and nothing stored was lost');
        const fix = (err as StateFileFailure).fix ?? 'Make the state directory writable (disk full? read-only volume? a mount that does not answer?) and retry.';
        const why = `writing the state file ${stateFile.path} failed (${(err as Error).message})`;
        const failure = new StateWriteFailedError(`The change was not stored: ${why}. Nothing already registered was lost. ${fix}`, { cause: err });
        sayLate(late(), 'were not stored after all: the write failed when it returned');
        for (const item of batch) settle(item, { stored: false, batchRefused: true }, failure);
        continue;
      }
      committed = draft;
      version += 1;
      sayLate(late(), 'are stored after all, where they changed anything (GET /shards)');
      batch.forEach((item, i) => settle(item, { stored: true, result: results[i] }));
    }
    writing = false;
  }

  /** Logs what became of changes whose callers were answered 503 pending. */
  function sayLate(changes: number, outcome: string): void {
    if (changes === 0) return;
    const msg = `A late write of the state file returned: the ${changes} change(s) answered 503 NODECOMPUTE_STATE_WRITE_PENDING meanwhile ${outcome}.`;
    log.info({ stateFile: stateFile.path, changes }, msg);
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

  /** The bound passed before the change was stored or refused: withdraws it if still queued, and answers its caller. */
  function answerLate(item: Queued): void {
    const index = queue.indexOf(item);
    const late = `${stateFile.timeoutMs} ms after it came, the state file ${stateFile.path}`;
    if (index !== -1) {
      queue.splice(index, 1);
      const why = `The change was not stored: ${late} was still being written for earlier changes (a hung network mount?). It was withdrawn; nothing changed.`;
      settle(item, { stored: false, batchRefused: false }, new StateWriteFailedError(`${why} Retry once GET /readyz passes.`));
      return;
    }
    item.answeredPending = true;
    const retry = 'Retry once GET /readyz passes; a repeat is safe (a repeated DELETE answering 404 means the first was stored).';
    const why = `The change is not acknowledged: ${late} had not finished writing it (a hung network mount?). It may yet be stored (see GET /shards).`;
    item.reject(new StateWritePendingError(`${why} ${retry}`));
  }

  /** Queues `change` for the next batch, answered as the header says; `settled` is told what became of it in any case. */
  function enqueue<T>(change: (draft: Map<string, ShardRecord>) => T, settled: (outcome: Settled<T>) => void): Promise<T> {
    const stuck = stateFile.stuck();
    if (stuck !== null) {
      // Refused at once, not after waiting out the bound behind a write that does not return.
      settled({ stored: false, batchRefused: false });
      const failed = `The change was not stored: the state file ${stateFile.path} cannot be written now (${stuck}). Nothing was changed.`;
      return Promise.reject(new StateWriteFailedError(`${failed} Retry once GET /readyz passes.`));
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
    list: (): ShardRecord[] => [...committed.values()],
    get: (id: string): ShardRecord | undefined => committed.get(id),
    /** Bumped on every acknowledged registration or removal: keys the per-snapshot views and ETags. */
    get version() {
      return version;
    },
    /** Bumped on every engine output: it changes verdicts, never attribution. */
    get engineVersion() {
      return engineVersion;
    },
    /** Whether put(record) would now be an unchanged repeat: then put it with `overlaps` null (NotARepeatError if no longer one). */
    repeats,
    /**
     * Registers or replaces a shard once the state file holds it; rejects with ShardConflictError (`overlaps`: what only /proc
     * can tell). `stored` is told once it is stored, even after its caller was answered 503 pending.
     */
    async put(
      record: ShardRecord,
      overlaps: Overlaps | null = () => null,
      stored: (result: PutResult) => void = () => undefined,
      precondition: Precondition = () => null,
    ): Promise<PutResult> {
      // With nothing queued, a repeat (a control plane reconciling; never a conflict, so registrations stored
      // before overlaps were refused still reconcile) or a conflict is answered at once; else the batch decides.
      if (queue.length === 0 && !writing) {
        const previous = committed.get(record.id);
        const failed = precondition(previous);
        if (failed !== null) throw new PreconditionFailedError(failed);
        if (previous !== undefined && repeats(record)) {
          const result = { created: false, shard: previous, graceKept: true, unchanged: true };
          stored(result);
          return result;
        }
        if (overlaps === null) throw new NotARepeatError(record.id);
        const conflict = conflicting(committed, record, overlaps);
        if (conflict !== undefined) throw conflictError(record, conflict);
      }
      const posted: { now: Posted } = { now: { tail: '', pending: NO_BYTES, tailStartedAtTicks: null } };
      let pending = inFlight.get(record.id);
      if (!pending) inFlight.set(record.id, (pending = new Set()));
      pending.add(posted);
      const outcome = await enqueue(
        (draft): { conflict: Conflict } | { notARepeat: true } | { failed: string } | Stored => {
          const previous = draft.get(record.id);
          const failed = precondition(previous);
          if (failed !== null) return { failed };
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
          if (!settled.stored || !('stored' in settled.result)) return;
          carryEngineOutput(record, settled.result.previous, posted.now);
          stored(putResult(settled.result));
        },
      );
      if ('notARepeat' in outcome) throw new NotARepeatError(record.id);
      if ('failed' in outcome) throw new PreconditionFailedError(outcome.failed);
      if ('conflict' in outcome) throw conflictError(record, outcome.conflict);
      return putResult(outcome);
    },
    /** False when it was not registered. Resolves once the state file agrees; `removed` is told then, as put's `stored`. */
    async remove(id: string, removed: () => void = () => undefined, precondition: Precondition = () => null): Promise<boolean> {
      // Nothing to write when the id is unknown and no change is pending that could add it.
      if (!committed.has(id) && queue.length === 0 && !writing) return false;
      // Refused by the shard as stored, as a PUT is: no write (a failing state file would make it a 503).
      const failed = committed.has(id) ? precondition(committed.get(id)) : null;
      if (failed !== null) throw new PreconditionFailedError(failed);
      let batchRefused = false;
      try {
        const outcome = await enqueue(
          (draft): boolean | { failed: string } => {
            // Not registered: 404 whatever the request's conditions (RFC 9110 13.2.1).
            const failed = draft.has(id) ? precondition(draft.get(id)) : null;
            return failed === null ? draft.delete(id) : { failed };
          },
          (settled) => {
            if (!settled.stored) batchRefused = settled.batchRefused;
            else if (settled.result === true) {
              if (engines.delete(id)) engineVersion += 1;
              removed();
            }
          },
        );
        if (typeof outcome === 'object') throw new PreconditionFailedError(outcome.failed);
        return outcome;
      } catch (err) {
        // Refused with its batch and not registered: "not registered". Withdrawn or pending: a write may still add it.
        if (!batchRefused || committed.has(id)) throw err;
        return false;
      }
    },
    engine: (id: string): EngineState | undefined => engines.get(id),
    /**
     * Appends a post (its bytes, or text) to the shard's tail (`fresh`: begins a new one) and re-reads the account; `ticks`: now,
     * since boot.
     */
    appendEngineOutput(id: string, output: Buffer | string, ticks: number | null, fresh = false) {
      const shard = committed.get(id);
      if (!shard) return undefined;
      const kept = engines.get(id);
      // Read once, on this shard's stream: what an in-flight PUT carries gets the same text and held bytes.
      const chunk = decodePost(kept, typeof output === 'string' ? Buffer.from(output) : output, fresh);
      const state = engineState(shard.engine, appended(kept, chunk, ticks, fresh));
      engines.set(id, state);
      engineVersion += 1;
      for (const posted of inFlight.get(id) ?? []) posted.now = appended(posted.now, chunk, ticks, fresh);
      return state;
    },
    /** PIDs and cgroups the next snapshot must read: not PIDs of shards of another boot than `bootId`, which name other processes now. */
    interest(bootId: string | null): { pids: number[]; cgroups: string[]; runnerHosts: RunnerHost[] } {
      const pids: number[] = [];
      const cgroups: string[] = [];
      const runnerHosts: RunnerHost[] = [];
      for (const shard of committed.values()) {
        const ollama = shard.engine === 'ollama';
        if (shard.cgroup !== null) {
          cgroups.push(shard.cgroup);
          if (ollama) runnerHosts.push({ cgroup: shard.cgroup });
        } else if (!ranInAnotherBoot(shard.identity, bootId)) {
          pids.push(shard.identity.pid);
          if (ollama) runnerHosts.push({ pid: shard.identity.pid });
        }
      }
      return { pids, cgroups, runnerHosts };
    },
  };
}
