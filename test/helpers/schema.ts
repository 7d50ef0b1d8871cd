// Validates an answer against its route schema with Ajv and the formats Fastify uses, so a test can
// prove a body is exactly what the OpenAPI document promises (OpenAPI 3.1 nullable types included).
import { Ajv } from 'ajv';
import addFormats from 'ajv-formats';
import type { TSchema } from '@sinclair/typebox';
import { COMPONENTS } from '../../src/schemas/index.js';

const ajv = new Ajv({ allErrors: true, strict: false });
addFormats.default(ajv);
// The route schemas name the shared shapes by reference ($ref: "Gpu"), as Fastify resolves them.
for (const component of COMPONENTS) ajv.addSchema(component);

/** The schema's complaints about `value`, as "path message" lines; empty when it conforms. */
export function schemaErrors(schema: TSchema, value: unknown): string[] {
  const validate = ajv.compile(schema);
  return validate(value) ? [] : (validate.errors ?? []).map((error) => `${error.instancePath || '/'} ${error.message ?? ''}`);
}
