// Owns the choice between the status page's HTML and its text: only a client that prefers text/html
// strictly over text/plain (a browser) gets HTML; ties, no Accept header and curl's */* get text.
import Negotiator from 'negotiator';

export function prefersHtml(accept: string | undefined): boolean {
  if (!accept) return false;
  return new Negotiator({ headers: { accept } }).mediaType(['text/plain', 'text/html']) === 'text/html';
}
