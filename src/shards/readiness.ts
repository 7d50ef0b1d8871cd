// Owns the readiness verdict of a shard, the answer a Kubernetes probe acts on:
//   ready      alive and holding memory on every GPU it was given (or given none);
//   starting   alive, some GPU not held yet, still within its grace window (nvidia-smi lags
//              behind a process that just created its CUDA context); or, while nvidia-smi cannot
//              be asked, not seen holding its GPUs by any listing since it was registered (or
//              since its engine started again);
//   on-cpu     grace over and some GPU still not held, or the engine itself says it runs on the CPU
//              (for a cgroup shard, engine output posted before every one of its running processes
//              started describes an earlier run of its container: it is set aside, with a warning);
//              the reason follows what is known beyond the missing memory: memory held on a GPU it
//              was not given, engine output showing weights on a CUDA device (which contradicts
//              nvidia-smi, so what to check is the process and the device mapping, not the
//              backend), output that says nothing, or none posted; when the engine says CPU, on
//              whether its GPU backend loaded (no layers: -ngl; not loaded: the build) and whether
//              memory its processes hold contradicts it (then the output is another run's);
//   gpu-lost   a GPU it was given is no longer listed by nvidia-smi (fallen off the bus, reset or
//              detached), or nvidia-smi says it cannot reach it (a failed query naming the GPU by bus
//              id, "GPU is lost", which the last good listing maps to the GPU; it holds past
//              max-stale too): no engine, build or mapping can
//              compute on it, so the GPU is what to fix,
//              at once (no grace: waiting cannot bring it back) and whatever else is true of the
//              engine (an engine that says CPU is a warning, which counts once it has GPUs again);
//              it comes before starting, on-cpu and unverified, since it rests on the GPU list alone;
//   stopped    its process is stopped (state T: SIGSTOP, or SIGTSTP from Ctrl-Z in its terminal; t:
//              halted by a debugger or tracer; for a cgroup shard, every process of it that has not
//              exited, the pod's sandbox aside; or a process of it that holds its GPU memory, a
//              worker whose stop stalls every request): it keeps its GPU memory but answers no request.
//              Whatever else is true, nothing is served, so it comes before gpu-lost, starting, on-cpu
//              and unverified; what would still count once it runs again (a given GPU it holds nothing
//              on, an engine that says CPU) is a warning, as is nvidia-smi failing to say what it holds;
//   exited     its process is gone or its PID was reused (for a cgroup shard: no process is left,
//              or only the pod's sandbox, whose engine container exited); it comes before stopped
//              (its PID reused by a process that is stopped is exited);
//   unverified nvidia-smi cannot be asked (and its last good listing showed the shard ready, or an
//              earlier run of nodecompute registered it), its processes are hidden from it or their PIDs are not
//              visible in this /proc, or the shard's own /proc stat could not be read this
//              refresh: no evidence either way, so the shard keeps serving and the answer carries
//              a warning.
// Neither an exit, a stop nor the engine's own CPU account depends on nvidia-smi: while it cannot be
// asked, /proc (read by the failed refresh, see node-service.ts) still makes a shard exited or
// stopped, and the engine's account still makes it on-cpu. What nvidia-smi alone can show holds
// against a shard, never for it (lastListingVerdict): a shard its last good listing showed ready is
// unverified, and one it showed starting, on-cpu or gpu-lost, or never saw, is not ready.
// A shard is judged on the devices its registration named, under the index nvidia-smi gives each now
// (node-state/placement.ts): after nvidia-smi renumbers the GPUs, a warning says so.
// Reasons are written for the operator who reads the probe's failure in `kubectl describe pod`.
import { formatDuration } from '../duration.js';
import { sameProcessNow, stoppedSinceListing, type Liveness } from '../node-state/attribution.js';
import { gpuNoLongerListed, gpuUnreachable, LOST_GPU_FIX, LOST_GPU_MEANING, saidOfBusId, UNREACHABLE_GPU_MEANING } from '../node-state/gpu-roster.js';
import type { NodeView } from '../node-state/node-view.js';
import { placementOf, unreachableGiven, type Renumbered, type UnlistedGpu, type UnreachableKnownGpu, type UnreachableListedGpu } from '../node-state/placement.js';
import { deviceLabel } from './compute.js';
import type { EngineAccount } from './llama-account.js';
import { showsGpuWeights } from './llama-log.js';
import type { StatAnswer, UnreadableStat } from '../system/procfs.js';
import type { ShardRecord } from './shard.js';

export const READINESS_STATES = ['ready', 'starting', 'on-cpu', 'gpu-lost', 'stopped', 'exited', 'unverified'] as const;
export type ReadinessState = (typeof READINESS_STATES)[number];

/**
 * What decided a verdict, for programs (the reason says it for people), one code per decision below;
 * null when ready. A control plane acts on these: on-cpu by a build or a driver (the engine's GPU
 * backend failed) is not fixed by a restart, one without GPU layers is fixed by the engine's flags.
 */
export const VERDICT_CAUSES = [
  // starting
  'awaiting-snapshot', // no snapshot since the registration includes it yet, within its grace
  'awaiting-nvidia-smi', // nvidia-smi cannot be asked, and no listing has shown it on its GPUs since it was registered (or its engine started again)
  'awaiting-gpu-memory', // some GPU not held yet, within its grace
  'awaiting-listing', // grace over, but the latest listing was begun before it ended
  // on-cpu
  'engine-gpu-backend-failed', // the engine says CPU: its GPU backend did not load
  'engine-no-gpu-layers', // the engine says CPU: its GPU backend loaded, with no layers on the GPU
  'engine-reports-cpu', // the engine says CPU, without saying whether its GPU backend loaded
  'memory-on-other-gpu', // no memory on a GPU it was given, memory on one it was not
  'engine-output-conflicts', // no memory on a GPU it was given, while its engine output shows weights on a GPU
  'no-gpu-memory', // no memory on a GPU it was given, grace over
  // gpu-lost
  'gpu-not-listed', // a GPU it was given is no longer listed by nvidia-smi
  'gpu-unreachable', // nvidia-smi fails, saying it cannot reach a GPU it was given ("GPU is lost")
  // stopped
  'process-stopped', // its process, every process of its cgroup, or a process holding its GPU memory is stopped
  // exited
  'process-exited', // its process is gone (or a zombie, or its PID reused; a cgroup with no engine left)
  // unverified
  'nvidia-smi-unavailable', // nvidia-smi cannot be asked
  'processes-hidden', // nvidia-smi's processes cannot be matched to this /proc
  'stat-unreadable', // the shard's own /proc stat (a cgroup shard's: which processes are in it) could not be read this refresh
  'gpu-owner-unknown', // a GPU it misses holds memory of a process whose owner could not be read
  'not-in-snapshot', // grace over, and no snapshot since the registration includes it yet
] as const;
export type VerdictCause = (typeof VERDICT_CAUSES)[number];

export interface Readiness {
  ready: boolean;
  state: ReadinessState;
  /** What decided the verdict (VERDICT_CAUSES); null when ready. */
  cause: VerdictCause | null;
  reason: string | null;
  warnings: string[];
}

export interface ReadinessInput {
  shard: ShardRecord;
  /** Null when nvidia-smi cannot be asked; `unavailable` then says why. */
  node: NodeView | null;
  unavailable?: string;
  /**
   * The GPUs nvidia-smi said it cannot reach when the latest refresh failed (NodeService.unreachable);
   * absent or empty when none. With `node` given, that node is the last good snapshot, served stale.
   */
  unreachable?: readonly UnreachableListedGpu[];
  /**
   * Only when `node` is null: the shard's liveness from /proc, read without nvidia-smi (absent or
   * undefined when there is none).
   */
  liveness?: Liveness | undefined;
  /**
   * Only when `node` is null: the last good snapshot, however old (its node view, and when its refresh
   * began); absent or null when no refresh of this run of nodecompute has succeeded.
   */
  lastGood?: { node: NodeView; startedAt: number; observedAt: number } | null;
  /**
   * Only when `node` is null: when this run of nodecompute began judging shards. One registered
   * before it may have been seen ready by an earlier run; absent, every shard counts as such.
   */
  judgingSince?: number;
  /**
   * Only when `node` is null: the stats the failed refresh read (ProcOnly.proc), of the shards'
   * processes and of the last good snapshot's GPU processes; absent when it read none.
   */
  procNow?: ReadonlyMap<number, StatAnswer>;
  /**
   * With `node` given: the shard's liveness as /proc says it now, to judge by instead of the one that
   * snapshot read (when `node` is a last good snapshot judged past max-stale).
   */
  livenessNow?: Liveness;
  /** Why the snapshot is stale, when that is worth a warning (the last refresh failed, or nvidia-smi is slow). */
  staleReason: string | null;
  engine: EngineAccount | null;
  /**
   * Whether engine output was posted for the shard (and is kept): with `engine` null, it then says
   * nothing about where the engine computes. Absent: none was.
   */
  enginePosted?: boolean;
  /**
   * When the engine output behind `engine` was last posted, in clock ticks since boot (the unit of
   * /proc start times); absent or null when unknown, and then the account is taken as current.
   */
  engineTicks?: number | null;
  now: number;
  /**
   * When the snapshot behind `node` began to be read (SnapshotView.startedAt); absent, the evidence
   * counts as taken now. The grace window is judged by it: a listing nvidia-smi began inside the
   * grace cannot show that the shard failed to take its GPU after it.
   */
  evidenceAt?: number;
}

function gpuList(indices: number[]): string {
  const names = indices.map((index) => `GPU ${index}`);
  if (names.length <= 1) return names.join('');
  return `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;
}

const ON_CPU_ADVICE =
  "Check the engine's build and libraries (ldd on libggml-cuda.so for llama.cpp), CUDA_VISIBLE_DEVICES and the container's GPU runtime, or run `nodecompute doctor` on this node.";

function verdict(state: ReadinessState, cause: VerdictCause | null, reason: string | null, warnings: string[]): Readiness {
  return { ready: state === 'ready' || state === 'unverified', state, cause, reason, warnings };
}

/** The cause of an on-cpu verdict the engine's own account decides, by whether its GPU backend loaded. */
function engineCpuCause(engine: EngineAccount): VerdictCause {
  if (engine.gpuBackendLoaded === true) return 'engine-no-gpu-layers';
  return engine.gpuBackendLoaded === false ? 'engine-gpu-backend-failed' : 'engine-reports-cpu';
}

/** The on-cpu verdict the engine's own account decides. */
function engineCpuVerdict(shard: ShardRecord, engine: EngineAccount, node: NodeView | null, warnings: string[]): Readiness {
  return verdict('on-cpu', engineCpuCause(engine), engineCpuReason(shard, engine, node), warnings);
}

function engineSaysCpu(engine: EngineAccount | null): engine is EngineAccount {
  return engine !== null && engine.backend === 'CPU';
}

function placedOnCpu(shard: ShardRecord): string {
  return `placed on ${gpuList(shard.gpus)} but computing on the CPU`;
}

const GPU_LAYERS_ADVICE =
  'start it with its model layers on the GPU (llama.cpp: -ngl / --n-gpu-layers, or LLAMA_ARG_N_GPU_LAYERS; a number at least the model\'s layer count puts them all there).';

/** What to do about an engine that says CPU, by whether its GPU backend loaded (true, false, or not known). */
function engineCpuAdvice(loaded: boolean | null): string {
  if (loaded === true) return `Its GPU backend loaded, but no model layers were put on the GPU: ${GPU_LAYERS_ADVICE}`;
  if (loaded === false) return `Its GPU backend did not load. ${ON_CPU_ADVICE}`;
  return `Either its GPU backend did not load or it was started without GPU layers (-ngl / --n-gpu-layers). ${ON_CPU_ADVICE}`;
}

/** The memory the shard's processes hold on the GPUs it was given, as device labels; empty without a node view. */
function heldOnGiven(shard: ShardRecord, node: NodeView | null): string[] {
  const holdings = node?.attribution.holdings.get(shard.id);
  if (holdings === undefined) return [];
  return [...holdings.values()]
    .filter((holding) => shard.gpus.includes(holding.index))
    .sort((a, b) => a.index - b.index)
    .map(deviceLabel);
}

/**
 * The engine says CPU. A run whose GPU backend loaded holds its CUDA context and compute buffers on
 * the GPU without a single layer there, so memory held is no proof against it (and, where the output
 * does not say whether the backend loaded, that memory shows it did); but memory held by an engine
 * that found no usable GPU contradicts its output, and then the advice is about the output (another
 * run's), not the build.
 */
function engineCpuReason(shard: ShardRecord, engine: EngineAccount, node: NodeView | null): string {
  const says = `${placedOnCpu(shard)}: the engine itself reports it. ${engine.summary}.`;
  const held = heldOnGiven(shard, node);
  const post = `/shards/${shard.id}/engine-output`;
  if (held.length === 0) return `${says} ${engineCpuAdvice(engine.gpuBackendLoaded)}`;
  const holding = `nvidia-smi lists its processes holding ${held.join(', ')}`;
  if (engine.gpuBackendLoaded === false) {
    return (
      `${says} Yet ${holding}, which an engine that found no usable GPU cannot hold: the output posted is most likely another run's (or another engine's). ` +
      `Post this run's output (llama.cpp at -lv 4) to ${post}: the verdict follows the latest run in it. GET /gpus shows which of the shard's processes hold that memory.`
    );
  }
  return (
    `${says} ${holding}: a run without GPU layers holds its CUDA context and compute buffers there too. ${engineCpuAdvice(true)} ` +
    `If that memory is more than those (the size of the weights), the output posted is another run's: post this run's to ${post}; the verdict follows the latest run in it.`
  );
}

/** Why there is no engine account to judge by: nothing posted, output that says nothing, or an earlier run's output set aside. */
type NoAccount = 'not-posted' | 'silent' | 'earlier-run';

/** GPUs the shard's processes hold memory on without having been given them, in index order. */
function strayGpus(shard: ShardRecord, node: NodeView): number[] {
  const holdings = node.attribution.holdings.get(shard.id);
  return [...(holdings?.keys() ?? [])].filter((index) => !shard.gpus.includes(index)).sort((a, b) => a - b);
}

/** The engine's CUDA device names ("CUDA0"), as its account lists them. */
function cudaNames(engine: EngineAccount): string {
  const names = engine.devices.map((device) => device.split(':')[0] as string);
  if (names.length === 0) return 'its CUDA devices';
  return names.length === 1 ? (names[0] as string) : `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;
}

/** How the process computing can lie outside what the shard covers: its PID (and process group), or its cgroup. */
function notCovered(shard: ShardRecord): string {
  return shard.cgroup === null
    ? "a child started in another process group, or the wrong PID registered: register the engine's own PID, or the pod by its cgroup"
    : `a process outside cgroup "${shard.cgroup}": register the pod or container the engine runs in`;
}

/** Memory on a GPU it was not given: the GPU backend loaded, on devices other than its placement. */
function strayReason(shard: ShardRecord, strays: number[], held: string): string {
  return (
    `placed on ${gpuList(shard.gpus)}; it holds memory on ${gpuList(strays)}, which it was not given, and ${held} ` +
    `Its GPU backend loaded (a CUDA context at least) on a GPU it was not given: CUDA_VISIBLE_DEVICES or the container's GPU runtime gives it ${gpuList(strays)}. ` +
    'Check them (CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi by PCI bus; GPU UUIDs avoid the difference), ' +
    'or register the shard with the GPUs it uses.'
  );
}

/** Engine output showing weights on a CUDA device, while nvidia-smi lists none of the shard's memory on its GPUs. */
function conflictReason(shard: ShardRecord, missing: number[], engine: EngineAccount, held: string): string {
  const devices = cudaNames(engine);
  return (
    `placed on ${gpuList(shard.gpus)}, but ${held}, although the engine output posted to /shards/${shard.id}/engine-output says ${engine.summary} (${engine.evidence}). ` +
    `Both cannot be true of the same process: the engine did put its weights on a GPU, but not as a process of this shard on ${gpuList(missing)}, or that output is from another run. ` +
    `Find that memory in GET /gpus, which lists each GPU's processes and the shard each belongs to: under no shard, the engine runs in a process this shard does not cover (${notCovered(shard)}); ` +
    `on another GPU, CUDA_VISIBLE_DEVICES (or the container's GPU runtime) maps ${devices} to that GPU, not to ${gpuList(missing)}; ` +
    `nowhere, the output posted is another run's: post this run's to /shards/${shard.id}/engine-output.`
  );
}

/** What the engine output says, or why there is none, for a reason that found no memory of the shard on some GPU. */
function engineNote(shard: ShardRecord, engine: EngineAccount | null, noAccount: NoAccount): string {
  const post = `/shards/${shard.id}/engine-output`;
  if (engine !== null) {
    return (
      `The engine output posted says ${engine.summary}. ` +
      `Post its output through model loading (llama.cpp at -lv 4 prints its "CUDA<n> model buffer size" lines) to ${post}, ` +
      `and find the engine's memory in GET /gpus, which lists each GPU's processes and the shard each belongs to: under no shard, or on another GPU, ` +
      `the engine runs in a process this shard does not cover (${notCovered(shard)}) or CUDA_VISIBLE_DEVICES maps ${cudaNames(engine)} to another GPU.`
    );
  }
  const backend = 'Its GPU backend probably did not load.';
  if (shard.engine !== 'llama.cpp') return `${backend} ${ON_CPU_ADVICE}`;
  if (noAccount === 'silent') {
    return (
      `${backend} The output posted to ${post} says nothing about where llama.cpp computes: ` +
      `post its log at -lv 4 (llama.cpp b9829 and later names its devices and buffers only then). ${ON_CPU_ADVICE}`
    );
  }
  if (noAccount === 'earlier-run') {
    return `${backend} The engine output posted is an earlier run's (see the warnings): post this run's (llama.cpp at -lv 4) to ${post} to see what it saw. ${ON_CPU_ADVICE}`;
  }
  return `${backend} Post the engine's log (llama.cpp at -lv 4) to ${post} to see what it saw. ${ON_CPU_ADVICE}`;
}

function onCpuVerdict(
  shard: ShardRecord,
  missing: number[],
  node: NodeView,
  evidenceAt: number,
  engine: EngineAccount | null,
  noAccount: NoAccount,
  warnings: string[],
): Readiness {
  // Dated by the listing that shows it, not by the request: with a slow nvidia-smi they differ.
  const held = `its processes hold no memory on ${gpuList(missing)}, ${formatDuration(evidenceAt - shard.registeredAt)} after registration (grace ${formatDuration(shard.graceMs)})`;
  const strays = strayGpus(shard, node);
  if (strays.length > 0) return verdict('on-cpu', 'memory-on-other-gpu', strayReason(shard, strays, `${held}.`), warnings);
  if (engine !== null && showsGpuWeights(engine)) return verdict('on-cpu', 'engine-output-conflicts', conflictReason(shard, missing, engine, held), warnings);
  return verdict('on-cpu', 'no-gpu-memory', `${placedOnCpu(shard)}: ${held}. ${engineNote(shard, engine, noAccount)}`, warnings);
}

/** One unlisted GPU, as the roster knows it (what it was and since when it is missing), or as not known to this run. */
function unlistedGpu({ index, uuid }: UnlistedGpu, node: NodeView): string {
  const lost = node.snapshot.lostGpus.find((gpu) => (uuid === undefined ? gpu.index === index : gpu.uuid === uuid));
  if (lost !== undefined) {
    const said = lost.said === undefined ? '' : `; ${saidOfBusId(lost.busId, lost.said)}`;
    return `${gpuNoLongerListed({ ...lost, index })} (missing since ${new Date(lost.lostAt).toISOString()}${said})`;
  }
  if (uuid !== undefined) return `GPU ${index} (${uuid}) is not listed by nvidia-smi (it was already missing when nodecompute started)`;
  return (
    `GPU ${index} is not listed by nvidia-smi (it was already missing when nodecompute started, nvidia-smi numbers the GPUs differently since a GPU went, ` +
    'or the registration, taken on trust while nvidia-smi could not be asked, names a GPU this node does not have)'
  );
}

/** A given GPU nvidia-smi lists under another index now, as a warning: the verdict follows the device. */
function renumberedWarning({ registered, now, uuid }: Renumbered): string {
  return (
    `GPU ${registered} as registered (${uuid}) is GPU ${now} now: nvidia-smi renumbered the GPUs after one went, and this shard is judged on GPU ${now}, the same device. ` +
    `An engine restarted with GPUs named by index (CUDA_VISIBLE_DEVICES=${registered}) would land on another device: name them by UUID, or PUT the shard with its new gpus`
  );
}

/**
 * The verdict of a shard placed on a GPU nvidia-smi no longer lists, or says it cannot reach: the
 * GPU is what to fix, and meanwhile the shard needs other GPUs. It rests on the GPU list alone (no
 * time in it, so it is cached like a ready verdict); an engine that says CPU is a warning, for once
 * it has GPUs again. `gone`: the given GPUs no longer listed, as unlistedGpu says them.
 */
function gpuLostVerdict(
  shard: ShardRecord,
  gone: readonly string[],
  unreachable: readonly UnreachableKnownGpu[],
  asRegistered: boolean,
  engine: EngineAccount | null,
  warnings: string[],
): Readiness {
  if (engineSaysCpu(engine)) {
    warnings.push(`the engine output posted says it computes on the CPU (${engine.summary}): once it has GPUs again, it reads on-cpu`);
  }
  const parts: string[] = [];
  if (gone.length > 0) parts.push(`${gone.join('; ')}: ${LOST_GPU_MEANING}`);
  if (unreachable.length > 0) parts.push(`${unreachable.map(gpuUnreachable).join('; ')}: ${UNREACHABLE_GPU_MEANING}`);
  const reason =
    // "As registered" where its other GPUs have new indices: the same numbers may name other GPUs now.
    `placed on ${gpuList(shard.gpus)}${asRegistered ? ' as registered' : ''}, but ${parts.join(' Also, ')} ` +
    `This shard cannot serve as placed. ${LOST_GPU_FIX} ` +
    `Meanwhile start its engine on ${gone.length > 0 ? 'GPUs that are listed' : 'other GPUs'} and PUT the shard with its new gpus.`;
  return verdict('gpu-lost', gone.length > 0 ? 'gpu-not-listed' : 'gpu-unreachable', reason, warnings);
}

function warningsFor(shard: ShardRecord, node: NodeView, engine: EngineAccount | null, staleReason: string | null): string[] {
  const warnings: string[] = [];
  if (staleReason !== null) warnings.push(`answered from an older snapshot: ${staleReason}`);
  const strays = strayGpus(shard, node);
  if (strays.length > 0) {
    warnings.push(`holds memory on ${gpuList(strays)}, which it was not given: check CUDA_VISIBLE_DEVICES and the placement`);
  }
  // An engine that says it computes on the CPU offloaded nothing, whatever "offloaded N/M" it printed.
  if (engine?.backend === 'CUDA' && engine.layersOffloaded !== null && engine.layersTotal !== null && engine.layersOffloaded < engine.layersTotal) {
    warnings.push(`the engine offloaded only ${engine.layersOffloaded} of ${engine.layersTotal} layers to the GPU; the rest runs on the CPU`);
  }
  return warnings;
}

/**
 * Whether a cgroup shard restarted since its engine output began to be posted (at `tailStartedAtTicks`,
 * clock ticks since boot): every process of it that runs now, the pod's sandbox aside, started after
 * that (same registration, new container), so the output is, at least in part, an earlier run's.
 * False when unknown.
 */
export function restartedSince(liveness: Liveness | undefined, tailStartedAtTicks: number | null | undefined): boolean {
  return tailStartedAtTicks != null && liveness?.state === 'alive' && liveness.oldestStart !== undefined && liveness.oldestStart > tailStartedAtTicks;
}

/** The engine's account set aside, with why, when it cannot be about the processes running now. */
function earlierRun(shard: ShardRecord, liveness: Liveness, engine: EngineAccount | null, postedAtTicks: number | null | undefined): string | null {
  if (engine === null || !restartedSince(liveness, postedAtTicks)) return null;
  return (
    `the engine output posted for this shard (it says ${engine.backend}) came, at least in part, from an earlier run: every process now in cgroup "${shard.cgroup}" ` +
    `started after it began to be posted (the container restarted), so it does not decide this verdict: post the new run's output (llama.cpp at -lv 4) to /shards/${shard.id}/engine-output; it begins a new tail`
  );
}

/**
 * Given GPUs a stopped shard holds no memory on, as a warning: it outlives the stop, and decides the
 * verdict once the shard runs again. Only where nvidia-smi can show it: not while processes are
 * hidden from it, nor on a GPU holding memory of a process whose owner is unknown.
 */
function unheldWhileStopped(shard: ShardRecord, node: NodeView): string[] {
  if (node.processesHidden !== null) return [];
  // A shard the attribution judged stopped has holdings there, if only an empty map.
  const held = node.attribution.holdings.get(shard.id)!;
  const missing = shard.gpus.filter((index) => !held.has(index) && !node.attribution.uncertain.has(index));
  if (missing.length === 0) return [];
  return [
    `it holds no memory on ${gpuList(missing)} (nvidia-smi lists none of its processes there): once it runs again, that decides its verdict (starting within its grace, on-cpu after it)`,
  ];
}

/**
 * The verdict of a shard whose process is stopped (`why`, from attribution): not ready, whatever
 * nvidia-smi says, since it answers nothing. `warnings`: what the GPU picture adds (or that there is
 * none); an engine that says CPU is added, since it still counts once the shard runs again.
 */
function stoppedVerdict(input: ReadinessInput, why: string, warnings: string[], gpuLost = false): Readiness {
  const { shard, engine } = input;
  if (shard.gpus.length > 0 && engineSaysCpu(engine)) {
    // A lost GPU comes first once it runs: the engine's word counts only once it has GPUs again.
    warnings.push(`the engine output posted says it computes on the CPU (${engine.summary}): once it ${gpuLost ? 'has GPUs again' : 'runs again'}, it reads on-cpu`);
  }
  return verdict('stopped', 'process-stopped', `${why}.`, warnings);
}

function uncertainWhy(stat: UnreadableStat): string {
  return `the /proc stat of process ${stat.pid} on its way to a shard could not be read in this refresh (${stat.unreadable}), so it may be this shard's. ${stat.advice}`;
}

/**
 * The verdict while nvidia-smi cannot be asked: what /proc and the engine's own account decide
 * without it (exited, stopped, on-cpu), a GPU nvidia-smi's failure names (gpu-lost), then what its
 * last good listing still says against the shard, else unverified.
 */
function withoutNvidiaSmi(input: ReadinessInput): Readiness {
  const { shard } = input;
  const why = input.unavailable ?? 'unknown reason';
  const unverified = `nvidia-smi cannot be asked, so where this shard computes is unverified and it keeps serving: ${why}`;
  const liveness = livenessWithoutNvidiaSmi(input);
  const unreachable = unreachableGiven(shard, input.unreachable ?? []);
  if (liveness.state === 'gone') return verdict('exited', 'process-exited', `the shard's process exited: ${liveness.why}.`, []);
  if (liveness.state === 'stopped') {
    const lost = unreachable.map((gpu) => `${gpuUnreachable(gpu)}: once it runs again, it reads gpu-lost`);
    return stoppedVerdict(input, liveness.why, [`nvidia-smi cannot be asked, so which GPU memory it holds is unverified: ${why}`, ...lost], lost.length > 0);
  }
  const setAside = earlierRun(shard, liveness, input.engine, input.engineTicks);
  const engine = setAside === null ? input.engine : null;
  const besides = [...(liveness.state === 'unreadable' ? [liveness.why] : []), ...(setAside === null ? [] : [setAside])];
  if (unreachable.length > 0) return gpuLostVerdict(shard, [], unreachable, false, engine, besides);
  // An unreadable stat comes before the engine's word, as it does with a snapshot.
  const judgedEngine = liveness.state === 'unreadable' ? null : engine;
  const last = lastListingVerdict(input, liveness, why, besides);
  // As with a snapshot, a GPU gone from the listing comes before what the engine says.
  if (last?.state === 'gpu-lost') return last;
  if (shard.gpus.length > 0 && engineSaysCpu(judgedEngine)) {
    return engineCpuVerdict(shard, judgedEngine, null, [`nvidia-smi cannot be asked, so this verdict rests on the engine's own output: ${why}`]);
  }
  return last ?? verdict('unverified', 'nvidia-smi-unavailable', null, [unverified, ...besides]);
}

/**
 * Whether the shard runs, from /proc now: a shard that runs is stopped all the same when a process
 * that held its GPU memory in the last good listing, one that listing describes it in, is stopped
 * now (a stopped tensor-parallel rank stalls the engine, as it does with a snapshot).
 */
function livenessWithoutNvidiaSmi(input: ReadinessInput): Liveness {
  const liveness: Liveness = input.liveness ?? { state: 'unknown' };
  const { lastGood, procNow, shard } = input;
  if (liveness.state !== 'alive' || !describes(lastGood, shard) || procNow === undefined) return liveness;
  return stoppedSinceListing(lastGood.node.snapshot, lastGood.node.attribution.holdings.get(shard.id), procNow) ?? liveness;
}

/**
 * Past max-stale, nvidia-smi's last word holds against a shard, never for it. Keeping a shard that
 * served on its GPUs serving is fail-open (its CUDA contexts outlive a broken nvidia-smi, and failing
 * every probe of the node would make a monitoring failure an outage), but admitting one nvidia-smi
 * never saw there is not (an engine started while the driver fails most likely cannot use CUDA).
 * So the last good listing's GPU facts are judged with /proc's word now (a stop since ended reads as
 * running, a grace since ended as waiting for a listing), and the verdict holds when it is against
 * the shard (starting, on-cpu, gpu-lost; exited or stopped while /proc has no word on it now). A shard with GPUs the listing does not describe
 * (registered after its refresh began, or none succeeded in this run), or whose engine started
 * again since (exited then, or every process that held its memory on one of its GPUs then gone now),
 * has not been seen on them: starting, unless registered before this run, which may have seen it
 * ready. Null: unverified. The engine's own CPU account is left to the caller, which weighs it now.
 */
function lastListingVerdict(input: ReadinessInput, liveness: Liveness, why: string, besides: string[]): Readiness | null {
  const { shard, lastGood, now } = input;
  if (shard.gpus.length === 0) return null;
  if (!describes(lastGood, shard)) {
    if (input.judgingSince === undefined || shard.registeredAt < input.judgingSince) return null;
    return unseenVerdict(shard, `registered ${formatDuration(now - shard.registeredAt)} ago, and no nvidia-smi listing since has included it`, why, besides);
  }
  const listing = `nvidia-smi's last good listing (${new Date(lastGood.observedAt).toISOString()}, ${formatDuration(Math.max(0, now - lastGood.observedAt))} ago)`;
  if (liveness.state === 'alive') {
    if (lastGood.node.attribution.liveness.get(shard.id)?.state === 'gone') {
      return unseenVerdict(shard, `${listing} showed it exited, and its engine runs again since`, why, besides);
    }
    const exited = holdersGone(lastGood.node, shard, input.procNow);
    if (exited.length > 0) {
      return unseenVerdict(shard, `every process that held its memory on ${gpuList(exited)} in ${listing} has exited since (its engine restarted)`, why, besides);
    }
  }
  const prior = readiness({
    shard,
    node: lastGood.node,
    evidenceAt: lastGood.startedAt,
    staleReason: null,
    engine: input.engine,
    engineTicks: input.engineTicks ?? null,
    enginePosted: input.enginePosted === true,
    now,
    ...(liveness.state === 'unknown' ? {} : { livenessNow: liveness }),
  });
  if (!HELD_STATES.has(prior.state)) return null;
  return {
    ...prior,
    reason: `nvidia-smi cannot be asked; ${listing} showed: ${prior.reason}`,
    warnings: [`nvidia-smi cannot be asked, so this verdict holds until it answers: ${why}`, ...prior.warnings],
  };
}

/** Whether the last good listing describes the shard: its refresh began once the shard was registered. */
function describes(lastGood: ReadinessInput['lastGood'], shard: ShardRecord): lastGood is NonNullable<ReadinessInput['lastGood']> {
  return lastGood != null && shard.registeredAt <= lastGood.startedAt;
}

/** Verdicts of the last good listing that hold past max-stale: those against the shard that /proc cannot end. */
const HELD_STATES: ReadonlySet<ReadinessState> = new Set(['starting', 'on-cpu', 'gpu-lost', 'exited', 'stopped']);

/**
 * The GPUs it was given on which every process that held the shard's memory in `listed` has exited
 * since (by PID and start time, in the stats read now), under that listing's indices; none when
 * those stats are not at hand.
 */
function holdersGone(listed: NodeView, shard: ShardRecord, procNow: ReadonlyMap<number, StatAnswer> | undefined): number[] {
  if (procNow === undefined) return [];
  // Not known to have exited (not read now, or unreadable either time) counts as running.
  const runs = (pid: number): boolean => sameProcessNow(listed.snapshot, procNow, pid) !== null;
  const given = placementOf(shard, listed.snapshot.gpus).indices;
  const holdings = listed.attribution.holdings.get(shard.id);
  return [...(holdings?.values() ?? [])]
    .filter((holding) => given.includes(holding.index) && !holding.processes.some((process) => runs(process.pid)))
    .map((holding) => holding.index);
}

/** Starting, for a shard no listing has shown on its GPUs while nvidia-smi cannot be asked: `since` says why none has. */
function unseenVerdict(shard: ShardRecord, since: string, why: string, besides: string[]): Readiness {
  return verdict(
    'starting',
    'awaiting-nvidia-smi',
    `${since}, so it has not been seen holding memory on ${gpuList(shard.gpus)}: it reads starting until nvidia-smi answers and lists its memory there. ` +
      'Fix nvidia-smi first (`nodecompute doctor` on this node): an engine started while the driver fails most likely cannot use CUDA either.',
    [`nvidia-smi cannot be asked: ${why}`, ...besides],
  );
}

/** When the listing a verdict rests on was begun, inside the grace: relative to the registration (never a negative time). */
function begun(shard: ShardRecord, evidenceAt: number): string {
  return evidenceAt < shard.registeredAt
    ? 'before this shard was registered'
    : `${formatDuration(evidenceAt - shard.registeredAt)} after registration, before the grace ended`;
}

export function readiness(input: ReadinessInput): Readiness {
  const { node, now } = input;
  if (node === null) return withoutNvidiaSmi(input);
  const placement = placementOf(input.shard, node.snapshot.gpus);
  // Judged on its GPUs' indices in this listing: the registered ones unless some went or were renumbered.
  const moved = placement.renumbered.length > 0 || placement.unlisted.length > 0;
  const shard = moved ? { ...input.shard, gpus: placement.indices } : input.shard;
  const renumbered = placement.renumbered.map(renumberedWarning);
  const gone = placement.unlisted.map((gpu) => unlistedGpu(gpu, node));
  // Only GPUs this listing has: one it no longer lists is said once, as not listed.
  const unreachable = unreachableGiven(
    input.shard,
    (input.unreachable ?? []).filter(({ listed }) => node.snapshot.gpus.some((gpu) => gpu.uuid === listed?.uuid)),
  );
  const liveness: Liveness = input.livenessNow ?? node.attribution.liveness.get(shard.id) ?? { state: 'unknown' };
  if (liveness.state === 'gone') return verdict('exited', 'process-exited', `the shard's process exited: ${liveness.why}.`, []);
  if (liveness.state === 'stopped') {
    const lost = [...gone, ...unreachable.map(gpuUnreachable)].map((gpu) => `${gpu}: once it runs again, it reads gpu-lost`);
    return stoppedVerdict(input, liveness.why, [...warningsFor(shard, node, input.engine, input.staleReason), ...renumbered, ...lost, ...unheldWhileStopped(shard, node)], lost.length > 0);
  }
  const setAside = earlierRun(shard, liveness, input.engine, input.engineTicks);
  const engine = setAside === null ? input.engine : null;
  const warnings = [...warningsFor(shard, node, engine, input.staleReason), ...renumbered];
  if (setAside !== null) warnings.push(setAside);
  if (gone.length > 0 || unreachable.length > 0) return gpuLostVerdict(input.shard, gone, unreachable, placement.renumbered.length > 0, engine, warnings);
  if (liveness.state === 'unreadable') return verdict('unverified', 'stat-unreadable', null, [...warnings, liveness.why]);
  const evidenceAt = Math.min(now, input.evidenceAt ?? now);
  if (shard.gpus.length > 0 && engineSaysCpu(engine)) return engineCpuVerdict(shard, engine, node, warnings);
  const held = node.attribution.holdings.get(shard.id);
  const missing = shard.gpus.filter((index) => !held?.has(index));
  if (missing.length === 0) return verdict('ready', null, null, warnings);
  const left = shard.registeredAt + shard.graceMs - now;
  if (liveness.state === 'unknown') {
    if (left > 0) {
      return verdict('starting', 'awaiting-snapshot', `registered ${formatDuration(now - shard.registeredAt)} ago; waiting for the first snapshot that includes it (${formatDuration(left)} of grace left).`, warnings);
    }
    return verdict('unverified', 'not-in-snapshot', null, [...warnings, 'no snapshot taken since this shard was registered includes it yet (the next refresh will): until one does, where it computes is unverified']);
  }
  const waiting = `waiting for the shard to hold memory on ${gpuList(missing)} (nvidia-smi lists none of its memory there yet)`;
  if (left > 0) return verdict('starting', 'awaiting-gpu-memory', `${waiting}; ${formatDuration(left)} of its ${formatDuration(shard.graceMs)} grace left.`, warnings);
  if (evidenceAt < shard.registeredAt + shard.graceMs) {
    // Routine right after the grace ends (the snapshot served was begun before); a slow or failing
    // nvidia-smi, which makes it last, is a warning of its own (staleReason).
    return verdict(
      'starting',
      'awaiting-listing',
      `${waiting}. Its ${formatDuration(shard.graceMs)} grace is over, but the latest nvidia-smi listing was begun ${begun(shard, evidenceAt)}: ` +
        'the verdict waits for a listing begun after the grace.',
      warnings,
    );
  }
  if (node.processesHidden !== null) return verdict('unverified', 'processes-hidden', null, [...warnings, node.processesHidden]);
  const uncertain = missing.flatMap((index) => {
    const blocked = node.attribution.uncertain.get(index);
    return blocked === undefined ? [] : [`GPU ${index} holds memory of a process whose owner is unknown: ${uncertainWhy(blocked)}`];
  });
  if (uncertain.length > 0) return verdict('unverified', 'gpu-owner-unknown', null, [...warnings, ...uncertain]);
  const noAccount: NoAccount = setAside !== null ? 'earlier-run' : input.enginePosted === true ? 'silent' : 'not-posted';
  return onCpuVerdict(shard, missing, node, evidenceAt, engine, noAccount, warnings);
}
