// Owns the per-request logger. Fastify gives every request a child logger bound to its request id,
// and a pino child costs more to build than answering a probe from the cache does; yet almost no
// request logs anything (answered requests are not logged, see app.ts). So each request gets a
// stand-in that builds the real child, with the same bindings, the first time it logs.
import type { FastifyBaseLogger } from 'fastify';
import type { Bindings, ChildLoggerOptions } from 'pino';

const LOG_METHODS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

class DeferredChildLogger {
  #child: FastifyBaseLogger | null = null;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly bindings: Bindings,
    private readonly options: ChildLoggerOptions,
  ) {}

  /** The real child logger, built on first use. */
  built(): FastifyBaseLogger {
    return (this.#child ??= this.parent.child(this.bindings, this.options));
  }

  get level(): string {
    return this.#child?.level ?? this.options.level ?? this.parent.level;
  }

  set level(level: string) {
    this.built().level = level;
  }

  child(bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.built().child(bindings, options);
  }
}

// Every log method is the same: build the child, then call the child's method of that name.
for (const method of LOG_METHODS) {
  Object.defineProperty(DeferredChildLogger.prototype, method, {
    value(this: DeferredChildLogger, ...args: unknown[]): void {
      const logger = this.built();
      (logger[method] as (...logged: unknown[]) => void).apply(logger, args);
    },
  });
}

/** Fastify's `childLoggerFactory`: a request logger that costs nothing until the request logs. */
export function deferredChildLogger(parent: FastifyBaseLogger, bindings: Bindings, options: ChildLoggerOptions): FastifyBaseLogger {
  return new DeferredChildLogger(parent, bindings, options) as unknown as FastifyBaseLogger;
}
