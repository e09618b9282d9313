'use strict'
// The single-key flight driver: a getOrLoad past the hot path (lookup, then serve, join or
// lead), a flight's gate in Redis, its loader call (ctx, loadTimeout, tracing), its write-back
// and end, and the background refresh of one stale key. A batch's keys are flights of this
// driver too, whose loader hands them to the batch (lib/many.js). State: lib/core.js.

const native = require('../binding.js')
const { engine } = require('./engine.js')
const { StampedeCacheError, invalidArgument, closedError, abortError, withSignal } = require('./errors.js')
const { loadChannel, hitChannel, missChannel, coalesceChannel, lockChannel, loadTimeoutChannel, loadTraced } = require('./channels.js')
const { asLoadOf, inLoad, inLoadOf } = require('./reentry.js')
const { UNREADABLE, toStored } = require('./codec.js')
const { checkTags } = require('./keys.js')
const { hitState } = require('./core.js')

const { beginRefresh, complete, fail, skip, noteLoaderCall, defaultPolicy } = native
const { redisGate, abandon, writeBack, finishWrite } = native
const { HIT_SLOT_SHIFT, HIT_REFRESH, STEP_KINDS, STEP_SERVE, STEP_LEAD } = native
const { POLICY_TTL, POLICY_HARD_TTL, POLICY_NEGATIVE_TTL, POLICY_LOAD_TIMEOUT } = native
// What a flight is for (redisGate's purpose), and the reason the channels give it.
const { PURPOSE_COLD, PURPOSE_REFRESH, PURPOSE_FORCE, PURPOSE_PAST_VALUE, REASONS } = native
const { GATE_FOUND, GATE_SKIP, GATE_CLOSED, LOCK_NONE, LOCK_OUTCOMES, DROPPED } = native
const noop = () => {}
/** What a call without options means (see callOptions in lib/core.js). */
const NO_OPTIONS = Object.freeze({ policy: null, signal: undefined, waitUntil: undefined, force: false, tags: null })

// The flight's own promise when this call leads or joins one (no async wrapper around it: two
// microtask turns less per read), else a promise of the value or of the error.
function getOrLoadSlow(sc, key, loader, options) {
  try {
    return startGetOrLoad(sc, key, loader, options)
  } catch (err) {
    return Promise.reject(err)
  }
}

function startGetOrLoad(sc, key, loader, options) {
  if (sc.closed) throw closedError()
  const o = options === undefined ? NO_OPTIONS : sc.callOptions(options)
  const { policy, signal, force } = o
  const k = engine.encodeKey(key)
  if (signal?.aborted) throw abortError(signal)
  if (inLoad() && inLoadOf(sc.store + k)) {
    const nested = loadNested(sc, k, loader, policy)
    return signal ? withSignal(nested, signal) : nested
  }
  sc.watchInvalidations()
  // One number: n * STEP_KINDS + kind (see `lookup` in src/node/local.rs).
  const looked = engine.lookup(sc.id, k, policy, force)
  const step = { kind: looked % STEP_KINDS, n: Math.floor(looked / STEP_KINDS) }
  if (step.kind === STEP_SERVE) {
    const value = sc.values[step.n >> HIT_SLOT_SHIFT]
    sc.publishInvalidations()
    if (hitChannel.hasSubscribers) sc.publishHit(k, 'memory', hitState(step.n))
    if (step.n & HIT_REFRESH) startRefresh(sc, k, loader, o, value, -1)
    return Promise.resolve(value)
  }
  let load
  if (step.kind === STEP_LEAD) {
    const stale = force ? sc.currentValue(k) : undefined
    const purpose = force ? PURPOSE_FORCE : PURPOSE_COLD
    load = leadFlight(sc, { k, flight: step.n, loader, policy, stale, purpose, waitUntil: o.waitUntil, tags: o.tags, batch: undefined })
  } else {
    load = sc.flights.get(step.n)
  }
  // Once the flight is registered: a subscriber that calls the cache joins it.
  sc.publishInvalidations()
  if (missChannel.hasSubscribers) missChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k })
  if (step.kind !== STEP_LEAD && coalesceChannel.hasSubscribers) {
    coalesceChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k })
  }
  return signal ? withSignal(load, signal) : load
}

// A getOrLoad inside the load of its own key (lib/reentry.js), which would otherwise wait for
// the load it is part of: its loader runs now, alone, bounded by loadTimeout; its caller gets
// what a hit would return, and nothing is written (the enclosing load writes the key).
async function loadNested(sc, k, loader, policy) {
  const result = { policy, tags: null, skip: false, done: false }
  // No flight of the engine's: nothing is gated, written or ended.
  const f = { k, flight: -1, loader, policy, stale: undefined, purpose: PURPOSE_COLD, waitUntil: undefined, tags: null, batch: undefined }
  try {
    return toStored(sc.codec, await callLoader(sc, f, result)).stored
  } finally {
    result.done = true
  }
}

// Leads flight `f` and registers its promise, for callers to join. A flight's record `f`:
// - `k`: its key; `flight`: its id in the engine (-1 for a nested load, which has none);
// - `loader`: what loads the key (for a batch's key, batchLoader in lib/many.js);
// - `policy`: the call's (null: the constructor's); `tags`: the call's, or null;
// - `stale`: the value the load replaces (ctx.stale; what a refresh that ends early returns);
// - `purpose`: PURPOSE_COLD, PURPOSE_FORCE or PURPOSE_REFRESH;
// - `waitUntil`: the call's, for the refresh a stale value from Redis starts;
// - `batch`: the getOrLoadMany batch whose loadMany loads this key (lib/many.js), else undefined.
// Each is made as an object literal with these fields in this order (one shape).
function leadFlight(sc, f) {
  const load = runFlight(sc, f)
  sc.flights.set(f.flight, load)
  return load
}

// One flight: ask Redis first (if configured), then call the loader if still needed. Its
// first await comes before the loader runs, so the flight is registered by then (leadFlight): a
// loader that reads the same key joins its own flight instead of finding an unknown one.
async function runFlight(sc, f) {
  const { k, flight, policy, stale, purpose, batch } = f
  let gate = null
  if (!sc.redis) {
    await undefined
  } else {
    // A batch's cold keys passed their gates together (batchGates in lib/many.js).
    const first = batch?.gates?.get(k)
    gate = first === undefined ? await askGate(sc, k, purpose, purpose, flight) : await first
    // A value this cache's serializer cannot read (another custom serializer, corrupt data)
    // is a miss: look again, taking the lock past it. A few times at most, then load without
    // Redis (nothing is written there).
    for (let tries = 0; gate.kind === GATE_FOUND; tries++) {
      const value = sc.decode(gate)
      if (value !== UNREADABLE) {
        sc.flights.delete(flight)
        const refresh = sc.adoptDecoded(k, flight, purpose === PURPOSE_COLD, gate, value, policy)
        // A cold load answered by Redis is that tier's hit; a refresh found refreshed
        // elsewhere is not a read.
        if (purpose === PURPOSE_COLD && hitChannel.hasSubscribers) sc.publishHit(k, 'redis', gate.state)
        // A cold caller given a stale value from Redis starts its refresh, as for a stale hit.
        // Its basis is the copy Redis answered (the in-process tier may keep none of it).
        if (refresh) {
          // A batch refreshes all its stale keys in one loadMany call.
          if (batch !== undefined) batch.stale(k, value, gate.freshUntil)
          else startRefresh(sc, k, f.loader, f, value, gate.freshUntil)
        }
        return value
      }
      if (tries >= 2) {
        gate = null
        break
      }
      gate = await askGate(sc, k, PURPOSE_PAST_VALUE, purpose, flight)
    }
  }
  if (gate !== null) {
    if (gate.kind === GATE_SKIP) {
      // Another process holds the refresh and will announce its result.
      sc.flights.delete(flight)
      abandon(sc.id, flight)
      return stale
    }
    if (gate.kind === GATE_CLOSED) {
      sc.flights.delete(flight)
      // A background refresh just ends (the stale value it had is what its readers got).
      if (purpose === PURPOSE_REFRESH) return stale
      throw closedError()
    }
  }
  return runLoader(sc, f)
}

// Asks Redis before `flight` loads (`ask`: the gate's purpose); publishes the lock outcome
// under the flight's `purpose`. What the gate answered for the flight's end (its lock, fence,
// stamp) stays in the engine: the answer says what to do and carries the value found.
async function askGate(sc, k, ask, purpose, flight) {
  // A cold read answered by the value another process's announcement carried is no promise.
  const asked = redisGate(sc.id, k, ask, flight)
  const gate = asked instanceof Promise ? await asked : asked
  if (gate.reported) sc.drainRedisReports()
  if (gate.lock !== LOCK_NONE && lockChannel.hasSubscribers) {
    lockChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k, reason: REASONS[purpose], outcome: LOCK_OUTCOMES[gate.lock] })
  }
  return gate
}

async function runLoader(sc, f) {
  const { k, flight, stale, purpose, batch } = f
  let { policy, tags } = f
  // A batch's keys are counted (and traced) once per loadMany call instead (callLoadMany in lib/many.js).
  if (batch === undefined) noteLoaderCall(sc.id, k, flight)
  const started = performance.now()
  // What the loader says about its result (ctx.setTtl, setTags, skipCache).
  const result = { policy, tags: null, skip: false, done: false }
  let value
  try {
    if (batch === undefined && loadTraced()) {
      const context = { cache: sc.cache, namespace: sc.namespace, key: k, reason: REASONS[purpose] }
      value = await loadChannel.tracePromise(callLoader, context, null, sc, f, result)
    } else {
      value = await callLoader(sc, f, result)
    }
  } catch (err) {
    result.done = true
    await loadFailed(sc, k, flight)
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
    ;({ text, stored, size, fmt } = toStored(sc.codec, value))
  } catch (err) {
    await loadFailed(sc, k, flight)
    throw err
  }
  if (result.skip) {
    await skipped(sc, k, flight)
    return stored
  }
  policy = result.policy
  const negative = stored === null || stored === undefined
  // The call's tags and the loader's; with neither, a refresh keeps the tags of the entry
  // it replaces (the engine knows them in process; the gate read them from Redis).
  tags = tags === null ? result.tags : result.tags === null ? tags : [...new Set([...tags, ...result.tags])]
  const loaded = { computeMs, negative, policy, tags, size }
  if (sc.redis) {
    // In Redis (or dropped there as older than what Redis holds, and the lock released)
    // before any caller sees it; the flight stays open meanwhile so callers keep joining it.
    const written = writeBack(sc.id, flight, loaded, text, fmt)
    sc.publishInvalidations()
    const outcome = await written
    sc.flights.delete(flight)
    sc.fill(finishWrite(sc.id, flight, outcome !== DROPPED), stored)
  } else {
    sc.flights.delete(flight)
    sc.fill(complete(sc.id, k, flight, loaded, purpose !== PURPOSE_COLD), stored)
  }
  sc.publishInvalidations()
  sc.drainRedisReports()
  return stored
}

// The loader called ctx.skipCache(): its callers get the result, nothing is written anywhere,
// and the lock is released (announced, so other processes waiting for it load themselves).
async function skipped(sc, k, flight) {
  sc.flights.delete(flight)
  skip(sc.id, k, flight)
  const sent = sc.redisFailed(flight, 0)
  if (sent !== undefined) await sent
}

// The loader's ctx. Its setters change `result` until the loader has settled, and are
// ignored after.
function loaderContext(sc, f, signal, result) {
  const id = sc.id
  return {
    key: f.k,
    stale: f.stale,
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
function callLoader(sc, f, result) {
  const { k, loader, policy, purpose } = f
  const control = new AbortController()
  sc.loads.add(control)
  const timeout = policy === null ? sc.loadTimeout : policy[POLICY_LOAD_TIMEOUT]
  let timer
  const loaded = new Promise((resolve, reject) => {
    if (timeout !== Infinity) {
      timer = setTimeout(() => {
        const err = new StampedeCacheError('ERR_LOAD_TIMEOUT', `the loader of ${JSON.stringify(k)} ran longer than loadTimeout (${timeout} ms)`)
        if (loadTimeoutChannel.hasSubscribers) {
          loadTimeoutChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k, reason: REASONS[purpose], timeout })
        }
        control.abort(err)
        reject(err)
      }, timeout)
      // An idle cache never keeps the process alive; a loader that does work keeps it alive itself.
      timer.unref()
    }
    // A loader may throw synchronously or return a plain value: both become this promise.
    Promise.resolve()
      .then(() => asLoadOf(sc.store + k, () => loader(loaderContext(sc, f, control.signal, result))))
      .then(resolve, reject)
  })
  return loaded.finally(() => {
    clearTimeout(timer)
    sc.loads.delete(control)
  })
}

async function loadFailed(sc, k, flight) {
  sc.flights.delete(flight)
  const retryAfter = fail(sc.id, k, flight)
  const sent = sc.redisFailed(flight, retryAfter)
  if (sent !== undefined) await sent
}

// Starts the background refresh the engine asked for and hands it to waitUntil at once.
// `o`: the call's policy, waitUntil and tags (its options, NO_OPTIONS, or the flight that found
// the value stale); `stale`: the value served. `seen`: the fresh-until of the copy the caller
// was served from Redis (-1: from the in-process tier), the copy the refresh replaces.
function startRefresh(sc, k, loader, o, stale, seen) {
  const flight = beginRefresh(sc.id, k, seen)
  if (flight < 0) return
  const load = leadFlight(sc, { k, flight, loader, policy: o.policy, stale, purpose: PURPOSE_REFRESH, waitUntil: undefined, tags: o.tags, batch: undefined })
  const done = load.then(noop, (err) => sc.report(err, 'refresh', k))
  sc.keepInBackground(done, o.waitUntil, k)
}

module.exports = { NO_OPTIONS, getOrLoadSlow, leadFlight, runFlight, askGate, startRefresh }
