'use strict'
// Faults of the Redis tier that production has and a private redis-server can reproduce
// (docs/CONTRACT.md, "Redis" and "The rest"):
//
//   - a connection that goes silent (a proxy stops forwarding, keeps the socket open) is replaced;
//   - a command error (READONLY after a REPLICAOF demotion) fails that command alone, and the
//     tier works again once the node is writable;
//   - the invalidation inbox is deduplicated and capped (on overflow the in-process tier is dropped);
//   - after close(), lock releases share one connection; the bus is per db index.
//
// Every test starts its own redis-server(s) on free 127.0.0.1 ports and real worker processes
// (__test__/fixtures/redis-worker.js, scripted with its `run` command). Assertions are on counts
// and final states in Redis, read directly (never through the proxy or the cache).

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, RedisServer, barrier, waitFor, sleep, killAllSync } = require('./helpers/redis-server')
const { TcpProxy } = require('./helpers/tcp-proxy')
const { eventually } = require('./helpers/eventually')
const { StampedeCache } = require('..')

/** A hang fails its test instead of blocking the run. */
const TEST_TIMEOUT = 45_000

after(() => killAllSync())

/** Its own redis-server plus `workers` worker processes (see setupRedis). */
const setup = (t, { workers = 0, options = {} } = {}) => setupRedis(t, { workers, options, prefix: 'scfault' })

/** The value in a Redis envelope (undefined when the key is absent). */
function envelopeValue(raw) {
  return typeof raw === 'string' ? JSON.parse(raw).value : undefined
}

function note(t, text) {
  t.diagnostic(text)
}

/** Every pub/sub client's output buffer is empty: all published messages were written to the sockets. */
async function deliveredToSubscribers(redis) {
  const list = await redis.cmd('CLIENT', 'LIST', 'TYPE', 'pubsub')
  return list
    .split('\n')
    .filter(Boolean)
    .every((line) => /\bomem=0\b/.test(line) && /\boll=0\b/.test(line))
}

/** PUBLISHes `messages` on `channel` from the raw client, `batch` per round trip. */
async function publishAll(redis, channel, messages, batch = 2_000) {
  for (let i = 0; i < messages.length; i += batch) {
    const replies = await redis.pipeline(
      messages.slice(i, i + batch).map((m) => ['PUBLISH', channel, m]),
      { timeout: 30_000 },
    )
    for (const r of replies) if (typeof r !== 'number') throw new Error(`PUBLISH failed: ${r}`)
  }
}

// ---------------------------------------------------------------------------------------------

test('a connection that goes silent is replaced: writes reach Redis again, reads never reject', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  const proxy = new TcpProxy(redis.port)
  t.after(() => proxy.close())
  await proxy.start()
  const w = await spawnWorker('w', { redis: `redis://127.0.0.1:${proxy.port}` })

  // Warm-up: the command connection and the bus subscription are open, through the proxy.
  const warm = await w.request('run', {
    body: `
      const read = await tools.outcome(cache.getOrLoad('warm', tools.makeLoader('warm', { value: 'warm' })))
      const set = await tools.outcome(cache.set('cur', -1))
      return { read, set }
    `,
  })
  assert.ok(warm.read.ok && warm.set.ok, `warm-up: ${JSON.stringify(warm)}`)
  assert.equal(envelopeValue(await redis.cmd('GET', vkey('cur'))), -1, 'the warm-up write reached Redis through the proxy')

  // Every socket the cache has goes silent; the proxy still forwards new connections.
  const frozen = proxy.freeze()
  assert.ok(frozen >= 1, 'the cache had connections open through the proxy')
  const acceptedBefore = proxy.accepted

  // A write every 250 ms for 6 s, each to its own key (so each can be found in Redis) and to
  // 'cur' (whose final value must be the last one), plus a warm and a cold read each time. A
  // write may reject (ERR_REDIS) while the silent socket times out; a read must never reject.
  const ticks = 24
  const run = await w.request(
    'run',
    {
      args: { ticks, every: 250, settleMs: 6_000 },
      body: `
        const t0 = Date.now()
        const sets = []
        const curSets = []
        const reads = []
        const track = (list, p, extra) => {
          const slot = { ...extra, settled: false }
          list.push(slot)
          return p.then((r) => Object.assign(slot, r, { settled: true }))
        }
        const all = []
        for (let i = 0; i < args.ticks; i++) {
          const issuedAt = Date.now() - t0
          all.push(track(sets, tools.outcome(cache.set('w:' + i, i)), { i, issuedAt }))
          all.push(track(curSets, tools.outcome(cache.set('cur', i)), { i, issuedAt }))
          all.push(track(reads, tools.outcome(cache.getOrLoad('warm', tools.makeLoader('warm', { value: 'reloaded' }))), { i, issuedAt, key: 'warm' }))
          all.push(track(reads, tools.outcome(cache.getOrLoad('cold:' + i, tools.makeLoader('cold:' + i, { value: i }))), { i, issuedAt, key: 'cold:' + i }))
          await tools.sleep(args.every)
        }
        // A call still pending this long after the last tick is reported, not awaited forever.
        await Promise.race([Promise.all(all), tools.sleep(args.settleMs)])
        return { sets, curSets, reads, snap: tools.snapshot() }
      `,
    },
    { timeout: 30_000 },
  )

  const inRedis = await redis.pipeline(Array.from({ length: ticks }, (_, i) => ['GET', vkey(`w:${i}`)]))
  const landed = run.sets.map((s) => envelopeValue(inRedis[s.i]) === s.i)
  const late = run.sets.filter((s) => s.issuedAt >= 3_000)
  const lateLanded = late.filter((s) => landed[s.i]).length
  const cur = envelopeValue(await redis.cmd('GET', vkey('cur')))
  const rejectedSets = [...run.sets, ...run.curSets].filter((s) => s.settled && !s.ok)
  note(
    t,
    `frozen=${frozen} new connections after the freeze=${proxy.accepted - acceptedBefore}; ` +
      `landed ${landed.filter(Boolean).length}/${ticks} (issued after 3 s: ${lateLanded}/${late.length}); cur=${cur}; ` +
      `sets rejected=${rejectedSets.length} (${[...new Set(rejectedSets.map((s) => s.code))].join(',')}); ` +
      `redisErrors=${run.snap.stats.redisErrors}`,
  )

  assert.ok(late.length >= 8, `the loop ran ~6 s after the freeze (${late.length} writes issued after 3 s)`)
  assert.ok(
    lateLanded >= Math.ceil(late.length * 0.75),
    `most writes issued 3 s or more after the freeze reach Redis (the silent socket was replaced): ${lateLanded}/${late.length}`,
  )
  assert.equal(cur, ticks - 1, "the last write of 'cur' is the value in Redis")
  for (const r of run.reads) {
    assert.ok(r.settled, `a read of ${r.key} (issued at ${r.issuedAt} ms) never settled`)
    assert.ok(r.ok, `a read of ${r.key} (issued at ${r.issuedAt} ms) rejected: ${r.code} ${r.message}`)
  }
  for (const s of [...run.sets, ...run.curSets]) {
    assert.ok(s.settled, `a write issued at ${s.issuedAt} ms never settled`)
    if (!s.ok) assert.equal(s.code, 'ERR_REDIS', `a write that Redis could not take rejects with ERR_REDIS: ${s.message}`)
  }
})

test('READONLY after a REPLICAOF demotion fails single commands; once writable, the tier coalesces again', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, ws, namespace, vkey } = await setup(t, { workers: 2 })
  const master = new RedisServer()
  t.after(() => master.dispose())
  await master.start()

  // Warm-up: both instances hold an entry in process and are subscribed to the bus.
  for (const w of ws) assert.ok((await w.request('read', { key: 'warm', loader: { value: 'warm' } })).results[0].ok)

  // Demote the cache's redis: it syncs from the (empty) master, its data replaced, and refuses writes.
  await redis.cmd('REPLICAOF', '127.0.0.1', String(master.port))
  await waitFor(async () => (await redis.info('replication')).master_link_status === 'up', { timeout: 15_000, what: 'the replica to sync' })
  await assert.rejects(redis.cmd('SET', `${namespace}:probe`, '1'), /READONLY/, 'the demoted node refuses writes')

  // ~1.5 s of reads in both instances while it is read-only: cold keys both contend for (the lock
  // SET and the write-back are refused), and the warm key.
  const readOnly = await Promise.all(
    ws.map((w) =>
      w.request('run', {
        body: `
          const out = []
          const until = Date.now() + 1500
          for (let n = 0; Date.now() < until; n++) {
            const batch = []
            for (let j = 0; j < 3; j++) {
              const k = 'ro:' + n + ':' + j
              batch.push(tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { ms: 50, value: k }))).then((r) => ({ k, ...r })))
            }
            batch.push(tools.outcome(cache.getOrLoad('warm', tools.makeLoader('warm', { value: 'warm' }))).then((r) => ({ k: 'warm', ...r })))
            out.push(...(await Promise.all(batch)))
          }
          return { out, snap: tools.snapshot() }
        `,
      }),
    ),
  )
  for (const [i, r] of readOnly.entries()) {
    assert.ok(r.out.length >= 4, `w${i} read while read-only`)
    for (const x of r.out) assert.ok(x.ok, `w${i}: a read of ${x.k} rejected while Redis was read-only: ${x.code} ${x.message}`)
  }

  await redis.cmd('REPLICAOF', 'NO', 'ONE')
  const writableAt = Date.now()
  // READONLY fails one command and never marks Redis down (docs/CONTRACT.md), so the instances have
  // nothing to recover from: what the phase below needs is a node that takes writes again.
  await waitFor(
    async () =>
      (await redis.info('replication')).role === 'master' &&
      (await redis.cmd('SET', `${namespace}:probe`, '1').then(
        (r) => r === 'OK',
        () => false,
      )),
    { timeout: 15_000, interval: 50, what: 'the node to be a writable master again' },
  )

  // 5 new cold keys read concurrently by both instances: one load each in total, as with a
  // healthy Redis (lock and bus work again).
  const keys = Array.from({ length: 5 }, (_, j) => `after:${j}`)
  // While the 300 ms loads run, look at the lock keys from outside: this proves the pattern the
  // "none left" check below uses does match the locks the instances take.
  const lockPattern = `${namespace}:lock:*`
  let loadsDone = false
  let locksSeenDuringLoads = 0
  const sampler = (async () => {
    const deadline = Date.now() + 30_000
    while (!loadsDone && Date.now() < deadline) {
      locksSeenDuringLoads = Math.max(locksSeenDuringLoads, (await redis.cmd('KEYS', lockPattern)).length)
      await sleep(20)
    }
  })()
  const results = await barrier(ws, 'run', {
    args: { keys },
    body: `
      const before = tools.snapshot().loaderCalls
      const out = await Promise.all(args.keys.map((k) => tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { ms: 300 })))))
      return { out, loaderCalls: tools.snapshot().loaderCalls - before }
    `,
  }).finally(() => {
    loadsDone = true
  })
  await sampler
  const calls = results.reduce((s, r) => s + r.loaderCalls, 0)
  const inRedis = await redis.pipeline(keys.map((k) => ['GET', vkey(k)]))
  note(
    t,
    `read-only phase: ${readOnly.map((r) => r.out.length).join('+')} reads, redisErrors ${readOnly.map((r) => r.snap.stats.redisErrors).join('/')}; ` +
      `after REPLICAOF NO ONE (+${Date.now() - writableAt} ms): ${calls} loader calls for 5 keys x 2 instances`,
  )

  for (const [i, r] of results.entries()) {
    for (const [j, x] of r.out.entries()) assert.ok(x.ok, `w${i}: a read of ${keys[j]} rejected: ${x.code} ${x.message}`)
  }
  assert.equal(calls, keys.length, 'one loader call per key across both instances once Redis is writable again')
  for (const [j, k] of keys.entries()) {
    assert.deepEqual(results[1].out[j].value, results[0].out[j].value, `both instances got the same value of ${k}`)
    assert.deepEqual(envelopeValue(inRedis[j]), results[0].out[j].value, `the value of ${k} is in Redis`)
  }
  assert.ok(locksSeenDuringLoads >= 1, `the loads took lock keys matching ${lockPattern} (saw ${locksSeenDuringLoads})`)
  // A lock left behind would live for lockTtl (10 s); releases are sent as each load ends, so
  // well within 5 s none may remain. A failing KEYS fails the check too (locks stays null).
  let locks = null
  const released = await waitFor(
    async () => {
      locks = await redis.cmd('KEYS', lockPattern)
      return locks.length === 0
    },
    { timeout: 5_000, what: 'every lock key to be released' },
  ).then(
    () => true,
    () => false,
  )
  assert.ok(released, `no lock key is left behind 5 s after the loads ended: ${JSON.stringify(locks)}`)
})

test('the invalidation inbox is deduplicated and capped; on overflow the in-process tier is dropped', { timeout: TEST_TIMEOUT }, async (t) => {
  const origin = 'someone-else' // not any instance's origin

  /** Its own redis that lets a subscriber take a whole flood (no output-buffer limit disconnects it). */
  async function floodSetup(t) {
    const env = await setup(t)
    await env.redis.cmd('CONFIG', 'SET', 'client-output-buffer-limit', 'pubsub 0 0 0')
    return env
  }

  /**
   * PUBLISHes `messages` where the instances of `namespace` listen (PUBSUB CHANNELS: `<ns>:bus:0`
   * by the design, so this measures the inbox, not the channel name) and waits until the
   * subscriber has read them all.
   */
  async function flood(redis, namespace, messages) {
    const channels = await redis.cmd('PUBSUB', 'CHANNELS', `${namespace}:bus*`)
    assert.ok(channels.length >= 1, `an instance of ${namespace} is subscribed to its bus`)
    for (const channel of channels) await publishAll(redis, channel, messages)
    await waitFor(() => deliveredToSubscribers(redis), { timeout: 30_000, interval: 100, what: 'the announcements to reach the subscriber' })
    await sleep(1_000) // what is still in the socket buffers is read by then
  }

  await t.test('100k announcements of one 1 KB key: one inbox entry, bounded memory', async (t) => {
    const { redis, namespace, spawnWorker } = await floodSetup(t)
    const a = await spawnWorker('a')
    const bigKey = `big:${'x'.repeat(1_020)}` // 1,024 bytes
    const warm = await a.request('run', {
      args: { keys: [bigKey, 'a1', 'a2', 'a3'] },
      body: `
        for (const k of args.keys) {
          const r = await tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { value: k.length })))
          if (!r.ok) throw new Error(r.message)
        }
        return { rss: process.memoryUsage().rss, debug: cache._debugCounts() }
      `,
    })
    await flood(
      redis,
      namespace,
      Array.from({ length: 100_000 }, () => `${origin} ${bigKey}`),
    )
    // No cache call here: an idle instance never drains its inbox by reading.
    const after = await a.request('run', { body: `return { rss: process.memoryUsage().rss, debug: cache._debugCounts() }` })
    const growthMb = (after.rss - warm.rss) / 2 ** 20
    note(t, `RSS ${(warm.rss / 2 ** 20).toFixed(0)} -> ${(after.rss / 2 ** 20).toFixed(0)} MB (+${growthMb.toFixed(1)}), inboxKeys=${after.debug.inboxKeys}`)
    assert.ok(growthMb < 30, `100k announcements of one key must not grow an idle instance's RSS by ${growthMb.toFixed(1)} MB`)
    assert.equal(typeof after.debug.inboxKeys, 'number', '_debugCounts() reports inboxKeys')
    assert.ok(after.debug.inboxKeys <= 1, `one key announced 100k times waits once: inboxKeys=${after.debug.inboxKeys}`)
  })

  await t.test('20k announcements of distinct keys: the inbox stays capped and the overflow drops the in-process tier', async (t) => {
    const { redis, namespace, spawnWorker, vkey } = await floodSetup(t)
    const b = await spawnWorker('b')
    const kept = Array.from({ length: 20 }, (_, i) => `kept:${i}`)
    const warm = await b.request('run', {
      args: { keys: kept },
      body: `
        for (const k of args.keys) {
          const r = await tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { value: 'first' })))
          if (!r.ok) throw new Error(r.message)
        }
        return cache._debugCounts()
      `,
    })
    assert.equal(warm.entries, kept.length, 'B holds its entries in process')
    // Gone from Redis without an announcement: a read that does not come from B's own copy must load.
    await redis.cmd('DEL', ...kept.map((k) => vkey(k)))
    await flood(
      redis,
      namespace,
      Array.from({ length: 20_000 }, (_, i) => `${origin} flood:${i}`),
    )
    const counts = await b.request('run', { body: `return cache._debugCounts()` })
    const reread = await b.request('run', {
      args: { keys: kept },
      body: `
        const before = tools.snapshot().loaderCalls
        const out = []
        for (const k of args.keys) out.push(await tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { value: 'second' }))))
        return { out, loaderCalls: tools.snapshot().loaderCalls - before }
      `,
    })
    note(t, `inboxKeys=${counts.inboxKeys}; re-reads of ${kept.length} kept keys called the loader ${reread.loaderCalls} times`)
    for (const [i, r] of reread.out.entries()) assert.ok(r.ok, `re-read of ${kept[i]} rejected: ${r.code} ${r.message}`)
    // None of the kept keys was announced: only a dropped tier explains a reload of every one.
    assert.equal(reread.loaderCalls, kept.length, 'after the inbox overflowed, no in-process entry is served (every kept key loads again)')
    assert.deepEqual(
      reread.out.map((r) => r.value),
      kept.map(() => 'second'),
    )
    assert.equal(typeof counts.inboxKeys, 'number', '_debugCounts() reports inboxKeys')
    assert.ok(counts.inboxKeys <= 10_000, `the inbox is capped at 10,000 keys: ${counts.inboxKeys}`)
  })
})

test('lock releases after close() share one connection; the bus does not cross db indexes', { timeout: TEST_TIMEOUT }, async (t) => {
  await t.test('50 loads holding locks at close(): their releases do not open a connection each', async (t) => {
    const { redis, namespace, spawnWorker } = await setup(t)
    const n = 50
    const w = await spawnWorker('closer')
    const started = await w.request('run', {
      args: { n },
      body: `
        globalThis.heldReads = []
        for (let i = 0; i < args.n; i++) {
          const k = 'held:' + i
          globalThis.heldReads.push(tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { ms: 1500 }))))
        }
        const t0 = Date.now()
        while (tools.snapshot().loaderCalls < args.n && Date.now() - t0 < 10000) await tools.sleep(10)
        return tools.snapshot().loaderCalls
      `,
    })
    assert.equal(started, n, 'every load started')
    assert.equal((await redis.cmd('KEYS', `${namespace}:lock:*`)).length, n, 'every running load holds its lock')
    const before = Number((await redis.info('stats')).total_connections_received)
    // No raw command from here to the count below: every new connection is the closed cache's.
    await w.request('run', {
      body: `
        await cache.close()
        await Promise.all(globalThis.heldReads)
        const t0 = Date.now()
        while ([...tools.loads.values()].some((recs) => recs.some((r) => r.end === null)) && Date.now() - t0 < 10000) await tools.sleep(20)
        await tools.sleep(500) // the releases that follow the loads' ends
        return true
      `,
    })
    const [stats, locksLeft] = await redis.pipeline([
      ['INFO', 'stats'],
      ['KEYS', `${namespace}:lock:*`],
    ])
    const after = Number(/total_connections_received:(\d+)/.exec(stats)[1])
    const newConnections = after - before - 1 // minus this INFO's own connection
    note(t, `connections opened by the closed cache for ${n} lock releases: ${newConnections}; locks left: ${locksLeft.length}`)
    assert.ok(newConnections <= 3, `the lock releases after close() reuse one connection: ${newConnections} new connections for ${n} releases`)
    assert.deepEqual(locksLeft, [], 'every lock held at close() was released when its load ended')
  })

  await t.test('same namespace on db 0 and db 1: a write on db 1 does not drop db 0 copies', async (t) => {
    const { redis, spawnWorker, vkey } = await setup(t)
    const k = 'shared-name'
    const [x, x1, y] = await Promise.all([
      spawnWorker('x-db0', { redis: `${redis.url}/0` }),
      spawnWorker('x-db1', { redis: `${redis.url}/1` }),
      spawnWorker('y-db1', { redis: `${redis.url}/1` }),
    ])
    const r1 = await x1.request('read', { key: k, loader: { value: 'x1' } })
    assert.equal(r1.loaderCallsDuring, 1)
    const r0 = await x.request('read', { key: k, loader: { value: 'x' } })
    assert.equal(r0.loaderCallsDuring, 1, 'X (db 0) loads k once')
    // A Redis read by X would now miss and call its loader: only X's in-process copy still says 'x'.
    assert.equal(await redis.cmd('DEL', vkey(k)), 1, "X's value of k is in db 0")
    const xBefore = (await x.request('snapshot')).stats
    const s = await y.request('set', { key: k, value: 'y' })
    assert.ok(s.ok, `Y's set on db 1 resolved: ${s.message}`)
    await sleep(300)

    // Control: the announcement did reach the other instance on db 1.
    const c = await x1.request('read', { key: k, loader: { value: 'x1-again' } })
    assert.equal(c.results[0].value, 'y', 'an instance on the same db drops its copy and reads the new value')

    const r = await x.request('read', { key: k, loader: { value: 'x-again' } })
    const xAfter = (await x.request('snapshot')).stats
    note(
      t,
      `X on db 0 after Y's set on db 1: ${JSON.stringify(r.results[0].value)}, loader calls ${r.loaderCallsDuring}, l2Hits ${xBefore.l2Hits}->${xAfter.l2Hits}, misses ${xBefore.misses}->${xAfter.misses}`,
    )
    assert.ok(r.results[0].ok, r.results[0].message)
    assert.equal(r.loaderCallsDuring, 0, "a write on db 1 does not drop X's copy on db 0 (X had to load again)")
    assert.equal(r.results[0].value, 'x', 'X still serves its own value of k')
    assert.equal(xAfter.l2Hits, xBefore.l2Hits, 'X made no Redis read for k')
    assert.equal(xAfter.misses, xBefore.misses, 'X made no Redis read for k')
    assert.equal(xAfter.hits, xBefore.hits + 1, 'X served k from its in-process tier')
  })
})

test('after a connection is killed, an idle cache goes back to Redis by itself: its next load is written back', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, base, vkey } = await setup(t)
  const reports = []
  // No in-process tier and a short ttl: Redis alone holds the value, stale by the time it is read again.
  const cache = new StampedeCache({ ...base, ttl: 200, hardTtl: 60_000, l1: false, onError: (err) => reports.push(err.message) })
  t.after(() => cache.close())
  assert.equal(await cache.getOrLoad('k', () => 'v1'), 'v1')
  await eventually(async () => envelopeValue(await redis.cmd('GET', vkey('k'))) === 'v1', { what: "k's first value in Redis" })

  // A connection kill (Redis stays up): the next command fails on the dead connection.
  assert.ok((await redis.cmd('CLIENT', 'KILL', 'TYPE', 'normal')) >= 1)
  assert.equal(await cache.getOrLoad('other', () => 'o'), 'o', 'a read that meets the dead connection is served')
  await eventually(() => cache.stats().redisErrors > 0, { what: 'the failure counted' })

  // Idle, with no call to probe Redis, for longer than the probe interval and a command timeout.
  await sleep(2_000)
  let loads = 0
  await cache.getOrLoad('k', () => {
    loads++
    return 'v2'
  })
  await eventually(async () => envelopeValue(await redis.cmd('GET', vkey('k'))) === 'v2', {
    timeout: 5_000,
    what: `the load after the idle time written back (reports: ${reports.join('; ')})`,
  })
  assert.equal(loads, 1)
})
