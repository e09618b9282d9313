'use strict'
// stampede-cache/next: the two cache handlers of Next.js 16 on a StampedeCache.
//
// - createUseCacheHandler(options): for `cacheHandlers` ("use cache"): get, set, refreshTags,
//   getExpiration, updateTags, as next/dist/server/lib/cache-handlers/types.d.ts defines them.
// - createIncrementalCacheHandler(options): for `cacheHandler` (ISR pages, fetch, unstable_cache):
//   a class with get, set, revalidateTag and resetRequestCache, as
//   next/dist/server/lib/incremental-cache/index.d.ts defines CacheHandler.
//
// One computation across instances. Next.js merges concurrent computations inside one process only,
// and it computes an entry only after `get` answered a miss, then hands the result to `set`. So a
// `get` that misses runs `getOrLoad` with a loader that does not compute: the loader is called only
// in the instance that won the key (in-process flight plus the Redis lock), and it makes that `get`
// answer a miss, so this instance's Next computes; the loader then resolves with what this
// instance's `set` stores. Every other `get` of the key, here or in another instance, is a caller of
// that load: it waits (notified, bounded by lockTtl) and serves the entry. If the `set` never comes
// (the render failed, the entry is not cacheable), the load times out after lockTtl and frees the
// key, and the waiting callers answer a miss: their instances compute, as Next would have anyway.

const { createHash } = require('node:crypto')
const { StampedeCache, StampedeCacheError } = require('./index.js')

// next/dist/shared/lib/constants PHASE_PRODUCTION_BUILD; `next build` sets NEXT_PHASE to it.
const PHASE_PRODUCTION_BUILD = 'phase-production-build'
// The tag header of ISR entries (next/dist/lib/constants NEXT_CACHE_TAGS_HEADER).
const NEXT_CACHE_TAGS_HEADER = 'x-next-cache-tags'
// StampedeCache's bound on a tag's length: an entry carrying a longer one is not stored, since a tag
// it could not carry could never invalidate it. Their number is not bounded.
const MAX_TAG_BYTES = 1024
// Next.js's own keys are kept as they are up to this size, longer ones (a "use cache" key holds the
// function's encoded arguments) are hashed to fit StampedeCache's 1,024-byte key bound.
const MAX_PLAIN_KEY_BYTES = 400
// The longest any entry lives (CACHE_ONE_YEAR_SECONDS): an ISR or fetch entry when Next gives no
// `expire`, and the bound of every other.
const ONE_YEAR_MS = 31_536_000_000
const DEFAULT_LOCK_TTL = 10_000
const DEFAULT_COMMAND_TIMEOUT = 1_000
// The largest entry stored (bytes; README, "Next.js"). Storing costs the process several times an
// entry's size and holds the event loop while it is serialized: measured (bench/next-entry-size.js)
// about 10 ms and 6 MB of RSS per MiB, so 64 MiB stalled it for half a second. 4 MiB stays near the
// 50 ms a batch may hold the loop, and is twice the 2 MB Next.js itself caps a fetch entry at.
const DEFAULT_MAX_ENTRY_BYTES = 4 * 1024 * 1024

function invalid(message) {
  return new StampedeCacheError('ERR_INVALID_OPTION', message)
}

// ---- Entry size: maxEntryBytes ----------------------------------------------------------------

/** The handlers' `maxEntryBytes` option (removed from the StampedeCache options), checked. */
function takeMaxEntryBytes(cacheOptions, where) {
  const max = cacheOptions.maxEntryBytes === undefined ? DEFAULT_MAX_ENTRY_BYTES : cacheOptions.maxEntryBytes
  delete cacheOptions.maxEntryBytes
  if (typeof max !== 'number' || Number.isNaN(max) || max < 1 || (Number.isFinite(max) && !Number.isInteger(max))) {
    throw invalid(`${where}: option \`maxEntryBytes\` must be a whole number of bytes >= 1 (or Infinity), got ${typeof max === 'number' ? max : typeof max}`)
  }
  return max
}

/**
 * The size of `value` as stored, in bytes (strings as UTF-8, byte arrays as their length, a few
 * bytes per other item), counted only until it passes `limit`: a huge entry costs a walk of its
 * first `limit` bytes' worth of parts, never a serialization. Shared parts count once.
 */
function sizeUpTo(value, limit) {
  let total = 0
  const stack = [value]
  const seen = new Set()
  while (stack.length > 0 && total <= limit) {
    const v = stack.pop()
    if (typeof v === 'string') total += Buffer.byteLength(v)
    else if (ArrayBuffer.isView(v) || v instanceof ArrayBuffer) total += v.byteLength
    else if (typeof v !== 'object' || v === null) total += 8
    else if (!seen.has(v)) {
      seen.add(v)
      if (v instanceof Map) for (const [k, x] of v) stack.push(k, x)
      else if (v instanceof Set) for (const x of v) stack.push(x)
      else
        for (const k of Object.keys(v)) {
          total += k.length
          stack.push(v[k])
        }
    }
  }
  return total
}

/** A stream's bytes, or `{ over }` (the bytes read when it passed `limit`: the rest is not read). */
async function readUpTo(stream, limit) {
  const chunks = []
  let size = 0
  const reader = stream.getReader()
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > limit) {
      // Next reads its own branch of the stream; this one stops here and keeps nothing.
      reader.cancel().catch(() => {})
      return { over: size }
    }
    chunks.push(value)
  }
  return { bytes: Buffer.concat(chunks, size) }
}

// `size`: what was counted when the entry passed `max` (a lower bound: counting stops there).
function tooLargeError(size, max) {
  return new StampedeCacheError('ERR_ENTRY_TOO_LARGE', `an entry of ${size} bytes or more is over maxEntryBytes (${max}): served from its render, not stored`)
}

// ---- Records handed back to Next ----------------------------------------------------------------
//
// What Redis holds at a key is not trusted to be what `set` stored (another writer, a corrupt or
// hostile value): a record is handed to Next only if every field has the type Next reads it as;
// anything else is a miss, so Next computes the entry again.

const isString = (v) => typeof v === 'string'
const isBytes = (v) => v instanceof Uint8Array
const isFiniteNumber = (v) => typeof v === 'number' && Number.isFinite(v)
const optional = (v, check) => v === undefined || check(v)
const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v)
const isStatus = (v) => Number.isInteger(v) && v >= 100 && v <= 999
const isStrings = (v) => Array.isArray(v) && v.every(isString)
const isHeaders = (v) => isObject(v) && Object.values(v).every((h) => h === undefined || isString(h) || isFiniteNumber(h) || isStrings(h))

// Next.js 16's CachedRouteKind values and the fields each is read with.
const INCREMENTAL_KINDS = {
  APP_PAGE: (v) =>
    isString(v.html) &&
    optional(v.rscData, isBytes) &&
    optional(v.status, isStatus) &&
    optional(v.postponed, isString) &&
    optional(v.headers, isHeaders) &&
    optional(v.segmentData, (m) => m instanceof Map && [...m].every(([k, b]) => isString(k) && isBytes(b))),
  APP_ROUTE: (v) => isBytes(v.body) && optional(v.status, isStatus) && optional(v.headers, isHeaders),
  PAGES: (v) => isString(v.html) && isObject(v.pageData) && optional(v.status, isStatus) && optional(v.headers, isHeaders),
  FETCH: (v) =>
    isObject(v.data) &&
    isString(v.data.body) &&
    isString(v.data.url) &&
    optional(v.data.status, isStatus) &&
    optional(v.data.headers, isHeaders) &&
    optional(v.revalidate, isFiniteNumber) &&
    optional(v.tags, isStrings),
  REDIRECT: (v) => isObject(v.props),
  IMAGE: (v) => isString(v.etag) && isBytes(v.buffer) && isString(v.extension) && optional(v.upstreamEtag, isString) && optional(v.revalidate, isFiniteNumber),
}

function isCacheControl(c) {
  return isObject(c) && (c.revalidate === false || (isFiniteNumber(c.revalidate) && c.revalidate >= 0)) && optional(c.expire, isFiniteNumber)
}

/** A record the incremental handler's `set` stored: { lastModified, value, cacheControl }. */
function isIncrementalRecord(r) {
  if (!isObject(r) || !isFiniteNumber(r.lastModified) || !('value' in r) || !optional(r.cacheControl, isCacheControl)) return false
  const v = r.value
  if (v === null) return true
  return isObject(v) && Object.hasOwn(INCREMENTAL_KINDS, v.kind) && INCREMENTAL_KINDS[v.kind](v)
}

// The shared machinery of both handlers: one StampedeCache, the loads waiting for this instance's
// `set`, and the `set`s in progress. Lives as long as the handler (module level: Next constructs the
// cacheHandler class on every request).
function createStore(options, kind, where) {
  if (options !== undefined && (typeof options !== 'object' || options === null || Array.isArray(options))) {
    throw invalid(`${where}: options must be an object`)
  }
  const cacheOptions = { ...options }
  const maxEntryBytes = takeMaxEntryBytes(cacheOptions, where)
  // Entries must round-trip exactly: bytes stay bytes, Buffers and Maps keep their types.
  if ('serializer' in cacheOptions) throw invalid(`${where}: serializer is chosen by the handler ('v8'); remove the option`)
  cacheOptions.serializer = 'v8'
  // Next's lifetimes are exact (fresh until `revalidate`, gone at `expire`): no jitter unless asked for.
  cacheOptions.jitter ??= 0
  // Every entry here lives a year at most, so a revalidateTag's or revalidatePath's record in Redis
  // need not outlive it by more: tag keys expire a year after their last revalidation.
  cacheOptions.tagTtl ??= ONE_YEAR_MS
  // Nothing reaches Redis during `next build`: what it prerenders stays in this process, so a new
  // deployment never overwrites entries that running instances have revalidated since.
  if (process.env.NEXT_PHASE === PHASE_PRODUCTION_BUILD) delete cacheOptions.redis
  const cache = new StampedeCache(cacheOptions)
  const lockTtl = cacheOptions.lockTtl ?? DEFAULT_LOCK_TTL
  const redis = cacheOptions.redis
  const commandTimeout = (typeof redis === 'object' && redis !== null && redis.commandTimeout) || DEFAULT_COMMAND_TIMEOUT
  // A write that Redis does not take within this bound no longer holds up Next (it is applied in
  // process; StampedeCache retries it or reports it to onError).
  const writeBound = 2 * commandTimeout + 500
  const onError = typeof cacheOptions.onError === 'function' ? cacheOptions.onError : () => {}
  const userWaitUntil = typeof cacheOptions.waitUntil === 'function' ? cacheOptions.waitUntil : undefined

  /** What the handler turned away: entries over maxEntryBytes, stored records that were not valid. */
  const counts = { oversizedEntries: 0, invalidRecords: 0 }

  // An entry over maxEntryBytes: counted and reported; the caller stores nothing.
  function tooLarge(key, size) {
    counts.oversizedEntries++
    onError(tooLargeError(size, maxEntryBytes), { op: 'next:set', key: key.join(':') })
  }

  // `record` as it may be stored: undefined when it is over maxEntryBytes.
  function capped(key, record) {
    if (record === undefined || maxEntryBytes === Infinity) return record
    const size = sizeUpTo(record, maxEntryBytes)
    if (size <= maxEntryBytes) return record
    tooLarge(key, size)
    return undefined
  }

  /** A "use cache" entry's bytes, or undefined when they pass maxEntryBytes (counted, reported). */
  async function readEntry(key, stream) {
    const read = await readUpTo(stream, maxEntryBytes)
    if (read.over === undefined) return read.bytes
    tooLarge(key, read.over)
    return undefined
  }

  // A stored record `valid` refused: counted; the caller answers a miss.
  function refused(record, valid) {
    if (record === undefined || record === null || valid(record)) return false
    counts.invalidRecords++
    return true
  }

  /** key -> { ctx, resolve, reject, softTags, written } of the load this instance leads. */
  const leading = new Map()
  /** key -> promise of a `set` in progress in this instance. */
  const setting = new Map()

  function keyOf(nextKey) {
    if (typeof nextKey !== 'string' || nextKey.length === 0) return null
    if (Buffer.byteLength(nextKey) <= MAX_PLAIN_KEY_BYTES) return [kind, nextKey]
    return [kind, 'sha256', createHash('sha256').update(nextKey).digest('hex')]
  }

  function bounded(promise, op, key) {
    let timer
    const late = new Promise((resolve) => {
      timer = setTimeout(resolve, writeBound)
      timer.unref()
    })
    const done = promise.then(
      () => {},
      (err) => onError(err, { op, key: key?.join(':') }),
    )
    return Promise.race([done, late]).finally(() => clearTimeout(timer))
  }

  // What is stored for `key`: `{ record, regenerate }`, or undefined (a miss this instance must
  // compute). Waits for a `set` of the key in progress here, and for the load of any instance
  // computing it. A stale record (past its `revalidate`, or its tag revalidated with a profile) is
  // served at once, and `regenerate` is true in the one `get` across instances whose refresh won
  // the key: its Next regenerates the entry in the background and calls `set`, which is that
  // refresh's result. Every other `get` serves the record while it runs.
  async function lookup(key, softTags) {
    const inProgress = setting.get(key.join('\0'))
    if (inProgress) await inProgress
    return new Promise((resolve) => {
      let leads = false
      // The background refresh this `get` started (StampedeCache hands it to waitUntil at once),
      // and whether this instance won it (its loader runs: the Redis lock was free).
      let refresh = null
      let won
      const winning = new Promise((r) => (won = r))
      const id = key.join('\0')
      const load = cache.getOrLoad(
        key,
        (ctx) =>
          new Promise((resolveLoad, rejectLoad) => {
            const refreshing = ctx.stale !== undefined
            if (!refreshing) leads = true
            // `load` settles once a cold result is in Redis (or Redis could not take it); a
            // refresh's result is written by the refresh itself, which `refresh` follows.
            const lead = { ctx, resolve: resolveLoad, reject: rejectLoad, softTags, written: () => (refreshing ? refresh : load) }
            leading.set(id, lead)
            // Timed out (no `set` within lockTtl) or the cache closed: the load is over.
            ctx.signal.addEventListener(
              'abort',
              () => {
                if (leading.get(id) === lead) leading.delete(id)
                rejectLoad(ctx.signal.reason)
              },
              { once: true },
            )
            if (refreshing) won()
            else resolve(undefined) // this instance's Next computes the entry and calls `set`
          }),
        // StampedeCache keeps an entry fresh until its `revalidate`, stale until it must go.
        {
          loadTimeout: lockTtl,
          beta: 0,
          jitter: 0,
          waitUntil: (p) => {
            refresh = p
            if (userWaitUntil !== undefined) userWaitUntil(p)
          },
        },
      )
      load.then(
        async (record) => {
          if (leads) return
          if (record === null || record === undefined) return resolve(undefined)
          // This get started a refresh: it regenerates if its refresh wins the key (the loader
          // runs), else another instance does (the refresh ends without calling it).
          const regenerate = refresh !== null && (await Promise.race([winning.then(() => true), refresh.then(() => false)]))
          resolve({ record, regenerate })
        },
        // The computing instance gave up (no `set` within lockTtl) or failed: compute here.
        () => {
          if (!leads) resolve(undefined)
        },
      )
    })
  }

  // Stores `record` for `key`, fresh for `ttl` ms and kept (stale) until `hardTtl` ms, with `tags`;
  // `record === undefined`: nothing to store (the load this instance leads, if any, frees the key).
  // Resolves within writeBound.
  async function store(key, entry, ttl, hardTtl, tags) {
    const record = capped(key, entry)
    const id = key.join('\0')
    const lead = leading.get(id)
    if (lead) leading.delete(id)
    const allTags = [...new Set([...tags, ...(lead?.softTags ?? [])].filter((t) => typeof t === 'string' && t.length > 0))]
    const storable = record !== undefined && Number.isFinite(ttl) && ttl >= 1 && hardTtl >= ttl && allTags.every((t) => Buffer.byteLength(t) <= MAX_TAG_BYTES)
    if (lead) {
      if (storable) {
        lead.ctx.setTtl(ttl, hardTtl)
        if (allTags.length > 0) lead.ctx.setTags(allTags)
      } else {
        lead.ctx.skipCache()
      }
      lead.resolve(storable ? record : null)
      await bounded(lead.written(), 'next:set', key)
      return
    }
    if (!storable) return
    await bounded(cache.set(key, record, { ttl, hardTtl, tags: allTags }), 'next:set', key)
  }

  // A `set` that failed before it had a record: frees the key this instance leads.
  function abandon(key, err) {
    const id = key.join('\0')
    const lead = leading.get(id)
    if (lead) {
      leading.delete(id)
      lead.reject(err)
    }
  }

  // Marks a `set` in progress, so a `get` of the key here waits for it (Next requires it).
  function trackSet(key, work) {
    const id = key.join('\0')
    const p = work().catch((err) => {
      abandon(key, err)
      onError(err, { op: 'next:set', key: key.join(':') })
    })
    setting.set(id, p)
    return p.finally(() => {
      if (setting.get(id) === p) setting.delete(id)
    })
  }

  // revalidateTag, updateTag, revalidatePath: Next 16's meanings. With a profile's durations
  // (`revalidateTag(tag, 'max')`, `revalidateTag(tag, { expire })`), the entries carrying a tag turn
  // stale: each is served stale once while one instance regenerates it, for the profile's `expire`
  // window ('max': until each entry's own expiry); past it, those not regenerated are gone.
  // Without durations (updateTag, the profile-less revalidateTag, revalidatePath) or with
  // `expire: 0`, they expire at once: the next read computes them. Any number of tags, applied
  // whole (one step in Redis).
  async function invalidate(tags, durations) {
    const list = [
      ...new Set((Array.isArray(tags) ? tags : [tags]).filter((t) => typeof t === 'string' && t.length > 0 && Buffer.byteLength(t) <= MAX_TAG_BYTES)),
    ]
    if (list.length === 0) return
    const soft = typeof durations === 'object' && durations !== null && !(durations.expire === 0)
    if (!soft) return bounded(cache.deleteByTag(list), 'next:revalidateTag')
    // The profile's `expire` (seconds) ends the window in which they are served stale; none
    // given, or past the year every entry here lives at most: each entry's own expiry.
    const window = typeof durations.expire === 'number' && durations.expire >= 0 ? durations.expire * 1000 : Infinity
    const options = window < ONE_YEAR_MS ? { hardTtl: window } : undefined
    await bounded(cache.expireByTag(list, options), 'next:revalidateTag')
  }

  return { cache, keyOf, lookup, store, trackSet, invalidate, readEntry, refused, stats: () => ({ ...cache.stats(), ...counts }) }
}

function streamOf(bytes) {
  return new ReadableStream({
    start(controller) {
      if (bytes.byteLength > 0) controller.enqueue(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength))
      controller.close()
    },
  })
}

function isUseCacheRecord(r) {
  return (
    isObject(r) &&
    isBytes(r.value) &&
    isStrings(r.tags) &&
    ['stale', 'timestamp', 'expire', 'revalidate'].every((field) => isFiniteNumber(r[field]) && r[field] >= 0)
  )
}

/**
 * The "use cache" handler (next.config `cacheHandlers`), shared by every instance through Redis.
 * @param {import('./index').StampedeCacheOptions} [options]
 */
function createUseCacheHandler(options) {
  const store = createStore(options, 'next:use-cache', 'createUseCacheHandler')
  return {
    async get(cacheKey, softTags) {
      const key = store.keyOf(cacheKey)
      if (key === null) return undefined
      const found = await store.lookup(key, Array.isArray(softTags) ? softTags : [])
      const record = found?.record
      // Anything but what `set` stored (another writer's value at the key) is a miss.
      if (store.refused(record, isUseCacheRecord) || !isUseCacheRecord(record)) return undefined
      const now = Date.now()
      // Past `expire` is a miss; StampedeCache's hardTtl already ends there, this only guards
      // against clocks that disagree.
      const expiresAt = record.timestamp + record.expire * 1000
      if (now > expiresAt) return undefined
      const entry = {
        value: streamOf(record.value),
        tags: record.tags,
        stale: record.stale,
        timestamp: record.timestamp,
        expire: record.expire,
        revalidate: record.revalidate,
      }
      // Stale and this instance regenerates it: `revalidate: -1` is Next's "serve it, and
      // regenerate it in the background" (as its own handler answers for a stale tag).
      if (found.regenerate) return { ...entry, revalidate: -1 }
      // Past `revalidate` while another instance regenerates it: served as it is, dated now so
      // that this instance's Next does not regenerate it too (its expiry unchanged).
      if (now > record.timestamp + record.revalidate * 1000) {
        return { ...entry, timestamp: now, expire: Math.max(record.revalidate, Math.floor((expiresAt - now) / 1000)) }
      }
      return entry
    },

    set(cacheKey, pendingEntry) {
      const key = store.keyOf(cacheKey)
      if (key === null) return Promise.resolve()
      return store.trackSet(key, async () => {
        const entry = await pendingEntry
        // The stream may error: nothing partial is kept, and the key is freed (abandon()). Past
        // maxEntryBytes it is not read further, and nothing is stored.
        const value = await store.readEntry(key, entry.value)
        const tags = Array.isArray(entry.tags) ? entry.tags : []
        // An `expire: 0` or `revalidate: 0` entry is dynamic: Next regenerates it on every read.
        // Fresh until `revalidate`, then served stale (one instance regenerates it) until `expire`.
        const fresh = Math.min(entry.revalidate, entry.expire) * 1000
        const now = Date.now()
        // At most a year, as ISR entries: every entry of these handlers lives a year at the most.
        const ttl = Math.min(Math.floor(entry.timestamp + fresh - now), ONE_YEAR_MS)
        const hardTtl = Math.min(Math.floor(entry.timestamp + entry.expire * 1000 - now), ONE_YEAR_MS)
        const record =
          fresh > 0 && value !== undefined
            ? { value, tags, stale: entry.stale, timestamp: entry.timestamp, expire: entry.expire, revalidate: entry.revalidate }
            : undefined
        await store.store(key, record, ttl, Math.max(ttl, hardTtl), tags)
      })
    },

    // Tags reach every instance through StampedeCache's bus; there is no local manifest to refresh.
    async refreshTags() {},

    // Infinity: Next passes the soft (implicit) tags to `get`. Each entry carries its own tags and
    // the soft tags of the request that computed it, and a revalidation reaches every entry carrying
    // one of its tags (StampedeCache's deleteByTag or expireByTag: one clock per tag, nothing per
    // entry).
    async getExpiration() {
      return Infinity
    },

    // revalidateTag (each form), updateTag and revalidatePath, within the bus bound everywhere:
    // with durations (a profile) every entry carrying one of the tags is served stale once while
    // one instance regenerates it; without, or with `expire: 0`, it is gone and the next read
    // computes it, once across instances.
    async updateTags(tags, durations) {
      await store.invalidate(tags, durations)
    },

    /** The StampedeCache under this handler (stats, close). */
    cache: store.cache,

    /** The cache's stats(), and what the handler turned away: oversizedEntries, invalidRecords. */
    stats: store.stats,
  }
}

function tagsOfIncremental(data, ctx) {
  if (data && (data.kind === 'APP_PAGE' || data.kind === 'APP_ROUTE' || data.kind === 'PAGES')) {
    const header = data.headers?.[NEXT_CACHE_TAGS_HEADER]
    return typeof header === 'string' ? header.split(',') : []
  }
  return Array.isArray(ctx?.tags) ? ctx.tags : []
}

/**
 * The incremental cache handler (next.config `cacheHandler`): ISR pages, fetch and unstable_cache,
 * shared by every instance through Redis. Returns the class Next constructs (on every request: its
 * state lives here, once per call of this function).
 * @param {import('./index').StampedeCacheOptions} [options]
 */
function createIncrementalCacheHandler(options) {
  const store = createStore(options, 'next:incremental', 'createIncrementalCacheHandler')

  return class StampedeIncrementalCacheHandler {
    static cache = store.cache

    /** The cache's stats(), and what the handler turned away: oversizedEntries, invalidRecords. */
    static stats() {
      return store.stats()
    }

    constructor(context) {
      this.context = context
    }

    async get(cacheKey, ctx) {
      const key = store.keyOf(cacheKey)
      if (key === null) return null
      const softTags = [...(Array.isArray(ctx?.tags) ? ctx.tags : []), ...(Array.isArray(ctx?.softTags) ? ctx.softTags : [])]
      const found = await store.lookup(key, softTags)
      const record = found?.record
      if (store.refused(record, isIncrementalRecord) || !isIncrementalRecord(record)) return null
      // Its tag was revalidated with a profile and this instance regenerates it: dated long ago,
      // so Next serves it stale and regenerates it in the background (1: Next reads 0 as "now").
      // Every other instance serves it as it is meanwhile.
      const lastModified = found.regenerate ? 1 : record.lastModified
      return { lastModified, value: record.value, cacheControl: record.cacheControl }
    }

    set(cacheKey, data, ctx) {
      const key = store.keyOf(cacheKey)
      if (key === null) return Promise.resolve()
      return store.trackSet(key, async () => {
        const cacheControl = ctx?.fetchCache ? undefined : ctx?.cacheControl
        const expire = typeof cacheControl?.expire === 'number' ? cacheControl.expire * 1000 : ONE_YEAR_MS
        const record = { lastModified: Date.now(), value: data ?? null, cacheControl }
        // Next judges its `revalidate` itself (from lastModified): fresh here until it must go.
        const ttl = Math.min(expire, ONE_YEAR_MS)
        await store.store(key, record, ttl, ttl, tagsOfIncremental(data, ctx))
      })
    }

    // revalidateTag(tags, durations?) as Next 16 calls it: see `invalidate`.
    async revalidateTag(tags, durations) {
      await store.invalidate(tags, durations)
    }

    resetRequestCache() {}
  }
}

module.exports = { createUseCacheHandler, createIncrementalCacheHandler }
