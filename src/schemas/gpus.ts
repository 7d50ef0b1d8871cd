// Owns the schema of the GPU view (GET /gpus): each GPU with its memory and the processes on it.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { Nullable, Ref, SnapshotMetaComponent } from './common.js';

const MiB = (description: string) => Nullable(Type.Integer({ minimum: 0 }), `${description} in MiB; null when the GPU driver does not report it ([N/A] or [Insufficient Permissions]).`);

/** A GPU's `unreachable` in GET /gpus and GET /gpus/foreign-memory. */
export const GpuUnreachableComponent = Type.Unsafe<string | null>({
  $id: 'GpuUnreachable',
  type: ['string', 'null'],
  description:
    'What the GPU driver said of this GPU when its queries since this snapshot failed naming it by bus id (e.g. "GPU is lost. Reboot the system to recover this GPU"): it cannot reach the GPU, so the figures here, from the last good snapshot, no longer hold and nothing should be placed on it; shards placed on it read gpu-lost. null otherwise.',
});

export const GpuProcessComponent = Type.Object(
  {
    pid: Type.Integer({ minimum: 1, description: 'Host PID, as the GPU driver reports it.' }),
    name: Type.String({ description: 'Process name as the GPU driver reports it; [Not Found] for a PID of another PID namespace.' }),
    usedMiB: MiB('GPU memory this process holds on this GPU'),
    shard: Nullable(Type.String(), 'Id of the registered shard this process belongs to; null when it belongs to none (foreign).'),
    smUtilPct: Nullable(
      Type.Integer({ minimum: 0, maximum: 100 }),
      'Highest SM utilization (%) NVML sampled of this process on this GPU since the snapshot before: 0 when it did no GPU work; null under nvidia-smi, under MIG, or where the GPU gives none.',
    ),
    migUuid: Nullable(Type.String(), 'The MIG device (MIG-...) it runs on, as in migDevices; null off MIG and under nvidia-smi, whose listing does not say.'),
  },
  { $id: 'GpuProcess', description: 'A compute process holding memory on a GPU, with the shard it belongs to.' },
);
export type GpuProcess = Static<typeof GpuProcessComponent>;

export const GpuEventsComponent = Type.Object(
  {
    xid: Type.Record(Type.String({ pattern: '^[0-9]+$' }), Type.Integer({ minimum: 1 }), { description: 'How many of each Xid (by number) NVML reported.' }),
    eccSingleBit: Type.Integer({ minimum: 0, description: 'Single-bit ECC error events (corrected).' }),
    eccDoubleBit: Type.Integer({ minimum: 0, description: 'Double-bit ECC error events (uncorrected: the memory is suspect).' }),
    lastXid: Nullable(
      Type.Object({ xid: Type.Integer({ minimum: 0 }), at: Type.String({ format: 'date-time', description: 'When nodecompute read it.' }) }),
      'The latest Xid; null when none came.',
    ),
  },
  { $id: 'GpuEvents', description: 'Xid and ECC events NVML reported for a GPU since nodecompute started (see dmesg for the NVRM lines).' },
);

export const MigDeviceComponent = Type.Object(
  {
    uuid: Type.String({ description: 'MIG device UUID (MIG-...), as nvidia-smi -L lists it and NVIDIA_VISIBLE_DEVICES names it.' }),
    profile: Type.String({ description: 'Its profile, e.g. 3g.40gb (1c.3g.71gb for one compute instance of several).' }),
    gpuInstanceId: Type.Integer({ minimum: 0, description: 'GPU instance id (GI ID in nvidia-smi).' }),
    computeInstanceId: Type.Integer({ minimum: 0, description: 'Compute instance id (CI ID in nvidia-smi).' }),
    memory: Type.Object(
      { totalMiB: MiB('Its memory'), usedMiB: MiB('Memory used on it'), freeMiB: MiB('Memory free on it') },
      { description: 'The memory of its GPU instance (shared by its compute instances).' },
    ),
  },
  { $id: 'MigDevice', description: 'A MIG device of a GPU: one compute instance of a GPU instance, with its own memory.' },
);

export const GpuComponent = Type.Object(
  {
    index: Type.Integer({ minimum: 0, description: 'GPU index, as the GPU driver numbers it.' }),
    uuid: Type.String({ description: 'GPU UUID (GPU-...).' }),
    name: Type.String({ description: 'Product name, e.g. NVIDIA H200.' }),
    busId: Nullable(
      Type.String(),
      "PCI bus id (pci.bus_id), e.g. 00000000:83:00.0: how the kernel (dmesg's NVRM and Xid lines) and the GPU driver's errors name this GPU; null where the GPU driver reports none.",
    ),
    memory: Type.Object(
      {
        totalMiB: MiB('Total memory'),
        usedMiB: MiB('Used memory'),
        freeMiB: MiB('Free memory'),
        reservedMiB: MiB('Memory reserved by the driver (null also when the driver does not know memory.reserved)'),
      },
      { description: 'Memory of the GPU as the GPU driver reports it.' },
    ),
    migMode: Nullable(
      Type.String(),
      'MIG mode (mig.mode.current): Enabled or Disabled; null where the GPU has no MIG mode or the driver does not report it. The memory figures here are for the whole GPU; migDevices gives each MIG device its own.',
    ),
    migDevices: Nullable(
      Type.Array(Ref(MigDeviceComponent)),
      'Its MIG devices with their memory (NVML only); empty with MIG enabled and none made; null with MIG off, and under nvidia-smi, whose CSV has no per-instance figures.',
    ),
    utilizationPct: Nullable(
      Type.Integer({ minimum: 0, maximum: 100 }),
      'utilization.gpu: % of the last sample period (1/6 s to 1 s, by product) in which a kernel ran on it, whoever ran it; null where the driver gives none (MIG, some vGPUs).',
    ),
    processes: Type.Array(Ref(GpuProcessComponent), { description: 'Compute processes holding memory on this GPU.' }),
    unreachable: Ref(GpuUnreachableComponent),
    events: Nullable(Ref(GpuEventsComponent), 'Its Xid and ECC events since nodecompute started; null under nvidia-smi, which reports none.'),
  },
  { $id: 'Gpu', description: 'A GPU as the GPU driver lists it: its memory and the compute processes on it.' },
);
export type Gpu = Static<typeof GpuComponent>;

export const LostGpuComponent = Type.Object(
  {
    index: Type.Integer({ minimum: 0, description: 'Its index when it was last listed.' }),
    uuid: Type.String({ description: 'GPU UUID (GPU-...).' }),
    name: Type.String({ description: 'Product name, e.g. NVIDIA H200.' }),
    busId: Nullable(Type.String(), 'Its PCI bus id when it was last listed (as in Gpu), to find it in dmesg; null where the GPU driver reported none.'),
    lastListedAt: Type.String({ format: 'date-time', description: 'When a snapshot last listed it.' }),
    lostAt: Type.String({ format: 'date-time', description: 'When the first snapshot that did not list it was taken: it went between lastListedAt and this.' }),
    unreachable: Nullable(
      Type.String(),
      'What the latest listing said of its bus id, when the GPU driver said beside the GPUs it listed that it cannot reach this one (e.g. "Unknown Error", "GPU is lost. Reboot the system to recover this GPU"); null when it said nothing of it.',
    ),
  },
  { $id: 'LostGpu', description: 'A GPU the GPU driver listed earlier in this run of nodecompute and no longer lists.' },
);

/** The lost GPUs of GET /gpus and GET /gpus/foreign-memory. */
export const LostGpusComponent = Type.Array(Ref(LostGpuComponent), {
  $id: 'LostGpus',
  description:
    'GPUs the GPU driver listed earlier in this run of nodecompute and no longer lists (fallen off the bus, reset or detached: see dmesg for Xid errors), by index; empty when none. A GPU lost before nodecompute started is not known here.',
});

/** An answer per GPU (GET /gpus, GET /gpus/foreign-memory): the snapshot, one `gpu` per GPU, and the GPUs lost. */
export const perGpuAnswer = <T extends TSchema>(gpu: T, gpus: string, description: string) =>
  Type.Intersect(
    [Ref(SnapshotMetaComponent), Type.Object({ gpus: Type.Array(Ref(gpu), { description: gpus }), lostGpus: Ref(LostGpusComponent) })],
    { description },
  );

export const GpusResponseSchema = perGpuAnswer(GpuComponent, 'Every GPU the GPU driver sees, by index.', 'The GPUs of this node and the processes on them.');
export type GpusResponse = Static<typeof GpusResponseSchema>;
