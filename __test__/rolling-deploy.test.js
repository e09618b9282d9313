'use strict'
// A rolling deploy (../shared/API.md, Redis): instances of the previous release (its envelopes are
// JSON, with a second `gen:` key per entry) and of this one (a binary header, one key per entry)
// share one Redis. Entries the previous release wrote are read by this one without a load; the
// previous release reading this one's entries serves the right value or loads it (a miss), never
// crashes; both at once load a key at most twice; and a set by either build drops a load the
// other began before it. The previous build comes from helpers/previous-build.js (built once).
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { setupRedis, barrier } = require('./helpers/redis-server')
const { previousBuild, PREVIOUS_COMMIT } = require('./helpers/previous-build')

const MUST_NOT_LOAD = 'MUST-NOT-LOAD'
const previous = (() => {
  try {
    return previousBuild()
  } catch (err) {
    return { error: err.message }
  }
})()
const skip = typeof previous !== 'string' && `no build of ${PREVIOUS_COMMIT}: ${previous?.error ?? 'not a git checkout'}`
const valueOf = (key) => ({ key, body: `value of ${key}`, n: key.length })
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function setup(t) {
  const env = await setupRedis(t, { options: { ttl: 60_000 }, prefix: 'deploy' })
  const old = (name) => env.spawnWorker(name, {}, { build: previous })
  const now = (name) => env.spawnWorker(name)
  return { ...env, old, now }
}

async function readOne(w, key, loader) {
  const r = await w.request('read', { key, loader })
  assert.ok(r.results[0].ok, `${w.name} ${key}: ${r.results[0].message}`)
  return { value: r.results[0].value, loads: r.loaderCallsDuring }
}

test(`rolling deploy: the previous release (${PREVIOUS_COMMIT}) and this one share a Redis`, { skip, timeout: 120_000 }, async (t) => {
  const { old, now, spawnWorker } = await setup(t)
  const [O, N] = await Promise.all([old('old'), now('new')])

  await t.test("the previous release's entries are read without a load", async () => {
    for (let i = 0; i < 10; i++) {
      const key = `a:${i}`
      assert.deepEqual(await readOne(O, key, { value: valueOf(key) }), { value: valueOf(key), loads: 1 })
    }
    const fresh = await now('new-a') // nothing in process: every read goes to Redis
    for (let i = 0; i < 10; i++) {
      const key = `a:${i}`
      assert.deepEqual(await readOne(fresh, key, { value: MUST_NOT_LOAD }), { value: valueOf(key), loads: 0 }, key)
    }
  })

  await t.test("the previous release reading this one's entries serves the right value or loads it, and never crashes", async () => {
    for (let i = 0; i < 10; i++) {
      const key = `b:${i}`
      assert.deepEqual(await readOne(N, key, { value: valueOf(key) }), { value: valueOf(key), loads: 1 })
    }
    const oldReader = await old('old-b')
    for (let i = 0; i < 10; i++) {
      const key = `b:${i}`
      const r = await readOne(oldReader, key, { value: valueOf(key) })
      assert.deepEqual(r.value, valueOf(key), key)
      assert.ok(r.loads <= 1, `${key}: ${r.loads} loads`)
    }
    // What either build holds now is read by both without another load.
    const [o2, n2] = await Promise.all([old('old-b2'), now('new-b2')])
    for (let i = 0; i < 10; i++) {
      const key = `b:${i}`
      assert.deepEqual(await readOne(n2, key, { value: MUST_NOT_LOAD }), { value: valueOf(key), loads: 0 }, `new: ${key}`)
      assert.deepEqual(await readOne(o2, key, { value: MUST_NOT_LOAD }), { value: valueOf(key), loads: 0 }, `old: ${key}`)
    }
    assert.equal(oldReader.exitInfo, null, 'the previous release did not crash')
  })

  await t.test('both at once load a key at most twice', async () => {
    const ws = await Promise.all([old('old-c1'), old('old-c2'), now('new-c1'), now('new-c2')])
    for (let i = 0; i < 5; i++) {
      const key = `c:${i}`
      const results = await barrier(ws, 'read', () => ({ key, n: 20, loader: { ms: 150, value: valueOf(key) } }))
      const loads = results.reduce((s, r) => s + r.loaderCallsDuring, 0)
      assert.ok(loads >= 1 && loads <= 2, `${key}: ${loads} loads across both builds`)
      for (const r of results) for (const x of r.results) assert.deepEqual(x.value, valueOf(key))
    }
  })

  await t.test("a waiter of the previous release is woken by this one's write-back at once, not after lockTtl", async () => {
    // This build announces a result written over its marker only when someone waits: the
    // previous release's waiter shows itself by the generation key its gate puts there.
    const lockTtl = 20_000
    const [holder, waiter] = await Promise.all([spawnWorker('new-w', { lockTtl }), spawnWorker('old-w', { lockTtl }, { build: previous })])
    const key = 'w:0'
    const h = holder.start('read', { key, loader: { ms: 1_500, value: valueOf(key) } })
    await sleep(300) // the holder is in its load
    const w = waiter.start('read', { key, loader: { value: valueOf(key) } })
    const a = await h.result
    const b = await w.result
    assert.ok(b.results[0].ok, b.results[0].message)
    assert.deepEqual(b.results[0].value, valueOf(key))
    const after = b.results[0].at - a.results[0].at
    t.diagnostic(`the previous release's waiter resolved ${after} ms after this one's load`)
    assert.ok(after < lockTtl / 4, `the previous release's waiter resolved ${after} ms after the load: it was not woken`)
  })

  await t.test('a set by either build drops a load the other began before it', async () => {
    for (const [loader, setter, label] of [
      [O, N, 'old loads, new sets'],
      [N, O, 'new loads, old sets'],
    ]) {
      const key = `d:${label}`
      const run = loader.start('read', { key, loader: { ms: 800, value: 'loaded before the set' } })
      await sleep(250)
      assert.ok((await setter.request('set', { key, value: 'set during the load' })).ok)
      await run.result
      await Promise.all([loader.request('settle'), setter.request('settle')])
      // This build reads either build's entry; the previous one reads its own, or takes this
      // one's for a miss (and loads): never the load the set came after.
      const fresh = await now(`new-${label}`)
      assert.deepEqual(await readOne(fresh, key, { value: MUST_NOT_LOAD }), { value: 'set during the load', loads: 0 }, label)
      const r = await readOne(await old(`old-${label}`), key, { value: 'a miss' })
      assert.ok(r.value === 'set during the load' || (r.value === 'a miss' && r.loads === 1), `${label}: the previous release read ${r.value}`)
    }
  })
  assert.equal(O.exitInfo, null)
  assert.equal(N.exitInfo, null)
})

test(`rolling deploy: expire here of the previous release's (${PREVIOUS_COMMIT}) entries`, { skip, timeout: 120_000 }, async (t) => {
  const { old, now } = await setup(t)
  const [O, N] = await Promise.all([old('old'), now('new')])
  const expire = (w, key) => w.request('run', { body: 'return cache.expire(args.key)', args: { key } })

  await t.test('an old entry stays readable by both builds: served stale, refreshed once, the refresh read by this one', async () => {
    const key = 'e:stale'
    assert.deepEqual(await readOne(O, key, { value: valueOf(key) }), { value: valueOf(key), loads: 1 })
    assert.equal(await expire(N, key), true)
    // The previous release reads the entry expire rewrote: the old value at once, then one refresh.
    const r = await readOne(await old('old-e'), key, { value: 'refreshed by the old release' })
    assert.deepEqual(r, { value: valueOf(key), loads: 1 }, 'served stale by the previous release, refreshed once')
    // That refresh began after the expire: it was written, and this release reads it.
    assert.deepEqual(await readOne(await now('new-e'), key, { value: MUST_NOT_LOAD }), { value: 'refreshed by the old release', loads: 0 })
  })

  await t.test('a load the previous release began before the expire is dropped', async () => {
    const key = 'e:fenced'
    const run = O.start('read', { key, loader: { ms: 800, value: 'loaded before the expire' } })
    await sleep(250)
    assert.equal(await expire(N, key), false, 'no value held yet')
    await run.result
    await O.request('settle')
    const r = await readOne(await now('new-f'), key, { value: 'loaded after' })
    assert.deepEqual(r, { value: 'loaded after', loads: 1 }, 'the old load was not written over the expire')
  })
  assert.equal(O.exitInfo, null)
  assert.equal(N.exitInfo, null)
})
