'use strict'
// Loader control, tags and the byte budget, in one process (docs/CONTRACT.md: LoaderContext,
// GetOrLoadOptions.tags, set, deleteByTag, clear, l1.maxBytes, serializer, stats): the loader's
// own ttl, tags and skipCache; deleteByTag and clear, fenced against loads that began before them; the byte budget
// of the in-process tier; the 'v8' and custom serializers. The Redis side, across processes, is
// __test__/redis-tags.test.js.
//
// Races are made deterministic with gated loaders (a deferred the test resolves), and every
// assertion is on loader-call counts and final states, never on durations.

const { describe, test } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { deferred, rejectsWithCode, throwsWithCode, assertNoLeaks, within } = require('./helpers/assertions')

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** A loader that counts its calls and returns `value` (a function of the call number if given one). */
function counting(value) {
  const loader = async (ctx) => {
    loader.calls++
    return typeof value === 'function' ? value(loader.calls, ctx) : value
  }
  loader.calls = 0
  return loader
}

/** getOrLoad with a loader that must not run: what the cache serves for `key`, or undefined. */
async function served(cache, key) {
  let ran = false
  const v = await cache.getOrLoad(key, () => {
    ran = true
    return 'LOADED'
  })
  return ran ? undefined : v
}

describe('ctx.setTtl', () => {
  test("sets this result's ttl and hardTtl; hardTtl defaults as for a call's ttl", async () => {
    const cache = new StampedeCache({ ttl: 60_000, jitter: 0 })
    try {
      const t0 = Date.now()
      await cache.getOrLoad('both', (ctx) => {
        ctx.setTtl(1_000, 5_000)
        return 1
      })
      await cache.getOrLoad('ttl-only', (ctx) => {
        ctx.setTtl(2_000)
        return 2
      })
      const t1 = Date.now()
      const both = await cache.inspect('both')
      assert.ok(both.freshUntil >= t0 + 1_000 && both.freshUntil <= t1 + 1_000, JSON.stringify(both))
      assert.equal(both.hardUntil - both.freshUntil, 4_000)
      const one = await cache.inspect('ttl-only')
      assert.equal(one.hardUntil - one.freshUntil, 18_000, 'no hardTtl anywhere: 10 x the ttl')
      // The constructor's hardTtl, when given, is the default (never below the ttl).
      const withHard = new StampedeCache({ ttl: 60_000, hardTtl: 90_000, jitter: 0 })
      await withHard.getOrLoad('k', (ctx) => (ctx.setTtl(2_000), 1))
      const k = await withHard.inspect('k')
      assert.equal(k.hardUntil - k.freshUntil, 88_000)
      await withHard.close()
    } finally {
      await cache.close()
    }
  })

  test('a short ttl from the loader makes the entry stale on time, and a not-found result lives it too', async () => {
    const cache = new StampedeCache({ ttl: 60_000, negativeTtl: 60_000, jitter: 0, beta: 0 })
    try {
      await cache.getOrLoad('k', (ctx) => (ctx.setTtl(30, 10_000), 'v'))
      await cache.getOrLoad('n', (ctx) => (ctx.setTtl(30), null))
      await sleep(120)
      assert.equal((await cache.inspect('k')).state, 'stale')
      assert.equal(await cache.inspect('n'), undefined, 'the null result lived 30 ms, not negativeTtl')
      // setTtl(0): nothing is cached.
      const loader = counting((n, ctx) => (ctx.setTtl(0), n))
      assert.equal(await cache.getOrLoad('zero', loader), 1)
      assert.equal(await cache.getOrLoad('zero', loader), 2)
    } finally {
      await cache.close()
    }
  })

  test('a bad ttl throws ERR_INVALID_ARGUMENT inside the loader: its callers reject, nothing is cached; calls after the load are ignored', async () => {
    const cache = new StampedeCache()
    try {
      for (const [args, what] of [
        [[-1], 'ttl'],
        [[NaN], 'ttl'],
        [['5'], 'ttl'],
        [[100, 50], 'hardTtl'],
      ]) {
        await rejectsWithCode(() => cache.getOrLoad('bad', (ctx) => (ctx.setTtl(...args), 1)), 'ERR_INVALID_ARGUMENT', what, JSON.stringify(args))
      }
      assert.equal(await cache.get('bad'), undefined)
      let late
      await cache.getOrLoad('late', (ctx) => {
        late = ctx
        return 1
      })
      late.setTtl(1)
      late.setTags(['t'])
      late.skipCache()
      await cache.deleteByTag('t')
      const info = await cache.inspect('late')
      assert.ok(info && info.hardUntil - Date.now() > 60_000, 'setTtl, setTags and skipCache after the load changed nothing')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
    }
  })
})

describe('ctx.skipCache', () => {
  test('every waiting caller gets the result, nothing is cached, the next call loads', async () => {
    const cache = new StampedeCache()
    try {
      const gate = deferred()
      const loader = counting(async (n, ctx) => {
        await gate.promise
        ctx.skipCache()
        return { n }
      })
      const callers = Array.from({ length: 20 }, () => cache.getOrLoad('k', loader))
      gate.resolve()
      const values = await Promise.all(callers)
      assert.equal(loader.calls, 1)
      for (const v of values) assert.deepEqual(v, { n: 1 })
      assert.equal(await cache.get('k'), undefined)
      assert.deepEqual(await cache.getOrLoad('k', loader), { n: 2 }, 'the next call loads')
      assert.equal(cache.stats().l1Entries, 0)
      await assertNoLeaks(cache, 0)
    } finally {
      await cache.close()
    }
  })

  test('an entry already there is left as it was (forceRefresh, and a background refresh)', async () => {
    const cache = new StampedeCache({ ttl: 50, hardTtl: 60_000, jitter: 0, beta: 0 })
    try {
      await cache.getOrLoad('k', () => 'old')
      assert.equal(await cache.getOrLoad('k', (ctx) => (ctx.skipCache(), 'new'), { forceRefresh: true }), 'new')
      assert.equal(await cache.get('k'), 'old')
      await sleep(80)
      const refresh = counting((n, ctx) => (ctx.skipCache(), `refreshed-${n}`))
      assert.equal(await cache.getOrLoad('k', refresh), 'old', 'stale, served at once')
      await cache.settle()
      assert.equal(refresh.calls, 1)
      assert.equal(await cache.get('k'), 'old', 'the skipped refresh wrote nothing')
      assert.equal((await cache.inspect('k')).state, 'stale')
    } finally {
      await cache.close()
    }
  })
})

describe('tags and deleteByTag', () => {
  test('deleteByTag removes every entry carrying one of the tags, from getOrLoad options, ctx.setTags and set; nothing else', async () => {
    const cache = new StampedeCache()
    try {
      await cache.getOrLoad('opt', () => 'opt', { tags: ['user:1'] })
      await cache.getOrLoad('ctx', (ctx) => (ctx.setTags(['user:1', 'feed']), 'ctx'))
      await cache.getOrLoad('both', (ctx) => (ctx.setTags(['feed']), 'both'), { tags: ['user:2'] })
      await cache.set('set', 'set', { tags: ['user:1'] })
      await cache.getOrLoad('other', () => 'other', { tags: ['user:2'] })
      await cache.getOrLoad('plain', () => 'plain')
      assert.equal(cache.stats().l1Entries, 6)

      await cache.deleteByTag('user:1')
      for (const k of ['opt', 'ctx', 'set']) assert.equal(await served(cache, k), undefined, `${k} carries user:1`)
      for (const k of ['both', 'other', 'plain']) assert.equal(await served(cache, k), k, `${k} does not`)
      await cache.deleteByTag(['feed', 'nobody'])
      assert.equal(await served(cache, 'both'), undefined, 'both carries feed (ctx) and user:2 (options)')
      assert.equal(await served(cache, 'other'), 'other')
      assert.equal(await served(cache, 'plain'), 'plain')
    } finally {
      await cache.close()
    }
  })

  test('tagged entries are served as hits until their tag is deleted; a refresh given no tags keeps them', async () => {
    const cache = new StampedeCache({ ttl: 40, hardTtl: 60_000, jitter: 0, beta: 0 })
    try {
      await cache.getOrLoad('k', () => 1, { tags: ['t'] })
      const before = cache.stats().hits
      for (let i = 0; i < 100; i++) assert.equal(await cache.getOrLoad('k', () => 'LOADED'), 1)
      assert.equal(cache.stats().hits, before + 100)
      await sleep(60)
      // A stale hit without options: the refresh is given no tags, and keeps the entry's.
      assert.equal(await cache.getOrLoad('k', () => 2), 1)
      await cache.settle()
      assert.equal(await cache.get('k'), 2)
      await cache.deleteByTag('t')
      assert.equal(await cache.get('k'), undefined, 'the refreshed entry still carries t')
    } finally {
      await cache.close()
    }
  })

  test('a load that began before deleteByTag never caches its result; its callers still get it', async () => {
    const cache = new StampedeCache()
    try {
      // Tagged by the call's options, and by ctx.setTags as the loader returns.
      for (const [label, opts, tagIt] of [
        ['options', { tags: ['t'] }, false],
        ['ctx.setTags', undefined, true],
      ]) {
        const gate = deferred()
        const loader = counting(async (n, ctx) => {
          await gate.promise
          if (tagIt) ctx.setTags(['t'])
          return `v${n}`
        })
        const key = `fence:${label}`
        const pending = opts ? cache.getOrLoad(key, loader, opts) : cache.getOrLoad(key, loader)
        await sleep(10)
        await cache.deleteByTag('t')
        gate.resolve()
        assert.equal(await within(pending, 5_000, label), 'v1', `${label}: the caller gets the loaded value`)
        assert.equal(await cache.get(key), undefined, `${label}: not cached`)
        assert.equal(await cache.getOrLoad(key, loader, { tags: ['t'] }), 'v2', `${label}: the next call loads`)
        assert.equal(await cache.get(key), 'v2', `${label}: a load that began after the deleteByTag is kept`)
      }
      // A load of another tag that began before is kept.
      const gate = deferred()
      const pending = cache.getOrLoad('fence:other', async () => (await gate.promise, 'kept'), { tags: ['u'] })
      await sleep(10)
      await cache.deleteByTag('t')
      gate.resolve()
      await pending
      assert.equal(await cache.get('fence:other'), 'kept')
      await assertNoLeaks(cache)
    } finally {
      await cache.close()
    }
  })

  test('bad tags are refused with a code, and nothing is loaded or deleted', async () => {
    const cache = new StampedeCache()
    try {
      await cache.getOrLoad('k', () => 1, { tags: ['t'] })
      const loader = counting(1)
      for (const tags of ['t', [1], [''], ['a\uD800'], [null], ['x'.repeat(1_025)]]) {
        await rejectsWithCode(() => cache.getOrLoad('other', loader, { tags }), 'ERR_INVALID_OPTION', 'tags', JSON.stringify(tags))
        await rejectsWithCode(() => cache.set('other', 1, { tags }), 'ERR_INVALID_OPTION', 'tags', `set ${JSON.stringify(tags)}`)
      }
      assert.equal(loader.calls, 0)
      for (const tags of [1, null, [1], [''], {}]) {
        await rejectsWithCode(() => cache.deleteByTag(tags), 'ERR_INVALID_ARGUMENT', 'tags', JSON.stringify(tags))
      }
      await rejectsWithCode(() => cache.getOrLoad('x', (ctx) => (ctx.setTags('t'), 1)), 'ERR_INVALID_ARGUMENT', 'setTags')
      assert.equal(await served(cache, 'k'), 1, 'nothing was deleted')
      await cache.deleteByTag([])
      assert.equal(await served(cache, 'k'), 1, 'no tags: nothing to delete')
    } finally {
      await cache.close()
    }
  })
})

describe('clear()', () => {
  test('drops every entry of this cache, and a load that began before never caches its result', async () => {
    const cache = new StampedeCache()
    const other = new StampedeCache()
    try {
      for (let i = 0; i < 50; i++) await cache.getOrLoad(`k${i}`, () => i, i % 2 ? { tags: ['odd'] } : undefined)
      await other.getOrLoad('k0', () => 'other')
      const gate = deferred()
      const pending = cache.getOrLoad('slow', async () => (await gate.promise, 'slow'))
      await sleep(10)
      await cache.clear()
      assert.equal(cache.stats().l1Entries, 0)
      assert.equal(cache.stats().l1Bytes, 0)
      gate.resolve()
      assert.equal(await pending, 'slow')
      assert.equal(await cache.get('slow'), undefined)
      for (let i = 0; i < 50; i += 7) assert.equal(await cache.get(`k${i}`), undefined)
      assert.equal(await other.get('k0'), 'other', 'another cache is untouched')
      // The cache works as before afterwards.
      assert.equal(await cache.getOrLoad('k1', () => 'again', { tags: ['odd'] }), 'again')
      assert.equal(await served(cache, 'k1'), 'again')
      await assertNoLeaks(cache, 1)
    } finally {
      await cache.close()
      await other.close()
    }
  })
})

describe('l1.maxBytes', () => {
  const tenKb = (n) => ({ n, pad: 'x'.repeat(10_000) })

  test('bounds the in-process tier by serialized size, least recently used first; stats report it', async () => {
    const cache = new StampedeCache({ l1: { maxBytes: 25_000 } })
    try {
      const size = JSON.stringify(tenKb(0)).length
      const loader = counting((n) => tenKb(n))
      for (const k of ['a', 'b']) await cache.getOrLoad(k, loader)
      assert.deepEqual([cache.stats().l1Entries, cache.stats().l1Bytes], [2, 2 * size])
      await cache.getOrLoad('a', loader) // a is now the most recently used
      await cache.getOrLoad('c', loader)
      assert.deepEqual([cache.stats().l1Entries, cache.stats().l1Bytes], [2, 2 * size], 'b went to make room')
      assert.ok(cache.stats().l1Bytes <= 25_000)
      assert.equal((await served(cache, 'a')).n, 1)
      assert.equal((await served(cache, 'c')).n, 3)
      assert.equal(await served(cache, 'b'), undefined)
    } finally {
      await cache.close()
    }
  })

  test('a value larger than maxBytes is served to its callers but not kept (nor is an older copy)', async () => {
    const cache = new StampedeCache({ l1: { maxBytes: 25_000 } })
    try {
      await cache.getOrLoad('big', () => 'small first')
      const big = counting((n) => ({ n, pad: 'y'.repeat(30_000) }))
      const values = await Promise.all(Array.from({ length: 5 }, () => cache.getOrLoad('big', big, { forceRefresh: true })))
      assert.equal(big.calls, 1)
      for (const v of values) assert.equal(v.n, 1)
      assert.equal(await cache.get('big'), undefined, 'neither the big value nor the older copy is kept')
      assert.equal((await cache.getOrLoad('big', big)).n, 2, 'without Redis, the next call loads again')
      assert.equal(cache.stats().l1Bytes, 0)
      // An entry of exactly maxBytes fits.
      await cache.set('exact', 'z'.repeat(25_000 - 2))
      assert.deepEqual([cache.stats().l1Entries, cache.stats().l1Bytes], [1, 25_000])
    } finally {
      await cache.close()
    }
  })

  test('bad maxBytes is refused naming l1.maxBytes; maxEntries still applies beside it', async () => {
    for (const bad of [-1, 1.5, NaN, Infinity, '10']) {
      throwsWithCode(() => new StampedeCache({ l1: { maxBytes: bad } }), 'ERR_INVALID_OPTION', 'l1.maxBytes', String(bad))
    }
    const cache = new StampedeCache({ l1: { maxEntries: 2, maxBytes: 1_000_000 } })
    try {
      for (const k of ['a', 'b', 'c']) await cache.set(k, k)
      assert.equal(cache.stats().l1Entries, 2)
    } finally {
      await cache.close()
    }
  })
})

describe('serializer', () => {
  test("'v8' round-trips Date, Map, Set, BigInt, typed arrays, Buffers and cycles; a hit is a copy made once", async () => {
    const cache = new StampedeCache({ serializer: 'v8' })
    try {
      const original = {
        at: new Date(1_700_000_000_000),
        map: new Map([['a', new Date(0)]]),
        set: new Set([1, 'x']),
        big: 2n ** 70n,
        typed: new Float64Array([1.5, -2]),
        buf: Buffer.from('héllo'),
        nested: { undef: undefined, re: /a+b/gi },
      }
      original.self = original
      const first = await cache.getOrLoad('k', () => original)
      assert.notEqual(first, original, 'what is cached is deserialize(serialize(value)), not the object itself')
      assert.deepEqual(first.at, original.at)
      assert.ok(first.at instanceof Date)
      assert.deepEqual(first.map, original.map)
      assert.deepEqual(first.set, original.set)
      assert.equal(first.big, 2n ** 70n)
      assert.ok(first.typed instanceof Float64Array)
      assert.deepEqual([...first.typed], [1.5, -2])
      assert.ok(Buffer.isBuffer(first.buf) || first.buf instanceof Uint8Array)
      assert.equal(Buffer.from(first.buf).toString(), 'héllo')
      assert.ok('undef' in first.nested)
      assert.equal(first.self, first, 'cycles survive')
      assert.equal(await cache.getOrLoad('k', () => 'LOADED'), first, 'a hit hands out the same copy: nothing is deserialized on a hit')
      await rejectsWithCode(() => cache.getOrLoad('fn', () => () => 1), 'ERR_VALUE_NOT_SERIALIZABLE')
      await rejectsWithCode(() => cache.set('sym', { s: Symbol('x') }), 'ERR_VALUE_NOT_SERIALIZABLE')
      assert.equal(await cache.get('fn'), undefined)
    } finally {
      await cache.close()
    }
  })

  test('a custom serializer is used for every value, as text or as bytes; its failures are ERR_VALUE_NOT_SERIALIZABLE', async () => {
    const calls = { serialize: 0, deserialize: 0 }
    const dates = {
      serialize(value) {
        calls.serialize++
        return JSON.stringify(value, function (key, v) {
          return this[key] instanceof Date ? { $date: this[key].toISOString() } : v
        })
      },
      deserialize(text) {
        calls.deserialize++
        return JSON.parse(text, (key, v) => (v && typeof v === 'object' && typeof v.$date === 'string' ? new Date(v.$date) : v))
      },
    }
    const cache = new StampedeCache({ serializer: dates })
    const bytes = new StampedeCache({
      serializer: { serialize: (v) => new TextEncoder().encode(JSON.stringify(v)), deserialize: (d) => ({ decoded: JSON.parse(Buffer.from(d).toString()) }) },
    })
    try {
      const v = await cache.getOrLoad('k', () => ({ at: new Date(5) }))
      assert.ok(v.at instanceof Date)
      assert.equal(v.at.getTime(), 5)
      assert.deepEqual(calls, { serialize: 1, deserialize: 1 })
      await cache.getOrLoad('k', () => 'LOADED')
      assert.deepEqual(calls, { serialize: 1, deserialize: 1 }, 'a hit runs neither')
      await cache.getOrLoad('n', () => null)
      assert.deepEqual(calls, { serialize: 1, deserialize: 1 }, 'null (a not-found) does not go through the serializer')
      assert.deepEqual(await bytes.getOrLoad('b', () => [1, 2]), { decoded: [1, 2] }, 'a hit returns deserialize(serialize(value))')
      const throwing = new StampedeCache({
        serializer: {
          serialize() {
            throw new Error('nope')
          },
          deserialize: (d) => d,
        },
      })
      const err = await rejectsWithCode(() => throwing.getOrLoad('k', () => 1), 'ERR_VALUE_NOT_SERIALIZABLE')
      assert.equal(err.cause.message, 'nope')
      await rejectsWithCode(() => new StampedeCache({ serializer: { serialize: () => 42, deserialize: (d) => d } }).set('k', 1), 'ERR_VALUE_NOT_SERIALIZABLE')
      assert.equal(await throwing.get('k'), undefined)
      await throwing.close()
    } finally {
      await cache.close()
      await bytes.close()
    }
  })

  test('a bad serializer option is refused naming it', () => {
    for (const bad of ['yaml', 'JSON', 42, null, {}, { serialize: () => '' }, { serialize: 'x', deserialize: () => 1 }]) {
      throwsWithCode(() => new StampedeCache({ serializer: bad }), 'ERR_INVALID_OPTION', 'serializer', JSON.stringify(bad) ?? String(bad))
    }
  })
})

describe('observability', () => {
  test('deleteByTag and clear are published on stampede-cache:invalidate as local invalidations', async () => {
    const dc = require('node:diagnostics_channel')
    const cache = new StampedeCache({ namespace: 'obs' })
    const seen = []
    const onInvalidate = (m) => {
      if (m.cache === cache) seen.push({ key: m.key, source: m.source, tags: m.tags })
    }
    dc.subscribe('stampede-cache:invalidate', onInvalidate)
    try {
      await cache.getOrLoad('k', () => 1, { tags: ['t'] })
      await cache.deleteByTag(['t', 'u'])
      await cache.clear()
      assert.deepEqual(seen, [
        { key: undefined, source: 'local', tags: ['t', 'u'] },
        { key: undefined, source: 'local', tags: undefined },
      ])
    } finally {
      dc.unsubscribe('stampede-cache:invalidate', onInvalidate)
      await cache.close()
    }
  })
})
