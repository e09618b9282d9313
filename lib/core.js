'use strict'
// The state of one cache (lib/cache.js is its facade) and what every flight driver shares: the
// values at the engine's slots (fill, fillMany), the promises of flights in progress, what
// Redis answers decoded and adopted, the channels' messages, reports to onError and background
// work handed to waitUntil. It calls no flight driver (lib/flight.js, lib/many.js call it).

const native = require('../binding.js')
const { engine } = require('./engine.js')
const { StampedeCacheError, invalidOption, notAnOptionsObject, warnRedisOutage, isAbortSignal } = require('./errors.js')
const { hitChannel, invalidateChannel, redisErrorChannel } = require('./channels.js')
const { requestScope } = require('./scope.js')
const { storeOf } = require('./reentry.js')
const { UNREADABLE } = require('./codec.js')
const { tagsOption } = require('./keys.js')
const { FreshIndex } = require('./fresh.js')

const { takeReleased, defaultPolicy, adopt, adoptRead, redisFailed, takeRedisReports, hasRedis } = native
const { observeInvalidations, takeInvalidations, batchTexts } = native
// A batch answer's per-key codes (see `Batch` in src/node/batch.rs).
const { BATCH_VALUE, BATCH_NEGATIVE, BATCH_FMT_MASK } = native
const { HIT_KIND_SHIFT, HIT_KIND_MASK, HIT_STATES, POLICY_LOAD_TIMEOUT, POLICY_BETA } = native

// The promises of the flights in progress, by flight id. Each sits in a holder that `delete`
// empties: a V8 Map kept deleted values reachable until it next rehashed, so a promise resolved
// after its flight was deleted kept its value alive through scavenges and into the old
// generation (measured: MBs promoted per scavenge with 64 Redis reads of 10 KB in flight; none
// with holders).
class Flights {
  #m = new Map()
  get size() {
    return this.#m.size
  }
  get(id) {
    return this.#m.get(id)?.load
  }
  set(id, load) {
    this.#m.set(id, { load })
  }
  // A holder of its own (a batch's Outcome, whose promise is made when first asked for).
  hold(id, holder) {
    this.#m.set(id, holder)
  }
  delete(id) {
    const held = this.#m.get(id)
    if (held === undefined) return
    held.load = undefined
    this.#m.delete(id)
  }
}

class CacheState {
  /**
   * `cache`: the facade (the channels' messages name it); `id`: its engine's id in this
   * thread's engine table; `options`: the constructor's, checked; `codec`: its serializer.
   */
  constructor(cache, id, options, codec) {
    this.cache = cache
    this.id = id
    /** Values by slot; the engine says which slot holds which key's value. Never replaced. */
    this.values = []
    /** Promises of running loads by flight id; joiners await the leader's promise. */
    this.flights = new Flights()
    /** Background refreshes not yet ended, for settle(). */
    this.background = new Set()
    /** Per running loader, what aborts its ctx.signal (close() aborts them all). */
    this.loads = new Set()
    const defaults = defaultPolicy(id)
    /** The constructor's loadTimeout (ms; Infinity for none). */
    this.loadTimeout = defaults[POLICY_LOAD_TIMEOUT]
    /** The constructor's XFetch beta: the hot path decides hits at it. */
    this.beta = defaults[POLICY_BETA]
    this.closed = false
    /** Redis configured: loads go through the Redis tier (lock, bus, shared envelopes). */
    this.redis = hasRedis(id)
    this.waitUntil = options?.waitUntil
    this.onError = options?.onError
    /** The Redis key prefix, for the channels' messages (validated by the engine). */
    this.namespace = options?.namespace ?? 'sc'
    /** What this cache's entries are named by in a load's scope (lib/reentry.js), before their key. */
    this.store = storeOf(options)
    /** The engine keeps the invalidations it applies for us (someone listens to them). */
    this.watchingInvalidations = false
    /** The serializer, as a codec (lib/codec.js). */
    this.codec = codec
    const l1 = options?.l1
    /** l1.maxBytes is set: slots the engine frees are released here too (see fill). */
    this.bytesBounded = typeof l1 === 'object' && l1 !== null && l1.maxBytes !== undefined
    /**
     * The in-process tier keeps nothing (`l1: false`, or `maxEntries: 0`): no key is asked of it
     * (a batch of 1,000 keys spent a native call a key finding nothing there).
     */
    this.keepsNone = l1 === false || (typeof l1 === 'object' && l1 !== null && l1.maxEntries === 0)
    /** `l1: false`: the engine has no in-process tier, and adopts a read nowhere (`adoptRead`). */
    this.l1Off = l1 === false
    /**
     * Fresh hits answered without a native call (lib/fresh.js), or null: l1 off, or a runtime
     * that cannot share the engine's memory. Filled by the hot paths' native hits.
     */
    this.fresh = FreshIndex.of(id)
  }

  // Keeps `value` at `slot`, what the engine call that wrote it answered (NO_SLOT or
  // WRITTEN_NOWHERE: nothing to keep), and returns `slot`. The one place a value is stored at a
  // slot, called in the JS turn of that engine call, before any await: the engine may hand the
  // slot to another key at its next call (src/node/mod.rs, "Boundary rules"). Under l1.maxBytes,
  // first drops the values at slots the engine freed since (evicted by size, removed), so memory,
  // not just the count, stays within the budget; before writing, as `slot` may be one of them.
  fill(slot, value) {
    if (this.bytesBounded) {
      for (const freed of takeReleased(this.id)) this.values[freed] = undefined
    }
    if (slot >= 0) this.values[slot] = value
    return slot
  }

  // Keeps each value of a batch at the slot adoptMany answered for it, as fill keeps one.
  fillMany(adopted, values) {
    if (this.bytesBounded) {
      for (const freed of takeReleased(this.id)) this.values[freed] = undefined
    }
    for (let i = 0; i < adopted.length; i++) {
      const slot = adopted[i] >> 1
      if (slot >= 0) this.values[slot] = values[i]
    }
  }

  // The value of an envelope read from Redis, or UNREADABLE when this cache's serializer
  // cannot read it (never a throw: a miss, as for any value this cache did not write).
  decode(answer) {
    if (answer.json === undefined || answer.json === null) return undefined
    try {
      return answer.negative ? JSON.parse(answer.json) : this.codec.decode(answer.json, answer.fmt)
    } catch {
      return UNREADABLE
    }
  }

  // The values of a batch answer's found keys, by position (UNREADABLE where this cache's
  // serializer cannot read one; undefined at keys not found). With the JSON serializer they
  // come as one JSON array text, parsed at once; if it does not parse (a corrupt value among
  // them), each is read apart, as decode reads one.
  batchValues(codes, texts, found) {
    const n = codes.length
    const values = new Array(n)
    if (typeof texts === 'string') {
      let parsed = null
      try {
        parsed = JSON.parse(texts)
      } catch {}
      if (Array.isArray(parsed)) {
        let j = 0
        for (let i = 0; i < n; i++) {
          if (codes[i] >= 0 && codes[i] & BATCH_VALUE) values[i] = parsed[j++]
        }
        if (j === parsed.length) return values
      }
      texts = batchTexts(found, texts)
    }
    for (let i = 0; i < n; i++) {
      const code = codes[i]
      const text = texts[i]
      if (code < 0 || !(code & BATCH_VALUE) || text === null || text === undefined) {
        values[i] = undefined
        continue
      }
      try {
        values[i] = code & BATCH_NEGATIVE ? JSON.parse(text) : this.codec.decode(text, code & BATCH_FMT_MASK)
      } catch {
        values[i] = UNREADABLE
      }
    }
    return values
  }

  // Takes an envelope read from Redis into the in-process tier, with its decoded value: for a
  // flight (`flight` >= 0) the one its gate found, which the engine kept; for a read (-1), the
  // one `answer` carries. Returns whether the caller (of a cold flight: `cold`) should start a
  // refresh of the stale value. `policy`: the call's (its XFetch beta decides a cold caller's
  // early refresh), or null.
  adoptDecoded(k, flight, cold, answer, value, policy = null) {
    // One number: slot * 2 + refresh (see `adopt` in src/node/redis.rs).
    const adopted = flight >= 0 ? adopt(this.id, flight, cold, policy === null ? -1 : policy[POLICY_BETA]) : adoptRead(this.id, k, answer)
    this.fill(adopted >> 1, value)
    // After the value is in place: a subscriber may read the cache.
    this.publishInvalidations()
    return (adopted & 1) === 1
  }

  drainRedisReports() {
    for (const r of takeRedisReports(this.id)) {
      // Without onError, an outage's two ends are warned of once each; its end is no failure.
      if (r.outage !== undefined && r.outage !== null && this.onError === undefined) warnRedisOutage(r, this.namespace)
      if (r.outage === 'up') continue
      const err = new StampedeCacheError('ERR_REDIS', r.message)
      const key = r.key ?? undefined
      if (redisErrorChannel.hasSubscribers) redisErrorChannel.publish({ cache: this.cache, namespace: this.namespace, op: r.op, key, error: err })
      this.report(err, `redis:${r.op}`, key)
    }
  }

  publishHit(key, tier, state) {
    hitChannel.publish({ cache: this.cache, namespace: this.namespace, key, tier, state })
  }

  // Has the engine keep the invalidations it applies from other processes while anyone listens
  // (checked before each call that may apply them; the hot path leaves pending ones to us).
  watchInvalidations() {
    const on = invalidateChannel.hasSubscribers
    if (on !== this.watchingInvalidations) {
      this.watchingInvalidations = on
      observeInvalidations(this.id, on)
    }
  }

  // Publishes what the engine applied from other processes since the last call.
  publishInvalidations() {
    if (!this.watchingInvalidations) return
    const keys = takeInvalidations(this.id)
    for (let i = 0; i < keys.length; i++) {
      this.publishInvalidation(keys[i] ?? undefined, 'bus')
    }
  }

  // `tags`: a deleteByTag here (no key).
  publishInvalidation(key, source, tags) {
    if (!invalidateChannel.hasSubscribers) return
    const message = { cache: this.cache, namespace: this.namespace, key, source }
    if (tags !== undefined) message.tags = tags
    invalidateChannel.publish(message)
  }

  report(err, op, key) {
    if (this.onError === undefined) return
    try {
      // Called on the cache, as the constructor's option was given.
      this.onError.call(this.cache, err, { op, key })
    } catch {
      // An onError that throws must not break the refresh that reported.
    }
  }

  // The value of a live entry, for ctx.stale when forceRefresh replaces it (no stats counted).
  currentValue(k) {
    const slot = native.currentSlot(this.id, k)
    return slot >= 0 ? this.values[slot] : undefined
  }

  // Ends a Redis flight's record after a failure or skipCache: its lock released, a failed
  // refresh's retryAfter recorded. A promise while that is sent, else undefined.
  redisFailed(flight, retryAfter) {
    if (!this.redis) return undefined
    const sent = redisFailed(this.id, flight, retryAfter)
    return sent === null ? undefined : sent.then(() => this.drainRedisReports())
  }

  // A getOrLoad or getOrLoadMany call's options, checked.
  callOptions(options, method = 'getOrLoad') {
    if (options === null || typeof options !== 'object') throw notAnOptionsObject(method, options)
    const policy = engine.resolvePolicy(this.id, options, false)
    const { signal, waitUntil } = options
    const tags = options.tags === undefined ? null : tagsOption(options.tags)
    if (signal !== undefined && !isAbortSignal(signal)) throw invalidOption('signal', 'must be an AbortSignal')
    if (waitUntil !== undefined && typeof waitUntil !== 'function') throw invalidOption('waitUntil', 'must be a function')
    if (options.forceRefresh !== undefined && typeof options.forceRefresh !== 'boolean') {
      throw invalidOption('forceRefresh', 'must be a boolean')
    }
    return { policy, signal, waitUntil, force: options.forceRefresh === true, tags }
  }

  // Background work (a refresh) started now: kept for settle() and handed to waitUntil at once;
  // the per-call option first, then the request's scope, then the constructor's. `k`: the key
  // reported if the hook throws (undefined for a batch).
  keepInBackground(done, waitUntil, k) {
    this.background.add(done)
    done.then(() => this.background.delete(done))
    const hook = waitUntil ?? requestScope.getStore() ?? this.waitUntil
    if (hook !== undefined) {
      try {
        hook(done)
      } catch (err) {
        this.report(err, 'waitUntil', k)
      }
    }
  }
}

// The state of a hit (see HIT_SLOT_SHIFT in lib/cache.js), as the hit channel names it.
function hitState(n) {
  return HIT_STATES[(n >> HIT_KIND_SHIFT) & HIT_KIND_MASK]
}

module.exports = { CacheState, hitState }
