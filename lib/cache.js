'use strict'
// The JS facade over the Rust engine (native.js loads the addon built from src/): the class
// users see, its public methods and the hot paths.
//
// The engine decides (fresh, stale, lead, join, refresh, backoff) and keeps every entry's
// envelope in LRU order; it hands out a dense slot number per entry, and the cache keeps the
// value itself at that slot (lib/core.js). A fresh hit the engine has proved before is answered
// from the index of fresh entries (lib/fresh.js) with no native call at all; any other hit is
// one synchronous native call that returns an integer, then an array read: no thread hop, no
// copy, no deserialization, no new object. What only JS can do (call loaders, await promises,
// hand refreshes to `waitUntil`, honour AbortSignals, run the serializer once per write or
// Redis read) is the flight drivers': lib/flight.js for one key, lib/many.js for a batch.

const native = require('../binding.js')
const { engine, deleteTags, expireTags, expireEntry, clearEntries } = require('./engine.js')
const { StampedeCacheError, invalidArgument, invalidOption, notAnOptionsObject, closedError, redisError } = require('./errors.js')
const { hitChannel, missChannel } = require('./channels.js')
const { withWaitUntil } = require('./scope.js')
const { UNREADABLE, codecOf, toStored } = require('./codec.js')
const { checkTags, tagsOption } = require('./keys.js')
const { checkBatchKeys, keyLengths } = require('./batch.js')
const { CacheState, hitState } = require('./core.js')
const { NO_OPTIONS, getOrLoadSlow, startRefresh } = require('./flight.js')
const { startGetOrLoadMany } = require('./many.js')

const { peek, peekGet, stats, closeEngine, debugCounts, engineId } = native
const { redisFetch, redisWrite, lastRedisFailure, redisFetchMany, adoptMany } = native
const { BATCH_STATE_SHIFT } = native

// The codes the engine answers with, read once, here, from the binding (src/node/codes.rs says
// what each means). A hit is one integer: the slot is `n >> HIT_SLOT_SHIFT`, the kind
// `(n >> HIT_KIND_SHIFT) & HIT_KIND_MASK` (its state for the hit channel is HIT_STATES[kind],
// see hitState), and `n & HIT_REFRESH` asks for a background refresh.
const { HIT_SLOT_SHIFT, HIT_REFRESH, HIT_STATES, WRITTEN_NOWHERE } = native
// A hit with none of these bits is fresh (kind 0) and asks for no refresh: one the engine may
// have offered to the index of fresh entries.
const HIT_FLAGS = (1 << HIT_SLOT_SHIFT) - 1
const { GATE_FOUND, UNAVAILABLE, QUEUED, FMT_JSON } = native

class StampedeCache {
  /** The cache's state, shared with the flight drivers (lib/core.js). */
  #c
  /** Engine id in this thread's engine table (the state's, held here for the hot paths). */
  #id
  /** Keeps the engine alive exactly as long as this object. */
  #token
  /** Values by slot (the state's array, never replaced, held here for the hot paths). */
  #values
  /** The index of fresh entries, or null (the state's, held here for the hot paths). */
  #fresh
  /** getMany's scratch array of fresh slots, one per key (see getMany). */
  #slotScratch = new Int32Array(0)

  constructor(options) {
    if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
      throw new StampedeCacheError('ERR_INVALID_OPTION', 'options must be an object')
    }
    const waitUntil = options?.waitUntil
    if (waitUntil !== undefined && typeof waitUntil !== 'function') throw invalidOption('waitUntil', 'must be a function')
    const onError = options?.onError
    if (onError !== undefined && typeof onError !== 'function') throw invalidOption('onError', 'must be a function')
    const codec = codecOf(options?.serializer)
    // The engine knows the serializer by name only (envelopes of another serializer are misses);
    // its functions stay here.
    this.#token = engine.create(options?.serializer === undefined ? options : { ...options, serializer: codec.kind })
    this.#id = engineId(this.#token)
    // The engine validated the options above (namespace, l1).
    this.#c = new CacheState(this, this.#id, options, codec)
    this.#values = this.#c.values
    this.#fresh = this.#c.fresh
  }

  getOrLoad(key, loader, options) {
    if (typeof loader !== 'function') {
      return Promise.reject(invalidArgument(`the loader must be a function, got ${loader === null ? 'null' : typeof loader}`))
    }
    if (options === undefined && typeof key === 'string') {
      const fresh = this.#fresh
      if (fresh !== null) {
        // The hottest path: an entry the engine proved fresh, no native call.
        const slot = fresh.find(key)
        if (slot >= 0) {
          fresh.served(slot)
          if (hitChannel.hasSubscribers) this.#c.publishHit(key, 'memory', 'fresh')
          return Promise.resolve(this.#values[slot])
        }
      }
      // The hot path: a hit (see HIT_SLOT_SHIFT), or a negative number for a miss.
      const epoch = fresh === null ? 0 : fresh.epoch()
      const r = peek(this.#id, key)
      if (r >= 0) {
        const value = this.#values[r >> HIT_SLOT_SHIFT]
        if (fresh !== null && (r & HIT_FLAGS) === 0) fresh.offer(key, r >> HIT_SLOT_SHIFT, epoch)
        if (hitChannel.hasSubscribers) this.#c.publishHit(key, 'memory', hitState(r))
        if (r & HIT_REFRESH) startRefresh(this.#c, key, loader, NO_OPTIONS, value, -1)
        return Promise.resolve(value)
      }
    }
    return getOrLoadSlow(this.#c, key, loader, options)
  }

  /**
   * Many keys at once (README, "Many keys at once"): every key answered as getOrLoad would answer
   * it alone, and the keys this call must load, each once, in one `loadMany(keys, ctx)` call
   * (DataLoader's convention: an array of the same length; an Error at a position fails that key).
   */
  getOrLoadMany(keys, loadMany, options) {
    try {
      return startGetOrLoadMany(this.#c, keys, loadMany, options)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  /** Many keys at once, as `get` reads one: fresh or stale values (undefined where none); never loads. */
  async getMany(keys) {
    if (this.#c.closed) throw closedError()
    checkBatchKeys(keys)
    const n = keys.length
    const out = new Array(n)
    // Entries the engine proved fresh first, without a native call: `slots[i]` is key i's, or
    // -1, and the hits are counted once every other key is checked (a bad key fails the call
    // before anything is counted). `slots` is this cache's scratch array (no allocation per
    // call) unless a hit subscriber listens, which may call getMany itself before it is read.
    const fresh = this.#fresh
    const held = this.#values
    const now = Date.now()
    const publish = hitChannel.hasSubscribers
    let slots = this.#slotScratch
    if (publish || slots.length < n) {
      slots = new Int32Array(n)
      if (!publish) this.#slotScratch = slots
    }
    let rest = null
    if (fresh !== null) rest = fresh.findMany(keys, now, slots, out, held)
    else if (n > 0) {
      out.fill(undefined)
      rest = Array.from({ length: n }, (_, i) => i)
    }
    const encoded = rest === null ? null : rest.map((i) => engine.encodeKey(keys[i]))
    if (fresh !== null && (rest === null || rest.length < n)) {
      if (!publish) fresh.servedMany(slots, n)
      else {
        for (let i = 0; i < n; i++) {
          const slot = slots[i]
          if (slot < 0) continue
          fresh.served(slot)
          this.#c.publishHit(keys[i], 'memory', 'fresh')
        }
      }
    }
    if (rest === null) return out
    this.#c.watchInvalidations()
    // Positions of the keys the in-process tier does not have, by key (each asked of Redis once).
    let missed = new Map()
    if (fresh === null) {
      // No index of fresh entries (l1 off): the tier is asked for every key in one call.
      const positions = new Map()
      for (let j = 0; j < rest.length; j++) {
        const at = positions.get(encoded[j])
        if (at !== undefined) at.push(rest[j])
        else positions.set(encoded[j], [rest[j]])
      }
      if (this.#c.keepsNone) {
        // It keeps nothing: every key is Redis's.
        if (missChannel.hasSubscribers) {
          for (const k of positions.keys()) missChannel.publish({ cache: this, namespace: this.#c.namespace, key: k })
        }
        missed = positions
      } else {
        const asked = [...positions.keys()]
        const hits = engine.getEntries(this.#id, asked.join(''), keyLengths(asked))
        for (let u = 0; u < asked.length; u++) {
          const k = asked[u]
          const hit = hits[u]
          if (hit >= 0) {
            if (hitChannel.hasSubscribers) this.#c.publishHit(k, 'memory', hitState(hit))
            const value = this.#values[hit >> HIT_SLOT_SHIFT]
            for (const i of positions.get(k)) out[i] = value
            continue
          }
          if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#c.namespace, key: k })
          missed.set(k, positions.get(k))
        }
      }
    }
    for (let j = 0; fresh !== null && j < rest.length; j++) {
      const i = rest[j]
      const k = encoded[j]
      const positions = missed.get(k)
      if (positions !== undefined) {
        positions.push(i)
        continue
      }
      // get's hot path first (it offers a fresh hit to the index); its misses are the engine's
      // to count (getEntry).
      const epoch = fresh === null ? 0 : fresh.epoch()
      const peeked = peekGet(this.#id, k)
      if (peeked >= 0 && fresh !== null && (peeked & HIT_FLAGS) === 0) fresh.offer(k, peeked >> HIT_SLOT_SHIFT, epoch)
      const hit = peeked >= 0 ? peeked : engine.getEntry(this.#id, k)
      if (hit >= 0) {
        if (hitChannel.hasSubscribers) this.#c.publishHit(k, 'memory', hitState(hit))
        out[i] = this.#values[hit >> HIT_SLOT_SHIFT]
        continue
      }
      if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#c.namespace, key: k })
      missed.set(k, [i])
    }
    this.#c.publishInvalidations()
    if (missed.size === 0 || !this.#c.redis) return out
    const asked = [...missed.keys()]
    const [codes, texts, , others, found, reported] = await redisFetchMany(this.#id, asked.join(''), keyLengths(asked), true)
    if (reported) this.#c.drainRedisReports()
    // The keys Redis had, adopted in one call (a value this serializer cannot read: a miss).
    const values = this.#c.batchValues(codes, texts, found)
    const flights = new Float64Array(asked.length)
    for (let u = 0; u < asked.length; u++) flights[u] = codes[u] >= 0 && values[u] !== UNREADABLE ? -1 : -2
    this.#c.fillMany(adoptMany(this.#id, found, flights, false, -1), values)
    for (let u = 0; u < asked.length; u++) {
      const code = codes[u]
      let value
      let state
      if (code >= 0) {
        if (flights[u] < -1) continue
        value = values[u]
        state = HIT_STATES[(code >> BATCH_STATE_SHIFT) & 3]
      } else {
        // A value an announcement carried, or no value.
        const answer = others[-1 - code]
        if (answer.kind !== GATE_FOUND) continue
        value = this.#c.decode(answer)
        if (value === UNREADABLE) continue
        this.#c.adoptDecoded(asked[u], -1, false, answer, value)
        state = answer.state
      }
      if (hitChannel.hasSubscribers) this.#c.publishHit(asked[u], 'redis', state)
      for (const i of missed.get(asked[u])) out[i] = value
    }
    this.#c.publishInvalidations()
    return out
  }

  get(key) {
    if (typeof key === 'string') {
      const fresh = this.#fresh
      if (fresh !== null) {
        // As getOrLoad's: an entry the engine proved fresh, no native call.
        const slot = fresh.find(key)
        if (slot >= 0) {
          fresh.served(slot)
          if (hitChannel.hasSubscribers) this.#c.publishHit(key, 'memory', 'fresh')
          return Promise.resolve(this.#values[slot])
        }
      }
      // The hot path, as getOrLoad's: a hit (see HIT_SLOT_SHIFT; never a refresh request), or a
      // negative number. A miss, a closed cache or a bad key is the slow path's to answer. A
      // tier that keeps nothing has nothing to look up: every read is Redis's (a native call
      // saved is 5-10% of a sequential read's time under Bun).
      if (!this.#c.keepsNone) {
        const epoch = fresh === null ? 0 : fresh.epoch()
        const r = peekGet(this.#id, key)
        if (r >= 0) {
          const value = this.#values[r >> HIT_SLOT_SHIFT]
          if (fresh !== null && (r & HIT_FLAGS) === 0) fresh.offer(key, r >> HIT_SLOT_SHIFT, epoch)
          if (hitChannel.hasSubscribers) this.#c.publishHit(key, 'memory', hitState(r))
          return Promise.resolve(value)
        }
      }
    }
    return this.#getSlow(key)
  }

  async #getSlow(key) {
    if (this.#c.closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#c.watchInvalidations()
    // Without Redis, the engine's lookup counts the miss.
    if (!this.#c.keepsNone || !this.#c.redis) {
      const hit = engine.getEntry(this.#id, k)
      this.#c.publishInvalidations()
      if (hit >= 0) {
        if (hitChannel.hasSubscribers) this.#c.publishHit(k, 'memory', hitState(hit))
        return this.#values[hit >> HIT_SLOT_SHIFT]
      }
    }
    if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#c.namespace, key: k })
    if (!this.#c.redis) return undefined
    const asked = redisFetch(this.#id, k, true)
    const answer = asked instanceof Promise ? await asked : asked
    if (answer.reported) this.#c.drainRedisReports()
    // Closed while Redis was asked: the read was cut short, which says nothing of the key.
    if (answer.kind !== GATE_FOUND && this.#c.closed) throw closedError()
    if (answer.kind !== GATE_FOUND) return undefined
    const value = this.#c.decode(answer)
    if (value === UNREADABLE) return undefined
    // `l1: false`: the engine would keep it nowhere (adoptRead answers so at once).
    if (this.#c.l1Off) this.#c.publishInvalidations()
    else this.#c.adoptDecoded(k, -1, false, answer, value)
    if (hitChannel.hasSubscribers) this.#c.publishHit(k, 'redis', answer.state)
    return value
  }

  async set(key, value, options) {
    if (this.#c.closed) throw closedError()
    const k = engine.encodeKey(key)
    let policy = null
    let tags = null
    if (options !== undefined) {
      if (options === null || typeof options !== 'object') throw notAnOptionsObject('set', options)
      policy = engine.resolvePolicy(this.#id, options, true)
      if (options.tags !== undefined) tags = tagsOption(options.tags)
    }
    const { text, stored, size, fmt } = toStored(this.#c.codec, value)
    this.#c.watchInvalidations()
    const slot = this.#c.fill(engine.setEntry(this.#id, k, stored === null || stored === undefined, policy, tags, size), stored)
    // Sent before any subscriber runs (one may write the key too): Redis gets the writes in call
    // order. A zero TTL caches nothing: an older copy in Redis must not come back either.
    const sent = this.#c.redis ? redisWrite(this.#id, k, text, slot === WRITTEN_NOWHERE, fmt) : null
    this.#c.publishInvalidations()
    this.#c.publishInvalidation(k, 'local')
    if (sent === null) return
    const outcome = await sent
    this.#c.drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError('set', lastRedisFailure(this.#id), outcome === QUEUED)
  }

  async delete(key) {
    if (this.#c.closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#c.watchInvalidations()
    const [slot, removed] = engine.deleteEntry(this.#id, k)
    this.#c.fill(slot, undefined)
    // Sent before any subscriber runs, as for set.
    const sent = this.#c.redis ? redisWrite(this.#id, k, undefined, true, FMT_JSON) : null
    this.#c.publishInvalidations()
    this.#c.publishInvalidation(k, 'local')
    if (sent === null) return removed === 1
    const removedRemote = await sent
    this.#c.drainRedisReports()
    if (removedRemote === UNAVAILABLE || removedRemote === QUEUED) throw redisError('delete', lastRedisFailure(this.#id), removedRemote === QUEUED)
    return removed === 1 || removedRemote === 1
  }

  /**
   * Soft invalidation: the entry keeps its value but is stale from now on, in this process at once
   * and, with Redis, in every instance sharing it. The next read anywhere is served the old value
   * and starts one refresh for the whole fleet; a load that began before never writes its result.
   * Resolves true when there was an entry.
   */
  async expire(key) {
    if (this.#c.closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#c.watchInvalidations()
    const sent = expireEntry(this.#id, k)
    this.#c.publishInvalidations()
    this.#c.publishInvalidation(k, 'local')
    const outcome = await sent
    this.#c.drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError('expire', lastRedisFailure(this.#id), outcome === QUEUED)
    return outcome !== 0
  }

  async inspect(key) {
    if (this.#c.closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#c.watchInvalidations()
    const local = engine.inspectEntry(this.#id, k)
    this.#c.publishInvalidations()
    if (local || !this.#c.redis) return local ?? undefined
    const answer = await redisFetch(this.#id, k, false)
    if (answer.reported) this.#c.drainRedisReports()
    if (answer.kind !== GATE_FOUND && this.#c.closed) throw closedError()
    if (answer.kind !== GATE_FOUND) return undefined
    return {
      state: answer.state,
      freshUntil: answer.freshUntil,
      hardUntil: answer.hardUntil,
      computeMs: answer.computeMs,
    }
  }

  /**
   * Removes every entry carrying one of `tags`, in this process at once and, with Redis, in every
   * instance sharing it; a load that began before never writes its result back. Costs one Redis
   * key per tag, however many entries carry it.
   */
  deleteByTag(tags) {
    return this.#markTags(tags, 'deleteByTag', deleteTags)
  }

  /**
   * expire() for every entry carrying one of `tags`, in this process at once and, with Redis, in
   * every instance sharing it: each is served stale once while one refresh runs. Costs one Redis
   * key per tag, however many entries carry it. `options.hardTtl` (ms from now): past it, those
   * not refreshed meanwhile are gone (default: each stays until its own hardTtl).
   */
  expireByTag(tags, options) {
    return this.#markTags(tags, 'expireByTag', expireTags, options)
  }

  // deleteByTag or expireByTag (`op`), through the engine's `mark`. Any number of tags: applied
  // whole (see tags.rs), never partly. expireByTag's `options.hardTtl`: ms from now the entries
  // it makes stale are served at most (then, unless refreshed, they are gone).
  async #markTags(tags, op, mark, options) {
    if (this.#c.closed) throw closedError()
    const list = checkTags(typeof tags === 'string' ? [tags] : tags, (why) => {
      throw invalidArgument(`${op} takes a tag or an array of tags: tags ${why}`)
    })
    let within
    if (options !== undefined) {
      if (options === null || typeof options !== 'object') throw invalidArgument(`${op}: options must be an object`)
      within = options.hardTtl
      if (within !== undefined && (typeof within !== 'number' || Number.isNaN(within) || within < 0)) {
        throw invalidArgument(`${op}: hardTtl must be a number of ms >= 0, got ${String(within)}`)
      }
      if (within === Number.POSITIVE_INFINITY) within = undefined
    }
    if (list.length === 0) return
    this.#c.watchInvalidations()
    const sent = within === undefined ? mark(this.#id, list) : mark(this.#id, list, within)
    this.#c.publishInvalidations()
    this.#c.publishInvalidation(undefined, 'local', list)
    const outcome = await sent
    this.#c.drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError(op, lastRedisFailure(this.#id), outcome === QUEUED)
  }

  /**
   * Removes every entry of this namespace, in this process at once and, with Redis, in every
   * instance sharing it (no KEYS: the namespace's value keys are swept with SCAN, one batch at a
   * time); a load that began before never writes its result back. Other namespaces are untouched.
   */
  async clear() {
    if (this.#c.closed) throw closedError()
    this.#c.watchInvalidations()
    const sent = clearEntries(this.#id)
    // The engine dropped every entry; their values go too (the array is the state's: emptied).
    this.#values.length = 0
    this.#c.publishInvalidations()
    this.#c.publishInvalidation(undefined, 'local')
    const outcome = await sent
    this.#c.drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError('clear', lastRedisFailure(this.#id), outcome === QUEUED)
  }

  stats() {
    const s = stats(this.#id)
    // The fresh hits answered without the engine.
    if (this.#fresh !== null) s.hits += this.#fresh.hits
    return s
  }

  /** The namespace this cache was built with (its Redis key prefix, and the metrics' label). */
  get namespace() {
    return this.#c.namespace
  }

  /**
   * Runs `fn` with `waitUntil` as the hook for every background refresh started inside it (by
   * any cache), unless a call gives its own. For frameworks that hand out `waitUntil` per request.
   */
  withWaitUntil(waitUntil, fn) {
    return withWaitUntil(waitUntil, fn)
  }

  async settle() {
    await Promise.all([...this.#c.background])
  }

  async close() {
    if (this.#c.closed) return
    this.#c.closed = true
    closeEngine(this.#id)
    // The engine's clear voided the index already; its keys go too.
    this.#fresh?.clear()
    this.#values.length = 0
    for (const control of this.#c.loads) control.abort(closedError())
    this.#c.loads.clear()
  }

  /** For tests: loads in flight (engine and facade) and entries held. Not part of the API. */
  _debugCounts() {
    const [engineFlights, entries, lockWaiters, unsentWrites, inboxKeys, keptInvalidations, refreshing] = debugCounts(this.#id)
    const facadeFlights = this.#c.flights.size
    return { engineFlights, facadeFlights, background: this.#c.background.size, entries, lockWaiters, unsentWrites, inboxKeys, keptInvalidations, refreshing }
  }
}

module.exports = { StampedeCache }
