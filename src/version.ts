// Owns the service's version: the package's own, so --version, /doctor and OpenAPI agree.
import pkg from '../package.json' with { type: 'json' };

export const VERSION: string = pkg.version;
