// Owns the Host header's rule (RFC 9112 3.2): an HTTP/1.1 request names exactly one Host, or it is a
// coded 400. Node would answer a request without one itself, with an empty body, and keeps only the
// first of two, which the write guard's loopback check would then read.
import type { FastifyRequest } from 'fastify';
import { BadRequestError } from '../errors.js';

/** An onRequest hook for every route. */
export async function requireOneHost(request: FastifyRequest): Promise<void> {
  const { rawHeaders, httpVersion } = request.raw;
  let hosts = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) if (rawHeaders[i]!.toLowerCase() === 'host') hosts += 1;
  if (hosts === 1 || (hosts === 0 && httpVersion !== '1.1')) return;
  const said = hosts === 0 ? 'names no Host' : `names ${hosts} Host headers`;
  throw new BadRequestError(`This HTTP/${httpVersion} request ${said}: send exactly one, the name or address and port you reach nodecompute at (curl does).`);
}
