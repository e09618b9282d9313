'use strict'
// expire, expireByTag and tag lists of any length in one process (API.md "The rest"): the value is
// kept but stale from now on (inspect says so, the fresh-hit index stops answering it fresh), the
// next read is served it at once and starts one refresh, until hardTtl; a not-found is loaded
// again; a load that began before is not the refresh after it; bad input is refused with its code.
// Cross-process behaviour is in redis-expire.test.js.

const { test } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')

const tick = () => new Promise((r) => setTimeout(r, 5))

function counted(value) {
  const loader = async () => {
    loader.calls++
    return typeof value === 'function' ? value(loader.calls) : value
  }
  loader.calls = 0
  return loader
}

test('expire: the value is kept, stale at once (the fresh-hit index too), served while one refresh runs', async (t) => {
  const cache = new StampedeCache({ ttl: 60_000 })
  t.after(() => cache.close())
  const loader = counted((n) => `v${n}`)
  assert.equal(await cache.getOrLoad('k', loader), 'v1')
  // Hits answered by the fresh-hit index (lib/fresh.js) from here on.
  for (let i = 0; i < 3; i++) assert.equal(await cache.getOrLoad('k', loader), 'v1')
  assert.equal(await cache.get('k'), 'v1')
  const before = await cache.inspect('k')
  assert.equal(before.state, 'fresh')

  assert.equal(await cache.expire('k'), true)
  const info = await cache.inspect('k')
  assert.equal(info.state, 'stale')
  assert.ok(info.freshUntil <= Date.now())
  assert.equal(info.hardUntil, before.hardUntil, 'hardTtl as before')
  // The next reads: the old value at once, one refresh for all of them.
  const served = await Promise.all(Array.from({ length: 5 }, () => cache.getOrLoad('k', loader)))
  assert.deepEqual(served, ['v1', 'v1', 'v1', 'v1', 'v1'])
  assert.equal(await cache.get('k'), 'v1', 'get serves it stale too')
  await cache.settle()
  assert.equal(loader.calls, 2, 'one refresh')
  assert.equal(await cache.getOrLoad('k', loader), 'v2')
  assert.equal((await cache.inspect('k')).state, 'fresh')
  assert.equal(cache.stats().staleHits >= 5, true)

  assert.equal(await cache.expire('missing'), false, 'nothing there')
  assert.equal(await cache.expire(['a', 1]), false, 'array keys are keys')
})

test('expire: a load that began before it does not count as the refresh after it', async (t) => {
  const cache = new StampedeCache({ ttl: 60_000 })
  t.after(() => cache.close())
  await cache.set('k', 'old')
  let open
  const gate = new Promise((r) => (open = r))
  // A forced load begins (it may carry what the expire is about); the expire comes meanwhile.
  const early = cache.getOrLoad(
    'k',
    async () => {
      await gate
      return 'before-expire'
    },
    { forceRefresh: true },
  )
  await tick()
  assert.equal(await cache.expire('k'), true)
  open()
  assert.equal(await early, 'before-expire', 'its callers still get it')
  // Not written over the expired entry: the old value is served stale and refreshed.
  const loader = counted('after-expire')
  assert.equal(await cache.getOrLoad('k', loader), 'old')
  await cache.settle()
  assert.equal(loader.calls, 1)
  assert.equal(await cache.getOrLoad('k', loader), 'after-expire')
})

test('expire of a not-found: it is loaded again', async (t) => {
  const cache = new StampedeCache({ negativeTtl: 60_000 })
  t.after(() => cache.close())
  const loader = counted((n) => (n === 1 ? null : 'found'))
  assert.equal(await cache.getOrLoad('n', loader), null)
  assert.equal(await cache.getOrLoad('n', loader), null)
  assert.equal(loader.calls, 1)
  assert.equal(await cache.expire('n'), true)
  assert.equal(await cache.getOrLoad('n', loader), 'found')
  assert.equal(loader.calls, 2)
})

test('expireByTag: every entry carrying one of the tags turns stale (index included) and is refreshed once; others stay fresh', async (t) => {
  const cache = new StampedeCache({ ttl: 60_000 })
  t.after(() => cache.close())
  const loaders = { a: counted((n) => `a${n}`), b: counted((n) => `b${n}`), c: counted((n) => `c${n}`), u: counted((n) => `u${n}`) }
  const tagsOf = { a: ['t1'], b: ['t2', 't1'], c: ['t2'], u: undefined }
  const read = (k) => cache.getOrLoad(k, loaders[k], tagsOf[k] ? { tags: tagsOf[k] } : undefined)
  for (const k of Object.keys(loaders)) for (let i = 0; i < 3; i++) assert.equal(await read(k), `${k}1`)
  await cache.expireByTag('t1')
  for (const k of ['a', 'b']) assert.equal((await cache.inspect(k)).state, 'stale', k)
  for (const k of ['c', 'u']) assert.equal((await cache.inspect(k)).state, 'fresh', k)
  for (const k of Object.keys(loaders)) assert.equal(await read(k), `${k}1`, 'the old value at once')
  await cache.settle()
  assert.deepEqual(Object.fromEntries(Object.entries(loaders).map(([k, l]) => [k, l.calls])), { a: 2, b: 2, c: 1, u: 1 })
  for (const k of ['a', 'b']) assert.equal(await read(k), `${k}2`)
  for (const k of ['a', 'b']) assert.equal((await cache.inspect(k)).state, 'fresh', `${k}: its refresh is fresh`)
  // A string is one tag; an empty list does nothing.
  await cache.expireByTag([])
  await cache.expireByTag('t2')
  assert.equal((await cache.inspect('c')).state, 'stale')
})

test('expireByTag: the fresh-hit index stops answering a tagged entry fresh at once', async (t) => {
  const cache = new StampedeCache({ ttl: 60_000 })
  t.after(() => cache.close())
  await cache.set('k', 'old', { tags: ['t'] })
  const loader = counted('new')
  // Plain reads of the key: answered by the index once the engine proved it fresh.
  for (let i = 0; i < 3; i++) assert.equal(await cache.getOrLoad('k', loader), 'old')
  assert.equal(await cache.get('k'), 'old')
  await cache.expireByTag('t')
  assert.equal(await cache.getOrLoad('k', loader), 'old', 'served stale')
  await cache.settle()
  assert.equal(loader.calls, 1, 'and refreshed')
  assert.equal(await cache.getOrLoad('k', loader), 'new')
})

test('expire and expireByTag refuse bad input with a code, and reject once closed', async () => {
  const cache = new StampedeCache()
  await assert.rejects(cache.expire(''), { code: 'ERR_INVALID_KEY' })
  await assert.rejects(cache.expire({}), { code: 'ERR_INVALID_KEY' })
  await assert.rejects(cache.expireByTag(42), { code: 'ERR_INVALID_ARGUMENT' })
  await assert.rejects(cache.expireByTag(['ok', '']), { code: 'ERR_INVALID_ARGUMENT' })
  for (const options of [null, 1, { hardTtl: -1 }, { hardTtl: '1s' }, { hardTtl: Number.NaN }]) {
    await assert.rejects(cache.expireByTag('t', options), { code: 'ERR_INVALID_ARGUMENT' }, JSON.stringify(options))
  }
  await cache.close()
  await assert.rejects(cache.expire('k'), { code: 'ERR_CLOSED' })
  await assert.rejects(cache.expireByTag('t'), { code: 'ERR_CLOSED' })
})

for (const count of [65, 200]) {
  test(`${count} tags in process: set, getOrLoad, ctx.setTags, deleteByTag and expireByTag take them all`, async (t) => {
    const cache = new StampedeCache()
    t.after(() => cache.close())
    const tags = Array.from({ length: count }, (_, i) => `t${i}`)
    const last = tags[count - 1]
    await cache.set('set', 1, { tags })
    assert.equal(await cache.getOrLoad('opt', () => 2, { tags }), 2)
    assert.equal(
      await cache.getOrLoad('ctx', (ctx) => {
        ctx.setTags(tags)
        return 3
      }),
      3,
    )
    for (const tag of tags) await cache.set(`only:${tag}`, tag, { tags: [tag] })
    await cache.expireByTag(tags)
    for (const k of ['set', 'opt', 'ctx', `only:${last}`, 'only:t0']) assert.equal((await cache.inspect(k)).state, 'stale', k)
    await cache.deleteByTag(tags)
    for (const k of ['set', 'opt', 'ctx', `only:${last}`, 'only:t0']) assert.equal(await cache.get(k), undefined, k)
    // An entry carrying only the last tag of a long list is dropped by it.
    await cache.set('x', 'x', { tags: [last] })
    await cache.deleteByTag([...tags.slice(0, -1), last])
    assert.equal(await cache.get('x'), undefined)
  })
}
