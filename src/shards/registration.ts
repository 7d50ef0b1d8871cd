// Owns registering and removing shards: a registration is checked against /proc (a running process,
// no init or kernel thread; a cgroup with a running process) and the GPUs (each index exists; its UUID
// is kept), and refused (409) where another id covers its processes: the same process or cgroup, or,
// for a PID, an ancestor or descendant within ANCESTRY_DEPTH, or a process group one leads and the
// other is in. A repeat (a controller reconciling) is never a conflict and reads no other shard's /proc.
// A body's nulls read as absent and GET's read-only fields are dropped, so a shard read can be PUT back.
import type { Logger } from 'pino';
import { BadRequestError, NotAShardProcessError, PreconditionFailedError, ProcessNotFoundError, ProcUnreadableError, ShardNotFoundError, UnknownGpuError, UnknownMigDeviceError, isCodedError } from '../errors.js';
import { SANDBOX_COMMS } from '../node-state/attribution.js';
import { gpuNoLongerListed, LOST_GPU_MEANING, type LostGpu } from '../node-state/gpu-roster.js';
import type { NodeService } from '../node-state/node-view.js';
import { ANCESTRY_DEPTH, type NodeSnapshot } from '../node-state/node-snapshot.js';
import type { RegisterShard } from '../schemas/shards.js';
import { cgroupMatcher, hasExited, type ProcReader, type ProcStat } from '../system/procfs.js';
import { NotARepeatError, processOf, type Overlaps, type Precondition, type Registry } from './registry.js';
import type { StoredChange } from './shard-log.js';
import { ranInAnotherBoot, sameProcess, type Engine, type ProcessIdentity, type ShardRecord } from './shard.js';

/** What a registration names, read from /proc: its identity, and the registrations covering its processes (null: a repeat). */
type Target = { identity: ProcessIdentity; overlaps: Overlaps | null };

/** What attribution counts as a process's own besides itself: its nearest ancestors and its process group. */
type Lineage = { ancestors: ProcessIdentity[]; pgid: number };

const processKey = (identity: ProcessIdentity): string => `${identity.pid}@${identity.startTime}`;

/** What a registration sets: a null field is left out (GET writes an absent one as null), and GET's read-only fields are dropped. */
type Settings = { pid?: number; cgroup?: string; gpus: number[]; migDevices?: string[]; engine?: Engine; graceMs?: number; minGpuWeightsShare?: number };

function settingsOf(body: RegisterShard): Settings {
  const { pid, cgroup, gpus, migDevices, engine, graceMs, minGpuWeightsShare } = body;
  return { pid: pid ?? undefined, cgroup: cgroup ?? undefined, gpus, migDevices: migDevices ?? undefined, engine, graceMs, minGpuWeightsShare: minGpuWeightsShare ?? undefined };
}

const INIT_PID = 1; // the ancestor of every process (in a container's PID namespace, its main process)
const KTHREADD_PID = 2; // every kernel thread is it or its child
const PID_AND_CGROUP = 'Give either "pid" or "cgroup", not both: a shard is one process group or one cgroup.';
const MIG_WITHOUT_GPUS = '"migDevices" names MIG devices but "gpus" is empty: add the index of each one\'s GPU to "gpus" (GET /gpus lists each GPU\'s migDevices).';
const NO_TARGET = 'Give "pid" (the host PID of the shard\'s main process) or "cgroup" (its container id or pod UID).';

export interface RegistrationDeps {
  registry: Registry;
  node: NodeService;
  proc: ProcReader;
  defaultGraceMs: number;
  log: Logger;
  now: () => number;
  /** Told after a change is stored (even one whose caller was answered 503 pending). */
  onStored: (id: string, change: StoredChange) => void;
}

export function createRegistration(deps: RegistrationDeps) {
  const { registry, node, proc, log, now } = deps;

  const identityOf = (stat: ProcStat): ProcessIdentity => {
    const bootId = proc.bootId();
    return { pid: stat.pid, pgid: stat.pgrp, startTime: stat.startTime, name: stat.comm, ...(bootId === null ? {} : { bootId }) };
  };

  async function identityOfPid(pid: number): Promise<{ identity: ProcessIdentity; ppid: number }> {
    const stat = await proc.readStat(pid);
    if (!stat) {
      const hostPid = "a containerised nodecompute needs the host's PID namespace (--pid=host / hostPID: true) to see it";
      throw new ProcessNotFoundError(`No process with PID ${pid} exists in ${proc.root}. Register the shard's host PID while it runs; ${hostPid}.`);
    }
    if (hasExited(stat)) {
      throw new ProcessNotFoundError(`Process ${pid} (${stat.comm}) has already exited: it is a zombie its parent has not reaped. Register the engine's live process (restart it if it crashed).`);
    }
    const tgid = await proc.readTgid(pid);
    if (tgid !== null && tgid !== pid) {
      throw new NotAShardProcessError(
        `PID ${pid} in ${proc.root} is a thread (${stat.comm}) of process ${tgid}, not a process: the GPU driver lists processes, never their threads, so its memory would never be found. Register process ${tgid}.`,
      );
    }
    if (stat.pid === INIT_PID) {
      const crictl = "`crictl inspect --output go-template --template '{{.info.pid}}' CONTAINER_ID` on the node";
      throw new NotAShardProcessError(
        `PID 1 in ${proc.root} is init (${stat.comm}), not a shard: every process on the node descends from it, so as a shard it would claim ` +
          "other workloads' GPU memory. " +
          `A container's PID 1? Register its host PID (\`docker inspect -f '{{.State.Pid}}' CONTAINER\`, or ${crictl}), ` +
          'or register the pod by its cgroup ("cgroup": `kubectl get pod POD -o jsonpath=\'{.metadata.uid}\'`).',
      );
    }
    if (stat.pid === KTHREADD_PID || stat.ppid === KTHREADD_PID) {
      const fix = "register the host PID (`docker inspect -f '{{.State.Pid}}' CONTAINER`) or the shard by its cgroup";
      throw new NotAShardProcessError(`PID ${pid} in ${proc.root} is the kernel thread ${stat.comm}, not a shard. A PID as a container sees it? ${fix}.`);
    }
    return { identity: { ...identityOf(stat), pid }, ppid: stat.ppid };
  }

  /** Which registrations cover one of `held` though their target differs: a PID shard of one of them, or a cgroup one runs in. */
  async function overlapsWith(held: ProcessIdentity[], ofCgroup: boolean): Promise<Overlaps> {
    const cgroups = (await Promise.all(held.map((identity) => proc.readCgroup(identity.pid)))).map((paths) => paths ?? []);
    return (other) => {
      if (other.cgroup === null) return held.some((identity) => sameProcess(other.identity, identity)) ? `holds process ${processOf(other)}` : null;
      if (!cgroups.some(cgroupMatcher(other.cgroup))) return null;
      return `${ofCgroup ? 'shares processes with' : 'runs in'} the cgroup "${other.cgroup}"`;
    };
  }

  /** Another process's stat for a conflict check; undefined when unreadable, which must not fail this registration. */
  const statIfReadable = (pid: number): Promise<ProcStat | null | undefined> => proc.readStat(pid).catch(() => undefined);

  /** The nearest ANCESTRY_DEPTH ancestors of a process whose parent is `ppid`, read now. */
  async function ancestorsFrom(ppid: number): Promise<ProcessIdentity[]> {
    const ancestors: ProcessIdentity[] = [];
    for (let next = ppid; next > 0 && ancestors.length < ANCESTRY_DEPTH; ) {
      const parent = await statIfReadable(next);
      if (!parent) break;
      ancestors.push(identityOf(parent));
      next = parent.ppid;
    }
    return ancestors;
  }

  /** A registered PID shard's lineage now: null when its process no longer runs; undefined when unreadable. */
  async function lineageOf(identity: ProcessIdentity): Promise<Lineage | null | undefined> {
    const stat = await statIfReadable(identity.pid);
    if (stat === undefined) return undefined;
    if (stat === null || stat.startTime !== identity.startTime || hasExited(stat)) return null;
    return { ancestors: await ancestorsFrom(stat.ppid), pgid: stat.pgrp };
  }

  /**
   * A process to register. A PID shard also covers it when one descends from the other (within ANCESTRY_DEPTH) or is in the
   * group the other leads: attribution would give the second one's memory to the first. Siblings in a group do not.
   */
  async function targetOfPid(pid: number, repeats: (identity: ProcessIdentity) => boolean): Promise<Target> {
    const { identity, ppid } = await identityOfPid(pid);
    if (repeats(identity)) return { identity, overlaps: null };
    const others = registry.list().filter((shard) => shard.cgroup === null && !ranInAnotherBoot(shard.identity, proc.bootId()));
    const [ancestors, lineages] = await Promise.all([
      ancestorsFrom(ppid),
      Promise.all(others.map(async (shard) => [processKey(shard.identity), await lineageOf(shard.identity)] as const)),
    ]);
    const lineageByProcess = new Map(lineages);
    const sameOrCgroup = await overlapsWith([identity], false);
    return {
      identity,
      overlaps: (other) => {
        const plain = sameOrCgroup(other);
        if (plain !== null || other.cgroup !== null || ranInAnotherBoot(other.identity, proc.bootId())) return plain;
        // Keyed by process, not id: an id replaced since by another process was not read.
        const theirs = lineageByProcess.get(processKey(other.identity));
        if (theirs === null) return null; // gone since: its PID and group number may be another's now
        const process = `process ${processOf(other)}`;
        if (ancestors.some((ancestor) => sameProcess(other.identity, ancestor))) return `descends from ${process}`;
        if (theirs?.ancestors.some((ancestor) => sameProcess(identity, ancestor))) return `is an ancestor of ${process}`;
        const theirGroup = theirs?.pgid ?? other.identity.pgid;
        if (theirGroup === other.identity.pid && identity.pgid === theirGroup) return `is in the process group ${process} leads`;
        if (identity.pgid === identity.pid && theirGroup === identity.pid) return `leads the process group ${process} is in`;
        return null;
      },
    };
  }

  /** A cgroup to register: its identity is its oldest running process that is not the pod's sandbox. */
  async function targetOfCgroup(cgroup: string): Promise<Target> {
    const pids = (await proc.findPidsInCgroup(cgroup)).sort((a, b) => a - b);
    const held: ProcessIdentity[] = [];
    for (const pid of pids) {
      const stat = await proc.readStat(pid);
      if (stat && !hasExited(stat)) held.push({ ...identityOf(stat), pid });
    }
    const engines = held.filter((identity) => !SANDBOX_COMMS.has(identity.name));
    // A stable sort: of engine processes started in the same tick, the lowest PID.
    engines.sort((a, b) => a.startTime - b.startTime);
    const chosen = engines[0] ?? held[0];
    if (chosen !== undefined) return { identity: chosen, overlaps: await overlapsWith(held, true) };
    const give = 'Give the container id or pod UID as /proc/PID/cgroup shows it (with "-" or "_" as the cgroup driver writes it), once the container runs';
    throw new ProcessNotFoundError(`No process in ${proc.root} has a cgroup containing "${cgroup}". ${give}.`);
  }

  /** A /proc that cannot be read (permissions, a bad mount) is the node's problem: 503. */
  const readable = <T>(reading: Promise<T>): Promise<T> =>
    reading.catch((err: unknown) => {
      if (isCodedError(err)) throw err;
      throw new ProcUnreadableError(`The registration was not stored: ${(err as Error).message} Run \`nodecompute doctor\` on this node.`, { cause: err });
    });

  /** Each GPU index exists, with its UUID; taken on trust while nvidia-smi cannot be asked (`unchecked`: why). `kept`: a repeat's devices. */
  async function checkGpus(gpus: number[], kept: string[] | undefined, migDevices: readonly string[]): Promise<{ unchecked: string | null; uuids?: string[] }> {
    if (gpus.length === 0) return { unchecked: null, uuids: [] };
    let snapshot: NodeSnapshot;
    try {
      snapshot = (await node.current()).view.snapshot;
    } catch (err) {
      if (!isCodedError(err)) throw err;
      return kept === undefined ? { unchecked: err.message } : { unchecked: null, uuids: kept };
    }
    const known = snapshot.gpus.map((gpu) => gpu.index);
    const unknown = gpus.filter((index) => !known.includes(index));
    const uuids = kept ?? (unknown.length === 0 ? gpus.map((index) => snapshot.gpus.find((gpu) => gpu.index === index)!.uuid) : undefined);
    if (uuids !== undefined) {
      checkMigDevices(snapshot, uuids, migDevices);
      return { unchecked: null, uuids };
    }
    // The GPUs asked for that were lost first; another lost GPU renumbers those after it, most likely the one asked for.
    const asked = (gpu: LostGpu) => unknown.includes(gpu.index);
    const moved = ", and the GPUs after it usually moved down one index. GET /gpus gives each GPU's index and UUID now.";
    const notes = [...snapshot.lostGpus.filter(asked), ...snapshot.lostGpus.filter((gpu) => !asked(gpu))].map((gpu) => {
      const said = asked(gpu) ? `: ${LOST_GPU_MEANING}` : moved;
      return ` ${gpuNoLongerListed(gpu)} since ${new Date(gpu.lostAt).toISOString()}${said}`;
    });
    const has = `it has GPU ${known.join(', ')} (as the GPU driver numbers them)`;
    throw new UnknownGpuError(`GPU ${unknown.join(', ')} does not exist on this node; ${has}.${notes.join('')} Fix "gpus" in the registration.`);
  }

  /** Each MIG device is one of the given GPUs' where the backend lists them (NVML); nvidia-smi's cannot say, so they are taken on trust. */
  function checkMigDevices(snapshot: NodeSnapshot, uuids: readonly string[], migDevices: readonly string[]): void {
    if (migDevices.length === 0 || snapshot.gpus.every((gpu) => gpu.migDevices === undefined)) return;
    for (const mig of migDevices) {
      const parent = snapshot.gpus.find((gpu) => gpu.migDevices?.some((device) => device.uuid === mig));
      if (parent !== undefined && uuids.includes(parent.uuid)) continue;
      const listed = snapshot.gpus.flatMap((gpu) => (gpu.migDevices ?? []).map((device) => `${device.uuid} (${device.profile}, GPU ${gpu.index})`));
      const has = listed.length === 0 ? 'this node has no MIG device' : `its MIG devices are ${listed.join(', ')}`;
      const where = parent === undefined ? `MIG device ${mig} does not exist on this node; ${has}` : `MIG device ${mig} is on GPU ${parent.index}, which is not in "gpus"`;
      throw new UnknownMigDeviceError(`${where}. Fix "migDevices" (or "gpus") in the registration; GET /gpus lists each GPU's migDevices.`);
    }
  }

  /** A PUT that repeats this id's GPUs means the devices the registration kept, whatever their indices now: their UUIDs. */
  function repeatedUuids(id: string, gpus: number[]): string[] | undefined {
    const before = registry.get(id);
    if (before?.gpuUuids === undefined || before.gpus.length !== gpus.length || !gpus.every((index) => before.gpus.includes(index))) return undefined;
    return gpus.map((index) => before.gpuUuids![before.gpus.indexOf(index)]!);
  }

  return {
    /** `precondition`: judged before /proc is read, and again when the change is decided. */
    async register(id: string, given: RegisterShard, precondition: Precondition = () => null): Promise<{ created: boolean; shard: ShardRecord }> {
      if (given.id !== undefined && given.id !== id) {
        throw new BadRequestError(`The body's "id" is "${given.id}" but the path names shard "${id}": a body read from one shard is not PUT to another. Remove "id", or PUT it to /shards/${given.id}.`);
      }
      const failed = precondition(registry.get(id));
      if (failed !== null) throw new PreconditionFailedError(failed);
      const body = settingsOf(given);
      if ((body.pid !== undefined) === (body.cgroup !== undefined)) throw new BadRequestError(body.pid !== undefined ? PID_AND_CGROUP : NO_TARGET);
      if (body.migDevices !== undefined && body.gpus.length === 0) throw new UnknownMigDeviceError(MIG_WITHOUT_GPUS);
      const recordOf = (identity: ProcessIdentity, gpuUuids: string[] | undefined): ShardRecord => ({
        id,
        pid: body.pid ?? null,
        cgroup: body.cgroup ?? null,
        gpus: [...body.gpus],
        ...(gpuUuids === undefined ? {} : { gpuUuids }),
        ...(body.migDevices === undefined ? {} : { migDevices: [...body.migDevices] }),
        engine: body.engine ?? 'other',
        graceMs: body.graceMs ?? deps.defaultGraceMs,
        ...(body.minGpuWeightsShare === undefined ? {} : { minGpuWeightsShare: body.minGpuWeightsShare }),
        registeredAt: now(),
        identity,
      });
      const kept = repeatedUuids(id, body.gpus);
      const target = (repeats: (identity: ProcessIdentity) => boolean) =>
        readable(body.pid !== undefined ? targetOfPid(body.pid, repeats) : targetOfCgroup(body.cgroup as string));
      const [read, { unchecked, uuids }] = await Promise.all([target((identity) => registry.repeats(recordOf(identity, kept))), checkGpus(body.gpus, kept, body.migDevices ?? [])]);
      const put = ({ identity, overlaps }: Target) => registry.put(recordOf(identity, uuids), overlaps, (stored) => deps.onStored(id, { put: stored }), precondition);
      const { created, shard, unchanged } = await put(read).catch(async (err: unknown) => {
        if (!(err instanceof NotARepeatError)) throw err;
        // Read as a repeat, the id was removed or changed before it was decided: judged in full now.
        return put(await target(() => false));
      });
      if (unchecked !== null && !unchanged) {
        const msg = `Shard "${id}" was stored with GPU ${shard.gpus.join(', ')} unchecked (the GPU driver cannot be asked): check them in GET /gpus later.`;
        log.warn({ shard: id, gpus: shard.gpus, nvidiaSmi: unchecked }, msg);
      }
      return { created, shard };
    },

    async remove(id: string, precondition: Precondition = () => null): Promise<void> {
      if (!(await registry.remove(id, () => deps.onStored(id, { removed: true }), precondition))) {
        throw new ShardNotFoundError(`No shard "${id}" is registered on this node (an earlier DELETE may have removed it); GET /shards lists them.`);
      }
    },
  };
}
