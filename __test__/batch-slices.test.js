'use strict'
// Short holds of the event loop (docs/CONTRACT.md, Many keys at once): a batch's work on the JS
// thread grows linearly with its keys and yields between slices, so even a cold batch of 10,000
// keys never holds the loop for long at a time. In process and with Redis (a private
// redis-server), cold, warm, stale, and getMany.
//
// Time on a shared 2-core machine is noise, so the asserts count: how many times the loop
// turned during a batch (a 1 ms interval's ticks), and that no stretch held most of the batch
// (the longest gap, less the garbage collector's pauses in it, against the whole call). The
// figures themselves are reported (t.diagnostic).

const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { PerformanceObserver } = require('node:perf_hooks')
const { StampedeCache } = require('..')
const { RedisServer, killAllSync, newNamespace } = require('./helpers/redis-server')

after(() => killAllSync())

const N = 10_000
const keysOf = (n, tag) => Array.from({ length: n }, (_, i) => `${tag}:${i}`)
const loadMany = (ks) => ks.map((k) => ({ k, payload: 'x'.repeat(64) }))

/**
 * Runs `call` with a 1 ms interval beside it: the loop's turns and its longest gap during it,
 * and that gap without the garbage collector's pauses in it (`longestJs`): on a loaded 2-core
 * machine a scavenge of the young generation has taken 400 ms, which is V8's time, not a
 * stretch of the batch's work.
 */
async function held(call) {
  let ticks = 0
  let last = performance.now()
  let longest = 0
  let longestJs = 0
  const gcs = []
  const observer = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) gcs.push([e.startTime, e.startTime + e.duration])
  })
  observer.observe({ entryTypes: ['gc'] })
  const gaps = []
  const timer = setInterval(() => {
    const now = performance.now()
    gaps.push([last, now])
    last = now
    ticks++
  }, 1)
  await new Promise((resolve) => setTimeout(resolve, 5))
  ticks = 0
  gaps.length = 0
  const started = performance.now()
  last = started
  const result = await call()
  const total = performance.now() - started
  gaps.push([last, performance.now()])
  clearInterval(timer)
  // The observer reports a pause after it: let it.
  await new Promise((resolve) => setTimeout(resolve, 20))
  observer.disconnect()
  for (const [from, to] of gaps) {
    const inGc = gcs.reduce((sum, [a, b]) => sum + Math.max(0, Math.min(b, to) - Math.max(a, from)), 0)
    longest = Math.max(longest, to - from)
    longestJs = Math.max(longestJs, to - from - inGc)
  }
  return { result, ticks, longest, longestJs, total }
}

/** A cold (or stale) batch of N keys: sliced, never one stretch. */
function assertSliced(t, label, m) {
  t.diagnostic(
    `${label}: ${N} keys in ${m.total.toFixed(0)} ms, longest hold ${m.longest.toFixed(1)} ms (${m.longestJs.toFixed(1)} ms of it not the GC's), ${m.ticks} turns of the loop`,
  )
  assert.ok(m.ticks >= 8, `${label}: the loop turned ${m.ticks} times during the batch`)
  assert.ok(m.longestJs < Math.max(150, m.total / 4), `${label}: one stretch held ${m.longestJs.toFixed(0)} of ${m.total.toFixed(0)} ms`)
}

/** A warm batch is short: one stretch is fine, a long one is not. */
function assertShort(t, label, m) {
  t.diagnostic(`${label}: ${N} keys in ${m.total.toFixed(0)} ms, longest hold ${m.longest.toFixed(1)} ms (${m.longestJs.toFixed(1)} ms not the GC's)`)
  assert.ok(m.longestJs < 400, `${label}: held the loop ${m.longestJs.toFixed(0)} ms`)
}

test('in process: a cold batch of 10,000 keys is sliced; warm ones are short; every key answered once', async (t) => {
  const cache = new StampedeCache({ l1: { maxEntries: 3 * N } })
  t.after(() => cache.close())
  const keys = keysOf(N, 'p')
  let calls = 0
  const cold = await held(() =>
    cache.getOrLoadMany(keys, (ks) => {
      calls++
      assert.equal(ks.length, N, 'one loadMany call gets every key')
      return loadMany(ks)
    }),
  )
  assert.equal(calls, 1)
  assert.deepEqual(cold.result[N - 1], { k: `p:${N - 1}`, payload: 'x'.repeat(64) })
  assertSliced(t, 'cold getOrLoadMany', cold)
  const warm = await held(() => cache.getOrLoadMany(keys, () => assert.fail('all are cached')))
  assert.equal(warm.result[7].k, 'p:7')
  assertShort(t, 'warm getOrLoadMany', warm)
  const many = await held(() => cache.getMany(keys))
  assert.equal(many.result[N - 1].k, `p:${N - 1}`)
  assertShort(t, 'warm getMany', many)
  // Single-key callers beside a cold batch (before it, and right after it, while its later
  // slices are still to be led): every key is loaded exactly once, by one of them.
  const keys2 = keysOf(N, 'q')
  const loadedBy = new Map()
  const one = (k) =>
    cache.getOrLoad(k, () => {
      loadedBy.set(k, (loadedBy.get(k) ?? 0) + 1)
      return { k, payload: 'x'.repeat(64) }
    })
  const before = one(keys2[N / 2])
  const batch = cache.getOrLoadMany(keys2, (ks) => {
    for (const k of ks) loadedBy.set(k, (loadedBy.get(k) ?? 0) + 1)
    return loadMany(ks)
  })
  const after = [keys2[0], keys2[N - 1], keys2[N - 2]].map(one)
  const [out, ...singles] = await Promise.all([batch, before, ...after])
  assert.equal(loadedBy.size, N)
  assert.ok(
    [...loadedBy.values()].every((c) => c === 1),
    'each key loaded once',
  )
  out.forEach((v, i) => assert.equal(v.k, keys2[i]))
  for (const v of singles) assert.ok(keys2.includes(v.k))
})

test('close() between the slices of a cold batch: the call rejects with ERR_CLOSED, a caller joined on a key it led is answered', async () => {
  const cache = new StampedeCache()
  const keys = keysOf(N, 'c')
  const batch = cache.getOrLoadMany(keys, loadMany)
  // Joins a key of the first slice, whose flight waits for the batch's loadMany call.
  const joined = cache.getOrLoad(keys[3], () => assert.fail('joined, not loaded'))
  setImmediate(() => cache.close())
  const settled = await Promise.race([Promise.allSettled([batch, joined]), new Promise((resolve) => setTimeout(() => resolve('hung'), 10_000).unref())])
  assert.notEqual(settled, 'hung', 'every call is answered')
  const [b, j] = settled
  assert.equal(b.status, 'rejected')
  assert.equal(b.reason.code, 'ERR_CLOSED')
  if (j.status === 'rejected') assert.equal(j.reason.code, 'ERR_CLOSED')
  else assert.equal(j.value.k, keys[3])
})

test('in process: 10,000 stale keys are refreshed in one loadMany call, in slices, handed to waitUntil at once', async (t) => {
  const handed = []
  const cache = new StampedeCache({ ttl: 50, hardTtl: 60_000, jitter: 0, waitUntil: (p) => handed.push(p), l1: { maxEntries: 2 * N } })
  t.after(() => cache.close())
  const keys = keysOf(N, 's')
  await cache.getOrLoadMany(keys, loadMany)
  await new Promise((resolve) => setTimeout(resolve, 80))
  let refreshed = 0
  const m = await held(async () => {
    const out = await cache.getOrLoadMany(keys, (ks) => {
      refreshed += ks.length
      return loadMany(ks)
    })
    assert.equal(handed.length, 1, 'handed to waitUntil before the call resolved')
    await handed[0]
    return out
  })
  assert.equal(m.result[3].k, 's:3', 'stale values served')
  assert.equal(refreshed, N)
  assert.equal(cache.stats().refreshes, 1)
  assertSliced(t, 'stale getOrLoadMany and its refresh', m)
})

test('in process: the facade work of a batch is linear in its keys (1,000 against 10,000)', async (t) => {
  // Counted: the loop turns per key stay alike, and CPU time per key does not grow with the batch
  // (the slowest of three runs of 1,000 against the fastest of three of 10,000: generous).
  const perKey = async (n, tag) => {
    const cache = new StampedeCache({ l1: { maxEntries: n } })
    try {
      const before = process.cpuUsage()
      await cache.getOrLoadMany(keysOf(n, tag), loadMany)
      const used = process.cpuUsage(before)
      return (used.user + used.system) / n
    } finally {
      await cache.close()
    }
  }
  await perKey(2_000, 'warmup')
  const small = []
  const large = []
  for (let r = 0; r < 3; r++) {
    small.push(await perKey(1_000, `a${r}`))
    large.push(await perKey(N, `b${r}`))
  }
  const ratio = Math.min(...large) / Math.max(...small)
  t.diagnostic(
    `CPU per key: 1,000 keys ${small.map((x) => x.toFixed(1)).join('/')} us, 10,000 keys ${large.map((x) => x.toFixed(1)).join('/')} us (ratio ${ratio.toFixed(2)})`,
  )
  assert.ok(ratio < 3, `CPU per key grew ${ratio.toFixed(2)}x from 1,000 to 10,000 keys`)
})

describe('with Redis', () => {
  let redis
  before(async () => {
    redis = new RedisServer()
    await redis.start()
  })
  after(() => redis?.dispose())

  test('a cold batch of 10,000 keys is sliced; read back by another instance (Redis hits), warm batches are short', async (t) => {
    const namespace = newNamespace('scslice')
    const a = new StampedeCache({ redis: { url: redis.url, commandTimeout: 5_000 }, namespace, l1: { maxEntries: 2 * N } })
    t.after(() => a.close())
    const keys = keysOf(N, 'r')
    let calls = 0
    const cold = await held(() =>
      a.getOrLoadMany(keys, (ks) => {
        calls++
        return loadMany(ks)
      }),
    )
    assert.equal(calls, 1)
    assert.equal(cold.result[N - 1].k, `r:${N - 1}`)
    assert.equal(a.stats().redisErrors, 0)
    assertSliced(t, 'cold getOrLoadMany with Redis', cold)
    // Every value is in Redis: another instance reads them all (no l1 there yet).
    const b = new StampedeCache({ redis: redis.url, namespace, l1: { maxEntries: 2 * N } })
    t.after(() => b.close())
    await b.get('nothing')
    const fromRedis = await held(() => b.getOrLoadMany(keys, () => assert.fail('all are in Redis')))
    assert.equal(fromRedis.result[5].k, 'r:5')
    assertShort(t, 'getOrLoadMany from Redis', fromRedis)
    const c = new StampedeCache({ redis: redis.url, namespace })
    t.after(() => c.close())
    await c.get('nothing')
    const many = await held(() => c.getMany(keys))
    assert.equal(many.result[N - 1].k, `r:${N - 1}`)
    assertShort(t, 'getMany from Redis', many)
    assert.equal(b.stats().l2Hits, N)
  })
})
