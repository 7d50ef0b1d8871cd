// Owns what Fastify itself reports about answers that went wrong. Fastify runs without a logger of
// its own (app.ts says why), so the lines its LogController writes would go nowhere; this one
// writes the failures to the service's log, with the request they belong to, and does nothing for
// ordinary requests (the service logs those itself, at debug level).
import { LogController, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';

/** The fields that name a request in a log line (the service's own lines use them too). */
export const requestFields = (request: FastifyRequest) => ({ reqId: request.id, method: request.method, url: request.url });

export class ServiceLogController extends LogController {
  readonly #log: Logger;

  constructor(log: Logger) {
    super({ disableRequestLogging: true });
    this.#log = log;
  }

  override incomingRequest(): void {}

  override requestCompleted(): void {}

  override streamError(error: Error, request: FastifyRequest, _reply: FastifyReply): void {
    if ((error as NodeJS.ErrnoException).code === 'ERR_STREAM_PREMATURE_CLOSE') {
      this.#log.debug(requestFields(request), 'The client closed the connection before the answer was complete');
      return;
    }
    this.#log.warn(
      { ...requestFields(request), err: error },
      'An answer failed after its headers were sent, so the client got a cut-off response. If this repeats, report it with this line.',
    );
  }

  override writeHeadError(error: Error, request: FastifyRequest, _reply: FastifyReply): void {
    this.#log.warn({ ...requestFields(request), err: error }, 'Could not write the headers of an error answer; the connection was closed instead');
  }

  override serializerError(error: Error, request: FastifyRequest, _reply: FastifyReply, { statusCode }: { statusCode: number }): void {
    this.#log.error(
      { ...requestFields(request), statusCode, err: error },
      'The error answer could not be serialised with its schema, so a generic 500 was sent; this is a bug in nodecompute, please report it',
    );
  }
}
