'use strict'
// The batch flight driver: getOrLoadMany past its hits (the first read from Redis, then the
// keys' lookups, gates and flights in slices), the loadMany calls its led keys go to (rounds),
// the background refresh of a batch's stale keys, and a getOrLoadMany nested in a load. Each
// led key is a flight of lib/flight.js whose loader hands it to the batch (lib/batch.js holds
// the batch's own record). State: lib/core.js.

const native = require('../binding.js')
const { engine } = require('./engine.js')
const { StampedeCacheError, invalidArgument, closedError, abortError, isClosedError, withSignal, isError } = require('./errors.js')
const { loadChannel, hitChannel, missChannel, coalesceChannel, lockChannel, loadTimeoutChannel, loadTraced } = require('./channels.js')
const { asLoadOfMany, inLoad, inLoadOf } = require('./reentry.js')
const { UNREADABLE, toStored } = require('./codec.js')
const { Batch, Outcome, ColdKey, checkBatchKeys, keyLengths, inSlices, LEADING } = require('./batch.js')
const { hitState } = require('./core.js')
const { NO_OPTIONS, leadFlight, runFlight, askGate } = require('./flight.js')

const { peek, peekAt, defaultPolicy } = native
const { redisGateMany, redisFetchMany, adoptMany, noteBatchCall, beginBatchRefresh, GATE_WAIT } = native
// A batch answer's per-key codes (see `Batch` in src/node/batch.rs).
const { BATCH_STATE_SHIFT } = native
const { HIT_SLOT_SHIFT, HIT_REFRESH, HIT_STATES, STEP_KINDS, STEP_SERVE, STEP_LEAD } = native
const { POLICY_LOAD_TIMEOUT, POLICY_BETA } = native
const { PURPOSE_COLD, PURPOSE_REFRESH, PURPOSE_FORCE, REASONS } = native
const { GATE_FOUND, GATE_MISSING, LOCK_NONE, LOCK_OUTCOMES } = native
// A hit with none of these bits is fresh and asks for no refresh (see lib/cache.js).
const HIT_FLAGS = (1 << HIT_SLOT_SHIFT) - 1
// A key of a getOrLoadMany call's first read that Redis did not answer with a value (readFirst).
const MISSED = Symbol('missed')
const noop = () => {}
const identity = (x) => x
/** The ctx of each key of a nested loadMany call (loadManyNested): nothing is cached, so nothing to set. */
const NESTED_BATCH_CTX = Object.freeze({ setTtl: noop, setTags: noop })

function startGetOrLoadMany(sc, keys, loadMany, options) {
  if (sc.closed) throw closedError()
  checkBatchKeys(keys)
  if (typeof loadMany !== 'function') {
    throw invalidArgument(`loadMany must be a function, got ${loadMany === null ? 'null' : typeof loadMany}`)
  }
  const o = options === undefined ? NO_OPTIONS : sc.callOptions(options, 'getOrLoadMany')
  const { policy, signal, force } = o
  const n = keys.length
  const out = new Array(n)
  // The call's record: `out` its answers by position; `stale` the keys it found stale (each
  // { k, key, value, seen? }), refreshed together.
  const call = { keys, out, stale: null, loadMany, policy, signal, waitUntil: o.waitUntil, force, tags: o.tags, options }
  // Hits first, on getOrLoad's hot path (a string key), the other positions below. Options
  // other than beta shape only what a load writes, so the hits are the same with them; a
  // beta of the call's own decides each hit's early refresh at that beta (peekAt), as
  // getOrLoad with it would, and the index of fresh entries (proved at the constructor's) is
  // not asked. forceRefresh serves nothing; an aborted signal rejects as getOrLoad's does
  // (after the keys are checked, below).
  let rest = null
  if (!force && !signal?.aborted && !sc.keepsNone) {
    const beta = policy === null ? sc.beta : policy[POLICY_BETA]
    const hot = beta === sc.beta
    const fresh = hot ? sc.fresh : null
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
          out[i] = sc.values[slot]
          if (hitChannel.hasSubscribers) sc.publishHit(key, 'memory', 'fresh')
          continue
        }
      }
      const epoch = fresh === null ? 0 : fresh.epoch()
      const r = hot ? peek(sc.id, key) : peekAt(sc.id, key, beta)
      if (r < 0) {
        ;(rest ??= []).push(i)
        continue
      }
      const value = sc.values[r >> HIT_SLOT_SHIFT]
      if (fresh !== null && (r & HIT_FLAGS) === 0) fresh.offer(key, r >> HIT_SLOT_SHIFT, epoch)
      out[i] = value
      if (hitChannel.hasSubscribers) sc.publishHit(key, 'memory', hitState(r))
      if (r & HIT_REFRESH) (call.stale ??= []).push({ k: key, key, value })
    }
    if (rest === null) {
      if (call.stale !== null) refreshMany(sc, call.stale, call)
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
    const nested = loadManyNested(sc, call, rest, encoded)
    if (nested !== null) return signal ? withSignal(nested, signal) : nested
  }
  sc.watchInvalidations()
  // The keys the in-process tier did not have are read from Redis first, in one batch as
  // getMany reads them (on the read lane when it can), with no flight, lookup or lock bid per
  // key: only the keys Redis does not have are looked up, led and bid for (readFirst). A
  // profile of a warm batch of 1,000 keys with l1: false put 3.3 ms of its 7 ms in that
  // per-key machinery (a lookup, a flight and its record, its adopt and end). forceRefresh
  // loads every key now: nothing is read first.
  if (sc.redis && !force) {
    const read = readFirst(sc, call, rest, encoded)
    return signal ? withSignal(read, signal) : read
  }
  const settled = loadRest(sc, call, rest, encoded, false, false)
  return signal ? withSignal(settled, signal) : settled
}

// A getOrLoadMany call's keys not held in process (`rest`: their positions in `call.keys`,
// `encoded` their keys), read from Redis in one batch first: those Redis has are served (a
// stale one refreshed with the call's stale keys, `call.stale`), the others go to loadRest,
// which bids for their locks without reading them again. The call's policy (its beta decides
// the early refresh of each value read, as for a cold getOrLoad with it), waitUntil and tags.
function readFirst(sc, call, rest, encoded) {
  const { keys, out, policy } = call
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
    if (missChannel.hasSubscribers) missChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k })
  }
  let read
  try {
    read = redisFetchMany(sc.id, asked.join(''), keyLengths(asked), false)
  } catch (err) {
    return Promise.reject(err)
  }
  return read.then((batch) => {
    const [codes, texts, freshUntil, others, found, reported] = batch
    if (reported) sc.drainRedisReports()
    const values = sc.batchValues(codes, texts, found)
    const flights = new Float64Array(asked.length)
    for (let u = 0; u < asked.length; u++) flights[u] = codes[u] >= 0 && values[u] !== UNREADABLE ? -1 : -2
    const adopted = adoptMany(sc.id, found, flights, true, policy === null ? -1 : policy[POLICY_BETA])
    sc.fillMany(adopted, values)
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
          if (adopted[u] & 1) (call.stale ??= []).push({ k, key: keys[rest[firstOf[u]]], value, seen: freshUntil[u] })
        } else looked = false
      } else {
        // A value an announcement carried (fresh: just written), or none.
        const answer = others[-1 - code]
        if (answer.kind !== GATE_MISSING) looked = false
        if (answer.kind === GATE_FOUND) {
          const decoded = sc.decode(answer)
          if (decoded !== UNREADABLE) {
            sc.adoptDecoded(k, -1, false, answer, decoded)
            value = decoded
            state = answer.state
          }
        }
      }
      served[u] = value
      if (value !== MISSED && hitChannel.hasSubscribers) sc.publishHit(k, 'redis', state)
    }
    sc.publishInvalidations()
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
      if (call.stale !== null) refreshMany(sc, call.stale, call)
      return out
    }
    // The caller's signal is the whole call's (see startGetOrLoadMany).
    return loadRest(sc, call, missed, missedKeys, true, looked)
  })
}

// The rest of a getOrLoadMany call: its keys at positions `rest` of `call.keys` (`encoded`:
// their keys) are looked up, joined or led, each once; `call.out` holds the other positions'
// values, and `call.stale` the call's stale keys, refreshed with those found stale in Redis.
// `readFirst`: Redis was read for these keys just now (readFirst), and their misses published;
// `looked`: it had none of them, so only their locks are bid for. The caller's signal is the
// caller's to apply.
function loadRest(sc, call, rest, encoded, readFirst, looked) {
  const { keys, out, loadMany, policy, force } = call
  const b = newBatch(sc, loadMany, policy, force ? PURPOSE_FORCE : PURPOSE_COLD)
  const gated = sc.redis && !force
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
    const looked = engine.lookup(sc.id, k, policy, force)
    const kind = looked % STEP_KINDS
    const m = Math.floor(looked / STEP_KINDS)
    if (kind === STEP_SERVE) {
      const value = sc.values[m >> HIT_SLOT_SHIFT]
      if (hitChannel.hasSubscribers) sc.publishHit(k, 'memory', hitState(m))
      if (m & HIT_REFRESH) (call.stale ??= []).push({ k, key: keys[rest[j]], value })
      answers.push(value)
      outcome.push(false)
      return
    }
    if (!readFirst && missChannel.hasSubscribers) missChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k })
    pending++
    outcome.push(true)
    if (kind !== STEP_LEAD) {
      if (coalesceChannel.hasSubscribers) coalesceChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: k })
      answers.push(new Outcome(settledOne).follow(sc.flights.get(m)))
      return
    }
    b.lead(k, keys[rest[j]])
    if (gated) {
      // The flight's outcome now (callers join it); its gate answers with every cold key's
      // (batchGates), which serves what Redis has without running the flight at all.
      const c = new ColdKey(k, m, () => {
        batchDecided(sc, b, k)
        settledOne()
      })
      sc.flights.hold(m, c)
      cold.push(c)
      answers.push(c)
      return
    }
    const decided = () => batchDecided(sc, b, k)
    const stale = force ? sc.currentValue(k) : undefined
    const f = {
      k,
      flight: m,
      loader: batchLoader(sc, b, k, m),
      policy: b.keyPolicy,
      stale,
      purpose: b.purpose,
      waitUntil: call.waitUntil,
      tags: call.tags,
      batch: b,
    }
    const load = leadFlight(sc, f)
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
    sc.publishInvalidations()
    // The call's stale keys, and those its cold keys found stale in Redis, in one refresh.
    b.refreshLate = (entries) => refreshMany(sc, entries, call)
    b.passed = () => {
      const found = b.staleFound
      b.staleFound = null
      const stale = call.stale
      const entries = stale === null ? found : found.length === 0 ? stale : [...stale, ...found]
      if (entries.length > 0) b.refreshLate(entries)
    }
    if (cold.length > 0) batchGates(sc, b, cold, call, looked)
    batchDecided(sc, b, LEADING)
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
  return settled
}

function newBatch(sc, loadMany, policy, purpose) {
  const keyPolicy = [...(policy ?? defaultPolicy(sc.id))]
  const timeout = keyPolicy[POLICY_LOAD_TIMEOUT]
  keyPolicy[POLICY_LOAD_TIMEOUT] = Infinity
  return new Batch(loadMany, purpose, keyPolicy, timeout)
}

// The cold keys' gates, in one go (one pipelined read, then one pipelined lock bid, per Redis
// node): a key Redis has is served at once; the others' flights run with their answers. A key
// another process holds is decided (the batch does not wait for it) and then waits for that
// process's value alone, as getOrLoad does. `cold`: their ColdKeys; `call`: the
// getOrLoadMany call's record (its waitUntil and tags). `looked`: Redis was read for these keys
// just now and had none of them: bids only.
function batchGates(sc, b, cold, call, looked) {
  const run = (c, gate) => {
    // Without a gate here, runFlight asks for the key's own.
    if (gate !== undefined) b.gates.set(c.k, gate)
    const loader = batchLoader(sc, b, c.k, c.flight)
    const f = {
      k: c.k,
      flight: c.flight,
      loader,
      policy: b.keyPolicy,
      stale: undefined,
      purpose: PURPOSE_COLD,
      waitUntil: call.waitUntil,
      tags: call.tags,
      batch: b,
    }
    c.follow(runFlight(sc, f))
  }
  const each = (batch) => {
    const [codes, texts, freshUntil, others, found, reported] = batch
    if (reported) sc.drainRedisReports()
    // The keys Redis had end their flights here, all adopted in one call; a value this cache's
    // serializer cannot read is not adopted: its flight runs, and looks again past it.
    const values = sc.batchValues(codes, texts, found)
    const flights = new Float64Array(cold.length)
    for (let i = 0; i < cold.length; i++) {
      flights[i] = codes[i] >= 0 && values[i] !== UNREADABLE ? cold[i].flight : -2
      if (flights[i] >= 0) sc.flights.delete(cold[i].flight)
    }
    const adopted = adoptMany(sc.id, found, flights, true, b.keyPolicy[POLICY_BETA])
    sc.fillMany(adopted, values)
    // After the values are in place: a subscriber may read the cache.
    sc.publishInvalidations()
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
        if (hitChannel.hasSubscribers) sc.publishHit(c.k, 'redis', HIT_STATES[(code >> BATCH_STATE_SHIFT) & 3])
        // A stale value served from Redis is refreshed with the batch's (its basis: this copy).
        if (adopted[i] & 1) b.stale(c.k, value, freshUntil[i])
        c.resolve(value)
        return
      }
      const a = others[-1 - code]
      if (a.kind === GATE_WAIT) {
        batchDecided(sc, b, c.k)
        run(c, askGate(sc, c.k, PURPOSE_COLD, PURPOSE_COLD, c.flight))
        return
      }
      if (a.lock !== LOCK_NONE && lockChannel.hasSubscribers) {
        lockChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: c.k, reason: REASONS[PURPOSE_COLD], outcome: LOCK_OUTCOMES[a.lock] })
      }
      if (a.kind !== GATE_FOUND || !servedFromRedis(sc, b, c, a)) run(c, a)
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
      sc.id,
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

// A cold key of a batch that Redis has: ends its flight with that value, as runFlight does for
// one key (adopted, then its stale value refreshed with the batch's). False when this cache's
// serializer cannot read it: then the flight runs, and looks again past it.
function servedFromRedis(sc, b, c, answer) {
  const value = sc.decode(answer)
  if (value === UNREADABLE) return false
  sc.flights.delete(c.flight)
  const refresh = sc.adoptDecoded(c.k, c.flight, true, answer, value, b.keyPolicy)
  if (hitChannel.hasSubscribers) sc.publishHit(c.k, 'redis', answer.state)
  if (refresh) b.stale(c.k, value, answer.freshUntil)
  c.resolve(value)
  return true
}

// A led key's loader: hands the key (and its ctx) to the batch's next loadMany call.
// `flight`: the key's, whose end the results' slices wait for (callLoadMany).
function batchLoader(sc, b, k, flight) {
  return (ctx) =>
    new Promise((resolve, reject) => {
      b.round.push({ k, ctx, resolve, reject, flight })
      batchDecided(sc, b, k)
    })
}

// Key `k` of batch `b` has asked or is decided otherwise; the first loadMany call goes once
// every led key is, later ones in the next microtask after a late key asks.
function batchDecided(sc, b, k) {
  if (!b.undecided.delete(k)) {
    if (b.gatesPassed && b.round.length > 0 && !b.roundScheduled) {
      b.roundScheduled = true
      queueMicrotask(() => {
        b.roundScheduled = false
        fireRound(sc, b)
      })
    }
    return
  }
  if (b.undecided.size > 0) return
  b.gatesPassed = true
  if (b.passed !== null) b.passed()
  fireRound(sc, b)
}

function fireRound(sc, b) {
  const entries = b.round
  if (entries.length === 0) return
  b.round = []
  // Keys ask as their gates answer (with Redis, in any order).
  entries.sort((x, y) => b.rank.get(x.k) - b.rank.get(y.k))
  callLoadMany(sc, b, entries)
}

// One loadMany call for `entries`, timed by loadTimeout; settles each key's loader with its
// result: a value (null/undefined: not found), or its Error.
function callLoadMany(sc, b, entries) {
  const keys = entries.map((e) => b.keyOf.get(e.k))
  const names = entries.map((e) => e.k)
  noteBatchCall(sc.id, b.purpose === PURPOSE_REFRESH)
  const control = new AbortController()
  sc.loads.add(control)
  let timer
  let settled = false
  const settle = (each) => {
    if (settled) return
    settled = true
    clearTimeout(timer)
    sc.loads.delete(control)
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
      if (!sc.redis) return
      const flight = sc.flights.get(e.flight)
      if (flight !== undefined) ends.push(flight)
    }
    inSlices(entries.length, one, noop, (err) => sc.report(err, 'loadMany', undefined), pause)
  }
  const failAll = (err) => settle((e) => e.reject(err))
  if (b.timeout !== Infinity) {
    timer = setTimeout(() => {
      const err = new StampedeCacheError('ERR_LOAD_TIMEOUT', `loadMany of ${keys.length} keys ran longer than loadTimeout (${b.timeout} ms)`)
      if (loadTimeoutChannel.hasSubscribers) {
        loadTimeoutChannel.publish({ cache: sc.cache, namespace: sc.namespace, key: names[0], keys: names, reason: REASONS[b.purpose], timeout: b.timeout })
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
  const store = sc.store
  const call = () => asLoadOfMany(new Set(names.map((n) => store + n)), () => b.loadMany(keys, ctx))
  const started = loadTraced()
    ? () => loadChannel.tracePromise(async () => call(), { cache: sc.cache, namespace: sc.namespace, key: names[0], keys: names, reason: REASONS[b.purpose] })
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

// Refreshes stale keys ({ k, key, value, seen? }) in the background in one loadMany call, as
// startRefresh refreshes one: handed to waitUntil at once; failures reported per key. `call`:
// the getOrLoadMany call's record (its loadMany, policy, waitUntil and tags).
function refreshMany(sc, entries, call) {
  const b = newBatch(sc, call.loadMany, call.policy, PURPOSE_REFRESH)
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
    const flight = beginBatchRefresh(sc.id, k, loads.length === 0, seen)
    if (flight < 0) return
    b.lead(k, key)
    const loader = batchLoader(sc, b, k, flight)
    const load = leadFlight(sc, {
      k,
      flight,
      loader,
      policy: b.keyPolicy,
      stale: value,
      purpose: PURPOSE_REFRESH,
      waitUntil: undefined,
      tags: call.tags,
      batch: b,
    })
    const decided = () => batchDecided(sc, b, k)
    load.then(decided, decided)
    loads.push(load.then(noop, (err) => sc.report(err, 'refresh', k)))
  }
  const end = () => {
    allLed = true
    batchDecided(sc, b, LEADING)
    ledAll()
  }
  inSlices(entries.length, lead, end, (err) => {
    sc.report(err, 'refresh', undefined)
    end()
  })
  if (allLed && loads.length === 0) return
  const done = led.then(() => Promise.all(loads)).then(noop)
  sc.keepInBackground(done, call.waitUntil, undefined)
}

// A getOrLoadMany inside the load of some of its keys (lib/reentry.js): those keys go to one
// loadMany call of their own, now, whose results are cached nowhere (the enclosing loads write
// them); the call's other keys are answered as usual. `rest`: the positions of `call.keys` not
// served yet (`encoded`: their keys); `call.out`: the call's answers so far. Null when no key is
// in a load.
function loadManyNested(sc, call, rest, encoded) {
  const { keys, out, loadMany, policy, options } = call
  let own = null
  let others = null
  for (let j = 0; j < rest.length; j++) {
    if (inLoadOf(sc.store + encoded[j])) (own ??= []).push(j)
    else (others ??= []).push(rest[j])
  }
  if (own === null) return null
  const b = newBatch(sc, loadMany, policy, PURPOSE_COLD)
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
        return toStored(sc.codec, value).stored
      } catch (err) {
        return err
      }
    }, identity)
    answers.set(k, answer)
  }
  callLoadMany(sc, b, entries)
  const mine = Promise.all(own.map((j) => answers.get(encoded[j])))
  const theirs =
    others === null
      ? null
      : sc.cache.getOrLoadMany(
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

module.exports = { startGetOrLoadMany }
