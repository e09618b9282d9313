'use strict'
// A bus that carries values. A load's write-back announces its key with the
// envelope it wrote when that is small and untagged; another instance, which drops its copy on
// hearing it, takes the new value from the message on its next read instead of asking Redis.
// Whatever it heard or did to the key since (its own set/delete/clear, another announcement)
// sends the read to Redis again, so the carried value never outlives a newer one.
//
// Two worker processes on a private redis-server. Round trips are counted by Redis itself
// (INFO commandstats), never timed.

const { test } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, waitFor } = require('./helpers/redis-server')

const TEST_TIMEOUT = 60_000
const MUST_NOT_LOAD = 'MUST-NOT-LOAD'

/** Commands Redis ran for keys and scripts (the bus's PINGs and the test's INFOs aside). */
async function dataCommands(redis) {
  const stats = await redis.info('commandstats')
  let calls = 0
  for (const [name, line] of Object.entries(stats)) {
    if (!name.startsWith('cmdstat_') || /^cmdstat_(info|ping|subscribe|hello|client|select|publish)$/.test(name)) continue
    calls += Number(line.match(/calls=(\d+)/)?.[1] ?? 0)
  }
  return calls
}

/** One getOrLoad in `w`; `loader` as redis-worker.js's loader specs. */
async function read(w, key, loader, opts) {
  const r = await w.request('read', { key, loader, opts })
  const x = r.results[0]
  assert.ok(x.ok, `${w.name}: getOrLoad(${key}) rejected: ${x.code} ${x.message}`)
  return { value: x.undef ? undefined : x.value, loaderCalls: r.loaderCallsDuring }
}

/** Keys `w` has heard announced and not applied yet. */
const inboxKeys = (w) => w.request('run', { body: 'return cache._debugCounts().inboxKeys' })

/** Waits until `w` has heard an announcement of some key it has not applied yet. */
async function heard(w, what) {
  await waitFor(async () => (await inboxKeys(w)) > 0, { what })
}

async function setup(t) {
  const env = await setupRedis(t, { options: { ttl: 60_000, hardTtl: 120_000 }, prefix: 'carried' })
  const A = await env.spawnWorker('A')
  const B = await env.spawnWorker('B')
  return { ...env, A, B }
}

test('a refresh in one instance reaches the other on the bus: its next read needs no Redis round trip', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, A, B } = await setup(t)
  const key = 'carried:one'
  assert.equal((await read(A, key, { value: 'v1' })).value, 'v1')
  // A's first load replaced no value and nobody waited on it: it is not announced (no process
  // can hold a copy of a value that did not exist), so B reads it from Redis, and the wait
  // below sees only the refresh's announcement.
  assert.equal(await inboxKeys(B), 0, "A's first load was not announced")
  assert.deepEqual(await read(B, key, { value: MUST_NOT_LOAD }), { value: 'v1', loaderCalls: 0 }, 'B holds v1')

  assert.equal((await read(A, key, { value: 'v2' }, { forceRefresh: true })).value, 'v2')
  await heard(B, "B to hear A's refresh")
  const before = await dataCommands(redis)
  assert.deepEqual(await read(B, key, { value: MUST_NOT_LOAD }), { value: 'v2', loaderCalls: 0 }, 'B reads the refreshed value')
  assert.equal(await dataCommands(redis), before, 'B asked Redis nothing: the value came with the announcement')
  assert.deepEqual(await read(B, key, { value: MUST_NOT_LOAD }), { value: 'v2', loaderCalls: 0 }, 'and keeps it in process')
  assert.equal((await B.request('snapshot')).stats.l2Hits >= 2, true, 'an answer from the bus counts as an l2Hit, as one from Redis')

  // get() takes it the same way.
  assert.equal((await read(A, key, { value: 'v3' }, { forceRefresh: true })).value, 'v3')
  await heard(B, "B to hear A's second refresh")
  const beforeGet = await dataCommands(redis)
  assert.equal((await B.request('get', { key })).value, 'v3')
  assert.equal(await dataCommands(redis), beforeGet, 'get() asked Redis nothing either')
})

test('a carried value is never served over what the instance did or heard since: its own delete, set, clear, a later delete elsewhere', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { A, B } = await setup(t)
  const cases = [
    ['its own delete', async (key) => assert.ok((await B.request('delete', { key })).ok)],
    ['its own clear', async () => assert.ok(await B.request('run', { body: 'await cache.clear(); return true' }))],
    [
      'a delete in A after the refresh',
      async (key) => {
        assert.ok((await A.request('delete', { key })).ok)
        await waitFor(async () => (await B.request('run', { body: 'return cache._debugCounts().inboxKeys', args: {} })) > 0, { what: "B to hear A's delete" })
      },
    ],
  ]
  for (const [i, [what, act]] of cases.entries()) {
    const key = `carried:fenced:${i}`
    assert.equal((await read(A, key, { value: 'old' })).value, 'old')
    assert.equal((await read(B, key, { value: MUST_NOT_LOAD })).value, 'old')
    assert.equal((await read(A, key, { value: 'carried' }, { forceRefresh: true })).value, 'carried')
    await heard(B, `B to hear A's refresh (${what})`)
    // Apply what was heard (a read of another key does), so the next wait sees only new messages.
    await read(B, `${key}:other`, { value: 'x' })
    await act(key)
    const r = await read(B, key, { value: 'reloaded' })
    assert.deepEqual(r, { value: 'reloaded', loaderCalls: 1 }, `after ${what}, B loads instead of serving the carried value`)
  }
})

test('tagged and large values are announced without the value: the other instance reads them from Redis', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, A, B } = await setup(t)
  const big = 'x'.repeat(10_000)
  for (const [key, value, opts] of [
    ['carried:tagged', 'tagged-v2', { forceRefresh: true, tags: ['t'] }],
    ['carried:big', big, { forceRefresh: true }],
  ]) {
    assert.equal((await read(A, key, { value: 'v1' })).loaderCalls, 1)
    // As above: A's first load is not announced; B reads it from Redis.
    assert.equal((await read(B, key, { value: MUST_NOT_LOAD })).value, 'v1')
    assert.equal((await read(A, key, { value }, opts)).value, value)
    await heard(B, `B to hear the refresh of ${key}`)
    const before = await dataCommands(redis)
    assert.deepEqual(await read(B, key, { value: MUST_NOT_LOAD }), { value, loaderCalls: 0 })
    assert.ok((await dataCommands(redis)) > before, `${key}: B read it from Redis`)
  }
})
