// Owns the 405 of a path that exists asked with a method it lacks, with an Allow header (RFC 9110
// 15.5.6); OPTIONS answers 204 with the same header and no CORS. Fastify's router decides: after the
// last route, each path gets one hidden route for its missing methods, including the ones Node parses
// that Fastify does not know (PROPFIND, ...), so a real method never passes through here.
import { METHODS } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { App } from '../services.js';
import { MethodNotAllowedError } from '../errors.js';

/**
 * Starts collecting the paths of the routes registered from now on; call it before the first
 * route. Call the function it returns after the last route: it adds the hidden routes.
 */
export function answerOtherMethods(app: App): () => void {
  for (const method of METHODS) {
    if (method !== 'CONNECT' && !app.supportedMethods.includes(method)) app.addHttpMethod(method, { hasBody: true });
  }
  const urls = new Set<string>();
  let sealed = false;
  app.addHook('onRoute', (route) => {
    if (!sealed) urls.add(route.url);
  });
  return () => {
    sealed = true;
    for (const url of urls) {
      const methods = app.supportedMethods;
      const answered = methods.filter((method) => app.hasRoute({ url, method }));
      const missing = methods.filter((method) => !answered.includes(method));
      if (missing.length === 0) continue;
      const allow = [...new Set([...answered, 'OPTIONS'])].sort().join(', ');
      // An onRequest hook, so the answer comes before any body is read or parsed: a POST with a
      // broken or oversized JSON body to a GET-only path is still told the method is wrong.
      const refuse = async (request: FastifyRequest, reply: FastifyReply) => {
        reply.header('allow', allow);
        if (request.method === 'OPTIONS') return reply.code(204).send();
        throw new MethodNotAllowedError(
          `${request.method} ${request.url.split('?')[0]} is not allowed: this path answers ${allow} (also in the Allow header). ` +
            'The API is listed at /docs and /openapi.json.',
        );
      };
      app.route({ method: missing, url, schema: { hide: true }, exposeHeadRoute: false, onRequest: refuse, handler: refuse });
    }
  };
}
