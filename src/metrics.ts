// Owns the Prometheus metrics (prefix nodecompute_, bytes, seconds), one registry per app. Node and
// shard series are rebuilt from the snapshot at every scrape, so a deleted shard's series go with
// it; nvidia-smi runs and refused writes are counted as they happen.
import { createRequire } from 'node:module';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import { WRITE_REFUSALS, type TokenFileState, type WriteRefusal } from './auth.js';
import { DRIVER_FAILURE_CODES } from './errors.js';
import { foreignMemory } from './node-state/foreign-memory.js';
import type { LostGpu } from './node-state/gpu-roster.js';
import { smUtilOf } from './node-state/attribution.js';
import { shardCpuCores, type NodeView } from './node-state/node-view.js';
import { placedIndices } from './node-state/placement.js';
import { READINESS_STATES } from './shards/verdict.js';
import { shardWeights } from './shards/weights.js';
import type { ShardState } from './shards/shard-service.js';
import type { Backend, QueryName, QueryObservation } from './system/gpu-driver.js';
import { VERSION } from './version.js';

const MIB = 1024 * 1024;

type DefaultCollector = (registry: Registry, config: { eventLoopMonitoringPrecision: number }) => void;
// prom-client's defaults but `gc`, whose observer costs every collection. prom-client cannot leave
// one out, so its own list and files are used: a renamed collector fails at start, not silently.
const DEFAULT_COLLECTORS = collectDefaultMetrics.metricsList.filter((name) => name !== 'gc');
const requireCollector = createRequire(import.meta.url);

/** Every query: its failure counter starts at 0 for every code a run can fail with (errors.ts), so rate() sees the first failure. */
const QUERIES: readonly QueryName[] = ['gpus', 'compute-apps', 'version'];

export type Metrics = ReturnType<typeof createMetrics>;
type Scrape = {
  node: NodeView | null; ageMs: number | null; nvidiaSmiUp: boolean; shards: ShardState[];
  tokenFile: TokenFileState | null; lostGpus: ReadonlyArray<Pick<LostGpu, 'index' | 'uuid'>>;
};

export function createMetrics() {
  const registry = new Registry();
  for (const name of DEFAULT_COLLECTORS) {
    (requireCollector(`prom-client/lib/metrics/${name}`) as DefaultCollector)(registry, { eventLoopMonitoringPrecision: 10 });
  }
  // Gauges named *_total, which Prometheus reserves for counters (promtool rejects them).
  for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) registry.removeSingleMetric(name);
  const gpuLabels = ['gpu', 'uuid'] as const;
  const gauge = (name: string, help: string, labelNames: readonly string[] = []) => new Gauge({ name, help, labelNames, registers: [registry] });

  const total = gauge('nodecompute_gpu_memory_total_bytes', 'Total memory of the GPU.', gpuLabels);
  const used = gauge('nodecompute_gpu_memory_used_bytes', 'Used memory of the GPU.', gpuLabels);
  const free = gauge('nodecompute_gpu_memory_free_bytes', 'Free memory of the GPU.', gpuLabels);
  const reserved = gauge('nodecompute_gpu_memory_reserved_bytes', 'Memory of the GPU reserved by the driver.', gpuLabels);
  const foreign = gauge('nodecompute_gpu_memory_foreign_bytes', 'Memory of the GPU held by anything but a registered shard: not to be handed out.', gpuLabels);
  const utilization = gauge('nodecompute_gpu_utilization_ratio', "Share of the driver's last sample period in which a kernel ran on the GPU (utilization.gpu, 1 = 100%).", gpuLabels);
  const lostHelp = '1 for each GPU the GPU driver listed earlier in this run and no longer lists or cannot reach (see dmesg); gpu is its last index. ' +
    'Kept while the GPU driver fails (a lost GPU often makes every query fail). Absent when none is lost.';
  const lost = gauge('nodecompute_gpu_lost', lostHelp, gpuLabels);
  const shardMemory = gauge('nodecompute_shard_gpu_memory_bytes', "Memory a shard's processes hold on a GPU.", ['shard', ...gpuLabels]);
  const placedHelp =
    '1 for each GPU a shard was placed on (its registration), under the index the GPU driver gives it now (none once not listed). Memory held elsewhere is stray.';
  const shardPlaced = gauge('nodecompute_shard_gpu_placed', placedHelp, ['shard', 'gpu']);
  const shardReady = gauge('nodecompute_shard_ready', '1 when the shard passes its readiness probe, else 0.', ['shard']);
  const shardState = gauge('nodecompute_shard_state', 'The shard readiness state: 1 for the current one, 0 for the others.', ['shard', 'state']);
  const upHelp = '1 when the last GPU driver refresh succeeded; 0 when it failed (answers then come from an older snapshot, or none) or cannot be asked.';
  const up = gauge('nodecompute_nvidia_smi_up', upHelp);
  const ageHelp = 'Age of the last good node snapshot (NaN before the first); taken on demand, it grows between requests: nvidia_smi_up is the failure signal.';
  const age = gauge('nodecompute_snapshot_age_seconds', ageHelp);
  const visibleHelp = '1 when the GPU processes the GPU driver lists can be matched to this /proc; 0 when hidden (no host PID namespace, or a GPU-sharing ' +
    'layer), so no memory is attributed to a shard. NaN while the GPU driver cannot be asked.';
  const processesVisible = gauge('nodecompute_gpu_processes_visible', visibleHelp);
  const tokenFileHelp = '1 when NODECOMPUTE_TOKEN_FILE was usable at its last look (at most once a second); 0 when not: the tokens last read stay ' +
    'in force, a rotated one is not picked up (GET /doctor says why). Absent without a token file.';
  const tokenFileOk = gauge('nodecompute_token_file_ok', tokenFileHelp, ['file']);
  const tokensHelp = 'Write tokens in force from NODECOMPUTE_TOKEN_FILE: 2 during a rotation ("old + new"), 1 before and after. Absent without a token file.';
  const tokensInForce = gauge('nodecompute_token_file_tokens', tokensHelp, ['file']);
  gauge('nodecompute_build_info', 'Always 1; the version label says which nodecompute runs.', ['version']).set({ version: VERSION }, 1);
  const counter = (name: string, help: string, labelNames: readonly string[]) => new Counter({ name, help, labelNames, registers: [registry] });
  const duration = new Histogram({
    name: 'nodecompute_nvidia_smi_query_duration_seconds',
    help: 'Duration of GPU driver queries, by query.',
    labelNames: ['query'],
    buckets: [0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [registry],
  });
  const failuresHelp = 'GPU driver queries that failed, by query and reason (the error code).';
  const failures = counter('nodecompute_nvidia_smi_failures_total', failuresHelp, ['query', 'reason']);
  const refusedHelp =
    'Writes refused before they were looked at, by reason: missing-token, wrong-token (none in force: a caller left behind by a rotation), ' +
    'not-loopback (no token, from the network), cross-origin (a web page of another origin), foreign-host (no token, another Host: DNS rebinding).';
  const refusedWrites = counter('nodecompute_writes_refused_total', refusedHelp, ['reason']);

  for (const query of QUERIES) for (const reason of DRIVER_FAILURE_CODES) failures.inc({ query, reason }, 0);
  for (const reason of WRITE_REFUSALS) refusedWrites.inc({ reason }, 0);
  const backendHelp = 'Always 1: backend is where the GPU figures come from (nvml or nvidia-smi). The nvidia_smi_* series count its queries, whichever it is.';
  const backendInfo = gauge('nodecompute_gpu_backend_info', backendHelp, ['backend']);
  // Counts the NVML backend keeps since start, rebuilt at each scrape: monotonic while nodecompute runs. Absent under nvidia-smi.
  const xids = counter('nodecompute_gpu_xid_errors_total', 'Xid events NVML reported for the GPU since nodecompute started, by Xid number (see dmesg).', [...gpuLabels, 'xid']);
  const ecc = counter('nodecompute_gpu_ecc_errors_total', 'ECC error events NVML reported for the GPU since nodecompute started (single-bit: corrected).', [...gpuLabels, 'type']);
  const smHelp = "SM utilization of a shard's processes on a GPU (NVML's per-process samples, 1 = 100%): near 0 while the shard is busy means its work is not on this GPU.";
  const shardSm = gauge('nodecompute_shard_gpu_sm_utilization_ratio', smHelp, ['shard', ...gpuLabels]);
  const cpuHelp = "CPU cores a shard's processes used between the last two snapshots (/proc/PID/stat); several while its GPUs do no work means it computes on the CPU.";
  const shardCpu = gauge('nodecompute_shard_cpu_cores', cpuHelp, ['shard']);
  const weightsHelp = "A shard's model weights (GGUF files its processes loaded), by where: total (the files), host (still mapped in host memory), gpu (estimated on its GPUs).";
  const shardWeightsBytes = gauge('nodecompute_shard_weights_bytes', weightsHelp, ['shard', 'where']);
  const shareHelp = "Estimated share of a shard's model weights on its GPUs (1 = all); near 0 while its GPUs are held: it computes on the CPU.";
  const shardWeightsShare = gauge('nodecompute_shard_weights_gpu_ratio', shareHelp, ['shard']);

  const migHelp = "A MIG device's memory (NVML only), by kind: total, used, free, and foreign (used by anything that is not a registered shard).";
  const migMemory = gauge('nodecompute_mig_device_memory_bytes', migHelp, [...gpuLabels, 'mig_uuid', 'profile', 'kind']);

  const rebuiltGauges = [total, used, free, reserved, foreign, utilization, lost, migMemory, shardMemory, shardPlaced, shardReady, shardState, tokenFileOk, tokensInForce];
  const setMiB = (metric: Gauge, labels: Record<string, string>, mib: number | null) => {
    if (mib !== null) metric.set(labels, mib * MIB);
  };

  return {
    registry,
    countRefusedWrite: (reason: WriteRefusal) => refusedWrites.inc({ reason }),
    /** Names the backend the GPU figures come from (set once, at start). */
    setBackend: (backend: Backend) => backendInfo.set({ backend }, 1),
    observeQuery(observation: QueryObservation) {
      if (observation.durationMs !== null) duration.observe({ query: observation.query }, observation.durationMs / 1000);
      if (observation.outcome !== 'ok') failures.inc({ query: observation.query, reason: observation.outcome });
    },
    /** Rebuilds the node and shard series; `lostGpus` stay while nvidia-smi fails, so their alert does not resolve then. */
    update({ node, ageMs, nvidiaSmiUp, lostGpus, shards, tokenFile }: Scrape) {
      for (const metric of [...rebuiltGauges, xids, ecc, shardSm, shardCpu, shardWeightsBytes, shardWeightsShare]) metric.reset();
      if (tokenFile !== null) {
        tokenFileOk.set({ file: tokenFile.path }, tokenFile.problem === null ? 1 : 0);
        tokensInForce.set({ file: tokenFile.path }, tokenFile.tokens);
      }
      up.set(node !== null && nvidiaSmiUp ? 1 : 0);
      age.set(ageMs === null ? Number.NaN : ageMs / 1000);
      processesVisible.set(node === null ? Number.NaN : node.processesHidden === null ? 1 : 0);
      if (node) {
        // One entry per GPU, in the snapshot's order.
        const foreignOf = foreignMemory(node);
        for (const [i, gpu] of node.snapshot.gpus.entries()) {
          const labels = { gpu: String(gpu.index), uuid: gpu.uuid };
          setMiB(total, labels, gpu.totalMiB);
          setMiB(used, labels, gpu.usedMiB);
          setMiB(free, labels, gpu.freeMiB);
          setMiB(reserved, labels, gpu.reservedMiB);
          setMiB(foreign, labels, foreignOf[i]!.foreignMiB);
          for (const [j, mig] of (gpu.migDevices ?? []).entries()) {
            const migLabels = { ...labels, mig_uuid: mig.uuid, profile: mig.profile };
            const kinds = { total: mig.totalMiB, used: mig.usedMiB, free: mig.freeMiB, foreign: foreignOf[i]!.migDevices![j]!.foreignMiB };
            for (const [kind, mib] of Object.entries(kinds)) setMiB(migMemory, { ...migLabels, kind }, mib);
          }
          if (gpu.utilizationPct !== null) utilization.set(labels, gpu.utilizationPct / 100);
          if (gpu.events === undefined) continue;
          for (const [xid, count] of Object.entries(gpu.events.xid)) xids.inc({ ...labels, xid }, count);
          ecc.inc({ ...labels, type: 'single-bit' }, gpu.events.eccSingleBit);
          ecc.inc({ ...labels, type: 'double-bit' }, gpu.events.eccDoubleBit);
        }
        for (const [shard, holdings] of node.attribution.holdings) {
          // NaN, not absent, where nvidia-smi does not report it: the series still says the shard holds that GPU.
          for (const holding of holdings.values()) {
            const labels = { shard, gpu: String(holding.index), uuid: holding.uuid };
            shardMemory.set(labels, holding.usedMiB === null ? NaN : holding.usedMiB * MIB);
            const smUtilPct = smUtilOf(holding.processes);
            if (smUtilPct !== null) shardSm.set(labels, smUtilPct / 100);
          }
        }
      }
      for (const gpu of lostGpus) lost.set({ gpu: String(gpu.index), uuid: gpu.uuid }, 1);
      for (const { shard, readiness } of shards) {
        shardReady.set({ shard: shard.id }, readiness.ready ? 1 : 0);
        for (const gpu of placedIndices(shard, node?.snapshot.gpus ?? null)) shardPlaced.set({ shard: shard.id, gpu: String(gpu) }, 1);
        for (const state of READINESS_STATES) shardState.set({ shard: shard.id, state }, state === readiness.state ? 1 : 0);
        if (node === null) continue;
        const cores = shardCpuCores(shard, node);
        if (cores !== null) shardCpu.set({ shard: shard.id }, cores);
        const weights = shardWeights(shard, node);
        for (const [where, bytes] of [['total', weights.bytes], ['host', weights.hostBytes], ['gpu', weights.gpuBytes]] as const) {
          if (bytes !== null) shardWeightsBytes.set({ shard: shard.id, where }, bytes);
        }
        if (weights.gpuShare !== null) shardWeightsShare.set({ shard: shard.id }, weights.gpuShare);
      }
    },
  };
}
