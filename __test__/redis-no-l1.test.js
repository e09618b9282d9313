'use strict'
// Every refresh decision with and without the in-process tier (docs/CONTRACT.md, getOrLoad 1-5):
// a cache built with `l1: false` reads every entry from Redis, so each decision the engine takes
// from its in-process entry (is it stale? did someone refresh it already? is a backoff in force?)
// must be taken from the envelope Redis answered instead. Each test runs twice, once with the
// default tier and once with `l1: false`, and asserts the same loads and values for both.
//
// Two caches in this process share a private redis-server: A writes the entry, B reads it.
// Counts are of loader calls, the values are checked, and waits for background work are
// `settle()` or polls with deadlines. The only sleeps let an entry's ttl pass.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { RedisServer, newNamespace, waitFor, sleep, killAllSync } = require('./helpers/redis-server')

after(() => killAllSync())

const TEST_TIMEOUT = 60_000
const TTL = 150

let redis
const started = (async () => {
  redis = new RedisServer()
  await redis.start()
  return redis
})()
after(() => redis?.dispose())

const TIERS = [
  ['in-process tier', {}],
  ['l1: false', { l1: false }],
]

/** Two caches (A writes, B reads) on one namespace of the private server. */
async function pair(t, tier, options = {}) {
  await started
  const base = { redis: redis.url, namespace: newNamespace('nol1'), ttl: TTL, hardTtl: 60_000, jitter: 0, beta: 0, ...tier, ...options }
  const a = new StampedeCache(base)
  const b = new StampedeCache(base)
  t.after(() => Promise.all([a.close(), b.close()]))
  return { a, b }
}

/** A loader that counts its calls and returns `value(n)` for the n-th. */
function counting(value = (n) => `v${n}`) {
  const loader = async () => {
    loader.calls++
    await sleep(2)
    return value(loader.calls)
  }
  loader.calls = 0
  return loader
}

const pastTtl = () => sleep(TTL + 50)

for (const [label, tier] of TIERS) {
  test(`${label}: a stale read serves the old value, refreshes it once in the background, and the next read gets the new one`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const { a, b } = await pair(t, tier)
    assert.equal(await a.getOrLoad('k', () => 'v0'), 'v0')
    // B knows the entry before it goes stale (with the in-process tier, it keeps a copy).
    assert.equal(await b.get('k'), 'v0')
    await pastTtl()
    const load = counting()
    assert.equal(await b.getOrLoad('k', load), 'v0', 'the stale value at once')
    await b.settle()
    assert.equal(load.calls, 1, 'one background refresh')
    assert.equal(b.stats().refreshes, 1)
    assert.equal(await b.getOrLoad('k', load), 'v1', 'the refreshed value')
    assert.equal(load.calls, 1)
    // The refresh reached Redis: A sees it too (from the bus, or Redis once its own copy goes).
    await waitFor(async () => (await a.get('k')) === 'v1', { what: 'A to read the refreshed value' })
  })

  test(`${label}: XFetch refreshes a fresh entry early, in the background`, { timeout: TEST_TIMEOUT }, async (t) => {
    // The largest beta and a 20 ms load make a draw refresh with probability 0.997
    // (now - computeMs * beta * ln(u) >= freshUntil); no stale window (hardTtl == ttl), so
    // XFetch is drawn at all.
    const { a, b } = await pair(t, tier, { ttl: 60_000, hardTtl: 60_000, beta: 1e6 })
    assert.equal(
      await a.getOrLoad('k', async () => {
        await sleep(20)
        return 'v1'
      }),
      'v1',
    )
    const load = counting((n) => `early${n}`)
    // A fresh value from Redis, then (in-process tier) one from B's own copy: a draw either way.
    assert.equal(await b.getOrLoad('k', load), 'v1', 'the fresh value at once')
    // The first read's early refresh may already have landed (l1: false reads Redis again).
    assert.ok(['v1', 'early1'].includes(await b.getOrLoad('k', load)))
    await b.settle()
    assert.ok(load.calls >= 1, `an early refresh ran (loads: ${load.calls})`)
    assert.ok(b.stats().refreshes >= 1)
    await waitFor(async () => (await b.get('k')) === 'early1', { what: 'the early refresh to be served' })
  })

  test(`${label}: a failed refresh keeps the stale value and holds refreshes back for errorBackoff, in every instance`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const errors = []
    const { a, b } = await pair(t, tier, { errorBackoff: 60_000, onError: (err, info) => errors.push(info.op) })
    assert.equal(await a.getOrLoad('k', () => 'v0'), 'v0')
    assert.equal(await b.get('k'), 'v0')
    await pastTtl()
    let failing = 0
    const fails = async () => {
      failing++
      throw new Error('source down')
    }
    assert.equal(await b.getOrLoad('k', fails), 'v0')
    await b.settle()
    assert.equal(failing, 1, 'the refresh ran and failed')
    assert.equal(b.stats().refreshErrors, 1)
    assert.ok(errors.includes('refresh'), `onError saw the refresh: ${errors}`)
    // Within the backoff: stale served, no refresh in B, nor in A (the backoff is in Redis).
    const load = counting()
    for (let i = 0; i < 3; i++) {
      assert.equal(await b.getOrLoad('k', load), 'v0')
      await b.settle()
    }
    const c = new StampedeCache({ redis: redis.url, namespace: a.namespace, ttl: TTL, hardTtl: 60_000, jitter: 0, beta: 0, ...tier })
    t.after(() => c.close())
    assert.equal(await c.getOrLoad('k', load), 'v0', 'a third instance is served the stale value')
    await c.settle()
    assert.equal(load.calls, 0, 'no refresh during the backoff, in any instance')
  })

  test(`${label}: forceRefresh loads now and replaces the entry for every instance`, { timeout: TEST_TIMEOUT }, async (t) => {
    const { a, b } = await pair(t, tier, { ttl: 60_000 })
    assert.equal(await a.getOrLoad('k', () => 'v0'), 'v0')
    assert.equal(await b.get('k'), 'v0')
    const load = counting()
    assert.equal(await b.getOrLoad('k', load, { forceRefresh: true }), 'v1')
    assert.equal(load.calls, 1)
    assert.equal(await b.getOrLoad('k', load), 'v1')
    await waitFor(async () => (await a.get('k')) === 'v1', { what: 'A to read the forced value' })
    assert.equal(load.calls, 1)
  })

  test(`${label}: a not-found result is cached for negativeTtl, then loaded again`, { timeout: TEST_TIMEOUT }, async (t) => {
    const { a, b } = await pair(t, tier, { negativeTtl: TTL })
    const load = counting(() => null)
    assert.equal(await a.getOrLoad('k', load), null)
    assert.equal(await b.getOrLoad('k', load), null, 'B is served the cached not-found')
    assert.equal(load.calls, 1)
    await pastTtl()
    await waitFor(
      async () => {
        await b.getOrLoad('k', load)
        await b.settle()
        return load.calls === 2
      },
      { what: 'the not-found to be loaded again after negativeTtl', timeout: 5_000 },
    )
    assert.equal(await b.getOrLoad('k', load), null)
    await b.settle()
    assert.equal(load.calls, 2, 'loaded once more, not on every read')
  })

  test(`${label}: maxConcurrentRefreshes bounds the refreshes running at once; every stale key is refreshed by later reads`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const { a, b } = await pair(t, tier, { maxConcurrentRefreshes: 1 })
    const keys = ['k1', 'k2', 'k3']
    for (const k of keys) assert.equal(await a.getOrLoad(k, () => `${k}:0`), `${k}:0`)
    for (const k of keys) assert.equal(await b.get(k), `${k}:0`)
    await pastTtl()
    let running = 0
    let most = 0
    const loads = new Map()
    const loader = async ({ key }) => {
      running++
      most = Math.max(most, running)
      loads.set(key, (loads.get(key) ?? 0) + 1)
      await sleep(20)
      running--
      return `${key}:1`
    }
    const served = await Promise.all(keys.map((k) => b.getOrLoad(k, loader)))
    assert.deepEqual(served, ['k1:0', 'k2:0', 'k3:0'], 'stale values at once')
    await b.settle()
    assert.equal(most, 1, 'one refresh at a time')
    await waitFor(
      async () => {
        const now = await Promise.all(keys.map((k) => b.getOrLoad(k, loader)))
        await b.settle()
        return now.every((v, i) => v === `${keys[i]}:1`)
      },
      { what: 'every key refreshed', timeout: 5_000 },
    )
    assert.equal(most, 1)
    for (const k of keys) assert.equal(loads.get(k), 1, `${k} refreshed once`)
  })

  test(`${label}: a refresh keeps the entry's tags, so deleteByTag elsewhere removes the refreshed entry`, { timeout: TEST_TIMEOUT }, async (t) => {
    const { a, b } = await pair(t, tier)
    assert.equal(await a.getOrLoad('k', () => 'v0', { tags: ['team'] }), 'v0')
    assert.equal(await b.get('k'), 'v0')
    await pastTtl()
    const load = counting()
    assert.equal(await b.getOrLoad('k', load), 'v0')
    await b.settle()
    assert.equal(load.calls, 1, 'refreshed')
    assert.equal(await b.getOrLoad('k', load), 'v1')
    await a.deleteByTag('team')
    await waitFor(async () => (await b.get('k')) === undefined, { what: 'the tagged entry to be gone in B' })
    assert.equal(await b.getOrLoad('k', load), 'v2', 'a cold load after deleteByTag')
    assert.equal(load.calls, 2)
  })

  test(`${label}: a stale read hands its refresh to waitUntil before it resolves`, { timeout: TEST_TIMEOUT }, async (t) => {
    const handed = []
    const { a, b } = await pair(t, tier, { waitUntil: (p) => handed.push(p) })
    assert.equal(await a.getOrLoad('k', () => 'v0'), 'v0')
    assert.equal(await b.get('k'), 'v0')
    await pastTtl()
    handed.length = 0
    const load = counting()
    const read = b.getOrLoad('k', load)
    let handedAtResolve = -1
    const value = await read.then((v) => {
      handedAtResolve = handed.length
      return v
    })
    assert.equal(value, 'v0')
    assert.equal(handedAtResolve, 1, 'the refresh was handed over before the read resolved')
    await Promise.all(handed)
    assert.equal(load.calls, 1, 'the promise handed over covers the refresh')
    assert.equal(await b.getOrLoad('k', load), 'v1')
  })
}

// get() on a tier that keeps nothing asks nothing of it (no in-process lookup, no adoption): each
// read is Redis's, and is counted and published as any read from Redis is.
for (const [label, l1] of [
  ['l1: false', false],
  ['l1: { maxEntries: 0 }', { maxEntries: 0 }],
]) {
  test(`${label}: get() answers Redis's value or a miss, counted and published as before; a bad key, a closed cache and no Redis answer as before`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const dc = require('node:diagnostics_channel')
    const { a, b } = await pair(t, { l1 })
    await a.set('k', { n: 1 })
    const seen = []
    const onHit = (m) => m.cache === b && seen.push(['hit', m.key, m.tier])
    const onMiss = (m) => m.cache === b && seen.push(['miss', m.key])
    dc.subscribe('stampede-cache:hit', onHit)
    dc.subscribe('stampede-cache:miss', onMiss)
    try {
      assert.deepEqual(await b.get('k'), { n: 1 })
      assert.equal(await b.get('absent'), undefined)
      assert.deepEqual(await b.get('k'), { n: 1 })
    } finally {
      dc.unsubscribe('stampede-cache:hit', onHit)
      dc.unsubscribe('stampede-cache:miss', onMiss)
    }
    assert.deepEqual(seen, [
      ['miss', 'k'],
      ['hit', 'k', 'redis'],
      ['miss', 'absent'],
      ['miss', 'k'],
      ['hit', 'k', 'redis'],
    ])
    const s = b.stats()
    assert.deepEqual([s.hits, s.l2Hits, s.misses, s.l1Entries, s.loads], [0, 2, 1, 0, 0])
    await assert.rejects(b.get(''), { code: 'ERR_INVALID_KEY' })
    await assert.rejects(b.get(42), { code: 'ERR_INVALID_KEY' })

    // Without Redis, a miss is counted all the same.
    const alone = new StampedeCache({ namespace: newNamespace('nol1'), l1 })
    assert.equal(await alone.get('k'), undefined)
    assert.equal(alone.stats().misses, 1)
    await alone.close()
    await assert.rejects(alone.get('k'), { code: 'ERR_CLOSED' })
  })
}
