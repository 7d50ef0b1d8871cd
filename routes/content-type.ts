// Owns the bodies routes accept: one in any other content type is a coded 415 that says which type
// to send, not a confusing schema error about its parsed shape. So is a body nodecompute would read
// wrong: a compressed one (Content-Encoding other than identity; nothing here decodes it, so gzip's
// bytes would be stored as engine text or called "not valid JSON") and one declared in a charset
// other than UTF-8 (read as UTF-8, its text would be mangled). RFC 9110 8.4 names 415 for the first;
// its Accept-Encoding header says which coding is taken (15.5.16).
import type { FastifyReply, FastifyRequest } from 'fastify';
import { UnsupportedMediaTypeError } from '../src/errors.js';

/** The charsets a body is read in as it is: UTF-8 (also spelt utf8) and its subset US-ASCII. */
const READ_AS_UTF8 = new Set(['utf-8', 'utf8', 'us-ascii']);

/** The charset parameter of a Content-Type, unquoted; null without one. */
function charsetOf(type: string): string | null {
  for (const parameter of type.split(';').slice(1)) {
    const charset = /^\s*charset\s*=\s*(.*?)\s*$/i.exec(parameter);
    if (charset) return charset[1]!.replace(/^"(.*)"$/, '$1');
  }
  return null;
}

/** The content codings a Content-Encoding header names other than identity (none: the body is as sent). */
function codingsOf(header: string | undefined): string[] {
  return (header ?? '')
    .split(',')
    .map((coding) => coding.trim())
    .filter((coding) => coding !== '' && coding.toLowerCase() !== 'identity');
}

export function requireContentType(expected: 'application/json' | 'text/plain', example: string) {
  const pattern = new RegExp(`^${expected.replace('/', '\\/')}\\s*(;|$)`, 'i');
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const type = request.headers['content-type'] ?? '';
    if (!pattern.test(type)) {
      throw new UnsupportedMediaTypeError(`This endpoint takes ${expected}, not "${type || 'no content type'}". Example: ${example}`);
    }
    const codings = codingsOf(request.headers['content-encoding']);
    if (codings.length > 0) {
      reply.header('accept-encoding', 'identity');
      throw new UnsupportedMediaTypeError(
        `This endpoint takes the body as it is, and this one is encoded ("Content-Encoding: ${codings.join(', ')}"): nodecompute does not decode request bodies, ` +
          `so it would read the encoded bytes as ${expected}. Send it uncompressed, without a Content-Encoding header. Example: ${example}`,
      );
    }
    const charset = charsetOf(type);
    if (charset !== null && !READ_AS_UTF8.has(charset.toLowerCase())) {
      throw new UnsupportedMediaTypeError(
        `This endpoint reads ${expected} as UTF-8, and this body says it is "${charset}" (the charset of its Content-Type): read as UTF-8 its text would be mangled. ` +
          `Convert it (iconv -f ${charset} -t UTF-8) and send "Content-Type: ${expected}; charset=utf-8", or no charset. Example: ${example}`,
      );
    }
  };
}
