'use strict'
// A mass expiry reaches the database as a trickle. `maxConcurrentRefreshes`
// (docs/CONTRACT.md, "Choices") bounds the background refreshes one instance runs at once; past
// it, readers are served the stale value at once and a later read refreshes the key. Cold loads
// are never held back. Gated loaders make every race deterministic: the assertions count loader
// calls and check final states, never durations.

const { describe, test } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { deferred, throwsWithCode, assertNoLeaks, within, sleep } = require('./helpers/assertions')

const KEYS = Array.from({ length: 40 }, (_, i) => `k${i}`)

/** A cache holding KEYS at version 1, all stale by the time it resolves. */
async function staleCache(options) {
  const cache = new StampedeCache({ ttl: 60_000, jitter: 0, beta: 0, ...options })
  for (const k of KEYS) await cache.set(k, { k, v: 1 }, { ttl: 30, hardTtl: 60_000 })
  await sleep(60)
  return cache
}

/** A refresh loader gated on `gate`, counting the calls running at once. */
function gatedRefresher() {
  const r = { gate: deferred(), calls: 0, running: 0, peak: 0, keys: [] }
  r.loader = async (ctx) => {
    r.calls++
    r.keys.push(ctx.key)
    r.running++
    r.peak = Math.max(r.peak, r.running)
    try {
      await r.gate.promise
      return { k: ctx.key, v: 2 }
    } finally {
      r.running--
    }
  }
  return r
}

describe('maxConcurrentRefreshes', () => {
  test('a mass expiry starts at most the bound; every read is served stale at once; cold loads are not held back', async () => {
    const cache = await staleCache({ maxConcurrentRefreshes: 4 })
    const r = gatedRefresher()
    const first = await within(Promise.all(KEYS.map((k) => cache.getOrLoad(k, r.loader))), 5_000, 'the stale reads')
    assert.deepEqual(
      first,
      KEYS.map((k) => ({ k, v: 1 })),
      'every reader got the stale value without waiting',
    )
    assert.equal(r.calls, 4, 'refreshes started: the bound, not one per key')
    assert.equal(cache._debugCounts().refreshing, 4)

    // Reading again while the four run starts nothing more.
    await Promise.all(KEYS.map((k) => cache.getOrLoad(k, r.loader)))
    assert.equal(r.calls, 4)

    // A cold key loads at once although every place is taken.
    let coldCalls = 0
    const cold = await within(
      cache.getOrLoad('cold', async () => ++coldCalls),
      5_000,
      'the cold load',
    )
    assert.equal(cold, 1)

    // Released, the refreshes finish; later reads refresh the rest, at most four at a time, each
    // key once, until every key holds version 2.
    r.gate.resolve()
    for (let round = 0; round < 40; round++) {
      await cache.settle()
      const values = await Promise.all(KEYS.map((k) => cache.getOrLoad(k, r.loader)))
      if (values.every((v) => v.v === 2)) break
    }
    await cache.settle()
    for (const k of KEYS) assert.equal((await cache.inspect(k))?.state, 'fresh', `${k} refreshed`)
    assert.deepEqual(
      await Promise.all(KEYS.map((k) => cache.get(k))),
      KEYS.map((k) => ({ k, v: 2 })),
    )
    assert.equal(r.peak, 4, 'never more than the bound at once')
    assert.equal(r.calls, KEYS.length, 'each key refreshed once')
    assert.equal(new Set(r.keys).size, KEYS.length)
    await assertNoLeaks(cache)
    await cache.close()
  })

  test('Infinity: every stale key read refreshes at once', async () => {
    const cache = await staleCache({ maxConcurrentRefreshes: Infinity })
    const r = gatedRefresher()
    await Promise.all(KEYS.map((k) => cache.getOrLoad(k, r.loader)))
    assert.equal(r.calls, KEYS.length)
    r.gate.resolve()
    await assertNoLeaks(cache)
    await cache.close()
  })

  test('a place is freed by every way a refresh ends: failure, timeout, a write superseding it, skipCache', async () => {
    const cache = await staleCache({ maxConcurrentRefreshes: 1, errorBackoff: 0 })
    const started = []
    const ends = [
      // fails
      async () => {
        throw new Error('source down')
      },
      // never settles: loadTimeout frees it
      () => new Promise(() => {}),
      // superseded by a set while it runs, then returns
      async (ctx) => {
        await cache.set(ctx.key, { k: ctx.key, v: 3 })
        return { k: ctx.key, v: 2 }
      },
      // declines caching
      async (ctx) => {
        ctx.skipCache()
        return { k: ctx.key, v: 2 }
      },
      // succeeds
      async (ctx) => ({ k: ctx.key, v: 2 }),
    ]
    for (const [i, end] of ends.entries()) {
      const key = KEYS[i]
      const before = started.length
      const value = await cache.getOrLoad(
        key,
        (ctx) => {
          started.push(key)
          return end(ctx)
        },
        { loadTimeout: 200 },
      )
      assert.equal(value.v, 1, `${key}: served stale`)
      await within(cache.settle(), 5_000, `${key}'s refresh`)
      assert.equal(started.length, before + 1, `${key}: its refresh started, so the previous one freed its place`)
      assert.equal(cache._debugCounts().refreshing, 0, `${key}: its place is free once it ended`)
    }
    assert.deepEqual(await cache.get(KEYS[2]), { k: KEYS[2], v: 3 }, 'the superseded refresh did not overwrite the set')
    await assertNoLeaks(cache)
    await cache.close()
  })

  test('rejects anything but a whole number >= 1 or Infinity', () => {
    for (const bad of [0, -1, 1.5, NaN, -Infinity, '4', null, true]) {
      throwsWithCode(() => new StampedeCache({ maxConcurrentRefreshes: bad }), 'ERR_INVALID_OPTION', 'maxConcurrentRefreshes')
    }
    for (const good of [1, 16, 1e6, Infinity]) new StampedeCache({ maxConcurrentRefreshes: good }).close()
  })
})
