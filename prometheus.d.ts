/// <reference types="node" />
/**
 * stampede-cache/prometheus: a StampedeCache's figures as prom-client metrics, labelled by
 * namespace. Needs `prom-client` (an optional peer dependency). The metrics are listed in the
 * README, "Observability".
 */
// Self-contained on purpose: compiles whether or not prom-client is installed; its Registry fits.
import { StampedeCache } from './index'

/** What this uses of a prom-client `Registry`. */
export interface RegistryLike {
  registerMetric(metric: any): void
  removeSingleMetric(name: string): void
  metrics(): Promise<string>
}

export interface RegisterOptions {
  /** Where the metrics go; default prom-client's global registry. */
  registry?: RegistryLike | undefined
  /** The start of every metric name; default 'stampede_cache_'. */
  prefix?: string | undefined
}

export interface Registration {
  /** Stops reporting this cache (totals keep what it counted); the last one stopped removes the metrics. */
  stop(): void
}

/**
 * Adds `cache`'s metrics to the registry. Caches registered on one registry with one prefix share
 * the metrics, summed by namespace. Throws `StampedeCacheError` (`ERR_INVALID_OPTION`) for a bad option.
 */
export declare function register(cache: StampedeCache, options?: RegisterOptions): Registration
