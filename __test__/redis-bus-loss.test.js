'use strict'
// A lost bus connection without a full flush (docs/CONTRACT.md, "The rest"): after it, an
// instance keeps the in-process entries no other instance changed meanwhile and drops those that
// were changed; only when it cannot tell which (a clear meanwhile) does it drop them all.
//
// Real worker processes share a private redis-server; instance a reaches it through a proxy
// (helpers/tcp-proxy.js) whose cut() resets a's connections, its bus included, and refuses new
// ones for 2 s while b changes what a holds.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, killAllSync, sleep } = require('./helpers/redis-server')
const { TcpProxy } = require('./helpers/tcp-proxy')
const { eventually } = require('./helpers/eventually')

const TEST_TIMEOUT = 60_000
const HELD = 1_000
const OUTAGE_MS = 2_000

after(() => killAllSync())

const until = (holds, what, timeout = 15_000) =>
  eventually(
    async () => {
      if (!(await holds())) throw new Error('not yet')
    },
    { timeout, what },
  )

/** b writes HELD keys (one tagged), a reads them all: a holds a copy of each. */
async function held(t) {
  const { redis, spawnWorker, stored } = await setupRedis(t, { prefix: 'scbus' })
  const proxy = new TcpProxy(redis.port)
  t.after(() => proxy.close())
  await proxy.start()
  const a = await spawnWorker('a', { redis: `redis://127.0.0.1:${proxy.port}` })
  const b = await spawnWorker('b')
  await b.request('run', {
    args: { n: HELD },
    body: `
      for (let i = 0; i < args.n; i++) await cache.set('k' + i, { i, v: 'old' }, i === 0 ? { tags: ['g'] } : undefined)
      return true
    `,
  })
  const warm = await a.request('run', {
    args: { n: HELD },
    body: `
      const keys = Array.from({ length: args.n }, (_, i) => 'k' + i)
      await cache.getMany(keys)
      // b's last announcements may come after that read, and drop what it kept: read again once
      // the bus is quiet.
      await tools.sleep(200)
      const values = await cache.getMany(keys)
      return { read: values.filter((v) => v && v.v === 'old').length, stats: cache.stats() }
    `,
  })
  assert.equal(warm.read, HELD)
  assert.equal(warm.stats.l1Entries, HELD, 'a holds every key')
  return { redis, proxy, a, b, stored }
}

/** a re-reads every key: how many it had to ask Redis for (the copies it dropped), and the values. */
function reread(a) {
  return a.request('run', {
    args: { n: HELD },
    body: `
      const keys = Array.from({ length: args.n }, (_, i) => 'k' + i)
      const before = cache.stats().l2Hits
      const values = await cache.getMany(keys)
      return { fromRedis: cache.stats().l2Hits - before, values }
    `,
  })
}

test(`a 2 s bus outage during which one of ${HELD} held keys changed drops that key alone`, { timeout: TEST_TIMEOUT }, async (t) => {
  const { proxy, a, b } = await held(t)
  proxy.cut()
  await sleep(OUTAGE_MS / 2)
  await b.request('run', { body: `await cache.set('k7', { i: 7, v: 'new' }); return true` })
  await sleep(OUTAGE_MS / 2)
  proxy.mend()
  // Once a has heard of k7 (its check after resubscribing), it serves b's value.
  await until(async () => {
    const [v] = await a.request('run', { body: `return [await cache.get('k7')]` })
    return v && v.v === 'new'
  }, "a serves b's new k7")
  const { fromRedis, values } = await reread(a)
  const dropped = fromRedis + 1
  t.diagnostic(`entries dropped after the ${OUTAGE_MS} ms bus outage: ${dropped} of ${HELD} (1 changed)`)
  assert.equal(dropped, 1, 'only the changed key was dropped')
  assert.equal(values.filter((v) => v.v === 'old').length, HELD - 1)
  assert.equal(values[7].v, 'new')
  const s = await a.request('run', { body: 'return cache.stats()' })
  assert.equal(s.l1Entries, HELD)
})

test('a key deleted, a tag deleted and a key expired during the outage are dropped; the rest kept', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, proxy, a, b } = await held(t)
  proxy.cut()
  await b.request('run', { body: `await cache.delete('k3'); await cache.deleteByTag('g'); return true` })
  // k5's value key goes behind the cache's back (evicted, say): a cannot have it any more.
  const { namespace } = await b.request('run', { body: 'return { namespace: tools.options.namespace }' })
  await redis.cmd('DEL', `${namespace}:v:{k5}`)
  await sleep(OUTAGE_MS)
  proxy.mend()
  await until(async () => {
    const [v] = await a.request('run', { body: `return [(await cache.get('k3')) ?? null]` })
    return v === null
  }, 'a dropped the deleted k3')
  const { values, fromRedis } = await reread(a)
  // (undefined reads as null across the workers' IPC)
  assert.equal(values[0], null, 'k0 carried the deleted tag')
  assert.equal(values[3], null)
  assert.equal(values[5], null)
  assert.equal(values.filter((v) => v && v.v === 'old').length, HELD - 3)
  // k0, k5 asked of Redis again (found nothing there); k3 was already asked above.
  assert.equal(fromRedis, 0, 'found nothing for them in Redis')
})

test('a clear during the outage: a cannot tell what it missed, so it drops every copy', { timeout: TEST_TIMEOUT }, async (t) => {
  const { proxy, a, b } = await held(t)
  proxy.cut()
  await b.request('run', { body: `await cache.clear(); await cache.set('k9', { i: 9, v: 'after clear' }); return true` })
  await sleep(OUTAGE_MS)
  proxy.mend()
  await until(async () => {
    const [v] = await a.request('run', { body: `return [(await cache.get('k1')) ?? null]` })
    return v === null
  }, 'a dropped its copies')
  const { values } = await reread(a)
  assert.equal(values.filter((v) => v !== null).length, 1, JSON.stringify(values.filter((v) => v !== null)))
  assert.equal(values[9].v, 'after clear')
})

test("a's own change Redis could not take during the outage stays in its copy (read your writes), and reaches Redis after", {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { proxy, a, stored } = await held(t)
  proxy.cut()
  const r = await a.request('run', { body: `try { await cache.set('k4', { i: 4, v: 'mine' }); return 'ok' } catch (e) { return e.queued }` })
  assert.equal(r, true, 'rejected as queued')
  await sleep(OUTAGE_MS)
  proxy.mend()
  await until(async () => (await stored('k4')).value?.v === 'mine', "a's set replayed")
  const { values } = await reread(a)
  assert.equal(values[4].v, 'mine')
  assert.equal(values.filter((v) => v.v === 'old').length, HELD - 1, 'the others kept')
})

test('Redis Cluster: the check after a lost bus goes one pipeline per node and drops only the changed key', { timeout: 120_000 }, async (t) => {
  const { StampedeCache } = require('..')
  const { RedisCluster, killTopologySync } = require('./helpers/redis-topology')
  t.after(() => killTopologySync())
  const cluster = new RedisCluster({ masters: 3, replicasPerMaster: 0 })
  t.after(() => cluster.dispose())
  await cluster.start()
  const options = { redis: { cluster: cluster.seedUrls }, namespace: `buscl${process.pid}`, jitter: 0 }
  const a = new StampedeCache(options)
  const b = new StampedeCache(options)
  t.after(() => Promise.all([a.close(), b.close()]))
  const keys = Array.from({ length: 300 }, (_, i) => `cl${i}`)
  for (const k of keys) await b.set(k, { k, v: 'old' })
  await a.getMany(keys)
  // b's last announcements may come after that read, and drop what it kept: read again once the
  // bus is quiet.
  await sleep(200)
  assert.equal((await a.getMany(keys)).filter((v) => v?.v === 'old').length, 300)
  assert.equal(a.stats().l1Entries, 300)
  // Every subscription goes (a's and b's), and b changes a key while a resubscribes.
  for (const node of cluster.liveNodes) await node.cmd('CLIENT', 'KILL', 'TYPE', 'pubsub')
  await b.set('cl7', { k: 'cl7', v: 'new' })
  await until(async () => (await a.get('cl7'))?.v === 'new', "a serves b's new cl7")
  const before = a.stats().l2Hits
  const values = await a.getMany(keys)
  const dropped = a.stats().l2Hits - before + 1
  t.diagnostic(`Cluster, 3 masters: entries dropped after the bus was lost: ${dropped} of 300 (1 changed)`)
  assert.equal(dropped, 1)
  assert.equal(values.filter((v) => v.v === 'old').length, 299)
})
