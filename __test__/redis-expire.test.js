'use strict'
// expire, expireByTag and tag lists of any length with Redis, across real processes (API.md "The
// rest": expire/expireByTag keep the value but end its freshness in every instance; the next read
// anywhere is served the old value and starts one refresh for the whole fleet; any number of tags
// in every tag method, never partly applied).
//
// Every test starts its own redis-server on a free 127.0.0.1 port and real worker processes
// (__test__/fixtures/redis-worker.js). Loader calls are counted per process (globalThis.__calls)
// and summed: one refresh for the fleet is one call in all.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, killAllSync } = require('./helpers/redis-server')
const { eventually, busFlushed } = require('./helpers/eventually')

const TEST_TIMEOUT = 60_000

after(() => killAllSync())

const setup = (t, options = {}) => setupRedis(t, { options, prefix: 'scexp' })

function run(w, body, args = {}) {
  return w.request('run', { body, args })
}

// getOrLoad(args.key) with a loader that counts its calls in this process and returns
// args.value after args.ms; resolves with what the call got.
const READ = `
  globalThis.__calls ??= 0
  const loader = async () => {
    globalThis.__calls++
    await tools.sleep(args.ms ?? 0)
    return args.value
  }
  return cache.getOrLoad(args.key, loader, args.tags ? { tags: args.tags } : undefined)
`
const CALLS = `await cache.settle(); return globalThis.__calls ?? 0`
const STATE = `return (await cache.inspect(args.key))?.state ?? null`

async function totalCalls(workers) {
  let n = 0
  for (const w of workers) n += await run(w, CALLS)
  return n
}

/** Every worker reads `key` at once; returns what each got. */
function readAll(workers, args) {
  return Promise.all(workers.map((w) => run(w, READ, args)))
}

for (const form of ['expire', 'expireByTag']) {
  test(`${form} in one process: every instance serves the old value at once, and the fleet refreshes it once`, { timeout: TEST_TIMEOUT }, async (t) => {
    const { spawnWorker, redis, vkey } = await setup(t, { ttl: 60_000 })
    const [A, B, C] = await Promise.all(['A', 'B', 'C'].map((n) => spawnWorker(n)))
    const workers = [A, B, C]
    const tags = form === 'expireByTag' ? ['user:1'] : undefined
    // Loaded once, read by every instance (each then holds it in process, fresh).
    assert.deepEqual(await readAll(workers, { key: 'k', value: 'v1', tags }), ['v1', 'v1', 'v1'])
    assert.deepEqual(await readAll(workers, { key: 'plain', value: 'p1' }), ['p1', 'p1', 'p1'])
    assert.equal(await totalCalls(workers), 2, 'one load per key for the fleet')
    for (const w of workers) assert.equal(await run(w, STATE, { key: 'k' }), 'fresh')

    const result = await run(C, form === 'expire' ? 'return cache.expire(args.key)' : 'await cache.expireByTag(args.tags); return null', {
      key: 'k',
      tags,
    })
    if (form === 'expire') assert.equal(result, true, 'there was an entry')
    await busFlushed(workers)
    // The value is kept, stale, everywhere (in Redis too).
    assert.notEqual(await redis.cmd('GET', vkey('k')), null)
    for (const w of workers) assert.equal(await run(w, STATE, { key: 'k' }), 'stale', `${w.name} sees it stale`)

    // The next reads, everywhere at once: the old value at once; one refresh (200 ms) for all.
    const served = await readAll(workers, { key: 'k', value: 'v2', ms: 200, tags })
    assert.deepEqual(served, ['v1', 'v1', 'v1'], 'served stale, not waiting for the refresh')
    assert.deepEqual(await readAll(workers, { key: 'k', value: 'v3', tags }), ['v1', 'v1', 'v1'], 'still stale while it runs')
    assert.equal(await totalCalls(workers), 3, 'one refresh for the whole fleet')
    await busFlushed(workers)
    await eventually(async () => {
      assert.deepEqual(await readAll(workers, { key: 'k', value: 'v4', tags }), ['v2', 'v2', 'v2'])
    })
    for (const w of workers) assert.equal(await run(w, STATE, { key: 'k' }), 'fresh', `${w.name}: fresh again`)
    assert.equal(await totalCalls(workers), 3, 'no second refresh')
    // The untouched key stayed fresh and was never reloaded.
    assert.deepEqual(await readAll(workers, { key: 'plain', value: 'p2' }), ['p1', 'p1', 'p1'])
    assert.equal(await totalCalls(workers), 3)
  })
}

test('expire: a load that began before it, elsewhere, never writes its result (the next read starts the refresh after it)', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker } = await setup(t, { ttl: 300, hardTtl: 60_000 })
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  assert.equal(await run(A, READ, { key: 'k', value: 'v1' }), 'v1')
  await new Promise((r) => setTimeout(r, 400))
  // B is served v1 stale and starts a refresh that takes 1.5 s; A expires the key meanwhile.
  assert.equal(await run(B, READ, { key: 'k', value: 'before-expire', ms: 1_500 }), 'v1')
  await new Promise((r) => setTimeout(r, 300))
  assert.equal(await run(A, 'return cache.expire(args.key)', { key: 'k' }), true)
  assert.equal(await run(B, CALLS), 1, "B's refresh ran to its end")
  await busFlushed([A, B])
  // Its result was not written: A is still served v1, stale, and starts the refresh after it.
  assert.equal(await run(A, READ, { key: 'k', value: 'after-expire' }), 'v1')
  await run(A, CALLS)
  await busFlushed([A, B])
  for (const w of [A, B]) {
    await eventually(async () => assert.equal(await run(w, READ, { key: 'k', value: 'never' }), 'after-expire'))
  }
  assert.equal((await run(A, CALLS)) + (await run(B, CALLS)), 3)
})

test('expire of a key nobody holds resolves false; Redis down: expire and expireByTag reject ERR_REDIS, applied in process', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker, redis } = await setup(t)
  const A = await spawnWorker('A')
  assert.equal(await run(A, 'return cache.expire("none")'), false)
  assert.equal(await run(A, READ, { key: 'k', value: 'k1' }), 'k1')
  assert.equal(await run(A, READ, { key: 'j', value: 'j1', tags: ['t'] }), 'j1')
  await redis.stop('SIGKILL')
  const outcome = await run(
    A,
    `
    const code = (p) => p.then(() => 'resolved', (e) => e.code)
    const codes = [await code(cache.expire('k')), await code(cache.expireByTag('t'))]
    const state = async (key) => (await cache.inspect(key))?.state ?? null
    return { codes, k: await state('k'), j: await state('j'), value: await cache.get('j') }
  `,
  )
  assert.deepEqual(outcome, { codes: ['ERR_REDIS', 'ERR_REDIS'], k: 'stale', j: 'stale', value: 'j1' })
})

test('expireByTag with a hardTtl: stale everywhere within the window; past it, what was not refreshed is gone everywhere', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker } = await setup(t, { ttl: 60_000 })
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  for (const key of ['read', 'unread']) assert.equal(await run(A, READ, { key, value: `${key}1`, tags: ['t'] }), `${key}1`)
  await busFlushed([A, B])
  for (const key of ['read', 'unread']) assert.equal(await run(B, READ, { key, value: 'never', tags: ['t'] }), `${key}1`)
  await run(A, 'await cache.expireByTag("t", { hardTtl: 1_500 }); return null')
  await busFlushed([A, B])
  for (const w of [A, B]) for (const key of ['read', 'unread']) assert.equal(await run(w, STATE, { key }), 'stale', `${w.name} ${key}`)
  // "read" is read in the window: served stale, refreshed once.
  assert.equal(await run(B, READ, { key: 'read', value: 'read2', tags: ['t'] }), 'read1')
  await run(B, CALLS)
  await new Promise((r) => setTimeout(r, 1_700))
  for (const w of [A, B]) {
    assert.equal(await run(w, 'return (await cache.get(args.key)) ?? null', { key: 'unread' }), null, `${w.name}: the window is over`)
    assert.equal(await run(w, READ, { key: 'read', value: 'never', tags: ['t'] }), 'read2', `${w.name}: refreshed within it`)
  }
})

test('expire and expireByTag of a not-found: every instance loads it again (no not-found is served stale)', { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t, { negativeTtl: 60_000 })
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  const NOT_FOUND = `
    globalThis.__calls ??= 0
    return (await cache.getOrLoad(args.key, () => (globalThis.__calls++, args.value), args.tags ? { tags: args.tags } : undefined)) ?? 'null'
  `
  for (const key of ['n', 'tn']) {
    const tags = key === 'tn' ? ['t'] : undefined
    assert.equal(await run(A, NOT_FOUND, { key, value: null, tags }), 'null')
    await busFlushed([A, B])
    assert.equal(await run(B, NOT_FOUND, { key, value: 'never', tags }), 'null', 'shared')
    if (key === 'n') await run(A, 'return cache.expire(args.key)', { key })
    else await run(A, 'await cache.expireByTag("t"); return null')
    await busFlushed([A, B])
    assert.equal(await run(B, NOT_FOUND, { key, value: `found:${key}`, tags }), `found:${key}`, `${key}: loaded again, not served null`)
    await busFlushed([A, B])
    assert.equal(await run(A, NOT_FOUND, { key, value: 'never', tags }), `found:${key}`)
  }
  assert.equal((await run(A, CALLS)) + (await run(B, CALLS)), 4)
})

test('l1: false: expire and expireByTag are seen in Redis by another instance (inspect says stale), served stale and refreshed once', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { spawnWorker } = await setup(t, { l1: false })
  const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
  await run(A, 'await cache.set("k", 1, { tags: ["t"] }); await cache.set("j", 2); return null')
  const states = (w) => run(w, 'return Promise.all(["k", "j"].map(async (k) => (await cache.inspect(k))?.state ?? null))')
  assert.deepEqual(await states(B), ['fresh', 'fresh'])
  await run(A, 'await cache.expireByTag("t"); await cache.expire("j"); return null')
  assert.deepEqual(await states(B), ['stale', 'stale'])
  assert.deepEqual(await Promise.all(['k', 'j'].map((key) => run(B, READ, { key, value: `${key}2`, tags: key === 'k' ? ['t'] : undefined }))), [1, 2])
  assert.equal(await run(B, CALLS), 2, 'one refresh each')
  assert.deepEqual(await states(A), ['fresh', 'fresh'])
  assert.deepEqual(await run(A, 'return Promise.all([cache.get("k"), cache.get("j")])'), ['k2', 'j2'])
})

for (const count of [65, 200]) {
  test(`${count} tags with Redis: deleteByTag and expireByTag apply every one, in every process, in one step`, { timeout: TEST_TIMEOUT }, async (t) => {
    const { spawnWorker, redis, namespace } = await setup(t)
    const [A, B] = await Promise.all(['A', 'B'].map((n) => spawnWorker(n)))
    const tags = Array.from({ length: count }, (_, i) => `t${i}`)
    // One entry carries every tag; one entry per tag carries only it (the last ones included).
    const filled = await run(
      A,
      `
      await cache.set('all', 'all', { tags: args.tags })
      for (const tag of args.tags) await cache.set('only:' + tag, tag, { tags: [tag] })
      return (await cache.inspect('all')).state
    `,
      { tags },
    )
    assert.equal(filled, 'fresh', `an entry carrying ${count} tags is kept`)
    await busFlushed([A, B])
    const last = tags[count - 1]
    assert.equal(await run(B, 'return cache.get(args.key)', { key: `only:${last}` }), last)

    // expireByTag of the whole list: every entry stale, everywhere; one script in Redis.
    await run(B, 'await cache.expireByTag(args.tags); return null', { tags })
    await busFlushed([A, B])
    for (const w of [A, B]) {
      const states = await run(w, 'return Promise.all(args.keys.map(async (k) => (await cache.inspect(k))?.state))', {
        keys: ['all', ...tags.map((tag) => `only:${tag}`)],
      })
      assert.ok(
        states.every((s) => s === 'stale'),
        `${w.name}: ${states.filter((s) => s !== 'stale').length} entries not stale`,
      )
    }
    const clock = await redis.cmd('HGET', `${namespace}:meta`, 'clock')
    const records = await Promise.all(tags.map((tag) => redis.cmd('GET', `${namespace}:stale:{${tag}}`)))
    assert.ok(
      records.every((r) => r === clock),
      'every tag recorded at the one clock of the call',
    )

    // deleteByTag of the whole list: every entry gone, everywhere.
    await run(A, 'await cache.deleteByTag(args.tags); return null', { tags })
    await busFlushed([A, B])
    for (const w of [A, B]) {
      const served = await run(w, 'return (await Promise.all(args.keys.map((k) => cache.get(k)))).filter((v) => v !== undefined).length', {
        keys: ['all', ...tags.map((tag) => `only:${tag}`)],
      })
      assert.equal(served, 0, `${w.name} still serves ${served} entries`)
    }
    const clock2 = await redis.cmd('HGET', `${namespace}:meta`, 'clock')
    const deleted = await Promise.all(tags.map((tag) => redis.cmd('GET', `${namespace}:tag:{${tag}}`)))
    assert.ok(
      deleted.every((r) => r === clock2),
      'every tag deleted at the one clock of the call',
    )
  })
}
