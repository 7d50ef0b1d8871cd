// Every coded error the service raises, with its HTTP status; all answer in one body shape
// ({ statusCode, code, error, message }). Client errors of Fastify and its /docs server are coded in
// http/errors.ts. Each takes the whole operator-facing message, then optionally `{ cause }`.
import createError from '@fastify/error';

function coded<C extends string, S extends number>(code: C, statusCode: S) {
  return createError<C, S, [message: string, options?: { cause: unknown }]>(code, '%s', statusCode);
}

/** Every code a driver query (nvidia-smi run or NVML call) can fail with: metrics.ts starts a failure counter at 0 for each. */
export const DRIVER_FAILURE_CODES = [
  'NODECOMPUTE_NVIDIA_SMI_NOT_FOUND',
  'NODECOMPUTE_NVIDIA_SMI_FAILED',
  'NODECOMPUTE_NVIDIA_SMI_TIMEOUT',
  'NODECOMPUTE_NVIDIA_SMI_UNPARSABLE',
  'NODECOMPUTE_NVML_NOT_FOUND',
  'NODECOMPUTE_NVML_FAILED',
  'NODECOMPUTE_NVML_TIMEOUT',
] as const;

export const NvidiaSmiNotFoundError = coded('NODECOMPUTE_NVIDIA_SMI_NOT_FOUND', 503);
export const NvidiaSmiFailedError = coded('NODECOMPUTE_NVIDIA_SMI_FAILED', 503);
export const NvidiaSmiTimeoutError = coded('NODECOMPUTE_NVIDIA_SMI_TIMEOUT', 503);
export const NvidiaSmiUnparsableError = coded('NODECOMPUTE_NVIDIA_SMI_UNPARSABLE', 503);
/** libnvidia-ml.so.1 could not be loaded or its symbols bound. */
export const NvmlNotFoundError = coded('NODECOMPUTE_NVML_NOT_FOUND', 503);
export const NvmlFailedError = coded('NODECOMPUTE_NVML_FAILED', 503);
export const NvmlTimeoutError = coded('NODECOMPUTE_NVML_TIMEOUT', 503);

export const BadRequestError = coded('NODECOMPUTE_BAD_REQUEST', 400);
export const UnauthorizedError = coded('NODECOMPUTE_UNAUTHORIZED', 401);
export const ForbiddenError = coded('NODECOMPUTE_FORBIDDEN', 403);
/** A write from a web page of another origin (write-guard.ts). */
export const CrossOriginError = coded('NODECOMPUTE_CROSS_ORIGIN', 403);
/** A write trusted for coming from loopback that names a Host other than loopback's (write-guard.ts). */
export const HostNotAllowedError = coded('NODECOMPUTE_HOST_NOT_ALLOWED', 403);
export const NotFoundError = coded('NODECOMPUTE_NOT_FOUND', 404);
export const ShardNotFoundError = coded('NODECOMPUTE_SHARD_NOT_FOUND', 404);
export const MethodNotAllowedError = coded('NODECOMPUTE_METHOD_NOT_ALLOWED', 405);
export const ShardConflictError = coded('NODECOMPUTE_SHARD_CONFLICT', 409);
/** A write whose If-Match or If-None-Match does not hold for the shard as registered (http/conditional.ts). */
export const PreconditionFailedError = coded('NODECOMPUTE_PRECONDITION_FAILED', 412);
export const UnsupportedMediaTypeError = coded('NODECOMPUTE_UNSUPPORTED_MEDIA_TYPE', 415);
export const UnknownGpuError = coded('NODECOMPUTE_UNKNOWN_GPU', 422);
export const UnknownMigDeviceError = coded('NODECOMPUTE_UNKNOWN_MIG_DEVICE', 422);
export const ProcessNotFoundError = coded('NODECOMPUTE_PROCESS_NOT_FOUND', 422);
/** A PID that exists but can never be a shard's: init, or a kernel thread (most often a PID as a container sees it). */
export const NotAShardProcessError = coded('NODECOMPUTE_NOT_A_SHARD_PROCESS', 422);
export const StateWriteFailedError = coded('NODECOMPUTE_STATE_WRITE_FAILED', 503);
/** A change whose write of the state file did not finish in time: not acknowledged, yet it may still be stored. */
export const StateWritePendingError = coded('NODECOMPUTE_STATE_WRITE_PENDING', 503);
export const ProcUnreadableError = coded('NODECOMPUTE_PROC_UNREADABLE', 503);
export const InternalError = coded('NODECOMPUTE_INTERNAL', 500);

// Raised at start-up only: they stop the service before it listens.
export const ConfigInvalidError = coded('NODECOMPUTE_CONFIG_INVALID', 500);
export const StateFileInvalidError = coded('NODECOMPUTE_STATE_FILE_INVALID', 500);

/** What a state directory that takes no writes means and what to do: one text for the log and for /readyz. */
export function cannotStoreMessage(path: string, why: { reason: string; fix?: string }): string {
  const fix = why.fix ?? 'Make the directory writable (a read-write volume, not full; a hung mount: its server, `dmesg`) or move NODECOMPUTE_STATE_FILE.';
  return `Registrations cannot be stored in ${path}: ${why.reason}. Every registration and removal is refused (503) until they can; the shards already stored are kept and served. ${fix}`;
}

/** A coded error of this module, recognised by its code prefix rather than by class. */
export interface CodedError extends Error {
  code: string;
  statusCode: number;
}

/** An error of the NvidiaSmi*Error or Nvml*Error classes: what a failed driver query rejects with. */
export type DriverFailure = CodedError & { code: (typeof DRIVER_FAILURE_CODES)[number] };

export function isCodedError(err: unknown): err is CodedError {
  const e = err as Partial<CodedError>;
  return err instanceof Error && typeof e.code === 'string' && e.code.startsWith('NODECOMPUTE_') && typeof e.statusCode === 'number';
}
