// Owns the answer to a path that exists asked with a method it does not have: 405 Method Not Allowed
// with an Allow header listing the methods the path answers (RFC 9110 15.5.6), not the 404 of a
// path that does not exist. Fastify's own router decides: every path the routes registered gets,
// after the last route, one hidden route for the methods it lacks, so matching (parameters, the
// /docs wildcard) is the router's, and a request to a real method never passes through here.
// OPTIONS on a known path answers 204 with the same Allow header (RFC 9110 9.3.7: it asks which
// methods a path takes), so Allow always lists OPTIONS. There is no CORS: the 204 carries no
// Access-Control-* header, so a browser's preflight from another origin still fails, as before.
// The hidden routes stay out of the OpenAPI document (schema.hide). Fastify's router knows only the
// common methods and would send any other that Node's parser accepts (PROPFIND, LOCK, ...) to the
// 404 of a missing path: those become known methods too, answered nowhere, so a known path asked
// with one is a 405 as well. CONNECT never reaches a route (Node hands it to a 'connect' listener).
import { METHODS } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { App } from '../src/app.js';
import { MethodNotAllowedError } from '../src/errors.js';

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
