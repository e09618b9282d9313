/**
 * stampede-cache: stops cache stampedes. One load per key per process (coalescing), stale values
 * served at once while one worker refreshes (stale-while-revalidate), XFetch early refresh, TTL
 * jitter, negative caching and stale-if-error, in a Rust core.
 */

/** A non-empty string, or an array of strings and finite numbers (joined unambiguously). At most 1,024 bytes. */
export type Key = string | readonly (string | number)[]

export interface StampedeCacheOptions {
  /** `'redis://127.0.0.1:6379/0'`. Absent: in-process only (the embedded default). */
  redis?: string
  /** Prefix of every Redis key; default `'sc'`. */
  namespace?: string
  /** Milliseconds an entry is fresh (the soft TTL); default 60_000. */
  ttl?: number
  /** Milliseconds an entry lives at all, stale included; default 10 * ttl; must be >= ttl. */
  hardTtl?: number
  /** In [0, 1): each written entry's ttl and hardTtl are scaled by a random factor in [1-jitter, 1+jitter]; default 0.1. */
  jitter?: number
  /** XFetch beta >= 0; default 1; 0 turns probabilistic early refresh off. */
  beta?: number
  /** Milliseconds a null/undefined loader result is cached; default 5_000; 0 caches none. */
  negativeTtl?: number
  /** Milliseconds the cross-process refresh lock lives; default 10_000. */
  lockTtl?: number
  /** Milliseconds after a failed background refresh before that key is refreshed again; default 5_000; 0 = none. */
  errorBackoff?: number
  /** The in-process tier; default `{ maxEntries: 10_000 }`, LRU-bounded. `false` keeps nothing in process. */
  l1?: false | { maxEntries?: number }
  /** Handed every background refresh (Vercel `waitUntil`, Next.js `after`). */
  waitUntil?: (p: Promise<unknown>) => void
  /** Background failures: refresh errors, Redis errors. */
  onError?: (err: Error, info: { op: string; key?: string }) => void
}

export interface LoaderContext<T> {
  /** The key as a string (array keys encoded). */
  key: string
  /** The value being refreshed, if any. */
  stale: T | undefined
  /** Aborts only when the cache is closed. */
  signal: AbortSignal
}

export interface GetOrLoadOptions {
  ttl?: number
  hardTtl?: number
  negativeTtl?: number
  beta?: number
  jitter?: number
  /** This caller's own cancellation: rejects this caller with an `AbortError`; the shared load goes on. */
  signal?: AbortSignal
  /** Overrides the constructor's `waitUntil` for this call. */
  waitUntil?: (p: Promise<unknown>) => void
  /** Load now (still coalesced) and replace the entry. */
  forceRefresh?: boolean
}

export interface SetOptions {
  ttl?: number
  hardTtl?: number
}

export interface EntryInfo {
  state: 'fresh' | 'stale' | 'negative'
  /** Epoch ms. */
  freshUntil: number
  /** Epoch ms. */
  hardUntil: number
  computeMs: number
}

export interface Stats {
  hits: number
  staleHits: number
  misses: number
  loads: number
  coalesced: number
  refreshes: number
  refreshErrors: number
  negativeHits: number
  lockWins: number
  lockWaits: number
  redisErrors: number
}

/** An error raised by stampede-cache itself, with a stable `code`. */
export class StampedeCacheError extends Error {
  readonly code:
    | 'ERR_INVALID_OPTION'
    | 'ERR_INVALID_KEY'
    | 'ERR_INVALID_ARGUMENT'
    | 'ERR_VALUE_NOT_SERIALIZABLE'
    | 'ERR_CLOSED'
    | (string & {})
  constructor(code: string, message: string, options?: { cause?: unknown })
}

export class StampedeCache {
  /** Throws `StampedeCacheError` (`ERR_INVALID_OPTION`) at once for a bad option, naming it. */
  constructor(options?: StampedeCacheOptions)
  /**
   * The cached value, or the loader's. Fresh: at once. Stale: at once, with one background
   * refresh. Missing: one loader call shared by every concurrent caller.
   */
  getOrLoad<T>(key: Key, loader: (ctx: LoaderContext<T>) => T | Promise<T>, options?: GetOrLoadOptions): Promise<T>
  /** A fresh or stale value; never loads. */
  get<T>(key: Key): Promise<T | undefined>
  set<T>(key: Key, value: T, options?: SetOptions): Promise<void>
  /** True when something was removed. */
  delete(key: Key): Promise<boolean>
  inspect(key: Key): Promise<EntryInfo | undefined>
  /** Counters since construction. */
  stats(): Stats
  /** Resolves when every background refresh started so far has ended. */
  settle(): Promise<void>
  /** Ends background work; later calls reject with `ERR_CLOSED`. */
  close(): Promise<void>
  /**
   * Runs `fn` with `waitUntil` as the hook for every background refresh started inside it (by any
   * cache), unless a call gives its own: per-call option, then this scope, then the constructor's.
   */
  withWaitUntil<R>(waitUntil: (p: Promise<unknown>) => void, fn: () => R): R
}

/** The same as `cache.withWaitUntil`, for code that has no cache at hand. */
export function withWaitUntil<R>(waitUntil: (p: Promise<unknown>) => void, fn: () => R): R
