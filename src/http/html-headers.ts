// Owns the headers of the HTML answers: nosniff, and a Content-Security-Policy that lets the status
// page run no script at all (its CSS is inline, its reload a meta refresh) and /docs load only its
// own assets. A page on the node that embeds them, or injected text in them, can do no more.
import type { FastifyReply } from 'fastify';

const COMMON = "base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'";

export const STATUS_PAGE_CSP = `default-src 'none'; style-src 'unsafe-inline'; img-src data:; ${COMMON}`;
export const DOCS_CSP = `default-src 'self'; img-src 'self' data:; script-src 'self'; script-src-attr 'none'; style-src 'self' 'unsafe-inline'; ${COMMON}`;

export function setHtmlHeaders(reply: FastifyReply, csp: string): void {
  reply.header('x-content-type-options', 'nosniff').header('content-security-policy', csp);
}
