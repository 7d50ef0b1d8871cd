// Owns the binding to libnvidia-ml.so.1 through koffi: which symbols exist (newest version first, as
// go-nvml resolves them), and one call shape: every call runs on a thread of libuv's pool (koffi's
// `.async`), so a driver that blocks never blocks the event loop; out-parameters are plain Buffers
// read by the caller.
import koffi from 'koffi';

/** nvmlReturn_t values this service acts on (nvml.h). */
export const NVML = {
  SUCCESS: 0,
  ERROR_UNINITIALIZED: 1,
  ERROR_NO_PERMISSION: 4,
  ERROR_NOT_FOUND: 6,
  ERROR_INSUFFICIENT_SIZE: 7,
  ERROR_DRIVER_NOT_LOADED: 9,
  ERROR_FUNCTION_NOT_FOUND: 13,
  ERROR_GPU_IS_LOST: 15,
  ERROR_LIB_RM_VERSION_MISMATCH: 18,
  ERROR_UNKNOWN: 999,
} as const;

/** Each function: its C signature with `%s` for the name, and the names to try, newest first. */
const FUNCTIONS = {
  init: ['int %s(void)', ['nvmlInit_v2', 'nvmlInit']],
  driverVersion: ['int %s(void *version, unsigned int length)', ['nvmlSystemGetDriverVersion']],
  cudaVersion: ['int %s(void *version)', ['nvmlSystemGetCudaDriverVersion_v2', 'nvmlSystemGetCudaDriverVersion']],
  count: ['int %s(void *count)', ['nvmlDeviceGetCount_v2', 'nvmlDeviceGetCount']],
  handleByIndex: ['int %s(unsigned int index, void *device)', ['nvmlDeviceGetHandleByIndex_v2', 'nvmlDeviceGetHandleByIndex']],
  uuid: ['int %s(uint64_t device, void *uuid, unsigned int length)', ['nvmlDeviceGetUUID']],
  name: ['int %s(uint64_t device, void *name, unsigned int length)', ['nvmlDeviceGetName']],
  pciInfo: ['int %s(uint64_t device, void *pci)', ['nvmlDeviceGetPciInfo_v3', 'nvmlDeviceGetPciInfo_v2']],
  memoryV2: ['int %s(uint64_t device, void *memory)', ['nvmlDeviceGetMemoryInfo_v2']],
  memory: ['int %s(uint64_t device, void *memory)', ['nvmlDeviceGetMemoryInfo']],
  migMode: ['int %s(uint64_t device, void *current, void *pending)', ['nvmlDeviceGetMigMode']],
  maxMigDevices: ['int %s(uint64_t device, void *count)', ['nvmlDeviceGetMaxMigDeviceCount']],
  migHandle: ['int %s(uint64_t device, unsigned int index, void *migDevice)', ['nvmlDeviceGetMigDeviceHandleByIndex']],
  gpuInstanceId: ['int %s(uint64_t device, void *id)', ['nvmlDeviceGetGpuInstanceId']],
  computeInstanceId: ['int %s(uint64_t device, void *id)', ['nvmlDeviceGetComputeInstanceId']],
  utilizationRates: ['int %s(uint64_t device, void *utilization)', ['nvmlDeviceGetUtilizationRates']],
  processes: ['int %s(uint64_t device, void *count, void *infos)', ['nvmlDeviceGetComputeRunningProcesses_v3']],
  processesV2: ['int %s(uint64_t device, void *count, void *infos)', ['nvmlDeviceGetComputeRunningProcesses_v2']],
  processesV1: ['int %s(uint64_t device, void *count, void *infos)', ['nvmlDeviceGetComputeRunningProcesses']],
  processName: ['int %s(unsigned int pid, void *name, unsigned int length)', ['nvmlSystemGetProcessName']],
  processUtilization: ['int %s(uint64_t device, void *samples, void *count, uint64_t lastSeen)', ['nvmlDeviceGetProcessUtilization']],
  eventSetCreate: ['int %s(void *set)', ['nvmlEventSetCreate']],
  supportedEvents: ['int %s(uint64_t device, void *types)', ['nvmlDeviceGetSupportedEventTypes']],
  registerEvents: ['int %s(uint64_t device, uint64_t types, uint64_t set)', ['nvmlDeviceRegisterEvents']],
  eventWait: ['int %s(uint64_t set, void *data, unsigned int timeoutMs)', ['nvmlEventSetWait_v2', 'nvmlEventSetWait']],
} as const satisfies Record<string, readonly [string, readonly string[]]>;

export type NvmlFunction = keyof typeof FUNCTIONS;

/** A device handle (nvmlDevice_t), carried as the pointer's value: passed as uint64_t, which the 64-bit ABIs pass as a pointer. */
export type DeviceHandle = bigint;

export interface NvmlLibrary {
  /** Where it was loaded from: the name given to the loader, or the explicit path. */
  readonly path: string;
  /** Calls `fn` on a thread of libuv's pool; a symbol the library lacks answers ERROR_FUNCTION_NOT_FOUND ("not supported here"). */
  call(fn: NvmlFunction, ...args: unknown[]): Promise<number>;
  has(fn: NvmlFunction): boolean;
  /** The symbol `fn` is bound to (nvmlDeviceGetCount_v2), for messages; its newest name when the library lacks it. */
  symbol(fn: NvmlFunction): string;
  /** The library's own words for a return code ("GPU is lost"). */
  errorString(code: number): string;
}

type AsyncFunction = { async: (...args: unknown[]) => void };

/** Calls of every library loaded in this process that have not returned: while any is, the process cannot end the usual way. */
let callsUnderWay = 0;

/** NVML calls under way in this process, whichever driver made them (one given up at start included). */
export function nvmlCallsUnderWay(): number {
  return callsUnderWay;
}

/** Loads the library (dlopen: a soname goes through LD_LIBRARY_PATH and the ld.so cache); throws the loader's error. */
export function loadNvmlLibrary(path: string): NvmlLibrary {
  const lib = koffi.load(path);
  const bound = new Map<NvmlFunction, { bind: AsyncFunction; name: string }>();
  for (const [fn, [signature, names]] of Object.entries(FUNCTIONS) as [NvmlFunction, readonly [string, readonly string[]]][]) {
    for (const name of names) {
      try {
        bound.set(fn, { bind: lib.func(signature.replace('%s', name)) as AsyncFunction, name });
        break;
      } catch {
        // Not exported by this driver: try the older name.
      }
    }
  }
  const errorString = lib.func('const char *nvmlErrorString(int result)');
  return {
    path,
    has: (fn) => bound.has(fn),
    symbol: (fn) => bound.get(fn)?.name ?? (FUNCTIONS[fn][1][0] as string),
    call(fn, ...args) {
      const found = bound.get(fn);
      if (found === undefined) return Promise.resolve(NVML.ERROR_FUNCTION_NOT_FOUND);
      return new Promise((resolve, reject) => {
        found.bind.async(...args, (err: unknown, code: number) => {
          callsUnderWay -= 1;
          if (err) reject(err);
          else resolve(code);
        });
        callsUnderWay += 1;
      });
    },
    errorString: (code) => String(errorString(code)),
  };
}

/** A C string from an out-buffer: up to its first NUL. */
export function cString(buffer: Buffer): string {
  const end = buffer.indexOf(0);
  return buffer.toString('utf8', 0, end < 0 ? buffer.length : end);
}

