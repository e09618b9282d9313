'use strict'
// Changes Redis could not take are replayed (docs/CONTRACT.md, "The rest"): a set, delete,
// deleteByTag or clear made while Redis is paused or cut off is applied in process, rejected with
// ERR_REDIS and err.queued === true, and replayed in order once Redis answers, so other instances
// converge without the caller retrying; a replay never replaces a newer write by another
// instance (the time the change was made decides); at most 10,000 changes wait, the oldest past
// that dropped, counted and reported.
//
// Real worker processes (__test__/fixtures/redis-worker.js) share a private redis-server; faults
// are a paused server (SIGSTOP) and a cut connection (helpers/tcp-proxy.js). Final states are
// read from Redis directly.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, killAllSync, sleep } = require('./helpers/redis-server')
const { TcpProxy } = require('./helpers/tcp-proxy')
const { eventually } = require('./helpers/eventually')

/** Polls `holds` until it is true (eventually retries what throws). */
const until = (holds, what, timeout = 15_000) =>
  eventually(
    async () => {
      if (!(await holds())) throw new Error('not yet')
    },
    { timeout, what },
  )

const TEST_TIMEOUT = 60_000

after(() => killAllSync())

const setup = (t, options = {}) => setupRedis(t, { options, prefix: 'screplay' })

/** Runs `ops` ([op, ...args]) one after another on `w`: each one's outcome, with err.queued. */
function changes(w, ops) {
  return w.request('run', {
    args: ops,
    body: `
      const out = []
      for (const [op, ...rest] of args) {
        try {
          await cache[op](...rest)
          out.push({ ok: true })
        } catch (err) {
          out.push({ ok: false, code: err.code, queued: err.queued, message: err.message })
        }
      }
      return { out, stats: cache.stats() }
    `,
  })
}

const stats = (w) => w.request('run', { body: 'return cache.stats()' })
const read = (w, keys) => w.request('run', { args: keys, body: 'return Promise.all(args.map(async (k) => (await cache.get(k)) ?? null))' })

test('a paused Redis: the changes are rejected as queued, replayed in order, and another instance converges without a retry', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, stored } = await setup(t)
  const a = await spawnWorker('a')
  const b = await spawnWorker('b')
  await changes(a, [
    ['set', 'k1', 'v0'],
    ['set', 'k2', 'gone soon'],
    ['set', 'tagged', 'tagged', { tags: ['t'] }],
  ])
  // b holds every key in process: it must hear of each replayed change.
  assert.deepEqual(await read(b, ['k1', 'k2', 'tagged']), ['v0', 'gone soon', 'tagged'])

  redis.pause()
  const during = await changes(a, [
    ['set', 'k1', 'v1'],
    ['set', 'k1', 'v2'],
    ['delete', 'k2'],
    ['set', 'k3', { n: 3 }],
    ['deleteByTag', 't'],
  ])
  for (const r of during.out) {
    assert.equal(r.ok, false, JSON.stringify(r))
    assert.equal(r.code, 'ERR_REDIS')
    assert.equal(r.queued, true, 'err.queued')
    assert.match(r.message, /replayed/, 'the message says it will be replayed')
  }
  assert.equal(during.stats.replayQueued, 5)
  // Applied in process at once.
  assert.deepEqual(await read(a, ['k1', 'k2', 'k3', 'tagged']), ['v2', null, { n: 3 }, null])
  redis.resume()
  const resumed = Date.now()

  await until(async () => (await stats(a)).replayQueued === 0, 'the queue drained', 15_000)
  t.diagnostic(`5 changes queued while paused, replayed within ${Date.now() - resumed} ms of the resume`)
  assert.equal((await stored('k1')).value, 'v2', 'the last set of k1 won: replayed in order')
  assert.equal((await stored('k2')).exists, false)
  assert.deepEqual((await stored('k3')).value, { n: 3 })
  await until(
    async () => JSON.stringify(await read(b, ['k1', 'k2', 'k3', 'tagged'])) === JSON.stringify(['v2', null, { n: 3 }, null]),
    "b sees a's final state",
    5_000,
  )
  assert.equal((await stats(a)).replayDropped, 0)
})

test('expire and expireByTag made while Redis is paused are queued and replayed: another instance then serves those entries stale while one refresh runs', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  const a = await spawnWorker('a')
  const b = await spawnWorker('b')
  await changes(a, [
    ['set', 'e1', 'v1', { ttl: 60_000 }],
    ['set', 'e2', 'v2', { ttl: 60_000, tags: ['t'] }],
    ['set', 'e3', 'v3', { ttl: 60_000 }],
  ])
  assert.deepEqual(await read(b, ['e1', 'e2', 'e3']), ['v1', 'v2', 'v3'])

  redis.pause()
  const during = await changes(a, [
    ['expire', 'e1'],
    ['expireByTag', 't'],
  ])
  for (const r of during.out) {
    assert.equal(r.ok, false, JSON.stringify(r))
    assert.equal(r.code, 'ERR_REDIS')
    assert.equal(r.queued, true, 'err.queued')
  }
  assert.equal(during.stats.replayQueued, 2)
  redis.resume()
  await until(async () => (await stats(a)).replayQueued === 0, 'the queue drained', 15_000)
  const e1 = JSON.parse(await redis.cmd('GET', vkey('e1')))
  assert.ok(e1.freshUntil <= Date.now(), `e1 is stale in Redis (freshUntil ${e1.freshUntil})`)
  assert.equal(e1.value, 'v1', 'and keeps its value')
  const e3 = JSON.parse(await redis.cmd('GET', vkey('e3')))
  assert.ok(e3.freshUntil > Date.now(), 'e3, neither expired nor tagged, stays fresh')
  // b heard of both: each is served stale at once while a refresh loads it, then refreshed.
  const refresh = (keys) => b.request('run', { args: keys, body: "return Promise.all(args.map((k) => cache.getOrLoad(k, async () => 'fresh ' + k)))" })
  await until(
    async () => {
      const now = await refresh(['e1', 'e2', 'e3'])
      return now[0] === 'fresh e1' && now[1] === 'fresh e2'
    },
    'b refreshed the expired entries',
    10_000,
  )
  assert.deepEqual(await read(b, ['e3']), ['v3'], 'e3 was never refreshed')
  assert.equal((await stats(a)).replayDropped, 0)
})

test('a cut connection: a newer write by another instance during the outage is not replaced by the replay; an older one a did not see is invalidated', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, stored } = await setup(t)
  const proxy = new TcpProxy(redis.port)
  t.after(() => proxy.close())
  await proxy.start()
  const a = await spawnWorker('a', { redis: `redis://127.0.0.1:${proxy.port}` })
  const b = await spawnWorker('b')
  await changes(a, [['set', 'warm', 1]])
  assert.equal((await stored('warm')).value, 1, 'a writes through the proxy')

  proxy.cut()
  // b writes j first, then a: a's change is the newer one. a writes k and d first, then b.
  assert.equal((await changes(b, [['set', 'j', 'b older']])).out[0].ok, true)
  await sleep(5)
  const cutOff = await changes(a, [
    ['set', 'j', 'a newer'],
    ['set', 'k', 'a older'],
    ['delete', 'd'],
    ['set', 'only-a', 'a alone'],
  ])
  assert.ok(
    cutOff.out.every((r) => !r.ok && r.code === 'ERR_REDIS' && r.queued === true),
    JSON.stringify(cutOff.out),
  )
  await sleep(5)
  assert.deepEqual(
    (
      await changes(b, [
        ['set', 'k', 'b newer'],
        ['set', 'd', 'b set after the delete'],
      ])
    ).out,
    [{ ok: true }, { ok: true }],
  )
  proxy.mend()

  await until(async () => (await stats(a)).replayQueued === 0, 'the queue drained', 15_000)
  assert.equal((await stored('k')).value, 'b newer', "b's newer set is not replaced by a's older one")
  assert.equal((await stored('d')).value, 'b set after the delete', "nor by a's older delete")
  // a held nothing of j when it set it: b's older set, which a never saw, cannot be told from a
  // load made after a's set (which a's value must not replace), so the replay deletes j instead.
  assert.equal((await stored('j')).exists, false, "a's newer set over a write it did not see invalidates the key")
  assert.equal((await stored('only-a')).value, 'a alone')
  // a's own copies of what it lost give way to b's values, and to j's absence.
  await until(
    async () => JSON.stringify(await read(a, ['k', 'd', 'j'])) === JSON.stringify(['b newer', 'b set after the delete', null]),
    "a serves b's newer values",
    5_000,
  )
  await until(async () => JSON.stringify(await read(b, ['j', 'only-a'])) === JSON.stringify([null, 'a alone']), "b sees a's replayed changes", 5_000)
})

test('at most 10,000 changes wait: the oldest past that are dropped, each counted and reported', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, stored } = await setup(t)
  const a = await spawnWorker('a')
  await changes(a, [['set', 'warm', 1]])
  redis.pause()
  t.after(() => redis.resume())
  const over = 37
  const outcome = await a.request(
    'run',
    {
      args: { n: 10_000 + over },
      body: `
        // The first alone: it meets the paused server (and times out); the rest find Redis down.
        let queued = (await cache.set('b0', 0).catch((e) => e))?.queued === true ? 1 : 0
        for (let i = 1; i < args.n; i += 500) {
          const batch = []
          for (let j = i; j < Math.min(args.n, i + 500); j++) batch.push(cache.set('b' + j, j).catch((e) => e))
          for (const r of await Promise.all(batch)) if (r && r.queued === true) queued++
        }
        const s = tools.snapshot()
        return { namespace: tools.options.namespace, queued, stats: s.stats, replayReports: s.onError.samples.filter((x) => x.op === 'redis:replay').length, onError: s.onError.count }
      `,
    },
    { timeout: 50_000 },
  )
  assert.equal(outcome.queued, 10_000 + over, 'every one was rejected as queued')
  assert.equal(outcome.stats.replayQueued, 10_000)
  assert.equal(outcome.stats.replayDropped, over)
  assert.ok(outcome.replayReports >= Math.min(over, 100), `each dropped change reported to onError: ${JSON.stringify(outcome)}`)
  redis.resume()
  const resumed = Date.now()
  await until(async () => (await stats(a)).replayQueued === 0, 'the queue drained', 40_000)
  t.diagnostic(
    `${10_000 + over} changes while paused: ${outcome.stats.replayQueued} queued, ${outcome.stats.replayDropped} dropped; replayed within ${Date.now() - resumed} ms of the resume`,
  )
  // The oldest went: b0 (whose own attempt timed out in the paused server's socket, which ran it
  // once resumed: it may be there) and the 36 after it, in the order the sets were made, however
  // their writes ran; those were never sent (Redis was known down by then).
  const { namespace } = outcome
  const exists = await redis.pipeline(
    Array.from({ length: 10_000 + over - 1 }, (_, i) => ['EXISTS', `${namespace}:v:{b${i + 1}}`]),
    { timeout: 30_000 },
  )
  const absent = exists.flatMap((e, i) => (e === 0 ? [i + 1] : []))
  assert.deepEqual(
    absent,
    Array.from({ length: over - 1 }, (_, i) => i + 1),
    'b1 to b36 were dropped, and no other',
  )
  assert.equal((await stored(`b${10_000 + over - 1}`)).value, 10_000 + over - 1, 'the newest was replayed')
})

test('a clear made while Redis is paused is replayed before the set made after it: every instance keeps that set alone', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, stored } = await setup(t)
  const a = await spawnWorker('a')
  const b = await spawnWorker('b')
  await changes(a, [
    ['set', 'x', 'before'],
    ['set', 'y', 'before'],
  ])
  assert.deepEqual(await read(b, ['x', 'y']), ['before', 'before'])
  redis.pause()
  const during = await changes(a, [['clear'], ['set', 'y', 'after the clear']])
  assert.ok(
    during.out.every((r) => !r.ok && r.queued === true),
    JSON.stringify(during.out),
  )
  redis.resume()
  await until(async () => (await stats(a)).replayQueued === 0, 'the queue drained')
  assert.equal((await stored('y')).value, 'after the clear')
  await until(async () => JSON.stringify(await read(b, ['x', 'y'])) === JSON.stringify([null, 'after the clear']), 'b sees the clear, then the set', 5_000)
  assert.deepEqual(await read(a, ['x', 'y']), [null, 'after the clear'])
  // The clear's sweep removed x's value key.
  await until(async () => !(await stored('x')).exists, 'x swept', 5_000)
})

test('close() with changes waiting for replay: the call waiting behind them settles, and nothing is replayed after', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, stored } = await setup(t)
  const a = await spawnWorker('a')
  await changes(a, [['set', 'w', 1]])
  redis.pause()
  const r = await a.request('run', {
    body: `
      // The first meets the paused server (Redis runs it once resumed); then Redis is down.
      await cache.set('p', 1).catch(() => {})
      const first = await cache.set('q', 1).catch((e) => e.queued)
      // Behind the first: waits for its replay.
      const behind = cache.set('q', 2).then(() => 'resolved', (e) => e.code + ':' + e.queued)
      await tools.sleep(50)
      await cache.close()
      return { first, behind: await behind }
    `,
  })
  assert.equal(r.first, true)
  assert.match(r.behind, /^ERR_REDIS:(true|false|undefined)$/, 'settled, not left hanging')
  redis.resume()
  await sleep(500)
  assert.equal((await stored('q')).exists, false, 'nothing replayed after close')
})

// ---- what a replayed set expects of its key (issue 37) -------------------------------------
// A set queued while this instance was cut off carries what it knew of the key in Redis then: the
// write it held in process, none (its own queued delete before it), or nothing known. Replayed
// over a key that changed in a way it did not see (a delete, a load, another write), it becomes
// an invalidation: every instance's next read loads from the source of truth.

/** `a` reaches Redis through a proxy the test cuts; `b` directly. `seed`: changes `b` makes
 * before `a` starts, so `a` never hears their announcements (one heard after `a` read the key
 * would drop its copy, and it would hold nothing of the key). */
async function cutOffWorld(t, seed = []) {
  const world = await setup(t)
  const proxy = new TcpProxy(world.redis.port)
  t.after(() => proxy.close())
  await proxy.start()
  const b = await world.spawnWorker('b')
  assert.ok((await changes(b, seed)).out.every((r) => r.ok))
  const a = await spawnWorkerThrough(world, proxy)
  return { ...world, proxy, a, b }
}

const spawnWorkerThrough = (world, proxy) => world.spawnWorker('a', { redis: `redis://127.0.0.1:${proxy.port}` })

/** One getOrLoad of `key` on `w` whose loader gives `value`: what it served, and whether it loaded. */
async function load(w, key, value) {
  const r = await w.request('read', { key, loader: { value } })
  assert.equal(r.results[0].ok, true, JSON.stringify(r.results[0]))
  return { value: r.results[0].value, loads: r.loaderCallsDuring }
}

/** `ops` made on `a` while it is cut off: each rejected as queued. */
async function queuedOn(a, ops) {
  const during = await changes(a, ops)
  assert.ok(
    during.out.every((r) => !r.ok && r.code === 'ERR_REDIS' && r.queued === true),
    JSON.stringify(during.out),
  )
}

/** Mends the proxy and waits until Redis holds `fence`, a set queued after the changes of interest:
 * the drain replays in order, one at a time, so every change queued before it has been applied. */
async function replayedUpTo(proxy, stored, fence) {
  proxy.mend()
  await until(async () => (await stored(fence)).exists, `a's replay reached ${fence}`)
}

/** a holds k (v0, read from Redis), is cut off, and queues a set of k to v1, then one of `fence`. */
async function heldThenCutOff(t) {
  const world = await cutOffWorld(t, [['set', 'k', 'v0']])
  assert.deepEqual(await read(world.a, ['k']), ['v0'], 'a holds k, read from Redis')
  world.proxy.cut()
  await queuedOn(world.a, [
    ['set', 'k', 'v1'],
    ['set', 'fence', 1],
  ])
  return world
}

test('a replayed set does not bring back a key another instance deleted during the outage: both instances then load it', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { a, b, proxy, stored } = await heldThenCutOff(t)
  assert.deepEqual((await changes(b, [['delete', 'k']])).out, [{ ok: true }])
  await replayedUpTo(proxy, stored, 'fence')

  assert.equal((await stored('k')).exists, false, "a's older set did not bring the deleted key back")
  const fromA = await load(a, 'k', 'from the source')
  const fromB = await load(b, 'k', 'from the source')
  assert.deepEqual([fromA.value, fromB.value], ['from the source', 'from the source'], 'never v1')
  assert.equal(fromA.loads + fromB.loads, 1, 'one load between them: the first read loads, the second reads its result')
})

test('a replayed set does not overwrite what another instance loaded after its delete: no instance serves the replayed value', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { a, b, proxy, stored } = await heldThenCutOff(t)
  assert.deepEqual((await changes(b, [['delete', 'k']])).out, [{ ok: true }])
  assert.deepEqual(await load(b, 'k', 'v2'), { value: 'v2', loads: 1 }, 'b reloads k after its delete')
  await replayedUpTo(proxy, stored, 'fence')

  assert.notEqual((await stored('k')).value, 'v1', 'Redis does not hold the replayed value')
  const fromA = await load(a, 'k', 'v3')
  const fromB = await load(b, 'k', 'v3')
  assert.notEqual(fromA.value, 'v1', 'a does not serve it')
  assert.notEqual(fromB.value, 'v1', 'b does not serve it')
  // b hears the replay's invalidation and drops its copy of v2; from then on both agree.
  await until(async () => (await load(b, 'k', 'v3')).value === (await load(a, 'k', 'v3')).value, 'a and b serve the same value of k', 5_000)
})

test('a replayed set over the very write it held is applied: another instance reads it without a load', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { a, b, proxy, stored } = await heldThenCutOff(t)
  await replayedUpTo(proxy, stored, 'fence')
  assert.equal((await stored('k')).value, 'v1')
  assert.deepEqual(await load(b, 'k', 'from the source'), { value: 'v1', loads: 0 })
  assert.deepEqual(await load(a, 'k', 'from the source'), { value: 'v1', loads: 0 })
})

test('queued sets of one key replay as a chain: each expects what the one before it leaves, and the last is applied', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { a, b, proxy, stored } = await cutOffWorld(t)
  await changes(a, [['set', 'k', 'v0']])
  proxy.cut()
  await queuedOn(a, [
    ['set', 'k', 'v1'],
    ['set', 'k', 'v2'],
    ['delete', 'k'],
    ['set', 'k', 'v3'],
    ['set', 'never-held', 'n'],
    ['set', 'fence', 1],
  ])
  await replayedUpTo(proxy, stored, 'fence')
  assert.equal((await stored('k')).value, 'v3', 'v3 expects the absence its delete left')
  assert.equal((await stored('never-held')).value, 'n', 'a key a never held, absent in Redis, takes its set')
  assert.deepEqual(await load(b, 'k', 'from the source'), { value: 'v3', loads: 0 })
  assert.deepEqual(await load(b, 'never-held', 'from the source'), { value: 'n', loads: 0 })
})
