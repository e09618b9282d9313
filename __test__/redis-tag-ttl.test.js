'use strict'
// Bounded tag state (README, Tags): tag state in Redis is bounded. A deleteByTag's record,
// `<ns>:tag:{<tag>}`, expires `tagTtl` (plus a margin of 2 x commandTimeout + 1 s) after the
// tag's newest deletion, and no entry carrying a tag lives longer than `tagTtl`, so a record
// that expired can no longer have anything to kill: no entry it killed comes back.
//
// Each test starts its own redis-server on a free 127.0.0.1 port; the caches run in this
// process, each its own engine with its own connection and bus subscription. Assertions are on
// PTTLs and EXISTS read from Redis and on what a cache that never heard the deletion serves.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache, StampedeCacheError } = require('..')
const { RedisServer, newNamespace, waitFor, killAllSync } = require('./helpers/redis-server')

after(killAllSync)

const TEST_TIMEOUT = 60_000
const TEN_YEARS = 10 * 365 * 24 * 3_600_000
const COMMAND_TIMEOUT = 1_000
/** What a record outlives tagTtl by (tags.rs, tag_key_px). */
const MARGIN = 2 * COMMAND_TIMEOUT + 1_000

async function setup(t) {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const namespace = newNamespace('sctagttl')
  const caches = []
  t.after(() => Promise.all(caches.map((c) => c.close())))
  const open = (options = {}) => {
    const c = new StampedeCache({ redis: { url: redis.url, commandTimeout: COMMAND_TIMEOUT }, namespace, jitter: 0, ...options })
    caches.push(c)
    return c
  }
  const tkey = (tag) => `${namespace}:tag:{${tag}}`
  const vkey = (key) => `${namespace}:v:{${key}}`
  const pttl = async (key) => Number(await redis.cmd('PTTL', key))
  return { redis, open, tkey, vkey, pttl }
}

test('deleteByTag records the tag with an expiry of tagTtl, moved later and never earlier', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, open, tkey, pttl } = await setup(t)
  const day = 24 * 3_600_000
  const long = open({ tagTtl: 30 * day })
  const short = open({ tagTtl: day })

  await long.deleteByTag('a')
  let left = await pttl(tkey('a'))
  assert.ok(left > 30 * day - 60_000 && left <= 30 * day + MARGIN, `PTTL ${left} ≈ 30 days`)

  // A deletion by an instance with a shorter tagTtl keeps the longer expiry (entries of the
  // other instance may still need the record).
  await short.deleteByTag('a')
  left = await pttl(tkey('a'))
  assert.ok(left > 30 * day - 60_000, `PTTL ${left} was not shortened`)

  // And a longer one extends a shorter one, whether or not its clock moves the record.
  await short.deleteByTag('b')
  assert.ok((await pttl(tkey('b'))) <= day + MARGIN)
  await long.deleteByTag('b')
  left = await pttl(tkey('b'))
  assert.ok(left > 30 * day - 60_000, `PTTL ${left} extended to 30 days`)

  // A record written without an expiry (before records expired) gets one at its next deletion.
  await redis.cmd('SET', tkey('old'), '1')
  assert.equal(await pttl(tkey('old')), -1)
  await short.deleteByTag('old')
  left = await pttl(tkey('old'))
  assert.ok(left > day - 60_000 && left <= day + MARGIN, `PTTL ${left} ≈ a day`)

  // By default, the longest hardTtl: ten years.
  const plain = open()
  await plain.deleteByTag('c')
  left = await pttl(tkey('c'))
  assert.ok(left > TEN_YEARS - 60_000 && left <= TEN_YEARS + MARGIN, `PTTL ${left} ≈ ten years`)
})

test('a tagged entry never lives in Redis longer than tagTtl; an untagged one keeps its hardTtl', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, open, vkey, pttl } = await setup(t)
  const tagTtl = 120_000
  const cache = open({ tagTtl, ttl: 60_000, hardTtl: 3_600_000 })

  await cache.set('set', 'v', { tags: ['t'], ttl: 600_000, hardTtl: 6_000_000 })
  await cache.getOrLoad('load', () => 'v', { tags: ['t'] })
  await cache.getOrLoad('ctx', (ctx) => {
    ctx.setTags(['t'])
    ctx.setTtl(500_000, 5_000_000)
    return 'v'
  })
  await cache.set('untagged', 'v', { hardTtl: 6_000_000, ttl: 600_000 })
  await cache.settle()
  for (const key of ['set', 'load', 'ctx']) {
    const left = await pttl(vkey(key))
    assert.ok(left > 0 && left <= tagTtl, `${key}: PTTL ${left} <= tagTtl ${tagTtl}`)
  }
  const untagged = await pttl(vkey('untagged'))
  assert.ok(untagged > 5_000_000, `untagged: PTTL ${untagged} is its hardTtl`)
  // Its freshness is clamped too: never fresh past its end.
  const envelope = JSON.parse(await redis.cmd('GET', vkey('set')))
  assert.ok(envelope.freshUntil <= envelope.hardUntil, JSON.stringify(envelope))
})

test('once a tag record expired, no entry it killed comes back', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, open, tkey, vkey } = await setup(t)
  const tagTtl = 300
  const writer = open({ tagTtl, ttl: 60_000, hardTtl: 600_000 })
  await writer.set('old', 'before', { tags: ['t'], hardTtl: 600_000 })
  await writer.set('other', 'untagged', { hardTtl: 600_000 })
  await writer.deleteByTag('t')
  assert.equal(Number(await redis.cmd('EXISTS', tkey('t'))), 1, 'the deletion is recorded')

  // Past tagTtl and the margin, the record is gone; so is every entry born before it.
  await waitFor(async () => Number(await redis.cmd('EXISTS', tkey('t'))) === 0, { timeout: 20_000, what: 'the tag record to expire' })
  assert.equal(Number(await redis.cmd('EXISTS', vkey('old'))), 0, 'the entry the deletion killed has expired first')

  // A cache that never heard the deletion (it subscribes only now, with nothing in process)
  // finds nothing to serve: the entry does not come back.
  const late = open({ tagTtl, l1: false })
  assert.equal(await late.get('old'), undefined)
  assert.equal(await late.get('other'), 'untagged', 'the untagged entry lives on')
  let calls = 0
  assert.equal(await late.getOrLoad('old', () => `after ${++calls}`, { tags: ['t'] }), 'after 1')

  // And the tag still works after its record expired: a new deletion is a new record.
  await writer.deleteByTag('t')
  assert.equal(Number(await redis.cmd('EXISTS', tkey('t'))), 1)
  assert.equal(await late.getOrLoad('old', () => `after ${++calls}`, { tags: ['t'] }), 'after 2')
})

test('tagTtl is checked: a positive number of ms, at most ten years', { timeout: TEST_TIMEOUT }, () => {
  for (const bad of [-1, 0, 0.5, Number.NaN, Infinity, TEN_YEARS + 1, '1000', null]) {
    assert.throws(
      () => new StampedeCache({ tagTtl: bad }),
      (err) => {
        assert.ok(err instanceof StampedeCacheError, String(err))
        assert.equal(err.code, 'ERR_INVALID_OPTION')
        assert.match(err.message, /tagTtl/)
        return true
      },
      `tagTtl ${String(bad)}`,
    )
  }
  assert.throws(() => new StampedeCache({ tagTtl: TEN_YEARS * 2 }), { code: 'ERR_INVALID_OPTION', message: /315360000000/ })
  for (const good of [1, 300, TEN_YEARS, undefined]) new StampedeCache({ tagTtl: good }).close()
})
