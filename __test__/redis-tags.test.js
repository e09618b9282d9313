'use strict'
// Tags and clear with Redis, across real processes (docs/CONTRACT.md: deleteByTag, clear, getOrLoad
// 10, l1.maxBytes, serializer, stats): tags and clear in three processes, and what they cost in
// Redis; deleteByTag and clear fenced against a slow load; a set just after a deleteByTag made
// elsewhere; deleteByTag and clear while Redis is down; skipCache and setTtl across processes;
// the byte budget with 10 KB and oversized values (l2Hits); every type the v8 serializer claims,
// read back by another process with l1: false; another serializer's entry is a miss; and
// deleteByTag and clear on a Redis Cluster.
//
// Every test starts its own redis-server on a free 127.0.0.1 port (the cluster test its own
// three masters) and real worker processes (__test__/fixtures/redis-worker.js), each with its own
// StampedeCache. Races are made deterministic with gated loaders run through the worker's `run`
// command. Assertions are on loader calls and final states in every instance and in Redis.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, newNamespace: newNamespaceOf, CacheWorker, waitFor, sleep, killAllSync } = require('./helpers/redis-server')
const { RedisCluster, killTopologySync } = require('./helpers/redis-topology')
const { eventually, busFlushed } = require('./helpers/eventually')

/** A hang fails its test instead of blocking the run. */
const TEST_TIMEOUT = 60_000

after(() => {
  killAllSync()
  killTopologySync()
})

const newNamespace = () => newNamespaceOf('sctags')

/** Commands Redis ran that do work: the ECHO pipelined with each command to prove its reply in
 * place is left out. */
async function workCommands(redis) {
  const info = await redis.info('all')
  const echo = /calls=(\d+)/.exec(info.cmdstat_echo ?? '')
  return Number(info.total_commands_processed) - Number(echo?.[1] ?? 0)
}

/** Its own redis-server; `options` are every worker's (see setupRedis). */
const setup = (t, options = {}) => setupRedis(t, { options, prefix: 'sctags' })

/** Runs `body` in `w` (an async function of cache, args, tools) and returns its result. */
function run(w, body, args = {}) {
  return w.request('run', { body, args })
}

/** What `w` serves for `key` from cache: `{ value, loaded }` (loaded: its loader had to run). */
async function serves(w, key) {
  const r = await w.request('read', { key, loader: { value: 'LOADED' } })
  const x = r.results[0]
  assert.ok(x.ok, `${w.name}: getOrLoad(${key}) rejected: ${x.code} ${x.message}`)
  return { value: x.undef ? undefined : x.value, loaded: r.loaderCallsDuring > 0 }
}

async function assertServed(workers, key, expected, label) {
  for (const w of workers) {
    const s = await serves(w, key)
    assert.equal(s.loaded, false, `${label}: ${w.name} had to load ${key}`)
    assert.deepEqual(s.value, expected, `${label}: ${w.name} serves ${JSON.stringify(s.value)} for ${key}`)
  }
}

async function assertGone(workers, key, label) {
  for (const w of workers) {
    const g = await w.request('get', { key })
    assert.ok(g.ok, `${label}: ${w.name} get(${key}) rejected: ${g.message}`)
    assert.ok(g.undef, `${label}: ${w.name} still serves ${JSON.stringify(g.value)} for ${key}`)
  }
}

// Loads args.keys, each tagged as args.tags[key] says: by getOrLoad options, by ctx.setTags, or
// by set (args.how[key]); returns what each call resolved with.
const FILL = `
  const out = {}
  for (const key of args.keys) {
    const tags = args.tags[key]
    const how = args.how?.[key] ?? 'options'
    if (how === 'set') {
      await cache.set(key, 'set:' + key, tags ? { tags } : undefined)
      out[key] = 'set:' + key
    } else if (how === 'ctx') {
      out[key] = await cache.getOrLoad(key, (ctx) => { if (tags) ctx.setTags(tags); return 'ctx:' + key })
    } else {
      out[key] = await cache.getOrLoad(key, () => 'opt:' + key, tags ? { tags } : undefined)
    }
  }
  return out
`

// A gated load: its loader reports when it starts and returns once the test opens the gate
// (then it calls ctx.setTags(args.setTags) if given). Gates live on globalThis.
const START_GATED = `
  const gates = (globalThis.__gates ??= new Map())
  const g = { calls: 0 }
  g.gate = new Promise((resolve) => (g.open = resolve))
  gates.set(args.name, g)
  const loader = async (ctx) => {
    g.calls++
    tools.ready()
    await g.gate
    if (args.setTags) ctx.setTags(args.setTags)
    return args.value
  }
  return tools.outcome(args.opts ? cache.getOrLoad(args.key, loader, args.opts) : cache.getOrLoad(args.key, loader))
`
const OPEN_GATE = `globalThis.__gates.get(args.name).open(); return true`

async function startGated(w, args) {
  const r = w.start('run', { body: START_GATED, args })
  await Promise.race([r.ready, r.result])
  return { result: r.result, open: () => run(w, OPEN_GATE, { name: args.name }) }
}

// ---------------------------------------------------------------------------------------------

test('tags across three processes: deleteByTag in one drops the tagged entries in all three, and only those', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, namespace, spawnWorker, vkey } = await setup(t)
  const [A, B, C] = await Promise.all(['A', 'B', 'C'].map((n) => spawnWorker(n)))
  const keys = ['u1:profile', 'u1:feed', 'u1:set', 'u2:profile', 'plain']
  const tags = { 'u1:profile': ['user:1'], 'u1:feed': ['feed', 'user:1'], 'u1:set': ['user:1'], 'u2:profile': ['user:2'] }
  const how = { 'u1:feed': 'ctx', 'u1:set': 'set' }
  const filled = await run(A, FILL, { keys, tags, how })
  // B and C read everything from Redis (l2Hits), then serve it in process.
  for (const w of [B, C]) for (const k of keys) assert.deepEqual(await serves(w, k), { value: filled[k], loaded: false }, `${w.name} ${k}`)
  const bStats = (await B.request('snapshot')).stats
  assert.equal(bStats.l2Hits, keys.length, 'B read each key from Redis once')
  await assertServed([A, B, C], 'u1:feed', filled['u1:feed'], 'before')

  const before = await workCommands(redis)
  const d = await run(C, `await cache.deleteByTag(args.tag); return true`, { tag: 'user:1' })
  const commands = (await workCommands(redis)) - before
  assert.equal(d, true)
  await busFlushed([A, B, C])

  for (const k of ['u1:profile', 'u1:feed', 'u1:set']) await assertGone([A, B, C], k, 'after deleteByTag(user:1)')
  await assertServed([A, B, C], 'u2:profile', filled['u2:profile'], 'another tag')
  await assertServed([A, B, C], 'plain', filled.plain, 'untagged')
  // deleteByTag touches no entry: the value keys are still in Redis, dead by their born clock.
  assert.notEqual(await redis.cmd('GET', vkey('u1:profile')), null)
  assert.equal(await redis.cmd('GET', `${namespace}:tag:{user:1}`), await redis.cmd('HGET', `${namespace}:meta`, 'clock'))
  assert.ok(commands < 15, `deleteByTag sent ${commands} Redis commands`)

  // Loaded again after the deleteByTag: kept, and shared again.
  const again = await A.request('read', { key: 'u1:profile', opts: { tags: ['user:1'] }, loader: { value: 'fresh' } })
  assert.equal(again.results[0].value, 'fresh')
  assert.equal(again.loaderCallsDuring, 1)
  await busFlushed([A, B, C])
  for (const w of [B, C]) assert.deepEqual(await serves(w, 'u1:profile'), { value: 'fresh', loaded: false }, w.name)
})

test("deleteByTag's cost does not grow with the tagged keys: a tag on 3,000 keys costs what a tag on 3 does", { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker } = await setup(t)
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  await run(
    A,
    `
    for (let i = 0; i < 3000; i += 100) {
      await Promise.all(Array.from({ length: 100 }, (_, j) => cache.set('many:' + (i + j), i + j, { tags: ['many'] })))
    }
    for (let i = 0; i < 3; i++) await cache.set('few:' + i, i, { tags: ['few'] })
    return true
  `,
  )
  await busFlushed([A, B])
  const cost = async (tag) => {
    const before = await workCommands(redis)
    await run(B, `await cache.deleteByTag(args.tag); return true`, { tag })
    return (await workCommands(redis)) - before
  }
  const few = await cost('few')
  const many = await cost('many')
  t.diagnostic(`Redis commands: deleteByTag of a tag on 3 keys ${few}, on 3,000 keys ${many}`)
  assert.ok(many < 15 && few < 15, `few ${few}, many ${many}`)
  assert.ok(many <= few + 3, `the cost grew with the keys: ${few} -> ${many}`)
  await busFlushed([A, B])
  const gone = await run(
    A,
    `
    let served = 0
    for (let i = 0; i < 3000; i += 37) if ((await cache.get('many:' + i)) !== undefined) served++
    return served
  `,
  )
  assert.equal(gone, 0, 'every tagged entry is gone in A')
})

test('clear() across three processes: every entry of the namespace, in every instance and in Redis; other namespaces untouched', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, namespace, spawnWorker, vkey } = await setup(t)
  const [A, B, C] = await Promise.all(['A', 'B', 'C'].map((n) => spawnWorker(n)))
  // Another namespace whose name starts like this one's: SCAN patterns must not reach it.
  const D = await spawnWorker('D', { namespace: `${namespace}:v` })
  const keys = Array.from({ length: 40 }, (_, i) => `k${i}`)
  await run(
    A,
    `
    for (const key of args.keys) await cache.getOrLoad(key, () => 'A:' + key, key.endsWith('0') ? { tags: ['t'] } : undefined)
    await cache.set('}odd{', 'braces')
    return true
  `,
    { keys },
  )
  await run(B, `for (const key of args.keys) await cache.getOrLoad(key, () => 'B'); return true`, { keys })
  await run(D, `for (const key of args.keys) await cache.set(key, 'D:' + key); return true`, { keys })
  await assertServed([A, B, C], 'k1', 'A:k1', 'before')
  const dBefore = (await redis.cmd('KEYS', `${namespace}:v:v:*`)).length
  assert.equal(dBefore, keys.length, "D's values are in Redis")

  const r = await run(C, `await cache.clear(); return cache.stats()`)
  assert.equal(r.l1Entries, 0)
  // Polled, not behind a bus barrier: a barrier's own key would be an entry left after the clear.
  await eventually(
    async () => {
      for (const k of ['k0', 'k1', 'k39', '}odd{']) await assertGone([A, B, C], k, 'after clear')
      for (const w of [A, B]) assert.equal((await w.request('snapshot')).stats.l1Entries, 0, `${w.name} holds nothing in process`)
    },
    { what: 'the clear to reach A, B and C' },
  )
  // Swept from Redis (the check uses KEYS; clear itself never does).
  const left = (await redis.cmd('KEYS', `${namespace}:v*`)).filter((k) => k.startsWith(`${namespace}:v:{`) || k.startsWith(`${namespace}:vx:{`))
  assert.deepEqual(left, [], 'no value key of the namespace is left')
  assert.equal(await redis.cmd('GET', vkey('k1')), null)
  assert.equal((await redis.cmd('KEYS', `${namespace}:v:v:*`)).length, keys.length, "D's values are untouched")
  await assertServed([D], 'k1', 'D:k1', 'the other namespace')

  // The namespace works as before: one load, shared.
  const again = await B.request('read', { key: 'k1', loader: { value: 'after' } })
  assert.equal(again.loaderCallsDuring, 1)
  await busFlushed([A, B, C])
  await assertServed([A, C], 'k1', 'after', 'loaded after the clear')
})

test('clear() sweeps 20,000 keys in batches: no KEYS, entries written after it stay', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, namespace, spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { l1: false })
  // Written straight to Redis: 20,000 envelopes born at 0.
  const envelope = (i, born = 0) =>
    JSON.stringify({ sc: 1, gen: 'g', born, freshUntil: Date.now() + 600_000, hardUntil: Date.now() + 600_000, computeMs: 0, retryAfter: 0, value: i })
  for (let i = 0; i < 20_000; i += 1_000) {
    await redis.pipeline(Array.from({ length: 1_000 }, (_, j) => ['SET', `${namespace}:v:{bulk${i + j}}`, envelope(i + j)]))
  }
  // An entry born after the clear (at a clock far ahead of it): the sweep must leave it.
  await redis.cmd('SET', `${namespace}:v:{future}`, envelope('future', 1e9))
  assert.deepEqual(await serves(A, 'bulk7'), { value: 7, loaded: false })
  const keysBefore = Number((await redis.info('commandstats'))['cmdstat_keys']?.match(/calls=(\d+)/)?.[1] ?? 0)
  const cleared = run(A, `await cache.clear(); return true`)
  // A set made while the sweep runs (after clear was called) is not swept.
  await sleep(5)
  await run(A, `await cache.set('bulk5', 'new'); return true`)
  assert.equal(await cleared, true)
  const keysAfter = Number((await redis.info('commandstats'))['cmdstat_keys']?.match(/calls=(\d+)/)?.[1] ?? 0)
  assert.equal(keysAfter, keysBefore, 'clear sent no KEYS')
  assert.ok(Number((await redis.info('commandstats'))['cmdstat_scan']?.match(/calls=(\d+)/)?.[1] ?? 0) >= 2, 'clear scanned in steps')
  assert.equal((await redis.cmd('DBSIZE')) < 10, true, `keys left: ${await redis.cmd('DBSIZE')}`)
  assert.deepEqual(await serves(A, 'bulk5'), { value: 'new', loaded: false }, 'the set made after clear stays')
  assert.notEqual(await redis.cmd('GET', `${namespace}:v:{future}`), null, 'an entry born after the clear is not swept')
  assert.deepEqual(await serves(A, 'bulk6'), { value: 'LOADED', loaded: true })
})

test('fencing: a load that began before deleteByTag or clear in another process never writes its result back', { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t)
  const [A, B, C] = await Promise.all(['A', 'B', 'C'].map((n) => spawnWorker(n)))
  const cases = [
    ['tag by options', { opts: { tags: ['t'] } }, `await cache.deleteByTag('t')`],
    ['tag by ctx.setTags as the loader returns', { setTags: ['t'] }, `await cache.deleteByTag(['x', 't'])`],
    ['clear', {}, `await cache.clear()`],
  ]
  for (const [label, extra, op] of cases) {
    const key = `fence:${label.split(' ')[0]}:${label.length}`
    const load = await startGated(A, { key, name: key, value: `old:${key}`, ...extra })
    await run(B, `${op}; return true`)
    await load.open()
    const a = await load.result
    assert.ok(a.ok, `${label}: A's caller: ${a.message}`)
    assert.equal(a.value, `old:${key}`, `${label}: A's caller gets its loader's value`)
    await busFlushed([A, B, C])
    await assertGone([A, B, C], key, label)
    const c = await C.request('read', { key, loader: { value: `new:${key}` }, opts: extra.opts })
    assert.equal(c.loaderCallsDuring, 1, `${label}: C had to load (nothing was cached)`)
    assert.equal(c.results[0].value, `new:${key}`)
    await busFlushed([A, B, C])
    // A load that began after the invalidation is kept and shared.
    await assertServed([A, B], key, `new:${key}`, `${label}: after`)
  }
  // Control: a load of another tag that began before is written.
  const key = 'fence:other'
  const load = await startGated(A, { key, name: key, value: 'kept', opts: { tags: ['u'] } })
  await run(B, `await cache.deleteByTag('t'); return true`)
  await load.open()
  await load.result
  await busFlushed([A, B, C])
  await assertServed([A, B, C], key, 'kept', 'another tag')
})

test('a set made after a deleteByTag elsewhere resolved is kept, whether or not its process has heard of it yet', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, namespace, spawnWorker } = await setup(t)
  const [A, B, C] = await Promise.all(['A', 'B', 'C'].map((n) => spawnWorker(n)))
  for (let i = 0; i < 3; i++) {
    const key = `after:${i}`
    await run(A, `await cache.set(args.key, 'old', { tags: ['t'] }); return true`, { key })
    await run(B, `await cache.deleteByTag('t'); return true`)
    // At once, in another process (no wait for the bus).
    await run(C, `await cache.set(args.key, 'new', { tags: ['t'] }); return true`, { key })
    await busFlushed([A, B, C])
    await assertServed([A, B, C], key, 'new', `round ${i}`)
  }
  // The same with a deleteByTag C cannot have heard of: made in Redis as deleteByTag makes it,
  // but never announced. C's set is born at the clock C knows, which is behind Redis's.
  const meta = `${namespace}:meta`
  const clock = await redis.cmd('HINCRBY', meta, 'clock', 5)
  await redis.cmd('SET', `${namespace}:tag:{t}`, String(clock))
  await run(C, `await cache.set('unheard', 'new', { tags: ['t'] }); return true`)
  await busFlushed([A, B, C])
  await assertServed([A, B, C], 'unheard', 'new', 'a deleteByTag never announced')
})

test('after a Redis restart without persistence the namespace clock never runs backwards: a deleteByTag still drops entries written since', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  // Before the fix Redis's clock restarted at 0 while every instance still knew 3: entries were
  // born at 3, and a deleteByTag made afterwards (clock 1, or 4 from an instance's own floor)
  // could leave them alive.
  const { redis, spawnWorker } = await setup(t)
  const A = await spawnWorker('A')
  const B = await spawnWorker('B')
  for (let i = 0; i < 3; i++) assert.ok(await run(A, 'await cache.deleteByTag("unrelated"); return true'))
  await busFlushed([A, B])
  await redis.restart('SIGKILL')
  for (const w of [A, B]) {
    await waitFor(async () => (await w.request('set', { key: `probe:${w.name}`, value: 1 })).ok, {
      what: `${w.name} to reach the restarted Redis`,
      timeout: 15_000,
    })
  }
  assert.deepEqual(await run(A, FILL, { keys: ['k'], tags: { k: ['t'] } }), { k: 'opt:k' })
  // An instance started after the restart knows no clock but Redis's.
  const C = await spawnWorker('C')
  assert.ok(await run(C, 'await cache.deleteByTag("t"); return true'))
  await busFlushed([A, B, C])
  // The first read reloads it (then the others may read that from Redis); none serves the old one.
  assert.deepEqual(await serves(A, 'k'), { value: 'LOADED', loaded: true }, "A after deleteByTag('t')")
  for (const w of [B, C]) assert.equal((await serves(w, 'k')).value, 'LOADED', `${w.name} after deleteByTag('t')`)

  // And one that knew the clock before the restart: its own deleteByTag is never numbered
  // below what it knew.
  assert.deepEqual(await run(A, FILL, { keys: ['j'], tags: { j: ['u'] } }), { j: 'opt:j' })
  await redis.restart('SIGKILL')
  for (const w of [A, B]) {
    await waitFor(async () => (await w.request('set', { key: `probe:${w.name}`, value: 1 })).ok, {
      what: `${w.name} to reach the restarted Redis`,
      timeout: 15_000,
    })
  }
  assert.deepEqual(await run(A, FILL, { keys: ['j'], tags: { j: ['u'] } }), { j: 'opt:j' })
  assert.ok(await run(B, 'await cache.deleteByTag("u"); return true'))
  await busFlushed([A, B])
  assert.deepEqual(await serves(A, 'j'), { value: 'LOADED', loaded: true }, "A after deleteByTag('u')")
  assert.equal((await serves(B, 'j')).value, 'LOADED', "B after deleteByTag('u')")
})

test('Redis down: deleteByTag and clear are applied in process and reject with ERR_REDIS; the cache goes on working', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker } = await setup(t)
  const A = await spawnWorker('A')
  await run(A, FILL, { keys: ['a', 'b', 'plain'], tags: { a: ['t'], b: ['u'] } })
  await redis.stop('SIGKILL')
  const r = await run(
    A,
    `
    const code = (p) => p.then(() => 'resolved', (e) => e.code)
    const out = { deleteByTag: await code(cache.deleteByTag('t')) }
    out.a = (await cache.get('a')) ?? 'gone'
    out.b = (await cache.get('b')) ?? 'gone'
    // Loads go on in process; an entry tagged t and loaded now is kept (the mark made for the
    // deleteByTag Redis did not take is not left to kill every later entry of the tag).
    let loads = 0
    for (let i = 0; i < 3; i++) await cache.getOrLoad('c', () => (loads++, 'c'), { tags: ['t'] })
    out.loads = loads
    out.clear = await code(cache.clear())
    out.entries = cache.stats().l1Entries
    out.plain = (await cache.get('plain')) ?? 'gone'
    return out
  `,
  )
  assert.deepEqual(r, { deleteByTag: 'ERR_REDIS', a: 'gone', b: 'opt:b', loads: 1, clear: 'ERR_REDIS', entries: 0, plain: 'gone' })
})

test('skipCache across processes: nothing reaches Redis, and the lock is released so a waiting process loads at once', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t, { lockTtl: 20_000 })
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  // A leads the load (and holds the lock) for 400 ms, then declines caching its result.
  const SKIPPING = `
    const p = cache.getOrLoad('k', async (ctx) => {
      tools.ready()
      await tools.sleep(400)
      ctx.skipCache()
      return 'A skipped'
    })
    return tools.outcome(p)
  `
  const a = A.start('run', { body: SKIPPING })
  await a.ready
  const t0 = Date.now()
  const b = await B.request('read', { key: 'k', n: 5, loader: { value: 'B loaded' } })
  const waited = Date.now() - t0
  assert.equal((await a.result).value, 'A skipped', "A's caller gets the result")
  assert.equal(b.loaderCallsDuring, 1, 'B loaded once for its 5 callers')
  for (const r of b.results) assert.equal(r.value, 'B loaded')
  const bStats = (await B.request('snapshot')).stats
  assert.equal(bStats.lockWaits, 1, "B waited on A's lock first")
  assert.ok(waited < 10_000, `B waited ${waited} ms with lockTtl 20 s: the lock was released`)
  assert.equal(JSON.parse(await redis.cmd('GET', vkey('k'))).value, 'B loaded', "only B's result reached Redis")
  assert.deepEqual(await serves(A, 'k'), { value: 'B loaded', loaded: false })
})

test('ctx.setTtl across processes: the Redis expiry is the hardTtl and every process sees the same freshUntil', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t, { ttl: 600_000 })
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  await run(A, `await cache.getOrLoad('k', (ctx) => { ctx.setTtl(5_000, 20_000); return 1 }); return true`)
  const pttl = await redis.cmd('PTTL', vkey('k'))
  assert.ok(pttl > 15_000 && pttl <= 20_000, `PTTL ${pttl}`)
  const a = (await A.request('inspect', { key: 'k' })).value
  const b = (await B.request('inspect', { key: 'k' })).value
  assert.equal(a.freshUntil, b.freshUntil)
  assert.equal(b.hardUntil - b.freshUntil, 15_000)
})

test('l1.maxBytes with Redis: 10 KB values evicted by size are read back from Redis (l2Hits); an oversized value is served but kept only in Redis', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { l1: { maxBytes: 25_000 } })
  const body = `
    const out = []
    for (const key of args.keys) {
      let loads = 0
      const v = await cache.getOrLoad(key, () => { loads++; return { key, pad: 'x'.repeat(args.size) } })
      out.push({ key, ok: v.key === key && v.pad.length === args.size, loads })
    }
    return { out, stats: cache.stats() }
  `
  const first = await run(A, body, { keys: ['a', 'b', 'c'], size: 10_000 })
  assert.deepEqual(
    first.out.map((x) => x.loads),
    [1, 1, 1],
  )
  assert.equal(first.stats.l1Entries, 2, 'three 10 KB values in 25 KB: the oldest went')
  assert.ok(first.stats.l1Bytes <= 25_000 && first.stats.l1Bytes > 20_000, `l1Bytes ${first.stats.l1Bytes}`)
  const again = await run(A, body, { keys: ['a'], size: 10_000 })
  assert.deepEqual(again.out, [{ key: 'a', ok: true, loads: 0 }])
  assert.equal(again.stats.l2Hits, first.stats.l2Hits + 1, 'a came back from Redis, not from the loader')
  assert.equal(again.stats.misses, first.stats.misses)
  const big = await run(A, body, { keys: ['big', 'big', 'big'], size: 40_000 })
  assert.deepEqual(
    big.out.map((x) => [x.ok, x.loads]),
    [
      [true, 1],
      [true, 0],
      [true, 0],
    ],
  )
  assert.equal(big.stats.l2Hits, again.stats.l2Hits + 2, 'each later read of the big value is an l2Hit')
  assert.ok(big.stats.l1Bytes <= 25_000, `l1Bytes ${big.stats.l1Bytes}`)
})

// Every type the v8 serializer claims, as a worker builds it (values cannot cross IPC as JSON).
const RICH = `
  const rich = {
    date: new Date(1_700_000_000_123),
    map: new Map([['a', 1], [2, new Date(0)]]),
    set: new Set(['x', 3]),
    big: 12345678901234567890n,
    u8: new Uint8Array([1, 2, 255]),
    f64: new Float64Array([0.5, -1e300]),
    buf: Buffer.from('bytes ✓'),
    nested: { list: [new Date(1), null, undefined], neg: -0 },
  }
`
// Describes a value in JSON terms a parent can compare (types included).
const DESCRIBE = `
  const describe = (v) => ({
    date: v.date instanceof Date && v.date.getTime(),
    map: v.map instanceof Map && [...v.map].map(([k, x]) => [k, x instanceof Date ? 'date:' + x.getTime() : x]),
    set: v.set instanceof Set && [...v.set],
    big: typeof v.big === 'bigint' && v.big.toString(),
    u8: v.u8 instanceof Uint8Array && [...v.u8],
    f64: v.f64 instanceof Float64Array && [...v.f64],
    buf: (Buffer.isBuffer(v.buf) || v.buf instanceof Uint8Array) && Buffer.from(v.buf).toString(),
    nested: v.nested.list[0] instanceof Date && v.nested.list.length === 3 && v.nested.list[2] === undefined && Object.is(v.nested.neg, -0),
  })
`

test("'v8' serializer: every type it claims is read back by another process with l1: false; another serializer's entry is a miss, never a crash", {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker, redis, vkey } = await setup(t)
  const W = await spawnWorker('W', { serializer: 'v8' })
  const R = await spawnWorker('R', { serializer: 'v8', l1: false })
  const J = await spawnWorker('J')
  const written = await run(W, `${RICH}${DESCRIBE} await cache.set('rich', rich); return describe(await cache.getOrLoad('loaded', () => rich))`)
  const expected = {
    date: 1_700_000_000_123,
    map: [
      ['a', 1],
      [2, 'date:0'],
    ],
    set: ['x', 3],
    big: '12345678901234567890',
    u8: [1, 2, 255],
    f64: [0.5, -1e300],
    buf: 'bytes ✓',
    nested: true,
  }
  assert.deepEqual(written, expected, 'the writer itself gets every type back')
  for (const key of ['rich', 'loaded']) {
    const r = await run(
      R,
      `${DESCRIBE} let loads = 0; const v = await cache.getOrLoad(args.key, () => (loads++, null)); return { v: v && describe(v), loads, got: describe(await cache.get(args.key)) }`,
      { key },
    )
    assert.equal(r.loads, 0, `R read ${key} from Redis`)
    assert.deepEqual(r.v, expected, `R (l1: false) getOrLoad(${key})`)
    assert.deepEqual(r.got, expected, `R (l1: false) get(${key})`)
  }
  // The envelope stays readable JSON, with the format marked.
  const envelope = JSON.parse(await redis.cmd('GET', vkey('rich')))
  assert.equal(envelope.fmt, 'v8')
  assert.equal(typeof envelope.value, 'string')
  // A JSON cache, and a cache with a custom serializer, find no entry there (and no crash).
  const j = await J.request('read', { key: 'rich', loader: { value: 'json loaded' } })
  assert.ok(j.results[0].ok, j.results[0].message)
  assert.equal(j.results[0].value, 'json loaded')
  assert.equal((await J.request('get', { key: 'loaded' })).undef, true)
  const custom = await run(
    J,
    `
    const other = new cache.constructor({ ...tools.options, serializer: { serialize: (v) => JSON.stringify(v), deserialize: (d) => JSON.parse(d) } })
    try {
      const got = await other.get('loaded')
      return { got: got === undefined ? 'undefined' : got, loaded: await other.getOrLoad('loaded', () => 'custom loaded') }
    } finally {
      await other.close()
    }
  `,
  )
  assert.deepEqual(custom, { got: 'undefined', loaded: 'custom loaded' })
  // J's JSON value replaced W's in Redis; W's v8 cache now finds J's entry unreadable: a miss.
  await busFlushed([R, W]) // R (v8, like W) writes the barrier: W cannot read J's JSON
  const w = await W.request('read', { key: 'rich', loader: { value: 'v8 reloaded' } })
  assert.equal(w.results[0].value, 'v8 reloaded')
})

test('a custom serializer is used by every tier and another process; a value it cannot read is a miss', { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t)
  const A = await spawnWorker('A')
  const B = await spawnWorker('B')
  // 'dates': Dates survive as { $date } (a superjson-like serializer), in two processes.
  // 'v2': another custom serializer, whose deserialize throws on anything it did not write.
  const WITH = `
    const serializers = {
      dates: {
        serialize: (v) => JSON.stringify(v, function (k, x) { return this[k] instanceof Date ? { $date: this[k].getTime() } : x }),
        deserialize: (d) => JSON.parse(d, (k, x) => (x && typeof x.$date === 'number' ? new Date(x.$date) : x)),
      },
      v2: {
        serialize: (v) => 'v2:' + JSON.stringify(v),
        deserialize: (d) => {
          if (!d.startsWith('v2:')) throw new Error('not mine')
          return JSON.parse(d.slice(3))
        },
      },
    }
    const c = new cache.constructor({ ...tools.options, l1: args.l1, serializer: serializers[args.serializer] })
    try {
      let loads = 0
      const v = await c.getOrLoad('d', () => (loads++, { at: new Date(42), by: args.serializer }))
      return { isDate: v.at instanceof Date, by: v.by, loads }
    } finally {
      await c.close()
    }
  `
  assert.deepEqual(await run(A, WITH, { serializer: 'dates' }), { isDate: true, by: 'dates', loads: 1 })
  assert.deepEqual(await run(B, WITH, { serializer: 'dates', l1: false }), { isDate: true, by: 'dates', loads: 0 }, 'B read it from Redis')
  assert.deepEqual(await run(B, WITH, { serializer: 'v2' }), { isDate: false, by: 'v2', loads: 1 }, "v2 cannot read dates' entry: a miss, loaded again")
  assert.deepEqual(await run(A, WITH, { serializer: 'dates', l1: false }), { isDate: true, by: 'dates', loads: 1 }, "and dates cannot read v2's")
})

test('Redis Cluster: deleteByTag, expireByTag of 71 tags and clear reach entries on every master, with no cross-slot script', {
  timeout: 120_000,
}, async (t) => {
  const cluster = new RedisCluster({ masters: 3, replicasPerMaster: 0 })
  t.after(() => cluster.dispose())
  await cluster.start()
  const namespace = newNamespace()
  const options = { redis: { cluster: [cluster.nodes[0].url] }, namespace, jitter: 0 }
  const spawned = []
  t.after(() => Promise.all(spawned.map((w) => w.kill('SIGKILL'))))
  const [A, B] = await Promise.all(
    ['A', 'B'].map(async (name) => {
      const w = new CacheWorker(name, options)
      spawned.push(w)
      await w.hello
      return w
    }),
  )
  // 30 keys hash to all three masters.
  const keys = Array.from({ length: 30 }, (_, i) => `key${i}`)
  const slots = await cluster.keySlots(keys.map((k) => `${namespace}:v:{${k}}`))
  const map = await cluster.slotMap()
  const owners = new Set(slots.map((s) => map.find((r) => s >= r.start && s <= r.end).master))
  assert.equal(owners.size, 3, 'the keys live on all three masters')
  const tags = Object.fromEntries(keys.map((k, i) => [k, i % 2 ? ['odd'] : ['even']]))
  await run(A, FILL, { keys, tags })
  for (const k of ['key1', 'key2']) assert.equal((await serves(B, k)).loaded, false)
  await run(B, `await cache.deleteByTag('odd'); return true`)
  // Polled: a Cluster does not order PUBLISH made on different nodes, so no bus barrier here.
  await eventually(
    async () => {
      for (const k of keys.slice(0, 8)) {
        const s = await Promise.all([A, B].map((w) => w.request('get', { key: k })))
        for (const g of s) assert.equal(g.undef, k.match(/\d+/)[0] % 2 === 1, `${k} after deleteByTag('odd')`)
      }
    },
    { what: "deleteByTag('odd') to reach A and B" },
  )
  // expireByTag of a long list (every tag on its node, with its stale key on the tag's slot):
  // the even keys are stale everywhere, still served.
  const many = [...Array.from({ length: 70 }, (_, i) => `filler${i}`), 'even']
  await run(B, `await cache.expireByTag(args.tags); return true`, { tags: many })
  await eventually(
    async () => {
      for (const w of [A, B]) {
        const states = await run(w, 'return Promise.all(args.keys.map(async (k) => (await cache.inspect(k))?.state ?? null))', {
          keys: ['key0', 'key2', 'key4'],
        })
        assert.deepEqual(states, ['stale', 'stale', 'stale'], w.name)
      }
    },
    { what: 'the expireByTag to reach A and B' },
  )
  assert.equal((await serves(A, 'key0')).value, 'opt:key0', 'served stale')
  await run(A, `await cache.clear(); return true`)
  await eventually(
    async () => {
      for (const k of ['key0', 'key2']) await assertGone([A, B], k, 'after clear')
    },
    { what: 'the clear to reach A and B' },
  )
  let left = 0
  for (const m of await cluster.masters()) left += (await m.cmd('KEYS', `${namespace}:v:*`)).length
  assert.equal(left, 0, 'every master was swept')
  const after = await A.request('read', { key: 'key0', loader: { value: 'again' } })
  assert.equal(after.loaderCallsDuring, 1)
  // B has nothing in process (the clear dropped it), so it reads what A wrote: no wait needed,
  // and a load here could not be undone by waiting.
  assert.deepEqual(await serves(B, 'key0'), { value: 'again', loaded: false })
})
