import t from 'tap';
import { isCodedError, NvidiaSmiTimeoutError, UnknownGpuError } from '../src/errors.js';

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
