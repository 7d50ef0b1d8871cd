// Owns how a route that answers outside its handler (it returned nothing and sends when a promise
// settles) fails: the error goes to the app's error handler, as a thrown one would. A typed reply
// accepts only its schema's bodies, so the error is sent through the untyped one.
import type { FastifyReply } from 'fastify';

export function sendLateError(reply: FastifyReply, err: Error): void {
  void reply.send(err);
}
