// Owns the schemas of the shard API: registration, the shard record, where a shard computes, its
// readiness verdict, the engine's account and the foreign-memory view.
import { Type, type Static } from '@sinclair/typebox';
import { ENGINES } from '../shards/shard.js';
import { READINESS_STATES, VERDICT_CAUSES } from '../shards/verdict.js';
import { OFFLOADS } from '../shards/weights.js';
import { Nullable, NullableStringEnum, Ref, SnapshotMetaComponent, StringEnum } from './common.js';
import { GpuUnreachableComponent, perGpuAnswer } from './gpus.js';

const SHARD_ID_PATTERN = '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$';
const MAX_PID = 4_194_304;
const MAX_GPU_INDEX = 63;

export const ShardParamsSchema = Type.Object({
  id: Type.String({
    // Checked before the pattern: an empty id ("/shards/") gets its own explanation (app.ts).
    minLength: 1,
    pattern: SHARD_ID_PATTERN,
    description: 'Shard id: 1 to 128 characters of letters, digits, ".", "_" and "-", starting with a letter or digit.',
  }),
});

const GpuIndicesSchema = Type.Array(Type.Integer({ minimum: 0, maximum: MAX_GPU_INDEX }), {
  uniqueItems: true,
  maxItems: MAX_GPU_INDEX + 1,
  description: 'Indices of the GPUs the shard was placed on (as the GPU driver numbers them); unique; empty for a CPU-only shard.',
});

// Described where it is made nullable (RegisterShardSchema): the description goes on the whole field.
const MigDevicesSchema = Type.Array(Type.String({ pattern: '^MIG-[0-9A-Za-z-]+$', maxLength: 64 }), { uniqueItems: true, minItems: 1, maxItems: 64 });

const EngineSchema = StringEnum(ENGINES, 'The serving engine: llama.cpp, ollama, vllm or other; llama.cpp and Ollama output posted to engine-output is understood.');
const BACKENDS = ['CUDA', 'CPU'] as const;

/**
 * What a cgroup registration may name: a container id (12 to 64 hex digits, as docker, podman and
 * crictl print it) or a pod UID (with "-" or "_", as the two cgroup drivers write it). It is matched
 * as a substring of /proc/PID/cgroup, so anything looser ("kubepods") would make one shard of every
 * process on the node and leave no memory foreign.
 */
const CGROUP_PATTERN = '^(?:[0-9a-f]{12,64}|[0-9a-f]{8}([-_])[0-9a-f]{4}\\1[0-9a-f]{4}\\1[0-9a-f]{4}\\1[0-9a-f]{12})$';

/** A field GET writes and a PUT does not set: taken, so that a GET body can be PUT back, and ignored. */
const ReadOnly = (description: string) => Type.Optional(Type.Unknown({ readOnly: true, description: `Read-only, as GET writes it (${description}): ignored.` }));

// Null is taken wherever GET writes an absent field as null, and means what leaving it out means:
// a control plane can PUT back the record it read with one field changed.
export const RegisterShardSchema = Type.Object(
  {
    id: Type.Optional(
      Type.String({ pattern: SHARD_ID_PATTERN, readOnly: true, description: 'Read-only, as GET writes it: when given, it must be the id in the path (a body read from another shard is refused).' }),
    ),
    pid: Type.Optional(
      Nullable(
        Type.Integer({ minimum: 1, maximum: MAX_PID }),
        "Host PID of the shard's main process; its descendants, and the members of its process group that started after it unless another shard shares the group, count as the shard. Null: as absent.",
      ),
    ),
    cgroup: Type.Optional(
      Nullable(
        Type.String({ pattern: CGROUP_PATTERN }),
        'A container id (12 to 64 hex digits) or a pod UID (with "-" or "_"): every process whose /proc/PID/cgroup contains it is the shard. Give pid or cgroup, not both. Null: as absent.',
      ),
    ),
    gpus: GpuIndicesSchema,
    migDevices: Type.Optional(
      Nullable(
        MigDevicesSchema,
        'MIG devices of those GPUs the shard was placed on, by UUID (MIG-..., as nvidia-smi -L and NVIDIA_VISIBLE_DEVICES name them): its foreign memory is then theirs, and memory it holds on another MIG device of its GPUs is a warning. Each must be on one of its gpus; checked under NVML, which lists MIG devices (GET /gpus migDevices); taken on trust under nvidia-smi. Null or absent: whole GPUs.',
      ),
    ),
    engine: Type.Optional(EngineSchema),
    graceMs: Type.Optional(
      Type.Integer({ minimum: 0, maximum: 3_600_000, description: 'How long the shard may take to hold its GPUs before it counts as on-cpu; defaults to NODECOMPUTE_GPU_GRACE_MS.' }),
    ),
    minGpuWeightsShare: Type.Optional(
      Nullable(
        Type.Number({ minimum: 0, maximum: 1 }),
        'The least share (0 to 1) of its model weights that must be on its GPUs, as compute.weights estimates it, for the shard to be ready; below it after the grace: on-cpu (partial-offload-below-minimum). Null or absent: a partial offload serves, with a warning.',
      ),
    ),
    gpuUuids: ReadOnly('the devices are those of the registration, kept while gpus repeats them'),
    registeredAt: ReadOnly('a repeat for the same process and GPUs keeps it'),
    identity: ReadOnly('read from /proc'),
    status: ReadOnly('the verdict'),
    compute: ReadOnly('where it computes'),
    observedAt: ReadOnly('the snapshot'),
    ageMs: ReadOnly('the snapshot'),
    stale: ReadOnly('the snapshot'),
    staleReason: ReadOnly('the snapshot'),
  },
  {
    additionalProperties: false,
    description: 'A shard registration: pid or cgroup, and the GPUs it was given. A shard as GET /shards/:id answers it may be sent back: null means absent, and the read-only fields are ignored.',
  },
);
export type RegisterShard = Static<typeof RegisterShardSchema>;

export const ShardRecordComponent = Type.Object(
  {
    id: Type.String({ description: 'Shard id.' }),
    pid: Nullable(Type.Integer(), 'The registered PID; null for a cgroup shard.'),
    cgroup: Nullable(Type.String(), 'The registered cgroup string; null for a PID shard.'),
    gpus: Type.Array(Type.Integer(), { description: 'GPU indices the shard was given, as the GPU driver numbered them at registration.' }),
    gpuUuids: Nullable(
      Type.Array(Type.String()),
      "The UUIDs of those GPUs at registration, in the same order: the shard is judged on these devices, under the index the GPU driver gives them now (it renumbers the GPUs after one drops out). Null when the GPU driver could not be asked at registration (the GPUs were taken on trust, and are judged by index).",
    ),
    migDevices: Nullable(Type.Array(Type.String()), 'The MIG devices (MIG-...) of its GPUs it was placed on; null: whole GPUs.'),
    engine: EngineSchema,
    graceMs: Type.Integer({ description: 'Grace window in milliseconds.' }),
    minGpuWeightsShare: Nullable(Type.Number(), 'The least share of its weights that must be on its GPUs for it to be ready; null: none asked.'),
    registeredAt: Type.String({
      format: 'date-time',
      description: 'When this run of the shard was first registered: a re-PUT for the same process (or the same engine process of a cgroup) and GPUs keeps it, and the grace runs from it.',
    }),
    identity: Type.Object(
      {
        pid: Type.Integer({ description: 'PID of the process (for a cgroup shard: its lowest PID at registration).' }),
        pgid: Type.Integer({ description: 'Its process group id at registration; GPU processes of its current group that started after it belong to the shard unless another shard shares the group.' }),
        startTime: Type.Integer({ description: 'Its start time in clock ticks since boot: a reused PID has another.' }),
        name: Type.String({ description: 'Its command name (comm) at registration.' }),
        bootId: Type.Optional(
          Type.String({
            description:
              "The node's boot it ran in (/proc/sys/kernel/random/boot_id): after the node restarts, the process is gone whatever runs under its PID. Absent when /proc could not say.",
          }),
        ),
      },
      { description: 'The process captured at registration.' },
    ),
  },
  { $id: 'ShardRecord', description: 'A shard as registered: the process or cgroup, and the GPUs it was given.' },
);
export type ShardRecordBody = Static<typeof ShardRecordComponent>;
/** The shard record, as routes name it: a reference to the ShardRecord component. */
export const ShardRecordSchema = Ref(ShardRecordComponent);

export const EngineAccountComponent = Type.Object(
  {
    backend: StringEnum(BACKENDS, 'Where the engine says it computes.'),
    devices: Type.Array(Type.String(), { description: 'Devices the engine reports using, as it names them.' }),
    layersOffloaded: Nullable(Type.Integer(), 'Layers offloaded to the GPU, from "offloaded N/M layers"; null when not printed.'),
    layersTotal: Nullable(Type.Integer(), 'Total layers, from "offloaded N/M layers"; null when not printed.'),
    gpuBackendLoaded: Nullable(
      Type.Boolean(),
      'Whether its GPU backend loaded: true when it found or used a CUDA device (a CPU account then means no layers were put on the GPU: -ngl), false when it said no GPU is usable or listed only the CPU (the build, its libraries, the container\'s GPU runtime), null when its output does not say.',
    ),
    evidence: Type.String({ description: 'The engine line(s) this account rests on.' }),
    summary: Type.String({ description: 'One sentence: what the engine itself saw.' }),
  },
  { $id: 'EngineAccount', description: "The engine's own account of where it computes, read from its output." },
);

export const ShardGpuUsageComponent = Type.Object(
  {
    index: Type.Integer({ description: 'GPU index.' }),
    usedMiB: Nullable(Type.Integer(), "Memory the shard's processes hold there, in MiB; null when the GPU driver does not report it ([N/A]) for one of them (the GPU is held all the same)."),
    smUtilPct: Nullable(
      Type.Integer({ minimum: 0 }),
      "SM utilization (%) of the shard's processes there, summed (NVML's per-process samples): 0 while its GPU does no work; null under nvidia-smi or where the GPU gives none.",
    ),
    xidErrors: Nullable(Type.Integer({ minimum: 0 }), 'Xid events NVML reported for this GPU since nodecompute started (GET /gpus has each); null under nvidia-smi.'),
    utilizationPct: Nullable(
      Type.Integer({ minimum: 0, maximum: 100 }),
      "The whole GPU's utilization.gpu (as GET /gpus; any process's kernels count); null where the driver gives none (MIG).",
    ),
    migDevices: Nullable(
      Type.Array(
        Type.Object({
          uuid: Type.String({ description: 'MIG device UUID (MIG-...).' }),
          profile: Type.String({ description: 'Its profile, e.g. 3g.40gb.' }),
          usedMiB: Nullable(Type.Integer(), "Memory the shard's processes hold on it, in MiB (0 on one it was placed on and does not use); null when one's is not reported."),
          foreignMiB: Nullable(Type.Integer(), 'Its memory held by anything that is not a registered shard (as GET /gpus/foreign-memory); null when its used memory is unknown.'),
        }),
      ),
      'The MIG devices of this GPU the shard holds memory on or was placed on (NVML only); null where the GPU lists none (MIG off, nvidia-smi).',
    ),
  },
  { $id: 'ShardGpuUsage', description: 'A GPU the shard holds memory on, and how much.' },
);

export const ModelFileComponent = Type.Object(
  {
    path: Type.String({ description: 'The file as its process sees it (inside its container).' }),
    deleted: Type.Boolean({ description: 'Deleted since it was loaded ("(deleted)" in /proc/PID/maps): its size is then not known.' }),
    bytes: Nullable(Type.Integer({ minimum: 0 }), "The file's size; null when it cannot be opened (deleted, or not readable through /proc/PID/root)."),
    mappedBytes: Nullable(Type.Integer({ minimum: 0 }), 'Bytes of it still mapped in host memory; null when it is named on the command line and not mapped (--no-mmap).'),
    seenIn: StringEnum(['mapping', 'command-line'] as const, 'Where it was found: /proc/PID/maps, or -m/--model in /proc/PID/cmdline (else LLAMA_ARG_MODEL in /proc/PID/environ).'),
    layers: Nullable(
      Type.Integer({ minimum: 1 }),
      "The layers llama.cpp can offload of the model it holds: its GGUF header's <general.architecture>.block_count, plus the output layer (the M of llama.cpp's \"offloaded N/M layers\"). Null when the header does not say: a split but the first, a projector, a file that cannot be opened.",
    ),
  },
  { $id: 'ModelFile', description: 'A GGUF model file a process of the shard loaded.' },
);

export const ShardWeightsComponent = Type.Object(
  {
    offload: StringEnum(
      OFFLOADS,
      'full, partial or none: how much of its weights is on its GPUs; unknown when the GPU driver does not report its memory; not-seen when no GGUF model file is in view (vLLM and other engines), which judges it by GPU memory alone.',
    ),
    files: Type.Array(Ref(ModelFileComponent), { description: 'The model files its processes loaded.' }),
    bytes: Nullable(Type.Integer({ minimum: 0 }), "The files' size; null when one's is not known."),
    hostBytes: Nullable(Type.Integer({ minimum: 0 }), 'Bytes of them still mapped in host memory: llama.cpp unmaps what it put on a GPU once loaded. Null when none is mapped.'),
    gpuBytes: Nullable(Type.Integer({ minimum: 0 }), 'Estimated bytes of weights on its GPUs; null when not known.'),
    gpuShare: Nullable(Type.Number({ minimum: 0, maximum: 1 }), 'Estimated share of its weights on its GPUs, 0 to 1, two decimals; null when not known.'),
    judgedBy: NullableStringEnum(
      ['mapping', 'gpu-memory'] as const,
      'mapping: the file mapped shrank to what stays on the CPU (a full offload); gpu-memory: the memory its processes hold on its given GPUs, less 1 GiB a GPU for a context and buffers, against the file size.',
    ),
    note: Type.String({ description: 'How it was judged, for people.' }),
    gpuLayers: Nullable(
      Type.String(),
      "The GPU layers its command line asks for, as written: -ngl/--gpu-layers/--n-gpu-layers (an Ollama runner's too), else LLAMA_ARG_N_GPU_LAYERS for a llama-* program; a count, or llama.cpp's auto or all; of the process with a model file holding the most GPU memory. Null when unsaid (llama.cpp's default: auto in current builds, none on a CUDA GPU in b4748, February 2025) or no model file is in view.",
    ),
    modelLayers: Nullable(
      Type.Integer({ minimum: 1 }),
      'The layers llama.cpp can offload of its model (files[].layers): of the largest model (its splits counted together) of the process gpuLayers is read from, so both speak of one model; -ngl at or above it asks for every layer. Null when no file of it says.',
    ),
  },
  { $id: 'ShardWeights', description: "Where the shard's model weights are, from /proc and the memory it holds on its GPUs." },
);

export const ShardComputeComponent = Type.Object(
  {
    backend: NullableStringEnum(
      BACKENDS,
      'CUDA when the shard holds memory on any GPU as the GPU driver sees it; CPU only when its verdict is on-cpu (grace over with a GPU not held, or the engine itself says CPU), ' +
        'or it was given no GPU and runs holding none; null when that is not known (starting, exited, unverified, gpu-lost holding no GPU still listed) and while it is stopped, ' +
        'which computes nowhere until it runs again (gpus still lists the memory it keeps).',
    ),
    devices: Type.Array(Type.String(), {
      description: 'Each assigned GPU the shard holds memory on, for people to read: "GPU <index>: <size>", the size in binary units, GiB with one decimal from 1 GiB up ("GPU 0: 9.8 GiB" for 10000 MiB), whole MiB below ("GPU 0: 512 MiB"). gpus carries the same in MiB.',
    }),
    gpus: Type.Array(Ref(ShardGpuUsageComponent), { description: 'Assigned GPUs the shard holds memory on.' }),
    strayGpus: Type.Array(Ref(ShardGpuUsageComponent), { description: 'GPUs the shard holds memory on but was not given.' }),
    cpuCores: Nullable(
      Type.Number({ minimum: 0 }),
      "CPU cores the shard's processes used between the last two snapshots (its registered process, its cgroup's members and its GPU processes; /proc/PID/stat), " +
        'to two decimals; null until two snapshots have read them. Several cores while its GPUs do no work: it computes on the CPU.',
    ),
    weights: Ref(ShardWeightsComponent),
    engine: Nullable(Ref(EngineAccountComponent), "The engine's own account, or null when its output says nothing (or none was posted)."),
  },
  { $id: 'ShardCompute', description: "Where a shard computes, as the GPU driver sees it, with the engine's own account." },
);

export const ComputeResponseSchema = Type.Intersect(
  [Type.Object({ shard: Type.String({ description: 'Shard id.' }) }), Ref(SnapshotMetaComponent), Ref(ShardComputeComponent)],
  { description: 'Where the shard computes, as the GPU driver sees it.' },
);

export const ReadinessComponent = Type.Object(
  {
    ready: Type.Boolean({ description: 'True for ready and unverified: the probe passes.' }),
    state: StringEnum(READINESS_STATES, 'ready, starting, on-cpu, gpu-lost (a GPU it was given is no longer listed by the GPU driver), stopped, exited or unverified.'),
    cause: NullableStringEnum(
      VERDICT_CAUSES,
      'What decided the verdict, for programs (reason says it for people); null when ready, but for partial-offload (ready with part of its weights on the CPU; a warning says how much), ' +
        'no-model-loaded (an Ollama server running no model, holding no GPU memory: the next request loads one) and model-loading (an Ollama model runner within its grace). ' +
        "starting: awaiting-gpu-weights (every GPU held, its weights still in host memory), awaiting-snapshot, awaiting-nvidia-smi (the GPU driver cannot be asked, and no listing has shown it on its GPUs: lasts as long as it fails), awaiting-gpu-memory, awaiting-listing (grace over, the GPU driver's latest listing begun before it ended). " +
        'on-cpu: engine-gpu-backend-failed (the engine says CPU, its GPU backend did not load: the build, its libraries or the driver), engine-no-gpu-layers (it loaded, with no layers on the GPU: the engine\'s flags), ' +
        'engine-reports-cpu (not said which), memory-on-other-gpu (memory on a GPU it was not given), engine-output-conflicts (the engine output shows weights on a GPU, the GPU driver none on its GPUs), no-gpu-memory, ' +
        'weights-in-host-memory (its GPUs hold little beyond a context while its model stays in host memory: zero offload), partial-offload-below-minimum (less of its weights on the GPU than minGpuWeightsShare asks), last-load-on-cpu (an idle Ollama server whose last model runner ran past the grace without its weights on a GPU, holding no GPU memory or a CUDA context alone: the next load would too). ' +
        'gpu-lost: gpu-not-listed, gpu-unreachable (the GPU driver fails, saying it cannot reach one). stopped: process-stopped. exited: process-exited. ' +
        'unverified: nvidia-smi-unavailable, processes-hidden, stat-unreadable, gpu-owner-unknown, not-in-snapshot. New codes may be added: treat an unknown one as its state says.',
    ),
    reason: Nullable(Type.String(), 'Why the shard is not ready, written for an operator; null when ready.'),
    warnings: Type.Array(Type.String(), { description: 'Things worth knowing that do not change the verdict.' }),
  },
  { $id: 'Readiness', description: 'The readiness verdict.' },
);

export const ReadinessProbeComponent = Type.Intersect(
  [
    Type.Object({ shard: Type.String({ description: 'Shard id.' }) }),
    Ref(ReadinessComponent),
    Type.Object({ observedAt: Nullable(Type.String({ format: 'date-time' }), 'When the snapshot behind the verdict was taken; null when there is none.') }),
  ],
  { $id: 'ReadinessProbe', description: 'The readiness verdict: 200 when ready (or unverified), 503 otherwise.' },
);
/** The probe's answer, as the route names it for 200 and 503: a reference to the ReadinessProbe component. */
export const ReadyResponseSchema = Ref(ReadinessProbeComponent);

/** What GET /shards and GET /shards/:id add to a shard's record: its verdict and where it computes. */
const ShardStateSchema = () =>
  Type.Object({
    status: Ref(ReadinessComponent),
    compute: Nullable(Ref(ShardComputeComponent), 'Where it computes; null when the GPU driver cannot be asked.'),
  });

export const ShardStatusComponent = Type.Intersect([Ref(ShardRecordComponent), ShardStateSchema()], {
  $id: 'ShardStatus',
  description: 'A shard with its current state.',
});

/** The snapshot fields of GET /shards (first) and GET /shards/:id (last). */
export const ShardSnapshotComponent = Type.Object(
  {
    observedAt: Nullable(Type.String({ format: 'date-time' }), 'When the snapshot was taken; null when the GPU driver cannot be asked.'),
    ageMs: Nullable(Type.Integer(), 'Age of that snapshot in milliseconds.'),
    stale: Type.Boolean({ description: 'True when the snapshot is older than the TTL.' }),
    staleReason: Type.Optional(Type.String({ description: 'Why it is stale, or why there is no snapshot.' })),
  },
  { $id: 'ShardSnapshot', description: 'The snapshot behind a shard answer, or (all null, stale) why there is none.' },
);

export const ShardListSchema = Type.Intersect(
  [Ref(ShardSnapshotComponent), Type.Object({ shards: Type.Array(Ref(ShardStatusComponent), { description: 'Every registered shard, by id.' }) })],
  { description: 'Every shard with its state, reason and compute: one answer for a polling control plane.' },
);

// ShardStatus's parts, not ShardStatus: fast-json-stringify writes the fields of an allOf nested in
// another after the outer one's, which would put the snapshot's first.
export const ShardResponseSchema = Type.Intersect([Ref(ShardRecordComponent), ShardStateSchema(), Ref(ShardSnapshotComponent)], {
  description: 'One shard with its state, reason and compute, and the snapshot they come from.',
});

/** The memory of a GPU, or of one MIG device, split between registered shards and everything else. */
const foreignSplit = (where: string) => ({
  usedMiB: Nullable(Type.Integer(), `Used memory of the ${where} in MiB; null when the GPU driver cannot read it.`),
  shardMiB: Type.Integer({ description: "Memory registered shards' processes hold there, in MiB, as far as the GPU driver reports it (see unreportedShardProcesses)." }),
  unreportedShardProcesses: Type.Integer({
    description:
      "Shard processes on this GPU whose memory the GPU driver does not report ([N/A]: WSL2, Windows, some vGPU setups). Above 0, shardMiB is a lower bound and foreignMiB an upper bound: their memory reads as foreign, which placement never over-commits.",
  }),
  foreignMiB: Nullable(Type.Integer(), 'used - shardMiB, never below zero: memory placement must not hand out; null when used is unknown.'),
  foreignProcesses: Type.Array(
    Type.Object({
      pid: Type.Integer({ description: 'Host PID.' }),
      name: Type.String({ description: 'Process name as the GPU driver reports it.' }),
      usedMiB: Nullable(Type.Integer(), 'Memory it holds there in MiB; null when [N/A].'),
    }),
    { description: `Processes on this ${where} that belong to no shard.` },
  ),
});

export const ForeignMemoryGpuComponent = Type.Object(
  {
    index: Type.Integer({ description: 'GPU index.' }),
    uuid: Type.String({ description: 'GPU UUID.' }),
    ...foreignSplit('GPU'),
    migDevices: Nullable(
      Type.Array(
        Type.Object({ uuid: Type.String({ description: 'MIG device UUID (MIG-...).' }), profile: Type.String({ description: 'Its profile, e.g. 3g.40gb.' }), ...foreignSplit('MIG device') }),
      ),
      "The same per MIG device (NVML only): a shard placed on a MIG device can use only that device's free memory. Null with MIG off and under nvidia-smi.",
    ),
    unreachable: Ref(GpuUnreachableComponent),
  },
  { $id: 'ForeignMemoryGpu', description: 'A GPU, and the memory on it held by anything that is not a registered shard.' },
);

export const ForeignMemoryResponseSchema = perGpuAnswer(
  ForeignMemoryGpuComponent,
  'Per GPU.',
  'Per GPU, the memory held by anything that is not a registered shard; and the GPUs lost, which have no memory to hand out.',
);

/** POST /shards/:id/engine-output's body, in the OpenAPI document only: the route reads it as bytes (openapi-document.ts). */
export const EngineOutputBodySchema = Type.String({ description: "The engine's output: UTF-8 text, its bytes as the engine wrote them." });

export const EngineOutputResponseSchema = Type.Object(
  {
    shard: Type.String({ description: 'Shard id.' }),
    account: Nullable(Ref(EngineAccountComponent), 'What the output (tail kept so far) says; null when it says nothing about where the engine computes, or is not read.'),
    tailBytes: Type.Integer({ description: 'Bytes of engine output kept for this shard (a bounded tail).' }),
    note: Nullable(
      Type.String(),
      'Why the account is null, for the operator: only llama.cpp and Ollama output is read (the shard names another engine), or nothing in it says where llama.cpp computes yet; null when there is an account.',
    ),
  },
  { description: "The engine's account after this output." },
);
