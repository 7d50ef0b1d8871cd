import t from 'tap';
import * as errors from '../src/errors.js';
import { isCodedError, DRIVER_FAILURE_CODES, NvidiaSmiTimeoutError, UnknownGpuError } from '../src/errors.js';

t.test('coded errors carry their code, status, message and cause', async (t) => {
  const cause = new Error('boom');
  const err = new NvidiaSmiTimeoutError('nvidia-smi took longer than 2000 ms', { cause });
  t.equal(err.code, 'NODECOMPUTE_NVIDIA_SMI_TIMEOUT');
  t.equal(err.statusCode, 503);
  t.equal(err.message, 'nvidia-smi took longer than 2000 ms');
  t.equal(err.cause, cause);
  t.ok(isCodedError(err));
  t.ok(isCodedError(new UnknownGpuError('GPU 9 does not exist')));
  t.notOk(isCodedError(new Error('plain')));
  t.notOk(isCodedError(Object.assign(new Error('x'), { code: 'ENOENT', statusCode: 1 })));
});

t.test('the nvidia-smi failure codes are exactly those of the nvidia-smi error classes, so each has its metrics counter', async (t) => {
  // Every coded class errors.ts exports, by the code an instance carries: @fastify/error classes
  // carry no code of their own.
  const codes = Object.values(errors as Record<string, unknown>)
    .filter((value): value is new (message: string) => Error => typeof value === 'function' && value.prototype instanceof Error)
    .map((ErrorClass) => new ErrorClass('x'))
    .filter(isCodedError)
    .map((err) => err.code);
  t.ok(codes.includes('NODECOMPUTE_INTERNAL'), `the classes are found (${codes.length})`);
  t.same(
    codes.filter((code) => /^NODECOMPUTE_(NVIDIA_SMI|NVML)_/.test(code)).sort(),
    [...DRIVER_FAILURE_CODES].sort(),
    'a class speaking for a driver query without its code in the list would have no counter; a code in the list without a class is a counter nothing raises',
  );
  t.equal(new Set(codes).size, codes.length, 'no two classes share a code');
});
