// Owns bringing up a nodecompute server for an HTTP figure: a fake nvidia-smi of its own (scenario
// and invocation log in its own directory), its own state file, the 64 shards registered over HTTP
// as a control plane would, and a wait until a snapshot that includes all of them says they are ready.
// The backend is named, never left to auto (a machine with a real libnvidia-ml.so.1 would pick NVML):
// nvidia-smi by default; with `backend: 'nvml'`, the fake libnvidia-ml.so.1 installed beside the same
// scenario.json (as NODECOMPUTE_BACKEND=nvml NODECOMPUTE_NVML_LIBRARY=<it> would set).
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { installFakeNvml } from '../scripts/fake-nvml.js';
import type { Config } from '../src/config.js';
import { createFakeSmi, type FakeSmi, type NodeLayout } from './fake-smi.js';
import { request } from './http-load.js';
import type { ProcessFarm } from './processes.js';
import { startServer, type ServerHandle } from './server-handle.js';

export interface BenchContext {
  /** A private temporary directory for this bench run. */
  dir: string;
  farm: ProcessFarm;
  /** The large node: 8 GPUs, 256 GPU processes, 64 shards (each shard's child on its GPU). */
  layout: NodeLayout;
  shardIds: string[];
}

export interface NodecomputeServer {
  server: ServerHandle;
  /** The fake nvidia-smi, whose scenario.json the fake NVML reads too; under NVML it is never run. */
  fake: FakeSmi;
  backend: 'nvidia-smi' | 'nvml';
}

export function shardId(i: number): string {
  return `shard-${String(i).padStart(2, '0')}`;
}

export async function startNodecompute(ctx: BenchContext, name: string, config: Partial<Config>, delayMs = 0): Promise<NodecomputeServer> {
  const dir = join(ctx.dir, name);
  mkdirSync(dir, { recursive: true });
  const fake = createFakeSmi(dir, { gpus: ctx.layout.gpus, processes: ctx.layout.processes, delayMs });
  const backend = config.backend === 'nvml' ? 'nvml' : 'nvidia-smi';
  const nvmlLibrary = backend === 'nvml' ? (config.nvmlLibrary ?? installFakeNvml(dir)) : null;
  const server = await startServer(name, {
    config: { logLevel: 'warn', nvidiaSmi: fake.path, stateFile: join(dir, 'shards.json'), ...config, backend, nvmlLibrary },
  });
  return { server, fake, backend };
}

/**
 * GPU queries the server has made (gpus and compute-apps; the count of its query duration
 * histogram in /metrics, which counts them whichever the backend); null when /metrics has no such series.
 */
export async function driverQueries(server: ServerHandle): Promise<number | null> {
  const answer = await request(`${server.url}/metrics`);
  if (answer.status !== 200) throw new Error(`GET /metrics answered ${answer.status}`);
  let total: number | null = null;
  for (const match of answer.body.matchAll(/^nodecompute_nvidia_smi_query_duration_seconds_count\{query="(gpus|compute-apps)"\} (\d+)$/gm)) {
    total = (total ?? 0) + Number(match[2]);
  }
  return total;
}

/** Registers every shard of the farm (PUT, 8 at a time). */
export async function registerShards(ctx: BenchContext, server: ServerHandle): Promise<void> {
  const queue = ctx.farm.shards.map((group, i) => ({ id: ctx.shardIds[i]!, pid: group.leader, gpu: ctx.layout.shardGpu[i]!, engine: group.engine }));
  const worker = async () => {
    for (let next = queue.shift(); next; next = queue.shift()) {
      const answer = await request(`${server.url}/shards/${next.id}`, { method: 'PUT', body: { pid: next.pid, gpus: [next.gpu], engine: next.engine } });
      if (answer.status !== 201 && answer.status !== 200) throw new Error(`PUT /shards/${next.id} answered ${answer.status}: ${answer.body}`);
    }
  };
  await Promise.all(Array.from({ length: 8 }, worker));
}

/** Polls GET /shards until every shard is ready (bounded by `timeoutMs`). */
export async function waitAllReady(ctx: BenchContext, server: ServerHandle, timeoutMs = 30_000): Promise<void> {
  const giveUpAt = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < giveUpAt) {
    const answer = await request(`${server.url}/shards`);
    if (answer.status === 200) {
      const list = JSON.parse(answer.body) as { shards: Array<{ id: string; status: { state: string } }> };
      const ready = list.shards.filter((shard) => shard.status.state === 'ready').length;
      if (ready === ctx.shardIds.length) return;
      last = `${ready} of ${ctx.shardIds.length} ready (${[...new Set(list.shards.map((s) => s.status.state))].join(', ')})`;
    } else {
      last = `GET /shards answered ${answer.status}`;
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`${server.name}: the shards did not all become ready within ${timeoutMs} ms: ${last}`);
}

/**
 * Waits until the GPUs have not been queried for `quietMs` (bounded by `timeoutMs`): a registration
 * that arrived while a refresh ran leaves one more refresh due, which the next request starts.
 * One request starts it here, so it does not land inside a measurement. The queries are the fake
 * nvidia-smi's runs, or under NVML the count /metrics gives.
 */
export async function settle(node: NodecomputeServer, quietMs = 1_000, timeoutMs = 15_000): Promise<void> {
  await request(`${node.server.url}/gpus`);
  const giveUpAt = Date.now() + timeoutMs;
  const queries = async () => (node.backend === 'nvml' ? ((await driverQueries(node.server)) ?? 0) : node.fake.invocations().length);
  let seen = await queries();
  let quietSince = Date.now();
  while (Date.now() < giveUpAt) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    const now = await queries();
    if (now !== seen) {
      seen = now;
      quietSince = Date.now();
      await request(`${node.server.url}/gpus`);
    } else if (Date.now() - quietSince >= quietMs) {
      return;
    }
  }
  throw new Error(`${node.server.name}: the GPUs kept being queried (${node.backend}) for ${timeoutMs} ms after the shards were ready`);
}

export async function startRegisteredNode(ctx: BenchContext, name: string, config: Partial<Config>, delayMs = 0): Promise<NodecomputeServer> {
  const node = await startNodecompute(ctx, name, config, delayMs);
  try {
    await registerShards(ctx, node.server);
    await waitAllReady(ctx, node.server);
    await settle(node);
  } catch (err) {
    await node.server.stop();
    throw err;
  }
  return node;
}
