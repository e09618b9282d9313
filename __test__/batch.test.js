'use strict'
// Many keys at once (docs/CONTRACT.md and API.md, "Many keys at once"): getOrLoadMany and getMany.
//
// Every claim is counted, not timed: loadMany calls and the ids they were given, per process
// and across processes; Redis commands as Redis counts them (INFO commandstats). The only time
// bounds are "did not deadlock" bounds far above the loads' own durations and far below lockTtl.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { sleep, assertNoLeaks, rejectsWithCode } = require('./helpers/assertions')
const { monitorDuring } = require('./helpers/monitor')
const { setupRedis, barrier, killAllSync, waitFor } = require('./helpers/redis-server')

const TEST_TIMEOUT = 60_000
after(() => killAllSync())

const ids = (n, prefix = 'id') => Array.from({ length: n }, (_, i) => `${prefix}${i}`)

/** A loadMany that records each call's keys and answers `value(key)` after `ms`. */
function recorder({ ms = 0, value = (k) => ({ k }) } = {}) {
  const calls = []
  const loadMany = async (keys, ctx) => {
    calls.push({ keys: [...keys], ctx, startedAt: Date.now() })
    if (ms) await sleep(ms)
    return keys.map(value)
  }
  return { calls, loadMany }
}

/**
 * The commands clients sent while `fn` ran, by name, as Redis's MONITOR shows them (commands a
 * script runs are shown as the script's, "lua", and not counted: INFO commandstats counts both).
 */
async function clientCommands(redis, fn, onCommand = () => {}) {
  const counts = {}
  await monitorDuring(redis.port, fn, (addr, name) => {
    if (addr === 'lua') return
    counts[name.toLowerCase()] = (counts[name.toLowerCase()] ?? 0) + 1
    onCommand(addr, name)
  })
  return counts
}

/** The addresses of the read lanes connected to `redis` now (CLIENT LIST names them). */
async function readLanes(redis) {
  const list = await redis.cmd('CLIENT', 'LIST')
  return new Set(
    list
      .split('\n')
      .filter((line) => line.includes('name=stampede-cache:read-lane'))
      .map((line) => line.match(/addr=(\S+)/)[1]),
  )
}

const pick = (counts, names) => Object.fromEntries(names.map((n) => [n, counts[n] ?? 0]))

/**
 * Reads with `cache` until its read lane is open and has carried a read: the lane opens in the
 * background (its handshake ends with an ECHO of its own), and is taken up by the first read
 * after it opened. Counts must not catch it opening.
 */
async function laneOpen(redis, cache) {
  await waitFor(
    async () => {
      // A key no one wrote: read from Redis, never from the in-process tier or an announcement.
      await cache.getMany(['lane-warmup'])
      const list = await redis.cmd('CLIENT', 'LIST')
      return list.split('\n').some((line) => line.includes('name=stampede-cache:read-lane') && line.includes('cmd=echo '))
    },
    { what: 'the read lane to open' },
  )
  await sleep(50)
  for (let i = 0; i < 2; i++) await cache.getMany(['lane-warmup'])
}

// ---- in process ---------------------------------------------------------------------------

test('1,000 cold ids: one loadMany call with all of them, in order; then all hits and no call', async () => {
  const cache = new StampedeCache()
  const { calls, loadMany } = recorder()
  const keys = ids(1_000)
  const values = await cache.getOrLoadMany(keys, loadMany)
  assert.equal(calls.length, 1)
  assert.deepEqual(calls[0].keys, keys)
  assert.deepEqual(
    values,
    keys.map((k) => ({ k })),
  )
  assert.deepEqual(await cache.getOrLoadMany(keys, loadMany), values)
  assert.equal(calls.length, 1, 'warm: nothing loaded')
  const s = cache.stats()
  assert.deepEqual([s.loads, s.misses, s.hits], [1, 1_000, 1_000], 'loads counts loadMany calls; misses and hits per key')
  await assertNoLeaks(cache, 1_000)
  await cache.close()
})

test('only the misses are loaded, in the order of keys; duplicates once, answered at every position', async () => {
  const cache = new StampedeCache()
  await cache.set('b', 'B')
  await cache.set(['arr', 1], 'ARR')
  const { calls, loadMany } = recorder({ value: (k) => `v:${Array.isArray(k) ? k.join('/') : k}` })
  const keys = ['c', 'b', 'a', 'c', ['arr', 1], ['arr', 2], 'a']
  const values = await cache.getOrLoadMany(keys, loadMany)
  assert.equal(calls.length, 1)
  assert.deepEqual(calls[0].keys, ['c', 'a', ['arr', 2]], 'each missing key once, as given, first position first')
  assert.deepEqual(values, ['v:c', 'B', 'v:a', 'v:c', 'ARR', 'v:arr/2', 'v:a'])
  assert.equal(calls[0].ctx.keys.length, 3, 'ctx.keys: the encoded keys')
  assert.deepEqual(await cache.getOrLoadMany([], loadMany), [], 'empty keys: []')
  assert.equal(calls.length, 1, 'without calling loadMany')
  await cache.close()
})

test('per-key results: an Error fails its key alone (not cached, joined callers reject); null is cached for negativeTtl', async () => {
  const cache = new StampedeCache({ negativeTtl: 60_000 })
  const boom = new Error('db: no row lock')
  let release
  const gate = new Promise((r) => (release = r))
  let loads = 0
  const first = cache.getOrLoadMany(['ok', 'bad', 'none', 'undef'], async () => {
    loads++
    await gate
    return [1, boom, null, undefined]
  })
  // A getOrLoad of a key the batch is loading joins it and rejects with that key's Error.
  const joined = cache.getOrLoad('bad', () => 'must not load')
  release()
  assert.deepEqual(await first, [1, boom, null, undefined])
  await assert.rejects(joined, (err) => err === boom)
  const { calls, loadMany } = recorder({ value: () => 'again' })
  assert.deepEqual(await cache.getOrLoadMany(['ok', 'bad', 'none', 'undef'], loadMany), [1, 'again', null, undefined])
  assert.deepEqual(
    calls.map((c) => c.keys),
    [['bad']],
    'only the failed key is loaded again: null and undefined were cached',
  )
  assert.equal(loads, 1)
  await cache.close()
})

test('an Error from another realm (a vm context, a test sandbox) at a position is an error, never cached as a value', async () => {
  const vm = require('node:vm')
  const cache = new StampedeCache({ negativeTtl: 60_000 })
  const foreign = vm.runInNewContext('new Error("x")')
  const foreignType = vm.runInNewContext('new TypeError("y")')
  assert.equal(foreign instanceof Error, false, 'the premise: instanceof fails across realms')
  let release
  const gate = new Promise((r) => (release = r))
  const first = cache.getOrLoadMany(['a', 'b', 'c'], async () => {
    await gate
    return [foreign, 1, foreignType]
  })
  const joined = cache.getOrLoad('a', () => 'must not load')
  release()
  const got = await first
  assert.equal(got[0], foreign, 'the position holds the error itself')
  assert.equal(got[2], foreignType)
  await assert.rejects(joined, (err) => err === foreign)
  assert.equal(await cache.get('a'), undefined, 'nothing cached for it')
  const { calls, loadMany } = recorder({ value: () => 'loaded' })
  assert.deepEqual(await cache.getOrLoadMany(['a', 'b', 'c'], loadMany), ['loaded', 1, 'loaded'])
  assert.deepEqual(
    calls.map((c) => c.keys),
    [['a', 'c']],
  )
  await cache.close()
})

test('loadMany throwing fails every key it was asked for; the call still resolves, per position', async () => {
  const cache = new StampedeCache()
  await cache.set('warm', 'W')
  const err = new Error('db down')
  const out = await cache.getOrLoadMany(['x', 'warm', 'y'], () => {
    throw err
  })
  assert.deepEqual(out, [err, 'W', err])
  const rejected = await cache.getOrLoadMany(['x'], async () => Promise.reject(err))
  assert.deepEqual(rejected, [err])
  assert.equal(cache.stats().loads, 2)
  await assertNoLeaks(cache)
  await cache.close()
})

test('a result of the wrong length rejects the call and every caller joined on its keys with ERR_INVALID_ARGUMENT; nothing cached', async () => {
  const cache = new StampedeCache()
  let release
  const gate = new Promise((r) => (release = r))
  const batch = cache.getOrLoadMany(['p', 'q', 'r'], async () => {
    await gate
    return ['only', 'two']
  })
  const joined = cache.getOrLoad('q', () => 'must not load')
  release()
  await rejectsWithCode(() => batch, 'ERR_INVALID_ARGUMENT')
  await rejectsWithCode(() => joined, 'ERR_INVALID_ARGUMENT')
  await rejectsWithCode(() => cache.getOrLoadMany(['s'], () => 'not an array'), 'ERR_INVALID_ARGUMENT')
  for (const k of ['p', 'q', 'r', 's']) assert.equal(await cache.get(k), undefined, `${k} not cached`)
  await assertNoLeaks(cache, 0)
  await cache.close()
})

test('bad input: codes, and nothing loads', async () => {
  const cache = new StampedeCache()
  let called = 0
  const loadMany = (keys) => {
    called++
    return keys.map(() => 1)
  }
  await rejectsWithCode(() => cache.getOrLoadMany(['a', '', 'b'], loadMany), 'ERR_INVALID_KEY')
  await rejectsWithCode(() => cache.getOrLoadMany(['a', { no: 1 }], loadMany), 'ERR_INVALID_KEY')
  await rejectsWithCode(() => cache.getOrLoadMany(['a', 'x'.repeat(2_000)], loadMany), 'ERR_INVALID_KEY')
  await rejectsWithCode(() => cache.getOrLoadMany('a', loadMany), 'ERR_INVALID_ARGUMENT')
  await rejectsWithCode(() => cache.getOrLoadMany(ids(10_001), loadMany), 'ERR_INVALID_ARGUMENT')
  await rejectsWithCode(() => cache.getOrLoadMany(['a'], 'nope'), 'ERR_INVALID_ARGUMENT')
  await rejectsWithCode(() => cache.getOrLoadMany(['a'], loadMany, { ttl: -1 }), 'ERR_INVALID_OPTION')
  await rejectsWithCode(() => cache.getMany(['a', 7]), 'ERR_INVALID_KEY')
  await rejectsWithCode(() => cache.getMany(ids(10_001)), 'ERR_INVALID_ARGUMENT')
  assert.equal(called, 0)
  assert.equal((await cache.getOrLoadMany(ids(10_000), loadMany)).length, 10_000, '10,000 keys is allowed')
  assert.equal(called, 1)
  assert.equal(cache._debugCounts().engineFlights, 0, 'no flight was left by a rejected call')
  await cache.close()
  await rejectsWithCode(() => cache.getOrLoadMany(['a'], loadMany), 'ERR_CLOSED')
  await rejectsWithCode(() => cache.getMany(['a']), 'ERR_CLOSED')
})

test('a key already loading (getOrLoad, or another batch) is joined, both ways', async () => {
  const cache = new StampedeCache()
  let releaseSingle
  const single = cache.getOrLoad('a', () => new Promise((r) => (releaseSingle = () => r('from getOrLoad'))))
  const { calls, loadMany } = recorder({ ms: 20 })
  const batch = cache.getOrLoadMany(['a', 'b'], loadMany)
  await sleep(50)
  assert.deepEqual(
    calls.map((c) => c.keys),
    [['b']],
    'the batch did not wait for the key getOrLoad loads',
  )
  releaseSingle()
  assert.deepEqual(await batch, ['from getOrLoad', { k: 'b' }])
  assert.equal(await single, 'from getOrLoad')

  let releaseBatch
  const slow = cache.getOrLoadMany(['c', 'd'], (keys) => new Promise((r) => (releaseBatch = () => r(keys.map((k) => `batch:${k}`)))))
  let loaderCalled = false
  const joined = cache.getOrLoad('d', () => {
    loaderCalled = true
    return 'single'
  })
  await sleep(10)
  releaseBatch()
  assert.deepEqual(await slow, ['batch:c', 'batch:d'])
  assert.equal(await joined, 'batch:d')
  assert.equal(loaderCalled, false)
  await assertNoLeaks(cache)
  await cache.close()
})

/** 10 batches of 300 ids each, windows over 1,000 ids, started at once. */
async function overlapping(cache, { prefix, ms = 40 }) {
  const all = ids(1_000, prefix)
  const loadedTimes = new Map()
  const durations = []
  const loadMany = async (keys) => {
    const t0 = Date.now()
    for (const k of keys) loadedTimes.set(k, (loadedTimes.get(k) ?? 0) + 1)
    await sleep(ms)
    durations.push(Date.now() - t0)
    return keys.map((k) => `v:${k}`)
  }
  const waits = []
  const batches = Array.from({ length: 10 }, (_, b) => {
    const start = (b * 97) % 1_000
    const keys = Array.from({ length: 300 }, (_, i) => all[(start + i) % 1_000])
    const t0 = Date.now()
    return cache.getOrLoadMany(keys, loadMany).then((values) => {
      waits.push(Date.now() - t0)
      assert.deepEqual(
        values,
        keys.map((k) => `v:${k}`),
      )
    })
  })
  await Promise.all(batches)
  return { loadedTimes, durations, waits, all }
}

test('10 concurrent overlapping batches over 1,000 ids: every id loaded exactly once, none deadlocks', { timeout: TEST_TIMEOUT }, async () => {
  const cache = new StampedeCache()
  const { loadedTimes, durations, waits, all } = await overlapping(cache, { prefix: 'ov' })
  const touched = all.filter((k) => loadedTimes.has(k))
  assert.ok(touched.length > 900, 'the windows cover the ids')
  assert.ok(
    [...loadedTimes.values()].every((n) => n === 1),
    'no id was loaded twice',
  )
  assert.ok(durations.length <= 10, 'at most one loadMany call per batch')
  const slowest = Math.max(...durations)
  // A batch waits for its own loadMany and the overlapping ones it joined, which all started at once.
  for (const w of waits) assert.ok(w < slowest + 2_000, `a batch waited ${w} ms (slowest loadMany ${slowest} ms)`)
  await assertNoLeaks(cache)
  await cache.close()
})

test('stale keys are served at once and refreshed in one background loadMany call, handed to waitUntil', async () => {
  const handed = []
  const cache = new StampedeCache({ ttl: 30, hardTtl: 60_000, jitter: 0, beta: 0, waitUntil: (p) => handed.push(p) })
  const keys = ids(5, 'st')
  let round = 0
  const calls = []
  const loadMany = (ks, ctx) => {
    calls.push({ keys: [...ks], ctx })
    round++
    return ks.map((k) => `${k}@${round}`)
  }
  assert.deepEqual(
    await cache.getOrLoadMany(keys, loadMany),
    keys.map((k) => `${k}@1`),
  )
  await sleep(60)
  // One more key, cold, in the same call: loaded with the cold call, not with the refresh.
  const out = await cache.getOrLoadMany([...keys, 'fresh-one'], loadMany)
  assert.deepEqual(
    out.slice(0, 5),
    keys.map((k) => `${k}@1`),
    'stale values served at once',
  )
  assert.equal(handed.length, 1, 'one background promise, handed to waitUntil before the call resolved')
  await cache.settle()
  assert.deepEqual(
    calls.map((c) => c.keys),
    [keys, ['fresh-one'], keys],
    'the stale keys refreshed in one call',
  )
  assert.equal(calls[2].ctx.signal.aborted, false)
  assert.deepEqual(
    await cache.getOrLoadMany(keys, loadMany),
    keys.map((k) => `${k}@3`),
  )
  const s = cache.stats()
  assert.equal(s.staleHits, 5)
  assert.equal(s.loads, 3)
  assert.equal(s.refreshes, 1)
  await assertNoLeaks(cache)
  await cache.close()
})

test('a failed background refresh keeps serving the stale values (stale-if-error) and reports per key', async () => {
  const errors = []
  const cache = new StampedeCache({ ttl: 30, hardTtl: 60_000, jitter: 0, beta: 0, errorBackoff: 60_000, onError: (e, info) => errors.push(info) })
  const keys = ['e1', 'e2']
  await cache.getOrLoadMany(keys, (ks) => ks.map((k) => `${k}:v1`))
  await sleep(60)
  let refreshCalls = 0
  const failing = (ks) => {
    refreshCalls++
    return ks.map((k) => (k === 'e1' ? new Error('upstream 503') : `${k}:v2`))
  }
  assert.deepEqual(await cache.getOrLoadMany(keys, failing), ['e1:v1', 'e2:v1'])
  await cache.settle()
  assert.equal(refreshCalls, 1)
  assert.deepEqual(
    errors.map((e) => [e.op, e.key]),
    [['refresh', 'e1']],
  )
  assert.deepEqual(await cache.getOrLoadMany(keys, failing), ['e1:v1', 'e2:v2'], 'e1 stays stale; e2 refreshed')
  await cache.settle()
  assert.equal(refreshCalls, 1, 'e1 is in errorBackoff; e2 is fresh: nothing refreshed')
  assert.equal(cache.stats().refreshErrors, 1)
  await cache.close()
})

test('loadTimeout bounds the loadMany call: its keys fail with ERR_LOAD_TIMEOUT, ctx.signal aborts, the keys are free, a late result is not cached', async () => {
  const cache = new StampedeCache({ loadTimeout: 100 })
  let ctxSeen
  let finish
  const out = await cache.getOrLoadMany(['t1', 't2'], (keys, ctx) => {
    ctxSeen = ctx
    // A real loadMany does I/O, which keeps the process alive (the timeout's timer does not).
    return new Promise((r) => {
      const io = setTimeout(() => r(keys.map(() => 'late')), 30_000)
      finish = () => {
        clearTimeout(io)
        r(keys.map(() => 'late'))
      }
    })
  })
  assert.equal(out.length, 2)
  for (const e of out) assert.equal(e.code, 'ERR_LOAD_TIMEOUT')
  assert.equal(ctxSeen.signal.aborted, true)
  finish()
  await sleep(10)
  assert.equal(await cache.get('t1'), undefined, 'the late result is not cached')
  const again = await cache.getOrLoadMany(['t1', 't2'], (keys) => keys.map((k) => `${k}:ok`), { loadTimeout: 5_000 })
  assert.deepEqual(again, ['t1:ok', 't2:ok'], 'the keys were free: the next call led a new load')
  await assertNoLeaks(cache)
  await cache.close()
})

test('ctx.setTtl and ctx.setTags apply to every key of the call; options.tags too', async () => {
  const cache = new StampedeCache({ ttl: 60_000 })
  await cache.getOrLoadMany(
    ['g1', 'g2'],
    (keys, ctx) => {
      ctx.setTtl(30, 60_000)
      ctx.setTags(['group'])
      return keys.map((k) => k)
    },
    { tags: ['call'] },
  )
  const info = await cache.inspect('g1')
  assert.ok(info.freshUntil - Date.now() <= 40, 'setTtl applied')
  await cache.deleteByTag('group')
  assert.deepEqual(await cache.getMany(['g1', 'g2']), [undefined, undefined], 'setTags applied to every key')
  await cache.getOrLoadMany(['g3'], (keys) => keys, { tags: ['call'] })
  await cache.deleteByTag('call')
  assert.equal(await cache.get('g3'), undefined, 'options.tags applied')
  // An invalid ttl throws from ctx.setTtl inside loadMany: that fails the keys, not the process.
  const bad = await cache.getOrLoadMany(['g4'], (keys, ctx) => {
    ctx.setTtl(-5)
    return keys
  })
  assert.equal(bad[0].code, 'ERR_INVALID_ARGUMENT')
  await cache.close()
})

test('getMany: fresh or stale values, undefined where none; never loads; duplicates answered', async () => {
  const cache = new StampedeCache({ ttl: 20, hardTtl: 60_000, jitter: 0 })
  await cache.set('m1', { a: 1 })
  await cache.set(['m', 2], null)
  await sleep(40)
  assert.deepEqual(await cache.getMany(['m1', 'nope', ['m', 2], 'm1']), [{ a: 1 }, undefined, null, { a: 1 }])
  assert.deepEqual(await cache.getMany([]), [])
  assert.equal(cache.stats().loads, 0)
  await cache.close()
})

test('a caller signal rejects that call with AbortError; the load goes on and fills the cache', async () => {
  const cache = new StampedeCache()
  const ac = new AbortController()
  const { calls, loadMany } = recorder({ ms: 50 })
  const p = cache.getOrLoadMany(['s1'], loadMany, { signal: ac.signal })
  ac.abort()
  await assert.rejects(p, { name: 'AbortError' })
  await cache.settle()
  await sleep(80)
  assert.deepEqual(await cache.get('s1'), { k: 's1' })
  assert.equal(calls.length, 1)
  await cache.close()
})

test('options take the same per-key rules: an aborted signal rejects even when every key is held, and loads nothing', async () => {
  const cache = new StampedeCache()
  const { calls, loadMany } = recorder()
  await cache.getOrLoadMany(['h1', 'h2'], loadMany)
  const ac = new AbortController()
  ac.abort()
  await assert.rejects(cache.getOrLoadMany(['h1', 'h2'], loadMany, { signal: ac.signal, ttl: 5_000 }), { name: 'AbortError' })
  await assert.rejects(cache.getOrLoadMany(['h1', 'cold'], loadMany, { signal: ac.signal }), { name: 'AbortError' })
  await assert.rejects(
    cache.getOrLoad('h1', () => 'x', { signal: ac.signal }),
    { name: 'AbortError' },
    'as getOrLoad does',
  )
  assert.equal(calls.length, 1)
  // A bad key still rejects the whole call before anything loads, with options as without.
  await rejectsWithCode(() => cache.getOrLoadMany(['h1', ''], loadMany, { ttl: 5_000 }), 'ERR_INVALID_KEY')
  await rejectsWithCode(() => cache.getOrLoadMany(['h1'], loadMany, { ttl: -1 }), 'ERR_INVALID_OPTION')
  assert.equal(calls.length, 1)
  await cache.close()
})

test('forceRefresh loads every key now, held or not, in one loadMany call, and replaces them', async () => {
  const cache = new StampedeCache()
  let round = 0
  const calls = []
  const loadMany = (ks, ctx) => {
    calls.push([...ks])
    round++
    return ks.map((k) => `${k}@${round}`)
  }
  await cache.getOrLoadMany(['f1', 'f2'], loadMany)
  assert.deepEqual(await cache.getOrLoadMany(['f1', 'f2', 'f3'], loadMany, { forceRefresh: true, ttl: 5_000 }), ['f1@2', 'f2@2', 'f3@2'])
  assert.deepEqual(calls, [
    ['f1', 'f2'],
    ['f1', 'f2', 'f3'],
  ])
  assert.deepEqual(await cache.getMany(['f1', 'f2', 'f3']), ['f1@2', 'f2@2', 'f3@2'])
  await assertNoLeaks(cache, 3)
  await cache.close()
})

test("held stale keys of a batch with options are refreshed once in the background, with that call's ttl, tags and waitUntil", async () => {
  const cache = new StampedeCache({ ttl: 30, hardTtl: 60_000, jitter: 0, beta: 0 })
  const keys = ids(5, 'so')
  const calls = []
  const loadMany = (ks) => {
    calls.push([...ks])
    return ks.map((k) => `${k}@${calls.length}`)
  }
  await cache.getOrLoadMany(keys, loadMany)
  await sleep(60)
  const handed = []
  const out = await cache.getOrLoadMany(keys, loadMany, { ttl: 60_000, tags: ['held'], waitUntil: (p) => handed.push(p) })
  assert.deepEqual(
    out,
    keys.map((k) => `${k}@1`),
    'stale values served at once',
  )
  assert.equal(handed.length, 1, "handed to the call's waitUntil before it resolved")
  await cache.settle()
  assert.deepEqual(calls, [keys, keys])
  const info = await cache.inspect(keys[0])
  assert.ok(info.freshUntil - Date.now() > 30_000, "written with the call's ttl")
  await cache.deleteByTag('held')
  assert.deepEqual(await cache.getMany(keys), new Array(5).fill(undefined), "the call's tags on every key refreshed")
  await assertNoLeaks(cache)
  await cache.close()
})

test('a per-call beta decides each held key as getOrLoad with that beta decides it', async () => {
  // hardTtl == ttl (no stale window): a read at a huge beta refreshes early with near certainty
  // (computeMs ~40 ms * 1e6 against at most 2 s left: a key missed with probability about 5e-5); at beta 0
  // never. The constructor's beta is the other one each time.
  for (const [constructorBeta, callBeta, refreshes] of [
    [0, 1e6, true],
    [1e6, 0, false],
  ]) {
    const cache = new StampedeCache({ ttl: 2_000, hardTtl: 2_000, jitter: 0, beta: constructorBeta })
    const calls = []
    const loadMany = async (ks) => {
      calls.push([...ks])
      await sleep(40)
      return ks.map((k) => `${k}@${calls.length}`)
    }
    let single = 0
    const loader = async (ctx) => {
      single++
      await sleep(40)
      return `${ctx.key}@${single}`
    }
    await cache.getOrLoadMany(['b1', 'b2'], loadMany, { beta: callBeta })
    await cache.getOrLoad('alone', loader, { beta: callBeta })
    // Each early refresh writes an entry as close to its draw as the last: at the huge beta every
    // read refreshes, so one read is enough; at beta 0 none does, however many.
    for (let i = 0; i < (refreshes ? 1 : 5); i++) {
      assert.deepEqual(await cache.getOrLoadMany(['b1', 'b2'], loadMany, { beta: callBeta }), ['b1@1', 'b2@1'], 'served at once')
      assert.equal(await cache.getOrLoad('alone', loader, { beta: callBeta }), 'alone@1')
      await cache.settle()
    }
    assert.equal(cache.stats().staleHits, 0)
    if (refreshes) {
      assert.equal(single, 2, 'getOrLoad refreshed early')
      assert.deepEqual(
        calls,
        [
          ['b1', 'b2'],
          ['b1', 'b2'],
        ],
        'the batch too: its held keys early, in one background call',
      )
      assert.deepEqual(await cache.getMany(['b1', 'b2']), ['b1@2', 'b2@2'])
    } else {
      assert.equal(single, 1, 'getOrLoad at beta 0 never refreshes early')
      assert.deepEqual(calls, [['b1', 'b2']], 'nor does the batch')
    }
    await assertNoLeaks(cache)
    await cache.close()
  }
})

// ---- with Redis -------------------------------------------------------------------------------

test('Redis: 1,000 cold ids take one loadMany call; a second instance (l1: false) reads them all with one MGET, loading none', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache(base)
  t.after(() => a.close())
  const keys = ids(1_000, 'r')
  // Connected (and the bus subscribed, the read lane open), and the scripts loaded in Redis,
  // before counting.
  await a.getOrLoadMany(['warmup'], (ks) => ks)
  await laneOpen(redis, a)
  const { calls, loadMany } = recorder()
  let values
  const cold = pick(
    await clientCommands(redis, async () => {
      values = await a.getOrLoadMany(keys, loadMany)
    }),
    ['get', 'mget', 'echo', 'evalsha', 'eval', 'hget'],
  )
  assert.equal(calls.length, 1)
  assert.deepEqual(
    values,
    keys.map((k) => ({ k })),
  )
  // One MGET of every key (on the read lane; its ECHO, the alignment mark, only when one is due:
  // marks are amortised while nothing changed), one lock bid per key (one pipeline, ended by an
  // ECHO as every pipeline off a Cluster), one fenced write-back per key (each proving its place
  // by the mark it returns: no ECHO), and at most one read of the namespace clock for the batch
  // (with its ECHO): none while the clock known here stands for Redis's (read by the warm-up less
  // than a second before, the bus up since: see `Lock::vouched`).
  const { echo: coldEchoes, hget: clockReads, ...coldRest } = cold
  assert.deepEqual(coldRest, { get: 0, mget: 1, evalsha: 2_000, eval: 0 })
  assert.ok(clockReads <= 1, `${clockReads} reads of the namespace clock for a cold batch`)
  assert.ok(coldEchoes >= 1 && coldEchoes <= 3, `${coldEchoes} ECHOs for a cold batch`)

  // Built after the writes, so it heard none of their announcements (a value one carries is read
  // without asking Redis at all).
  const b = new StampedeCache({ ...base, l1: false })
  t.after(() => b.close())
  await laneOpen(redis, b)
  const s0 = b.stats()
  const { calls: none, loadMany: mustNotLoad } = recorder()
  const warm = pick(
    await clientCommands(redis, async () => {
      assert.deepEqual(await b.getOrLoadMany(keys, mustNotLoad), values)
    }),
    ['get', 'mget', 'echo', 'evalsha', 'eval', 'hget'],
  )
  assert.equal(none.length, 0)
  // Its ECHO only if a mark is due (the lane's first read is marked; see src/store/redis/lane/marks.rs).
  assert.ok(warm.echo <= 1, `${warm.echo} ECHOs for a warm batch`)
  assert.deepEqual({ ...warm, echo: 0 }, { get: 0, mget: 1, echo: 0, evalsha: 0, eval: 0, hget: 0 }, 'warm: one MGET and at most its ECHO, nothing else')
  const s = b.stats()
  assert.deepEqual([s.l2Hits - s0.l2Hits, s.misses - s0.misses, s.loads], [1_000, 0, 0], 'l2Hits per key')
  assert.deepEqual(await b.getMany(['r1', 'nope', 'r999']), [{ k: 'r1' }, undefined, { k: 'r999' }])
  await assertNoLeaks(a)
  await assertNoLeaks(b)
})

test('Redis: overlapping batches in one process, and a getOrLoad joined across', { timeout: TEST_TIMEOUT }, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  const cache = new StampedeCache({ ...base, lockTtl: 10_000 })
  t.after(() => cache.close())
  const { loadedTimes, durations, waits } = await overlapping(cache, { prefix: 'rov' })
  assert.ok(
    [...loadedTimes.values()].every((n) => n === 1),
    'no id was loaded twice',
  )
  const slowest = Math.max(...durations)
  for (const w of waits) assert.ok(w < slowest + 2_000, `a batch waited ${w} ms (slowest loadMany ${slowest} ms, lockTtl 10 s)`)
  await assertNoLeaks(cache)
})

test('Redis: 4 processes at once on the same 1,000 ids: each id loaded once across them, at most one loadMany call per process', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { ws, stored } = await setupRedis(t, { workers: 4, prefix: 'batch', options: { lockTtl: 10_000 } })
  const body = `
    // Each process asks in its own order, so their lock bids interleave in Redis.
    const keys = Array.from({ length: 1000 }, (_, i) => 'mp' + ((i + args.shift) % 1000))
    const calls = []
    const t0 = Date.now()
    const values = await cache.getOrLoadMany(keys, async (ks) => {
      calls.push([...ks])
      await tools.sleep(150)
      return ks.map((k) => ({ k, by: process.pid }))
    })
    return { calls, keys, values, waited: Date.now() - t0, stats: cache.stats() }
  `
  // Connected, and the bus subscribed, before the race.
  await Promise.all(ws.map((w) => w.request('run', { body: "await cache.get('warmup')" })))
  const results = await barrier(ws, 'run', (w, i) => ({ body, args: { shift: i * 250 } }))
  const loaded = results.flatMap((r) => r.calls.flat())
  t.diagnostic(`ids loaded per process: ${results.map((r) => r.calls.flat().length).join(', ')}`)
  assert.equal(loaded.length, 1_000, `ids passed to loadMany across the processes: ${loaded.length}`)
  assert.equal(new Set(loaded).size, 1_000)
  for (const r of results) assert.ok(r.calls.length <= 1, `a process called loadMany ${r.calls.length} times`)
  // Every process sees the one value each id was loaded with.
  const byKey = new Map()
  for (const r of results) {
    r.values.forEach((v, i) => {
      assert.equal(v.k, r.keys[i])
      const seen = byKey.get(v.k)
      if (seen === undefined) byKey.set(v.k, v.by)
      else assert.equal(v.by, seen, `${v.k}: two processes saw different loads`)
    })
  }
  assert.deepEqual((await stored('mp7')).value, { k: 'mp7', by: byKey.get('mp7') })
  for (const r of results) assert.ok(r.waited < 10_000, `a process waited ${r.waited} ms: as long as a lock`)
})

test('Redis: stale keys refreshed in one background loadMany call; only one process refreshes', { timeout: TEST_TIMEOUT }, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache({ ...base, ttl: 50, hardTtl: 60_000, beta: 0 })
  t.after(() => a.close())
  const keys = ids(20, 'rs')
  let round = 0
  const calls = []
  const loadMany = (ks) => {
    calls.push([...ks])
    round++
    return ks.map((k) => `${k}@${round}`)
  }
  await a.getOrLoadMany(keys, loadMany)
  await sleep(80)
  assert.deepEqual(
    await a.getOrLoadMany(keys, loadMany),
    keys.map((k) => `${k}@1`),
  )
  await a.settle()
  assert.deepEqual(calls, [keys, keys])
  // A fresh instance finds the refreshed values in Redis.
  const b = new StampedeCache({ ...base, ttl: 50, hardTtl: 60_000, beta: 0 })
  t.after(() => b.close())
  assert.deepEqual(
    await b.getMany(keys),
    keys.map((k) => `${k}@2`),
  )
  await assertNoLeaks(a)
})

test('Redis: a warm batch with options costs one MGET and its ECHO, as without; forceRefresh loads every key', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache(base)
  t.after(() => a.close())
  const keys = ids(100, 'wo')
  const values = await a.getOrLoadMany(keys, recorder().loadMany)
  // Built after the writes (it heard none of their announcements): every key is read from Redis.
  const b = new StampedeCache({ ...base, l1: false })
  t.after(() => b.close())
  await laneOpen(redis, b)
  const names = ['get', 'mget', 'echo', 'evalsha', 'eval', 'hget']
  const { calls: none, loadMany: mustNotLoad } = recorder()
  const handed = []
  for (const options of [
    { ttl: 5_000 },
    { tags: ['wo'] },
    {
      ttl: 5_000,
      hardTtl: 50_000,
      negativeTtl: 1_000,
      jitter: 0.2,
      beta: 2,
      loadTimeout: 5_000,
      tags: ['wo'],
      signal: new AbortController().signal,
      waitUntil: (p) => handed.push(p),
    },
  ]) {
    const s0 = b.stats()
    const senders = []
    const warm = pick(
      await clientCommands(
        redis,
        async () => {
          assert.deepEqual(await b.getOrLoadMany(keys, mustNotLoad, options), values)
        },
        (addr, name) => senders.push([addr, name]),
      ),
      names,
    )
    const what = Object.keys(options).join(', ')
    assert.ok(warm.echo <= 1, `${what}: ${warm.echo} ECHOs`)
    assert.deepEqual({ ...warm, echo: 0 }, { get: 0, mget: 1, echo: 0, evalsha: 0, eval: 0, hget: 0 }, `${what}: one MGET and at most its ECHO, no lock bid`)
    // Read first, as without options: on the read lane, with no flight or gate per key (whose
    // read takes the command connection).
    const lanes = await readLanes(redis)
    for (const [addr, name] of senders) assert.ok(lanes.has(addr), `${what}: ${name} sent by ${addr}, not by a read lane (${[...lanes]})`)
    const s = b.stats()
    assert.deepEqual([s.l2Hits - s0.l2Hits, s.misses - s0.misses], [100, 0], 'l2Hits per key')
  }
  assert.equal(none.length, 0)
  assert.equal(handed.length, 0, 'nothing was stale: no refresh handed to waitUntil')
  // forceRefresh reads nothing first: every key is loaded now, in one call, and written back.
  const { calls, loadMany } = recorder({ value: (k) => ({ k, forced: true }) })
  const forced = pick(
    await clientCommands(redis, async () => {
      assert.deepEqual(
        await b.getOrLoadMany(keys, loadMany, { forceRefresh: true, ttl: 5_000 }),
        keys.map((k) => ({ k, forced: true })),
      )
    }),
    names,
  )
  assert.deepEqual(
    calls.map((c) => c.keys),
    [keys],
  )
  assert.equal(forced.mget, 0, 'forceRefresh reads nothing first')
  assert.ok(forced.evalsha >= 100, `one fenced write-back per key (${forced.evalsha} EVALSHA)`)
  const c = new StampedeCache({ ...base, l1: false })
  t.after(() => c.close())
  assert.deepEqual(
    await c.getMany(keys),
    calls[0].keys.map((k) => ({ k, forced: true })),
  )
  await assertNoLeaks(b)
})

test("Redis: stale keys of a batch with options are served at once and refreshed once in the background, with that call's ttl and tags", {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache({ ...base, ttl: 50, hardTtl: 60_000, beta: 0 })
  t.after(() => a.close())
  const keys = ids(20, 'so')
  await a.getOrLoadMany(keys, (ks) => ks.map((k) => `${k}@1`))
  await sleep(80)
  // Every key stale in Redis; then with a cold key besides (loaded with the call, not with the
  // refresh); then into an in-process tier.
  for (const [round, l1, withCold] of [
    [0, false, false],
    [1, false, true],
    [2, undefined, true],
  ]) {
    const b = new StampedeCache({ ...base, ttl: 50, hardTtl: 60_000, beta: 0, ...(l1 === false ? { l1 } : {}) })
    t.after(() => b.close())
    const calls = []
    const loadMany = (ks) => {
      calls.push([...ks])
      return ks.map((k) => `${k}@2`)
    }
    const handed = []
    const tag = `so-${round}`
    const cold = withCold ? [`cold-${round}`] : []
    const out = await b.getOrLoadMany([...keys, ...cold], loadMany, {
      ttl: 60_000,
      hardTtl: 120_000,
      tags: [tag],
      waitUntil: (p) => handed.push(p),
    })
    assert.deepEqual(out, [...keys.map((k) => `${k}@1`), ...cold.map((k) => `${k}@2`)], 'stale values served at once')
    assert.equal(handed.length, 1, "one background refresh, handed to the call's waitUntil before it resolved")
    await handed[0]
    await b.settle()
    assert.deepEqual(calls, [...(withCold ? [cold] : []), keys], 'the stale keys refreshed in one background call')
    const reader = new StampedeCache({ ...base, l1: false })
    t.after(() => reader.close())
    for (const k of [keys[0], keys[19], ...cold]) {
      const info = await reader.inspect(k)
      assert.equal(info.state, 'fresh')
      assert.ok(info.freshUntil - Date.now() > 30_000, `${k}: written with the call's ttl (60 s), not the constructor's (50 ms)`)
    }
    assert.deepEqual(
      await reader.getMany(keys),
      keys.map((k) => `${k}@2`),
    )
    await b.deleteByTag(tag)
    assert.deepEqual(await reader.getMany([...keys, ...cold]), new Array(keys.length + cold.length).fill(undefined), "the call's tags on every key it wrote")
    await assertNoLeaks(b)
    // Stale again for the next round.
    await a.getOrLoadMany(keys, (ks) => ks.map((k) => `${k}@1`))
    await sleep(80)
  }
})

test('Redis: a caller signal aborting a batch with options rejects it at once, during the read or the load; the load goes on', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache(base)
  t.after(() => a.close())
  const warm = ids(10, 'sw')
  await a.getOrLoadMany(warm, recorder().loadMany)
  const b = new StampedeCache({ ...base, l1: false })
  t.after(() => b.close())
  await b.get('connect')
  // During the read: every key warm in Redis.
  const during = new AbortController()
  const read = b.getOrLoadMany(warm, recorder().loadMany, { signal: during.signal, ttl: 5_000 })
  during.abort()
  await assert.rejects(read, { name: 'AbortError' })
  // During the load: half warm, half cold; the load goes on for the cold keys and fills Redis.
  const ac = new AbortController()
  const cold = ids(10, 'sc')
  const calls = []
  let finished
  const done = new Promise((r) => (finished = r))
  const p = b.getOrLoadMany(
    [...warm, ...cold],
    async (ks) => {
      calls.push([...ks])
      ac.abort()
      await sleep(50)
      finished()
      return ks.map((k) => ({ k }))
    },
    { signal: ac.signal, ttl: 60_000 },
  )
  await assert.rejects(p, { name: 'AbortError' })
  await done
  await b.settle()
  assert.deepEqual(calls, [cold], 'only the cold keys were loaded')
  const reader = new StampedeCache({ ...base, l1: false })
  t.after(() => reader.close())
  await waitFor(async () => (await reader.getMany(cold)).every((v, i) => v?.k === cold[i]), { what: 'the cold keys written' })
  await assertNoLeaks(b)
})

test('Redis: tags of a batch with options land on the keys it loads (not on those Redis had), so deleteByTag removes them', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache(base)
  t.after(() => a.close())
  const found = ids(5, 'tf')
  const cold = ids(5, 'tc')
  await a.getOrLoadMany(found, (ks) => ks.map((k) => `${k}:a`))
  const b = new StampedeCache(base)
  t.after(() => b.close())
  const calls = []
  const out = await b.getOrLoadMany(
    [...found, ...cold],
    (ks) => {
      calls.push([...ks])
      return ks.map((k) => `${k}:b`)
    },
    { tags: ['tagged'], ttl: 60_000 },
  )
  assert.deepEqual(out, [...found.map((k) => `${k}:a`), ...cold.map((k) => `${k}:b`)])
  assert.deepEqual(calls, [cold])
  await b.deleteByTag('tagged')
  assert.deepEqual(await b.getMany(cold), new Array(5).fill(undefined), 'the loaded keys carried the tag')
  assert.deepEqual(
    await b.getMany(found),
    found.map((k) => `${k}:a`),
    'the keys Redis had were served as they were',
  )
  const c = new StampedeCache({ ...base, l1: false })
  t.after(() => c.close())
  assert.deepEqual(await c.getMany([...found, ...cold]), [...found.map((k) => `${k}:a`), ...new Array(5).fill(undefined)])
  await assertNoLeaks(b)
})

test('Redis: a per-call beta decides each key read from Redis as getOrLoad with that beta decides it', { timeout: TEST_TIMEOUT }, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  // hardTtl == ttl: no stale window (see the in-process test of beta).
  const a = new StampedeCache({ ...base, ttl: 3_000, hardTtl: 3_000, beta: 0 })
  t.after(() => a.close())
  const keys = ['xb1', 'xb2', 'xalone']
  await a.getOrLoadMany(keys, async (ks) => {
    await sleep(40)
    return ks.map((k) => `${k}@1`)
  })
  for (const [constructorBeta, callBeta, refreshes] of [
    [1e6, 0, false],
    [0, 1e6, true],
  ]) {
    const b = new StampedeCache({ ...base, ttl: 3_000, hardTtl: 3_000, beta: constructorBeta, l1: false })
    t.after(() => b.close())
    const calls = []
    const loadMany = (ks) => {
      calls.push([...ks])
      return ks.map((k) => `${k}@2`)
    }
    let single = 0
    const loader = (ctx) => {
      single++
      return `${ctx.key}@2`
    }
    assert.deepEqual(await b.getOrLoadMany(['xb1', 'xb2'], loadMany, { beta: callBeta }), ['xb1@1', 'xb2@1'], 'served at once')
    assert.equal(await b.getOrLoad('xalone', loader, { beta: callBeta }), 'xalone@1')
    await b.settle()
    if (refreshes) {
      assert.equal(single, 1, 'getOrLoad refreshed early')
      assert.deepEqual(calls, [['xb1', 'xb2']], 'the batch too, in one background call')
    } else {
      assert.equal(single, 0, 'getOrLoad at beta 0 never refreshes early')
      assert.deepEqual(calls, [], 'nor does the batch')
    }
    assert.equal(b.stats().staleHits, 0)
    await assertNoLeaks(b)
  }
})

test('Redis Cluster: a batch over every master (one pipeline per node) loads once, and reads back from every node', { timeout: 120_000 }, async (t) => {
  const { RedisCluster, killTopologySync } = require('./helpers/redis-topology')
  t.after(() => killTopologySync())
  const cluster = new RedisCluster({ masters: 3, replicasPerMaster: 0 })
  t.after(() => cluster.dispose())
  await cluster.start()
  const options = { redis: { cluster: cluster.seedUrls }, namespace: `batchcl${process.pid}`, jitter: 0 }
  const a = new StampedeCache(options)
  t.after(() => a.close())
  const keys = ids(300, 'cl')
  const { calls, loadMany } = recorder()
  const values = await a.getOrLoadMany(keys, loadMany)
  assert.equal(calls.length, 1)
  assert.deepEqual(
    values,
    keys.map((k) => ({ k })),
  )
  assert.equal(a.stats().redisErrors, 0, 'no pipeline crossed a slot')
  const b = new StampedeCache({ ...options, l1: false })
  t.after(() => b.close())
  const { calls: none, loadMany: mustNotLoad } = recorder()
  assert.deepEqual(await b.getOrLoadMany(keys, mustNotLoad), values)
  assert.equal(none.length, 0, 'every key found in the cluster')
  assert.deepEqual(await b.getMany(['cl0', 'nope', 'cl299']), [{ k: 'cl0' }, undefined, { k: 'cl299' }])
  assert.equal(b.stats().redisErrors, 0)
})

test('Redis: a tier that keeps nothing (l1: false, or maxEntries: 0) serves a batch from Redis, duplicates at every position, and refreshes its stale keys once', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { base } = await setupRedis(t, { prefix: 'batch' })
  const a = new StampedeCache({ ...base, ttl: 60_000 })
  t.after(() => a.close())
  const short = new StampedeCache({ ...base, ttl: 40, hardTtl: 60_000, beta: 0 })
  t.after(() => short.close())
  const fresh = ids(30, 'kf')
  await a.getOrLoadMany(fresh, (ks) => ks.map((k) => `${k}@1`))
  for (const [n, l1] of [false, { maxEntries: 0 }].entries()) {
    const stale = ids(4, `ks${n}-`)
    await short.getOrLoadMany(stale, (ks) => ks.map((k) => `${k}@1`))
    await sleep(80)
    // Built after the writes: nothing carried, every key read from Redis.
    const b = new StampedeCache({ ...base, ttl: 60_000, hardTtl: 120_000, beta: 0, l1 })
    t.after(() => b.close())
    const missing = `kmissing${n}`
    const keys = [...fresh, fresh[3], ...stale, missing, fresh[0]]
    const { calls, loadMany } = recorder({ value: (k) => `${k}@2` })
    const got = await b.getOrLoadMany(keys, loadMany)
    assert.deepEqual(got, [...fresh.map((k) => `${k}@1`), `${fresh[3]}@1`, ...stale.map((k) => `${k}@1`), `${missing}@2`, `${fresh[0]}@1`])
    // The cold key, then the stale keys' refresh: one loadMany call each.
    await waitFor(() => calls.length === 2, { what: 'the refresh of the stale keys' })
    assert.deepEqual(
      calls.map((c) => c.keys),
      [[missing], stale],
    )
    const s = b.stats()
    assert.equal(s.l2Hits, fresh.length + stale.length, 'l2Hits per key, each once')
    assert.equal(s.l1Entries, 0, 'nothing kept in process')
    await waitFor(async () => (await b.getMany(stale)).every((v, i) => v === `${stale[i]}@2`), { what: 'the refreshed values in Redis' })
    assert.deepEqual(await b.getMany([fresh[1], 'nope', fresh[1]]), [`${fresh[1]}@1`, undefined, `${fresh[1]}@1`])
    await assertNoLeaks(b)
  }
})
