/// <reference types="node" />
/**
 * stampede-cache: stops cache stampedes. One load per key per process (coalescing), stale values
 * served at once while one worker refreshes (stale-while-revalidate), XFetch early refresh, TTL
 * jitter, negative caching and stale-if-error, in a Rust core; a Redis tier shares entries, the
 * refresh lock and invalidations across processes.
 *
 * Loading the package throws an `Error` with `code === 'ERR_NATIVE_BINDING'` when this platform
 * has no usable native binary (see the README, "Supported platforms").
 */

/** A non-empty string, or an array of strings and finite numbers (joined unambiguously). At most 1,024 bytes. */
export type Key = string | readonly (string | number)[]

// ---------------------------------------------------------------------------------------------
// What a cached value reads back as. Every tier stores JSON, so a hit returns what
// `JSON.parse(JSON.stringify(value))` gives: a Date is a string, functions, symbols and undefined
// members are gone (undefined in an array is null), `toJSON` is honoured, a Map or Set is `{}`.

/** Members JSON.stringify leaves out of an object (and writes as null in an array). */
type Dropped = undefined | void | symbol | ((...args: any[]) => unknown)

/** JSON.stringify throws on these (ERR_VALUE_NOT_SERIALIZABLE): nothing comes back. */
type Unserializable = bigint

type IsAny<T> = 0 extends 1 & T ? true : false

/** Flattens an intersection of object types into one, for readable hovers. */
type Simplify<T> = { [K in keyof T]: T[K] } & {}

type JsonKey<K> = K extends number ? `${K}` : K

/**
 * Optional properties (absent is allowed). An index signature is not: `T` is assignable to a record
 * over its own index type.
 */
type IsOptionalKey<T, K extends keyof T> = T extends Record<K, T[K]> ? false : true

/** Keys that stay required: always present, never undefined nor a function. */
type RequiredJsonKeys<T> = {
  [K in keyof T]-?: K extends symbol
    ? never
    : [Exclude<T[K], Dropped>] extends [never]
      ? never
      : IsOptionalKey<T, K> extends true
        ? never
        : [T[K]] extends [Exclude<T[K], Dropped>]
          ? K
          : never
}[keyof T]

/** Keys that may be absent after the round trip: optional, or possibly undefined or a function. */
type OptionalJsonKeys<T> = {
  [K in keyof T]-?: K extends symbol
    ? never
    : [Exclude<T[K], Dropped>] extends [never]
      ? never
      : K extends RequiredJsonKeys<T>
        ? never
        : K
}[keyof T]

type JsonifyObject<T> = Simplify<
  { [K in RequiredJsonKeys<T> as JsonKey<K>]: JsonifyValue<T[K]> } & {
    [K in OptionalJsonKeys<T> as JsonKey<K>]?: JsonifyValue<Exclude<T[K], Dropped>>
  }
>

type JsonifyElement<T> = T extends Dropped ? null : JsonifyValue<T>

type JsonifyArray<T extends readonly unknown[]> = { -readonly [I in keyof T]: JsonifyElement<T[I]> }

/** A typed array serializes as an object of its indices: `{"0":1,"1":2}`. */
type TypedArray =
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Float32Array
  | Float64Array

type JsonifyValue<T> =
  IsAny<T> extends true
    ? any
    : unknown extends T
      ? unknown
      : T extends string | number | boolean | null
        ? T
        : T extends Unserializable
          ? never
          : T extends { toJSON(...args: any[]): infer J }
            ? JsonifyValue<J>
            : T extends Dropped
              ? never
              : T extends ReadonlyMap<unknown, unknown> | ReadonlySet<unknown> | WeakMap<object, unknown> | WeakSet<object>
                ? Record<string, never>
                : T extends TypedArray
                  ? Record<`${number}`, number>
                  : T extends readonly unknown[]
                    ? JsonifyArray<T>
                    : T extends object
                      ? JsonifyObject<T>
                      : never

/**
 * What a value of type `T` reads back as from the cache: the type of
 * `JSON.parse(JSON.stringify(value))`. At the top, `undefined` and `null` (a cached not-found) come
 * back as they are; a function, symbol or BigInt at the top is refused (`never`).
 *
 * @example Jsonify<{ at: Date; n?: number; f(): void }>  // { at: string; n?: number }
 */
export type Jsonify<T> = IsAny<T> extends true ? any : unknown extends T ? unknown : T extends undefined | void ? undefined : JsonifyValue<T>

/**
 * A serializer of your own (superjson, msgpack, ...), used by every tier: a hit returns
 * `deserialize(serialize(value))`. A string is kept in Redis as a JSON string, bytes as base64.
 *
 * @example { serialize: superjson.stringify, deserialize: superjson.parse }
 */
export interface Serializer {
  serialize(value: unknown): string | Uint8Array
  deserialize(data: string | Uint8Array): unknown
}

/**
 * `'json'` (the default): values are JSON data. `'v8'`: node:v8 structured serialization (Date,
 * Map, Set, BigInt, typed arrays, Buffers and cycles survive). Or a `Serializer`.
 */
export type SerializerOption = 'json' | 'v8' | Serializer

/**
 * What a value of type `T` reads back as with serializer `S`: `Jsonify<T>` with `'json'`, `T`
 * itself with `'v8'` or a `Serializer` (whose round trip is yours to keep faithful).
 */
export type Stored<T, S extends SerializerOption = 'json'> = S extends 'json'
  ? Jsonify<T>
  : IsAny<T> extends true
    ? any
    : unknown extends T
      ? unknown
      : T extends undefined | void
        ? undefined
        : T

// ---------------------------------------------------------------------------------------------

/** TLS for `rediss://` and `valkeys://`: a private CA, client certificates (mutual TLS). System roots by default. */
export interface RedisTlsOptions {
  /** PEM certificate(s) of the CA to trust instead of the system roots. */
  ca?: string | Buffer | undefined
  /** PEM client certificate, for mutual TLS. */
  cert?: string | Buffer | undefined
  /** PEM private key of `cert`. */
  key?: string | Buffer | undefined
  /** The name to check the server's certificate against (SNI); default the URL's host. */
  servername?: string | undefined
  /** `false` accepts any server certificate. Default `true`. */
  rejectUnauthorized?: boolean | undefined
}

/** Where and how to reach Redis, when a URL alone is not enough. */
export interface RedisOptions {
  /** `redis://`, `rediss://` (TLS), `valkey://`, `valkeys://` or `unix://`; user, password and db index in the URL. */
  url?: string | undefined
  /**
   * ioredis's spelling, naming the server the URL would: `host` (default `'localhost'`) and
   * `port` (default 6379), or `path` (a Unix socket); `username`, `password` and `db` (with
   * `url` too, when the URL carries none of them: each part is given once; with `sentinels`,
   * the primary's; with `cluster`, every seed's credentials). `tls` makes it `rediss://`.
   */
  host?: string | undefined
  port?: number | undefined
  path?: string | undefined
  username?: string | undefined
  password?: string | undefined
  db?: number | undefined
  tls?: RedisTlsOptions | undefined
  /** Redis Cluster: seed node URLs (one is enough); slots, MOVED/ASK and failover are followed. */
  cluster?: string[] | undefined
  /** Sentinel: sentinel URLs, with `masterName`; the master is found and followed across failovers. */
  sentinels?: string[] | undefined
  /** The Sentinel master group name. */
  masterName?: string | undefined
  /** Milliseconds to connect before degrading; default about 1_000; at most 2 ** 31 - 1. */
  connectTimeout?: number | undefined
  /** Milliseconds a command may take before it counts as a Redis error; default about 1_000; at most 2 ** 31 - 1. */
  commandTimeout?: number | undefined
}

/** The second argument of `onError`. */
export interface ErrorInfo {
  /** What failed: `'refresh'` (a background refresh's loader), `'waitUntil'` (the hook threw), `'redis:<command>'`. */
  op: string
  /** The key concerned (array keys encoded), when there is one. */
  key?: string | undefined
}

export interface StampedeCacheOptions<S extends SerializerOption = SerializerOption> {
  /**
   * `'redis://127.0.0.1:6379/0'`, or `RedisOptions`. Absent or `undefined`: in-process only, so
   * `redis: process.env.REDIS_URL` works with and without the variable.
   */
  redis?: string | RedisOptions | undefined
  /** Prefix of every Redis key; default `'sc'`. */
  namespace?: string | undefined
  /** Milliseconds an entry is fresh (the soft TTL); default 60_000; at most a year (31_536_000_000). */
  ttl?: number | undefined
  /** Milliseconds an entry lives at all, stale included; default 10 * ttl; must be >= ttl; at most ten years (315_360_000_000). */
  hardTtl?: number | undefined
  /** In [0, 1): each written entry's ttl and hardTtl are scaled by a random factor in [1-jitter, 1+jitter]; default 0.1. */
  jitter?: number | undefined
  /** XFetch beta >= 0, at most 1e6; default 1; 0 turns probabilistic early refresh off. */
  beta?: number | undefined
  /** Milliseconds a null/undefined loader result is cached; default 5_000; 0 caches none; at most a year. */
  negativeTtl?: number | undefined
  /** Milliseconds the cross-process refresh lock lives; default 10_000; at most 2 ** 31 - 1. */
  lockTtl?: number | undefined
  /** Milliseconds after a failed background refresh before that key is refreshed again; default 5_000; 0 = none; at most a year. */
  errorBackoff?: number | undefined
  /**
   * Milliseconds an entry carrying tags lives at most, stale included (its hardTtl, and ttl, are
   * clamped to it, counted from its load's start); a deleteByTag's record in Redis expires this
   * long (plus 2 x commandTimeout + 1 s) after the tag's last deletion. Default and maximum ten
   * years (315_360_000_000); at least 1. Use the same value in every instance of a namespace.
   */
  tagTtl?: number | undefined
  /**
   * The in-process tier; default `{ maxEntries: 10_000 }`, LRU-bounded. `maxBytes` bounds it by
   * the values' serialized size too: a value larger than it is served but kept only in Redis.
   * `false` keeps nothing in process. `maxEntries` at most 2 ** 32 - 1, `maxBytes` at most
   * `Number.MAX_SAFE_INTEGER`.
   */
  l1?: false | { maxEntries?: number | undefined; maxBytes?: number | undefined } | undefined
  /**
   * Milliseconds a load may run, at most 2 ** 31 - 1; default 30_000; `Infinity`: no limit. Past it the loader's
   * `ctx.signal` aborts and its waiting callers reject with `ERR_LOAD_TIMEOUT`.
   */
  loadTimeout?: number | undefined
  /**
   * Background refreshes (stale-while-revalidate and XFetch early refreshes) this instance runs
   * at once; default 16, at most 2 ** 32 - 1; `Infinity`: no bound. Past it, readers are served the stale value at
   * once and a later read refreshes the key. Cold loads are never held back.
   */
  maxConcurrentRefreshes?: number | undefined
  /**
   * How values are stored, in every tier: `'json'` (default), `'v8'`, or a `Serializer`. An entry
   * written with another serializer is a miss.
   */
  serializer?: S | undefined
  /** Handed every background refresh (Vercel `waitUntil`, Next.js `after`). */
  waitUntil?: ((p: Promise<unknown>) => void) | undefined
  /**
   * Background failures: refresh errors (whatever the loader threw, which need not be an `Error`)
   * and Redis errors (`StampedeCacheError` with code `ERR_REDIS`). Absent: an outage's first Redis
   * failure and its recovery are each told once through `process.emitWarning` (code
   * `'STAMPEDE_CACHE_REDIS'`), never once per call.
   */
  onError?: ((err: unknown, info: ErrorInfo) => void) | undefined
}

export interface LoaderContext<T> {
  /** The key as a string (array keys encoded). */
  key: string
  /** The value being refreshed (a background refresh or `forceRefresh`), else `undefined`. */
  stale: T | undefined
  /** Aborts when the cache is closed or the load times out (`loadTimeout`). */
  signal: AbortSignal
  /**
   * This result's ttl (and hardTtl, default as for a call's `ttl`), e.g. from an upstream
   * `Cache-Control: max-age`; a `null`/`undefined` result lives `ttl` too. Throws
   * `ERR_INVALID_ARGUMENT` for a bad number.
   */
  setTtl(ttl: number, hardTtl?: number): void
  /** Adds tags to this result (to the call's `tags`), for `deleteByTag` and `expireByTag`. */
  setTags(tags: string[]): void
  /**
   * Hands this result to every waiting caller and caches nothing, in any tier; the Redis lock is
   * released, so the next call loads. An entry already there is left as it was.
   */
  skipCache(): void
}

/** What `getOrLoadMany`'s `loadMany` is given beside the keys; it applies to every key of that call. */
export interface BatchContext {
  /** The keys of this call as strings (array keys encoded), in the order `loadMany` got them. */
  keys: string[]
  /** Aborts when the cache is closed or the call times out (`loadTimeout`). */
  signal: AbortSignal
  /** Every key's ttl (and hardTtl), as `LoaderContext.setTtl`. */
  setTtl(ttl: number, hardTtl?: number): void
  /** Adds tags to every key's result, as `LoaderContext.setTags`. */
  setTags(tags: string[]): void
}

export interface GetOrLoadOptions {
  ttl?: number | undefined
  hardTtl?: number | undefined
  negativeTtl?: number | undefined
  beta?: number | undefined
  jitter?: number | undefined
  /** Overrides the constructor's `loadTimeout` for this call. */
  loadTimeout?: number | undefined
  /** This caller's own cancellation: rejects this caller with an `AbortError`; the shared load goes on. */
  signal?: AbortSignal | undefined
  /** Overrides the constructor's `waitUntil` for this call. */
  waitUntil?: ((p: Promise<unknown>) => void) | undefined
  /** Load now (still coalesced) and replace the entry. */
  forceRefresh?: boolean | undefined
  /**
   * The loaded entry's tags, for `deleteByTag` (with `ctx.setTags`'s). A refresh given none keeps
   * the tags of the entry it replaces.
   */
  tags?: string[] | undefined
}

export interface SetOptions {
  ttl?: number | undefined
  hardTtl?: number | undefined
  /** The entry's tags, for `deleteByTag`. */
  tags?: string[] | undefined
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
  /** Reads answered by Redis (not counted as misses). */
  l2Hits: number
  /** Entries in the in-process tier now. */
  l1Entries: number
  /** The serialized size of the in-process tier's values now, in bytes. */
  l1Bytes: number
  /** Changes (set, delete, deleteByTag, clear) Redis could not take, waiting to be replayed. */
  replayQueued: number
  /** Changes dropped without replay: more than 10,000 waited (each also reported to onError). */
  replayDropped: number
}

/** Every `code` a `StampedeCacheError` carries. */
export type StampedeCacheErrorCode =
  /** A bad constructor or call option; the message names it. */
  | 'ERR_INVALID_OPTION'
  /** Not a non-empty string or an array of strings and finite numbers, or over 1,024 bytes. */
  | 'ERR_INVALID_KEY'
  /** A loader (or `withWaitUntil` argument) that is not a function. */
  | 'ERR_INVALID_ARGUMENT'
  /** A value the serializer cannot hold (JSON: BigInt, a cycle, a function or symbol at the top). Nothing is cached. */
  | 'ERR_VALUE_NOT_SERIALIZABLE'
  /** Any call after `close()`. */
  | 'ERR_CLOSED'
  /** The load ran longer than `loadTimeout`. */
  | 'ERR_LOAD_TIMEOUT'
  /** A Redis failure, handed to `onError` (reads never fail because of Redis). */
  | 'ERR_REDIS'

/** An error raised by stampede-cache itself, with a stable `code`. */
export class StampedeCacheError extends Error {
  readonly name: 'StampedeCacheError'
  readonly code: StampedeCacheErrorCode
  /**
   * On an `ERR_REDIS` rejection of `set`, `delete`, `deleteByTag` or `clear`: true when the change
   * is applied in this process and queued, to be replayed to Redis (in order) once it answers.
   */
  readonly queued?: boolean
  constructor(code: StampedeCacheErrorCode, message: string, options?: { cause?: unknown })
}

/**
 * `S`, the serializer, is inferred from the constructor's `serializer` option (`'json'` when none
 * is given): it says what values read back as (`Stored<T, S>`).
 */
export class StampedeCache<S extends SerializerOption = 'json'> {
  /** Throws `StampedeCacheError` (`ERR_INVALID_OPTION`) at once for a bad option, naming it. */
  constructor(options?: StampedeCacheOptions<S>)
  /**
   * The cached value, or the loader's. Fresh: at once. Stale: at once, with one background
   * refresh. Missing: one loader call shared by every concurrent caller.
   *
   * Resolves with what the loader's value reads back as through the serializer (`Stored<T, S>`;
   * with JSON, `Jsonify<T>`): the same in every tier, whether this call loaded it or hit. `T` is
   * inferred from the loader; give it (`getOrLoad<User>(...)`) to type `ctx.stale` too, which is
   * otherwise `unknown`.
   */
  getOrLoad<T, Stale = T>(
    key: Key,
    loader: (ctx: LoaderContext<Stored<Stale, S>>) => T | PromiseLike<T>,
    options?: GetOrLoadOptions,
  ): Promise<Stored<T, S>>
  /**
   * Many keys at once, DataLoader's way: `loadMany` gets the keys that must be loaded (the
   * misses, each once, in the order of `keys`, as given) and returns an array of the same length
   * and order: a value, `null`/`undefined` for a not-found (cached for `negativeTtl`), or an
   * `Error` that fails that key alone. Resolves with an array aligned with `keys`: each value as
   * `getOrLoad` would type it, or the `Error` of a key that failed. Rejects only for bad
   * arguments (`ERR_INVALID_KEY`, `ERR_INVALID_ARGUMENT`: more than 10,000 keys, a `loadMany`
   * that is not a function, a result of the wrong length), `ERR_CLOSED`, or the caller's signal.
   */
  getOrLoadMany<K extends Key, T>(
    keys: readonly K[],
    loadMany: (missing: K[], ctx: BatchContext) => readonly (T | Error)[] | PromiseLike<readonly (T | Error)[]>,
    options?: GetOrLoadOptions,
  ): Promise<(Stored<Exclude<T, Error>, S> | Error)[]>
  /** Fresh or stale values aligned with `keys` (`undefined` where none); never loads. */
  getMany<T = unknown>(keys: readonly Key[]): Promise<(Stored<T, S> | undefined)[]>
  /** A fresh or stale value; never loads. `T` is the type of the value that was stored. */
  get<T = unknown>(key: Key): Promise<Stored<T, S> | undefined>
  /**
   * Resolves once Redis holds the value. When Redis cannot take it, the value is applied in this
   * process and the call rejects with `ERR_REDIS` and `err.queued === true`: it is replayed to
   * Redis, in order, once it answers (so do `delete`, `deleteByTag` and `clear`).
   */
  set<T>(key: Key, value: T, options?: SetOptions): Promise<void>
  /** True when something was removed. */
  delete(key: Key): Promise<boolean>
  /**
   * Removes every entry carrying one of the tags, in this process at once and in every instance
   * sharing the Redis (within the bus bound); a load that began before never writes its result
   * back. One Redis key per tag, however many entries carry it.
   */
  deleteByTag(tags: string | string[]): Promise<void>
  /**
   * Soft invalidation: the entry keeps its value but is stale from now on, in this process at once
   * and in every instance sharing the Redis (within the bus bound). The next read anywhere is
   * served the old value at once and starts one refresh for the whole fleet, until hardTtl as
   * usual; a load that began before never writes its result. True when there was an entry.
   */
  expire(key: Key): Promise<boolean>
  /**
   * `expire()` for every entry carrying one of the tags, in every instance: each is served stale
   * while one refresh runs. Any number of tags, never partly applied. One Redis key per tag.
   * `hardTtl` (ms from now): past it, those not refreshed meanwhile are gone (default: each until
   * its own hardTtl), as Next.js's `revalidateTag(tag, { expire })`.
   */
  expireByTag(tags: string | string[], options?: { hardTtl?: number | undefined }): Promise<void>
  /**
   * Removes every entry of this namespace, in every instance; a load that began before never
   * writes back. No `KEYS`: Redis is swept with `SCAN`, one batch at a time. Other namespaces are
   * untouched.
   */
  clear(): Promise<void>
  inspect(key: Key): Promise<EntryInfo | undefined>
  /** Counters since construction. */
  stats(): Stats
  /** The namespace this cache was built with: its Redis key prefix, and the label of its metrics. */
  readonly namespace: string
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

// ---------------------------------------------------------------------------------------------
// Observability: what the cache publishes through node:diagnostics_channel (README,
// "Observability"). Nothing is published while a channel has no subscriber.

/** Every message names the cache that published it and its namespace. */
export interface CacheEvent {
  cache: StampedeCache
  namespace: string
}

/** Why a loader runs: a missing entry, a background refresh, or `forceRefresh`. */
export type LoadReason = 'cold' | 'refresh' | 'force'

/**
 * The context of the TracingChannel `stampede-cache:load`, around every loader call: `start`
 * before it, `end` once it returned its promise, then `asyncStart`/`asyncEnd` when it settled;
 * `error` (with `error`) when it failed or ran past `loadTimeout`. `result` is the loader's value.
 */
export interface LoadContext extends CacheEvent {
  /** The key loaded (for a `getOrLoadMany` call, the first of `keys`). */
  key: string
  /** A `getOrLoadMany` call's `loadMany`: every key it was given (one trace for the call). */
  keys?: string[]
  reason: LoadReason
  result?: unknown
  error?: unknown
}

/** `stampede-cache:hit`: a read answered by the in-process tier ('memory') or by Redis. */
export interface HitEvent extends CacheEvent {
  key: string
  tier: 'memory' | 'redis'
  state: 'fresh' | 'stale' | 'negative'
}

/** `stampede-cache:miss` (the in-process tier had nothing usable) and `stampede-cache:coalesce` (the call joined a running load). */
export interface KeyEvent extends CacheEvent {
  key: string
}

/**
 * `stampede-cache:lock`: what became of a load's bid for the Redis lock. `won`: took it;
 * `waited`: another process held it and its value came; `took_over`: waited, then took it (the
 * holder failed or its lock expired); `gave_up`: waited past two holders' lockTtl, loads without
 * it; `skipped`: a background refresh left to the process that holds it.
 */
export interface LockEvent extends CacheEvent {
  key: string
  reason: 'cold' | 'refresh'
  outcome: 'won' | 'waited' | 'took_over' | 'gave_up' | 'skipped'
}

/**
 * `stampede-cache:invalidate`: an in-process entry dropped or replaced. `local`: `set`, `delete`,
 * `deleteByTag` or `clear` in this instance; `bus`: another process changed the key (no `key`:
 * everything was dropped, as when the bus reconnects or another process cleared the namespace).
 * `tags`: a `deleteByTag` here (no `key`: the entries carrying them).
 */
export interface InvalidateEvent extends CacheEvent {
  key: string | undefined
  source: 'local' | 'bus'
  tags?: string[]
}

/** `stampede-cache:load-timeout`: a loader ran past `timeout` ms; its callers reject with ERR_LOAD_TIMEOUT. */
export interface LoadTimeoutEvent extends CacheEvent {
  /** The key (for a `getOrLoadMany` call, the first of `keys`). */
  key: string
  /** A `getOrLoadMany` call's `loadMany`: every key it was given. */
  keys?: string[]
  reason: LoadReason
  timeout: number
}

/** `stampede-cache:redis-error`: a Redis failure, as `onError` gets it (at most one per `op` a second). */
export interface RedisErrorEvent extends CacheEvent {
  op: string
  key: string | undefined
  error: StampedeCacheError
}
