'use strict'
// stampede-cache/next: Next.js 16's tag meanings and "use cache" lifetimes across two instances
// (API.md "Next.js", Tags): revalidateTag(tag, profile) serves each entry stale once while one
// instance regenerates it; updateTag, the profile-less form and { expire: 0 } expire them at once;
// a "use cache" entry past its revalidate and before its expire is served stale while one instance
// regenerates it; any number of tags per call, never partly applied.
//
// Two real processes (__test__/fixtures/next-handler-worker.js: the handlers driven as Next's
// use-cache wrapper and incremental cache drive them) share one private redis-server.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { fork } = require('node:child_process')
const path = require('node:path')
const { RedisServer, newNamespace } = require('./helpers/redis-server.js')

const WORKER = path.join(__dirname, 'fixtures', 'next-handler-worker.js')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
// Past the bus bound (100 ms) with room for a loaded machine.
const BUS = 300
const TEST_TIMEOUT = 60_000

let redis
const children = []

before(async () => {
  redis = await new RedisServer().start()
})
after(async () => {
  for (const c of children) c.kill('SIGKILL')
  await redis.stop('SIGKILL')
})

function instance(name, options) {
  const child = fork(WORKER, [], { env: { ...process.env, NEXT_WORKER_OPTIONS: JSON.stringify(options) }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  children.push(child)
  const waiting = new Map()
  let next = 0
  const ready = new Promise((resolve) => {
    child.on('message', (m) => {
      if (m.ready) return resolve()
      const w = waiting.get(m.id)
      waiting.delete(m.id)
      if (m.error) w.reject(new Error(`${name}: ${m.error}`))
      else w.resolve(m.result)
    })
  })
  const call = (op, args) =>
    new Promise((resolve, reject) => {
      const id = ++next
      waiting.set(id, { resolve, reject })
      child.send({ id, op, args })
    })
  return ready.then(() => ({ name, call }))
}

async function two(t) {
  const options = { redis: redis.url, namespace: newNamespace('nexttags') }
  return Promise.all([instance('A', options), instance('B', options)])
}

async function computedIn(instances) {
  let n = 0
  for (const i of instances) n += await i.call('settle')
  return n
}

const render = (i, args) => i.call('render', args)

test('"use cache": revalidateTag(tag, \'max\') on one instance: each entry is served stale once, everywhere, while one instance regenerates it', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const [A, B] = await two(t)
  assert.equal((await render(A, { key: 'posts', value: 'v1', tags: ['posts'] })).state, 'miss')
  assert.equal((await render(A, { key: 'users', value: 'u1', tags: ['users'] })).state, 'miss')
  await sleep(BUS)
  assert.deepEqual(await render(B, { key: 'posts', value: 'never' }), { state: 'hit', value: 'v1' })
  // Next calls updateTags with the profile's durations ('max': its expire, in seconds).
  await A.call('updateTags', { tags: ['posts'], durations: { expire: 31_536_000 } })
  await sleep(BUS)
  const [a, b] = await Promise.all([
    render(A, { key: 'posts', value: 'v2', tags: ['posts'], ms: 300 }),
    render(B, { key: 'posts', value: 'v2', tags: ['posts'], ms: 300 }),
  ])
  assert.deepEqual([a.value, b.value], ['v1', 'v1'], 'the old value at once in both')
  assert.deepEqual([a.state, b.state].sort(), ['hit', 'stale'], 'one instance regenerates it, the other serves it as it is')
  assert.equal(await computedIn([A, B]), 3, 'one regeneration for both instances')
  await sleep(BUS)
  for (const i of [A, B]) assert.deepEqual(await render(i, { key: 'posts', value: 'never' }), { state: 'hit', value: 'v2' }, i.name)
  for (const i of [A, B]) assert.deepEqual(await render(i, { key: 'users', value: 'never' }), { state: 'hit', value: 'u1' }, `${i.name}: another tag`)
  assert.equal(await computedIn([A, B]), 3)
})

test('"use cache": revalidateTag(tag, { expire: 1 }): stale for the profile\'s window, gone after it on both instances', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const [A, B] = await two(t)
  await render(A, { key: 'read', value: 'r1', tags: ['posts'] })
  await render(A, { key: 'unread', value: 'u1', tags: ['posts'] })
  await sleep(BUS)
  await B.call('updateTags', { tags: ['posts'], durations: { expire: 1 } })
  await sleep(BUS)
  // Read within the window: served stale, regenerated once.
  const read = await render(B, { key: 'read', value: 'r2', tags: ['posts'] })
  assert.equal(read.value, 'r1')
  await B.call('settle')
  await sleep(1_200)
  for (const i of [A, B]) {
    assert.deepEqual(await render(i, { key: 'read', value: 'never', tags: ['posts'] }), { state: 'hit', value: 'r2' }, `${i.name}: regenerated in the window`)
  }
  assert.deepEqual(await render(A, { key: 'unread', value: 'u2', tags: ['posts'] }), { state: 'miss', value: 'u2' }, 'past the window: a miss')
})

for (const [form, durations] of [
  ['updateTag / the profile-less revalidateTag (no durations)', undefined],
  ['revalidateTag(tag, { expire: 0 })', { expire: 0 }],
]) {
  test(`"use cache": ${form} expires the entries at once, on both instances`, { timeout: TEST_TIMEOUT }, async (t) => {
    const [A, B] = await two(t)
    await render(A, { key: 'posts', value: 'v1', tags: ['posts'] })
    await sleep(BUS)
    assert.equal((await render(B, { key: 'posts', value: 'never' })).value, 'v1')
    await B.call('updateTags', { tags: ['posts'], durations })
    await sleep(BUS)
    assert.deepEqual(await render(A, { key: 'posts', value: 'v2', tags: ['posts'] }), { state: 'miss', value: 'v2' }, 'not served stale')
    await sleep(BUS)
    assert.deepEqual(await render(B, { key: 'posts', value: 'never' }), { state: 'hit', value: 'v2' })
    assert.equal(await computedIn([A, B]), 2)
  })
}

test('"use cache": past its revalidate and before its expire, an entry is served stale on both instances while one regenerates it', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const [A, B] = await two(t)
  await render(A, { key: 'short', value: 'v1', revalidate: 1, expire: 60 })
  await sleep(BUS)
  assert.deepEqual(await render(B, { key: 'short', value: 'never' }), { state: 'hit', value: 'v1' })
  await sleep(1_300)
  const [a, b] = await Promise.all([
    render(A, { key: 'short', value: 'v2', ms: 300, revalidate: 1, expire: 60 }),
    render(B, { key: 'short', value: 'v2', ms: 300, revalidate: 1, expire: 60 }),
  ])
  assert.deepEqual([a.value, b.value], ['v1', 'v1'], 'served stale, not a miss')
  assert.deepEqual([a.state, b.state].sort(), ['hit', 'stale'])
  assert.equal(await computedIn([A, B]), 2, 'one regeneration')
  await sleep(BUS)
  for (const i of [A, B]) assert.equal((await render(i, { key: 'short', value: 'never', revalidate: 1, expire: 60 })).value, 'v2', i.name)
})

test('incremental cache: revalidateTag(tag, profile) serves a fetch entry stale once while one instance refetches; revalidateTag(tag) drops it', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const [A, B] = await two(t)
  assert.equal((await A.call('fetchEntry', { key: 'f', value: 'b1', tags: ['feed'] })).state, 'miss')
  await sleep(BUS)
  assert.deepEqual(await B.call('fetchEntry', { key: 'f', value: 'never', tags: ['feed'] }), { state: 'hit', value: 'b1' })
  await B.call('revalidateTag', { tags: 'feed', durations: { expire: 3600 } })
  await sleep(BUS)
  const [a, b] = await Promise.all([A, B].map((i) => i.call('fetchEntry', { key: 'f', value: 'b2', tags: ['feed'], ms: 300 })))
  assert.deepEqual([a.value, b.value], ['b1', 'b1'])
  assert.deepEqual([a.state, b.state].sort(), ['hit', 'stale'])
  assert.equal(await computedIn([A, B]), 2)
  await sleep(BUS)
  for (const i of [A, B]) assert.deepEqual(await i.call('fetchEntry', { key: 'f', value: 'never', tags: ['feed'] }), { state: 'hit', value: 'b2' })
  await A.call('revalidateTag', { tags: ['feed'] })
  await sleep(BUS)
  assert.deepEqual(await B.call('fetchEntry', { key: 'f', value: 'b3', tags: ['feed'] }), { state: 'miss', value: 'b3' })
})

for (const count of [65, 200]) {
  test(`${count} tags: entries carrying them are stored, and updateTags / revalidateTag of the whole list reach them on the other instance`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const [A, B] = await two(t)
    const tags = Array.from({ length: count }, (_, i) => `tag${i}`)
    const last = tags[count - 1]
    await render(A, { key: 'many', value: 'm1', tags })
    await render(A, { key: 'last', value: 'l1', tags: [last] })
    await A.call('fetchEntry', { key: 'f-last', value: 'f1', tags: [last] })
    await sleep(BUS)
    assert.deepEqual(await render(B, { key: 'many', value: 'never' }), { state: 'hit', value: 'm1' }, `an entry with ${count} tags is shared`)
    await B.call('updateTags', { tags })
    await B.call('revalidateTag', { tags })
    await sleep(BUS)
    assert.equal((await render(A, { key: 'many', value: 'm2', tags })).state, 'miss')
    assert.equal((await render(A, { key: 'last', value: 'l2', tags: [last] })).state, 'miss', 'the last tag of the list applied')
    assert.equal((await A.call('fetchEntry', { key: 'f-last', value: 'f2', tags: [last] })).state, 'miss')
  })
}
