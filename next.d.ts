/// <reference types="node" />
/**
 * stampede-cache/next: the two cache handlers of Next.js 16, on a StampedeCache shared by every
 * instance through Redis.
 */
// Self-contained on purpose: no import from `next`, so these types hold whichever Next.js 16 minor
// an app uses; they follow next/dist/server/lib/cache-handlers/types.d.ts and
// next/dist/server/lib/incremental-cache/index.d.ts (CacheHandler).
import { StampedeCache, StampedeCacheOptions } from './index'

/** StampedeCache options; `serializer` is the handler's own ('v8'), so passing it throws ERR_INVALID_OPTION. */
export type NextCacheHandlerOptions = Omit<StampedeCacheOptions, 'serializer'> & {
  /**
   * The largest entry stored, in bytes; default 4 MiB (4_194_304); Infinity: no cap. A larger entry
   * is served from its render, not stored, counted and reported to onError (ERR_ENTRY_TOO_LARGE).
   */
  maxEntryBytes?: number | undefined
}

/** The cache's stats(), and what the handler turned away. */
export type NextCacheHandlerStats = ReturnType<StampedeCache['stats']> & {
  /** Entries over maxEntryBytes: served, not stored. */
  oversizedEntries: number
  /** Records read back that were not what the handler stores (answered as misses). */
  invalidRecords: number
}

/** A "use cache" entry, as Next.js 16 defines `CacheEntry`. */
export interface UseCacheEntry {
  value: ReadableStream<Uint8Array>
  tags: string[]
  /** seconds */
  stale: number
  /** epoch ms */
  timestamp: number
  /** seconds */
  expire: number
  /** seconds */
  revalidate: number
}

/** Next.js 16's `CacheHandler` for `cacheHandlers` ("use cache"). */
export interface UseCacheHandler {
  get(cacheKey: string, softTags: string[]): Promise<undefined | UseCacheEntry>
  set(cacheKey: string, pendingEntry: Promise<UseCacheEntry>): Promise<void>
  refreshTags(): Promise<void>
  getExpiration(tags: string[]): Promise<number>
  updateTags(tags: string[], durations?: { expire?: number }): Promise<void>
  /** The StampedeCache under the handler (stats(), close()). */
  readonly cache: StampedeCache
  stats(): NextCacheHandlerStats
}

/** What the incremental cache handler's `get` answers, as Next.js 16 defines `CacheHandlerValue`. */
export interface IncrementalCacheHandlerValue {
  lastModified: number
  age?: number
  cacheState?: string
  value: unknown
  cacheControl?: { revalidate: number | false; expire: number | undefined }
}

/** The class Next.js constructs for `cacheHandler` (on every request; its state is shared). */
export interface IncrementalCacheHandlerClass {
  new (context: unknown): {
    get(cacheKey: string, ctx: unknown): Promise<IncrementalCacheHandlerValue | null>
    set(cacheKey: string, data: unknown, ctx: unknown): Promise<void>
    revalidateTag(tags: string | string[], durations?: { expire?: number }): Promise<void>
    resetRequestCache(): void
  }
  /** The StampedeCache under the handler (stats(), close()). */
  readonly cache: StampedeCache
  stats(): NextCacheHandlerStats
}

/** The "use cache" handler: `export default createUseCacheHandler(...)` in the file `cacheHandlers` names. */
export declare function createUseCacheHandler(options?: NextCacheHandlerOptions): UseCacheHandler
/** The ISR / fetch / unstable_cache handler: `export default createIncrementalCacheHandler(...)` in the file `cacheHandler` names. */
export declare function createIncrementalCacheHandler(options?: NextCacheHandlerOptions): IncrementalCacheHandlerClass
