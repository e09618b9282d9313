'use strict'
// The JS facade over the Rust engine (native.js loads the addon built from src/).
//
// The engine decides (fresh, stale, lead, join, refresh, backoff) and keeps every entry's
// envelope in LRU order; it hands out a dense slot number per entry, and this facade keeps the
// value itself at that slot in `#values`. A fresh hit the engine has proved before is answered
// from the index of fresh entries (lib/fresh.js) with no native call at all; any other hit is
// one synchronous native call that returns an integer, then an array read: no thread hop, no
// copy, no deserialization, no new object. The facade also does what only JS can: call
// loaders, await promises, hand refreshes to `waitUntil`, honour AbortSignals, and run the
// serializer (once per write or Redis read).

const native = require('../binding.js')
const { engine, deleteTags, expireTags, expireEntry, clearEntries } = require('./engine.js')
const {
  StampedeCacheError,
  invalidArgument,
  invalidOption,
  notAnOptionsObject,
  closedError,
  redisError,
  warnRedisOutage,
  abortError,
  isClosedError,
  isAbortSignal,
  withSignal,
  isError,
} = require('./errors.js')
const {
  loadChannel,
  hitChannel,
  missChannel,
  coalesceChannel,
  lockChannel,
  invalidateChannel,
  loadTimeoutChannel,
  redisErrorChannel,
  loadTraced,
} = require('./channels.js')
const { requestScope, withWaitUntil } = require('./scope.js')
const { asLoadOf, asLoadOfMany, inLoad, inLoadOf, storeOf } = require('./reentry.js')
const { UNREADABLE, codecOf, toStored } = require('./codec.js')
const { checkTags, tagsOption } = require('./keys.js')
const { Batch, Outcome, ColdKey, checkBatchKeys, keyLengths, inSlices, LEADING } = require('./batch.js')
const { FreshIndex } = require('./fresh.js')

const { peek, peekAt, peekGet, beginRefresh, complete, fail, skip, takeReleased, stats, closeEngine, debugCounts, engineId, noteLoaderCall, defaultPolicy } =
  native
const { redisGate, redisFetch, adopt, adoptRead, abandon, writeBack, finishWrite, redisWrite, redisFailed, takeRedisReports, lastRedisFailure, hasRedis } =
  native
const { observeInvalidations, takeInvalidations } = native
const { redisGateMany, redisFetchMany, adoptMany, batchTexts, noteBatchCall, beginBatchRefresh, GATE_WAIT } = native
// A batch answer's per-key codes (see `Batch` in src/node/batch.rs).
const { BATCH_VALUE, BATCH_NEGATIVE, BATCH_FMT_MASK, BATCH_STATE_SHIFT } = native

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

// The codes the engine answers with and the indexes of the arrays it takes, read once, here, from
// the binding (src/node/codes.rs says what each means). A hit is one integer: the slot is
// `n >> HIT_SLOT_SHIFT`, the kind `(n >> HIT_KIND_SHIFT) & HIT_KIND_MASK` (its state for the hit
// channel is HIT_STATES[kind]), and `n & HIT_REFRESH` asks for a background refresh.
const { HIT_SLOT_SHIFT, HIT_KIND_SHIFT, HIT_KIND_MASK, HIT_REFRESH, HIT_STATES } = native
// A hit with none of these bits is fresh (kind 0) and asks for no refresh: one the engine may
// have offered to the index of fresh entries.
const HIT_FLAGS = (1 << HIT_SLOT_SHIFT) - 1
const { STEP_KINDS, STEP_SERVE, STEP_LEAD, WRITTEN_NOWHERE } = native
const { POLICY_TTL, POLICY_HARD_TTL, POLICY_NEGATIVE_TTL, POLICY_LOAD_TIMEOUT, POLICY_BETA } = native
// What a flight is for (redisGate's purpose), and the reason the channels give it.
const { PURPOSE_COLD, PURPOSE_REFRESH, PURPOSE_FORCE, PURPOSE_PAST_VALUE, REASONS } = native
// A key of a getOrLoadMany call's first read that Redis did not answer with a value (#readFirst).
const MISSED = Symbol('missed')
const { GATE_FOUND, GATE_MISSING, GATE_SKIP, GATE_CLOSED, LOCK_NONE, LOCK_OUTCOMES, DROPPED, UNAVAILABLE, QUEUED } = native
const { FMT_JSON } = native
const noop = () => {}
const identity = (x) => x
/** The ctx of each key of a nested loadMany call (#loadManyNested): nothing is cached, so nothing to set. */
const NESTED_BATCH_CTX = Object.freeze({ setTtl: noop, setTags: noop })
/** What a call without options means (see #callOptions). */
const NO_OPTIONS = Object.freeze({ policy: null, signal: undefined, waitUntil: undefined, force: false, tags: null })

class StampedeCache {
  /** Engine id in this thread's engine table. */
  #id
  /** Keeps the engine alive exactly as long as this object. */
  #token
  /** Values by slot; the engine says which slot holds which key's value. */
  #values = []
  /** Promises of running loads by flight id; joiners await the leader's promise. */
  #flights = new Flights()
  /** Background refreshes not yet ended, for settle(). */
  #background = new Set()
  /** Per running loader, what aborts its ctx.signal (close() aborts them all). */
  #loads = new Set()
  /** The constructor's loadTimeout (ms; Infinity for none). */
  #loadTimeout
  /** The constructor's XFetch beta: the hot path decides hits at it. */
  #beta
  #closed = false
  /** Redis configured: loads go through the Redis tier (lock, bus, shared envelopes). */
  #redis = false
  #waitUntil
  #onError
  /** The Redis key prefix, for the channels' messages. */
  #namespace
  /** What this cache's entries are named by in a load's scope (lib/reentry.js), before their key. */
  #store
  /** The engine keeps the invalidations it applies for us (someone listens to them). */
  #watchingInvalidations = false
  /** The serializer, as a codec (see JSON_CODEC). */
  #codec
  /** l1.maxBytes is set: slots the engine frees are released here too (see #fill). */
  #bytesBounded = false
  /**
   * Fresh hits answered without a native call (lib/fresh.js), or null: l1 off, or a runtime
   * that cannot share the engine's memory. Filled by the hot paths' native hits.
   */
  #fresh
  /** getMany's scratch array of fresh slots, one per key (see getMany). */
  #slotScratch = new Int32Array(0)
  /**
   * The in-process tier keeps nothing (`l1: false`, or `maxEntries: 0`): no key is asked of it
   * (a batch of 1,000 keys spent a native call a key finding nothing there).
   */
  #keepsNone = false

  constructor(options) {
    if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
      throw new StampedeCacheError('ERR_INVALID_OPTION', 'options must be an object')
    }
    const waitUntil = options?.waitUntil
    if (waitUntil !== undefined && typeof waitUntil !== 'function') throw invalidOption('waitUntil', 'must be a function')
    const onError = options?.onError
    if (onError !== undefined && typeof onError !== 'function') throw invalidOption('onError', 'must be a function')
    this.#codec = codecOf(options?.serializer)
    // The engine knows the serializer by name only (envelopes of another serializer are misses);
    // its functions stay here.
    this.#token = engine.create(options?.serializer === undefined ? options : { ...options, serializer: this.#codec.kind })
    const l1 = options?.l1
    this.#bytesBounded = typeof l1 === 'object' && l1 !== null && l1.maxBytes !== undefined
    this.#keepsNone = l1 === false || (typeof l1 === 'object' && l1 !== null && l1.maxEntries === 0)
    this.#id = engineId(this.#token)
    this.#redis = hasRedis(this.#id)
    this.#fresh = FreshIndex.of(this.#id)
    const defaults = defaultPolicy(this.#id)
    this.#loadTimeout = defaults[POLICY_LOAD_TIMEOUT]
    this.#beta = defaults[POLICY_BETA]
    this.#waitUntil = waitUntil
    this.#onError = onError
    // Validated by the engine above.
    this.#namespace = options?.namespace ?? 'sc'
    this.#store = storeOf(options)
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
          if (hitChannel.hasSubscribers) this.#publishHit(key, 'memory', 'fresh')
          return Promise.resolve(this.#values[slot])
        }
      }
      // The hot path: a hit (see HIT_SLOT_SHIFT), or a negative number for a miss.
      const epoch = fresh === null ? 0 : fresh.epoch()
      const r = peek(this.#id, key)
      if (r >= 0) {
        const value = this.#values[r >> HIT_SLOT_SHIFT]
        if (fresh !== null && (r & HIT_FLAGS) === 0) fresh.offer(key, r >> HIT_SLOT_SHIFT, epoch)
        if (hitChannel.hasSubscribers) this.#publishHit(key, 'memory', hitState(r))
        if (r & HIT_REFRESH) this.#refresh(key, loader, null, undefined, value)
        return Promise.resolve(value)
      }
    }
    return this.#getOrLoadSlow(key, loader, options)
  }

  /**
   * Many keys at once (README, "Many keys at once"): every key answered as getOrLoad would answer
   * it alone, and the keys this call must load, each once, in one `loadMany(keys, ctx)` call
   * (DataLoader's convention: an array of the same length; an Error at a position fails that key).
   */
  getOrLoadMany(keys, loadMany, options) {
    try {
      return this.#startGetOrLoadMany(keys, loadMany, options)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  #startGetOrLoadMany(keys, loadMany, options) {
    if (this.#closed) throw closedError()
    checkBatchKeys(keys)
    if (typeof loadMany !== 'function') {
      throw invalidArgument(`loadMany must be a function, got ${loadMany === null ? 'null' : typeof loadMany}`)
    }
    const { policy, signal, waitUntil, force, tags } = options === undefined ? NO_OPTIONS : this.#callOptions(options, 'getOrLoadMany')
    const n = keys.length
    const out = new Array(n)
    // Hits first, on getOrLoad's hot path (a string key), the other positions below. Options
    // other than beta shape only what a load writes, so the hits are the same with them; a
    // beta of the call's own decides each hit's early refresh at that beta (peekAt), as
    // getOrLoad with it would, and the index of fresh entries (proved at the constructor's) is
    // not asked. forceRefresh serves nothing; an aborted signal rejects as getOrLoad's does
    // (after the keys are checked, below).
    let rest = null
    let stale = null
    if (!force && !signal?.aborted && !this.#keepsNone) {
      const beta = policy === null ? this.#beta : policy[POLICY_BETA]
      const hot = beta === this.#beta
      const fresh = hot ? this.#fresh : null
      const now = Date.now()
      for (let i = 0; i < n; i++) {
        const key = keys[i]
        if (typeof key !== 'string') {
          ;(rest ??= []).push(i)
          continue
        }
        if (fresh !== null) {
          const slot = fresh.findAt(key, now)
          if (slot >= 0) {
            fresh.served(slot)
            out[i] = this.#values[slot]
            if (hitChannel.hasSubscribers) this.#publishHit(key, 'memory', 'fresh')
            continue
          }
        }
        const epoch = fresh === null ? 0 : fresh.epoch()
        const r = hot ? peek(this.#id, key) : peekAt(this.#id, key, beta)
        if (r < 0) {
          ;(rest ??= []).push(i)
          continue
        }
        const value = this.#values[r >> HIT_SLOT_SHIFT]
        if (fresh !== null && (r & HIT_FLAGS) === 0) fresh.offer(key, r >> HIT_SLOT_SHIFT, epoch)
        out[i] = value
        if (hitChannel.hasSubscribers) this.#publishHit(key, 'memory', hitState(r))
        if (r & HIT_REFRESH) (stale ??= []).push({ k: key, key, value })
      }
      if (rest === null) {
        if (stale !== null) this.#refreshMany(stale, loadMany, policy, waitUntil, tags)
        return Promise.resolve(out)
      }
    } else {
      rest = Array.from({ length: n }, (_, i) => i)
    }
    // Every key is checked before anything is looked up or loaded.
    const encoded = new Array(rest.length)
    for (let j = 0; j < rest.length; j++) encoded[j] = engine.encodeKey(keys[rest[j]])
    if (signal?.aborted) throw abortError(signal)
    if (inLoad()) {
      const nested = this.#loadManyNested(keys, rest, encoded, out, loadMany, policy, options)
      if (nested !== null) return signal ? withSignal(nested, signal) : nested
    }
    this.#watchInvalidations()
    // The keys the in-process tier did not have are read from Redis first, in one batch as
    // getMany reads them (on the read lane when it can), with no flight, lookup or lock bid per
    // key: only the keys Redis does not have are looked up, led and bid for (#readFirst). A
    // profile of a warm batch of 1,000 keys with l1: false put 3.3 ms of its 7 ms in that
    // per-key machinery (a lookup, a flight and its record, its adopt and end). forceRefresh
    // loads every key now: nothing is read first.
    if (this.#redis && !force) {
      const read = this.#readFirst(keys, rest, encoded, out, stale, loadMany, policy, waitUntil, tags)
      return signal ? withSignal(read, signal) : read
    }
    return this.#loadRest(keys, rest, encoded, out, stale, loadMany, policy, signal, waitUntil, force, tags, false, false)
  }

  // A getOrLoadMany call's keys not held in process (`rest`: their positions in `keys`,
  // `encoded` their keys), read from Redis in one batch first: those Redis has are served (a
  // stale one refreshed with the call's stale keys, `stale`), the others go to #loadRest, which
  // bids for their locks without reading them again. `policy`, `waitUntil`, `tags`: the call's
  // (its beta decides the early refresh of each value read, as for a cold getOrLoad with it).
  #readFirst(keys, rest, encoded, out, stale, loadMany, policy, waitUntil, tags) {
    // Each key once: `askedAt[j]` is the place of position j's key in `asked`, `firstOf[u]`
    // the first position of key `asked[u]` (a Map of keys to the values served was a second
    // Map of every key, among a profile's top frames).
    const firstAt = new Map()
    const asked = []
    const firstOf = []
    const askedAt = new Int32Array(rest.length)
    for (let j = 0; j < rest.length; j++) {
      const k = encoded[j]
      const u = firstAt.get(k)
      if (u !== undefined) {
        askedAt[j] = u
        continue
      }
      askedAt[j] = asked.length
      firstAt.set(k, asked.length)
      firstOf.push(j)
      asked.push(k)
      if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
    }
    let read
    try {
      read = redisFetchMany(this.#id, asked.join(''), keyLengths(asked), false)
    } catch (err) {
      return Promise.reject(err)
    }
    return read.then((batch) => {
      const [codes, texts, freshUntil, others, found, reported] = batch
      if (reported) this.#drainRedisReports()
      const values = this.#batchValues(codes, texts, found)
      const flights = new Float64Array(asked.length)
      for (let u = 0; u < asked.length; u++) flights[u] = codes[u] >= 0 && values[u] !== UNREADABLE ? -1 : -2
      const adopted = adoptMany(this.#id, found, flights, true, policy === null ? -1 : policy[POLICY_BETA])
      this.#fillMany(adopted, values)
      // By place in `asked`: its value, or MISSED (not in Redis, unreadable, Redis unavailable).
      const served = new Array(asked.length)
      // Every key missed was simply not in Redis: their gates need not read them again. A value
      // this serializer cannot read, or Redis unavailable, is judged by the gates' own read, as
      // getOrLoad judges one.
      let looked = true
      for (let u = 0; u < asked.length; u++) {
        const k = asked[u]
        const code = codes[u]
        let value = MISSED
        let state
        if (code >= 0) {
          if (flights[u] === -1) {
            value = values[u]
            state = HIT_STATES[(code >> BATCH_STATE_SHIFT) & 3]
            if (adopted[u] & 1) (stale ??= []).push({ k, key: keys[rest[firstOf[u]]], value, seen: freshUntil[u] })
          } else looked = false
        } else {
          // A value an announcement carried (fresh: just written), or none.
          const answer = others[-1 - code]
          if (answer.kind !== GATE_MISSING) looked = false
          if (answer.kind === GATE_FOUND) {
            const decoded = this.#decode(answer)
            if (decoded !== UNREADABLE) {
              this.#adoptDecoded(k, -1, false, answer, decoded)
              value = decoded
              state = answer.state
            }
          }
        }
        served[u] = value
        if (value !== MISSED && hitChannel.hasSubscribers) this.#publishHit(k, 'redis', state)
      }
      this.#publishInvalidations()
      let missed = null
      let missedKeys = null
      for (let j = 0; j < rest.length; j++) {
        const value = served[askedAt[j]]
        if (value !== MISSED) out[rest[j]] = value
        else {
          ;(missed ??= []).push(rest[j])
          ;(missedKeys ??= []).push(encoded[j])
        }
      }
      if (missed === null) {
        if (stale !== null) this.#refreshMany(stale, loadMany, policy, waitUntil, tags)
        return out
      }
      // The caller's signal is the whole call's (see #startGetOrLoadMany).
      return this.#loadRest(keys, missed, missedKeys, out, stale, loadMany, policy, undefined, waitUntil, false, tags, true, looked)
    })
  }

  // The rest of a getOrLoadMany call: its keys at positions `rest` of `keys` (`encoded`: their
  // keys) are looked up, joined or led, each once; `out` holds the other positions' values, and
  // `stale` the call's stale keys, refreshed with those found stale in Redis. `readFirst`: Redis
  // was read for these keys just now (#readFirst), and their misses published; `looked`: it had
  // none of them, so only their locks are bid for.
  #loadRest(keys, rest, encoded, out, stale, loadMany, policy, signal, waitUntil, force, tags, readFirst, looked) {
    const b = this.#newBatch(loadMany, policy, force ? PURPOSE_FORCE : PURPOSE_COLD)
    const gated = this.#redis && !force
    if (gated) b.gates = new Map()
    // Each distinct key once: `answers[u]` is its value (served in process) or its Outcome
    // (`outcome[u]`); `at[j]` says which. The call settles once every Outcome has.
    const indexOf = new Map()
    const answers = []
    const outcome = []
    const at = new Array(rest.length)
    const cold = []
    let pending = 0
    let finish = null
    const settledOne = () => {
      if (--pending === 0 && finish !== null) finish()
    }
    // Each key in turn, in slices of the thread's time (inSlices): `lead(j)` serves, joins or
    // leads key j. `pending` and `b.undecided` are held (LEADING) until every slice has run, so
    // neither the call nor the first loadMany call ends with the first slice's keys.
    const lead = (j) => {
      const k = encoded[j]
      const seen = indexOf.get(k)
      if (seen !== undefined) {
        at[j] = seen
        return
      }
      at[j] = answers.length
      indexOf.set(k, answers.length)
      const looked = engine.lookup(this.#id, k, policy, force)
      const kind = looked % STEP_KINDS
      const m = Math.floor(looked / STEP_KINDS)
      if (kind === STEP_SERVE) {
        const value = this.#values[m >> HIT_SLOT_SHIFT]
        if (hitChannel.hasSubscribers) this.#publishHit(k, 'memory', hitState(m))
        if (m & HIT_REFRESH) (stale ??= []).push({ k, key: keys[rest[j]], value })
        answers.push(value)
        outcome.push(false)
        return
      }
      if (!readFirst && missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
      pending++
      outcome.push(true)
      if (kind !== STEP_LEAD) {
        if (coalesceChannel.hasSubscribers) coalesceChannel.publish({ cache: this, namespace: this.#namespace, key: k })
        answers.push(new Outcome(settledOne).follow(this.#flights.get(m)))
        return
      }
      b.lead(k, keys[rest[j]])
      if (gated) {
        // The flight's outcome now (callers join it); its gate answers with every cold key's
        // (#batchGates), which serves what Redis has without running the flight at all.
        const c = new ColdKey(k, m, () => {
          this.#batchDecided(b, k)
          settledOne()
        })
        this.#flights.hold(m, c)
        cold.push(c)
        answers.push(c)
        return
      }
      const decided = () => this.#batchDecided(b, k)
      const load = this.#lead(k, m, this.#batchLoader(b, k, m), b.keyPolicy, force ? this.#currentValue(k) : undefined, b.purpose, waitUntil, tags, b)
      load.then(decided, decided)
      answers.push(new Outcome(settledOne).follow(load))
    }
    let failed
    const settled = new Promise((resolve, reject) => {
      failed = reject
      finish = () => {
        if (b.error !== null) return reject(b.error)
        for (let j = 0; j < rest.length; j++) {
          const u = at[j]
          const a = answers[u]
          if (!outcome[u]) {
            out[rest[j]] = a
            continue
          }
          if (a.rejected && isClosedError(a.result)) return reject(a.result)
          out[rest[j]] = a.result
        }
        resolve(out)
      }
    })
    pending++
    b.undecided.add(LEADING)
    const led = () => {
      // Once the flights are registered: a subscriber that calls the cache joins them.
      this.#publishInvalidations()
      // The call's stale keys, and those its cold keys found stale in Redis, in one refresh.
      b.refreshLate = (entries) => this.#refreshMany(entries, loadMany, policy, waitUntil, tags)
      b.passed = () => {
        const found = b.staleFound
        b.staleFound = null
        const entries = stale === null ? found : found.length === 0 ? stale : [...stale, ...found]
        if (entries.length > 0) b.refreshLate(entries)
      }
      if (cold.length > 0) this.#batchGates(b, cold, waitUntil, tags, looked)
      this.#batchDecided(b, LEADING)
      settledOne()
    }
    // A slice that throws (the cache closed between slices) rejects the call, and the keys led
    // so far still go on (to their loadMany call, or to ERR_CLOSED): a caller joined on one of
    // them is answered, never left waiting for a round that would never fire.
    const abandoned = (err) => {
      failed(err)
      try {
        led()
      } catch {}
    }
    inSlices(rest.length, lead, led, abandoned)
    return signal ? withSignal(settled, signal) : settled
  }

  #newBatch(loadMany, policy, purpose) {
    const keyPolicy = [...(policy ?? defaultPolicy(this.#id))]
    const timeout = keyPolicy[POLICY_LOAD_TIMEOUT]
    keyPolicy[POLICY_LOAD_TIMEOUT] = Infinity
    return new Batch(loadMany, purpose, keyPolicy, timeout)
  }

  // The cold keys' gates, in one go (one pipelined read, then one pipelined lock bid, per Redis
  // node): a key Redis has is served at once; the others' flights run with their answers. A key
  // another process holds is decided (the batch does not wait for it) and then waits for that
  // process's value alone, as getOrLoad does. `cold`: their ColdKeys.
  // `looked`: Redis was read for these keys just now and had none of them: bids only.
  #batchGates(b, cold, waitUntil, tags, looked) {
    const run = (c, gate) => {
      // Without a gate here, #runFlight asks for the key's own.
      if (gate !== undefined) b.gates.set(c.k, gate)
      c.follow(this.#runFlight(c.k, c.flight, this.#batchLoader(b, c.k, c.flight), b.keyPolicy, undefined, PURPOSE_COLD, waitUntil, tags, b))
    }
    const each = (batch) => {
      const [codes, texts, freshUntil, others, found, reported] = batch
      if (reported) this.#drainRedisReports()
      // The keys Redis had end their flights here, all adopted in one call; a value this cache's
      // serializer cannot read is not adopted: its flight runs, and looks again past it.
      const values = this.#batchValues(codes, texts, found)
      const flights = new Float64Array(cold.length)
      for (let i = 0; i < cold.length; i++) {
        flights[i] = codes[i] >= 0 && values[i] !== UNREADABLE ? cold[i].flight : -2
        if (flights[i] >= 0) this.#flights.delete(cold[i].flight)
      }
      const adopted = adoptMany(this.#id, found, flights, true, b.keyPolicy[POLICY_BETA])
      this.#fillMany(adopted, values)
      // After the values are in place: a subscriber may read the cache.
      this.#publishInvalidations()
      // Each key's flight ends or runs from here: in slices of the thread's time (inSlices).
      const answer = (i) => {
        const c = cold[i]
        const code = codes[i]
        if (code >= 0) {
          if (flights[i] < 0) {
            run(c, undefined)
            return
          }
          const value = values[i]
          if (hitChannel.hasSubscribers) this.#publishHit(c.k, 'redis', HIT_STATES[(code >> BATCH_STATE_SHIFT) & 3])
          // A stale value served from Redis is refreshed with the batch's (its basis: this copy).
          if (adopted[i] & 1) b.stale(c.k, value, freshUntil[i])
          c.resolve(value)
          return
        }
        const a = others[-1 - code]
        if (a.kind === GATE_WAIT) {
          this.#batchDecided(b, c.k)
          run(c, this.#gate(c.k, PURPOSE_COLD, PURPOSE_COLD, c.flight))
          return
        }
        if (a.lock !== LOCK_NONE && lockChannel.hasSubscribers) {
          lockChannel.publish({ cache: this, namespace: this.#namespace, key: c.k, reason: REASONS[PURPOSE_COLD], outcome: LOCK_OUTCOMES[a.lock] })
        }
        if (a.kind !== GATE_FOUND || !this.#servedFromRedis(b, c, a)) run(c, a)
      }
      inSlices(cold.length, answer, noop, (err) => {
        // Never expected: the keys not yet answered fail alone, as a loadMany failure would.
        for (const c of cold) c.reject(err)
      })
    }
    const names = cold.map((c) => c.k)
    let asked
    try {
      asked = redisGateMany(
        this.#id,
        names.join(''),
        keyLengths(names),
        Float64Array.from(cold, (c) => c.flight),
        looked,
      )
    } catch (err) {
      asked = Promise.reject(err)
    }
    asked.then(each, () => {
      // The binding could not ask (never expected): each key passes its own gate.
      for (const c of cold) run(c, undefined)
    })
  }

  // The values of a batch answer's found keys, by position (UNREADABLE where this cache's
  // serializer cannot read one; undefined at keys not found). With the JSON serializer they
  // come as one JSON array text, parsed at once; if it does not parse (a corrupt value among
  // them), each is read apart, as #decode reads one.
  #batchValues(codes, texts, found) {
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
        values[i] = code & BATCH_NEGATIVE ? JSON.parse(text) : this.#codec.decode(text, code & BATCH_FMT_MASK)
      } catch {
        values[i] = UNREADABLE
      }
    }
    return values
  }

  // Keeps each value of a batch at the slot adoptMany answered for it, as #fill keeps one.
  #fillMany(adopted, values) {
    if (this.#bytesBounded) {
      for (const freed of takeReleased(this.#id)) this.#values[freed] = undefined
    }
    for (let i = 0; i < adopted.length; i++) {
      const slot = adopted[i] >> 1
      if (slot >= 0) this.#values[slot] = values[i]
    }
  }

  // A cold key of a batch that Redis has: ends its flight with that value, as #runFlight does for
  // one key (adopted, then its stale value refreshed with the batch's). False when this cache's
  // serializer cannot read it: then the flight runs, and looks again past it.
  #servedFromRedis(b, c, answer) {
    const value = this.#decode(answer)
    if (value === UNREADABLE) return false
    this.#flights.delete(c.flight)
    const refresh = this.#adoptDecoded(c.k, c.flight, true, answer, value, b.keyPolicy)
    if (hitChannel.hasSubscribers) this.#publishHit(c.k, 'redis', answer.state)
    if (refresh) b.stale(c.k, value, answer.freshUntil)
    c.resolve(value)
    return true
  }

  // A led key's loader: hands the key (and its ctx) to the batch's next loadMany call.
  // `flight`: the key's, whose end the results' slices wait for (#callLoadMany).
  #batchLoader(b, k, flight) {
    return (ctx) =>
      new Promise((resolve, reject) => {
        b.round.push({ k, ctx, resolve, reject, flight })
        this.#batchDecided(b, k)
      })
  }

  // Key `k` of batch `b` has asked or is decided otherwise; the first loadMany call goes once
  // every led key is, later ones in the next microtask after a late key asks.
  #batchDecided(b, k) {
    if (!b.undecided.delete(k)) {
      if (b.gatesPassed && b.round.length > 0 && !b.roundScheduled) {
        b.roundScheduled = true
        queueMicrotask(() => {
          b.roundScheduled = false
          this.#fireRound(b)
        })
      }
      return
    }
    if (b.undecided.size > 0) return
    b.gatesPassed = true
    if (b.passed !== null) b.passed()
    this.#fireRound(b)
  }

  #fireRound(b) {
    const entries = b.round
    if (entries.length === 0) return
    b.round = []
    // Keys ask as their gates answer (with Redis, in any order).
    entries.sort((x, y) => b.rank.get(x.k) - b.rank.get(y.k))
    this.#callLoadMany(b, entries)
  }

  // One loadMany call for `entries`, timed by loadTimeout; settles each key's loader with its
  // result: a value (null/undefined: not found), or its Error.
  #callLoadMany(b, entries) {
    const keys = entries.map((e) => b.keyOf.get(e.k))
    const names = entries.map((e) => e.k)
    noteBatchCall(this.#id, b.purpose === PURPOSE_REFRESH)
    const control = new AbortController()
    this.#loads.add(control)
    let timer
    let settled = false
    const settle = (each) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      this.#loads.delete(control)
      // Each key's flight goes on from here (serialized, written, its callers answered): in
      // slices, so that a large batch never holds the event loop for all its keys at once. With
      // Redis a slice waits for the previous one's flights to end (their writes answered): the
      // answers of every key's write would otherwise arrive in one turn of the loop.
      const ends = []
      const pause = () => {
        const waiting = ends.splice(0)
        return waiting.length === 0 ? undefined : Promise.allSettled(waiting)
      }
      const one = (i) => {
        const e = entries[i]
        each(e, i)
        if (!this.#redis) return
        const flight = this.#flights.get(e.flight)
        if (flight !== undefined) ends.push(flight)
      }
      inSlices(entries.length, one, noop, (err) => this.#report(err, 'loadMany', undefined), pause)
    }
    const failAll = (err) => settle((e) => e.reject(err))
    if (b.timeout !== Infinity) {
      timer = setTimeout(() => {
        const err = new StampedeCacheError('ERR_LOAD_TIMEOUT', `loadMany of ${keys.length} keys ran longer than loadTimeout (${b.timeout} ms)`)
        if (loadTimeoutChannel.hasSubscribers) {
          loadTimeoutChannel.publish({ cache: this, namespace: this.#namespace, key: names[0], keys: names, reason: REASONS[b.purpose], timeout: b.timeout })
        }
        control.abort(err)
        failAll(err)
      }, b.timeout)
      // An idle cache never keeps the process alive; a loadMany that does work keeps it alive itself.
      timer.unref()
    }
    const ctx = {
      keys: names,
      signal: control.signal,
      // Every key of this call gets the ttl and tags; the first key's ctx checks them.
      setTtl(ttl, hardTtl) {
        for (const e of entries) e.ctx.setTtl(ttl, hardTtl)
      },
      setTags(tags) {
        for (const e of entries) e.ctx.setTags(tags)
      },
    }
    // Its keys' loads, for a call inside loadMany (lib/reentry.js).
    const store = this.#store
    const call = () => asLoadOfMany(new Set(names.map((n) => store + n)), () => b.loadMany(keys, ctx))
    const started = loadTraced()
      ? () => loadChannel.tracePromise(async () => call(), { cache: this, namespace: this.#namespace, key: names[0], keys: names, reason: REASONS[b.purpose] })
      : call
    Promise.resolve()
      .then(started)
      .then((results) => {
        if (!Array.isArray(results) || results.length !== keys.length) {
          const got = Array.isArray(results) ? `an array of ${results.length}` : results === null ? 'null' : typeof results
          const err = invalidArgument(`loadMany must return an array of ${keys.length} results, one per key it was given, got ${got}`)
          b.error ??= err
          failAll(err)
          return
        }
        settle((e, i) => {
          const r = results[i]
          if (isError(r)) e.reject(r)
          else e.resolve(r)
        })
      }, failAll)
  }

  // Refreshes stale keys ({ k, key, value }) in the background in one loadMany call, as #refresh
  // refreshes one: handed to waitUntil at once; failures reported per key.
  #refreshMany(entries, loadMany, policy, waitUntil, tags) {
    const b = this.#newBatch(loadMany, policy, PURPOSE_REFRESH)
    const loads = []
    // Led in slices of the thread's time (inSlices), the loadMany call held (LEADING) until
    // every key is led; `done` is handed to waitUntil now all the same, as rule 2 wants.
    b.undecided.add(LEADING)
    let allLed = false
    let ledAll
    const led = new Promise((resolve) => {
      ledAll = resolve
    })
    const lead = (i) => {
      const { k, key, value, seen = -1 } = entries[i]
      // The batch is one query: the bound on refreshes running holds its first key only.
      const flight = beginBatchRefresh(this.#id, k, loads.length === 0, seen)
      if (flight < 0) return
      b.lead(k, key)
      const load = this.#lead(k, flight, this.#batchLoader(b, k, flight), b.keyPolicy, value, PURPOSE_REFRESH, undefined, tags, b)
      const decided = () => this.#batchDecided(b, k)
      load.then(decided, decided)
      loads.push(load.then(noop, (err) => this.#report(err, 'refresh', k)))
    }
    const end = () => {
      allLed = true
      this.#batchDecided(b, LEADING)
      ledAll()
    }
    inSlices(entries.length, lead, end, (err) => {
      this.#report(err, 'refresh', undefined)
      end()
    })
    if (allLed && loads.length === 0) return
    const done = led.then(() => Promise.all(loads)).then(noop)
    this.#background.add(done)
    done.then(() => this.#background.delete(done))
    const hook = waitUntil ?? requestScope.getStore() ?? this.#waitUntil
    if (hook !== undefined) {
      try {
        hook(done)
      } catch (err) {
        this.#report(err, 'waitUntil', undefined)
      }
    }
  }

  /** Many keys at once, as `get` reads one: fresh or stale values (undefined where none); never loads. */
  async getMany(keys) {
    if (this.#closed) throw closedError()
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
          this.#publishHit(keys[i], 'memory', 'fresh')
        }
      }
    }
    if (rest === null) return out
    this.#watchInvalidations()
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
      if (this.#keepsNone) {
        // It keeps nothing: every key is Redis's.
        if (missChannel.hasSubscribers) {
          for (const k of positions.keys()) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
        }
        missed = positions
      } else {
        const asked = [...positions.keys()]
        const hits = engine.getEntries(this.#id, asked.join(''), keyLengths(asked))
        for (let u = 0; u < asked.length; u++) {
          const k = asked[u]
          const hit = hits[u]
          if (hit >= 0) {
            if (hitChannel.hasSubscribers) this.#publishHit(k, 'memory', hitState(hit))
            const value = this.#values[hit >> HIT_SLOT_SHIFT]
            for (const i of positions.get(k)) out[i] = value
            continue
          }
          if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
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
        if (hitChannel.hasSubscribers) this.#publishHit(k, 'memory', hitState(hit))
        out[i] = this.#values[hit >> HIT_SLOT_SHIFT]
        continue
      }
      if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
      missed.set(k, [i])
    }
    this.#publishInvalidations()
    if (missed.size === 0 || !this.#redis) return out
    const asked = [...missed.keys()]
    const [codes, texts, , others, found, reported] = await redisFetchMany(this.#id, asked.join(''), keyLengths(asked), true)
    if (reported) this.#drainRedisReports()
    // The keys Redis had, adopted in one call (a value this serializer cannot read: a miss).
    const values = this.#batchValues(codes, texts, found)
    const flights = new Float64Array(asked.length)
    for (let u = 0; u < asked.length; u++) flights[u] = codes[u] >= 0 && values[u] !== UNREADABLE ? -1 : -2
    this.#fillMany(adoptMany(this.#id, found, flights, false, -1), values)
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
        value = this.#decode(answer)
        if (value === UNREADABLE) continue
        this.#adoptDecoded(asked[u], -1, false, answer, value)
        state = answer.state
      }
      if (hitChannel.hasSubscribers) this.#publishHit(asked[u], 'redis', state)
      for (const i of missed.get(asked[u])) out[i] = value
    }
    this.#publishInvalidations()
    return out
  }

  // The flight's own promise when this call leads or joins one (no async wrapper around it: two
  // microtask turns less per read), else a promise of the value or of the error.
  #getOrLoadSlow(key, loader, options) {
    try {
      return this.#startGetOrLoad(key, loader, options)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  #startGetOrLoad(key, loader, options) {
    if (this.#closed) throw closedError()
    const { policy, signal, waitUntil, force, tags } = options === undefined ? NO_OPTIONS : this.#callOptions(options)
    const k = engine.encodeKey(key)
    if (signal?.aborted) throw abortError(signal)
    if (inLoad() && inLoadOf(this.#store + k)) {
      const nested = this.#loadNested(k, loader, policy)
      return signal ? withSignal(nested, signal) : nested
    }
    this.#watchInvalidations()
    // One number: n * STEP_KINDS + kind (see `lookup` in src/node/local.rs).
    const looked = engine.lookup(this.#id, k, policy, force)
    const step = { kind: looked % STEP_KINDS, n: Math.floor(looked / STEP_KINDS) }
    if (step.kind === STEP_SERVE) {
      const value = this.#values[step.n >> HIT_SLOT_SHIFT]
      this.#publishInvalidations()
      if (hitChannel.hasSubscribers) this.#publishHit(k, 'memory', hitState(step.n))
      if (step.n & HIT_REFRESH) this.#refresh(k, loader, policy, waitUntil, value, tags)
      return Promise.resolve(value)
    }
    let load
    if (step.kind === STEP_LEAD) {
      const stale = force ? this.#currentValue(k) : undefined
      load = this.#lead(k, step.n, loader, policy, stale, force ? PURPOSE_FORCE : PURPOSE_COLD, waitUntil, tags)
    } else {
      load = this.#flights.get(step.n)
    }
    // Once the flight is registered: a subscriber that calls the cache joins it.
    this.#publishInvalidations()
    if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
    if (step.kind !== STEP_LEAD && coalesceChannel.hasSubscribers) {
      coalesceChannel.publish({ cache: this, namespace: this.#namespace, key: k })
    }
    return signal ? withSignal(load, signal) : load
  }

  // A getOrLoad inside the load of its own key (lib/reentry.js), which would otherwise wait for
  // the load it is part of: its loader runs now, alone, bounded by loadTimeout; its caller gets
  // what a hit would return, and nothing is written (the enclosing load writes the key).
  async #loadNested(k, loader, policy) {
    const result = { policy, tags: null, skip: false, done: false }
    try {
      return toStored(this.#codec, await this.#callLoader(k, loader, undefined, policy, PURPOSE_COLD, result)).stored
    } finally {
      result.done = true
    }
  }

  // A getOrLoadMany inside the load of some of its keys (lib/reentry.js): those keys go to one
  // loadMany call of their own, now, whose results are cached nowhere (the enclosing loads write
  // them); the call's other keys are answered as usual. `rest`: the positions of `keys` not served
  // yet (`encoded`: their keys); `out`: the call's answers so far. Null when no key is in a load.
  #loadManyNested(keys, rest, encoded, out, loadMany, policy, options) {
    let own = null
    let others = null
    for (let j = 0; j < rest.length; j++) {
      if (inLoadOf(this.#store + encoded[j])) (own ??= []).push(j)
      else (others ??= []).push(rest[j])
    }
    if (own === null) return null
    const b = this.#newBatch(loadMany, policy, PURPOSE_COLD)
    const answers = new Map()
    const entries = []
    for (const j of own) {
      const k = encoded[j]
      if (answers.has(k)) continue
      b.lead(k, keys[rest[j]])
      // Each position holds its value as a hit would return it, or its Error (one the value
      // cannot be serialized with too), as getOrLoadMany answers.
      const answer = new Promise((resolve, reject) => entries.push({ k, ctx: NESTED_BATCH_CTX, resolve, reject })).then((value) => {
        try {
          return toStored(this.#codec, value).stored
        } catch (err) {
          return err
        }
      }, identity)
      answers.set(k, answer)
    }
    this.#callLoadMany(b, entries)
    const mine = Promise.all(own.map((j) => answers.get(encoded[j])))
    const theirs =
      others === null
        ? null
        : this.getOrLoadMany(
            others.map((i) => keys[i]),
            loadMany,
            options,
          )
    return Promise.all([mine, theirs]).then(([values, usual]) => {
      if (b.error !== null) throw b.error
      for (let n = 0; n < own.length; n++) out[rest[own[n]]] = values[n]
      for (let n = 0; others !== null && n < others.length; n++) out[others[n]] = usual[n]
      return out
    })
  }

  // A getOrLoad or getOrLoadMany call's options, checked.
  #callOptions(options, method = 'getOrLoad') {
    if (options === null || typeof options !== 'object') throw notAnOptionsObject(method, options)
    const policy = engine.resolvePolicy(this.#id, options, false)
    const { signal, waitUntil } = options
    const tags = options.tags === undefined ? null : tagsOption(options.tags)
    if (signal !== undefined && !isAbortSignal(signal)) throw invalidOption('signal', 'must be an AbortSignal')
    if (waitUntil !== undefined && typeof waitUntil !== 'function') throw invalidOption('waitUntil', 'must be a function')
    if (options.forceRefresh !== undefined && typeof options.forceRefresh !== 'boolean') {
      throw invalidOption('forceRefresh', 'must be a boolean')
    }
    return { policy, signal, waitUntil, force: options.forceRefresh === true, tags }
  }

  // The value of a live entry, for ctx.stale when forceRefresh replaces it (no stats counted).
  #currentValue(k) {
    const slot = native.currentSlot(this.#id, k)
    return slot >= 0 ? this.#values[slot] : undefined
  }

  // `batch`: the getOrLoadMany call whose loadMany loads this key (see #batchOf), else undefined.
  #lead(k, flight, loader, policy, stale, purpose, waitUntil, tags, batch) {
    const load = this.#runFlight(k, flight, loader, policy, stale, purpose, waitUntil, tags, batch)
    this.#flights.set(flight, load)
    return load
  }

  // One flight: ask Redis first (if configured), then call the loader if still needed. Its
  // first await comes before the loader runs, so the flight is registered by then (#lead): a
  // loader that reads the same key joins its own flight instead of finding an unknown one.
  async #runFlight(k, flight, loader, policy, stale, purpose, waitUntil, tags, batch) {
    let gate = null
    if (!this.#redis) {
      await undefined
    } else {
      // A batch's cold keys passed their gates together (#batchGates).
      const first = batch?.gates?.get(k)
      gate = first === undefined ? await this.#gate(k, purpose, purpose, flight) : await first
      // A value this cache's serializer cannot read (another custom serializer, corrupt data)
      // is a miss: look again, taking the lock past it. A few times at most, then load without
      // Redis (nothing is written there).
      for (let tries = 0; gate.kind === GATE_FOUND; tries++) {
        const value = this.#decode(gate)
        if (value !== UNREADABLE) {
          this.#flights.delete(flight)
          const refresh = this.#adoptDecoded(k, flight, purpose === PURPOSE_COLD, gate, value, policy)
          // A cold load answered by Redis is that tier's hit; a refresh found refreshed
          // elsewhere is not a read.
          if (purpose === PURPOSE_COLD && hitChannel.hasSubscribers) this.#publishHit(k, 'redis', gate.state)
          // A cold caller given a stale value from Redis starts its refresh, as for a stale hit.
          // Its basis is the copy Redis answered (the in-process tier may keep none of it).
          if (refresh) {
            // A batch refreshes all its stale keys in one loadMany call.
            if (batch !== undefined) batch.stale(k, value, gate.freshUntil)
            else this.#refresh(k, loader, policy, waitUntil, value, tags, gate.freshUntil)
          }
          return value
        }
        if (tries >= 2) {
          gate = null
          break
        }
        gate = await this.#gate(k, PURPOSE_PAST_VALUE, purpose, flight)
      }
    }
    if (gate !== null) {
      if (gate.kind === GATE_SKIP) {
        // Another process holds the refresh and will announce its result.
        this.#flights.delete(flight)
        abandon(this.#id, flight)
        return stale
      }
      if (gate.kind === GATE_CLOSED) {
        this.#flights.delete(flight)
        // A background refresh just ends (the stale value it had is what its readers got).
        if (purpose === PURPOSE_REFRESH) return stale
        throw closedError()
      }
    }
    return this.#runLoader(k, flight, loader, policy, stale, purpose, tags, batch)
  }

  // Asks Redis before `flight` loads (`ask`: the gate's purpose); publishes the lock outcome
  // under the flight's `purpose`. What the gate answered for the flight's end (its lock, fence,
  // stamp) stays in the engine: the answer says what to do and carries the value found.
  async #gate(k, ask, purpose, flight) {
    // A cold read answered by the value another process's announcement carried is no promise.
    const asked = redisGate(this.#id, k, ask, flight)
    const gate = asked instanceof Promise ? await asked : asked
    if (gate.reported) this.#drainRedisReports()
    if (gate.lock !== LOCK_NONE && lockChannel.hasSubscribers) {
      lockChannel.publish({ cache: this, namespace: this.#namespace, key: k, reason: REASONS[purpose], outcome: LOCK_OUTCOMES[gate.lock] })
    }
    return gate
  }

  // The value of an envelope read from Redis, or UNREADABLE when this cache's serializer
  // cannot read it (never a throw: a miss, as for any value this cache did not write).
  #decode(answer) {
    if (answer.json === undefined || answer.json === null) return undefined
    try {
      return answer.negative ? JSON.parse(answer.json) : this.#codec.decode(answer.json, answer.fmt)
    } catch {
      return UNREADABLE
    }
  }

  // Takes an envelope read from Redis into the in-process tier, with its decoded value: for a
  // flight (`flight` >= 0) the one its gate found, which the engine kept; for a read (-1), the
  // one `answer` carries. Returns whether the caller (of a cold flight: `cold`) should start a
  // refresh of the stale value. `policy`: the call's (its XFetch beta decides a cold caller's
  // early refresh), or null.
  #adoptDecoded(k, flight, cold, answer, value, policy = null) {
    // One number: slot * 2 + refresh (see `adopt` in src/node/redis.rs).
    const adopted = flight >= 0 ? adopt(this.#id, flight, cold, policy === null ? -1 : policy[POLICY_BETA]) : adoptRead(this.#id, k, answer)
    this.#fill(adopted >> 1, value)
    // After the value is in place: a subscriber may read the cache.
    this.#publishInvalidations()
    return (adopted & 1) === 1
  }

  // Keeps `value` at `slot`, what the engine call that wrote it answered (NO_SLOT or
  // WRITTEN_NOWHERE: nothing to keep), and returns `slot`. The one place a value is stored at a
  // slot, called in the JS turn of that engine call, before any await: the engine may hand the
  // slot to another key at its next call (src/node/mod.rs, "Boundary rules"). Under l1.maxBytes,
  // first drops the values at slots the engine freed since (evicted by size, removed), so memory,
  // not just the count, stays within the budget; before writing, as `slot` may be one of them.
  #fill(slot, value) {
    if (this.#bytesBounded) {
      for (const freed of takeReleased(this.#id)) this.#values[freed] = undefined
    }
    if (slot >= 0) this.#values[slot] = value
    return slot
  }

  async #runLoader(k, flight, loader, policy, stale, purpose, tags, batch) {
    // A batch's keys are counted (and traced) once per loadMany call instead (#fireBatch).
    if (batch === undefined) noteLoaderCall(this.#id, k, flight)
    const started = performance.now()
    // What the loader says about its result (ctx.setTtl, setTags, skipCache).
    const result = { policy, tags: null, skip: false, done: false }
    let value
    try {
      if (batch === undefined && loadTraced()) {
        const context = { cache: this, namespace: this.#namespace, key: k, reason: REASONS[purpose] }
        value = await loadChannel.tracePromise(this.#callLoader, context, this, k, loader, stale, policy, purpose, result)
      } else {
        value = await this.#callLoader(k, loader, stale, policy, purpose, result)
      }
    } catch (err) {
      result.done = true
      await this.#loadFailed(k, flight)
      // A caller that has a value (forceRefresh of a live entry) gets it instead of a timeout.
      if (err instanceof StampedeCacheError && err.code === 'ERR_LOAD_TIMEOUT' && purpose === PURPOSE_FORCE && stale !== undefined) {
        return stale
      }
      throw err
    }
    result.done = true
    const computeMs = performance.now() - started
    let text
    let stored
    let size
    let fmt
    try {
      // Even a result not cached goes through the serializer: callers get what a hit returns.
      ;({ text, stored, size, fmt } = toStored(this.#codec, value))
    } catch (err) {
      await this.#loadFailed(k, flight)
      throw err
    }
    if (result.skip) {
      await this.#skipped(k, flight)
      return stored
    }
    policy = result.policy
    const negative = stored === null || stored === undefined
    // The call's tags and the loader's; with neither, a refresh keeps the tags of the entry
    // it replaces (the engine knows them in process; the gate read them from Redis).
    tags = tags === null ? result.tags : result.tags === null ? tags : [...new Set([...tags, ...result.tags])]
    const loaded = { computeMs, negative, policy, tags, size }
    if (this.#redis) {
      // In Redis (or dropped there as older than what Redis holds, and the lock released)
      // before any caller sees it; the flight stays open meanwhile so callers keep joining it.
      const written = writeBack(this.#id, flight, loaded, text, fmt)
      this.#publishInvalidations()
      const outcome = await written
      this.#flights.delete(flight)
      this.#fill(finishWrite(this.#id, flight, outcome !== DROPPED), stored)
    } else {
      this.#flights.delete(flight)
      this.#fill(complete(this.#id, k, flight, loaded, purpose !== PURPOSE_COLD), stored)
    }
    this.#publishInvalidations()
    this.#drainRedisReports()
    return stored
  }

  // The loader called ctx.skipCache(): its callers get the result, nothing is written anywhere,
  // and the lock is released (announced, so other processes waiting for it load themselves).
  async #skipped(k, flight) {
    this.#flights.delete(flight)
    skip(this.#id, k, flight)
    const sent = this.#redisFailed(flight, 0)
    if (sent !== undefined) await sent
  }

  // The loader's ctx. Its setters change `result` until the loader has settled, and are
  // ignored after.
  #context(k, stale, signal, result) {
    const id = this.#id
    return {
      key: k,
      stale,
      signal,
      setTtl(ttl, hardTtl) {
        let own
        try {
          own = engine.resolvePolicy(id, hardTtl === undefined ? { ttl } : { ttl, hardTtl }, true)
        } catch (err) {
          throw new StampedeCacheError('ERR_INVALID_ARGUMENT', `ctx.setTtl: ${err.message}`)
        }
        if (result.done) return
        const p = [...(result.policy ?? defaultPolicy(id))]
        p[POLICY_TTL] = own[POLICY_TTL]
        p[POLICY_HARD_TTL] = own[POLICY_HARD_TTL]
        // A not-found result lives this ttl too.
        p[POLICY_NEGATIVE_TTL] = own[POLICY_TTL]
        result.policy = p
      },
      setTags(tags) {
        const list = checkTags(tags, (why) => {
          throw invalidArgument(`ctx.setTags: tags ${why}`)
        })
        if (result.done) return
        result.tags = result.tags === null ? list : [...new Set([...result.tags, ...list])]
      },
      skipCache() {
        if (!result.done) result.skip = true
      },
    }
  }

  // Calls the loader with its context; rejects with ERR_LOAD_TIMEOUT (and aborts ctx.signal)
  // once it has run for loadTimeout. A late result is ignored by the caller of this.
  #callLoader(k, loader, stale, policy, purpose, result) {
    const control = new AbortController()
    this.#loads.add(control)
    const timeout = policy === null ? this.#loadTimeout : policy[POLICY_LOAD_TIMEOUT]
    let timer
    const loaded = new Promise((resolve, reject) => {
      if (timeout !== Infinity) {
        timer = setTimeout(() => {
          const err = new StampedeCacheError('ERR_LOAD_TIMEOUT', `the loader of ${JSON.stringify(k)} ran longer than loadTimeout (${timeout} ms)`)
          if (loadTimeoutChannel.hasSubscribers) {
            loadTimeoutChannel.publish({ cache: this, namespace: this.#namespace, key: k, reason: REASONS[purpose], timeout })
          }
          control.abort(err)
          reject(err)
        }, timeout)
        // An idle cache never keeps the process alive; a loader that does work keeps it alive itself.
        timer.unref()
      }
      // A loader may throw synchronously or return a plain value: both become this promise.
      Promise.resolve()
        .then(() => asLoadOf(this.#store + k, () => loader(this.#context(k, stale, control.signal, result))))
        .then(resolve, reject)
    })
    return loaded.finally(() => {
      clearTimeout(timer)
      this.#loads.delete(control)
    })
  }

  async #loadFailed(k, flight) {
    this.#flights.delete(flight)
    const retryAfter = fail(this.#id, k, flight)
    const sent = this.#redisFailed(flight, retryAfter)
    if (sent !== undefined) await sent
  }

  // Ends a Redis flight's record after a failure or skipCache: its lock released, a failed
  // refresh's retryAfter recorded. A promise while that is sent, else undefined.
  #redisFailed(flight, retryAfter) {
    if (!this.#redis) return undefined
    const sent = redisFailed(this.#id, flight, retryAfter)
    return sent === null ? undefined : sent.then(() => this.#drainRedisReports())
  }

  #drainRedisReports() {
    for (const r of takeRedisReports(this.#id)) {
      // Without onError, an outage's two ends are warned of once each; its end is no failure.
      if (r.outage !== undefined && r.outage !== null && this.#onError === undefined) warnRedisOutage(r, this.#namespace)
      if (r.outage === 'up') continue
      const err = new StampedeCacheError('ERR_REDIS', r.message)
      const key = r.key ?? undefined
      if (redisErrorChannel.hasSubscribers) redisErrorChannel.publish({ cache: this, namespace: this.#namespace, op: r.op, key, error: err })
      this.#report(err, `redis:${r.op}`, key)
    }
  }

  #publishHit(key, tier, state) {
    hitChannel.publish({ cache: this, namespace: this.#namespace, key, tier, state })
  }

  // Has the engine keep the invalidations it applies from other processes while anyone listens
  // (checked before each call that may apply them; the hot path leaves pending ones to us).
  #watchInvalidations() {
    const on = invalidateChannel.hasSubscribers
    if (on !== this.#watchingInvalidations) {
      this.#watchingInvalidations = on
      observeInvalidations(this.#id, on)
    }
  }

  // Publishes what the engine applied from other processes since the last call.
  #publishInvalidations() {
    if (!this.#watchingInvalidations) return
    const keys = takeInvalidations(this.#id)
    for (let i = 0; i < keys.length; i++) {
      this.#publishInvalidation(keys[i] ?? undefined, 'bus')
    }
  }

  // `tags`: a deleteByTag here (no key).
  #publishInvalidation(key, source, tags) {
    if (!invalidateChannel.hasSubscribers) return
    const message = { cache: this, namespace: this.#namespace, key, source }
    if (tags !== undefined) message.tags = tags
    invalidateChannel.publish(message)
  }

  // Starts the background refresh the engine asked for and hands it to waitUntil at once.
  // `seen`: the fresh-until of the copy the caller was served from Redis (-1: from the
  // in-process tier), the copy the refresh replaces.
  #refresh(k, loader, policy, waitUntil, stale, tags = null, seen = -1) {
    const flight = beginRefresh(this.#id, k, seen)
    if (flight < 0) return
    const load = this.#lead(k, flight, loader, policy, stale, PURPOSE_REFRESH, undefined, tags)
    const done = load.then(noop, (err) => this.#report(err, 'refresh', k))
    this.#background.add(done)
    done.then(() => this.#background.delete(done))
    // Per-call option, then the request's scope, then the constructor's.
    const hook = waitUntil ?? requestScope.getStore() ?? this.#waitUntil
    if (hook !== undefined) {
      try {
        hook(done)
      } catch (err) {
        this.#report(err, 'waitUntil', k)
      }
    }
  }

  #report(err, op, key) {
    if (this.#onError === undefined) return
    try {
      this.#onError(err, { op, key })
    } catch {
      // An onError that throws must not break the refresh that reported.
    }
  }

  get(key) {
    if (typeof key === 'string') {
      const fresh = this.#fresh
      if (fresh !== null) {
        // As getOrLoad's: an entry the engine proved fresh, no native call.
        const slot = fresh.find(key)
        if (slot >= 0) {
          fresh.served(slot)
          if (hitChannel.hasSubscribers) this.#publishHit(key, 'memory', 'fresh')
          return Promise.resolve(this.#values[slot])
        }
      }
      // The hot path, as getOrLoad's: a hit (see HIT_SLOT_SHIFT; never a refresh request), or a
      // negative number. A miss, a closed cache or a bad key is the slow path's to answer.
      const epoch = fresh === null ? 0 : fresh.epoch()
      const r = peekGet(this.#id, key)
      if (r >= 0) {
        const value = this.#values[r >> HIT_SLOT_SHIFT]
        if (fresh !== null && (r & HIT_FLAGS) === 0) fresh.offer(key, r >> HIT_SLOT_SHIFT, epoch)
        if (hitChannel.hasSubscribers) this.#publishHit(key, 'memory', hitState(r))
        return Promise.resolve(value)
      }
    }
    return this.#getSlow(key)
  }

  async #getSlow(key) {
    if (this.#closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#watchInvalidations()
    const hit = engine.getEntry(this.#id, k)
    this.#publishInvalidations()
    if (hit >= 0) {
      if (hitChannel.hasSubscribers) this.#publishHit(k, 'memory', hitState(hit))
      return this.#values[hit >> HIT_SLOT_SHIFT]
    }
    if (missChannel.hasSubscribers) missChannel.publish({ cache: this, namespace: this.#namespace, key: k })
    if (!this.#redis) return undefined
    const asked = redisFetch(this.#id, k, true)
    const answer = asked instanceof Promise ? await asked : asked
    if (answer.reported) this.#drainRedisReports()
    // Closed while Redis was asked: the read was cut short, which says nothing of the key.
    if (answer.kind !== GATE_FOUND && this.#closed) throw closedError()
    if (answer.kind !== GATE_FOUND) return undefined
    const value = this.#decode(answer)
    if (value === UNREADABLE) return undefined
    this.#adoptDecoded(k, -1, false, answer, value)
    if (hitChannel.hasSubscribers) this.#publishHit(k, 'redis', answer.state)
    return value
  }

  async set(key, value, options) {
    if (this.#closed) throw closedError()
    const k = engine.encodeKey(key)
    let policy = null
    let tags = null
    if (options !== undefined) {
      if (options === null || typeof options !== 'object') throw notAnOptionsObject('set', options)
      policy = engine.resolvePolicy(this.#id, options, true)
      if (options.tags !== undefined) tags = tagsOption(options.tags)
    }
    const { text, stored, size, fmt } = toStored(this.#codec, value)
    this.#watchInvalidations()
    const slot = this.#fill(engine.setEntry(this.#id, k, stored === null || stored === undefined, policy, tags, size), stored)
    // Sent before any subscriber runs (one may write the key too): Redis gets the writes in call
    // order. A zero TTL caches nothing: an older copy in Redis must not come back either.
    const sent = this.#redis ? redisWrite(this.#id, k, text, slot === WRITTEN_NOWHERE, fmt) : null
    this.#publishInvalidations()
    this.#publishInvalidation(k, 'local')
    if (sent === null) return
    const outcome = await sent
    this.#drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError('set', lastRedisFailure(this.#id), outcome === QUEUED)
  }

  async delete(key) {
    if (this.#closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#watchInvalidations()
    const [slot, removed] = engine.deleteEntry(this.#id, k)
    this.#fill(slot, undefined)
    // Sent before any subscriber runs, as for set.
    const sent = this.#redis ? redisWrite(this.#id, k, undefined, true, FMT_JSON) : null
    this.#publishInvalidations()
    this.#publishInvalidation(k, 'local')
    if (sent === null) return removed === 1
    const removedRemote = await sent
    this.#drainRedisReports()
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
    if (this.#closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#watchInvalidations()
    const sent = expireEntry(this.#id, k)
    this.#publishInvalidations()
    this.#publishInvalidation(k, 'local')
    const outcome = await sent
    this.#drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError('expire', lastRedisFailure(this.#id), outcome === QUEUED)
    return outcome !== 0
  }

  async inspect(key) {
    if (this.#closed) throw closedError()
    const k = engine.encodeKey(key)
    this.#watchInvalidations()
    const local = engine.inspectEntry(this.#id, k)
    this.#publishInvalidations()
    if (local || !this.#redis) return local ?? undefined
    const answer = await redisFetch(this.#id, k, false)
    if (answer.reported) this.#drainRedisReports()
    if (answer.kind !== GATE_FOUND && this.#closed) throw closedError()
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
    if (this.#closed) throw closedError()
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
    this.#watchInvalidations()
    const sent = within === undefined ? mark(this.#id, list) : mark(this.#id, list, within)
    this.#publishInvalidations()
    this.#publishInvalidation(undefined, 'local', list)
    const outcome = await sent
    this.#drainRedisReports()
    if (outcome === UNAVAILABLE || outcome === QUEUED) throw redisError(op, lastRedisFailure(this.#id), outcome === QUEUED)
  }

  /**
   * Removes every entry of this namespace, in this process at once and, with Redis, in every
   * instance sharing it (no KEYS: the namespace's value keys are swept with SCAN, one batch at a
   * time); a load that began before never writes its result back. Other namespaces are untouched.
   */
  async clear() {
    if (this.#closed) throw closedError()
    this.#watchInvalidations()
    const sent = clearEntries(this.#id)
    // The engine dropped every entry; their values go too.
    this.#values = []
    this.#publishInvalidations()
    this.#publishInvalidation(undefined, 'local')
    const outcome = await sent
    this.#drainRedisReports()
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
    return this.#namespace
  }

  /**
   * Runs `fn` with `waitUntil` as the hook for every background refresh started inside it (by
   * any cache), unless a call gives its own. For frameworks that hand out `waitUntil` per request.
   */
  withWaitUntil(waitUntil, fn) {
    return withWaitUntil(waitUntil, fn)
  }

  async settle() {
    await Promise.all([...this.#background])
  }

  async close() {
    if (this.#closed) return
    this.#closed = true
    closeEngine(this.#id)
    // The engine's clear voided the index already; its keys go too.
    this.#fresh?.clear()
    this.#values = []
    for (const control of this.#loads) control.abort(closedError())
    this.#loads.clear()
  }

  /** For tests: loads in flight (engine and facade) and entries held. Not part of the API. */
  _debugCounts() {
    const [engineFlights, entries, lockWaiters, unsentWrites, inboxKeys, keptInvalidations, refreshing] = debugCounts(this.#id)
    const facadeFlights = this.#flights.size
    return { engineFlights, facadeFlights, background: this.#background.size, entries, lockWaiters, unsentWrites, inboxKeys, keptInvalidations, refreshing }
  }
}

// The state of a hit (see HIT_SLOT_SHIFT), as the hit channel names it.
function hitState(n) {
  return HIT_STATES[(n >> HIT_KIND_SHIFT) & HIT_KIND_MASK]
}

module.exports = { StampedeCache }
