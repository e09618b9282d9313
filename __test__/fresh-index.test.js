'use strict'
// Fresh hits answered without a native call (lib/fresh.js, src/fresh.rs): every way an indexed
// entry can become wrong makes the next read see the change (delete, set, clear, deleteByTag,
// eviction by maxEntries and by maxBytes, ttl passing, a bus invalidation from another process,
// close), XFetch still refreshes early where no stale window covers a refresh, the LRU still sees
// the hits the index served, and stats() counts them exactly.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const diagnostics = require('node:diagnostics_channel')
const { StampedeCache } = require('..')
const { eventually } = require('./helpers/eventually')
const { setupRedis, killAllSync } = require('./helpers/redis-server')

after(() => killAllSync())

const HOUR = 3_600_000
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** A cache and a loader that counts its calls and returns a new object each time. */
function counted(options = { ttl: HOUR }) {
  const cache = new StampedeCache(options)
  const calls = new Map()
  const loader = (ctx) => {
    const n = (calls.get(ctx.key) ?? 0) + 1
    calls.set(ctx.key, n)
    return { key: ctx.key, n }
  }
  return { cache, loader, calls: (k) => calls.get(k) ?? 0 }
}

test('hits are counted exactly, return the same object, and are published as fresh', async (t) => {
  const { cache, loader, calls } = counted()
  t.after(() => cache.close())
  const v = await cache.getOrLoad('k', loader)
  const seen = []
  const onHit = (m) => seen.push(m.state)
  diagnostics.subscribe('stampede-cache:hit', onHit)
  t.after(() => diagnostics.unsubscribe('stampede-cache:hit', onHit))
  const N = 500
  for (let i = 0; i < N; i++) {
    assert.equal(await cache.getOrLoad('k', loader), v)
    assert.equal(await cache.get('k'), v)
  }
  const many = await cache.getOrLoadMany(['k', 'k'], () => assert.fail('warm: no load'))
  const got = await cache.getMany(['k', 'k'])
  assert.ok(many.every((x) => x === v) && got.every((x) => x === v))
  assert.equal(calls('k'), 1)
  const s = cache.stats()
  assert.equal(s.hits, 2 * N + 4)
  assert.equal(s.misses, 1)
  assert.equal(seen.length, 2 * N + 4)
  assert.ok(seen.every((state) => state === 'fresh'))
})

test('delete, set and clear are seen by the next read', async (t) => {
  const { cache, loader, calls } = counted()
  t.after(() => cache.close())
  for (let i = 0; i < 3; i++) await cache.getOrLoad('k', loader)
  await cache.delete('k')
  assert.equal(await cache.get('k'), undefined)
  assert.deepEqual(await cache.getMany(['k']), [undefined])
  assert.equal((await cache.getOrLoad('k', loader)).n, 2)
  assert.equal((await cache.get('k')).n, 2)
  await cache.set('k', 'set')
  assert.equal(await cache.get('k'), 'set')
  assert.equal(await cache.getOrLoad('k', loader), 'set')
  assert.deepEqual(await cache.getOrLoadMany(['k'], () => assert.fail('warm')), ['set'])
  await cache.clear()
  assert.equal(await cache.get('k'), undefined)
  assert.equal((await cache.getOrLoad('k', loader)).n, 3)
  assert.equal(calls('k'), 3)
})

test('deleteByTag drops an indexed tagged entry', async (t) => {
  const { cache, loader } = counted()
  t.after(() => cache.close())
  await cache.getOrLoad('tagged', loader, { tags: ['t'] })
  await cache.getOrLoad('other', loader, { tags: ['u'] })
  for (let i = 0; i < 3; i++) {
    assert.equal((await cache.get('tagged')).n, 1)
    assert.equal((await cache.get('other')).n, 1)
  }
  await cache.deleteByTag('t')
  assert.equal(await cache.get('tagged'), undefined)
  assert.equal((await cache.getOrLoad('tagged', loader)).n, 2)
  assert.equal((await cache.get('other')).n, 1, 'another tag stays')
})

test('an entry evicted by maxEntries is not served from its reused slot', async (t) => {
  const { cache, loader } = counted({ ttl: HOUR, l1: { maxEntries: 1 } })
  t.after(() => cache.close())
  const a = await cache.getOrLoad('a', loader)
  assert.equal(await cache.get('a'), a)
  assert.equal(await cache.get('a'), a)
  // b takes a's slot.
  const b = await cache.getOrLoad('b', loader)
  assert.equal(await cache.get('a'), undefined)
  assert.deepEqual(await cache.getMany(['a', 'b']), [undefined, b])
  assert.equal((await cache.getOrLoad('a', loader)).n, 2)
})

test('an entry evicted by maxBytes is not served', async (t) => {
  const { cache } = counted({ ttl: HOUR, l1: { maxBytes: 300 } })
  t.after(() => cache.close())
  const big = (ctx) => ({ key: ctx.key, pad: 'x'.repeat(200) })
  const a = await cache.getOrLoad('a', big)
  for (let i = 0; i < 3; i++) assert.equal(await cache.get('a'), a)
  await cache.getOrLoad('b', big)
  assert.equal(await cache.get('a'), undefined, 'a went to make room for b')
  // c takes the slot a freed, and b goes for it.
  const c = await cache.getOrLoad('c', big)
  assert.equal(await cache.get('a'), undefined)
  assert.equal(await cache.get('b'), undefined)
  assert.equal(await cache.get('c'), c)
  assert.equal(cache.stats().l1Entries, 1)
})

test('the LRU keeps a key read only through the index under pressure', async (t) => {
  const { cache, loader, calls } = counted({ ttl: HOUR, l1: { maxEntries: 3 } })
  t.after(() => cache.close())
  await cache.getOrLoad('hot', loader)
  for (let i = 0; i < 200; i++) {
    // The hot key is read between each two new keys; nothing else reads it.
    for (let r = 0; r < 3; r++) await cache.getOrLoad('hot', loader)
    await cache.getOrLoad(`cold:${i}`, loader)
  }
  assert.equal(calls('hot'), 1, 'the hot key was never evicted')
  assert.equal(cache.stats().l1Entries, 3)
})

test('an entry whose ttl passed is not served', async (t) => {
  const { cache, loader, calls } = counted({ ttl: 150, hardTtl: 150, jitter: 0 })
  t.after(() => cache.close())
  await cache.getOrLoad('k', loader)
  assert.equal((await cache.get('k')).n, 1)
  const { freshUntil } = await cache.inspect('k')
  await eventually(async () => (await cache.get('k')) === undefined, { what: 'the entry to expire' })
  assert.ok(Date.now() >= freshUntil)
  assert.equal((await cache.getOrLoad('k', loader)).n, 2)
  assert.equal(calls('k'), 2)
})

/** The states the hit channel publishes, in order, while the test runs. */
function hitStates(t) {
  const states = []
  const onHit = (m) => states.push(m.state)
  diagnostics.subscribe('stampede-cache:hit', onHit)
  t.after(() => diagnostics.unsubscribe('stampede-cache:hit', onHit))
  return states
}

test('an entry is fresh exactly while Date.now() < freshUntil, read by read across its expiry', async (t) => {
  // One synchronous run of reads from the load to past expiry: a hit publishes its state before
  // get returns, so each read is bracketed by two clock reads. A clock that lags the wall clock
  // (cached, or read less often than once a read) would serve a read fresh after freshUntil.
  const { cache, loader } = counted({ ttl: 300, hardTtl: HOUR, jitter: 0, beta: 0 })
  t.after(() => cache.close())
  await cache.getOrLoad('k', loader)
  const { freshUntil } = await cache.inspect('k')
  const states = hitStates(t)
  let afterExpiry = 0
  let freshAfterExpiry = 0
  let staleAfterExpiry = 0
  let staleBeforeExpiry = 0
  let reads = 0
  // Until 1,000 reads began at or after freshUntil: counted, not timed, so a preemption across
  // expiry (a loaded machine) cannot leave the loop without reads past it.
  while (afterExpiry < 1_000) {
    const before = Date.now()
    const n = states.length
    cache.get('k')
    const after = Date.now()
    const state = states[n]
    if (before >= freshUntil) {
      afterExpiry++
      if (state === 'fresh') freshAfterExpiry++
      else if (state === 'stale') staleAfterExpiry++
    }
    if (state !== 'fresh' && after < freshUntil) staleBeforeExpiry++
    reads++
  }
  assert.equal(states.length, reads, 'every read was a hit published as it was served')
  assert.equal(freshAfterExpiry, 0, 'reads served fresh at or after freshUntil')
  assert.equal(staleAfterExpiry, 1_000)
  assert.equal(staleBeforeExpiry, 0, 'reads not served fresh before freshUntil')
})

test('an entry that expires during a long synchronous block is not served fresh after it', async (t) => {
  const { cache, loader, calls } = counted({ ttl: 1_000, hardTtl: HOUR, jitter: 0, beta: 0 })
  t.after(() => cache.close())
  const v = await cache.getOrLoad('k', loader)
  for (let i = 0; i < 100; i++) {
    await cache.get('k')
    await cache.getOrLoad('k', loader)
  }
  const { freshUntil } = await cache.inspect('k')
  const states = hitStates(t)
  // About 2 s of synchronous work, past expiry: no timer and no microtask runs meanwhile, so a
  // clock cached until a timer clears it would still read the time before the block.
  while (Date.now() < freshUntil + 1_000);
  const got = cache.get('k')
  const loaded = cache.getOrLoad('k', loader)
  assert.deepEqual(states, ['stale', 'stale'])
  assert.equal(await got, v, 'the stale value is served')
  assert.equal(await loaded, v)
  await eventually(() => calls('k') === 2, { what: 'the stale read to refresh the entry' })
  await eventually(async () => (await cache.getOrLoad('k', loader)).n === 2, { what: 'the refreshed value' })
})

test('XFetch still refreshes early when no stale window covers a refresh', async (t) => {
  // hardTtl == ttl: no stale window; a 50 ms load at beta 4 reaches 7.4 s ahead of expiry, so a
  // read may draw an early refresh at any time, and near expiry almost surely does.
  const cache = new StampedeCache({ ttl: 2_000, hardTtl: 2_000, beta: 4, jitter: 0 })
  t.after(() => cache.close())
  const loader = async () => {
    await sleep(50)
    return { at: Date.now() }
  }
  await cache.getOrLoad('k', loader)
  const { freshUntil } = await cache.inspect('k')
  while (Date.now() < freshUntil - 20) {
    // get draws nothing (it never loads), but what it offers the index must still leave the
    // getOrLoad after it to the engine's draw.
    await cache.get('k')
    await cache.getOrLoad('k', loader)
    await sleep(5)
  }
  const s = cache.stats()
  assert.ok(s.refreshes >= 1, `an early refresh before expiry (refreshes ${s.refreshes}, hits ${s.hits})`)
})

test('negative entries are hits of their own kind', async (t) => {
  const cache = new StampedeCache({ ttl: HOUR })
  t.after(() => cache.close())
  let calls = 0
  const missing = () => {
    calls++
    return null
  }
  for (let i = 0; i < 10; i++) assert.equal(await cache.getOrLoad('none', missing), null)
  assert.equal(calls, 1)
  const s = cache.stats()
  assert.equal(s.negativeHits, 9)
  assert.equal(s.hits, 0)
})

test('l1: false indexes nothing and still answers', async (t) => {
  const { cache, loader, calls } = counted({ ttl: HOUR, l1: false })
  t.after(() => cache.close())
  await cache.getOrLoad('k', loader)
  await cache.getOrLoad('k', loader)
  assert.equal(calls('k'), 2, 'nothing kept in process, no Redis: every read loads')
  assert.equal(await cache.get('k'), undefined)
})

test('close() after indexed hits: get and getOrLoad reject ERR_CLOSED', async () => {
  const { cache, loader } = counted()
  await cache.getOrLoad('k', loader)
  await cache.get('k')
  await cache.close()
  await assert.rejects(cache.get('k'), { code: 'ERR_CLOSED' })
  await assert.rejects(cache.getOrLoad('k', loader), { code: 'ERR_CLOSED' })
  await assert.rejects(cache.getMany(['k']), { code: 'ERR_CLOSED' })
  await assert.rejects(
    cache.getOrLoadMany(['k'], () => ['x']),
    { code: 'ERR_CLOSED' },
  )
})

test('a bus invalidation from another process is seen as soon as it arrives', { timeout: 60_000 }, async (t) => {
  const { base, spawnWorker } = await setupRedis(t, { prefix: 'scfresh' })
  const W = await spawnWorker('W')
  const cache = new StampedeCache({ ...base, ttl: HOUR })
  t.after(() => cache.close())
  let loads = 0
  const loader = () => ({ v: `loaded ${++loads}` })
  const first = await cache.getOrLoad('k', loader)
  // Indexed: hits answered without the engine.
  for (let i = 0; i < 5; i++) assert.equal(await cache.getOrLoad('k', loader), first)
  const r = await W.request('set', { key: 'k', value: 'from W' })
  assert.ok(r.ok, r.message)
  // The announcement reaches the inbox on the bus thread; no read of this process applies it.
  await eventually(() => cache._debugCounts().inboxKeys > 0, { what: 'the invalidation to arrive' })
  // The very next read, from the index's point of view, must not serve the replaced value.
  assert.equal(await cache.get('k'), 'from W')
  assert.equal(await cache.getOrLoad('k', loader), 'from W')
  assert.equal(loads, 1)
})
