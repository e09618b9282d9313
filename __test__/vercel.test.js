'use strict'
// examples/vercel: a Vercel Function whose cache takes `waitUntil` from @vercel/functions.
//
// There is no Vercel runtime here, so the test plays it the way @vercel/functions expects (see its
// get-context.js): the runtime sets globalThis[Symbol.for('@vercel/request-context')] to an object
// whose get() returns the current invocation's context, { waitUntil, ... }; waitUntil() looks it up
// on every call and is a no-op where there is none (local development).
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { AsyncLocalStorage } = require('node:async_hooks')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const invocation = new AsyncLocalStorage()
let GET, cache, source

before(async () => {
  process.env.FEED_TTL_MS = '200'
  // The example reads REDIS_URL at import. This test is about waitUntil in one instance; a Redis
  // from the developer's environment (a shared one on 6379, with keys already there) must not
  // reach it, so it runs in-process only, whatever the shell exports.
  delete process.env.REDIS_URL
  globalThis[Symbol.for('@vercel/request-context')] = { get: () => invocation.getStore() }
  ;({ GET } = await import('../examples/vercel/api/feed.mjs'))
  ;({ cache, source } = await import('../examples/vercel/lib/feed.mjs'))
})

after(async () => {
  delete globalThis[Symbol.for('@vercel/request-context')]
  await cache.close()
})

/**
 * One invocation as the runtime runs it: a context of its own; `handed` gets what it was given to
 * wait for, and `handedBeforeResponse` how many of those it had when the Response resolved.
 */
async function invoke(user) {
  const ctx = { handed: [], handedBeforeResponse: -1, waitUntil: (p) => ctx.handed.push(p) }
  const response = await invocation.run(ctx, () => GET(new Request(`https://example.test/api/feed?user=${user}`)))
  ctx.handedBeforeResponse = ctx.handed.length
  assert.equal(response.status, 200)
  ctx.body = await response.json()
  return ctx
}

/** Polls `predicate` every 5 ms; throws naming `what` (a string, or a function for the latest state) after `ms`. */
async function until(what, predicate, ms = 10_000) {
  const deadline = Date.now() + ms
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${typeof what === 'function' ? what() : what}`)
    await sleep(5)
  }
}

async function untilStale(key) {
  let state
  await until(
    () => `${JSON.stringify(key)} to go stale (last state ${state})`,
    async () => (state = (await cache.inspect(key))?.state) === 'stale',
  )
}

test('cold: 200 concurrent invocations share one load and hand nothing to waitUntil', async () => {
  source.hold()
  const all = Promise.all(Array.from({ length: 200 }, () => invoke('42')))
  await until('200 invocations to wait on the load', () => cache.stats().misses >= 200)
  source.release()
  const ctxs = await all
  assert.ok(ctxs.every((c) => c.body.version === 1 && c.handed.length === 0))
  assert.equal(source.started, 1)
})

test("stale: answered at once, and the one refresh is handed to that invocation's waitUntil before its response", async () => {
  await untilStale(['feed', '42'])
  source.hold()
  const ctxs = await Promise.all(Array.from({ length: 50 }, () => invoke('42')))
  assert.ok(
    ctxs.every((c) => c.body.version === 1),
    'the stale feed was served',
  )
  assert.equal(source.started, 2, 'one refresh started')
  assert.equal(source.finished, 1, 'every response came while the refresh was blocked')
  const leaders = ctxs.filter((c) => c.handed.length > 0)
  assert.equal(leaders.length, 1, 'exactly one invocation was handed the refresh')
  assert.equal(leaders[0].handed.length, 1)
  assert.equal(leaders[0].handedBeforeResponse, 1, 'handed over before its Response resolved')

  // What the runtime does with it: keep the instance alive until the promise settles.
  source.release()
  await leaders[0].handed[0]
  assert.equal(source.finished, 2)
  assert.equal(cache.stats().refreshes, 1)
  assert.equal((await invoke('42')).body.version, 2)
})

test('concurrent invocations each receive only their own refresh', async () => {
  const users = ['a', 'b', 'c', 'd']
  await Promise.all(users.map((u) => invoke(u)))
  await Promise.all(users.map((u) => untilStale(['feed', u])))
  const startedBefore = source.started
  const ctxs = await Promise.all(
    users.map(async (u) => {
      await sleep(Math.random() * 5) // interleave
      return invoke(u)
    }),
  )
  for (const c of ctxs) {
    assert.equal(c.handed.length, 1, `${c.body.user} got exactly one refresh`)
    assert.equal(c.handedBeforeResponse, 1)
  }
  await Promise.all(ctxs.map((c) => c.handed[0]))
  assert.equal(source.started, startedBefore + users.length)
  for (const u of users) assert.equal((await cache.get(['feed', u])).user, u, 'each refresh reloaded its own key')
})

test('outside an invocation (local development) waitUntil is a no-op and the refresh still completes', async () => {
  // With a 200 ms ttl an earlier test's read of '42' may have refreshed it again (its refresh
  // handed to a waitUntil nobody awaited): let those end, then take the version it holds now.
  await cache.settle()
  await untilStale(['feed', '42'])
  const staleVersion = (await cache.get(['feed', '42'])).version
  const before = source.finished
  const response = await GET(new Request('https://example.test/api/feed?user=42'))
  assert.equal((await response.json()).version, staleVersion, 'the stale feed')
  await cache.settle()
  assert.equal(source.finished, before + 1)
  assert.equal(cache.stats().refreshErrors, 0)
  assert.ok((await cache.get(['feed', '42'])).version > staleVersion, 'refreshed')
})
