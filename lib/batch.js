'use strict'
// Many keys at once (getOrLoadMany, getMany): the batch a call's keys are loaded in, and the
// check of its `keys` argument. The flights themselves are the cache's (lib/cache.js).
const { setImmediate } = require('node:timers')
const { invalidArgument } = require('./errors.js')

const noop = () => {}
/** Keys a getMany or getOrLoadMany call takes at most. */
const MAX_BATCH_KEYS = 10_000
/**
 * Keys a batch's per-key work handles in one stretch of the JS thread before it lets the event
 * loop run (docs/CONTRACT.md, Many keys at once: a 10,000-key cold batch holds the loop about
 * 50 ms at a time at most). A cold key costs the facade 20-60 us (its flight, loader context,
 * promises and engine calls), so a slice is a few ms to about 30 on a busy machine; batches of
 * up to this many keys run in one stretch, as before.
 */
const SLICE_KEYS = 512

// Calls each(i) for i in [0, n), SLICE_KEYS at a time: the first slice at once, each next one
// after the event loop has run (setImmediate), so the microtasks a slice starts (its flights'
// promise chains) end before the next slice begins. Then done(). A throw stops the slices and
// goes to fail (a later slice has no caller to throw to). `pause()`, if given, may return a
// promise that the next slice waits for too (what the slice started that answers later).
function inSlices(n, each, done, fail, pause) {
  let i = 0
  const slice = () => {
    try {
      const end = Math.min(n, i + SLICE_KEYS)
      for (; i < end; i++) each(i)
    } catch (err) {
      fail(err)
      return
    }
    if (i >= n) return done()
    const wait = pause === undefined ? undefined : pause()
    if (wait === undefined) setImmediate(slice)
    else wait.then(() => setImmediate(slice))
  }
  slice()
}

// Holds a batch's `undecided` open while its keys are still being led in slices (see inSlices):
// the first loadMany call waits for every key, not the first slice's.
const LEADING = Symbol('leading')

// One loadMany call's worth of keys: a getOrLoadMany call's cold keys, or the refresh of its stale
// keys. Each key it leads is an ordinary flight (its gate, fencing, write-back and end are
// getOrLoad's) whose loader, once the key has passed its gate, hands the key to the batch
// (#batchLoader). Once every led key has either asked or is decided otherwise (served from Redis,
// waiting for another process's lock, failed), the keys that asked go to one loadMany call (a
// round): so a batch never waits for keys someone else loads, and overlapping batches never wait
// for each other. A key that asks later (the lock holder it waited for failed, or its lock
// expired, and this process took over) goes to a later round.
class Batch {
  constructor(loadMany, purpose, keyPolicy, timeout) {
    this.loadMany = loadMany
    /** PURPOSE_COLD, PURPOSE_FORCE or PURPOSE_REFRESH. */
    this.purpose = purpose
    /** Each key's flight's policy: the call's, with no loadTimeout (the loadMany call is timed). */
    this.keyPolicy = keyPolicy
    /** ms the loadMany call may run (Infinity: none). */
    this.timeout = timeout
    /** The key as the caller gave it (what loadMany gets), by encoded key, in the order of `keys`. */
    this.keyOf = new Map()
    /** Each key's position in keyOf: loadMany gets its keys in that order, whichever asked first. */
    this.rank = new Map()
    /** Led keys that have neither asked nor been decided otherwise yet. */
    this.undecided = new Set()
    /** Every led key is decided: rounds fire as keys ask. */
    this.gatesPassed = false
    /** The keys waiting for the next loadMany call: { k, ctx, resolve, reject }. */
    this.round = []
    this.roundScheduled = false
    /** With Redis, a cold key's gate answer (all passed in one go, #batchGates), by key. */
    this.gates = null
    /** Stale values found in Redis for cold keys, refreshed with the call's stale keys. */
    this.staleFound = []
    /** Takes stale entries found after the refresh batch started. */
    this.refreshLate = noop
    /** A loadMany result of the wrong length: the call rejects with it. */
    this.error = null
    /** Called once every led key is decided (a cold batch starts its stale keys' refresh). */
    this.passed = null
  }

  // Registers a key this batch leads (`key`: as the caller gave it).
  lead(k, key) {
    this.rank.set(k, this.keyOf.size)
    this.keyOf.set(k, key)
    this.undecided.add(k)
  }

  // A cold key's flight found a stale value in Redis (served; refreshed in the background).
  // `seen`: that value's freshUntil, the basis of its refresh.
  stale(k, value, seen) {
    const entry = { k, key: this.keyOf.get(k), value, seen }
    if (this.staleFound !== null) this.staleFound.push(entry)
    else this.refreshLate([entry])
  }
}

const PENDING = 0
const FULFILLED = 1
const REJECTED = 2

// What one key of a getOrLoadMany call came to, with no promise unless something awaits it (a
// caller joining the key's flight: `load`). A promise per key, its `then` and allSettled's
// result object were most of the facade's time in a warm batch of 1,000 keys served from Redis.
// `onSettled` runs once, at once, when it settles.
class Outcome {
  constructor(onSettled) {
    this.state = PENDING
    this.result = undefined
    this.onSettled = onSettled
    this.promise = null
    this.fulfil = null
    this.fail = null
  }

  resolve(value) {
    if (this.state !== PENDING) return
    this.state = FULFILLED
    this.result = value
    if (this.fulfil !== null) this.fulfil(value)
    this.onSettled()
  }

  reject(err) {
    if (this.state !== PENDING) return
    this.state = REJECTED
    this.result = err
    if (this.fail !== null) this.fail(err)
    this.onSettled()
  }

  // Settles as `promise` does (a value that is not one: with it, at once).
  follow(promise) {
    if (typeof promise?.then !== 'function') this.resolve(promise)
    else {
      promise.then(
        (v) => this.resolve(v),
        (e) => this.reject(e),
      )
    }
    return this
  }

  get rejected() {
    return this.state === REJECTED
  }

  /** The promise of it (made when first asked for): the flight's, for callers that join it. */
  get load() {
    if (this.promise === null) {
      if (this.state === FULFILLED) this.promise = Promise.resolve(this.result)
      else if (this.state === REJECTED) this.promise = Promise.reject(this.result)
      else {
        this.promise = new Promise((resolve, reject) => {
          this.fulfil = resolve
          this.fail = reject
        })
      }
    }
    return this.promise
  }

  // The flight table empties a holder it drops (see Flights); the outcome is still the call's.
  set load(_) {}
}

// A cold key of a getOrLoadMany call with Redis: its gate answers with the batch's (#batchGates).
class ColdKey extends Outcome {
  constructor(k, flight, onSettled) {
    super(onSettled)
    this.k = k
    this.flight = flight
  }
}

// Checks a getMany/getOrLoadMany `keys` argument (each key is checked by encodeKey).
function checkBatchKeys(keys) {
  if (!Array.isArray(keys)) throw invalidArgument(`keys must be an array, got ${keys === null ? 'null' : typeof keys}`)
  if (keys.length > MAX_BATCH_KEYS) throw invalidArgument(`at most ${MAX_BATCH_KEYS} keys a call, got ${keys.length}`)
}

// A batch's keys as the binding takes them: one string, and each key's length (UTF-16 units).
// An array of strings crossed at a few N-API calls a key.
function keyLengths(keys) {
  const lengths = new Uint32Array(keys.length)
  for (let i = 0; i < keys.length; i++) lengths[i] = keys[i].length
  return lengths
}

module.exports = { Batch, Outcome, ColdKey, checkBatchKeys, keyLengths, inSlices, LEADING, SLICE_KEYS }
