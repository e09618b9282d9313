'use strict'
// What the cache publishes through node:diagnostics_channel (README, "Observability"): scripted
// runs, in process and across two instances sharing a Redis, whose every event a subscriber
// sees, in order, with the fields the README lists; and the counts agree with stats().
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const dc = require('node:diagnostics_channel')
const { StampedeCache } = require('..')
const { RedisServer, freePort, waitFor, killAllSync } = require('./helpers/redis-server')
const { deferred, sleep } = require('./helpers/assertions')

after(() => killAllSync())

const EVENTS = ['hit', 'miss', 'coalesce', 'lock', 'invalidate', 'load-timeout', 'redis-error']
const loadChannel = dc.tracingChannel('stampede-cache:load')

/**
 * Subscribes to every channel and keeps the events of `caches` (a Map of cache -> label) as
 * short lines, in the order published. `stop()` unsubscribes.
 */
function record(caches) {
  const lines = []
  const messages = []
  const keep = (name, m, line) => {
    const label = caches.get(m.cache)
    if (label === undefined) return
    // Every message names its cache and namespace.
    assert.equal(m.namespace, m.cache.namespace)
    messages.push({ name, message: m })
    lines.push(`${label} ${line}`)
  }
  const describe = {
    hit: (m) => `hit ${m.key} ${m.tier} ${m.state}`,
    miss: (m) => `miss ${m.key}`,
    coalesce: (m) => `coalesce ${m.key}`,
    lock: (m) => `lock ${m.key} ${m.reason} ${m.outcome}`,
    invalidate: (m) => `invalidate ${m.key ?? '*'} ${m.source}`,
    'load-timeout': (m) => `load-timeout ${m.key} ${m.reason} ${m.timeout}`,
    'redis-error': (m) => `redis-error ${m.op}`,
  }
  const subscribers = EVENTS.map((name) => {
    const fn = (m) => keep(name, m, describe[name](m))
    dc.subscribe(`stampede-cache:${name}`, fn)
    return [name, fn]
  })
  const tracing = {
    start: (c) => keep('load:start', c, `load:start ${c.key} ${c.reason}`),
    end: (c) => keep('load:end', c, `load:end ${c.key}`),
    asyncStart: (c) => keep('load:asyncStart', c, `load:asyncStart ${c.key}`),
    asyncEnd: (c) =>
      keep('load:asyncEnd', c, `load:asyncEnd ${c.key} ${'error' in c ? `error ${c.error.code ?? c.error.message}` : `= ${JSON.stringify(c.result)}`}`),
    error: (c) => keep('load:error', c, `load:error ${c.key} ${c.error.code ?? c.error.message}`),
  }
  loadChannel.subscribe(tracing)
  return {
    lines,
    messages,
    /** The lines recorded since the last take. */
    take() {
      return lines.splice(0)
    },
    stop() {
      for (const [name, fn] of subscribers) dc.unsubscribe(`stampede-cache:${name}`, fn)
      loadChannel.unsubscribe(tracing)
    },
  }
}

/** The lines of one successful load of `key` (after its start, which is awaited separately). */
const loaded = (label, key, value) => [`${label} load:asyncStart ${key}`, `${label} load:asyncEnd ${key} = ${JSON.stringify(value)}`]

test('in process: a subscriber sees every event of a scripted run, in order, and the counts agree with stats()', { timeout: 30_000 }, async (t) => {
  const cache = new StampedeCache({ ttl: 1_000, hardTtl: 60_000, jitter: 0, beta: 0, negativeTtl: 60_000, loadTimeout: 200 })
  const rec = record(new Map([[cache, 'A']]))
  t.after(async () => {
    rec.stop()
    await cache.close()
  })

  // Three callers of a cold key: one load, two coalesced.
  const values = await Promise.all([1, 2, 3].map((n) => cache.getOrLoad('a', () => n)))
  assert.deepEqual(values, [1, 1, 1])
  assert.deepEqual(rec.take(), [
    'A miss a',
    'A miss a',
    'A coalesce a',
    'A miss a',
    'A coalesce a',
    'A load:start a cold',
    'A load:end a',
    ...loaded('A', 'a', 1),
  ])

  // A fresh hit (the hot path), a cached not-found, and a loader that throws.
  await cache.getOrLoad('a', () => 9)
  assert.equal(await cache.getOrLoad('n', () => null), null)
  assert.equal(await cache.getOrLoad('n', () => 9), null)
  await assert.rejects(
    cache.getOrLoad('e', () => {
      throw new Error('boom')
    }),
    /boom/,
  )
  assert.deepEqual(rec.take(), [
    'A hit a memory fresh',
    'A miss n',
    'A load:start n cold',
    'A load:end n',
    ...loaded('A', 'n', null),
    'A hit n memory negative',
    'A miss e',
    'A load:start e cold',
    'A load:end e',
    'A load:error e boom',
    'A load:asyncStart e',
    'A load:asyncEnd e error boom',
  ])

  // Past ttl: a stale hit, then its background refresh; then a forced refresh.
  await sleep(1_100)
  assert.equal(await cache.getOrLoad('a', () => 2), 1)
  await cache.settle()
  assert.equal(await cache.getOrLoad('a', () => 3, { forceRefresh: true }), 3)
  assert.deepEqual(rec.take(), [
    'A hit a memory stale',
    'A load:start a refresh',
    'A load:end a',
    ...loaded('A', 'a', 2),
    'A miss a',
    'A load:start a force',
    'A load:end a',
    ...loaded('A', 'a', 3),
  ])

  // Local invalidations, and get() reads.
  await cache.set('a', 4)
  assert.equal(await cache.get('a'), 4)
  assert.equal(await cache.delete('a'), true)
  assert.equal(await cache.get('a'), undefined)
  assert.deepEqual(rec.take(), ['A invalidate a local', 'A hit a memory fresh', 'A invalidate a local', 'A miss a'])

  // A loader that outlives loadTimeout: the timeout event comes before the load's error.
  // (Its own timer keeps the process alive, as a loader doing real work would: loadTimeout's does not.)
  const late = cache.getOrLoad(
    'slow',
    ({ signal }) =>
      new Promise((resolve) => {
        const timer = setTimeout(resolve, 10_000, 'late')
        signal.addEventListener('abort', () => {
          clearTimeout(timer)
          resolve('late')
        })
      }),
  )
  await assert.rejects(late, { code: 'ERR_LOAD_TIMEOUT' })
  assert.deepEqual(rec.take(), [
    'A miss slow',
    'A load:start slow cold',
    'A load:end slow',
    'A load-timeout slow cold 200',
    'A load:error slow ERR_LOAD_TIMEOUT',
    'A load:asyncStart slow',
    'A load:asyncEnd slow error ERR_LOAD_TIMEOUT',
  ])

  // Every count of stats() has its events.
  const count = (name, pred = () => true) => rec.messages.filter((e) => e.name === name && pred(e.message)).length
  const s = cache.stats()
  assert.equal(
    count('hit', (m) => m.state === 'fresh'),
    s.hits,
  )
  assert.equal(
    count('hit', (m) => m.state === 'stale'),
    s.staleHits,
  )
  assert.equal(
    count('hit', (m) => m.state === 'negative'),
    s.negativeHits,
  )
  assert.equal(count('miss'), s.misses)
  assert.equal(count('coalesce'), s.coalesced)
  assert.equal(count('load:start'), s.loads)
  assert.equal(count('load:asyncEnd'), s.loads, 'every loader call ended')
  assert.equal(count('load:error'), 2)
  // The messages are the objects the README describes (no more fields than it lists).
  const hit = rec.messages.find((e) => e.name === 'hit').message
  assert.deepEqual(Object.keys(hit).sort(), ['cache', 'key', 'namespace', 'state', 'tier'])
  const load = rec.messages.find((e) => e.name === 'load:start').message
  assert.deepEqual(Object.keys(load).sort(), ['cache', 'key', 'namespace', 'reason', 'result'])
})

test('in process: nothing reaches a subscriber that has left, and an array key is reported encoded', { timeout: 10_000 }, async (t) => {
  const cache = new StampedeCache({ namespace: 'obs' })
  t.after(() => cache.close())
  const seen = []
  const fn = (m) => seen.push(m)
  dc.subscribe('stampede-cache:miss', fn)
  await cache.getOrLoad(['user', 42], () => 1)
  dc.unsubscribe('stampede-cache:miss', fn)
  await cache.getOrLoad('other', () => 1)
  assert.equal(seen.length, 1)
  assert.equal(seen[0].namespace, 'obs')
  assert.equal(seen[0].cache, cache)
  assert.notEqual(seen[0].key, 'user,42')
  assert.equal(typeof seen[0].key, 'string')
  // The key as the cache names it everywhere (Redis keys, spans): a second read hits it.
  assert.equal((await cache.inspect(['user', 42]))?.state, 'fresh')
})

test('a subscriber that calls the cache while it is told of a miss, a hit or a load joins what runs (one load)', { timeout: 10_000 }, async (t) => {
  const cache = new StampedeCache({ namespace: 'reentrant' })
  t.after(() => cache.close())
  let loads = 0
  const loader = async () => {
    loads++
    await sleep(5)
    return { n: loads }
  }
  const inner = []
  let calls = 0
  const onEvent = (m) => {
    // Counted before the call: the inner call publishes too.
    if (m.cache === cache && m.key === 'k' && calls++ < 3) inner.push(cache.getOrLoad('k', loader))
  }
  const tracing = { start: onEvent }
  dc.subscribe('stampede-cache:miss', onEvent)
  dc.subscribe('stampede-cache:hit', onEvent)
  loadChannel.subscribe(tracing)
  t.after(() => {
    dc.unsubscribe('stampede-cache:miss', onEvent)
    dc.unsubscribe('stampede-cache:hit', onEvent)
    loadChannel.unsubscribe(tracing)
  })
  const outer = await cache.getOrLoad('k', loader)
  const values = await Promise.all(inner)
  assert.equal(loads, 1)
  assert.deepEqual(outer, { n: 1 })
  assert.equal(values.length, 3)
  for (const v of values) assert.deepEqual(v, { n: 1 })
})

test('Redis: a subscriber told of a set or delete that sets the same key: every write succeeds and Redis ends with the last one called', {
  timeout: 30_000,
}, async (t) => {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const namespace = `reentrantw${process.pid}`
  const cache = new StampedeCache({ redis: redis.url, namespace })
  t.after(() => cache.close())
  const inRedis = async () => {
    const raw = await redis.cmd('GET', `${namespace}:v:{k}`)
    return raw === null ? undefined : JSON.parse(raw).value
  }
  let inner = null
  let armed = true
  const onInvalidate = (m) => {
    if (m.cache !== cache || m.key !== 'k' || m.source !== 'local' || !armed) return
    // Disarmed first: the inner set is told of too.
    armed = false
    inner = cache.set('k', 'inner')
  }
  dc.subscribe('stampede-cache:invalidate', onInvalidate)
  t.after(() => dc.unsubscribe('stampede-cache:invalidate', onInvalidate))

  // The outer write reaches Redis before the subscriber runs (docs: src/node/mod.rs, "Boundary
  // rules"), so it is not lost to the inner one, and the inner one, called last, wins everywhere.
  await cache.set('k', 'outer')
  await inner
  assert.equal(await cache.get('k'), 'inner')
  assert.equal(await inRedis(), 'inner')

  armed = true
  assert.equal(await cache.delete('k'), true)
  await inner
  assert.equal(await cache.get('k'), 'inner')
  assert.equal(await inRedis(), 'inner')
  assert.equal(cache._debugCounts().unsentWrites, 0)
})

test("Redis: two instances; lock outcomes, Redis hits and bus invalidations reach each instance's subscribers in order", { timeout: 60_000 }, async (t) => {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const options = { redis: redis.url, namespace: `obs${process.pid}`, ttl: 1_500, hardTtl: 60_000, jitter: 0, beta: 0, lockTtl: 10_000 }
  const a = new StampedeCache(options)
  const b = new StampedeCache(options)
  const rec = record(
    new Map([
      [a, 'A'],
      [b, 'B'],
    ]),
  )
  t.after(async () => {
    rec.stop()
    await Promise.all([a.close(), b.close()])
  })
  const only = (label) => rec.lines.filter((l) => l.startsWith(`${label} `))
  const take = (label) => {
    const mine = only(label)
    for (const l of mine) rec.lines.splice(rec.lines.indexOf(l), 1)
    return mine
  }
  const eventually = (what, fn) => waitFor(fn, { timeout: 10_000, what })

  // A cold key: A takes the lock and loads; B waits for A's value and reads it from Redis.
  const gate = deferred()
  const fromA = a.getOrLoad('k', () => gate.promise)
  await eventually('A loading', () => rec.lines.includes('A load:end k'))
  const fromB = b.getOrLoad('k', () => 'B loaded')
  await eventually('B waiting for the lock', () => b._debugCounts().lockWaiters === 1)
  gate.resolve({ v: 1 })
  assert.deepEqual(await Promise.all([fromA, fromB]), [{ v: 1 }, { v: 1 }])
  assert.deepEqual(take('A'), ['A miss k', 'A lock k cold won', 'A load:start k cold', 'A load:end k', ...loaded('A', 'k', { v: 1 })])
  // A's write-back announced k (which B drops) before it woke B.
  assert.deepEqual(take('B'), ['B miss k', 'B lock k cold waited', 'B invalidate k bus', 'B hit k redis fresh'])

  // Hits in process; then B sets k, and A drops its copy at its next call and reads B's value.
  await a.getOrLoad('k', () => 'x')
  await b.getOrLoad('k', () => 'x')
  await b.set('k', { v: 2 })
  await eventually('A hearing the set', () => a._debugCounts().inboxKeys === 1)
  assert.deepEqual(await a.getOrLoad('k', () => 'x'), { v: 2 })
  assert.deepEqual(take('A'), ['A hit k memory fresh', 'A invalidate k bus', 'A miss k', 'A hit k redis fresh'])
  assert.deepEqual(take('B'), ['B hit k memory fresh', 'B invalidate k local'])

  // Past ttl both copies are stale: A's refresh takes the lock, B's is skipped, then B drops its
  // copy when A's refresh lands and reads the new value from Redis.
  await sleep(1_600)
  const refresh = deferred()
  assert.deepEqual(await a.getOrLoad('k', () => refresh.promise), { v: 2 })
  await eventually('A refreshing', () => rec.lines.includes('A load:end k'))
  assert.deepEqual(await b.getOrLoad('k', () => 'B refreshed'), { v: 2 })
  await b.settle()
  refresh.resolve({ v: 3 })
  await a.settle()
  await eventually('B hearing the refresh', () => b._debugCounts().inboxKeys === 1)
  assert.deepEqual(await b.getOrLoad('k', () => 'x'), { v: 3 })
  assert.deepEqual(take('A'), ['A hit k memory stale', 'A lock k refresh won', 'A load:start k refresh', 'A load:end k', ...loaded('A', 'k', { v: 3 })])
  assert.deepEqual(take('B'), ['B hit k memory stale', 'B lock k refresh skipped', 'B invalidate k bus', 'B miss k', 'B hit k redis fresh'])

  // A loader fails while B waits: B takes the lock over and loads.
  const failing = deferred()
  const failed = a.getOrLoad('f', () => failing.promise)
  await eventually('A loading f', () => rec.lines.includes('A load:end f'))
  const fromB2 = b.getOrLoad('f', () => 'B took over')
  await eventually('B waiting for f', () => b._debugCounts().lockWaiters === 1)
  failing.reject(new Error('source down'))
  await assert.rejects(failed, /source down/)
  assert.equal(await fromB2, 'B took over')
  assert.deepEqual(take('A'), [
    'A miss f',
    'A lock f cold won',
    'A load:start f cold',
    'A load:end f',
    'A load:error f source down',
    'A load:asyncStart f',
    'A load:asyncEnd f error source down',
  ])
  // A's release announced f (as it does to wake waiters); B applies it when it writes f back.
  assert.deepEqual(take('B'), [
    'B miss f',
    'B lock f cold took_over',
    'B load:start f cold',
    'B load:end f',
    ...loaded('B', 'f', 'B took over'),
    'B invalidate f bus',
  ])

  // B's write-back of f replaced only its own marker, with nobody waiting: it is not announced
  // (A, whose load failed, holds no copy of f). A deletes k. B drops its copy of k at its next
  // call, and Redis has nothing.
  assert.equal(await a.delete('k'), true)
  await eventually('B hearing the delete', () => b._debugCounts().inboxKeys >= 1)
  assert.equal(await b.get('k'), undefined)
  assert.deepEqual(take('A'), ['A invalidate k local'])
  assert.deepEqual(take('B'), ['B invalidate k bus', 'B miss k'])
  assert.deepEqual(rec.lines, [], 'no other event')

  // The lock events agree with stats(): won and took_over are lockWins, the waits are lockWaits.
  const outcomes = (cache) => rec.messages.filter((e) => e.name === 'lock' && e.message.cache === cache).map((e) => e.message.outcome)
  for (const cache of [a, b]) {
    const s = cache.stats()
    const o = outcomes(cache)
    assert.equal(o.filter((x) => x === 'won' || x === 'took_over').length, s.lockWins)
    assert.equal(o.filter((x) => x === 'waited' || x === 'took_over' || x === 'gave_up').length, s.lockWaits)
    assert.equal(cache._debugCounts().keptInvalidations, 0, 'the engine keeps nothing once taken')
  }
})

test('Redis: a subscriber attached while only fresh hits happen still sees the next bus invalidation', { timeout: 30_000 }, async (t) => {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const options = { redis: redis.url, namespace: `obs${process.pid}b`, ttl: 60_000, jitter: 0, beta: 0 }
  const a = new StampedeCache(options)
  const b = new StampedeCache(options)
  t.after(() => Promise.all([a.close(), b.close()]))
  await b.getOrLoad('k', () => 1)
  for (let i = 0; i < 100; i++) await b.getOrLoad('k', () => 2)
  const seen = []
  const fn = (m) => {
    if (m.cache === b) seen.push(`${m.key} ${m.source}`)
  }
  dc.subscribe('stampede-cache:invalidate', fn)
  t.after(() => dc.unsubscribe('stampede-cache:invalidate', fn))
  await a.set('k', 3)
  await waitFor(() => b._debugCounts().inboxKeys === 1, { timeout: 10_000, what: 'B hearing the set' })
  // A fresh-hit call: the pending invalidation is applied where the subscriber is seen.
  assert.equal(await b.getOrLoad('k', () => 4), 3)
  assert.deepEqual(seen, ['k bus'])
})

test('Redis errors reach the redis-error channel as onError gets them, the same error objects in the same order', { timeout: 30_000 }, async (t) => {
  const port = await freePort()
  const reported = []
  const cache = new StampedeCache({
    redis: { url: `redis://127.0.0.1:${port}`, connectTimeout: 200, commandTimeout: 200 },
    namespace: 'down',
    onError: (err, info) => reported.push({ err, info }),
  })
  t.after(() => cache.close())
  const published = []
  const fn = (m) => published.push(m)
  dc.subscribe('stampede-cache:redis-error', fn)
  t.after(() => dc.unsubscribe('stampede-cache:redis-error', fn))
  // Reports are limited to one per operation a second: calls over a few seconds give several.
  const deadline = Date.now() + 3_000
  let i = 0
  while (Date.now() < deadline && published.length < 3) {
    assert.equal(await cache.getOrLoad(`k${i++}`, () => 'loaded without Redis'), 'loaded without Redis')
    await sleep(100)
  }
  assert.ok(published.length >= 1, 'at least one Redis error was published')
  assert.equal(published.length, reported.length)
  published.forEach((m, n) => {
    assert.equal(m.error, reported[n].err)
    assert.equal(m.error.code, 'ERR_REDIS')
    assert.equal(`redis:${m.op}`, reported[n].info.op)
    assert.equal(m.key, reported[n].info.key)
    assert.equal(m.namespace, 'down')
  })
  assert.ok(cache.stats().redisErrors >= published.length)
})
