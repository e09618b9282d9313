'use strict'
// docs/CONTRACT.md getOrLoad 9 (loadTimeout), in process: the paths no other suite covered. The
// stale-on-timeout path (a caller that has a stale value gets it instead of ERR_LOAD_TIMEOUT, and
// a background refresh that times out leaves the stale value served); loadTimeout: Infinity (no
// timeout, constructor and per call); and the option's validation (constructor and per call).
// The Redis side (lock released at the timeout, late result fenced) is in redis-fencing.test.js.
//
// Timeouts here are short (100 ms) and the loaders that must outlive them hang until the test
// releases them, so no assertion depends on how fast a loaded machine runs.

const { describe, test } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { deferred, within, rejectsWithCode, throwsWithCode, assertNoLeaks } = require('./helpers/assertions')
const { eventually } = require('./helpers/eventually')

/** A loader that records its ctx and settles only when the test says: `release(value)`. */
function hangingLoader() {
  const gate = deferred()
  const l = {
    calls: 0,
    ctx: null,
    release: (v) => gate.resolve(v),
    fn: (ctx) => {
      l.calls++
      l.ctx = ctx
      return gate.promise
    },
  }
  return l
}

/** Makes `key` stale in `cache`: loads it with `value`, then polls inspect (which counts nothing). */
async function staleEntry(cache, key, value) {
  assert.equal(await cache.getOrLoad(key, () => value), value)
  await eventually(async () => (await cache.inspect(key)).state === 'stale', { timeout: 10_000, what: `${key} to go stale` })
}

describe('getOrLoad 9: a caller that has a stale value gets it when the load times out', () => {
  test('forceRefresh on a stale entry whose loader hangs past loadTimeout resolves with the stale value; the late result is not cached', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 60_000, jitter: 0, beta: 0, loadTimeout: 100 })
    try {
      await staleEntry(cache, 'k', 'old')
      const hung = hangingLoader()
      const v = await within(cache.getOrLoad('k', hung.fn, { forceRefresh: true }), 10_000, 'the forceRefresh past loadTimeout')
      assert.equal(v, 'old', 'the stale value, not ERR_LOAD_TIMEOUT')
      assert.equal(hung.calls, 1)
      assert.equal(hung.ctx.signal.aborted, true, "the timed-out loader's ctx.signal aborted")
      assert.equal(hung.ctx.stale, 'old')
      // The key is free at once: the next load is led anew, and the late result lands nowhere.
      let next = 0
      assert.equal(await cache.getOrLoad('k', () => (next++, 'new'), { forceRefresh: true }), 'new')
      assert.equal(next, 1)
      hung.release('late')
      await cache.settle()
      assert.equal(await cache.get('k'), 'new', 'the late result of the timed-out load was cached')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })

  test('the same load, for a caller without a stale value (cold), rejects with ERR_LOAD_TIMEOUT', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0, loadTimeout: 100 })
    try {
      const hung = hangingLoader()
      const err = await rejectsWithCode(() => cache.getOrLoad('cold', hung.fn), 'ERR_LOAD_TIMEOUT', 'loadTimeout', 'cold load past loadTimeout')
      assert.match(err.message, /100 ms/)
      assert.equal(hung.ctx.signal.aborted, true)
      hung.release('late')
      await cache.settle()
      assert.equal(await cache.get('cold'), undefined, 'the late result of a timed-out cold load was cached')
    } finally {
      await cache.close()
    }
  })

  test('a background refresh past loadTimeout: the stale value stays served, onError gets ERR_LOAD_TIMEOUT, the late result is not cached', async () => {
    const reported = []
    const cache = new StampedeCache({
      ttl: 50,
      hardTtl: 60_000,
      jitter: 0,
      beta: 0,
      loadTimeout: 100,
      errorBackoff: 0,
      onError: (err, info) => reported.push({ code: err && err.code, ...info }),
    })
    try {
      await staleEntry(cache, 'k', 'old')
      const hung = hangingLoader()
      assert.equal(await cache.getOrLoad('k', hung.fn), 'old', 'a stale read resolves at once')
      await within(cache.settle(), 10_000, 'the timed-out refresh to settle')
      assert.equal(hung.calls, 1)
      assert.equal(hung.ctx.signal.aborted, true, "the refresh's ctx.signal aborted at the timeout")
      assert.deepEqual(reported, [{ code: 'ERR_LOAD_TIMEOUT', op: 'refresh', key: 'k' }])
      assert.equal(cache.stats().refreshErrors, 1)
      assert.equal(await cache.get('k'), 'old', 'the stale value stays served')
      hung.release('late')
      await cache.settle()
      assert.equal(await cache.get('k'), 'old', 'the late result of the timed-out refresh was cached')
      // The key is free: the next stale read refreshes it (errorBackoff 0).
      assert.equal(await cache.getOrLoad('k', () => 'new'), 'old')
      await cache.settle()
      assert.equal(await cache.get('k'), 'new')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

describe('getOrLoad 9: loadTimeout Infinity means no timeout', () => {
  test('per call, Infinity overrides a short constructor loadTimeout: a load 4x longer resolves, is cached, its signal never aborts', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0, loadTimeout: 50 })
    try {
      const hung = hangingLoader()
      const p = cache.getOrLoad('k', hung.fn, { loadTimeout: Infinity })
      // Well past the constructor's 50 ms, released by the test (not by a race with a timer).
      await new Promise((resolve) => setTimeout(resolve, 200))
      assert.equal(hung.ctx.signal.aborted, false)
      hung.release('slow value')
      assert.equal(await within(p, 10_000, 'the load with loadTimeout Infinity'), 'slow value')
      assert.equal(await cache.get('k'), 'slow value')
      // Control: without the override the constructor's 50 ms applies.
      const control = hangingLoader()
      await rejectsWithCode(() => cache.getOrLoad('c', control.fn), 'ERR_LOAD_TIMEOUT', undefined, 'control')
      control.release('x')
    } finally {
      await cache.close()
    }
  })

  test('in the constructor, Infinity: a load that outlives a per-call 50 ms elsewhere still resolves here', async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0, loadTimeout: Infinity })
    try {
      const hung = hangingLoader()
      const p = cache.getOrLoad('k', hung.fn)
      const short = hangingLoader()
      await rejectsWithCode(() => cache.getOrLoad('other', short.fn, { loadTimeout: 50 }), 'ERR_LOAD_TIMEOUT', undefined, 'per-call 50 ms')
      assert.equal(hung.ctx.signal.aborted, false, 'the Infinity load was not aborted')
      hung.release('v')
      assert.equal(await within(p, 10_000, 'the load with loadTimeout Infinity'), 'v')
      short.release('late')
    } finally {
      await cache.close()
    }
  })
})

test('loadTimeout past what a timer holds (2^31 - 1 ms) is refused naming its maximum; at it, no load times out at once', async () => {
  // setTimeout clamps a delay past 2^31 - 1 ms to 1 ms: such a loadTimeout must never mean "1 ms".
  for (const loadTimeout of [2 ** 31, 1e300]) {
    const err = throwsWithCode(() => new StampedeCache({ loadTimeout }), 'ERR_INVALID_OPTION', 'loadTimeout', `loadTimeout ${loadTimeout}`)
    assert.match(err.message, /2147483647/, err.message)
  }
  for (const loadTimeout of [2 ** 31 - 1]) {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0, loadTimeout })
    try {
      const hung = hangingLoader()
      const p = cache.getOrLoad('k', hung.fn)
      await new Promise((resolve) => setTimeout(resolve, 100))
      assert.equal(hung.ctx.signal.aborted, false, `loadTimeout ${loadTimeout}: the load was aborted within 100 ms`)
      hung.release('v')
      assert.equal(await within(p, 10_000, `loadTimeout ${loadTimeout}`), 'v')
    } finally {
      await cache.close()
    }
  }
})

describe('loadTimeout validation', () => {
  const BAD = [
    [0, /positive/],
    [-1, /positive/],
    [-Infinity, /positive/],
    [Number.NaN, /positive/],
    ['100', /number/],
    [null, /number/],
    [true, /number/],
  ]

  test('the constructor throws ERR_INVALID_OPTION naming loadTimeout, synchronously', () => {
    for (const [v, says] of BAD) {
      const err = throwsWithCode(() => new StampedeCache({ loadTimeout: v }), 'ERR_INVALID_OPTION', 'loadTimeout', `loadTimeout ${String(v)}`)
      assert.match(err.message, says, String(v))
    }
    for (const v of [1, 1.5, 30_000, Infinity]) new StampedeCache({ loadTimeout: v }).close()
  })

  test('per call, getOrLoad rejects with ERR_INVALID_OPTION naming loadTimeout and calls no loader', async () => {
    const cache = new StampedeCache({ ttl: 60_000 })
    try {
      let calls = 0
      for (const [v] of BAD) {
        await rejectsWithCode(
          () => cache.getOrLoad('k', () => (calls++, 'x'), { loadTimeout: v }),
          'ERR_INVALID_OPTION',
          'loadTimeout',
          `per call ${String(v)}`,
        )
      }
      assert.equal(calls, 0)
      assert.equal(await cache.get('k'), undefined)
    } finally {
      await cache.close()
    }
  })
})
