'use strict'
// The read lane. Plain GETs of the read path go on a second connection whose
// socket the JS thread's own event loop drives (src/node/lane/), not through the runtime's
// threads. __test__/redis-socket-lane.test.js runs this file again on the socket lane (a
// socket of the runtime's own, lib/lane.js: STAMPEDE_CACHE_LANE=socket). What it must keep: every read answered (by Redis or the loader), never hung, never
// an older value after this instance's own write; a killed or silent lane costs the reads in
// flight nothing; the process and worker threads still exit on their own.
//
// Each test starts its own redis-server on a free 127.0.0.1 port. The lane is found in
// CLIENT LIST by its name; facts are read from Redis and from the cache's counts, never timed.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const { Worker } = require('node:worker_threads')
const fs = require('node:fs')
const os = require('node:os')
const { RedisServer, waitFor, killAllSync } = require('./helpers/redis-server')
const { monitorDuring } = require('./helpers/monitor')
const { makeCertificates, RedisNode, killTopologySync } = require('./helpers/redis-topology')
const { lanes, laneCarrying } = require('./helpers/lanes')
const { StampedeCache } = require('..')

const root = path.join(__dirname, '..')
const TEST_TIMEOUT = 60_000

after(() => {
  killAllSync()
  killTopologySync()
})

async function server(t) {
  const redis = await new RedisServer().start()
  t.after(() => redis.dispose())
  return redis
}

function cacheOn(t, redis, options = {}) {
  const cache = new StampedeCache({ redis: redis.url, namespace: 'lane', l1: false, ttl: 60_000, ...options })
  t.after(() => cache.close())
  return cache
}

test('reads take the lane: one named connection carries the GETs, values and counts as before', { timeout: TEST_TIMEOUT }, async (t) => {
  const redis = await server(t)
  const writer = cacheOn(t, redis)
  const reader = cacheOn(t, redis)
  for (let i = 0; i < 50; i++) await writer.set(`k${i}`, { i, text: 'x'.repeat(i * 300) })
  const mustNotLoad = () => {
    throw new Error('must come from Redis')
  }
  const lane = await laneCarrying(redis, () => reader.getOrLoad('k0', mustNotLoad))
  assert.equal((await lanes(redis)).length, 1, 'one lane for the reader (the writer has not read)')
  const before = reader.stats()
  const values = await Promise.all(Array.from({ length: 500 }, (_, n) => reader.getOrLoad(`k${n % 50}`, mustNotLoad)))
  values.forEach((v, n) => assert.deepEqual(v, { i: n % 50, text: 'x'.repeat((n % 50) * 300) }))
  assert.deepEqual(await Promise.all([reader.get('k7'), reader.get('absent')]), [{ i: 7, text: 'x'.repeat(2100) }, undefined])
  const after = reader.stats()
  assert.equal(after.loads, before.loads, 'no loads')
  assert.equal(after.redisErrors, 0)
  assert.equal(after.misses - before.misses, 1, 'get(absent) is a miss')
  // A value far larger than one read of the socket, among small ones in flight with it.
  await writer.set('big', { data: 'y'.repeat(3_000_000) })
  const mixed = await Promise.all([reader.get('big'), reader.get('k1'), reader.get('big'), reader.get('k2')])
  assert.equal(mixed[0].data.length, 3_000_000)
  assert.deepEqual(mixed[1], { i: 1, text: 'x'.repeat(300) })
  assert.equal(mixed[2].data, mixed[0].data)
  assert.deepEqual(mixed[3], { i: 2, text: 'x'.repeat(600) })
  const still = (await lanes(redis)).find((c) => c.id === lane.id)
  assert.ok(still, 'the same lane is still open')

  // A key Redis does not have: the lane's GET finds nothing, the lock is taken on the command
  // connection, and 20 concurrent callers share one load.
  let loads = 0
  const cold = await Promise.all(Array.from({ length: 20 }, () => reader.getOrLoad('cold', async () => ++loads)))
  assert.deepEqual(new Set(cold), new Set([1]))
  assert.equal(loads, 1)
  assert.equal(await writer.getOrLoad('cold', mustNotLoad), 1, 'written back to Redis')

  // An entry with tags is asked again on the command connection (its tags' clocks are read
  // there): still served, and dead once its tag is deleted.
  await writer.set('tagged', 'v', { tags: ['t1'] })
  assert.equal(await reader.getOrLoad('tagged', mustNotLoad), 'v')
  await writer.deleteByTag('t1')
  assert.equal(await reader.getOrLoad('tagged', async () => 'reloaded'), 'reloaded')
})

/** Calls of each command since `CONFIG RESETSTAT` (INFO commandstats). */
async function calls(redis) {
  const stats = await redis.info('commandstats')
  const out = {}
  for (const [k, v] of Object.entries(stats)) out[k.replace(/^cmdstat_/, '')] = Number(/calls=(\d+)/.exec(v)[1])
  return out
}

test('marks are amortised: sequential reads while nothing changes cost about one GET each, and the first read after a write of this instance is proven before it is delivered', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const redis = await server(t)
  const writer = cacheOn(t, redis)
  const reader = cacheOn(t, redis)
  for (let i = 0; i < 20; i++) await writer.set(`m${i}`, i)
  const mustNotLoad = () => {
    throw new Error('must come from Redis')
  }
  await laneCarrying(redis, () => reader.getOrLoad('m0', mustNotLoad))
  await redis.cmd('CONFIG', 'RESETSTAT')
  for (let n = 0; n < 400; n++) assert.equal(await reader.getOrLoad(`m${n % 20}`, mustNotLoad), n % 20)
  const c = await calls(redis)
  // One mark per 16 reads at most while nothing changed (or per 50 ms, on a slow machine).
  assert.equal(c.get, 400, 'every read went to Redis')
  assert.ok((c.echo ?? 0) <= 400 / 4, `${c.echo} ECHOs for 400 reads: marks are not amortised`)
  // After this instance's own write, its next read is marked: a reply is delivered only once
  // an ECHO after it came back.
  await reader.set('m3', 'mine')
  await redis.cmd('CONFIG', 'RESETSTAT')
  assert.equal(await reader.getOrLoad('m3', mustNotLoad), 'mine')
  const after = await calls(redis)
  assert.deepEqual([after.get, after.echo], [1, 1], 'the read after a write went with its mark')
})

test('marks follow the keys written: a read of a key this instance wrote since the last mark is proven before it is delivered, a read of another key is not held for it', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const redis = await server(t)
  const cache = cacheOn(t, redis)
  for (let i = 0; i < 20; i++) await cache.set(`r${i}`, i)
  const mustNotLoad = () => {
    throw new Error('must come from Redis')
  }
  await laneCarrying(redis, () => cache.getOrLoad('r0', mustNotLoad))
  // The GETs and ECHOs Redis executed while `read` ran (the writes before it, whose scripts and
  // clock reads count GETs and ECHOs of their own, are not counted).
  const counted = { get: 0, echo: 0 }
  const reading = async (read) => {
    await redis.cmd('CONFIG', 'RESETSTAT')
    const value = await read()
    const c = await calls(redis)
    counted.get += c.get ?? 0
    counted.echo += c.echo ?? 0
    return value
  }
  // Each round writes one key and reads another: the write does not make the read marked (a
  // mark per 16 reads or 50 ms still comes, as when nothing is written).
  for (let n = 0; n < 100; n++) {
    await cache.set(`w${n}`, n)
    assert.equal(await reading(() => cache.getOrLoad(`r${n % 20}`, mustNotLoad)), n % 20)
  }
  assert.equal(counted.get, 100, 'every read went to Redis')
  assert.ok(counted.echo <= 100 / 4, `${counted.echo} ECHOs for 100 reads of keys not written: a write marks every read`)
  // Each round writes a key and reads it back: that read goes with its mark.
  Object.assign(counted, { get: 0, echo: 0 })
  for (let n = 0; n < 10; n++) {
    await cache.set(`r${n}`, `mine${n}`)
    assert.equal(await reading(() => cache.getOrLoad(`r${n}`, mustNotLoad)), `mine${n}`)
  }
  assert.deepEqual([counted.get, counted.echo], [10, 10], 'each first read of a key written went with its mark')
  // A load writes its key back: the next read of that key is proven too.
  Object.assign(counted, { get: 0, echo: 0 })
  assert.equal(await cache.getOrLoad('cold', async () => 'loaded'), 'loaded')
  assert.equal(await reading(() => cache.getOrLoad('cold', mustNotLoad)), 'loaded')
  assert.deepEqual([counted.get, counted.echo], [1, 1], 'the read after a load wrote its key went with its mark')
})

/** The connections (`addr`) that sent each `MGET` while `fn` ran, as MONITOR shows them. */
// The connections that sent MGETs of value keys while `fn` ran (a tagged entry's tag records,
// its deleteByTag and expireByTag keys, are read by an MGET too: not counted).
async function mgetSenders(redis, fn) {
  const senders = []
  await monitorDuring(redis.port, fn, (addr, name, line) => {
    if (name === 'MGET' && !/^\S+ \[[^\]]+\] "MGET" "[^"]*:tagx?:\{/.test(line)) senders.push(addr)
  })
  return senders
}

test('a batch read takes the lane: one MGET on it, values far larger than one socket read among small ones, tagged keys asked again on the command connection', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const redis = await server(t)
  const writer = cacheOn(t, redis)
  const reader = cacheOn(t, redis)
  const keys = Array.from({ length: 200 }, (_, i) => `b${i}`)
  const valueOf = (i) => ({ i, text: i % 50 === 7 ? 'z'.repeat(1_000_000) : 'x'.repeat(i) })
  for (let i = 0; i < keys.length; i++) await writer.set(keys[i], valueOf(i))
  await writer.set('btagged', 'v', { tags: ['bt'] })
  const lane = await laneCarrying(redis, () => reader.get('b0'))
  const mustNotLoad = () => {
    throw new Error('must come from Redis')
  }
  const before = reader.stats()
  let got
  const senders = await mgetSenders(redis, async () => {
    got = await reader.getMany([...keys, 'btagged', 'absent'])
  })
  assert.deepEqual(got, [...keys.map((_, i) => valueOf(i)), 'v', undefined])
  // The batch's MGET on the lane; the tagged key alone again on the command connection.
  assert.equal(senders.length, 2, `${senders}`)
  assert.equal(senders[0], lane.addr, 'the batch on the lane')
  assert.notEqual(senders[1], lane.addr, 'the tagged key on the command connection')
  const after = reader.stats()
  assert.deepEqual([after.l2Hits - before.l2Hits, after.misses - before.misses, after.redisErrors], [keys.length + 1, 1, 0])
  const warm = await mgetSenders(redis, async () => {
    assert.deepEqual(
      await reader.getOrLoadMany(keys, mustNotLoad),
      keys.map((_, i) => valueOf(i)),
    )
  })
  assert.deepEqual(warm, [lane.addr], 'getOrLoadMany: one MGET, on the lane')
  // The tagged entry is dead once its tag is deleted: the command connection judged it.
  await writer.deleteByTag('bt')
  assert.deepEqual(await reader.getMany(['btagged', 'b1']), [undefined, valueOf(1)])
  // Batches in flight together: one on the lane at a time, the others on the command connection.
  const many = await mgetSenders(redis, async () => {
    const all = await Promise.all(Array.from({ length: 4 }, () => reader.getMany(keys)))
    for (const values of all)
      assert.deepEqual(
        values,
        keys.map((_, i) => valueOf(i)),
      )
  })
  assert.equal(many.length, 4)
  assert.equal(many.filter((a) => a === lane.addr).length >= 1, true, `some on the lane: ${many}`)
  assert.equal(many.filter((a) => a !== lane.addr).length >= 1, true, `some on the command connection: ${many}`)
  assert.ok(
    (await lanes(redis)).some((c) => c.id === lane.id),
    'the same lane is still open',
  )
})

test("a read after this instance's own set or delete resolved sees it, though the two take different connections", { timeout: TEST_TIMEOUT }, async (t) => {
  const redis = await server(t)
  const cache = cacheOn(t, redis)
  await cache.set('rw', 0)
  await laneCarrying(redis, () => cache.get('rw'))
  for (let n = 1; n <= 300; n++) {
    if (n % 10 === 0) {
      await cache.delete('rw')
      assert.equal(await cache.get('rw'), undefined, `read ${n} after delete`)
      assert.equal(await cache.getOrLoad('rw', async () => n), n, `load ${n} after delete`)
    } else {
      await cache.set('rw', n)
      assert.equal(await cache.getOrLoad('rw', async () => -1), n, `read ${n} after set`)
    }
  }
  assert.equal((await lanes(redis)).length, 1)
})

test('a killed lane: every read in flight is answered from Redis on the command connection, and a new lane opens', { timeout: TEST_TIMEOUT }, async (t) => {
  const redis = await server(t)
  const cache = cacheOn(t, redis)
  for (let i = 0; i < 64; i++) await cache.set(`k${i}`, `v${i}`)
  const lane = await laneCarrying(redis, () => cache.get('k0'))
  const mustNotLoad = () => {
    throw new Error('Redis is up: the value must come from it')
  }
  let killed = 0
  for (let round = 0; round < 5; round++) {
    const current = await laneCarrying(redis, () => cache.get('k0'))
    const reads = Array.from({ length: 256 }, (_, n) => cache.getOrLoad(`k${n % 64}`, mustNotLoad))
    killed += await redis.cmd('CLIENT', 'KILL', 'ID', current.id)
    const values = await Promise.all(reads)
    values.forEach((v, n) => assert.equal(v, `v${n % 64}`))
  }
  assert.equal(killed, 5)
  const reopened = await laneCarrying(redis, () => cache.get('k1'))
  assert.notEqual(reopened.id, lane.id, 'a new lane')
  assert.equal(cache.stats().loads, 0)
  assert.equal(cache.stats().redisErrors, 0, "a lane's loss alone does not take Redis down")
})

test('Redis paused: a read on the lane ends at commandTimeout (the loader serves), and the lane works after', { timeout: TEST_TIMEOUT }, async (t) => {
  const redis = await server(t)
  const cache = cacheOn(t, redis, { redis: { url: redis.url, commandTimeout: 300, connectTimeout: 1_000 } })
  await cache.set('p', 'from-redis')
  await laneCarrying(redis, () => cache.get('p'))
  redis.pause()
  let loaderCalls = 0
  const values = await Promise.all(
    Array.from({ length: 10 }, () =>
      cache.getOrLoad('p', async () => {
        loaderCalls++
        return 'from-loader'
      }),
    ),
  )
  redis.resume()
  assert.deepEqual(new Set(values), new Set(['from-loader']), 'served by the loader while Redis was paused')
  assert.ok(loaderCalls >= 1)
  assert.ok(cache.stats().redisErrors >= 1, 'the timeout was counted')
  // Up again: reads go to Redis, on a lane.
  await waitFor(async () => (await cache.getOrLoad('p', async () => 'loader-again')) === 'from-redis', { what: 'Redis again' })
  await laneCarrying(redis, () => cache.get('p'))
})

test('an idle cache with its lane open lets the process exit; a worker thread reading on a lane ends cleanly', { timeout: TEST_TIMEOUT }, async (t) => {
  const redis = await server(t)
  const writer = cacheOn(t, redis)
  await writer.set('w', 'ok')
  // Never closed: only the lane and the bus are left, and neither holds the process.
  const r = spawnSync(
    process.execPath,
    [
      '-e',
      `
      const { StampedeCache } = require('.')
      const cache = new StampedeCache({ redis: ${JSON.stringify(redis.url)}, namespace: 'lane', l1: false })
      ;(async () => {
        let v
        for (let i = 0; i < 200; i++) v = await cache.get('w')
        console.log('value', v)
      })()
    `,
    ],
    { cwd: root, encoding: 'utf8', timeout: 30_000 },
  )
  assert.equal(r.signal, null, `killed by ${r.signal} (hung past the timeout?)`)
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /value ok/)

  const source = `
    const { parentPort, workerData } = require('node:worker_threads')
    const { StampedeCache } = require(workerData.root)
    const cache = new StampedeCache({ redis: workerData.url, namespace: 'lane', l1: false })
    ;(async () => {
      let v
      for (let i = 0; i < 200; i++) v = await cache.get('w')
      // Reads in flight when the thread is stopped from outside, which keeps it alive.
      setInterval(() => {}, 1_000)
      for (let i = 0; i < 50; i++) cache.get('w')
      parentPort.postMessage(v)
    })()
  `
  for (let i = 0; i < 3; i++) {
    const w = new Worker(source, { eval: true, workerData: { root, url: redis.url } })
    const value = await new Promise((resolve, reject) => {
      w.once('message', resolve)
      w.once('error', reject)
    })
    assert.equal(value, 'ok')
    assert.equal(await w.terminate(), 1)
  }
  await waitFor(async () => (await lanes(redis)).length === 0, { what: "the workers' lanes to close" })
})

test('over TLS (a private CA, client certificates, a server name): reads take a TLS lane, which a kill costs nothing; without verification they do not', {
  timeout: TEST_TIMEOUT,
  // The socket lane (redis-socket-lane.test.js runs this file on it) does not speak TLS.
  skip: process.env.STAMPEDE_CACHE_LANE === 'socket' && 'the socket lane speaks no TLS: reads over TLS take the command connection there',
}, async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-lane-tls-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const certs = makeCertificates(dir)
  // Mutual TLS: a connection without the client certificate is refused by the server.
  const redis = await new RedisNode('lane-tls', { dir, tls: { certs, authClients: 'yes' } }).start()
  t.after(() => redis.dispose())
  const tls = { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey }
  const writer = cacheOn(t, redis, { redis: { url: redis.url, tls } })
  const reader = cacheOn(t, redis, { redis: { url: redis.url, tls } })
  const mustNotLoad = () => {
    throw new Error('must come from Redis')
  }
  for (let i = 0; i < 50; i++) await writer.set(`k${i}`, { i, text: 'x'.repeat(i * 300) })
  const lane = await laneCarrying(redis, () => reader.getOrLoad('k0', mustNotLoad))
  const values = await Promise.all(Array.from({ length: 500 }, (_, n) => reader.getOrLoad(`k${n % 50}`, mustNotLoad)))
  values.forEach((v, n) => assert.deepEqual(v, { i: n % 50, text: 'x'.repeat((n % 50) * 300) }))
  // Many TLS records for one reply, among small replies in flight with it.
  await writer.set('big', { data: 'y'.repeat(3_000_000) })
  const mixed = await Promise.all([reader.get('big'), reader.get('k1'), reader.get('big'), reader.get('k2')])
  assert.equal(mixed[0].data.length, 3_000_000)
  assert.equal(mixed[2].data, mixed[0].data)
  assert.deepEqual(
    [mixed[1], mixed[3]],
    [
      { i: 1, text: 'x'.repeat(300) },
      { i: 2, text: 'x'.repeat(600) },
    ],
  )
  assert.ok(
    (await lanes(redis)).some((c) => c.id === lane.id),
    'the same lane is still open',
  )
  // Read-your-writes across the command connection and the lane.
  for (let n = 1; n <= 50; n++) {
    await reader.set('rw', n)
    assert.equal(await reader.getOrLoad('rw', async () => -1), n)
  }

  // Killed under reads in flight: each is answered from Redis, none loaded, Redis not down.
  let killed = 0
  for (let round = 0; round < 3; round++) {
    const current = await laneCarrying(redis, () => reader.get('k0'))
    const reads = Array.from({ length: 256 }, (_, n) => reader.getOrLoad(`k${n % 50}`, mustNotLoad))
    killed += await redis.cmd('CLIENT', 'KILL', 'ID', current.id)
    ;(await Promise.all(reads)).forEach((v, n) => assert.deepEqual(v, { i: n % 50, text: 'x'.repeat((n % 50) * 300) }))
  }
  assert.equal(killed, 3)
  assert.notEqual((await laneCarrying(redis, () => reader.get('k1'))).id, lane.id, 'a new lane')
  assert.equal(reader.stats().loads, 0)
  assert.equal(reader.stats().redisErrors, 0)

  // The certificate verified against tls.servername while the URL names the address.
  const named = cacheOn(t, redis, { redis: { url: redis.url, tls: { ...tls, servername: 'localhost' } } })
  const lanesBefore = (await lanes(redis)).length
  await waitFor(
    async () => {
      assert.deepEqual(await named.getOrLoad('k3', mustNotLoad), { i: 3, text: 'x'.repeat(900) })
      return (await lanes(redis)).length === lanesBefore + 1
    },
    { what: 'a lane for the cache with a server name' },
  )
  // rejectUnauthorized: false: the reads stay on the command connection, as its client skips
  // verification and the lane verifies always.
  const unverified = cacheOn(t, redis, { redis: { url: redis.url, tls: { ...tls, rejectUnauthorized: false } } })
  for (let i = 0; i < 200; i++) assert.equal((await unverified.getOrLoad(`k${i % 50}`, mustNotLoad)).i, i % 50)
  await new Promise((resolve) => setTimeout(resolve, 300))
  assert.equal((await lanes(redis)).length, lanesBefore + 1, 'no lane for the cache without verification')
  assert.equal(unverified.stats().loads, 0)
})
