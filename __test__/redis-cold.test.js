'use strict'
// What a cold load costs Redis (issue 34, "fewer commands per cold load"), and that the savings
// keep what the contract promises: a cold load whose result replaces no value and that nobody
// waits on announces nothing (no other process can hold a copy of a value that did not exist),
// while one with a lock waiter in another process still wakes it at once, not after lockTtl.
// Commands are counted by Redis itself (INFO commandstats, which counts a script's inner calls),
// never timed; the one bound on time is half of a 20 s lockTtl (waking and waiting the lock
// out are seconds apart however loaded the machine is).

const { test } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, waitFor } = require('./helpers/redis-server')

const TEST_TIMEOUT = 60_000
const LOCK_TTL = 20_000

/** INFO commandstats as { command: calls }, the test's own INFO/CONFIG left out. */
async function commandCounts(redis) {
  const stats = await redis.info('commandstats')
  const out = {}
  for (const [name, line] of Object.entries(stats)) {
    if (!name.startsWith('cmdstat_')) continue
    const command = name.slice('cmdstat_'.length)
    if (/^(info|config\|resetstat|config)$/.test(command)) continue
    out[command] = Number(line.match(/calls=(\d+)/)?.[1] ?? 0)
  }
  return out
}

/** Commands a cold load sends for its key: the bus's, the connection's own and alignment marks aside. */
const BOOKKEEPING = /^(ping|subscribe|hello|client\|.*|select|echo|script\|load|eval)$/
const dataCommands = (counts) => Object.entries(counts).reduce((s, [c, n]) => (BOOKKEEPING.test(c) ? s : s + n), 0)

async function setup(t) {
  const env = await setupRedis(t, { options: { ttl: 60_000, lockTtl: LOCK_TTL }, prefix: 'cold' })
  const A = await env.spawnWorker('A')
  const B = await env.spawnWorker('B')
  return { ...env, A, B }
}

test('a cold load nobody waits on: written and unlocked without an announcement, in fewer commands', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, A, stored, lkey } = await setup(t)
  // Warm the scripts and the connections first, on another key.
  assert.ok((await A.request('read', { key: 'cold:warm', loader: { value: 'w' } })).results[0].ok)
  await redis.cmd('CONFIG', 'RESETSTAT')
  const r = await A.request('read', { key: 'cold:one', loader: { value: 'v1' } })
  assert.ok(r.results[0].ok, r.results[0].message)
  assert.equal(r.loaderCallsDuring, 1)
  const counts = await commandCounts(redis)
  t.diagnostic(`one cold load: ${JSON.stringify(counts)}`)
  assert.deepEqual(await stored('cold:one'), { exists: true, value: 'v1' })
  assert.equal(await redis.cmd('EXISTS', lkey('cold:one')), 0, 'the lock was released')
  assert.equal(counts.publish ?? 0, 0, 'nothing announced: no process can hold a copy of a value that did not exist')
  assert.equal(counts.hget ?? 0, 0, "the clock known here stands for Redis's: read less than a second ago, the bus up since")
  // The read's GET, the gate (SET NX marker, SET NX lock), the write-back (MGET of the lock, the
  // value and the earlier versions' generation key; DEL lock; SET), two EVALSHA.
  assert.ok(dataCommands(counts) <= 8, `data commands per cold load: ${dataCommands(counts)} (${JSON.stringify(counts)})`)
})

test("after the bus changes, the next cold load reads Redis's clock again", { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, A } = await setup(t)
  assert.ok((await A.request('read', { key: 'bus:warm', loader: { value: 'w' } })).results[0].ok)
  await redis.cmd('CONFIG', 'RESETSTAT')
  assert.ok((await A.request('read', { key: 'bus:vouched', loader: { value: 'v' } })).results[0].ok)
  assert.equal((await commandCounts(redis)).hget ?? 0, 0, 'precondition: the clock was vouched for')
  await redis.cmd('CLIENT', 'KILL', 'TYPE', 'pubsub')
  await waitFor(async () => (await redis.cmd('CLIENT', 'LIST', 'TYPE', 'pubsub')).trim() !== '', {
    timeout: 10_000,
    interval: 10,
    what: 'A to subscribe again',
  })
  await redis.cmd('CONFIG', 'RESETSTAT')
  assert.ok((await A.request('read', { key: 'bus:after', loader: { value: 'v' } })).results[0].ok)
  const counts = await commandCounts(redis)
  t.diagnostic(JSON.stringify(counts))
  assert.equal(counts.hget, 1, 'announcements may have been missed while the bus was away: the gate read the clock')
})

test('Redis losing its clock with the bus up: within a second a cold load raises it again to the one known here', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, A, namespace } = await setup(t)
  for (let i = 0; i < 3; i++) assert.ok(await A.request('run', { body: 'await cache.deleteByTag("unrelated"); return true' }))
  assert.ok((await A.request('read', { key: 'lost:warm', loader: { value: 'w' } })).results[0].ok)
  const meta = `${namespace}:meta`
  const known = Number(await redis.cmd('HGET', meta, 'clock'))
  assert.ok(known >= 3, `precondition: the clock is ${known}`)
  await redis.cmd('DEL', meta) // as a FLUSHALL or an eviction would: no change of the bus
  await new Promise((r) => setTimeout(r, 1_100)) // CLOCK_VOUCHED_FOR (src/store/redis/lock.rs)
  assert.ok((await A.request('read', { key: 'lost:after', loader: { value: 'v' } })).results[0].ok)
  assert.equal(Number(await redis.cmd('HGET', meta, 'clock')), known, 'the clock was raised back before anything was born at it')
})

test('a lock waiter in another process is woken by the write-back at once, not after lockTtl', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, A, B, stored, lkey } = await setup(t)
  const key = 'cold:waited'
  const aRun = A.start('read', { key, loader: { ms: 1_500, value: 'A-value' } })
  await waitFor(async () => (await redis.cmd('EXISTS', lkey(key))) === 1, { timeout: 5_000, interval: 10, what: "A's lock" })
  const bRun = B.start('read', { key, loader: { value: 'B-own' } })
  await waitFor(async () => (await B.request('snapshot')).debug.lockWaiters > 0, { timeout: 5_000, interval: 10, what: "B to wait on A's lock" })
  const a = await aRun.result
  assert.equal(a.results[0].value, 'A-value')
  const b = await bRun.result
  const x = b.results[0]
  assert.ok(x.ok, `B rejected: ${x.code} ${x.message}`)
  assert.equal(x.value, 'A-value', "B resolves with A's value")
  assert.equal(b.loaderCallsDuring, 0, 'B never called its loader')
  const after = x.at - a.results[0].at
  t.diagnostic(`B resolved ${after} ms after A (lockTtl ${LOCK_TTL} ms)`)
  assert.ok(after < LOCK_TTL / 2, `B resolved ${after} ms after A: the write-back did not wake it and it waited the lock out`)
  assert.deepEqual(await stored(key), { exists: true, value: 'A-value' })
  assert.equal(await redis.cmd('EXISTS', lkey(key)), 0, 'the lock was released')
})

test('a refresh that replaces a value still announces it: the other process drops its copy', { timeout: TEST_TIMEOUT }, async (t) => {
  const { A, B } = await setup(t)
  const key = 'cold:refreshed'
  assert.equal((await A.request('read', { key, loader: { value: 'v1' } })).results[0].value, 'v1')
  assert.equal((await B.request('read', { key, loader: { value: 'B-must-not-load' } })).results[0].value, 'v1')
  assert.equal((await A.request('read', { key, loader: { value: 'v2' }, opts: { forceRefresh: true } })).results[0].value, 'v2')
  await waitFor(async () => (await B.request('read', { key, loader: { value: 'B-must-not-load' } })).results[0].value === 'v2', {
    timeout: 5_000,
    interval: 20,
    what: "B to drop v1 on A's announcement",
  })
})

test('Redis lost a value another process holds stale: its refresh finds the lock taken by a cold load, and that load announces its result', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, A, B, vkey, lkey } = await setup(t)
  const key = 'cold:lost'
  const opts = { ttl: 300, hardTtl: 60_000 }
  assert.equal((await A.request('read', { key, loader: { value: 'v1' }, opts })).results[0].value, 'v1')
  // As an eviction or a restart without persistence would: no process is told.
  await redis.cmd('DEL', vkey(key))
  // B's load of the key is a cold one: a marker in the key, B's lock.
  const bRun = B.start('read', { key, loader: { ms: 1_500, value: 'v2' } })
  await waitFor(async () => (await redis.cmd('EXISTS', lkey(key))) === 1, { timeout: 5_000, interval: 10, what: "B's lock" })
  const staleAt = async () => await A.request('run', { args: key, body: 'return (await cache.inspect(args))?.state ?? null' })
  await waitFor(async () => (await staleAt()) === 'stale', { timeout: 5_000, interval: 20, what: "A's copy to turn stale" })
  // A serves its stale copy and bids to refresh it: B holds the lock, so A leaves the load to B.
  assert.equal((await A.request('read', { key, loader: { value: 'A-own' }, opts })).results[0].value, 'v1')
  assert.equal((await bRun.result).results[0].value, 'v2')
  // B's result must reach A: it drops the stale copy (the next read is B's value, from Redis).
  await waitFor(async () => (await staleAt()) !== 'stale', {
    timeout: 5_000,
    interval: 20,
    what: "A to drop its stale copy on B's announcement",
  })
  assert.equal((await A.request('read', { key, loader: { value: 'A-must-not-load' }, opts })).results[0].value, 'v2')
})
