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
  store: 'stampede-cache keeps entries in process and, with the `redis` option, in Redis: use `redis` instead',
  nonBlocking: 'there is one store (Redis answers or the in-process tier does), so there is nothing to race',
  refreshAllStores: 'there is one store; a refresh replaces the entry in every tier and every instance',
  hardTtl: "in CacheModule, `ttl` is an entry's whole life (as in cache-manager); use `refreshThreshold` for stale-while-revalidate",
}
const ASYNC_KEYS = ['imports', 'inject', 'useFactory', 'useClass', 'useExisting', 'isGlobal', 'extraProviders']

// ---- `stores`: the original's documented Redis set-up, taken as the `redis` option ----
//
// cache-manager 7 is given Keyv stores: `stores: [createKeyv(url)]` (@keyv/redis) is how the
// original's documentation connects Redis, often behind an in-memory Keyv (`new Keyv()`,
// `new Keyv({ store: new CacheableMemory() })`) or as a `Cacheable` of both. That layout is what a
// StampedeCache is (its in-process tier in front of Redis), so in-memory stores are dropped and the
// one Redis store becomes `redis`. Anything else (another store, two Redis stores, a Redis client
// whose address cannot be read) throws, naming `stores` and `redis`. A @keyv/redis client connects
// on its first command, so the dropped stores hold no connection.

// A Keyv instance, told as @nestjs/cache-manager tells one (Keyv is not loaded here).
const isKeyv = (s) => typeof s === 'object' && s !== null && 'opts' in s && 'hooks' in s && typeof s.get === 'function' && typeof s.set === 'function'
// A `Cacheable` (the cacheable package): two tiers of its own.
const isCacheable = (s) => typeof s === 'object' && s !== null && 'primary' in s && 'secondary' in s && 'nonBlocking' in s
const className = (v) => (typeof v === 'object' && v !== null ? v.constructor?.name : undefined)
// A store that keeps entries in process: Keyv's default Map, cacheable's CacheableMemory.
const isMemoryAdapter = (a) => a instanceof Map || ['CacheableMemory', 'KeyvCacheableMemory'].includes(className(a))
// @keyv/redis's adapter: a node-redis client (or cluster) under `client`.
const isRedisAdapter = (a) => className(a) === 'KeyvRedis' && typeof a.client === 'object' && a.client !== null

// The `redis` option naming the server a node-redis client was made for (its url, or the socket
// and credentials it was given), or null when its options say neither.
function redisOptionOf(client) {
  const o = client.options ?? {}
  if (Array.isArray(o.rootNodes)) {
    const seeds = o.rootNodes.map((n) => n?.url).filter((u) => typeof u === 'string')
    return seeds.length > 0 && seeds.length === o.rootNodes.length ? { cluster: seeds } : null
  }
  if (o.sentinelRootNodes !== undefined) return null
  if (typeof o.url === 'string') return o.url
  const socket = o.socket ?? {}
  if (typeof socket.path === 'string') return `unix://${socket.path}${o.database ? `?db=${o.database}` : ''}`
  if (typeof socket.host !== 'string' && socket.port === undefined) return null
  const auth =
    o.username !== undefined || o.password !== undefined
      ? `${encodeURIComponent(o.username ?? '')}${o.password !== undefined ? `:${encodeURIComponent(o.password)}` : ''}@`
      : ''
  const host = socket.host ?? '127.0.0.1'
  return `${socket.tls ? 'rediss' : 'redis'}://${auth}${host.includes(':') ? `[${host}]` : host}:${socket.port ?? 6379}${o.database ? `/${o.database}` : ''}`
}

/** CacheModule options with `stores` taken as `redis` (and the Keyv namespace as `namespace`). */
function translateStores(options, where) {
  if (options.stores === undefined) return options
  const { stores, ...rest } = options
  const refuse = (why) => {
    throw invalid(`${where}: option \`stores\` is not supported ${why}: use \`redis\` (a URL or RedisOptions) instead`)
  }
  const tiers = []
  for (const s of Array.isArray(stores) ? stores : [stores]) {
    if (isCacheable(s)) tiers.push(s.primary, ...(Array.isArray(s.secondary) ? s.secondary : [s.secondary]))
    else tiers.push(s)
  }
  let redis = null
  let namespace
  for (const tier of tiers) {
    if (tier === undefined || tier === null) continue
    const adapter = isKeyv(tier) ? (tier.store ?? tier.opts?.store) : tier
    if (isMemoryAdapter(adapter) || adapter === undefined) continue
    if (!isRedisAdapter(adapter)) refuse(`with ${className(adapter) ?? typeof adapter} (only in-memory stores and one @keyv/redis store are)`)
    if (redis !== null) refuse('with several Redis stores')
    redis = redisOptionOf(adapter.client)
    if (redis === null) refuse('with a @keyv/redis client whose address is not a URL, a host and port, or cluster root node URLs')
    // The namespace given to createKeyv (@keyv/redis's own); a Keyv's default 'keyv' is no choice.
    const ns = adapter.namespace
    if (typeof ns === 'string' && ns !== '') namespace = ns
  }
  if (redis !== null && rest.redis !== undefined) throw invalid(`${where}: give \`redis\` or a Redis store in \`stores\`, not both`)
  const out = redis === null ? rest : { ...rest, redis }
  if (namespace !== undefined && out.namespace === undefined) out.namespace = namespace
  return out
}

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
  options = translateStores(options, where)
  for (const [name, why] of Object.entries(STORE_OPTIONS)) {
    // nonBlocking: false is cache-manager's default: nothing to refuse.
    if (options[name] !== undefined && !(name === 'nonBlocking' && options[name] === false)) {
      throw invalid(`${where}: option \`${name}\` is not supported: ${why}`)
    }
  }
  if (options.cacheId !== undefined && (typeof options.cacheId !== 'string' || options.cacheId === '')) {
    throw invalid(`${where}: option \`cacheId\` must be a non-empty string`)
  }
  // isGlobal is the module's; refreshThreshold and ttl become ttl and hardTtl. jitter defaults to 0:
  // cache-manager's ttl is exact. cacheId names the cache-manager object only (cacheId()): in
  // cache-manager it scopes wrap's coalescing, which here is per key and namespace.
  const { refreshThreshold, ttl, jitter = 0, negativeTtl = 5_000, cacheId, ...rest } = options
  delete rest.isGlobal
  delete rest.nonBlocking
  nonNegativeMs('ttl', ttl, where)
  nonNegativeMs('refreshThreshold', refreshThreshold, where)
  nonNegativeMs('negativeTtl', negativeTtl, where)
  const life = lifetimes(ttl, refreshThreshold, typeof jitter === 'number' && jitter >= 0 && jitter < 1 ? jitter : 0)
  const cacheOptions = { ...rest, jitter, ...life, negativeTtl: Math.min(negativeTtl, life.hardTtl) }
  return {
    cacheOptions,
    // json: the default serializer, under which values are JSON data (see markJson).
    plan: { ttl, refreshThreshold, jitter: cacheOptions.jitter, negativeTtl, cacheId, json: rest.serializer === undefined || rest.serializer === 'json' },
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

// Each cache-manager object this module made -> its StampedeCache, its getOrLoad (`load`), its
// set (`put`), the in-process flights of requests with credentials, and the plan, for
// CacheInterceptor (which is handed the object, as the original's is).
const managers = new WeakMap()

// Every event cache-manager 7 emits.
const MANAGER_EVENTS = ['get', 'mget', 'set', 'mset', 'del', 'mdel', 'clear', 'ttl', 'refresh']
// The label cache-manager gives its first store in events: a StampedeCache is one store.
const PRIMARY = 'primary'

function invalidArgument(message) {
  return new StampedeCacheError('ERR_INVALID_ARGUMENT', message)
}

function checkTtlArgument(name, v) {
  if (v === undefined || v === null || typeof v === 'function') return
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
    throw invalidArgument(`${name} must be a number of ms >= 0 or a function of the value, got ${typeof v === 'number' ? v : typeof v}`)
  }
}

// cache-manager (Keyv) takes keys of any length; a StampedeCache key is at most 1,024 bytes. A
// longer string key (a long URL) is stored under its SHA-256, so it is cached, silently, as the
// original caches it; every method maps it the same way, and events carry the key as given.
const MAX_KEY_BYTES = 1024
function storageKey(key) {
  if (typeof key !== 'string' || key.length <= MAX_KEY_BYTES / 3 || Buffer.byteLength(key) <= MAX_KEY_BYTES) return key
  return `#sha256:${require('node:crypto').createHash('sha256').update(key).digest('hex')}`
}

// Values are stored as JSON data (the default serializer), so an object whose JSON is not an
// object (a Date, an instance whose toJSON returns a string) would come back a string: Nest
// answers a string as text/html and an object as JSON. Such a value is stored marked, and
// answered as the JSON it was; CACHE_MANAGER's reads hand back the JSON value (what cache-manager
// over Redis hands back).
const JSON_MARKER_KEY = 'stampede-cache/nestjs:json'
const isJsonMarker = (v) => typeof v === 'object' && v !== null && !Array.isArray(v) && JSON_MARKER_KEY in v && Object.keys(v).length === 1
const unmarked = (v) => (isJsonMarker(v) ? v[JSON_MARKER_KEY] : v)
function markJson(value) {
  if (typeof value !== 'object' || value === null || typeof value.toJSON !== 'function') return value
  let json
  try {
    json = value.toJSON('')
  } catch {
    // The serializer calls toJSON again, and reports its error as its own.
    return value
  }
  return json === null || ['string', 'number', 'boolean'].includes(typeof json) ? { [JSON_MARKER_KEY]: json } : value
}

// What a load stores when its result must not be cached or shared (see responseForm): callers
// that shared the run make their own response. They get the stored copy, so it is told by shape.
const OWN_RESPONSE_KEY = 'stampede-cache/nestjs'
const OWN_RESPONSE = Object.freeze({ [OWN_RESPONSE_KEY]: 'own response' })
const isOwnResponse = (v) => typeof v === 'object' && v !== null && v[OWN_RESPONSE_KEY] === 'own response' && Object.keys(v).length === 1

/**
 * cache-manager 7's `Cache` over `cache`: the same methods, arguments, results and events.
 * Methods are plain functions (no `this`), so they may be destructured, as cache-manager's may.
 */
function createCacheManager(cache, plan) {
  const { EventEmitter } = require('node:events')
  const events = new EventEmitter()
  const jitter = plan.jitter
  const encode = plan.json ? markJson : (v) => v
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
  // Refreshed values on their way into the cache. A background refresh's write lands a moment
  // after its fn resolved (the store is native); cache-manager's lands within the same tick, so a
  // read right after a refresh sees the new value there. Reads of such a key answer the value being
  // written until every refresh started so far has ended (settle()); a write of the key ends it.
  const landing = new Map()
  const land = (sk, stored, written = null) => {
    landing.set(sk, plan.json ? JSON.parse(JSON.stringify(stored) ?? 'null') : stored)
    ;(written ?? cache.settle()).then(
      () => landing.delete(sk),
      () => landing.delete(sk),
    )
  }
  const landed = (keys) => {
    if (landing.size === 0) return
    if (keys === undefined) landing.clear()
    else for (const key of keys) landing.delete(storageKey(key))
  }

  // cache-manager's set emits once per store (with its label), then once for the call.
  const emitSet = (key, value) => {
    events.emit('set', { key, value, store: PRIMARY })
    events.emit('set', { key, value })
  }

  // getOrLoad with cache-manager's ttl and refreshThreshold (numbers or functions of the value).
  // `fn` gets getOrLoad's ctx; `store(value)` is what is cached for its result (OWN_RESPONSE:
  // nothing, and callers sharing the run make their own). Resolves with { value, ran }: `ran` when
  // this call's own fn produced the value (a cold load), for the 'set' event and X-Cache.
  async function load(key, fn, ttl, refreshThreshold, store = encode) {
    checkTtlArgument('ttl', ttl)
    checkTtlArgument('refreshThreshold', refreshThreshold)
    const dynamic = typeof ttl === 'function' || typeof refreshThreshold === 'function'
    const given = (ttl !== undefined && ttl !== null) || (refreshThreshold !== undefined && refreshThreshold !== null)
    const options = given && !dynamic ? policyOf(ttl ?? plan.ttl, refreshThreshold ?? plan.refreshThreshold) : undefined
    let ran = false
    let produced
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
        if (refreshing) events.emit('refresh', { key, value: unmarked(ctx.stale), error })
        throw error
      }
      const stored = store(value)
      if (isOwnResponse(stored)) own.skipCache()
      if (dynamic) {
        const life = typeof ttl === 'function' ? ttl(value) : (ttl ?? plan.ttl)
        const threshold = typeof refreshThreshold === 'function' ? refreshThreshold(value) : (refreshThreshold ?? plan.refreshThreshold)
        const l = policyOf(life, threshold)
        ctx.setTtl(l.ttl, l.hardTtl)
      }
      if (!refreshing) {
        ran = true
        produced = value
      } else if (!skipped) {
        land(sk, stored)
        emitSet(key, value)
        events.emit('refresh', { key, value })
      }
      return stored
    }
    const sk = storageKey(key)
    if (landing.has(sk)) return { value: landing.get(sk), ran: false }
    // A call's own refreshThreshold is cache-manager's: judged on each call (less than it left of
    // the entry's life), where the stored entry turns stale at the threshold it was written with.
    // Such a call judges the entry itself: it is served, and refreshed in the background at once
    // (in this process, as cache-manager refreshes) only if this call's threshold says so. The
    // module's refreshThreshold, and the interceptor's, are the cache's own: one refresh across
    // instances, under the key's lock.
    if (refreshThreshold !== undefined && refreshThreshold !== null) {
      const info = await cache.inspect(sk)
      if (info !== undefined && info.state !== 'negative') {
        const held = await cache.get(sk)
        const threshold = typeof refreshThreshold === 'function' ? refreshThreshold(unmarked(held)) : refreshThreshold
        if (held !== undefined) {
          if (info.hardUntil - Date.now() < threshold && !refreshing.has(sk)) refreshing.set(sk, refreshHere({ key, sk, held, fn, ttl, threshold, store }))
          return { value: held, ran: false }
        }
      }
    }
    const value = await cache.getOrLoad(sk, loader, options)
    if (ran && !skipped) emitSet(key, produced)
    return { value, ran, produced }
  }

  // A background refresh decided by a call (see load), as cache-manager's wrap runs it: fn once
  // for concurrent callers (`refreshing`), then a set, and the 'refresh' event.
  const refreshing = new Map()
  async function refreshHere({ key, sk, held, fn, ttl, threshold, store }) {
    try {
      const value = await fn({ key: sk, stale: held, signal: new AbortController().signal, setTtl() {}, setTags() {}, skipCache() {} })
      const stored = store(value)
      if (isOwnResponse(stored)) return
      const life = typeof ttl === 'function' ? ttl(value) : (ttl ?? plan.ttl)
      const { ttl: fresh, hardTtl } = policyOf(life, threshold)
      const written = cache.set(sk, stored, { ttl: fresh, hardTtl })
      land(sk, stored, written)
      await written
      emitSet(key, value)
      events.emit('refresh', { key, value })
    } catch (error) {
      events.emit('refresh', { key, value: unmarked(held), error })
    } finally {
      refreshing.delete(sk)
    }
  }

  // set: `value` stored as `stored`; events carry `value`.
  async function put(key, value, ttl, stored = encode(value)) {
    try {
      checkTtlArgument('ttl', ttl)
      if (typeof ttl === 'function') throw invalidArgument('set: ttl must be a number of ms')
      landed([key])
      await cache.set(storageKey(key), stored, setOptions(ttl))
    } catch (error) {
      events.emit('set', { key, value, error })
      throw error
    }
    emitSet(key, value)
    return value
  }

  // A read that fails (a closed cache, a key the cache cannot take) is reported as cache-manager
  // reports a store's failure, then rejects.
  async function get(key) {
    let value
    try {
      const sk = storageKey(key)
      value = unmarked(landing.has(sk) ? landing.get(sk) : await cache.get(sk))
    } catch (error) {
      events.emit('get', { key, error, store: PRIMARY })
      throw error
    }
    if (value !== undefined) events.emit('get', { key, value, store: PRIMARY })
    return value
  }

  // When the entry expires (epoch ms), or undefined: missing, or kept without a ttl.
  const expiryOf = (info) => (info === undefined || info.hardUntil - Date.now() > FOREVER / 2 ? undefined : info.hardUntil)

  const manager = {
    get,
    // One get per key, concurrently (each answered by whichever tier holds it).
    mget: async (keys) => {
      if (!Array.isArray(keys)) throw invalidArgument('mget takes an array of keys')
      let values
      try {
        const sks = keys.map(storageKey)
        values = (await cache.getMany(sks)).map((v, i) => unmarked(landing.has(sks[i]) ? landing.get(sks[i]) : v))
      } catch (error) {
        events.emit('mget', { keys, error })
        throw error
      }
      events.emit('mget', { keys, values })
      return values
    },
    /** When the entry expires (epoch ms), or undefined: missing, or kept without a ttl. */
    ttl: async (key) => {
      let info
      let value
      try {
        info = await cache.inspect(storageKey(key))
        // The 'ttl' event carries the stored record, { value, expires }, as Keyv's raw get.
        if (info !== undefined && events.listenerCount('ttl') > 0) value = unmarked(await cache.get(storageKey(key)))
      } catch (error) {
        events.emit('ttl', { key, error })
        throw error
      }
      if (info === undefined) return undefined
      const expires = expiryOf(info)
      if (events.listenerCount('ttl') > 0) events.emit('ttl', { key, value: { value, expires } })
      return expires
    },
    set: (key, value, ttl) => put(key, value, ttl),
    mset: async (list) => {
      if (!Array.isArray(list)) throw invalidArgument('mset takes an array of { key, value, ttl? }')
      const resolved = list.map(({ key, value, ttl }) => ({ key, value, ttl: ttl ?? plan.ttl }))
      try {
        landed(list.map(({ key }) => key))
        await Promise.all(list.map(({ key, value, ttl }) => cache.set(storageKey(key), encode(value), setOptions(ttl))))
      } catch (error) {
        events.emit('mset', { list: resolved, error })
        throw error
      }
      events.emit('mset', { list: resolved })
      return resolved
    },
    del: async (key) => {
      try {
        landed([key])
        await cache.delete(storageKey(key))
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
        landed(keys)
        await Promise.all(keys.map((key) => cache.delete(storageKey(key))))
      } catch (error) {
        events.emit('mdel', { keys, error })
        throw error
      }
      events.emit('mdel', { keys })
      return true
    },
    clear: async () => {
      try {
        landed()
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
      const loaded = await load(key, () => fnc(), ttl, refreshThreshold)
      // The caller whose fn ran gets its result itself, as cache-manager's does.
      const value = loaded.ran ? loaded.produced : unmarked(loaded.value)
      if (raw !== true) return value
      return { value, expires: expiryOf(await cache.inspect(storageKey(key))) }
    },
    on: (event, listener) => {
      if (!MANAGER_EVENTS.includes(event)) {
        throw invalidArgument(`on: cache-manager emits ${MANAGER_EVENTS.map((e) => `'${e}'`).join(', ')}, not ${JSON.stringify(event)}`)
      }
      return events.addListener(event, listener)
    },
    off: (event, listener) => events.removeListener(event, listener),
    /** Closes the StampedeCache (its Redis connections); later calls reject with ERR_CLOSED. */
    disconnect: async () => {
      await cache.close()
      return undefined
    },
    cacheId: () => plan.cacheId ?? cache.namespace,
  }
  managers.set(manager, { cache, load, put, plan, flights: new Map() })
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

const isNil = (v) => v === undefined || v === null

// A body Nest streams (a Node Readable, a web ReadableStream): one stream answers one request.
const isStream = (v) => typeof v === 'object' && v !== null && (typeof v.pipe === 'function' || typeof v.getReader === 'function')

/**
 * What the interceptor caches for a handler's result: what Nest's reply would send, kept so a hit
 * answers the same bytes and content type as the handler's own response (Nest sends an object,
 * a Date included, with res.json, and anything else as String(value)). OWN_RESPONSE for results
 * that are never cached (a StreamableFile, a stream) or that JSON cannot hold (a BigInt inside an
 * object, a cycle): each request sharing the run then makes its own.
 */
function responseForm(value, json, StreamableFile) {
  if (value instanceof StreamableFile || isStream(value)) return OWN_RESPONSE
  if (!json || isNil(value)) return value
  if (typeof value === 'object') {
    let text
    try {
      text = JSON.stringify(value)
    } catch {
      return OWN_RESPONSE
    }
    if (text === undefined) return OWN_RESPONSE
    const data = JSON.parse(text)
    return typeof data === 'object' && data !== null ? data : { [JSON_MARKER_KEY]: data }
  }
  if (typeof value === 'function') return OWN_RESPONSE
  // Sent as String(value): a BigInt, a symbol, NaN or Infinity (JSON has none of them) as that text.
  if (typeof value === 'bigint' || typeof value === 'symbol' || (typeof value === 'number' && !Number.isFinite(value))) return String(value)
  return value
}

// A cached response as Nest must be handed it to send the handler's bytes again: a marked JSON
// primitive goes out as JSON (res.json), as the Date or toJSON instance it was did.
const replyForm = (stored) => (isJsonMarker(stored) ? { toJSON: () => stored[JSON_MARKER_KEY] } : stored)

// The credentials a request carries, compared whole (never stored, never logged): '' for none.
const NO_CREDENTIALS = ''
function credentialsOf(context) {
  const type = context.getType?.()
  // GraphQL's resolver arguments are (root, args, context, info), the request in context.req.
  const request = type === 'http' ? context.switchToHttp().getRequest() : type === 'graphql' ? context.getArgByIndex?.(2)?.req : undefined
  const headers = request?.headers
  const authorization = headers?.authorization
  const cookie = headers?.cookie
  if (authorization === undefined && cookie === undefined) return NO_CREDENTIALS
  return JSON.stringify([authorization ?? null, cookie ?? null])
}

// rxjs and @nestjs/common, loaded on the first intercepted request (importing this entry loads neither).
let loadedDeps = null
function interceptorDeps() {
  if (loadedDeps === null) {
    const { of, lastValueFrom } = require('rxjs')
    const { StreamableFile } = require('@nestjs/common')
    loadedDeps = { of, lastValueFrom, StreamableFile }
  }
  return loadedDeps
}

/**
 * @nestjs/cache-manager's CacheInterceptor over getOrLoad: GET handlers' results are cached under
 * the request URL (or @CacheKey) for @CacheTTL ms, and concurrent requests for one key run the
 * handler once, across instances sharing a Redis. Sharing never crosses credentials: a request
 * shares another's handler run (its response or its error) only when both carry the same
 * `Authorization` and `Cookie` headers. `trackBy` and `isRequestCacheable` may be overridden as in
 * the original.
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
    const ttl = typeof ttlValueOrFactory === 'function' ? await ttlValueOrFactory(context) : ttlValueOrFactory
    const credentials = credentialsOf(context)
    const answer =
      credentials === NO_CREDENTIALS
        ? await this.#shared(internals, context, next, key, ttl)
        : await this.#ownCredentials(internals, context, next, key, ttl, credentials)
    if (answer.error !== undefined) {
      this.#setCacheHeader(context, undefined)
      throw answer.error
    }
    if (answer.run) {
      this.#setCacheHeader(context, undefined)
      return next.handle()
    }
    this.#setCacheHeader(context, answer.own ? undefined : answer.value)
    return interceptorDeps().of(answer.own ? answer.value : replyForm(answer.value))
  }

  // Requests without credentials: getOrLoad, so concurrent ones share one handler run in this
  // process and, through the Redis lock, across processes (only ever with requests that carry
  // none either: requests with credentials never take that lock). Resolves with { value, own }
  // (own: this request's handler made it), { run } (make this request's own response), or { error }.
  async #shared(internals, context, next, key, ttl) {
    const { lastValueFrom, StreamableFile } = interceptorDeps()
    let own
    let ownRan = false
    const runHandler = async (ctx) => {
      let value
      try {
        value = await lastValueFrom(next.handle(), { defaultValue: undefined })
      } catch (err) {
        throw markHandlerError(err)
      }
      if (ctx.stale === undefined) {
        own = value
        ownRan = true
      }
      return value
    }
    try {
      const loaded = await internals.load(key, runHandler, ttl ?? undefined, undefined, (value) => responseForm(value, internals.plan.json, StreamableFile))
      if (loaded.ran) return { value: own, own: true }
      if (isOwnResponse(loaded.value)) return { run: true }
      return { value: loaded.value, own: false }
    } catch (err) {
      if (handlerErrors.has(err)) return { error: unmark(err) }
      // The cache could not answer (a value it cannot store, a timeout, closed): answered as if
      // uncached, silently (the original logs nothing per request), with this request's own
      // handler run if it had one.
      return ownRan ? { value: own, own: true } : { run: true }
    }
  }

  // Requests with credentials: an entry already cached is served by its key, as the original
  // serves it; a miss runs this request's handler, shared only by concurrent requests with the
  // same credentials in this process, and caches its response (never its error).
  async #ownCredentials(internals, context, next, key, ttl, credentials) {
    const { lastValueFrom, StreamableFile } = interceptorDeps()
    let held
    try {
      held = await internals.cache.get(storageKey(key))
    } catch {
      return { run: true }
    }
    // Held: getOrLoad serves it (a stale one is refreshed in the background, by this request's
    // handler, whose response then is cached by key as a miss's would be). Only an entry that
    // expires between these two calls makes that getOrLoad a cold load others may join.
    if (held !== undefined) return this.#shared(internals, context, next, key, ttl)
    const flightKey = JSON.stringify([typeof key === 'string' ? key : String(key), credentials])
    const joined = internals.flights.get(flightKey)
    if (joined !== undefined) {
      const outcome = await joined
      if (outcome.error !== undefined) return { error: outcome.error }
      if (isOwnResponse(outcome.stored)) return { run: true }
      return { value: outcome.stored, own: false }
    }
    let release
    const flight = new Promise((resolve) => (release = resolve))
    internals.flights.set(flightKey, flight)
    let outcome
    try {
      const value = await lastValueFrom(next.handle(), { defaultValue: undefined })
      const stored = responseForm(value, internals.plan.json, StreamableFile)
      outcome = { stored, value }
      // Cached as the original caches a response, without holding it up (nil and streams are not:
      // they are never served from the original's cache either). A value the cache cannot take is
      // answered uncached.
      if (!isOwnResponse(stored) && !isNil(stored)) internals.put(key, value, ttl ?? undefined, stored).catch(() => {})
    } catch (error) {
      outcome = { error }
    } finally {
      internals.flights.delete(flightKey)
      release(outcome ?? { stored: OWN_RESPONSE })
    }
    if (outcome.error !== undefined) return { error: outcome.error }
    return { value: outcome.value, own: true }
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
