/// <reference types="node" />
/**
 * stampede-cache/otel: OpenTelemetry metrics and load spans for a StampedeCache. Needs
 * `@opentelemetry/api` (an optional peer dependency) and an SDK that provides the meter and
 * tracer providers. The metrics and span attributes are listed in the README, "Observability".
 */
// Self-contained on purpose: the providers are typed by the one method this uses, so these types
// compile whether or not @opentelemetry/api is installed; its MeterProvider and TracerProvider fit.
import { StampedeCache } from './index'

/** What this uses of an OpenTelemetry `MeterProvider`. */
export interface MeterProviderLike {
  getMeter(name: string, version?: string, options?: object): unknown
}

/** What this uses of an OpenTelemetry `TracerProvider`. */
export interface TracerProviderLike {
  getTracer(name: string, version?: string, options?: object): unknown
}

export interface InstrumentOptions {
  /** Where the metrics go; default the global one (`metrics.getMeterProvider()`). */
  meterProvider?: MeterProviderLike | undefined
  /** Where the load spans go; default the global one (`trace.getTracerProvider()`). */
  tracerProvider?: TracerProviderLike | undefined
  /** Report metrics; default true. */
  metrics?: boolean | undefined
  /** Report a span per loader call; default true. */
  traces?: boolean | undefined
  /**
   * What a span tells of its key, which may hold a user id: 'hash' (default: the first 16 hex
   * digits of its SHA-256, as `stampede_cache.key.hash`), 'omit', 'raw' (`stampede_cache.key`), or
   * a function whose result is `stampede_cache.key` (an HMAC with your secret, say).
   */
  keys?: 'hash' | 'omit' | 'raw' | ((key: string) => string) | undefined
}

export interface Instrumentation {
  /** Stops reporting this cache; counters keep the totals it reached. */
  stop(): void
}

/** Reports `cache` to OpenTelemetry. Throws `StampedeCacheError` (`ERR_INVALID_OPTION`) for a bad option. */
export declare function instrument(cache: StampedeCache, options?: InstrumentOptions): Instrumentation
