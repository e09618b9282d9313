'use strict'
// Fenced, ordered writes (docs/CONTRACT.md getOrLoad 9-10 and "Redis"); lock waiters woken when
// the bus drops or the cache closes; a lock key without an expiry; loadTimeout.
//
// Every test starts its own redis-server on a free 127.0.0.1 port and real worker processes
// (__test__/fixtures/redis-worker.js), each with its own StampedeCache. Races are made
// deterministic with gated loaders: a loader run through the worker's `run` command that blocks
// on a promise the test opens later (`openGate`), so "B writes while A's load is in flight" is
// an ordering the test controls, not a timing it hopes for. Each test checks the final state in
// Redis (raw client) and in every instance, and counts loader calls.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, waitFor, sleep, killAllSync } = require('./helpers/redis-server')
const { busFlushed } = require('./helpers/eventually')

/** A hang fails its test instead of blocking the run. */
const TEST_TIMEOUT = 45_000
/** What no read should return or load while an instance is only being looked at. */
const MUST_NOT_LOAD = 'must-not-load'

after(() => killAllSync())

/** Its own redis-server; `options` are every worker's (see setupRedis). */
const setup = (t, options = {}) => setupRedis(t, { options, prefix: 'scfence' })

/** Rejects with `what` when `promise` has not settled within `ms` (a hang fails, not blocks). */
function within(promise, ms, what) {
  let timer
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms)
    }),
  ]).finally(() => clearTimeout(timer))
}

// ---- gated loaders, run inside a worker ----------------------------------------------------

// Prepended to `run` bodies: gated(name, value) makes a loader that records its calls and its
// ctx.signal, reports when it starts, and settles only when the test opens gate `name` (with
// the default value, another value, or an error). Gates live on globalThis so a later `run`
// in the same worker can open them or read what happened.
const GATES = `
  const gates = (globalThis.__gates ??= new Map())
  function gated(name, value) {
    const g = { calls: 0, signals: [], startedAt: null, settledAt: null }
    g.gate = new Promise((resolve) => (g.open = resolve))
    g.started = new Promise((resolve) => (g.markStarted = resolve))
    gates.set(name, g)
    return async (ctx) => {
      g.calls++
      g.signals.push(ctx.signal)
      g.startedAt = Date.now()
      g.markStarted()
      const v = await g.gate
      g.settledAt = Date.now()
      return v === undefined ? value : v
    }
  }
`

// One getOrLoad of args.key with a gated loader; reports ready once the loader runs, resolves
// with the caller's outcome. With args.untilStarted (a stale read whose refresh runs in the
// background) it returns once the refresh's loader has started.
const LOAD_GATED = `${GATES}
  const loader = gated(args.name, args.value)
  const g = gates.get(args.name)
  g.started.then(() => tools.ready())
  const r = await tools.outcome(args.opts ? cache.getOrLoad(args.key, loader, args.opts) : cache.getOrLoad(args.key, loader))
  if (args.untilStarted) await g.started
  return r
`

const OPEN_GATE = `
  const g = globalThis.__gates.get(args.name)
  g.open(args.value)
  return true
`

const GATE_INFO = `
  const g = globalThis.__gates.get(args.name)
  return { calls: g.calls, aborted: g.signals.map((s) => s.aborted), startedAt: g.startedAt, settledAt: g.settledAt }
`

/**
 * Starts a gated load in `w` and waits until its loader runs. Returns `{ result, open(value) }`;
 * `result` is the caller's outcome (for a refresh: the stale value, at once).
 */
async function startGated(w, args, what) {
  const run = w.start('run', { body: LOAD_GATED, args })
  await within(Promise.race([run.ready, run.result]), 10_000, `${w.name}: the gated loader of ${what} to start`)
  return {
    result: run.result,
    open: (value) => w.request('run', { body: OPEN_GATE, args: { name: args.name, value } }),
  }
}

/** What `w` serves for `key` without loading: getOrLoad with a loader that must not run. */
async function serves(w, key) {
  const r = await w.request('read', { key, loader: { value: MUST_NOT_LOAD } })
  const x = r.results[0]
  assert.ok(x.ok, `${w.name}: getOrLoad(${key}) rejected: ${x.code} ${x.message}`)
  return { value: x.undef ? undefined : x.value, loaderCalls: r.loaderCallsDuring }
}

/** Asserts that every instance serves `expected` for `key` from cache (no loader call). */
async function assertServed(workers, key, expected, label) {
  for (const w of workers) {
    const s = await serves(w, key)
    assert.deepEqual(s.value, expected, `${label}: ${w.name} serves ${JSON.stringify(s.value)}, expected ${JSON.stringify(expected)}`)
    assert.equal(s.loaderCalls, 0, `${label}: ${w.name} called a loader instead of serving the cached value`)
  }
}

/** Asserts that no instance holds `key` (get(), which never loads, finds nothing). */
async function assertAbsent(workers, key, label) {
  for (const w of workers) {
    const g = await w.request('get', { key })
    assert.ok(g.ok, `${label}: ${w.name} get rejected: ${g.code} ${g.message}`)
    assert.ok(g.undef, `${label}: ${w.name} still serves ${JSON.stringify(g.value)}`)
  }
}

// ---------------------------------------------------------------------------------------------

test('a load or refresh that began before a newer write never writes its result over it', { timeout: TEST_TIMEOUT }, async (t) => {
  await t.test('(a) set in B during a cold load in A: Redis, A and B all end with the set value', async (t) => {
    const { spawnWorker, stored } = await setup(t)
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'fence:set'
    const load = await startGated(A, { key, name: 'a', value: 'A-old' }, 'A cold load')
    await sleep(100)
    const s = await B.request('set', { key, value: 'new' })
    assert.ok(s.ok, `B's set: ${s.message}`)
    assert.deepEqual(await stored(key), { exists: true, value: 'new' }, "precondition: B's set is in Redis before A's load ends")
    await load.open()
    const a = await within(load.result, 10_000, "A's load to end")
    assert.ok(a.ok, `A's caller: ${a.code} ${a.message}`)
    assert.equal(a.value, 'A-old', "A's own caller still gets the value its load returned")
    await busFlushed([A, B])

    assert.deepEqual(await stored(key), { exists: true, value: 'new' }, "A's older load was written over B's set in Redis")
    await assertServed([A, B], key, 'new', 'after A loaded')
    const info = await A.request('run', { body: GATE_INFO, args: { name: 'a' } })
    assert.equal(info.calls, 1, "A's loader ran once")
  })

  await t.test('(b) delete in B during a cold load in A: the key stays absent everywhere', async (t) => {
    const { spawnWorker, stored } = await setup(t)
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'fence:delete'
    const load = await startGated(A, { key, name: 'a', value: 'A-old' }, 'A cold load')
    await sleep(100)
    const d = await B.request('delete', { key })
    assert.ok(d.ok, `B's delete: ${d.message}`)
    await load.open()
    const a = await within(load.result, 10_000, "A's load to end")
    assert.ok(a.ok, `A's caller: ${a.code} ${a.message}`)
    await busFlushed([A, B])

    assert.deepEqual(await stored(key), { exists: false }, "the deleted key came back in Redis with A's older load")
    await assertAbsent([A, B], key, 'after A loaded')
    const b = await B.request('read', { key, loader: { value: 'B-marker' } })
    assert.equal(b.results[0].value, 'B-marker', "B's getOrLoad gets its own loader's value, not A's")
    assert.equal(b.loaderCallsDuring, 1, "B's getOrLoad calls its loader: nothing was cached")
    assert.equal((await A.request('run', { body: GATE_INFO, args: { name: 'a' } })).calls, 1)
  })

  await t.test('(c) a stale-while-revalidate refresh in A races a delete in B: the key does not come back', async (t) => {
    const { spawnWorker, stored } = await setup(t)
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'fence:refresh'
    assert.ok((await A.request('set', { key, value: 'v1', opts: { ttl: 200, hardTtl: 60_000 } })).ok)
    assert.equal((await B.request('get', { key })).value, 'v1', 'B holds v1 too')
    await sleep(400) // stale in both, far from its hardTtl
    const load = await startGated(A, { key, name: 'r', value: 'A-refreshed', untilStarted: true }, 'A refresh')
    const a = await within(load.result, 10_000, "A's stale read")
    assert.equal(a.value, 'v1', 'A is served stale while its refresh runs in the background')
    const d = await B.request('delete', { key })
    assert.ok(d.ok, `B's delete: ${d.message}`)
    await load.open()
    await A.request('settle')
    await busFlushed([A, B])

    assert.deepEqual(await stored(key), { exists: false }, "A's refresh brought the deleted key back in Redis")
    await assertAbsent([A, B], key, 'after the refresh ended')
    const b = await B.request('read', { key, loader: { value: 'B-marker' } })
    assert.equal(b.results[0].value, 'B-marker')
    assert.equal(b.loaderCallsDuring, 1, "B's getOrLoad calls its loader: nothing was cached")
    assert.equal((await A.request('run', { body: GATE_INFO, args: { name: 'r' } })).calls, 1, 'one refresh ran')
  })

  await t.test("(d) A's lock expires mid-load and B takes it over: A's older result is not written over B's", async (t) => {
    const { redis, spawnWorker, stored, lkey } = await setup(t, { lockTtl: 200 })
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'fence:takeover'
    const load = await startGated(A, { key, name: 'a', value: 'A-old' }, 'A cold load')
    await waitFor(async () => (await redis.cmd('EXISTS', lkey(key))) === 0, { timeout: 5_000, interval: 10, what: "A's lock to expire" })
    const b = await B.request('read', { key, loader: { value: 'B-new' } })
    assert.equal(b.results[0].value, 'B-new', 'B took the lock over and loaded its own value')
    assert.equal(b.loaderCallsDuring, 1)
    assert.deepEqual(await stored(key), { exists: true, value: 'B-new' }, "precondition: B's value is in Redis")
    await load.open() // A's load, begun before B's, ends after it
    const a = await within(load.result, 10_000, "A's load to end")
    assert.ok(a.ok, `A's caller: ${a.code} ${a.message}`)
    await busFlushed([A, B])

    assert.deepEqual(await stored(key), { exists: true, value: 'B-new' }, "A's load, whose lock B had taken over, was written over B's value")
    await assertServed([A, B], key, 'B-new', 'after both loads')
    assert.equal((await A.request('run', { body: GATE_INFO, args: { name: 'a' } })).calls, 1)
    assert.equal((await B.request('loads', { key })).length, 1, 'B loaded once')
  })
})

// Writes of distinct keys `${prefix}${i}`, one run after another, each run two writes started
// together; returns the outcomes that rejected. A millisecond between runs lets the runtime go
// idle, as between an app's writes: that is when two writes started together ran as separate
// tasks and reached Redis in either order (back to back, the race shows far less often).
const ORDERED_WRITES = `
  const errors = []
  for (let i = 0; i < args.runs; i++) {
    await tools.sleep(1)
    const k = args.prefix + i
    const pair = args.mode === 'set-set'
      ? [cache.set(k, 1), cache.set(k, 2)]
      : [cache.set(k, 'x' + i), cache.delete(k)] // no await in between
    for (const r of await Promise.all(pair.map((p) => tools.outcome(p)))) {
      if (!r.ok) errors.push(k + ': ' + r.code + ' ' + r.message)
    }
  }
  return errors
`

// Reads every key of a run; `load` uses getOrLoad with a counting loader returning 'marker'.
const READ_ALL = `
  let calls = 0
  const out = []
  for (let i = 0; i < args.runs; i++) {
    const k = args.prefix + i
    const r = args.load
      ? await tools.outcome(cache.getOrLoad(k, async () => { calls++; return 'marker' }))
      : await tools.outcome(cache.get(k))
    out.push(r.ok ? (r.undef ? 'undefined' : JSON.stringify(r.value)) : 'error:' + r.code)
  }
  return { out, calls }
`

test("a Redis restart without persistence between a set and an older load's write-back: that load is not written (history soak, seed 7009)", {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  // A key Redis knows nothing of: before the fix its fence was empty, and after a restart (which
  // loses B's set and its generation) it was empty again, so A's older result matched and was
  // written, then served to B after B's own write.
  const { redis, spawnWorker, stored } = await setup(t)
  const A = await spawnWorker('A')
  const B = await spawnWorker('B')
  const key = 'fence:restart'
  const load = await startGated(A, { key, name: 'a', value: 'A-old' }, 'A cold load')
  const s = await B.request('set', { key, value: 'new' })
  assert.ok(s.ok, `B's set: ${s.message}`)
  await redis.restart('SIGKILL')
  // Both instances talk to the new server again before A's load ends (else its write-back is
  // simply not sent, which proves nothing).
  for (const w of [A, B]) {
    await waitFor(async () => (await w.request('set', { key: `probe:${w.name}`, value: 1 })).ok, {
      what: `${w.name} to reach the restarted Redis`,
      timeout: 15_000,
    })
  }
  await load.open()
  const a = await within(load.result, 10_000, "A's load to end")
  assert.ok(a.ok, `A's caller: ${a.code} ${a.message}`)
  await busFlushed([A, B])
  assert.notDeepEqual(await stored(key), { exists: true, value: 'A-old' }, "A's load, begun before B's set, was written after the restart")
  const r = await B.request('read', { key, loader: { value: 'reloaded' } })
  assert.ok(r.results[0].ok, r.results[0].message)
  assert.notEqual(r.results[0].value, 'A-old', 'B was served a value older than its own write')
})

test("one instance's writes of a key reach Redis in call order", { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  const W = await spawnWorker('W')
  const B = await spawnWorker('B') // another instance, only reading
  const runs = 300
  const keysOf = (prefix) => Array.from({ length: runs }, (_, i) => `${prefix}${i}`)
  const tally = (list) => {
    const counts = {}
    for (const x of list) counts[x] = (counts[x] ?? 0) + 1
    return JSON.stringify(counts)
  }

  // set(k, 1) and set(k, 2) together: 2 must win every time.
  const setErrors = await W.request('run', { body: ORDERED_WRITES, args: { runs, prefix: 'ss:', mode: 'set-set' } })
  assert.deepEqual(setErrors, [], 'every set resolved')
  const setRaw = await redis.pipeline(keysOf('ss:').map((k) => ['GET', vkey(k)]))
  const setInRedis = setRaw.map((raw) => (raw === null ? 'absent' : JSON.stringify(JSON.parse(raw).value)))
  const setWrong = setInRedis.filter((v) => v !== '2').length
  t.diagnostic(`set/set: ${setWrong} of ${runs} runs left something other than 2 in Redis`)

  // set(k, x) then delete(k), not awaited in between: the key must end absent every time.
  const delErrors = await W.request('run', { body: ORDERED_WRITES, args: { runs, prefix: 'sd:', mode: 'set-delete' } })
  assert.deepEqual(delErrors, [], 'every set and delete resolved')
  const delRaw = await redis.pipeline(keysOf('sd:').map((k) => ['EXISTS', vkey(k)]))
  const delLeft = delRaw.filter((n) => n !== 0).length
  t.diagnostic(`set/delete: ${delLeft} of ${runs} runs left the key in Redis`)

  assert.equal(setWrong, 0, `Promise.all([set(k,1), set(k,2)]) left other than 2 in Redis: ${tally(setInRedis)}`)
  assert.equal(delLeft, 0, `set(k,x) then delete(k) left the key in Redis in ${delLeft} of ${runs} runs`)

  // Every instance agrees: B (Redis only) and W (its in-process tier), loader calls counted.
  const bSet = await B.request('run', { body: READ_ALL, args: { runs, prefix: 'ss:', load: true } })
  assert.equal(bSet.calls, 0, 'B found every set key without loading')
  assert.equal(tally(bSet.out), tally(Array(runs).fill('2')), 'B reads 2 for every set/set key')
  const bDel = await B.request('run', { body: READ_ALL, args: { runs, prefix: 'sd:', load: false } })
  assert.equal(tally(bDel.out), tally(Array(runs).fill('undefined')), 'B finds no set/delete key')
  const wSet = await W.request('run', { body: READ_ALL, args: { runs, prefix: 'ss:', load: true } })
  assert.equal(wSet.calls, 0)
  assert.equal(tally(wSet.out), tally(Array(runs).fill('2')), 'W reads 2 for every set/set key')
  const wDel = await W.request('run', { body: READ_ALL, args: { runs, prefix: 'sd:', load: true } })
  assert.equal(wDel.calls, runs, 'W loads every set/delete key: none is cached')
  assert.equal(tally(wDel.out), tally(Array(runs).fill('"marker"')))
})

// get(k) and a write of k started together in one instance (B wrote v1 before): after the write
// resolves, the instance must not serve what the get read from Redis before the write.
const GET_WITH_OWN_WRITE = `
  const wrong = []
  for (let i = 0; i < args.runs; i++) {
    const k = args.prefix + i
    const read = tools.outcome(cache.get(k))
    const write = tools.outcome(args.write === 'set' ? cache.set(k, 'v2') : cache.delete(k))
    await Promise.all([read, write])
    const after = await tools.outcome(cache.get(k))
    const seen = after.undef ? 'undefined' : JSON.stringify(after.value)
    if (seen !== (args.write === 'set' ? '"v2"' : 'undefined')) wrong.push(k + '=' + seen)
  }
  return wrong
`

test("a get overlapping its own instance's set or delete is not kept over it (found by history seeds 134, 152)", { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { ttl: 60_000 })
  const B = await spawnWorker('B', { ttl: 60_000 })
  const runs = 150
  for (const write of ['set', 'delete']) {
    const prefix = `gw:${write}:`
    for (let i = 0; i < runs; i++) assert.ok((await B.request('set', { key: prefix + i, value: 'v1' })).ok)
    // get() first: its Redis read is on its way when the write starts (get before set in call order).
    const wrong = await A.request('run', { body: GET_WITH_OWN_WRITE, args: { runs, prefix, write } })
    t.diagnostic(`get + ${write}: ${wrong.length} of ${runs} served the older value afterwards`)
    assert.deepEqual(wrong, [], `after its own ${write} resolved, A served the value its overlapping get read`)
  }
})

// Waits on another process's lock, closes the cache, and reports how the wait ended and
// whether the loader ever ran (watched until well past the other process's lockTtl).
const WAIT_THEN_CLOSE = `
  let calls = 0
  const p = tools.outcome(cache.getOrLoad(args.key, async () => { calls++; return 'B-own' }))
  const deadline = Date.now() + 5_000
  while (cache._debugCounts().lockWaiters === 0) {
    if (Date.now() > deadline) return { waited: false }
    await tools.sleep(5)
  }
  await tools.sleep(100) // well inside the wait
  const closedAt = Date.now()
  const closing = tools.outcome(cache.close())
  const r = await Promise.race([p, tools.sleep(args.watchMs).then(() => null)])
  await tools.sleep(Math.max(0, closedAt + args.watchMs - Date.now()))
  const closed = await Promise.race([closing, tools.sleep(1_000).then(() => null)])
  return { waited: true, closedAt, r, calls, closed }
`

// Its sibling (soak seed 7022): the read starts *after* the write was called, while the write
// still waits in the key's write order behind an earlier write of the same instance, so Redis
// runs the read before it. The read's stamp already includes the write, so only knowing that the
// write was unsent (or unacknowledged) keeps the older value out.
const WRITE_WRITE_GET = `
  const wrong = []
  for (let i = 0; i < args.runs; i++) {
    const k = args.prefix + i
    const first = tools.outcome(cache.set(k, 'v2'))
    const second = tools.outcome(args.write === 'set' ? cache.set(k, 'v3') : cache.delete(k))
    // The set above left 'v3' in process (a local hit): a delete leaves nothing, so get reads Redis.
    const read = tools.outcome(args.write === 'set' ? cache.getOrLoad(k, () => 'loaded') : cache.get(k))
    await Promise.all([first, second, read])
    const after = await tools.outcome(cache.get(k))
    const seen = after.undef ? 'undefined' : JSON.stringify(after.value)
    if (seen !== (args.write === 'set' ? '"v3"' : 'undefined')) wrong.push(k + '=' + seen)
  }
  return wrong
`

test('a read started after its own instance called set or delete, while that write waited behind another, is not kept over it (soak seed 7022)', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { ttl: 60_000 })
  const runs = 150
  for (const write of ['delete', 'set']) {
    const wrong = await A.request('run', { body: WRITE_WRITE_GET, args: { runs, prefix: `wwg:${write}:`, write } })
    t.diagnostic(`set + ${write} + read: ${wrong.length} of ${runs} served the older value afterwards`)
    assert.deepEqual(wrong, [], `after its own ${write} resolved, A served a value Redis held before it`)
  }
})

test('lock waiters wake when the bus drops and when their cache closes', { timeout: TEST_TIMEOUT }, async (t) => {
  await t.test("(a) subscribers killed just before the holder's write: the waiter resolves with its value at once, not after lockTtl", async (t) => {
    // A long lockTtl: B waking at once and B waiting the lock out are seconds apart however
    // loaded the machine is.
    const lockTtl = 20_000
    const { redis, spawnWorker, stored, lkey } = await setup(t, { lockTtl })
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'wake:bus'
    const load = await startGated(A, { key, name: 'a', value: 'A-value' }, 'A cold load')
    const bRun = B.start('read', { key, loader: { value: 'B-own' } })
    await waitFor(async () => (await B.request('snapshot')).debug.lockWaiters > 0, { timeout: 5_000, interval: 10, what: "B to wait on A's lock" })
    await sleep(300) // B is well into its wait (lockTtl is 20 s)

    // The subscriptions are killed and kept from coming back (SUBSCRIBE refused for the moment)
    // until A has written and announced: B's notification is lost for certain, not by a race
    // against its resubscription backoff.
    await redis.cmd('ACL', 'SETUSER', 'default', '-subscribe', '-psubscribe', '-ssubscribe')
    const killed = await redis.cmd('CLIENT', 'KILL', 'TYPE', 'pubsub')
    assert.ok(killed >= 1, `precondition: the bus subscriptions were killed (${killed})`)
    await load.open() // A writes and announces while B has no subscription
    const a = await within(load.result, 10_000, "A's load to end")
    assert.equal(a.value, 'A-value')
    const writtenAt = Date.now()
    assert.deepEqual(await stored(key), { exists: true, value: 'A-value' }, "precondition: A's value is in Redis")
    assert.equal((await redis.cmd('CLIENT', 'LIST', 'TYPE', 'pubsub')).trim(), '', 'precondition: no subscriber heard A')
    await redis.cmd('ACL', 'SETUSER', 'default', '+subscribe', '+psubscribe', '+ssubscribe')

    const b = await bRun.result
    const x = b.results[0]
    assert.ok(x.ok, `B rejected: ${x.code} ${x.message}`)
    const after = x.at - writtenAt
    t.diagnostic(`B resolved ${after} ms after A's write (lockTtl ${lockTtl} ms)`)
    assert.ok(after < lockTtl / 2, `B resolved ${after} ms after A's write: its wake-up went with the dropped bus and it waited out the lock`)
    assert.equal(x.value, 'A-value', "B resolves with A's value")
    assert.equal(b.loaderCallsDuring, 0, 'B never called its loader')
    assert.deepEqual(await stored(key), { exists: true, value: 'A-value' })
    assert.equal(await redis.cmd('EXISTS', lkey(key)), 0, 'the lock was released')
    await assertServed([A, B], key, 'A-value', 'afterwards')
  })

  await t.test('(b) a waiter whose cache is closed rejects with ERR_CLOSED promptly and never calls its loader', async (t) => {
    // B rejecting at close() and B waiting the lock out are seconds apart (see (a)).
    const lockTtl = 10_000
    const watchMs = 5_000
    const { redis, spawnWorker, stored, lkey } = await setup(t, { lockTtl })
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'wake:close'
    // A's load outlives everything below; A is killed when the test ends.
    await startGated(A, { key, name: 'a', value: 'A-value' }, 'A cold load')
    assert.equal(await redis.cmd('EXISTS', lkey(key)), 1, 'A holds the lock')
    const b = await B.request('run', { body: WAIT_THEN_CLOSE, args: { key, watchMs } })
    assert.ok(b.waited, "precondition: B waited on A's lock")
    assert.ok(b.closed && b.closed.ok, `close() resolved: ${JSON.stringify(b.closed)}`)
    assert.ok(b.r !== null, `B's getOrLoad still pending ${watchMs} ms after close() (lockTtl ${lockTtl} ms)`)
    const after = b.r.at - b.closedAt
    t.diagnostic(`B's getOrLoad settled ${after} ms after close(); B's loader calls: ${b.calls}`)
    assert.equal(b.r.ok, false, `B's getOrLoad resolved with ${JSON.stringify(b.r.value)} after close()`)
    assert.equal(b.r.code, 'ERR_CLOSED', `B's getOrLoad rejected with ${b.r.code}: ${b.r.message}`)
    assert.ok(after < lockTtl / 2, `B's getOrLoad rejected ${after} ms after close(): it waited for the lock`)
    assert.equal(b.calls, 0, "B's loader was called after its cache was closed")
    assert.deepEqual(await stored(key), { exists: false }, 'nothing was written (A still loading, B never loaded)')
    assert.equal((await A.request('run', { body: GATE_INFO, args: { name: 'a' } })).calls, 1)
  })
})

test('a lock key without an expiry counts as expiring in lockTtl', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, stored, lkey } = await setup(t, { lockTtl: 500 })
  const W = await spawnWorker('W')
  const B = await spawnWorker('B')
  const key = 'lock:no-expiry'
  // Both connected and subscribed before counting.
  for (const w of [W, B]) assert.ok((await w.request('get', { key: 'warm' })).ok)
  await sleep(300)
  await redis.cmd('SET', lkey(key), 'x') // no PX: a lock some crashed tool left behind
  assert.equal(await redis.cmd('PTTL', lkey(key)), -1)

  const before = await redis.commandsProcessed()
  const t0 = Date.now()
  const run = W.start('read', { key, n: 20, loader: { value: 'loaded' } }, { timeout: 20_000 })
  const r = await Promise.race([run.result, sleep(6_000).then(() => null)])
  const delta = (await redis.commandsProcessed()) - before
  const ms = r === null ? null : Math.max(...r.results.map((x) => x.at)) - t0
  t.diagnostic(`getOrLoad ${r === null ? 'still pending after 6 s' : `resolved in ${ms} ms`}; Redis commands meanwhile: ${delta}`)
  assert.ok(r !== null, `getOrLoad never resolved behind a lock without expiry (${delta} Redis commands in 6 s)`)
  assert.ok(delta < 200, `${delta} Redis commands while waiting on the lock (expected a bounded few)`)
  assert.ok(ms < 5_000, `getOrLoad took ${ms} ms with lockTtl 500`)
  for (const x of r.results) assert.ok(x.ok && x.value === 'loaded', `a caller got ${JSON.stringify(x)}`)
  assert.equal(r.loaderCallsDuring, 1, 'one load for the 20 callers')

  assert.deepEqual(await stored(key), { exists: true, value: 'loaded' })
  // Given an expiry of lockTtl, the stray lock is gone soon whether W loaded under its own lock
  // or after waiting it out.
  await waitFor(async () => (await redis.cmd('EXISTS', lkey(key))) === 0, { timeout: 2_000, interval: 20, what: 'no lock left behind' })
  await assertServed([W, B], key, 'loaded', 'afterwards')
})

// Two callers of args.key and one of args.key2, each on a loader that never settles (until the
// test opens its gate). Returns their outcomes (null: still pending after 3 s) and whether each
// loader's ctx.signal had aborted shortly after they settled.
const HUNG_LOADS = `${GATES}
  const h1 = gated('h1', 'late-1')
  const h2 = gated('h2', 'late-2')
  const t0 = Date.now()
  const all = Promise.all([
    tools.outcome(cache.getOrLoad(args.key, h1)),
    tools.outcome(cache.getOrLoad(args.key, h1)),
    tools.outcome(cache.getOrLoad(args.key2, h2)),
  ])
  const rs = await Promise.race([all, tools.sleep(8_000).then(() => null)])
  await tools.sleep(100) // the abort may follow the rejections by a tick
  return {
    t0,
    rs,
    calls: [gates.get('h1').calls, gates.get('h2').calls],
    aborted: [...gates.get('h1').signals, ...gates.get('h2').signals].map((s) => s.aborted),
  }
`

const NEXT_LOAD = `
  let calls = 0
  const p = tools.outcome(cache.getOrLoad(args.key, async () => { calls++; return args.value }))
  const r = await Promise.race([p, tools.sleep(8_000).then(() => null)])
  return { r, calls }
`

test('a loader that never settles does not block its key past loadTimeout, and its late result is cached nowhere', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  await t.test('(a) loadTimeout 300: callers reject ERR_LOAD_TIMEOUT, signal aborted, lock released, the next call loads', async (t) => {
    const { redis, spawnWorker, stored, lkey } = await setup(t)
    const W = await spawnWorker('W', { loadTimeout: 300 })
    const B = await spawnWorker('B')
    const key = 'hung:a'
    const key2 = 'hung:b'

    const hung = await W.request('run', { body: HUNG_LOADS, args: { key, key2 } })
    // Pending 8 s later (far past loadTimeout, under the 10 s lockTtl) means it never timed out.
    assert.ok(hung.rs !== null, 'the callers of a hung loader were still pending 8 s later (loadTimeout 300)')
    for (const r of hung.rs) {
      assert.equal(r.ok, false, `a caller of a hung loader resolved with ${JSON.stringify(r.value)}`)
      assert.equal(r.code, 'ERR_LOAD_TIMEOUT', `a caller rejected with ${r.code}: ${r.message}`)
      const after = r.at - hung.t0
      // Not before loadTimeout (timers never fire early); how late is the machine's business.
      assert.ok(after >= 290, `a caller rejected ${after} ms after the load began (loadTimeout 300)`)
    }
    assert.deepEqual(hung.calls, [1, 1], 'one loader call per key, shared by its callers')
    assert.deepEqual(hung.aborted, [true, true], "each hung loader's ctx.signal aborted when its callers rejected")
    // The default lockTtl is 10 s: a lock still there now was not released at the timeout.
    await waitFor(
      async () =>
        (
          await redis.pipeline([
            ['EXISTS', lkey(key)],
            ['EXISTS', lkey(key2)],
          ])
        ).every((n) => n === 0),
      {
        timeout: 5_000, // half the lockTtl: a lock left to expire is still there
        interval: 10,
        what: 'the Redis locks of the timed-out loads to be released',
      },
    )

    const next = await W.request('run', { body: NEXT_LOAD, args: { key, value: 'second' } })
    assert.ok(next.r !== null, 'the next getOrLoad was still pending 8 s later: the hung load still blocks the key')
    assert.equal(next.calls, 1, 'the next getOrLoad leads a new load')
    assert.ok(next.r.ok && next.r.value === 'second', `the next getOrLoad: ${JSON.stringify(next.r)}`)
    assert.deepEqual(await stored(key), { exists: true, value: 'second' })

    // The hung loaders settle now: their results must not land anywhere.
    await W.request('run', { body: OPEN_GATE, args: { name: 'h1' } })
    await W.request('run', { body: OPEN_GATE, args: { name: 'h2' } })
    await W.request('settle')
    await busFlushed([W, B])
    assert.deepEqual(await stored(key), { exists: true, value: 'second' }, 'the late result of the timed-out load replaced the newer one in Redis')
    assert.deepEqual(await stored(key2), { exists: false }, 'the late result of a timed-out load was written to Redis')
    await assertServed([W, B], key, 'second', 'after the late results')
    await assertAbsent([W, B], key2, 'after the late results')
    assert.equal((await W.request('snapshot')).debug.lockWaiters, 0)
  })

  await t.test("(b) A's loader hangs (per-call loadTimeout 500) while B sets the key: A's next getOrLoad returns B's value without loading", async (t) => {
    const { spawnWorker, stored } = await setup(t)
    const A = await spawnWorker('A')
    const B = await spawnWorker('B')
    const key = 'hung:set'
    const load = await startGated(A, { key, name: 'a', value: 'A-late', opts: { loadTimeout: 500 } }, 'A cold load')
    const s = await B.request('set', { key, value: 'B-value' })
    assert.ok(s.ok, `B's set: ${s.message}`)
    const a = await within(load.result, 5_000, "A's caller to settle after loadTimeout")
    // No stale value to fall back on: the caller times out (or, at best, is handed B's value).
    assert.ok((a.ok === false && a.code === 'ERR_LOAD_TIMEOUT') || (a.ok && a.value === 'B-value'), `A's caller of the hung load: ${JSON.stringify(a)}`)

    const next = await A.request('run', { body: NEXT_LOAD, args: { key, value: 'A-second' } })
    assert.ok(next.r !== null, "A's next getOrLoad was still pending 8 s later: the hung load blocks the key although B stored a value")
    assert.ok(next.r.ok && next.r.value === 'B-value', `A's next getOrLoad: ${JSON.stringify(next.r)}`)
    assert.equal(next.calls, 0, "A's next getOrLoad found B's value without loading")

    await load.open() // the hung loader settles late
    await A.request('settle')
    await busFlushed([A, B])
    assert.deepEqual(await stored(key), { exists: true, value: 'B-value' }, "A's late result was written over B's value in Redis")
    await assertServed([A, B], key, 'B-value', 'after the late result')
    const info = await A.request('run', { body: GATE_INFO, args: { name: 'a' } })
    assert.equal(info.calls, 1, "A's hung loader ran once")
    assert.deepEqual(info.aborted, [true], "the hung loader's ctx.signal aborted")
  })
})
