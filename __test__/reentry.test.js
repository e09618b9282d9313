'use strict'
// A loader never waits for itself (docs/CONTRACT.md, "The rest"): a getOrLoad, getOrLoadMany or
// NestJS wrap made inside the load of the same key, in this cache or another one sharing its
// namespace and Redis, runs its own loader directly and returns at once; it neither coalesces
// with the enclosing load nor writes the key: the enclosing load writes it.
//
// Each test gives the caches a short loadTimeout: without the rule the nested call waits for the
// load that encloses it, which times out (ERR_LOAD_TIMEOUT) instead of answering.

const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
require('reflect-metadata')
const { StampedeCache } = require('..')
const { RedisServer, newNamespace, killAllSync } = require('./helpers/redis-server')

after(() => killAllSync())

const TIMEOUT = 20_000
/** Long enough for a healthy nested call many times over; short enough that a wait shows. */
const LOAD_TIMEOUT = 3_000
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** One private redis-server for the file (each test has its own namespace). */
const shared = new RedisServer()
before(() => shared.start())
after(() => shared.dispose())
const redisUrl = async () => shared.url

function caches(t, count, options) {
  const made = Array.from({ length: count }, () => new StampedeCache({ loadTimeout: LOAD_TIMEOUT, jitter: 0, ...options }))
  t.after(() => Promise.all(made.map((c) => c.close())))
  return made
}

/** What a call settled with, as a record (a rejection is { code, message }). */
const settled = (p) =>
  p.then(
    (value) => ({ value }),
    (err) => ({ code: err.code, message: err.message }),
  )

for (const tier of ['in-process', 'Redis']) {
  const options = async () => (tier === 'Redis' ? { redis: await redisUrl(), namespace: newNamespace('reentry') } : {})

  test(`${tier}: a loader that asks its own cache for its own key gets its own result at once`, { timeout: TIMEOUT }, async (t) => {
    const [cache] = caches(t, 1, await options())
    const calls = { outer: 0, inner: 0 }
    const started = Date.now()
    const outer = await settled(
      cache.getOrLoad('k', async () => {
        calls.outer++
        const inner = await cache.getOrLoad('k', async () => {
          calls.inner++
          await sleep(5)
          return { from: 'inner' }
        })
        return { from: 'outer', inner }
      }),
    )
    assert.deepEqual(outer, { value: { from: 'outer', inner: { from: 'inner' } } })
    assert.ok(Date.now() - started < LOAD_TIMEOUT, 'no wait for the enclosing load')
    assert.deepEqual(calls, { outer: 1, inner: 1 })
    // The enclosing load wrote the key; the nested one did not.
    assert.deepEqual(await cache.get('k'), { from: 'outer', inner: { from: 'inner' } })
    const debug = cache._debugCounts()
    assert.equal(debug.engineFlights + debug.facadeFlights, 0, 'no flight left behind')
  })

  test(`${tier}: a nested call two levels deep, an array key, and options: each answers at once`, { timeout: TIMEOUT }, async (t) => {
    const [cache] = caches(t, 1, await options())
    const key = ['user', 7]
    const got = await settled(
      cache.getOrLoad(key, async () => {
        const middle = await cache.getOrLoad(
          key,
          async () => {
            const deepest = await cache.getOrLoad(key, () => 1, { ttl: 10 })
            return deepest + 1
          },
          { ttl: 1_000, tags: ['t'] },
        )
        return middle + 1
      }),
    )
    assert.deepEqual(got, { value: 3 })
    assert.equal(await cache.get(key), 3)
  })

  test(`${tier}: a loader's nested call of another key still coalesces and caches as usual`, { timeout: TIMEOUT }, async (t) => {
    const [cache] = caches(t, 1, await options())
    let otherLoads = 0
    const other = () => cache.getOrLoad('other', async () => ++otherLoads)
    const got = await cache.getOrLoad('k', async () => {
      const [a, b] = await Promise.all([other(), other()])
      return a + b
    })
    assert.equal(got, 2)
    assert.equal(otherLoads, 1, 'the other key is loaded once for both calls')
    assert.equal(await cache.get('other'), 1, 'and cached')
  })

  test(`${tier}: a loadMany that calls getOrLoad of one of its keys gets that result at once`, { timeout: TIMEOUT }, async (t) => {
    const [cache] = caches(t, 1, await options())
    const asked = []
    const got = await settled(
      cache.getOrLoadMany(['a', 'b', 'c'], async (missing) => {
        asked.push(missing)
        const b = await cache.getOrLoad('b', async () => 'inner-b')
        return missing.map((k) => (k === 'b' ? `outer-${b}` : `outer-${k}`))
      }),
    )
    assert.deepEqual(got, { value: ['outer-a', 'outer-inner-b', 'outer-c'] })
    assert.deepEqual(asked, [['a', 'b', 'c']])
    assert.deepEqual(await cache.getMany(['a', 'b', 'c']), ['outer-a', 'outer-inner-b', 'outer-c'])
  })

  test(`${tier}: a loader that calls getOrLoadMany with its own key loads that key directly and the others as usual`, { timeout: TIMEOUT }, async (t) => {
    const [cache] = caches(t, 1, await options())
    await cache.set('held', 'from-cache')
    const batches = []
    const got = await settled(
      cache.getOrLoad('k', async () => {
        const inner = await cache.getOrLoadMany(['x', 'k', 'held', 'k'], async (missing) => {
          batches.push(missing)
          return missing.map((m) => (m === 'k' ? new Error('k failed inside') : `inner-${m}`))
        })
        return { inner: inner.map((v) => (v instanceof Error ? `error: ${v.message}` : v)) }
      }),
    )
    assert.deepEqual(got, { value: { inner: ['inner-x', 'error: k failed inside', 'from-cache', 'error: k failed inside'] } })
    // The nested key alone, directly; the other missing key in the usual batch.
    assert.deepEqual(batches.map((b) => [...b].sort()).sort(), [['k'], ['x']])
    assert.equal(await cache.get('x'), 'inner-x', 'the other key was cached as usual')
    assert.deepEqual(await cache.get('k'), { inner: ['inner-x', 'error: k failed inside', 'from-cache', 'error: k failed inside'] })
  })

  test(`${tier}: a background refresh whose loader reads its own key answers at once`, { timeout: TIMEOUT }, async (t) => {
    const [cache] = caches(t, 1, { ...(await options()), ttl: 50, hardTtl: 60_000, beta: 0 })
    await cache.getOrLoad('k', () => 1)
    await sleep(80)
    let inner
    const stale = await cache.getOrLoad('k', async () => {
      // forceRefresh: the slow path, which would join the refresh this runs in.
      inner = await cache.getOrLoad('k', () => 'inner', { forceRefresh: true })
      return 2
    })
    assert.equal(stale, 1, 'the stale value at once')
    await cache.settle()
    assert.equal(inner, 'inner')
    assert.equal(await cache.get('k'), 2, 'the refresh wrote its own result')
  })
}

test('a nested loadMany: a position it fails, a value it cannot serialize and a wrong-length result', { timeout: TIMEOUT }, async (t) => {
  const [cache] = caches(t, 1, {})
  const got = await cache.getOrLoad('a', async () => {
    const inner = await cache.getOrLoadMany(['a', 'x'], async (keys) => keys.map((k) => (k === 'a' ? 1n : k)))
    const wrong = await cache.getOrLoadMany(['a'], async () => []).catch((err) => err.code)
    return { a: inner[0] instanceof Error ? inner[0].code : inner[0], wrong }
  })
  assert.deepEqual(got, { a: 'ERR_VALUE_NOT_SERIALIZABLE', wrong: 'ERR_INVALID_ARGUMENT' })
  assert.equal(await cache.get('x'), 'x')
})

test('what a loader leaves behind (a timer) runs outside its load once it has ended: it reads the cache as usual', { timeout: TIMEOUT }, async (t) => {
  const [cache] = caches(t, 1, {})
  let later
  const fired = new Promise((resolve) => {
    cache.getOrLoad('k', async () => {
      setTimeout(() => {
        // Options: the slow path, which looks at the loads enclosing it.
        later = cache.getOrLoad('k', () => 'a second load', { ttl: 60_000 })
        resolve()
      }, 30)
      return 'the load'
    })
  })
  await fired
  assert.equal(await later, 'the load', 'served from the cache, not loaded again')
})

test('two in-process caches are separate: a nested call to the other one loads and caches there', { timeout: TIMEOUT }, async (t) => {
  const [a, b] = caches(t, 2, { namespace: 'same' })
  const got = await a.getOrLoad('k', async () => `a(${await b.getOrLoad('k', async () => 'b')})`)
  assert.equal(got, 'a(b)')
  assert.equal(await b.get('k'), 'b', 'b cached its own load: the caches share nothing')
  assert.equal(await a.get('k'), 'a(b)')
})

test('Redis: two caches sharing a namespace and Redis: a nested call in the other one answers at once and writes nothing', { timeout: TIMEOUT }, async (t) => {
  const url = await redisUrl()
  const namespace = newNamespace('reentry')
  const [a, b] = caches(t, 2, { redis: url, namespace })
  const started = Date.now()
  const got = await settled(a.getOrLoad('k', async () => `a(${await b.getOrLoad('k', async () => 'b')})`))
  assert.deepEqual(got, { value: 'a(b)' })
  assert.ok(Date.now() - started < LOAD_TIMEOUT, 'no wait for the enclosing load or its lock')
  assert.equal(b.stats().l1Entries, 0, 'the nested call kept nothing')
  // The enclosing load wrote the key, in Redis: b reads a's value.
  assert.equal(await b.get('k'), 'a(b)')
  const raw = await shared.cmd('GET', `${namespace}:v:{k}`)
  assert.ok(raw !== null && raw.includes('a(b)'), `Redis holds the enclosing load's value: ${raw}`)
  // The same with the Redis given as an options object naming the same server and database.
  const { port } = new URL(url)
  const [c] = caches(t, 1, { redis: { url: `redis://localhost:${port}/0` }, namespace })
  const again = await settled(c.getOrLoad('j', async () => `c(${await a.getOrLoad('j', async () => 'a')})`))
  assert.deepEqual(again, { value: 'c(a)' })
  // And in ioredis's spelling (host, port, db).
  const [d] = caches(t, 1, { redis: { host: '127.0.0.1', port: Number(port), db: 0 }, namespace })
  const spelled = await settled(d.getOrLoad('h', async () => `d(${await a.getOrLoad('h', async () => 'a')})`))
  assert.deepEqual(spelled, { value: 'd(a)' })
  // Another namespace on the same Redis is another cache: its nested call loads and caches there.
  const [other] = caches(t, 1, { redis: url, namespace: newNamespace('reentry') })
  assert.equal(await a.getOrLoad('m', async () => `a(${await other.getOrLoad('m', async () => 'o')})`), 'a(o)')
  assert.equal(await other.get('m'), 'o')
})

test('Redis: a loadMany of one cache that calls getOrLoadMany of another sharing its namespace', { timeout: TIMEOUT }, async (t) => {
  const url = await redisUrl()
  const namespace = newNamespace('reentry')
  const [a, b] = caches(t, 2, { redis: url, namespace })
  const got = await settled(
    a.getOrLoadMany(['p', 'q'], async (missing) => {
      const inner = await b.getOrLoadMany(['q', 'r'], async (m) => m.map((k) => `b-${k}`))
      return missing.map((k) => `a-${k}:${inner.join(',')}`)
    }),
  )
  assert.deepEqual(got, { value: ['a-p:b-q,b-r', 'a-q:b-q,b-r'] })
  assert.deepEqual(await b.getMany(['p', 'q', 'r']), ['a-p:b-q,b-r', 'a-q:b-q,b-r', 'b-r'])
})

test('NestJS: a wrap inside a wrap of the same key, through two CacheModule registrations with one Redis URL', { timeout: TIMEOUT }, async (t) => {
  const url = await redisUrl()
  const namespace = newNamespace('reentry')
  const { NestFactory } = require('@nestjs/core')
  const { Module } = require('@nestjs/common')
  const { CacheModule, CACHE_MANAGER } = require('stampede-cache/nestjs')
  const managerOf = async () => {
    class AppModule {}
    Module({ imports: [CacheModule.register({ redis: url, namespace, loadTimeout: LOAD_TIMEOUT, ttl: 60_000 })] })(AppModule)
    const app = await NestFactory.createApplicationContext(AppModule, { logger: false })
    t.after(() => app.close())
    return app.get(CACHE_MANAGER)
  }
  const [one, two] = [await managerOf(), await managerOf()]
  let innerCalls = 0
  const started = Date.now()
  const got = await settled(
    one.wrap('page', async () => {
      const inner = await two.wrap('page', async () => {
        innerCalls++
        return { part: 'inner' }
      })
      const same = await one.wrap('page', async () => 'same-manager')
      return { outer: true, inner, same }
    }),
  )
  assert.deepEqual(got, { value: { outer: true, inner: { part: 'inner' }, same: 'same-manager' } })
  assert.ok(Date.now() - started < LOAD_TIMEOUT)
  assert.equal(innerCalls, 1)
  assert.deepEqual(await two.get('page'), { outer: true, inner: { part: 'inner' }, same: 'same-manager' })
})
