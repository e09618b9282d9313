'use strict'
// Request-scoped waitUntil: per-call option, then request scope, then constructor option, and a
// refresh started inside a request is handed to that request's hook before the read resolves.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache, withWaitUntil } = require('..')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function staleCache(hooks = {}) {
  const cache = new StampedeCache({ ttl: 30, hardTtl: 60_000, jitter: 0, ...hooks })
  for (const key of ['a', 'b', 'c']) await cache.set(key, `old-${key}`)
  await sleep(80)
  return cache
}

test('concurrent requests with different scopes each receive only their own refresh', async () => {
  const cache = await staleCache()
  const handed = { r1: [], r2: [], r3: [] }
  const request = (name, key) =>
    cache.withWaitUntil(
      (p) => handed[name].push(p),
      async () => {
        await sleep(Math.random() * 5) // interleave the requests
        const value = await cache.getOrLoad(key, async () => `new-${key}`)
        // Handed over before this request's read resolved.
        assert.equal(handed[name].length, 1, `${name} got its refresh before the read resolved`)
        return value
      },
    )
  const values = await Promise.all([request('r1', 'a'), request('r2', 'b'), request('r3', 'c')])
  assert.deepEqual(values, ['old-a', 'old-b', 'old-c'])
  for (const name of Object.keys(handed)) assert.equal(handed[name].length, 1)
  await Promise.all(Object.values(handed).flat())
  assert.equal(await cache.get('a'), 'new-a')
  assert.equal(cache.stats().refreshes, 3)
  await cache.close()
})

test('per-call option wins over the request scope, which wins over the constructor', async () => {
  const calls = []
  const cache = await staleCache({ waitUntil: () => calls.push('constructor') })
  await withWaitUntil(
    () => calls.push('scope'),
    async () => {
      await cache.getOrLoad('a', () => 'x', { waitUntil: () => calls.push('call') })
      await cache.getOrLoad('b', () => 'y')
    },
  )
  await cache.getOrLoad('c', () => 'z')
  assert.deepEqual(calls, ['call', 'scope', 'constructor'])
  await cache.settle()
  await cache.close()
})

test('the scope reaches refreshes started after awaits inside the request', async () => {
  const cache = await staleCache()
  const handed = []
  await cache.withWaitUntil(
    (p) => handed.push(p),
    async () => {
      await sleep(5)
      await Promise.resolve()
      await cache.getOrLoad('a', () => 'fresh')
    },
  )
  assert.equal(handed.length, 1)
  await handed[0]
  assert.equal(await cache.get('a'), 'fresh')
  await cache.close()
})

test('withWaitUntil returns what the function returns and rejects bad arguments', async () => {
  const cache = new StampedeCache()
  assert.equal(
    cache.withWaitUntil(
      () => {},
      () => 42,
    ),
    42,
  )
  assert.throws(() => withWaitUntil('nope', () => 1), { code: 'ERR_INVALID_ARGUMENT' })
  assert.throws(() => withWaitUntil(() => {}, null), { code: 'ERR_INVALID_ARGUMENT' })
  await cache.close()
})
