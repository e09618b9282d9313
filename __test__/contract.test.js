'use strict'
// Behaviour tests of the public contract (docs/CONTRACT.md), in-process tier only (no `redis`).
// One describe per numbered point of "getOrLoad", then "The rest", constructor options and ESM.
//
// Timing: ttls are small and waits comfortably past them; nothing asserts how long something took.
// "At once" / "not blocked" is proven with loaders gated on promises the test controls.

const { describe, test } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const { getEventListeners } = require('node:events')
const { StampedeCache, StampedeCacheError } = require('..')
const { sleep, tick, deferred, settledWithin, within, rejectsWithCode, throwsWithCode, assertNoLeaks, assertNothingInFlight } = require('./helpers/assertions')
const { eventually } = require('./helpers/eventually')

const STATS_KEYS = [
  'hits',
  'staleHits',
  'misses',
  'loads',
  'coalesced',
  'refreshes',
  'refreshErrors',
  'negativeHits',
  'lockWins',
  'lockWaits',
  'redisErrors',
  'l2Hits',
  'l1Entries',
  'l1Bytes',
  'replayQueued',
  'replayDropped',
]

/** Waits until `cache.inspect(key)` reports `state` (polling), at most `ms`. */
async function waitForState(cache, key, state, ms = 3_000) {
  const deadline = Date.now() + ms
  for (;;) {
    const info = await cache.inspect(key)
    if (info?.state === state) return info
    if (Date.now() > deadline) assert.fail(`${JSON.stringify(key)} never became ${state}: ${JSON.stringify(info)}`)
    await sleep(10)
  }
}

// ---------------------------------------------------------------------------------------------
describe('1. a fresh entry resolves at once; XFetch may refresh early', () => {
  test('a fresh hit resolves with the cached value and never calls the loader', async () => {
    const cache = new StampedeCache({ ttl: 10_000, jitter: 0 })
    try {
      let calls = 0
      const loader = async () => {
        calls++
        return { v: calls }
      }
      assert.deepEqual(await cache.getOrLoad('k', loader), { v: 1 })
      assert.deepEqual(await cache.getOrLoad(['arr', 1], loader), { v: 2 })
      // A loader that would never finish: a fresh hit must not wait for it.
      const never = () => {
        calls++
        return new Promise(() => {})
      }
      for (let i = 0; i < 50; i++) {
        assert.deepEqual(await within(cache.getOrLoad('k', never), 2_000, 'fresh hit'), { v: 1 })
      }
      assert.deepEqual(await within(cache.getOrLoad('k', never, { ttl: 10_000 }), 2_000, 'fresh hit with options'), { v: 1 })
      assert.deepEqual(await within(cache.getOrLoad(['arr', 1], never), 2_000, 'fresh hit, array key'), { v: 2 })
      assert.equal(calls, 2)
      const s = cache.stats()
      assert.equal(s.hits, 52)
      assert.equal(s.loads, 2)
      assert.equal(s.misses, 2)
      assert.equal(s.refreshes, 0)
      await assertNoLeaks(cache, 2)
    } finally {
      await cache.close()
    }
  })

  test('XFetch: a large beta with a slow loader starts a refresh before expiry (handed to waitUntil)', async () => {
    const handed = []
    // computeMs ~30 ms * beta 10: a read with r ms left refreshes with probability exp(-r / 300).
    // hardTtl == ttl: no stale window, so nothing but an early refresh spares a reader the wait.
    const cache = new StampedeCache({ ttl: 1_000, hardTtl: 1_000, beta: 10, jitter: 0, waitUntil: (p) => handed.push(p) })
    try {
      const calls = []
      const loader = async (ctx) => {
        calls.push({ at: Date.now(), stale: ctx.stale })
        await sleep(30)
        return `v${calls.length}`
      }
      assert.equal(await cache.getOrLoad('k', loader), 'v1')
      const info = await cache.inspect('k')
      assert.equal(info.state, 'fresh')
      assert.ok(info.computeMs >= 20, `computeMs ${info.computeMs} should reflect the ~30 ms load`)
      // Read (each read a fresh hit) until a refresh starts; stop well before expiry.
      let reads = 0
      while (calls.length === 1 && Date.now() < info.freshUntil - 100) {
        assert.equal(await cache.getOrLoad('k', loader), 'v1')
        reads++
        await sleep(5)
      }
      assert.equal(calls.length, 2, `an early refresh should have started within ${reads} fresh reads`)
      assert.ok(calls[1].at < info.freshUntil, 'the refresh started before the entry went stale')
      assert.equal(calls[1].stale, 'v1', 'the refresh loader sees the current value as ctx.stale')
      const s = cache.stats()
      assert.equal(s.staleHits, 0, 'no read was stale: the refresh was an early one')
      assert.equal(s.refreshes, 1)
      assert.equal(handed.length, 1, 'the early refresh is handed to waitUntil')
      await within(handed[0], 5_000, 'waitUntil promise')
      assert.equal(await cache.get('k'), 'v2')
      const after = await cache.inspect('k')
      assert.ok(after.freshUntil > info.freshUntil, 'the refresh wrote a new entry')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('XFetch: a stale window that covers a refresh leaves it to the first stale read', async () => {
    // computeMs ~30 ms * beta 3 reaches at most 30 * 3 * 37 = 3.3 s ahead of expiry; the 59 s
    // stale window covers that (it would take a 530 ms load not to): the entry is served stale at
    // once while one refresh runs, so an early refresh would only cost a load. Without the window
    // (the test above) the same reads refresh early with near certainty.
    const cache = new StampedeCache({ ttl: 1_000, hardTtl: 60_000, beta: 3, jitter: 0 })
    try {
      let calls = 0
      const loader = async () => {
        calls++
        await sleep(30)
        return `v${calls}`
      }
      assert.equal(await cache.getOrLoad('k', loader), 'v1')
      const info = await cache.inspect('k')
      let reads = 0
      while (Date.now() < info.freshUntil - 50) {
        assert.equal(await cache.getOrLoad('k', loader), 'v1')
        reads++
        await sleep(5)
      }
      assert.ok(reads > 5, `too few reads (${reads}) to prove anything`)
      assert.equal(calls, 1, 'no early refresh inside a covering stale window')
      assert.equal(cache.stats().refreshes, 0)
      await waitForState(cache, 'k', 'stale')
      assert.equal(await cache.getOrLoad('k', loader), 'v1', 'the stale value is served at once')
      await cache.settle()
      const s = cache.stats()
      assert.equal(calls, 2)
      assert.equal(s.staleHits, 1)
      assert.equal(s.refreshes, 1)
      assert.equal(await cache.get('k'), 'v2')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('XFetch: beta 0 (constructor) never refreshes early, only once stale', async () => {
    const cache = new StampedeCache({ ttl: 500, hardTtl: 20_000, beta: 0, jitter: 0 })
    try {
      let calls = 0
      const loader = async () => {
        calls++
        await sleep(30)
        return `v${calls}`
      }
      assert.equal(await cache.getOrLoad('k', loader), 'v1')
      const info = await cache.inspect('k')
      // With beta 10 and no stale window this loop would refresh with near certainty (see the
      // first test above).
      let reads = 0
      while (Date.now() < info.freshUntil - 80) {
        assert.equal(await cache.getOrLoad('k', loader), 'v1')
        reads++
        await sleep(5)
      }
      assert.ok(reads > 5, `too few reads (${reads}) to prove anything`)
      assert.equal(calls, 1, 'beta 0 must not refresh early')
      assert.equal(cache.stats().refreshes, 0)
      // Once stale, a read does refresh (so the loop above could have seen one).
      await waitForState(cache, 'k', 'stale')
      assert.equal(await cache.getOrLoad('k', loader), 'v1')
      await cache.settle()
      assert.equal(calls, 2)
      assert.equal(await cache.get('k'), 'v2')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('XFetch: a per-call beta 0 overrides a large constructor beta', async () => {
    // No stale window: the constructor's beta alone would refresh early (see the first test).
    const cache = new StampedeCache({ ttl: 500, hardTtl: 500, beta: 10, jitter: 0 })
    try {
      let calls = 0
      const loader = async () => {
        calls++
        await sleep(30)
        return `v${calls}`
      }
      assert.equal(await cache.getOrLoad('k', loader, { beta: 0 }), 'v1')
      const info = await cache.inspect('k')
      let reads = 0
      while (Date.now() < info.freshUntil - 80) {
        assert.equal(await cache.getOrLoad('k', loader, { beta: 0 }), 'v1')
        reads++
        await sleep(5)
      }
      assert.ok(reads > 5, `too few reads (${reads}) to prove anything`)
      assert.equal(calls, 1, 'a per-call beta 0 must not refresh early')
      assert.equal(cache.stats().refreshes, 0)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('2. a stale entry is served at once and refreshed once in the background', () => {
  test('resolves with the stale value without waiting for the refresh; the refresh then replaces it', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0 })
    try {
      assert.deepEqual(await cache.getOrLoad('k', () => ({ v: 1 })), { v: 1 })
      await sleep(150)
      assert.equal((await cache.inspect('k')).state, 'stale')
      const gate = deferred()
      const seen = []
      const slow = async (ctx) => {
        seen.push(ctx)
        await gate.promise // the "2 s" loader: finishes only when the test says so
        return { v: 2 }
      }
      // The read resolves while the refresh is still blocked.
      const v = await within(cache.getOrLoad('k', slow), 2_000, 'stale read')
      assert.deepEqual(v, { v: 1 })
      await tick()
      assert.equal(seen.length, 1, 'exactly one refresh started')
      assert.equal(seen[0].key, 'k')
      assert.deepEqual(seen[0].stale, { v: 1 }, 'ctx.stale is the stale value')
      assert.equal(seen[0].signal.aborted, false)
      // While it runs, readers still get the stale value at once.
      assert.deepEqual(await within(cache.getOrLoad('k', slow), 2_000, 'stale read'), { v: 1 })
      const afterReads = cache.stats()
      assert.equal(afterReads.refreshes, 1)
      assert.equal(afterReads.staleHits, 2)
      assert.deepEqual(await cache.get('k'), { v: 1 })
      gate.resolve()
      await within(cache.settle(), 5_000, 'settle')
      assert.equal(seen.length, 1)
      assert.deepEqual(await cache.get('k'), { v: 2 })
      assert.equal((await cache.inspect('k')).state, 'fresh')
      assert.deepEqual(await cache.getOrLoad('k', () => assert.fail('fresh now')), { v: 2 })
      assert.equal(cache.stats().refreshes, 1)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  for (const key of ['hot', ['hot', 'array', 7]]) {
    test(`200 concurrent stale readers start exactly one refresh (key ${JSON.stringify(key)})`, async () => {
      const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0 })
      try {
        let calls = 0
        const gate = deferred()
        const loader = async () => {
          calls++
          if (calls > 1) await gate.promise
          return { version: calls }
        }
        await cache.getOrLoad(key, loader)
        await sleep(150)
        const before = cache.stats()
        const values = await within(Promise.all(Array.from({ length: 200 }, () => cache.getOrLoad(key, loader))), 3_000, 'stale reads')
        for (const v of values) assert.deepEqual(v, { version: 1 })
        assert.equal(calls, 2, 'one initial load and exactly one refresh')
        // More stale readers while the refresh is still running start nothing.
        const more = await within(Promise.all(Array.from({ length: 50 }, () => cache.getOrLoad(key, loader))), 3_000, 'stale reads')
        for (const v of more) assert.deepEqual(v, { version: 1 })
        assert.equal(calls, 2)
        const s = cache.stats()
        assert.equal(s.staleHits - before.staleHits, 250)
        assert.equal(s.refreshes, 1)
        gate.resolve()
        await within(cache.settle(), 5_000, 'settle')
        assert.deepEqual(await cache.get(key), { version: 2 })
        assert.equal(calls, 2)
        await assertNoLeaks(cache, 1)
      } finally {
        await cache.close()
      }
    })
  }

  test('waitUntil (constructor) receives the refresh promise before the getOrLoad promise resolves', async () => {
    const handed = []
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0, waitUntil: (p) => handed.push(p) })
    try {
      await cache.getOrLoad('k', () => 'old')
      await cache.getOrLoad(['a', 'k'], () => 'old-a')
      assert.equal(handed.length, 0, 'cold loads and fresh hits are not background work')
      await sleep(150)
      const gate = deferred()
      const refresh = async () => {
        await gate.promise
        return 'new'
      }
      for (const [i, key] of [['k'], [['a', 'k']]].map((x, i) => [i, x[0]])) {
        let inThen
        const p = cache.getOrLoad(key, refresh).then((v) => {
          inThen = handed.length
          return v
        })
        assert.equal(handed.length, i + 1, 'handed over synchronously, during the getOrLoad call')
        assert.equal(await within(p, 2_000, 'stale read'), i === 0 ? 'old' : 'old-a')
        assert.equal(inThen, i + 1, 'the hook was called before the getOrLoad promise resolved')
        assert.ok(handed[i] && typeof handed[i].then === 'function', 'waitUntil gets a promise')
      }
      // The handed promise ends when the refresh has ended (and written the new value).
      assert.equal(await settledWithin(handed[0], 50), 'pending', 'the handed promise waits for the refresh')
      gate.resolve()
      await within(Promise.all(handed), 5_000, 'handed promises')
      assert.equal(await cache.get('k'), 'new')
      assert.equal(await cache.get(['a', 'k']), 'new')
      assert.equal(handed.length, 2)
      await assertNoLeaks(cache, 2)
    } finally {
      await cache.close()
    }
  })

  test('a per-call waitUntil overrides the constructor one for that call', async () => {
    const fromCtor = []
    const fromCall = []
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0, waitUntil: (p) => fromCtor.push(p) })
    try {
      await cache.getOrLoad('k', () => 1)
      await sleep(150)
      let inThen
      const p = cache
        .getOrLoad('k', () => 2, { waitUntil: (x) => fromCall.push(x) })
        .then((v) => {
          inThen = fromCall.length
          return v
        })
      assert.equal(fromCall.length, 1)
      assert.equal(await p, 1)
      assert.equal(inThen, 1)
      assert.equal(fromCtor.length, 0, 'the constructor hook is not called for that refresh')
      await within(fromCall[0], 5_000, 'handed promise')
      assert.equal(await cache.get('k'), 2)
      // Without the override, the constructor hook is used again.
      await sleep(150)
      assert.equal(await cache.getOrLoad('k', () => 3), 2)
      assert.equal(fromCtor.length, 1)
      assert.equal(fromCall.length, 1)
      await cache.settle()
      assert.equal(await cache.get('k'), 3)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('past hardTtl the entry is gone: the caller waits for a cold load', async () => {
    const cache = new StampedeCache({ ttl: 40, hardTtl: 80, jitter: 0 })
    try {
      await cache.getOrLoad('k', () => 'old')
      await sleep(250)
      assert.equal(await cache.inspect('k'), undefined)
      assert.equal(await cache.get('k'), undefined)
      const gate = deferred()
      const p = cache.getOrLoad('k', async () => {
        await gate.promise
        return 'new'
      })
      assert.equal(await settledWithin(p, 50), 'pending', 'an expired entry is not served')
      gate.resolve()
      assert.equal(await p, 'new')
      assert.equal(cache.stats().refreshes, 0)
      assert.equal(cache.stats().staleHits, 0)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('3. a missing entry: concurrent callers share one loader call', () => {
  test('500 concurrent callers of one cold key: 1 loader call, equal values, loads 1, coalesced 499', async () => {
    const cache = new StampedeCache()
    try {
      let calls = 0
      const loader = async () => {
        calls++
        await sleep(20)
        return { user: 'ada', roles: ['admin', 'dev'], n: 42 }
      }
      const values = await Promise.all(Array.from({ length: 500 }, () => cache.getOrLoad('cold', loader)))
      assert.equal(calls, 1)
      assert.equal(values.length, 500)
      for (const v of values) assert.deepEqual(v, { user: 'ada', roles: ['admin', 'dev'], n: 42 })
      const s = cache.stats()
      assert.equal(s.loads, 1)
      assert.equal(s.coalesced, 499)
      assert.equal(s.misses, 500)
      assert.equal(s.hits, 0)
      assert.equal(s.refreshes, 0)
      await assertNoLeaks(cache, 1)
      // Afterwards: a hit.
      assert.deepEqual(await cache.getOrLoad('cold', () => assert.fail('must hit')), { user: 'ada', roles: ['admin', 'dev'], n: 42 })
      assert.equal(calls, 1)
    } finally {
      await cache.close()
    }
  })

  test('callers arriving in later ticks while the load runs still join it', async () => {
    const cache = new StampedeCache()
    try {
      let calls = 0
      const gate = deferred()
      const loader = async () => {
        calls++
        await gate.promise
        return 'v'
      }
      const ps = []
      for (let round = 0; round < 5; round++) {
        for (let i = 0; i < 100; i++) ps.push(cache.getOrLoad(['late', 'key'], loader))
        await sleep(5)
      }
      assert.equal(calls, 1)
      gate.resolve()
      const values = await Promise.all(ps)
      assert.ok(values.every((v) => v === 'v'))
      assert.equal(calls, 1)
      assert.equal(cache.stats().loads, 1)
      assert.equal(cache.stats().coalesced, 499)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('different keys load independently: 20 keys x 30 callers = 20 loader calls', async () => {
    const cache = new StampedeCache()
    try {
      const perKey = new Map()
      const loader = async (ctx) => {
        perKey.set(ctx.key, (perKey.get(ctx.key) ?? 0) + 1)
        await sleep(10)
        return `value of ${ctx.key}`
      }
      const ps = []
      for (let c = 0; c < 30; c++) {
        for (let k = 0; k < 20; k++) ps.push(cache.getOrLoad(`key-${k}`, loader).then((v) => [k, v]))
      }
      for (const [k, v] of await Promise.all(ps)) assert.equal(v, `value of key-${k}`)
      assert.equal(perKey.size, 20)
      for (const n of perKey.values()) assert.equal(n, 1)
      assert.equal(cache.stats().loads, 20)
      assert.equal(cache.stats().coalesced, 580)
      await assertNoLeaks(cache, 20)
    } finally {
      await cache.close()
    }
  })

  test('the loader gets { key, stale: undefined, signal } and its value is stored fresh', async () => {
    const cache = new StampedeCache({ ttl: 5_000, jitter: 0 })
    try {
      let ctx
      const before = Date.now()
      const v = await cache.getOrLoad('ctx-key', async (c) => {
        ctx = c
        await sleep(25)
        return 'x'
      })
      const after = Date.now()
      assert.equal(v, 'x')
      assert.equal(ctx.key, 'ctx-key')
      assert.equal(ctx.stale, undefined)
      assert.ok(ctx.signal instanceof AbortSignal)
      assert.equal(ctx.signal.aborted, false)
      const info = await cache.inspect('ctx-key')
      assert.equal(info.state, 'fresh')
      assert.ok(info.freshUntil >= before + 5_000 - 2 && info.freshUntil <= after + 5_000 + 2, `freshUntil ${info.freshUntil}`)
      assert.ok(info.computeMs >= 15 && info.computeMs < 5_000, `computeMs ${info.computeMs}`)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('4. null/undefined results are cached for negativeTtl and returned as is', () => {
  for (const [label, nothing] of [
    ['null', null],
    ['undefined', undefined],
  ]) {
    test(`${label}: returned as is, not reloaded within negativeTtl, reloaded after`, async () => {
      const cache = new StampedeCache({ ttl: 60_000, negativeTtl: 100, jitter: 0 })
      try {
        let calls = 0
        const loader = async () => {
          calls++
          return calls === 1 ? nothing : 'found'
        }
        const first = await cache.getOrLoad('user:404', loader)
        assert.ok(Object.is(first, nothing), `expected ${label}, got ${first}`)
        const info = await cache.inspect('user:404')
        assert.equal(info.state, 'negative')
        for (let i = 0; i < 10; i++) {
          const v = await cache.getOrLoad('user:404', loader)
          assert.ok(Object.is(v, nothing), `hit ${i}: expected ${label}, got ${v}`)
        }
        assert.equal(calls, 1)
        assert.equal(cache.stats().negativeHits, 10)
        assert.equal(cache.stats().hits, 0)
        assert.ok(Object.is(await cache.get('user:404'), nothing), 'get() returns the cached not-found')
        await sleep(250)
        assert.equal(await cache.getOrLoad('user:404', loader), 'found')
        assert.equal(calls, 2)
        assert.equal((await cache.inspect('user:404')).state, 'fresh')
        await assertNoLeaks(cache, 1)
      } finally {
        await cache.close()
      }
    })
  }

  test('negativeTtl 0 caches no not-found (constructor and per call)', async () => {
    const cache = new StampedeCache({ negativeTtl: 0 })
    try {
      let calls = 0
      const loader = () => {
        calls++
        return null
      }
      for (let i = 0; i < 3; i++) assert.equal(await cache.getOrLoad('k', loader), null)
      assert.equal(calls, 3)
      assert.equal(await cache.inspect('k'), undefined)
      assert.equal(cache.stats().negativeHits, 0)
      // Concurrent callers still share the one load.
      const vs = await Promise.all(
        Array.from({ length: 20 }, () =>
          cache.getOrLoad('k2', async () => {
            calls++
            await sleep(10)
            return undefined
          }),
        ),
      )
      assert.ok(vs.every((v) => v === undefined))
      assert.equal(calls, 4)
      await assertNoLeaks(cache, 0)
    } finally {
      await cache.close()
    }
    const cache2 = new StampedeCache({ negativeTtl: 60_000 })
    try {
      let calls = 0
      const loader = () => {
        calls++
        return null
      }
      await cache2.getOrLoad('k', loader, { negativeTtl: 0 })
      await cache2.getOrLoad('k', loader, { negativeTtl: 0 })
      assert.equal(calls, 2, 'per-call negativeTtl 0 caches nothing')
      await cache2.getOrLoad('k', loader, { negativeTtl: 100 })
      await cache2.getOrLoad('k', loader)
      assert.equal(calls, 3, 'per-call negativeTtl 100 caches it')
      await sleep(250)
      await cache2.getOrLoad('k', loader)
      assert.equal(calls, 4, 'the per-call negativeTtl (not the constructor 60 s) applied')
    } finally {
      await cache2.close()
    }
  })

  test('falsy JSON values (0, false, "") are real values, not not-founds', async () => {
    const cache = new StampedeCache({ negativeTtl: 0 })
    try {
      for (const [key, value] of [
        ['zero', 0],
        ['false', false],
        ['empty', ''],
      ]) {
        let calls = 0
        const loader = () => {
          calls++
          return value
        }
        assert.equal(await cache.getOrLoad(key, loader), value)
        assert.equal(await cache.getOrLoad(key, loader), value)
        assert.equal(calls, 1, `${key} must be cached although negativeTtl is 0`)
        assert.equal((await cache.inspect(key)).state, 'fresh')
      }
      assert.equal(cache.stats().negativeHits, 0)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('5. loader errors: shared by waiters, never cached; failed refreshes back off', () => {
  test('loader shapes: plain value, promise, thenable, sync throw, rejection, rejecting thenable', async () => {
    const cache = new StampedeCache()
    try {
      assert.equal(await cache.getOrLoad('plain', () => 'p'), 'p')
      assert.equal(await cache.getOrLoad('async', async () => 'a'), 'a')
      assert.equal(await cache.getOrLoad('thenable', () => ({ then: (res) => setTimeout(() => res('t'), 5) })), 't')
      const syncErr = new Error('sync throw')
      await assert.rejects(
        cache.getOrLoad('throws', () => {
          throw syncErr
        }),
        (e) => e === syncErr,
      )
      const asyncErr = new Error('rejected')
      await assert.rejects(
        cache.getOrLoad('rejects', async () => {
          throw asyncErr
        }),
        (e) => e === asyncErr,
      )
      const thenErr = new Error('thenable rejected')
      await assert.rejects(
        cache.getOrLoad('bad-thenable', () => ({ then: (_res, rej) => rej(thenErr) })),
        (e) => e === thenErr,
      )
      for (const k of ['plain', 'async', 'thenable']) assert.equal((await cache.inspect(k)).state, 'fresh')
      for (const k of ['throws', 'rejects', 'bad-thenable']) assert.equal(await cache.inspect(k), undefined)
      await assertNoLeaks(cache, 3)
    } finally {
      await cache.close()
    }
  })

  test('every waiter of a failed cold load gets the same error object; nothing cached; next call retries', async () => {
    const cache = new StampedeCache()
    try {
      const boom = new Error('source down')
      let calls = 0
      const failing = async () => {
        calls++
        await sleep(20)
        throw boom
      }
      const ac = new AbortController() // some callers carry a signal that never aborts
      const settled = await Promise.allSettled(
        Array.from({ length: 100 }, (_, i) => cache.getOrLoad('k', failing, i % 3 === 0 ? { signal: ac.signal } : undefined)),
      )
      assert.equal(calls, 1)
      for (const r of settled) {
        assert.equal(r.status, 'rejected')
        assert.ok(r.reason === boom, 'the very same error object')
      }
      assert.equal(await cache.inspect('k'), undefined)
      assert.equal(await cache.get('k'), undefined)
      await assertNoLeaks(cache, 0)
      assert.equal(cache.stats().refreshErrors, 0, 'a cold failure is not a refresh error')
      // The error is not cached: the next call loads again.
      assert.equal(await cache.getOrLoad('k', () => 'ok'), 'ok')
      assert.equal(await cache.getOrLoad('k', failing), 'ok')
      assert.equal(calls, 1)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('failed background refresh: stale still served, onError(err, {op:"refresh", key}), refreshErrors, errorBackoff', async () => {
    const reported = []
    const cache = new StampedeCache({
      ttl: 50,
      hardTtl: 20_000,
      jitter: 0,
      errorBackoff: 600,
      onError: (err, info) => reported.push({ err, info }),
    })
    try {
      let calls = 0
      const boom = new Error('refresh failed')
      let fail = true
      const loader = async () => {
        calls++
        if (calls === 1) return 'v1'
        if (fail) throw boom
        return `v${calls}`
      }
      assert.equal(await cache.getOrLoad(['user', 7], loader), 'v1')
      await sleep(150)
      assert.equal(await cache.getOrLoad(['user', 7], loader), 'v1', 'stale served while the refresh fails')
      await within(cache.settle(), 5_000, 'settle')
      assert.equal(calls, 2)
      assert.equal(reported.length, 1)
      assert.ok(reported[0].err === boom)
      assert.equal(reported[0].info.op, 'refresh')
      assert.equal(reported[0].info.key, 'user:7', 'the key as the encoded string')
      assert.equal(cache.stats().refreshErrors, 1)
      // Within errorBackoff: still served stale, and no new refresh starts.
      for (let i = 0; i < 20; i++) assert.equal(await cache.getOrLoad(['user', 7], loader), 'v1')
      assert.deepEqual(await cache.getOrLoad(['user', 7], loader, { ttl: 50 }), 'v1')
      await cache.settle()
      assert.equal(calls, 2, 'no refresh during errorBackoff')
      assert.equal((await cache.inspect(['user', 7])).state, 'stale')
      // After errorBackoff: exactly one new refresh.
      await sleep(800)
      fail = false
      const vs = await Promise.all(Array.from({ length: 20 }, () => cache.getOrLoad(['user', 7], loader)))
      assert.ok(vs.every((v) => v === 'v1'))
      await within(cache.settle(), 5_000, 'settle')
      assert.equal(calls, 3)
      assert.equal(await cache.get(['user', 7]), 'v3')
      assert.equal(cache.stats().refreshErrors, 1)
      assert.equal(reported.length, 1)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('errorBackoff 0: the next stale read retries the refresh at once', async () => {
    const reported = []
    const cache = new StampedeCache({ ttl: 50, hardTtl: 20_000, jitter: 0, errorBackoff: 0, onError: (e, i) => reported.push(i) })
    try {
      let calls = 0
      const loader = async () => {
        calls++
        if (calls === 1) return 'v1'
        throw new Error(`fail ${calls}`)
      }
      await cache.getOrLoad('k', loader)
      await sleep(150)
      for (let i = 0; i < 3; i++) {
        assert.equal(await cache.getOrLoad('k', loader), 'v1')
        await cache.settle()
      }
      assert.equal(calls, 4, 'one refresh per stale read once the previous one failed')
      assert.equal(cache.stats().refreshErrors, 3)
      assert.equal(reported.length, 3)
      assert.ok(reported.every((i) => i.op === 'refresh' && i.key === 'k'))
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('a failed forceRefresh rejects its callers and keeps the previous entry', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0 })
    try {
      await cache.getOrLoad('k', () => 'v1')
      const boom = new Error('nope')
      const rs = await Promise.allSettled(
        Array.from({ length: 5 }, () =>
          cache.getOrLoad(
            'k',
            async () => {
              await sleep(10)
              throw boom
            },
            { forceRefresh: true },
          ),
        ),
      )
      assert.ok(rs.every((r) => r.status === 'rejected' && r.reason === boom))
      assert.equal(await cache.get('k'), 'v1')
      assert.equal(await cache.getOrLoad('k', () => assert.fail('still fresh')), 'v1')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('6. values are JSON data', () => {
  class Point {
    constructor() {
      this.x = 1
      this.y = 2
    }

    get sum() {
      return this.x + this.y
    }
  }
  const deep = {}
  let cur = deep
  for (let i = 0; i < 60; i++) {
    cur.next = { i }
    cur = cur.next
  }
  // eslint-disable-next-line no-sparse-arrays
  const sparse = [1, , 3]
  const VALUES = [
    ['Date at the top', new Date(86_400_000)],
    [
      'object with Date, undefined, NaN, -Infinity, -0, toJSON, function, symbol',
      {
        d: new Date(0),
        u: undefined,
        n: NaN,
        inf: -Infinity,
        nz: -0,
        t: { toJSON: () => 'T' },
        f() {},
        s: Symbol('s'),
        nested: { arr: [1, undefined, () => 1, Symbol('x'), NaN, new Date(1000)] },
      },
    ],
    ['class instance (becomes a plain object)', new Point()],
    ['Map and Set (become {})', { m: new Map([[1, 2]]), st: new Set([1]) }],
    ['Buffer (its toJSON)', Buffer.from('hi')],
    ['-0 at the top', -0],
    ['string', 'h\u00e9llo \u2028 "quoted" \\ \u{1F600}'],
    ['array', [1, 'a', null, true, { b: [] }]],
    ['sparse array', sparse],
    ['toJSON at the top', { toJSON: () => ({ replaced: true }) }],
    ['deeply nested', deep],
    ['large numbers', { big: 1e300, small: 5e-324, int: Number.MAX_SAFE_INTEGER }],
  ]

  for (const [label, value] of VALUES) {
    test(`${label}: cold result, hits and set/get deep-equal JSON.parse(JSON.stringify(v))`, async () => {
      const cache = new StampedeCache()
      try {
        const expected = JSON.parse(JSON.stringify(value))
        const cold = await cache.getOrLoad('k', () => value)
        assert.deepStrictEqual(cold, expected)
        const hit = await cache.getOrLoad('k', () => assert.fail('must hit'))
        assert.deepStrictEqual(hit, expected)
        assert.deepStrictEqual(await cache.get('k'), expected)
        await cache.set('s', value)
        assert.deepStrictEqual(await cache.get('s'), expected)
        assert.deepStrictEqual(await cache.getOrLoad('s', () => assert.fail('must hit')), expected)
        assert.equal((await cache.inspect('k')).state, 'fresh')
      } finally {
        await cache.close()
      }
    })
  }

  test('NaN at the top becomes null (and is then a not-found)', async () => {
    const cache = new StampedeCache()
    try {
      assert.equal(await cache.getOrLoad('k', () => NaN), null)
      assert.equal(await cache.getOrLoad('k', () => assert.fail('cached')), null)
    } finally {
      await cache.close()
    }
  })

  test('the cache holds a snapshot: mutating the loaded or set object later changes nothing', async () => {
    const cache = new StampedeCache()
    try {
      const src = { list: [1, 2], inner: { a: 1 } }
      await cache.getOrLoad('k', () => src)
      src.list.push(3)
      src.inner.a = 99
      src.added = true
      assert.deepStrictEqual(await cache.get('k'), { list: [1, 2], inner: { a: 1 } })
      const s2 = { x: 1 }
      await cache.set('s', s2)
      s2.x = 2
      assert.deepStrictEqual(await cache.get('s'), { x: 1 })
    } finally {
      await cache.close()
    }
  })

  const cyclic = { a: 1 }
  cyclic.self = cyclic
  const cyclicInArray = [1, { z: null }]
  cyclicInArray[1].z = cyclicInArray
  const NOT_JSON = [
    ['BigInt', 10n],
    ['nested BigInt', { n: { m: [1n] } }],
    ['cyclic object', cyclic],
    ['cycle through an array', cyclicInArray],
    ['function at the top', () => 1],
    ['symbol at the top', Symbol('s')],
  ]
  for (const [label, value] of NOT_JSON) {
    test(`${label}: every caller rejects with ERR_VALUE_NOT_SERIALIZABLE, nothing cached, next call loads`, async () => {
      const cache = new StampedeCache()
      try {
        let calls = 0
        const loader = async () => {
          calls++
          await sleep(5)
          return value
        }
        const rs = await Promise.allSettled(Array.from({ length: 20 }, () => cache.getOrLoad('k', loader)))
        assert.equal(calls, 1)
        const err = rs[0].reason
        assert.ok(err instanceof StampedeCacheError, `got ${err}`)
        assert.equal(err.code, 'ERR_VALUE_NOT_SERIALIZABLE')
        assert.ok(
          rs.every((r) => r.status === 'rejected' && r.reason === err),
          'same error for every waiter',
        )
        assert.equal(await cache.inspect('k'), undefined)
        assert.equal(await cache.get('k'), undefined)
        await assertNoLeaks(cache, 0)
        assert.equal(await cache.getOrLoad('k', () => 'fine'), 'fine')
        // set() refuses it too, without caching anything.
        await rejectsWithCode(() => cache.set('s', value), 'ERR_VALUE_NOT_SERIALIZABLE', undefined, `set ${label}`)
        assert.equal(await cache.get('s'), undefined)
        await assertNoLeaks(cache, 1)
      } finally {
        await cache.close()
      }
    })
  }

  test('a refresh returning a non-JSON value: onError gets ERR_VALUE_NOT_SERIALIZABLE, stale stays served', async () => {
    const reported = []
    const cache = new StampedeCache({ ttl: 50, hardTtl: 20_000, jitter: 0, onError: (err, info) => reported.push({ err, info }) })
    try {
      await cache.getOrLoad('k', () => ({ ok: 1 }))
      await sleep(150)
      assert.deepEqual(await cache.getOrLoad('k', () => ({ bad: 1n })), { ok: 1 })
      await cache.settle()
      assert.equal(reported.length, 1)
      assert.equal(reported[0].err.code, 'ERR_VALUE_NOT_SERIALIZABLE')
      assert.deepEqual(reported[0].info, { op: 'refresh', key: 'k' })
      assert.equal(cache.stats().refreshErrors, 1)
      assert.deepEqual(await cache.get('k'), { ok: 1 })
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('7. keys', () => {
  test('array keys are joined unambiguously: tricky part splits are distinct entries', async () => {
    const cache = new StampedeCache()
    try {
      const keys = [
        ['a:b', 'c'],
        ['a', 'b:c'],
        ['a', 'b', 'c'],
        ['a:b:c'],
        ['a\\', 'b'],
        ['a\\:b'],
        ['a', 'b'],
        ['a\\\\', ':b'],
        ['', 'a'],
        ['a', ''],
        ['', ''],
      ]
      const seen = new Set()
      for (const [i, key] of keys.entries()) {
        assert.equal(
          await cache.getOrLoad(key, (ctx) => {
            seen.add(ctx.key)
            return i
          }),
          i,
        )
      }
      assert.equal(seen.size, keys.length, 'each key encodes to its own string')
      for (const [i, key] of keys.entries()) {
        assert.equal(await cache.get(key), i, `${JSON.stringify(key)} keeps its own entry`)
        assert.equal(await cache.getOrLoad(key, () => assert.fail('cached')), i)
      }
      await assertNoLeaks(cache, keys.length)
    } finally {
      await cache.close()
    }
  })

  test("['user', 42] works and ctx.key is the encoded string; a string key is passed as given", async () => {
    const cache = new StampedeCache()
    try {
      let k1
      assert.equal(
        await cache.getOrLoad(['user', 42], (ctx) => {
          k1 = ctx.key
          return 'u42'
        }),
        'u42',
      )
      assert.equal(typeof k1, 'string')
      assert.equal(k1, 'user:42')
      assert.equal(await cache.get(['user', 42]), 'u42')
      assert.equal(await cache.get(['user', 43]), undefined)
      let k2
      await cache.getOrLoad('plain key \u00e9', (ctx) => {
        k2 = ctx.key
        return 1
      })
      assert.equal(k2, 'plain key \u00e9')
      // Finite numbers of every kind are fine.
      for (const key of [[0], [-1.5], [1e21], [Number.MAX_VALUE], ['x', -0]]) {
        assert.equal(await cache.getOrLoad(key, () => 'n'), 'n', JSON.stringify(key))
      }
    } finally {
      await cache.close()
    }
  })

  test('a 1,024-byte key works (ASCII, multibyte, array); 1,025 bytes rejects ERR_INVALID_KEY', async () => {
    const cache = new StampedeCache()
    try {
      const ascii = 'k'.repeat(1024)
      const multi = '\u20ac'.repeat(341) + 'k' // 341 x 3 + 1 = 1,024 bytes
      const arr = ['x'.repeat(511), 'y'.repeat(512)] // 511 + ':' + 512 = 1,024 bytes
      assert.equal(Buffer.byteLength(multi), 1024)
      for (const key of [ascii, multi, arr]) {
        assert.equal(await cache.getOrLoad(key, () => 'ok'), 'ok')
        assert.equal(await cache.get(key), 'ok')
      }
      let calls = 0
      const loader = () => {
        calls++
        return 'no'
      }
      for (const key of ['k'.repeat(1025), '\u20ac'.repeat(342), 'k'.repeat(1023) + '\u00e9', ['x'.repeat(512), 'y'.repeat(512)], 'z'.repeat(100_000)]) {
        await rejectsWithCode(() => cache.getOrLoad(key, loader), 'ERR_INVALID_KEY', undefined, `key of ${Buffer.byteLength(String(key))} bytes`)
      }
      assert.equal(calls, 0)
      await assertNoLeaks(cache, 3)
    } finally {
      await cache.close()
    }
  })

  test('a key over 1,024 bytes is rejected even when a cached key is its 1,024-byte prefix', async () => {
    const cache = new StampedeCache()
    try {
      await cache.set('k'.repeat(1024), 'prefix entry')
      await cache.set('\u20ac'.repeat(341), 'euro prefix entry')
      let calls = 0
      const loader = () => {
        calls++
        return 'loaded'
      }
      // 1,026 and 1,026 bytes: too long, whatever is cached under a prefix.
      await rejectsWithCode(() => cache.getOrLoad('k'.repeat(1024) + '\u00e9', loader), 'ERR_INVALID_KEY', undefined, '1024 ASCII + é')
      await rejectsWithCode(() => cache.getOrLoad('\u20ac'.repeat(342), loader), 'ERR_INVALID_KEY', undefined, '342 x €')
      assert.equal(calls, 0)
    } finally {
      await cache.close()
    }
  })

  test('distinct strings are distinct keys (ill-formed UTF-16 is kept apart or rejected, never merged)', async () => {
    const cache = new StampedeCache()
    try {
      await cache.set('a\uFFFD', 'replacement char')
      for (const key of ['a\uD800', 'a\uDC00', 'a\uDBFF\uDBFF']) {
        let got
        try {
          got = await cache.get(key)
        } catch (err) {
          assert.equal(err.code, 'ERR_INVALID_KEY')
          continue
        }
        assert.equal(got, undefined, `${JSON.stringify(key)} must not read the entry of "a\\uFFFD"`)
        assert.equal(await cache.getOrLoad(key, () => 'own'), 'own')
      }
      assert.equal(await cache.get('a\uFFFD'), 'replacement char')
    } finally {
      await cache.close()
    }
  })

  test('strings with NUL and other control characters are ordinary, distinct keys', async () => {
    const cache = new StampedeCache()
    try {
      const keys = ['a', 'a\0', 'a\0b', 'a\nb', '\0', ' ']
      for (const [i, k] of keys.entries()) await cache.set(k, i)
      for (const [i, k] of keys.entries()) assert.equal(await cache.getOrLoad(k, () => assert.fail('cached')), i)
    } finally {
      await cache.close()
    }
  })

  test('invalid keys reject with ERR_INVALID_KEY (not synchronously) and call no loader', async () => {
    const cache = new StampedeCache()
    try {
      let calls = 0
      const loader = () => {
        calls++
        return 1
      }
      const bad = [
        ['empty string', ''],
        ['empty array', []],
        ['object', { a: 1 }],
        ['number', 42],
        ['null', null],
        ['undefined', undefined],
        ['boolean', true],
        ['array with an object', ['a', {}]],
        ['array with NaN', ['a', NaN]],
        ['array with Infinity', ['a', Infinity]],
        ['array with -Infinity', ['a', -Infinity]],
        ['array with null', ['a', null]],
        ['nested array', ['a', ['b']]],
      ]
      for (const [label, key] of bad) {
        await rejectsWithCode(() => cache.getOrLoad(key, loader), 'ERR_INVALID_KEY', undefined, label)
      }
      assert.equal(calls, 0)
      await assertNoLeaks(cache, 0)
    } finally {
      await cache.close()
    }
  })

  test('a loader that is not a function rejects with ERR_INVALID_ARGUMENT (not synchronously)', async () => {
    const cache = new StampedeCache()
    try {
      await cache.set('cached', 1)
      for (const loader of [undefined, null, 'loader', 42, {}, Promise.resolve(1)]) {
        await rejectsWithCode(() => cache.getOrLoad('k', loader), 'ERR_INVALID_ARGUMENT', undefined, `loader ${String(loader)}`)
        await rejectsWithCode(() => cache.getOrLoad('cached', loader), 'ERR_INVALID_ARGUMENT', undefined, `cached key, loader ${String(loader)}`)
      }
      assert.equal(await cache.get('k'), undefined)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe("8. a caller's signal rejects that caller only; ctx.signal aborts on close", () => {
  test('aborting one caller rejects it at once with AbortError; the others resolve and the cache fills', async () => {
    const cache = new StampedeCache()
    try {
      let calls = 0
      let ctxSignal
      const gate = deferred()
      const loader = async (ctx) => {
        calls++
        ctxSignal = ctx.signal
        await gate.promise
        return { loaded: true }
      }
      const ac = new AbortController()
      const leader = cache.getOrLoad('k', loader, { signal: ac.signal })
      const others = Array.from({ length: 50 }, () => cache.getOrLoad('k', loader))
      const acJoiner = new AbortController()
      const joiner = cache.getOrLoad('k', loader, { signal: acJoiner.signal })
      await tick()
      ac.abort()
      const err = await within(
        leader.then(
          () => assert.fail('must reject'),
          (e) => e,
        ),
        2_000,
        'aborted caller',
      )
      assert.equal(err.name, 'AbortError')
      acJoiner.abort(new Error('custom reason'))
      const err2 = await within(
        joiner.then(
          () => assert.fail('must reject'),
          (e) => e,
        ),
        2_000,
        'aborted joiner',
      )
      assert.equal(err2.name, 'AbortError', 'a custom reason still gives an AbortError')
      assert.equal(ctxSignal.aborted, false, 'a caller aborting does not abort the shared load')
      assert.equal(await settledWithin(Promise.all(others), 20), 'pending', 'the others still wait for the load')
      gate.resolve()
      for (const v of await Promise.all(others)) assert.deepEqual(v, { loaded: true })
      assert.equal(calls, 1)
      assert.deepEqual(await cache.getOrLoad('k', () => assert.fail('cache filled')), { loaded: true })
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('when the only caller aborts, the load goes on and still fills the cache', async () => {
    const cache = new StampedeCache()
    try {
      let calls = 0
      const gate = deferred()
      const ac = new AbortController()
      const p = cache.getOrLoad(
        ['solo', 1],
        async () => {
          calls++
          await gate.promise
          return 'late value'
        },
        { signal: ac.signal },
      )
      await tick()
      ac.abort()
      await assert.rejects(within(p, 2_000, 'aborted caller'), { name: 'AbortError' })
      gate.resolve()
      await sleep(20)
      assert.equal(await cache.get(['solo', 1]), 'late value')
      assert.equal(await cache.getOrLoad(['solo', 1], () => assert.fail('filled')), 'late value')
      assert.equal(calls, 1)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('an already-aborted signal rejects with AbortError (any abort reason)', async () => {
    const cache = new StampedeCache()
    try {
      const signals = [AbortSignal.abort(), AbortSignal.abort('a string reason'), AbortSignal.abort(new TypeError('typed'))]
      for (const signal of signals) {
        let p
        assert.doesNotThrow(() => {
          p = cache.getOrLoad('cold', () => 'x', { signal })
        })
        await assert.rejects(within(p, 2_000, 'pre-aborted'), (e) => e.name === 'AbortError')
      }
      assert.equal(await cache.getOrLoad('cold', () => 'x'), 'x', 'the cache still works')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('AbortSignal.timeout rejects the caller with an AbortError while the load goes on', async () => {
    const cache = new StampedeCache()
    try {
      const gate = deferred()
      const p = cache.getOrLoad(
        'k',
        async () => {
          await gate.promise
          return 1
        },
        { signal: AbortSignal.timeout(30) },
      )
      await assert.rejects(within(p, 3_000, 'timeout signal'), (e) => e.name === 'AbortError')
      gate.resolve()
      await sleep(20)
      assert.equal(await cache.get('k'), 1)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('a long-lived signal collects no abort listeners from finished calls', async () => {
    const cache = new StampedeCache()
    try {
      const ac = new AbortController()
      for (let i = 0; i < 100; i++) {
        await cache.getOrLoad(
          `k${i % 10}`,
          async () => {
            await sleep(1)
            return i
          },
          { signal: ac.signal },
        )
      }
      await Promise.allSettled(
        Array.from({ length: 20 }, (_, i) =>
          cache.getOrLoad(
            ['fail', i],
            async () => {
              throw new Error('x')
            },
            { signal: ac.signal },
          ),
        ),
      )
      assert.equal(getEventListeners(ac.signal, 'abort').length, 0)
    } finally {
      await cache.close()
    }
  })

  test('ctx.signal aborts when the cache is closed (and not before)', async () => {
    const cache = new StampedeCache()
    let ctxSignal
    const started = deferred()
    const p = cache.getOrLoad('k', (ctx) => {
      ctxSignal = ctx.signal
      started.resolve()
      return new Promise((_resolve, reject) => {
        ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true })
      })
    })
    const caught = p.then(
      () => 'resolved',
      (e) => e,
    )
    await within(started.promise, 2_000, 'loader start')
    await sleep(20)
    assert.equal(ctxSignal.aborted, false)
    await cache.close()
    assert.equal(ctxSignal.aborted, true)
    const outcome = await within(caught, 2_000, 'loader honouring ctx.signal')
    assert.notEqual(outcome, 'resolved', 'the loader rejected on abort, so the caller rejects')
    await tick()
    assertNothingInFlight(cache)
  })
})

// ---------------------------------------------------------------------------------------------
describe('The rest: get, set, delete, inspect, stats, settle, close, l1', () => {
  test('get() never loads and returns fresh, stale and not-found values; undefined when missing', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0 })
    try {
      assert.equal(await cache.get('missing'), undefined)
      assert.equal(await cache.get(['missing', 1]), undefined)
      await cache.getOrLoad('k', () => ({ a: 1 }))
      await cache.getOrLoad('n', () => null)
      assert.deepEqual(await cache.get('k'), { a: 1 })
      await sleep(150)
      assert.equal((await cache.inspect('k')).state, 'stale')
      const loadsBefore = cache.stats().loads
      for (let i = 0; i < 10; i++) assert.deepEqual(await cache.get('k'), { a: 1 }, 'get returns stale values')
      assert.equal(await cache.get('n'), null)
      await cache.settle()
      assert.equal(cache.stats().loads, loadsBefore, 'get() never loads or refreshes')
      assert.equal(cache.stats().refreshes, 0)
      assert.equal((await cache.inspect('k')).state, 'stale')
      await assertNoLeaks(cache, 2)
    } finally {
      await cache.close()
    }
  })

  test('get() counts and publishes every hit as getOrLoad does, never refreshes, and rejects after close', async () => {
    const dc = require('node:diagnostics_channel')
    // hardTtl == ttl and a huge beta: a getOrLoad read of this entry refreshes early (XFetch) with
    // near certainty; a get() read never may (it has no loader).
    const cache = new StampedeCache({ ttl: 2_000, hardTtl: 2_000, beta: 1e6, jitter: 0, negativeTtl: 60_000 })
    const seen = []
    const onHit = (m) => {
      if (m.cache === cache) seen.push(`${m.key}:${m.tier}:${m.state}`)
    }
    dc.subscribe('stampede-cache:hit', onHit)
    try {
      let calls = 0
      const loader = async () => {
        calls++
        await sleep(20)
        return { n: calls }
      }
      await cache.getOrLoad('k', loader)
      await cache.getOrLoad('none', () => null)
      const before = cache.stats()
      for (let i = 0; i < 20; i++) assert.deepEqual(await cache.get('k'), { n: 1 })
      assert.equal(await cache.get('none'), null)
      assert.equal(await cache.get('missing'), undefined)
      await cache.settle()
      const after = cache.stats()
      assert.equal(calls, 1, 'get() never starts a refresh')
      assert.equal(after.refreshes, 0)
      assert.equal(after.hits - before.hits, 20)
      assert.equal(after.negativeHits - before.negativeHits, 1)
      assert.equal(after.misses - before.misses, 1, 'a miss is counted once')
      assert.deepEqual(seen.slice(-21), [...Array(20).fill('k:memory:fresh'), 'none:memory:negative'])
      // The control: the same entry read by getOrLoad refreshes early.
      assert.deepEqual(await cache.getOrLoad('k', loader), { n: 1 })
      await cache.settle()
      assert.equal(calls, 2, 'getOrLoad refreshes this entry early')
      assert.deepEqual(await cache.get('k'), { n: 2 })
    } finally {
      dc.unsubscribe('stampede-cache:hit', onHit)
      await cache.close()
    }
    // After close a warm key's get() is a rejected promise, never a value or a synchronous throw.
    let p
    assert.doesNotThrow(() => {
      p = cache.get('k')
    })
    await assert.rejects(p, (err) => err instanceof StampedeCacheError && err.code === 'ERR_CLOSED')
  })

  test('set() then getOrLoad() hits without the loader; set replaces; set resolves undefined', async () => {
    const cache = new StampedeCache({ jitter: 0 })
    try {
      assert.equal(await cache.set('k', { v: 1 }), undefined)
      assert.deepEqual(await cache.getOrLoad('k', () => assert.fail('must hit')), { v: 1 })
      await cache.set('k', { v: 2 })
      assert.deepEqual(await cache.getOrLoad('k', () => assert.fail('must hit')), { v: 2 })
      await cache.set(['user', 1], 'u1')
      assert.equal(await cache.getOrLoad(['user', 1], () => assert.fail('must hit')), 'u1')
      assert.equal((await cache.inspect('k')).state, 'fresh')
      assert.equal(cache.stats().loads, 0)
      await assertNoLeaks(cache, 2)
    } finally {
      await cache.close()
    }
  })

  test('set() with {ttl} and {ttl, hardTtl}', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0 })
    try {
      // ttls far above a scheduling stall between two awaits on a loaded machine (the "fresh"
      // checks), and polls, not sleeps, for the entries to age (inspect never changes an entry).
      const t0 = Date.now()
      await cache.set('short', 'v', { ttl: 400 })
      const t1 = Date.now()
      const info = await cache.inspect('short')
      assert.equal(info.state, 'fresh')
      assert.ok(info.freshUntil >= t0 + 400 - 2 && info.freshUntil <= t1 + 400 + 2, `freshUntil ${info.freshUntil - t0}`)
      await cache.set('both', 'w', { ttl: 200, hardTtl: 600 })
      const both = await cache.inspect('both')
      assert.ok(Math.abs(both.hardUntil - both.freshUntil - 400) < 1, 'hardUntil - freshUntil = hardTtl - ttl')
      await eventually(async () => (await cache.inspect('both')) === undefined, { timeout: 10_000, what: "'both' to pass its hardTtl" })
      assert.ok(Date.now() >= both.hardUntil, 'gone no earlier than its hardUntil')
      assert.equal((await cache.inspect('short')).state, 'stale')
      assert.equal(await cache.get('short'), 'v')
      assert.equal(await cache.inspect('both'), undefined, 'past its hardTtl')
      assert.equal(await cache.get('both'), undefined)
      // A stale set() entry is served and refreshed like any other.
      assert.equal(await cache.getOrLoad('short', () => 'v2'), 'v')
      await cache.settle()
      assert.equal(await cache.get('short'), 'v2')
    } finally {
      await cache.close()
    }
  })

  test("set() during a running load wins over the load's result", async () => {
    const cache = new StampedeCache({ jitter: 0 })
    try {
      const gate = deferred()
      const p = cache.getOrLoad('k', () => gate.promise)
      await tick()
      await cache.set('k', 'from set')
      gate.resolve('from load')
      const v = await p
      assert.ok(v === 'from load' || v === 'from set', `the waiting caller resolves (${v})`)
      assert.equal(await cache.get('k'), 'from set', 'an older load must not overwrite a newer set')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('delete() returns true when something was removed, false otherwise', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0 })
    try {
      assert.equal(await cache.delete('nothing'), false)
      await cache.getOrLoad('k', () => 1)
      await cache.set(['a', 'b'], 2)
      await cache.getOrLoad('neg', () => null)
      assert.equal(await cache.delete('k'), true)
      assert.equal(await cache.delete('k'), false)
      assert.equal(await cache.get('k'), undefined)
      assert.equal(await cache.inspect('k'), undefined)
      assert.equal(await cache.delete(['a', 'b']), true)
      assert.equal(await cache.delete('neg'), true)
      let calls = 0
      assert.equal(
        await cache.getOrLoad('k', () => {
          calls++
          return 3
        }),
        3,
      )
      assert.equal(calls, 1, 'after delete the next getOrLoad loads')
      await sleep(150)
      assert.equal((await cache.inspect('k')).state, 'stale')
      assert.equal(await cache.delete('k'), true, 'a stale entry is removed too')
      await assertNoLeaks(cache, 0)
    } finally {
      await cache.close()
    }
  })

  test("delete() during a running load: the load's (older) result is not cached", async () => {
    const cache = new StampedeCache()
    try {
      await cache.set('k', 'v0')
      const gate = deferred()
      const p = cache.getOrLoad('k', () => gate.promise, { forceRefresh: true })
      await tick()
      assert.equal(await cache.delete('k'), true)
      gate.resolve('v1 (read before the delete)')
      await p
      assert.equal(await cache.get('k'), undefined)
      let calls = 0
      assert.equal(
        await cache.getOrLoad('k', () => {
          calls++
          return 'v2'
        }),
        'v2',
      )
      assert.equal(calls, 1)
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('inspect() reports fresh / stale / negative with freshUntil, hardUntil, computeMs', async () => {
    // ttl 500: far above a stall between the load and the first inspect on a loaded machine.
    const cache = new StampedeCache({ ttl: 500, hardTtl: 10_000, negativeTtl: 5_000, jitter: 0 })
    try {
      assert.equal(await cache.inspect('missing'), undefined)
      const t0 = Date.now()
      await cache.getOrLoad('k', async () => {
        await sleep(25)
        return 'v'
      })
      const t1 = Date.now()
      const fresh = await cache.inspect('k')
      assert.deepEqual(Object.keys(fresh).sort(), ['computeMs', 'freshUntil', 'hardUntil', 'state'])
      assert.equal(fresh.state, 'fresh')
      for (const f of ['freshUntil', 'hardUntil', 'computeMs']) assert.ok(Number.isFinite(fresh[f]), f)
      assert.ok(fresh.freshUntil >= t0 + 500 && fresh.freshUntil <= t1 + 500 + 2, 'freshUntil is epoch ms')
      assert.ok(Math.abs(fresh.hardUntil - fresh.freshUntil - (10_000 - 500)) < 1)
      assert.ok(fresh.computeMs >= 15 && fresh.computeMs <= t1 - t0 + 5, `computeMs ${fresh.computeMs}`)
      await cache.getOrLoad('n', () => undefined)
      const neg = await cache.inspect('n')
      assert.equal(neg.state, 'negative')
      assert.ok(neg.freshUntil > Date.now() + 4_000 && neg.freshUntil <= Date.now() + 5_000 + 2)
      await eventually(async () => (await cache.inspect('k')).state === 'stale', { timeout: 10_000, what: "'k' to go stale" })
      const stale = await cache.inspect('k')
      assert.equal(stale.state, 'stale')
      assert.equal(stale.freshUntil, fresh.freshUntil)
      assert.equal(stale.hardUntil, fresh.hardUntil)
      // Stale means now >= freshUntil (fresh is now < freshUntil, in whole ms like Date.now()):
      // the inspect that first sees 'stale' can run in the very millisecond freshUntil names.
      assert.ok(stale.freshUntil <= Date.now() && Date.now() < stale.hardUntil)
      await cache.set('s', 1)
      assert.equal((await cache.inspect('s')).computeMs, 0)
      // inspect is side-effect free: no stats counted, no refresh started.
      const before = cache.stats()
      await cache.inspect('k')
      await cache.inspect('missing')
      await cache.settle()
      assert.deepEqual(cache.stats(), before)
    } finally {
      await cache.close()
    }
  })

  test('stats() is a synchronous snapshot with exact counters', async () => {
    // ttl 500, not 50: the second read of 'a' must still be a hit (not a stale hit and a refresh)
    // however long the machine stalls between two awaits; the entries then age by a poll.
    const cache = new StampedeCache({ ttl: 500, hardTtl: 10_000, jitter: 0, beta: 0, errorBackoff: 10_000 })
    try {
      const zero = cache.stats()
      assert.equal(typeof zero.then, 'undefined', 'not a promise')
      assert.deepEqual(Object.keys(zero).sort(), [...STATS_KEYS].sort())
      for (const k of STATS_KEYS) assert.equal(zero[k], 0, k)
      await cache.getOrLoad('a', () => 'A') // miss + load
      await cache.getOrLoad('a', () => 'X') // hit
      await cache.getOrLoad('n', () => null) // miss + load
      await cache.getOrLoad('n', () => 'X') // negative hit
      const slow = async () => {
        await sleep(10)
        return 'C'
      }
      await Promise.all([cache.getOrLoad('c', slow), cache.getOrLoad('c', slow), cache.getOrLoad('c', slow)]) // 3 misses, 1 load, 2 coalesced
      // inspect counts nothing (see the inspect test), so polling it leaves the counters alone.
      await eventually(async () => (await cache.inspect('a')).state === 'stale' && (await cache.inspect('c')).state === 'stale', {
        timeout: 10_000,
        what: "'a' and 'c' to go stale",
      })
      await cache.getOrLoad('a', () => {
        throw new Error('refresh fails')
      }) // stale hit + refresh (a loader call) that fails
      await cache.settle()
      await cache.getOrLoad('c', () => 'C2') // stale hit + refresh
      await cache.settle()
      // loads counts every loader call (cold loads and background refreshes).
      assert.deepEqual(cache.stats(), {
        hits: 1,
        staleHits: 2,
        misses: 5,
        loads: 5,
        coalesced: 2,
        refreshes: 2,
        refreshErrors: 1,
        negativeHits: 1,
        lockWins: 0,
        lockWaits: 0,
        redisErrors: 0,
        l2Hits: 0,
        // The in-process tier now: a ('"A"', 3 bytes as JSON), n (null, 4), c ('"C2"', 4).
        l1Entries: 3,
        l1Bytes: 11,
        replayQueued: 0,
        replayDropped: 0,
      })
      // A snapshot: mutating it changes nothing.
      const s = cache.stats()
      s.hits = 999
      assert.equal(cache.stats().hits, 1)
    } finally {
      await cache.close()
    }
  })

  test('settle() waits for every background refresh started so far (failed ones included)', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0 })
    try {
      await within(cache.settle(), 1_000, 'settle with nothing running')
      await cache.getOrLoad('a', () => 1)
      await cache.getOrLoad('b', () => 1)
      await sleep(150)
      const gateA = deferred()
      const gateB = deferred()
      assert.equal(
        await cache.getOrLoad('a', async () => {
          await gateA.promise
          return 2
        }),
        1,
      )
      assert.equal(
        await cache.getOrLoad('b', async () => {
          await gateB.promise
          throw new Error('b fails')
        }),
        1,
      )
      let settled = false
      const s = cache.settle().then(() => {
        settled = true
      })
      await sleep(30)
      assert.equal(settled, false)
      gateA.resolve()
      await sleep(30)
      assert.equal(settled, false, 'still waiting for b')
      gateB.resolve()
      await within(s, 5_000, 'settle')
      assert.equal(settled, true)
      assert.equal(await cache.get('a'), 2)
      assert.equal(cache.stats().refreshErrors, 1)
      await assertNoLeaks(cache, 2)
    } finally {
      await cache.close()
    }
  })

  test('close(): every method rejects with ERR_CLOSED afterwards; stats() still works', async () => {
    const cache = new StampedeCache({ jitter: 0 })
    await cache.getOrLoad('k', () => 1)
    await cache.getOrLoad(['a', 1], () => 2)
    const before = cache.stats()
    assert.equal(await cache.close(), undefined)
    let calls = 0
    const loader = () => {
      calls++
      return 3
    }
    const calls_ = [
      ['getOrLoad (cached string key)', () => cache.getOrLoad('k', loader)],
      ['getOrLoad (cached array key)', () => cache.getOrLoad(['a', 1], loader)],
      ['getOrLoad (with options)', () => cache.getOrLoad('k', loader, { ttl: 10 })],
      ['getOrLoad (forceRefresh)', () => cache.getOrLoad('k', loader, { forceRefresh: true })],
      ['getOrLoad (cold key)', () => cache.getOrLoad('new', loader)],
      ['get', () => cache.get('k')],
      ['set', () => cache.set('k', 4)],
      ['delete', () => cache.delete('k')],
      ['inspect', () => cache.inspect('k')],
      ['deleteByTag', () => cache.deleteByTag('t')],
      ['clear', () => cache.clear()],
    ]
    for (const [label, call] of calls_) await rejectsWithCode(call, 'ERR_CLOSED', undefined, label)
    assert.equal(calls, 0)
    // The counters are those from before close; the in-process tier is gone.
    assert.deepEqual(before.l1Entries, 2)
    assert.deepEqual(cache.stats(), { ...before, l1Entries: 0, l1Bytes: 0 }, 'stats() still answers, with the counts from before close')
    // close() and settle() again: never hang and never fail with anything but ERR_CLOSED.
    for (const [label, call] of [
      ['close again', () => cache.close()],
      ['settle', () => cache.settle()],
    ]) {
      try {
        await within(call(), 2_000, label)
      } catch (err) {
        assert.equal(err.code, 'ERR_CLOSED', `${label}: ${err.message}`)
      }
    }
    assertNothingInFlight(cache)
    assert.equal(cache._debugCounts().entries, 0)
  })

  test('close() with a background refresh in flight: settle() still resolves once it ends', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 10_000, jitter: 0 })
    await cache.getOrLoad('k', () => 1)
    await sleep(150)
    let ctxSignal
    const gate = deferred()
    assert.equal(
      await cache.getOrLoad('k', async (ctx) => {
        ctxSignal = ctx.signal
        await gate.promise
        return 2
      }),
      1,
    )
    const s = cache.settle()
    await cache.close()
    assert.equal(ctxSignal.aborted, true, 'the refresh loader is told to stop')
    gate.resolve()
    try {
      await within(s, 5_000, 'settle after close')
    } catch (err) {
      assert.equal(err.code, 'ERR_CLOSED', err.message)
    }
    await tick()
    assertNothingInFlight(cache)
  })

  test('l1 { maxEntries: 2 }: the least recently used entry is evicted', async () => {
    const cache = new StampedeCache({ l1: { maxEntries: 2 }, jitter: 0 })
    try {
      const counts = new Map()
      const loader = (ctx) => {
        counts.set(ctx.key, (counts.get(ctx.key) ?? 0) + 1)
        return `v-${ctx.key}`
      }
      await cache.getOrLoad('a', loader)
      await cache.getOrLoad('b', loader)
      await cache.getOrLoad('c', loader) // evicts a
      assert.equal(cache._debugCounts().entries, 2)
      assert.equal(await cache.getOrLoad('b', loader), 'v-b')
      assert.equal(await cache.getOrLoad('c', loader), 'v-c')
      assert.deepEqual(Object.fromEntries(counts), { a: 1, b: 1, c: 1 })
      assert.equal(await cache.get('a'), undefined)
      assert.equal(await cache.getOrLoad('a', loader), 'v-a') // loads again, evicts b (LRU)
      assert.equal(counts.get('a'), 2)
      assert.equal(await cache.getOrLoad('c', loader), 'v-c')
      assert.equal(counts.get('c'), 1)
      assert.equal(await cache.getOrLoad('b', loader), 'v-b')
      assert.equal(counts.get('b'), 2, 'b was the least recently used')
      // Recency, not insertion order: read x, insert z -> y goes.
      const c2 = new StampedeCache({ l1: { maxEntries: 2 } })
      try {
        const n = new Map()
        const l2 = (ctx) => {
          n.set(ctx.key, (n.get(ctx.key) ?? 0) + 1)
          return ctx.key
        }
        await c2.getOrLoad('x', l2)
        await c2.getOrLoad('y', l2)
        await c2.getOrLoad('x', l2) // x is now most recently used
        await c2.getOrLoad('z', l2)
        assert.equal(await c2.get('x'), 'x')
        assert.equal(await c2.get('y'), undefined)
        assert.equal(await c2.get('z'), 'z')
        assert.deepEqual(Object.fromEntries(n), { x: 1, y: 1, z: 1 })
        // Many keys: the bound holds and values stay with their keys.
        for (let i = 0; i < 200; i++) assert.equal(await c2.getOrLoad(`k${i}`, l2), `k${i}`)
        assert.equal(c2._debugCounts().entries, 2)
        assert.equal(await c2.get('k199'), 'k199')
        assert.equal(await c2.get('k198'), 'k198')
        assert.equal(await c2.get('k0'), undefined)
        await assertNoLeaks(c2, 2)
      } finally {
        await c2.close()
      }
    } finally {
      await cache.close()
    }
  })

  test('l1: false still coalesces concurrent callers but caches nothing', async () => {
    const cache = new StampedeCache({ l1: false })
    try {
      let calls = 0
      const loader = async () => {
        calls++
        await sleep(15)
        return { n: calls }
      }
      const vs = await Promise.all(Array.from({ length: 100 }, () => cache.getOrLoad('k', loader)))
      assert.equal(calls, 1)
      for (const v of vs) assert.deepEqual(v, { n: 1 })
      assert.equal(cache.stats().coalesced, 99)
      assert.deepEqual(await cache.getOrLoad('k', loader), { n: 2 }, 'nothing was cached')
      assert.equal(calls, 2)
      assert.equal(await cache.get('k'), undefined)
      assert.equal(await cache.inspect('k'), undefined)
      await cache.set('s', 1)
      assert.equal(await cache.get('s'), undefined)
      assert.equal(await cache.delete('s'), false)
      await assertNoLeaks(cache, 0)
    } finally {
      await cache.close()
    }
  })

  test('an idle cache never keeps the process alive (a script that forgets close() exits)', () => {
    const script = `
      const { StampedeCache } = require(${JSON.stringify(path.resolve(__dirname, '..'))})
      const cache = new StampedeCache({ ttl: 20, hardTtl: 10000 })
      ;(async () => {
        await cache.getOrLoad('k', async () => 1)
        await cache.getOrLoad(['n', 1], () => null)
        await new Promise((r) => setTimeout(r, 50))
        await cache.getOrLoad('k', async () => 2) // stale: starts a background refresh
        await cache.settle()
        console.log('done', await cache.get('k'))
      })()
    `
    const r = spawnSync(process.execPath, ['-e', script], { timeout: 15_000, encoding: 'utf8' })
    assert.equal(r.signal, null, `the process had to be killed: it did not exit by itself (${r.stderr})`)
    assert.equal(r.status, 0, r.stderr)
    assert.match(r.stdout, /done 2/)
  })
})

// ---------------------------------------------------------------------------------------------
describe('constructor options', () => {
  test('valid options are accepted', async () => {
    const valid = [
      undefined,
      {},
      { ttl: 0 },
      { ttl: 1000, hardTtl: 1000 },
      { ttl: 1, hardTtl: 2, jitter: 0, beta: 0, negativeTtl: 0, lockTtl: 1, errorBackoff: 0 },
      { jitter: 0.999, beta: 100, negativeTtl: 1e9 },
      { l1: false },
      { l1: {} },
      { l1: { maxEntries: 1 } },
      { namespace: 'app' },
      { waitUntil: () => {}, onError: () => {} },
      { ttl: undefined, hardTtl: undefined, waitUntil: undefined },
    ]
    for (const opts of valid) {
      const c = new StampedeCache(opts)
      assert.equal(await c.getOrLoad('k', () => 1), 1, JSON.stringify(opts))
      await c.close()
    }
  })

  test('defaults: ttl 60 s, hardTtl 10 x ttl, jitter 0.1, negativeTtl 5 s', async () => {
    const cache = new StampedeCache()
    try {
      const factors = []
      for (let i = 0; i < 40; i++) {
        const before = Date.now()
        await cache.getOrLoad(`k${i}`, () => i)
        const after = Date.now()
        const info = await cache.inspect(`k${i}`)
        const factor = (info.hardUntil - info.freshUntil) / (600_000 - 60_000)
        assert.ok(factor >= 0.9 - 1e-9 && factor <= 1.1 + 1e-9, `jitter factor ${factor}`)
        const written = info.freshUntil - factor * 60_000
        assert.ok(written >= before - 2 && written <= after + 2, 'freshUntil = write time + ttl * factor')
        factors.push(factor)
      }
      assert.ok(Math.max(...factors) - Math.min(...factors) > 0.02, 'default jitter spreads expiries')
      const before = Date.now()
      await cache.getOrLoad('neg', () => null)
      const neg = await cache.inspect('neg')
      const negTtl = neg.freshUntil - before
      assert.ok(negTtl >= 4_500 - 2 && negTtl <= 5_500 + 50, `negativeTtl ${negTtl}`)
    } finally {
      await cache.close()
    }
  })

  test('jitter 0.5 spreads freshUntil across keys; ttl and hardTtl share one factor', async () => {
    const cache = new StampedeCache({ ttl: 10_000, hardTtl: 50_000, jitter: 0.5 })
    try {
      const factors = []
      for (let i = 0; i < 60; i++) {
        const before = Date.now()
        await cache.getOrLoad(`k${i}`, () => i)
        const after = Date.now()
        const info = await cache.inspect(`k${i}`)
        const factor = (info.hardUntil - info.freshUntil) / 40_000
        assert.ok(factor >= 0.5 - 1e-9 && factor <= 1.5 + 1e-9, `factor ${factor}`)
        const written = info.freshUntil - factor * 10_000
        assert.ok(written >= before - 2 && written <= after + 2, `write time off by ${written - before}`)
        factors.push(factor)
      }
      assert.ok(new Set(factors.map((f) => f.toFixed(6))).size >= 50, 'factors differ per entry')
      assert.ok(Math.max(...factors) - Math.min(...factors) > 0.4, 'factors spread over the range')
      // A per-call jitter of 0 writes exactly ttl.
      const before = Date.now()
      await cache.getOrLoad('exact', () => 1, { jitter: 0 })
      const after = Date.now()
      const info = await cache.inspect('exact')
      assert.ok(info.freshUntil >= before + 10_000 - 2 && info.freshUntil <= after + 10_000 + 2)
      assert.ok(Math.abs(info.hardUntil - info.freshUntil - 40_000) < 0.01)
    } finally {
      await cache.close()
    }
  })

  test('jitter 0: every entry gets exactly ttl', async () => {
    const cache = new StampedeCache({ ttl: 10_000, jitter: 0 })
    try {
      for (let i = 0; i < 30; i++) {
        const before = Date.now()
        await cache.getOrLoad(`k${i}`, () => i)
        const after = Date.now()
        const info = await cache.inspect(`k${i}`)
        assert.ok(info.freshUntil >= before + 10_000 - 2 && info.freshUntil <= after + 10_000 + 2)
        assert.ok(Math.abs(info.hardUntil - info.freshUntil - 90_000) < 0.01, 'hardTtl defaults to 10 x ttl')
      }
    } finally {
      await cache.close()
    }
  })

  test('bad options throw ERR_INVALID_OPTION synchronously, naming the option', () => {
    const bad = [
      [{ ttl: -1 }, 'ttl'],
      [{ ttl: NaN }, 'ttl'],
      [{ ttl: Infinity }, 'ttl'],
      [{ ttl: '100' }, 'ttl'],
      [{ ttl: null }, 'ttl'],
      [{ hardTtl: -5 }, 'hardTtl'],
      [{ hardTtl: Infinity }, 'hardTtl'],
      [{ ttl: 1000, hardTtl: 999 }, 'hardTtl'],
      [{ jitter: 1 }, 'jitter'],
      [{ jitter: -0.1 }, 'jitter'],
      [{ jitter: NaN }, 'jitter'],
      [{ beta: -1 }, 'beta'],
      [{ beta: Infinity }, 'beta'],
      [{ negativeTtl: -1 }, 'negativeTtl'],
      [{ negativeTtl: NaN }, 'negativeTtl'],
      [{ lockTtl: -1 }, 'lockTtl'],
      [{ lockTtl: Infinity }, 'lockTtl'],
      [{ errorBackoff: -1 }, 'errorBackoff'],
      [{ errorBackoff: NaN }, 'errorBackoff'],
      [{ tll: 5 }, 'tll'],
      [{ ttl: 5, maxEntries: 3 }, 'maxEntries'],
      [{ l1: 'x' }, 'l1'],
      [{ l1: 5 }, 'l1'],
      [{ l1: { maxEntries: -1 } }, 'l1'],
      [{ l1: { maxEntries: NaN } }, 'l1'],
      [{ l1: { maxEntries: Infinity } }, 'l1'],
      [{ waitUntil: 1 }, 'waitUntil'],
      [{ waitUntil: 'fn' }, 'waitUntil'],
      [{ onError: 'x' }, 'onError'],
      [{ redis: 'not a url' }, 'redis'],
      [{ redis: 'http://localhost:6379' }, 'redis'],
      [{ redis: 6379 }, 'redis'],
    ]
    for (const [opts, name] of bad) {
      throwsWithCode(() => new StampedeCache(opts), 'ERR_INVALID_OPTION', name, JSON.stringify(opts) ?? String(opts))
    }
    for (const opts of [42, 'ttl=5', true]) {
      throwsWithCode(() => new StampedeCache(opts), 'ERR_INVALID_OPTION', undefined, String(opts))
    }
  })

  test('getOrLoad with an unknown option or a bad ttl rejects with ERR_INVALID_OPTION and loads nothing', async () => {
    const cache = new StampedeCache()
    try {
      let calls = 0
      const loader = () => {
        calls++
        return 1
      }
      await rejectsWithCode(() => cache.getOrLoad('k', loader, { tll: 5 }), 'ERR_INVALID_OPTION', 'tll', 'unknown option')
      await rejectsWithCode(() => cache.getOrLoad('k', loader, { ttl: -1 }), 'ERR_INVALID_OPTION', 'ttl', 'ttl -1')
      await rejectsWithCode(() => cache.getOrLoad('k', loader, { ttl: NaN }), 'ERR_INVALID_OPTION', 'ttl', 'ttl NaN')
      await rejectsWithCode(() => cache.getOrLoad('k', loader, { ttl: 100, hardTtl: 50 }), 'ERR_INVALID_OPTION', 'hardTtl', 'hardTtl < ttl')
      assert.equal(calls, 0)
      await assertNoLeaks(cache, 0)
    } finally {
      await cache.close()
    }
  })

  test('per-call ttl / hardTtl apply to the entry that call writes', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0 })
    try {
      await cache.getOrLoad('short', () => 1, { ttl: 50, hardTtl: 5_000 })
      await cache.getOrLoad('long', () => 1)
      const s = await cache.inspect('short')
      assert.ok(Math.abs(s.hardUntil - s.freshUntil - 4_950) < 0.01)
      await sleep(150)
      assert.equal((await cache.inspect('short')).state, 'stale')
      assert.equal((await cache.inspect('long')).state, 'fresh')
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('forceRefresh', () => {
  test('loads even when fresh, is coalesced among concurrent callers, replaces the entry', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0 })
    try {
      await cache.getOrLoad('k', () => ({ v: 1 }))
      let calls = 0
      const stales = []
      const loader = async (ctx) => {
        calls++
        stales.push(ctx.stale)
        await sleep(15)
        return { v: 2 }
      }
      const vs = await Promise.all(Array.from({ length: 50 }, () => cache.getOrLoad('k', loader, { forceRefresh: true })))
      assert.equal(calls, 1)
      for (const v of vs) assert.deepEqual(v, { v: 2 })
      assert.deepEqual(stales, [{ v: 1 }], 'ctx.stale is the replaced value')
      assert.deepEqual(await cache.get('k'), { v: 2 })
      assert.deepEqual(await cache.getOrLoad('k', () => assert.fail('fresh')), { v: 2 })
      // forceRefresh on a missing key is a plain load.
      assert.equal(await cache.getOrLoad('missing', () => 'm', { forceRefresh: true }), 'm')
      // forceRefresh: false is an ordinary call.
      assert.deepEqual(await cache.getOrLoad('k', () => assert.fail('fresh'), { forceRefresh: false }), { v: 2 })
      await assertNoLeaks(cache, 2)
    } finally {
      await cache.close()
    }
  })
})

// ---------------------------------------------------------------------------------------------
describe('package entry points', () => {
  test('ESM: index.mjs and the package name give the same classes as CommonJS', async () => {
    const esm = await import('../index.mjs')
    assert.equal(esm.StampedeCache, StampedeCache)
    assert.equal(esm.StampedeCacheError, StampedeCacheError)
    const byName = await import('stampede-cache')
    assert.equal(byName.StampedeCache, StampedeCache)
    assert.equal(byName.StampedeCacheError, StampedeCacheError)
    assert.equal(require('stampede-cache').StampedeCache, StampedeCache)
    const c = new esm.StampedeCache()
    try {
      assert.equal(await c.getOrLoad('k', () => 'esm'), 'esm')
      const err = await c.getOrLoad('', () => 1).catch((e) => e)
      assert.ok(err instanceof esm.StampedeCacheError)
      assert.ok(err instanceof StampedeCacheError)
    } finally {
      await c.close()
    }
  })
})
