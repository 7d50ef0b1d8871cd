// Owns GET /openapi.json: the OpenAPI document generated from the route schemas (the same one the
// /docs page renders and openapi.yaml holds).
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';

const openapiRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
};

export default openapiRoutes;
