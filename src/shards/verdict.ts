// Owns the vocabulary of a readiness verdict: its states, its causes (one code per decision, for
// programs; the reason says it for people) and its shape. Only ready and unverified pass the probe.
export const READINESS_STATES = ['ready', 'starting', 'on-cpu', 'gpu-lost', 'stopped', 'exited', 'unverified'] as const;
export type ReadinessState = (typeof READINESS_STATES)[number];

/** A control plane acts on these: on-cpu by the build is not fixed by a restart, one without GPU layers is by the engine's flags. */
export const VERDICT_CAUSES = [
  // starting
  'awaiting-snapshot', // no snapshot since the registration includes it yet, within its grace
  'awaiting-nvidia-smi', // nvidia-smi cannot be asked, and no listing has shown it on its GPUs since it was registered (or its engine started again)
  'awaiting-gpu-memory', // some GPU not held yet, within its grace
  'awaiting-listing', // grace over, but the latest listing was begun before it ended
  'awaiting-gpu-weights', // every GPU held, its weights in host memory (or below its minimum share), within its grace
  // on-cpu
  'engine-gpu-backend-failed', // the engine says CPU: its GPU backend did not load
  'engine-no-gpu-layers', // the engine says CPU: its GPU backend loaded, with no layers on the GPU
  'engine-reports-cpu', // the engine says CPU, without saying whether its GPU backend loaded
  'memory-on-other-gpu', // no memory on a GPU it was given, memory on one it was not
  'engine-output-conflicts', // no memory on a GPU it was given, while its engine output shows weights on a GPU
  'no-gpu-memory', // no memory on a GPU it was given, grace over
  'weights-in-host-memory', // its GPUs hold little beyond a context while its model stays in host memory (zero offload), grace over
  'partial-offload-below-minimum', // a share of its weights on the GPU below the minimum its registration asks, grace over
  'last-load-on-cpu', // an idle Ollama server whose last model runner ran past the grace without weights on a GPU
  // ready
  'partial-offload', // serving with part of its weights on the CPU (a warning says how much)
  'no-model-loaded', // an Ollama server running no model and holding no GPU memory: the next request loads one
  'model-loading', // an Ollama model runner within its grace from its own start, its GPUs not holding the model yet
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

export type Readiness = { ready: boolean; state: ReadinessState; cause: VerdictCause | null; reason: string | null; warnings: string[] };

export function verdict(state: ReadinessState, cause: VerdictCause | null, reason: string | null, warnings: string[]): Readiness {
  return { ready: state === 'ready' || state === 'unverified', state, cause, reason, warnings };
}

/** "a", "a and b", "a, b and c". */
export function andList(names: string[]): string {
  return names.length <= 1 ? names.join('') : `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;
}

/** "GPU 0", "GPU 0 and GPU 1", "GPU 0, GPU 1 and GPU 2". */
export const gpuList = (indices: number[]): string => andList(indices.map((index) => `GPU ${index}`));
