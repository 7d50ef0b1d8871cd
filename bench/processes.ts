// Owns the real processes the benchmarks point nvidia-smi's PIDs at, so /proc reads and attribution
// cost what they cost on a node: shard groups (a detached `sh` leader, the registered PID, with a
// child in its process group that "holds" GPU memory: a `sleep`, or for an Ollama server a model
// runner, an `sh` whose command line names `--model` as Ollama's runners do) and a pool of unrelated
// `sleep` processes that stand for foreign GPU processes. Every process sleeps at most SLEEP_S, so a bench
// that dies without cleaning up leaves nothing behind for long. Cleanup kills the children first so
// that each `sh` reaps its own (no orphans for a PID 1 that may not reap), then the leaders.
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

const SLEEP_S = 600;

export interface ShardGroup {
  /** The leader: the PID a shard is registered with; also its process group id. */
  leader: number;
  /** A child in the leader's process group: the process nvidia-smi lists on the GPU. */
  child: number;
  /** `ollama`: the leader stands for `ollama serve` and its child for the model runner it started. */
  engine: 'other' | 'ollama';
}

/** Every OLLAMA_EVERY-th shard group is an Ollama server, so a refresh reads its model runners too. */
export const OLLAMA_EVERY = 4;
/** The runner: an `sh` that outlives its `sleep` (the `; :` keeps it from exec'ing it), with Ollama's runner arguments. */
const RUNNER = `sh -c 'sleep ${SLEEP_S}; :' runner --model /nonexistent/nodecompute-bench/model --port 0`;

export interface ProcessFarm {
  shards: ShardGroup[];
  /** PIDs of live processes outside every shard group. */
  foreign: number[];
  stop(): Promise<void>;
}

/** Starts `sh -c script` detached and collects the first `lines` lines it prints (PIDs). */
function startPrinter(script: string, lines: number, timeoutMs: number): Promise<{ child: ChildProcess; pids: number[] }> {
  const child = spawn('sh', ['-c', script], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  const pids: number[] = [];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reader.close();
      reject(new Error(`sh printed ${pids.length} of ${lines} PIDs within ${timeoutMs} ms`));
    }, timeoutMs);
    const reader = createInterface({ input: child.stdout! });
    reader.on('line', (line) => {
      pids.push(Number(line));
      if (pids.length === lines) {
        clearTimeout(timer);
        reader.close();
        child.stdout!.destroy();
        resolve({ child, pids });
      }
    });
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

function killQuietly(pid: number, signal: NodeJS.Signals = 'SIGKILL'): void {
  try {
    process.kill(pid, signal);
  } catch {
    // ESRCH: already gone.
  }
}

function exited(child: ChildProcess, timeoutMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

export async function startProcessFarm(shardCount: number, foreignCount: number): Promise<ProcessFarm> {
  const leaders: ChildProcess[] = [];
  const shards: ShardGroup[] = [];
  let pool: { child: ChildProcess; pids: number[] } | null = null;

  const stop = async () => {
    for (const group of shards) killQuietly(group.child);
    for (const pid of pool?.pids ?? []) killQuietly(pid);
    const all = [...leaders, ...(pool ? [pool.child] : [])];
    await Promise.all(all.map((child) => exited(child, 2000)));
    for (const child of all) if (child.pid !== undefined) killQuietly(-child.pid);
  };
  const onExit = () => {
    for (const group of shards) killQuietly(-group.leader);
    if (pool?.child.pid !== undefined) killQuietly(-pool.child.pid);
    for (const pid of pool?.pids ?? []) killQuietly(pid);
  };
  process.once('exit', onExit);

  try {
    for (let i = 0; i < shardCount; i += 1) {
      const engine = i % OLLAMA_EVERY === OLLAMA_EVERY - 1 ? 'ollama' : 'other';
      const started = await startPrinter(`${engine === 'ollama' ? RUNNER : `sleep ${SLEEP_S}`} & echo $!; wait`, 1, 10_000);
      leaders.push(started.child);
      shards.push({ leader: started.child.pid!, child: started.pids[0]!, engine });
    }
    if (foreignCount > 0) {
      pool = await startPrinter(
        `i=0; while [ $i -lt ${foreignCount} ]; do sleep ${SLEEP_S} & echo $!; i=$((i+1)); done; wait`,
        foreignCount,
        60_000,
      );
    }
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    shards,
    foreign: pool?.pids ?? [],
    async stop() {
      await stop();
      process.removeListener('exit', onExit);
    },
  };
}
