// Owns the bodies routes accept: another content type is a coded 415 naming the type to send, as is
// a body nodecompute would read wrong: a compressed one (nothing here decodes a Content-Encoding) or
// one in a charset other than UTF-8. RFC 9110 8.4: the 415 says which coding is taken (Accept-Encoding).
import type { FastifyReply, FastifyRequest } from 'fastify';
import { safeParse } from 'fast-content-type-parse';
import { UnsupportedMediaTypeError } from '../errors.js';

/** The charsets a body is read in as it is: UTF-8 (also spelt utf8) and its subset US-ASCII, by its IANA names and "ascii". */
const READ_AS_UTF8 = new Set(['utf-8', 'utf8', 'us-ascii', 'ascii', 'ansi_x3.4-1968', 'ansi_x3.4-1986', 'iso_646.irv:1991', 'iso646-us', 'us', 'ibm367', 'cp367', 'csascii', 'iso-ir-6']);

/** An onRequest hook: refuses, before the body is read, a body of another type, encoded or in another charset. */
export function requireContentType(expected: 'application/json' | 'text/plain', example: string) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const header = request.headers['content-type'] ?? '';
    const { type, parameters } = safeParse(header);
    if (type === '' && header !== '') {
      throw new UnsupportedMediaTypeError(`This Content-Type header cannot be read ("${header}"): send "Content-Type: ${expected}", or with "; charset=utf-8". Example: ${example}`);
    }
    if (type !== expected) {
      throw new UnsupportedMediaTypeError(`This endpoint takes ${expected}, not "${header || 'no content type'}". Example: ${example}`);
    }
    const codings = (request.headers['content-encoding'] ?? '')
      .split(',')
      .map((coding) => coding.trim())
      .filter((coding) => coding !== '' && coding.toLowerCase() !== 'identity');
    if (codings.length > 0) {
      reply.header('accept-encoding', 'identity');
      throw new UnsupportedMediaTypeError(
        `This body is encoded ("Content-Encoding: ${codings.join(', ')}"), and nodecompute would read the encoded bytes as ${expected}: ` +
          `send it uncompressed, without a Content-Encoding header. Example: ${example}`,
      );
    }
    const charset = parameters.charset;
    if (charset !== undefined && !READ_AS_UTF8.has(charset.toLowerCase())) {
      throw new UnsupportedMediaTypeError(
        `This endpoint reads ${expected} as UTF-8, not "${charset}": convert it (iconv -f ${charset} -t UTF-8) ` +
          `and send "Content-Type: ${expected}; charset=utf-8", or no charset. Example: ${example}`,
      );
    }
  };
}
