// Owns the schema pieces every route shares: the error body, nullable fields and the snapshot
// metadata of every snapshot-derived answer. A shape the OpenAPI document names once is a component
// (`XComponent`, with an `$id`), registered once (index.ts) and named elsewhere with Ref ($ref).
import { Type, type Static, type TSchema, type TUnsafe } from '@sinclair/typebox';

/** A reference (`$ref`) to a component, typed as the component. */
export function Ref<T extends TSchema>(component: T): TUnsafe<Static<T>> {
  if (component.$id === undefined) throw new TypeError('Ref: the component has no $id');
  return Type.Unsafe<Static<T>>(Type.Ref(component.$id));
}

/**
 * A value or null. For a primitive it is one schema with `type: [t, "null"]` (OpenAPI 3.1), which
 * fast-json-stringify serialises directly; an anyOf would make it run a validator for every value.
 */
export function Nullable<T extends TSchema>(schema: T, description: string): TUnsafe<Static<T> | null> {
  if (typeof schema.type === 'string' && schema.type !== 'object' && schema.type !== 'array') {
    return Type.Unsafe<Static<T> | null>({ ...schema, type: [schema.type, 'null'], description });
  }
  return Type.Unsafe<Static<T> | null>(Type.Union([schema, Type.Null()], { description }));
}

export const ErrorComponent = Type.Object(
  {
    statusCode: Type.Integer({ description: 'The HTTP status code, repeated for clients that lose it.' }),
    code: Type.String({ description: 'A stable machine-readable code, e.g. NODECOMPUTE_NVIDIA_SMI_TIMEOUT.' }),
    error: Type.String({ description: 'The HTTP status text.' }),
    message: Type.String({ description: 'What happened, what it means and what to do.' }),
  },
  { $id: 'Error', description: 'The body of every error answer.' },
);
/** The error body, as routes name it: a reference to the Error component. */
export const ErrorSchema = Ref(ErrorComponent);

/** The snapshot behind a GPU or compute answer: its fields, the same in each (`allOf` with SnapshotMeta). */
export const SnapshotMetaComponent = Type.Object(
  {
    observedAt: Type.String({
      format: 'date-time',
      description:
        'When the node snapshot behind this answer was completed; its GPU driver and /proc reads began up to one GPU driver query before (ageMs counts from here). ' +
        'So observedAt after registeredAt does not mean a snapshot saw a shard: one that began before the registration is stale, saying the shard registry changed since it was taken.',
    }),
    ageMs: Type.Integer({ minimum: 0, description: 'Age of that snapshot in milliseconds when this answer was made.' }),
    stale: Type.Boolean({
      description:
        'True when the snapshot is older than the cache TTL or than the latest registration change. Usually routine: a newer one is being taken ' +
        '(stale-while-revalidate). staleReason blames the GPU driver only when the last refresh failed or the one under way is far slower than usual.',
    }),
    staleReason: Type.Optional(
      Type.String({
        description: 'Why the snapshot is stale ("refreshing: …", a registry change, "the GPU driver is slow: …" or "the last refresh failed: …"); present only when stale.',
      }),
    ),
  },
  { $id: 'SnapshotMeta', description: 'The node snapshot an answer comes from: when it was observed, how old it is and whether it is stale.' },
);

/**
 * One of a few strings, as a JSON Schema `enum`: a wrong value gets one error listing the choices, and
 * fast-json-stringify writes it without running a validator (a union of literals would do both worse).
 */
export function StringEnum<const T extends readonly string[]>(values: T, description: string): TUnsafe<T[number]> {
  return Type.Unsafe<T[number]>({ type: 'string', enum: [...values], description });
}

/** One of `values` or null, as one `enum` with null among its values (a nullable enum must list null to accept it). */
export function NullableStringEnum<const T extends readonly string[]>(values: T, description: string): TUnsafe<T[number] | null> {
  return Type.Unsafe<T[number] | null>({ type: ['string', 'null'], enum: [...values, null], description });
}

/** Error responses, by status, for a route's `response` schema. */
export function errorResponses<const S extends readonly number[]>(...statuses: S): { [K in S[number]]: typeof ErrorSchema } {
  return Object.fromEntries(statuses.map((status) => [status, ErrorSchema])) as { [K in S[number]]: typeof ErrorSchema };
}
