'use strict'
// stampede-cache/nestjs: a NestJS dynamic module that provides one StampedeCache per module
// registration and closes it when the application shuts down.
//
// Nothing here loads @nestjs/common or @nestjs/core at import time: a dynamic module is plain data
// ({ module, providers, exports, global }) that Nest reads as it is. @nestjs/common is required
// lazily, only by InjectStampedeCache(), so the main entry and this one never pull Nest in.

const { StampedeCache, StampedeCacheError } = require('./index.js')

/** Injection token of the cache (the same instance as the `StampedeCache` class token). */
const STAMPEDE_CACHE = 'STAMPEDE_CACHE'
/** Injection token of the options the cache was built with (after forRootAsync's factory ran). */
const STAMPEDE_CACHE_OPTIONS = 'STAMPEDE_CACHE_OPTIONS'
// Closes the cache on application shutdown; an internal provider nobody injects.
const STAMPEDE_CACHE_CLOSER = 'STAMPEDE_CACHE_CLOSER'

// Module-level options; everything else goes to `new StampedeCache(...)`.
const MODULE_KEYS = ['isGlobal', 'global']

function invalid(message) {
  return new StampedeCacheError('ERR_INVALID_OPTION', message)
}

function isPlainObject(v) {
  return typeof v === 'object' && v !== null && !Array.isArray(v)
}

function splitModuleOptions(options, where) {
  if (options === undefined) return { global: false, cacheOptions: {} }
  if (!isPlainObject(options)) throw invalid(`${where}: options must be an object`)
  const cacheOptions = { ...options }
  for (const k of MODULE_KEYS) delete cacheOptions[k]
  return { global: options.isGlobal === true || options.global === true, cacheOptions }
}

// The cache provider, its string alias, and the closer. Nest instantiates every static provider at
// startup, and calls onApplicationShutdown on provider instances (factory results included) during
// app.close(): onApplicationShutdown comes after onModuleDestroy and after the HTTP server has been
// closed, so the application's own shutdown hooks can still use the cache.
function cacheProviders() {
  return [
    {
      provide: StampedeCache,
      useFactory: (options) => new StampedeCache(options),
      inject: [STAMPEDE_CACHE_OPTIONS],
    },
    { provide: STAMPEDE_CACHE, useExisting: StampedeCache },
    {
      provide: STAMPEDE_CACHE_CLOSER,
      useFactory: (cache) => ({
        onApplicationShutdown: () => cache.close(),
      }),
      inject: [StampedeCache],
    },
  ]
}

const EXPORTS = [StampedeCache, STAMPEDE_CACHE, STAMPEDE_CACHE_OPTIONS]

class StampedeCacheModule {
  /**
   * A module providing a `StampedeCache` built from `options` (the constructor's options, plus
   * `isGlobal`/`global`). The cache is closed on application shutdown.
   */
  static forRoot(options) {
    const { global, cacheOptions } = splitModuleOptions(options, 'StampedeCacheModule.forRoot')
    return {
      module: StampedeCacheModule,
      global,
      providers: [{ provide: STAMPEDE_CACHE_OPTIONS, useValue: cacheOptions }, ...cacheProviders()],
      exports: EXPORTS,
    }
  }

  /**
   * The same, with the options made by `useFactory` (which may be async) from the providers named
   * in `inject`, found in this module's `imports` or a global module.
   */
  static forRootAsync(options) {
    const where = 'StampedeCacheModule.forRootAsync'
    if (!isPlainObject(options)) throw invalid(`${where}: options must be an object`)
    const { useFactory, inject = [], imports = [] } = options
    if (typeof useFactory !== 'function') throw invalid(`${where}: \`useFactory\` must be a function`)
    if (!Array.isArray(inject)) throw invalid(`${where}: \`inject\` must be an array`)
    if (!Array.isArray(imports)) throw invalid(`${where}: \`imports\` must be an array`)
    for (const k of Object.keys(options)) {
      if (!['useFactory', 'inject', 'imports', ...MODULE_KEYS].includes(k)) throw invalid(`${where}: unknown option \`${k}\``)
    }
    return {
      module: StampedeCacheModule,
      global: options.isGlobal === true || options.global === true,
      imports,
      providers: [
        {
          provide: STAMPEDE_CACHE_OPTIONS,
          useFactory: async (...deps) => {
            const made = await useFactory(...deps)
            if (made !== undefined && !isPlainObject(made)) throw invalid(`${where}: useFactory must return an options object`)
            return made ?? {}
          },
          inject,
        },
        ...cacheProviders(),
      ],
      exports: EXPORTS,
    }
  }
}

/**
 * `@InjectStampedeCache()`: a parameter or property decorator injecting the module's cache, for
 * code without `emitDecoratorMetadata` (plain JS, or a property). Same as `@Inject(StampedeCache)`.
 */
function InjectStampedeCache() {
  const { Inject } = require('@nestjs/common')
  return Inject(StampedeCache)
}

// ---- A drop-in for @nestjs/cache-manager --------------------------------------------------
//
// CacheModule, CACHE_MANAGER (cache-manager 7's Cache over one StampedeCache), CacheInterceptor,
// CacheKey and CacheTTL, shaped like @nestjs/cache-manager's so an app switches by its import.
// Tokens and metadata keys are the original's strings, so code written against either works.

/** The token @nestjs/cache-manager injects its cache-manager `Cache` under (the same string). */
const CACHE_MANAGER = 'CACHE_MANAGER'
/** The metadata keys of @CacheKey and @CacheTTL, the original's. */
const CACHE_KEY_METADATA = 'cache_module:cache_key'
const CACHE_TTL_METADATA = 'cache_module:cache_ttl'
/** The token of CacheModule's options (register's, or what registerAsync's factory made). */
const CACHE_MODULE_OPTIONS = 'STAMPEDE_CACHE_MODULE_OPTIONS'

/**
 * A class token for the cache-manager object (the same instance as CACHE_MANAGER), as
 * @nestjs/cache-manager exports: `constructor(private cache: Cache)` with emitDecoratorMetadata.
 */
class Cache {}

// cache-manager 7 (Keyv) keeps an entry without a ttl (or with ttl 0) until it is deleted. A
// StampedeCache entry always has a ttl, of at most a year: "no expiry" is a year. ttl() answers
// undefined for such entries, as cache-manager does.
const FOREVER = 365 * 24 * 3600 * 1000

// cache-manager's own store options: meaningless over a StampedeCache. Each names what to use.
const STORE_OPTIONS = {
  stores: 'stampede-cache keeps entries in process and, with the `redis` option, in Redis: use `redis` instead',
  store: 'stampede-cache keeps entries in process and, with the `redis` option, in Redis: use `redis` instead',
  nonBlocking: 'there is one store (Redis answers or the in-process tier does), so there is nothing to race',
  refreshAllStores: 'there is one store; a refresh replaces the entry in every tier and every instance',
  cacheId: 'coalescing is per key and namespace: use `namespace` to separate caches',
  hardTtl: "in CacheModule, `ttl` is an entry's whole life (as in cache-manager); use `refreshThreshold` for stale-while-revalidate",
}
const ASYNC_KEYS = ['imports', 'inject', 'useFactory', 'useClass', 'useExisting', 'isGlobal', 'extraProviders']

function nonNegativeMs(name, v, where) {
  if (v === undefined) return
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
    throw invalid(`${where}: option \`${name}\` must be a finite number of ms >= 0, got ${typeof v === 'number' ? v : typeof v}`)
  }
}

/**
 * The StampedeCache lifetimes of an entry that must live `life` ms at all (cache-manager's ttl;
 * 0 or undefined: no expiry) and be refreshed in the background once less than `refreshThreshold`
 * remains. Jitter scales both by up to 1 + jitter, so hardTtl is divided by it: an entry is never
 * served after `life`.
 */
function lifetimes(life, refreshThreshold, jitter) {
  const whole = life > 0 ? life : FOREVER
  const hardTtl = whole / (1 + jitter)
  if (!(refreshThreshold > 0) || !(life > 0)) return { ttl: hardTtl, hardTtl }
  // At least 1 ms fresh: a threshold at or past the life refreshes on (nearly) every read, as
  // cache-manager's wrap does.
  return { ttl: Math.min(hardTtl, Math.max(1, (whole - refreshThreshold) / (1 + jitter))), hardTtl }
}

/**
 * CacheModule options -> { cacheOptions (the StampedeCache constructor's), plan (what the
 * cache-manager methods need: the module's ttl, refreshThreshold, jitter, negativeTtl) }.
 */
function planCacheModule(options, where) {
  if (options === undefined || options === null) options = {}
  if (!isPlainObject(options)) throw invalid(`${where}: options must be an object`)
  for (const [name, why] of Object.entries(STORE_OPTIONS)) {
    if (options[name] !== undefined) throw invalid(`${where}: option \`${name}\` is not supported: ${why}`)
  }
  // isGlobal is the module's; refreshThreshold and ttl become ttl and hardTtl. jitter defaults to 0:
  // cache-manager's ttl is exact.
  const { refreshThreshold, ttl, jitter = 0, negativeTtl = 5_000, ...rest } = options
  delete rest.isGlobal
  nonNegativeMs('ttl', ttl, where)
  nonNegativeMs('refreshThreshold', refreshThreshold, where)
  nonNegativeMs('negativeTtl', negativeTtl, where)
  const life = lifetimes(ttl, refreshThreshold, typeof jitter === 'number' && jitter >= 0 && jitter < 1 ? jitter : 0)
  const cacheOptions = { ...rest, jitter, ...life, negativeTtl: Math.min(negativeTtl, life.hardTtl) }
  return {
    cacheOptions,
    plan: { ttl, refreshThreshold, jitter: cacheOptions.jitter, negativeTtl },
  }
}

// Validates every option at register time with the core's own rules (names and values, the Redis
// URL aside: an in-process cache made and closed at once, so no connection is opened).
function checkCacheOptions(cacheOptions, where) {
  const probe = { ...cacheOptions }
  delete probe.redis
  let made
  try {
    made = new StampedeCache(probe)
  } catch (err) {
    if (err instanceof StampedeCacheError) err.message = `${where}: ${err.message}`
    throw err
  }
  made.close().catch(() => {})
}

// Each cache-manager object this module made -> its StampedeCache and its getOrLoad (`load`), for
// CacheInterceptor (which is handed the object, as the original's is).
const managers = new WeakMap()

const MANAGER_EVENTS = ['set', 'mset', 'del', 'mdel', 'clear', 'refresh']

function invalidArgument(message) {
  return new StampedeCacheError('ERR_INVALID_ARGUMENT', message)
}

function checkTtlArgument(name, v) {
  if (v === undefined || v === null || typeof v === 'function') return
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
    throw invalidArgument(`${name} must be a number of ms >= 0 or a function of the value, got ${typeof v === 'number' ? v : typeof v}`)
  }
}

/**
 * cache-manager 7's `Cache` over `cache`: the same methods, arguments, results and events.
 * Methods are plain functions (no `this`), so they may be destructured, as cache-manager's may.
 */
function createCacheManager(cache, plan) {
  const { EventEmitter } = require('node:events')
  const events = new EventEmitter()
  const jitter = plan.jitter
  const policyOf = (life, refreshThreshold) => {
    const l = lifetimes(life, refreshThreshold, jitter)
    return { ttl: l.ttl, hardTtl: l.hardTtl, negativeTtl: Math.min(plan.negativeTtl, l.hardTtl) }
  }
  // Per-call options of a set: undefined when the module's defaults apply.
  const setOptions = (ttl) => {
    if (ttl === undefined || ttl === null) return undefined
    const l = lifetimes(ttl, plan.refreshThreshold, jitter)
    return { ttl: l.ttl, hardTtl: l.hardTtl }
  }

  // getOrLoad with cache-manager's ttl and refreshThreshold (numbers or functions of the value).
  // `fn` gets getOrLoad's ctx. Resolves with { value, ran }: `ran` when this call's own fn
  // produced the value (a cold load), for the 'set' event and the interceptor's X-Cache header.
  async function load(key, fn, ttl, refreshThreshold) {
    checkTtlArgument('ttl', ttl)
    checkTtlArgument('refreshThreshold', refreshThreshold)
    const dynamic = typeof ttl === 'function' || typeof refreshThreshold === 'function'
    const given = (ttl !== undefined && ttl !== null) || (refreshThreshold !== undefined && refreshThreshold !== null)
    const options = given && !dynamic ? policyOf(ttl ?? plan.ttl, refreshThreshold ?? plan.refreshThreshold) : undefined
    let ran = false
    // A result fn told not to cache (ctx.skipCache) was never set: no 'set' or 'refresh' event.
    let skipped = false
    const loader = async (ctx) => {
      // A refresh (background or XFetch-early) has the value it replaces; a cold load has none.
      const refreshing = ctx.stale !== undefined
      const own = {
        ...ctx,
        skipCache() {
          skipped = true
          ctx.skipCache()
        },
      }
      let value
      try {
        value = await fn(own)
      } catch (error) {
        if (refreshing) events.emit('refresh', { key, value: ctx.stale, error })
        throw error
      }
      if (dynamic) {
        const life = typeof ttl === 'function' ? ttl(value) : (ttl ?? plan.ttl)
        const threshold = typeof refreshThreshold === 'function' ? refreshThreshold(value) : (refreshThreshold ?? plan.refreshThreshold)
        const l = policyOf(life, threshold)
        ctx.setTtl(l.ttl, l.hardTtl)
      }
      if (!refreshing) ran = true
      else if (!skipped) events.emit('refresh', { key, value })
      return value
    }
    const value = await cache.getOrLoad(key, loader, options)
    if (ran && !skipped) events.emit('set', { key, value })
    return { value, ran }
  }

  async function set(key, value, ttl) {
    try {
      checkTtlArgument('ttl', ttl)
      if (typeof ttl === 'function') throw invalidArgument('set: ttl must be a number of ms')
      await cache.set(key, value, setOptions(ttl))
    } catch (error) {
      events.emit('set', { key, value, error })
      throw error
    }
    events.emit('set', { key, value })
    return value
  }

  const manager = {
    get: (key) => cache.get(key),
    // One get per key, concurrently (each answered by whichever tier holds it).
    mget: async (keys) => {
      if (!Array.isArray(keys)) throw invalidArgument('mget takes an array of keys')
      return Promise.all(keys.map((key) => cache.get(key)))
    },
    /** When the entry expires (epoch ms), or undefined: missing, or kept without a ttl. */
    ttl: async (key) => {
      const info = await cache.inspect(key)
      if (info === undefined || info.hardUntil - Date.now() > FOREVER / 2) return undefined
      return info.hardUntil
    },
    set,
    mset: async (list) => {
      if (!Array.isArray(list)) throw invalidArgument('mset takes an array of { key, value, ttl? }')
      const resolved = list.map(({ key, value, ttl }) => ({ key, value, ttl: ttl ?? plan.ttl }))
      try {
        await Promise.all(list.map(({ key, value, ttl }) => cache.set(key, value, setOptions(ttl))))
      } catch (error) {
        events.emit('mset', { list: resolved, error })
        throw error
      }
      events.emit('mset', { list: resolved })
      return resolved
    },
    del: async (key) => {
      try {
        await cache.delete(key)
      } catch (error) {
        events.emit('del', { key, error })
        throw error
      }
      events.emit('del', { key })
      return true
    },
    mdel: async (keys) => {
      if (!Array.isArray(keys)) throw invalidArgument('mdel takes an array of keys')
      try {
        await Promise.all(keys.map((key) => cache.delete(key)))
      } catch (error) {
        events.emit('mdel', { keys, error })
        throw error
      }
      events.emit('mdel', { keys })
      return true
    },
    clear: async () => {
      try {
        await cache.clear()
      } catch (error) {
        events.emit('clear', error)
        throw error
      }
      events.emit('clear')
      return true
    },
    /**
     * getOrLoad: concurrent calls for one key share one `fnc` call, in this process and across
     * processes sharing the Redis. `wrap(key, fnc, ttl?, refreshThreshold?)` or
     * `wrap(key, fnc, { ttl, refreshThreshold, raw })`; ttl and refreshThreshold may be functions of
     * the value.
     */
    wrap: async (key, fnc, ttlOrOptions, refreshThresholdArgument) => {
      if (typeof fnc !== 'function') throw invalidArgument(`wrap: the function must be a function, got ${typeof fnc}`)
      const byObject = typeof ttlOrOptions === 'object' && ttlOrOptions !== null
      const { ttl, refreshThreshold, raw } = byObject ? ttlOrOptions : { ttl: ttlOrOptions, refreshThreshold: refreshThresholdArgument }
      const { value } = await load(key, () => fnc(), ttl, refreshThreshold)
      if (raw !== true) return value
      const info = await cache.inspect(key)
      return { value, expires: info && info.hardUntil - Date.now() <= FOREVER / 2 ? info.hardUntil : undefined }
    },
    on: (event, listener) => {
      if (!MANAGER_EVENTS.includes(event)) {
        throw invalidArgument(`on: stampede-cache/nestjs emits ${MANAGER_EVENTS.map((e) => `'${e}'`).join(', ')}, not ${JSON.stringify(event)}`)
      }
      return events.addListener(event, listener)
    },
    off: (event, listener) => events.removeListener(event, listener),
    /** Closes the StampedeCache (its Redis connections); later calls reject with ERR_CLOSED. */
    disconnect: async () => {
      await cache.close()
      return undefined
    },
    cacheId: () => cache.namespace,
  }
  managers.set(manager, { cache, load })
  return manager
}

// The providers of one CacheModule registration, after its options provider.
function cacheManagerProviders() {
  return [
    {
      provide: StampedeCache,
      useFactory: (options) => new StampedeCache(planCacheModule(options, 'CacheModule').cacheOptions),
      inject: [CACHE_MODULE_OPTIONS],
    },
    { provide: STAMPEDE_CACHE, useExisting: StampedeCache },
    {
      provide: CACHE_MANAGER,
      useFactory: (cache, options) => createCacheManager(cache, planCacheModule(options, 'CacheModule').plan),
      inject: [StampedeCache, CACHE_MODULE_OPTIONS],
    },
    { provide: Cache, useExisting: CACHE_MANAGER },
    {
      provide: STAMPEDE_CACHE_CLOSER,
      useFactory: (cache) => ({ onApplicationShutdown: () => cache.close() }),
      inject: [StampedeCache],
    },
  ]
}

const CACHE_MODULE_EXPORTS = [CACHE_MANAGER, Cache, StampedeCache, STAMPEDE_CACHE, CACHE_MODULE_OPTIONS]

class CacheModule {
  /**
   * @nestjs/cache-manager's `CacheModule.register`: StampedeCache options, plus `isGlobal` and
   * `refreshThreshold`; `ttl` is an entry's whole life (ms), as in cache-manager 7.
   */
  static register(options = {}) {
    const where = 'CacheModule.register'
    const { cacheOptions } = planCacheModule(options, where)
    checkCacheOptions(cacheOptions, where)
    decorateCacheInterceptor()
    return {
      module: CacheModule,
      global: options?.isGlobal === true,
      providers: [{ provide: CACHE_MODULE_OPTIONS, useValue: { ...options } }, ...cacheManagerProviders()],
      exports: CACHE_MODULE_EXPORTS,
    }
  }

  /**
   * The same, with the options made at bootstrap by `useFactory` (from `inject`), or by the
   * `createCacheOptions()` of a `useClass` (instantiated here) or `useExisting` provider.
   */
  static registerAsync(options) {
    const where = 'CacheModule.registerAsync'
    if (!isPlainObject(options)) throw invalid(`${where}: options must be an object`)
    for (const k of Object.keys(options)) {
      if (!ASYNC_KEYS.includes(k)) throw invalid(`${where}: option \`${k}\` is not an option of registerAsync`)
    }
    const { useFactory, useClass, useExisting, inject = [], imports = [], extraProviders = [] } = options
    const ways = ['useFactory', 'useClass', 'useExisting'].filter((k) => options[k] !== undefined)
    if (ways.length !== 1)
      throw invalid(`${where}: give exactly one of \`useFactory\`, \`useClass\`, \`useExisting\`${ways.length ? `, not ${ways.join(' and ')}` : ''}`)
    if (useFactory !== undefined && typeof useFactory !== 'function') throw invalid(`${where}: \`useFactory\` must be a function`)
    if (useClass !== undefined && typeof useClass !== 'function') throw invalid(`${where}: \`useClass\` must be a class`)
    if (!Array.isArray(inject)) throw invalid(`${where}: \`inject\` must be an array`)
    if (!Array.isArray(imports)) throw invalid(`${where}: \`imports\` must be an array`)
    if (!Array.isArray(extraProviders)) throw invalid(`${where}: \`extraProviders\` must be an array`)
    const checked = (made) => {
      const { cacheOptions } = planCacheModule(made, where)
      checkCacheOptions(cacheOptions, where)
      return { ...made }
    }
    const fromFactory = async (factory) => {
      if (typeof factory?.createCacheOptions !== 'function') {
        throw invalid(`${where}: ${useClass ? '`useClass`' : '`useExisting`'} must provide createCacheOptions()`)
      }
      return checked(await factory.createCacheOptions())
    }
    let optionProviders
    if (useFactory) {
      optionProviders = [{ provide: CACHE_MODULE_OPTIONS, useFactory: async (...deps) => checked(await useFactory(...deps)), inject }]
    } else if (useClass) {
      optionProviders = [
        { provide: useClass, useClass },
        { provide: CACHE_MODULE_OPTIONS, useFactory: fromFactory, inject: [useClass] },
      ]
    } else {
      optionProviders = [{ provide: CACHE_MODULE_OPTIONS, useFactory: fromFactory, inject: [useExisting] }]
    }
    decorateCacheInterceptor()
    return {
      module: CacheModule,
      global: options.isGlobal === true,
      imports,
      providers: [...optionProviders, ...cacheManagerProviders(), ...extraProviders],
      exports: CACHE_MODULE_EXPORTS,
    }
  }
}

/** `@CacheKey(key)`: the cache key of a handler (a string, or a function of the ExecutionContext). */
function CacheKey(key) {
  return require('@nestjs/common').SetMetadata(CACHE_KEY_METADATA, key)
}

/** `@CacheTTL(ms)`: the life of a handler's (or a controller's) cached results; a number or a function of the context. */
function CacheTTL(ttl) {
  return require('@nestjs/common').SetMetadata(CACHE_TTL_METADATA, ttl)
}

// A value a handler threw: rethrown to every request that shared its run, unlike the cache's own
// errors, after which a request is answered as if there were no cache. Objects are marked in
// place (onError and the 'refresh' event see the error itself); anything else is boxed.
const handlerErrors = new WeakSet()
class ThrownValue {
  constructor(value) {
    this.value = value
  }
}
function markHandlerError(err) {
  const marked = (typeof err === 'object' && err !== null) || typeof err === 'function' ? err : new ThrownValue(err)
  handlerErrors.add(marked)
  return marked
}
const unmark = (err) => (err instanceof ThrownValue ? err.value : err)

// What a StreamableFile result is shared as (it is never cached, and one stream cannot answer two
// requests): the request whose handler made it sends it, the others run their own handlers.
const STREAM_MARKER_KEY = 'stampede-cache/nestjs'
const STREAM_MARKER = Object.freeze({ [STREAM_MARKER_KEY]: 'StreamableFile' })
const isStreamMarker = (v) => typeof v === 'object' && v !== null && v[STREAM_MARKER_KEY] === 'StreamableFile' && Object.keys(v).length === 1

const isNil = (v) => v === undefined || v === null

// rxjs and @nestjs/common, loaded on the first intercepted request (importing this entry loads neither).
let loadedDeps = null
function interceptorDeps() {
  if (loadedDeps === null) {
    const { of, from, lastValueFrom } = require('rxjs')
    const { StreamableFile, Logger } = require('@nestjs/common')
    loadedDeps = { of, from, lastValueFrom, StreamableFile, Logger }
  }
  return loadedDeps
}

/**
 * @nestjs/cache-manager's CacheInterceptor over getOrLoad: GET handlers' results are cached under
 * the request URL (or @CacheKey) for @CacheTTL ms, and concurrent requests for one key run the
 * handler once, across instances sharing a Redis. `trackBy` and `isRequestCacheable` may be
 * overridden as in the original.
 */
class CacheInterceptor {
  constructor(cacheManager, reflector) {
    this.cacheManager = cacheManager
    this.reflector = reflector
    this.allowedMethods = ['GET']
  }

  async intercept(context, next) {
    const key = await this.trackBy(context)
    const ttlValueOrFactory = this.reflector.get(CACHE_TTL_METADATA, context.getHandler()) ?? this.reflector.get(CACHE_TTL_METADATA, context.getClass()) ?? null
    if (!key) return next.handle()
    const internals = managers.get(this.cacheManager)
    if (internals === undefined) {
      throw new TypeError(
        "CacheInterceptor from 'stampede-cache/nestjs' needs CACHE_MANAGER from its CacheModule (import CacheModule from 'stampede-cache/nestjs' too)",
      )
    }
    const { of, from, lastValueFrom, StreamableFile, Logger } = interceptorDeps()
    const ttl = typeof ttlValueOrFactory === 'function' ? await ttlValueOrFactory(context) : ttlValueOrFactory
    // This request's own handler run, when its load was the cold one (not a background refresh).
    let ownRun = null
    let ownStream = null
    const runHandler = async (ctx) => {
      const run = lastValueFrom(next.handle(), { defaultValue: undefined })
      if (ctx.stale === undefined) ownRun = run
      let value
      try {
        value = await run
      } catch (err) {
        throw markHandlerError(err)
      }
      if (value instanceof StreamableFile) {
        ctx.skipCache()
        if (ctx.stale === undefined) ownStream = value
        return STREAM_MARKER
      }
      return value
    }
    let loaded
    try {
      loaded = await internals.load(key, runHandler, ttl ?? undefined, undefined)
    } catch (err) {
      if (handlerErrors.has(err)) {
        this.#setCacheHeader(context)
        throw unmark(err)
      }
      // The cache could not answer (a key it cannot take, a value it cannot store, a timeout,
      // closed): answer as if uncached, with this request's own handler run if it had one.
      Logger.error(`stampede-cache could not cache "key: ${key}": ${err?.message ?? err}`, err?.stack, 'CacheInterceptor')
      return ownRun ? from(ownRun) : next.handle()
    }
    if (isStreamMarker(loaded.value)) return ownStream ? of(ownStream) : next.handle()
    this.#setCacheHeader(context, loaded.ran ? undefined : loaded.value)
    return of(loaded.value)
  }

  #setCacheHeader(context, value) {
    try {
      this.setHeadersWhenHttp(context, value)
    } catch {
      // Headers already sent (a handler that wrote the response itself): nothing to mark.
    }
  }

  trackBy(context) {
    const httpAdapter = this.httpAdapterHost?.httpAdapter
    const isHttpApp = httpAdapter && !!httpAdapter.getRequestMethod
    const cacheMetadataOrFactory = this.reflector.get(CACHE_KEY_METADATA, context.getHandler()) ?? undefined
    if (!isHttpApp || cacheMetadataOrFactory) {
      return typeof cacheMetadataOrFactory === 'function' ? cacheMetadataOrFactory(context) : cacheMetadataOrFactory
    }
    if (!this.isRequestCacheable(context)) return undefined
    return httpAdapter.getRequestUrl(context.getArgByIndex(0))
  }

  isRequestCacheable(context) {
    const req = context.switchToHttp().getRequest()
    return this.allowedMethods.includes(req.method)
  }

  /** X-Cache: HIT when the handler did not run for this request (coalesced requests included), else MISS. */
  setHeadersWhenHttp(context, value) {
    const httpAdapter = this.httpAdapterHost?.httpAdapter
    if (!httpAdapter) return
    const response = context.switchToHttp().getResponse()
    httpAdapter.setHeader(response, 'X-Cache', isNil(value) ? 'MISS' : 'HIT')
  }
}

// Nest's injection metadata for CacheInterceptor, written with Nest's own decorators the first
// time CacheModule is registered (so importing this entry never loads Nest). Subclasses that
// override trackBy inherit it, as they inherit the original's.
let interceptorDecorated = false
function decorateCacheInterceptor() {
  if (interceptorDecorated) return
  const { Inject, Injectable, Optional } = require('@nestjs/common')
  const { HttpAdapterHost, Reflector } = require('@nestjs/core')
  Injectable()(CacheInterceptor)
  Inject(CACHE_MANAGER)(CacheInterceptor, undefined, 0)
  Inject(Reflector)(CacheInterceptor, undefined, 1)
  Optional()(CacheInterceptor.prototype, 'httpAdapterHost')
  Inject(HttpAdapterHost)(CacheInterceptor.prototype, 'httpAdapterHost')
  interceptorDecorated = true
}

module.exports = {
  StampedeCacheModule,
  InjectStampedeCache,
  STAMPEDE_CACHE,
  STAMPEDE_CACHE_OPTIONS,
  StampedeCache,
  CacheModule,
  CACHE_MANAGER,
  CACHE_KEY_METADATA,
  CACHE_TTL_METADATA,
  CACHE_MODULE_OPTIONS,
  Cache,
  CacheInterceptor,
  CacheKey,
  CacheTTL,
}
