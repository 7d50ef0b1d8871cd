// Owns the content types routes accept: a body in any other type is a coded 415 that says which
// type to send, not a confusing schema error about its parsed shape.
import type { FastifyRequest } from 'fastify';
import { UnsupportedMediaTypeError } from '../src/errors.js';

export function requireContentType(expected: 'application/json' | 'text/plain', example: string) {
  const pattern = new RegExp(`^${expected.replace('/', '\\/')}\\s*(;|$)`, 'i');
  return async (request: FastifyRequest): Promise<void> => {
    const type = request.headers['content-type'] ?? '';
    if (!pattern.test(type)) {
      throw new UnsupportedMediaTypeError(`This endpoint takes ${expected}, not "${type || 'no content type'}". Example: ${example}`);
    }
  };
}
