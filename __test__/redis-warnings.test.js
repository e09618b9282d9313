'use strict'
// Failures visible by default (docs/CONTRACT.md, Constructing: onError): without `onError`, an
// outage's first Redis failure and its recovery are each reported once through
// process.emitWarning (code 'STAMPEDE_CACHE_REDIS'), never once per call; with `onError`, no
// warning at all. A port nobody listens on (Redis down at construction, then started there) and
// a redis-server killed and restarted on its port; many calls in each phase.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { RedisServer, freePort, killAllSync, sleep, waitFor } = require('./helpers/redis-server')

after(() => killAllSync())

const CODE = 'STAMPEDE_CACHE_REDIS'

/** The warnings with our code emitted while the test runs, in order. */
function collectWarnings(t) {
  const seen = []
  const on = (w) => {
    if (w.code === CODE) seen.push(w)
  }
  process.on('warning', on)
  t.after(() => process.off('warning', on))
  return seen
}

/** Calls that reach Redis (cold keys, writes): `n` of them, `gap` ms apart. */
async function calls(cache, n, tag, gap = 20) {
  for (let i = 0; i < n; i++) {
    assert.equal(await cache.getOrLoad(`${tag}:${i}`, () => i), i)
    await cache.set(`${tag}:set:${i}`, i).catch((err) => assert.equal(err.code, 'ERR_REDIS'))
    await sleep(gap)
  }
}

/** Calls until `cond` holds (Redis answers again once its probe succeeds). */
async function callUntil(cache, tag, cond, what) {
  let i = 0
  await waitFor(
    async () => {
      await calls(cache, 1, `${tag}${i++}`, 0)
      await sleep(0)
      return cond()
    },
    { timeout: 15_000, interval: 50, what },
  )
}

const options = (port, extra) => ({
  redis: { url: `redis://127.0.0.1:${port}`, connectTimeout: 1_000, commandTimeout: 2_000 },
  namespace: `w${process.pid}`,
  ...extra,
})

test('Redis down at construction, then up: one warning for the failure, one for the recovery', { timeout: 60_000 }, async (t) => {
  const warnings = collectWarnings(t)
  const port = await freePort()
  const cache = new StampedeCache(options(port))
  t.after(() => cache.close())
  await calls(cache, 15, 'down')
  // Past the onError rate limit (one a second an operation): still one.
  await sleep(1_100)
  await calls(cache, 10, 'down2')
  await sleep(0)
  assert.equal(warnings.length, 1, warnings.map((w) => w.message).join(' | '))
  assert.equal(warnings[0].name, 'StampedeCacheWarning')
  assert.match(warnings[0].message, /Redis/)
  assert.match(warnings[0].message, /onError/, 'it says how to handle them instead')
  assert.match(warnings[0].message, new RegExp(`127\\.0\\.0\\.1:${port}|refused|connect`, 'i'), 'it says why')

  const server = new RedisServer()
  server.port = port
  t.after(() => server.dispose())
  await server.start()
  await callUntil(cache, 'up', () => warnings.length >= 2, 'the recovery warning')
  await calls(cache, 10, 'after')
  await sleep(0)
  assert.equal(warnings.length, 2, warnings.map((w) => w.message).join(' | '))
  assert.match(warnings[1].message, /answers again|recovered|back/i)
  // Working again: a write lands.
  await cache.set('landed', 1)
  assert.equal(await server.cmd('EXISTS', `w${process.pid}:v:{landed}`), 1)
})

test('Redis killed and restarted: one warning for the outage, one for the recovery, each time', { timeout: 60_000 }, async (t) => {
  const warnings = collectWarnings(t)
  const server = new RedisServer()
  t.after(() => server.dispose())
  await server.start()
  const cache = new StampedeCache(options(server.port))
  t.after(() => cache.close())
  await calls(cache, 5, 'healthy')
  assert.equal(warnings.length, 0, 'a healthy Redis warns of nothing')
  for (let round = 1; round <= 2; round++) {
    await server.stop('SIGKILL')
    await callUntil(cache, `down${round}`, () => warnings.length >= 2 * round - 1, 'the outage warning')
    await calls(cache, 15, `down${round}b`)
    await sleep(0)
    assert.equal(warnings.length, 2 * round - 1, warnings.map((w) => w.message).join(' | '))
    await server.start()
    await callUntil(cache, `up${round}`, () => warnings.length >= 2 * round, 'the recovery warning')
    await calls(cache, 10, `up${round}b`)
    await sleep(0)
    assert.equal(warnings.length, 2 * round, warnings.map((w) => w.message).join(' | '))
  }
})

test('with onError, no warning: every failure goes to onError', { timeout: 60_000 }, async (t) => {
  const warnings = collectWarnings(t)
  const errors = []
  const port = await freePort()
  const cache = new StampedeCache(options(port, { onError: (err, info) => errors.push({ err, info }) }))
  t.after(() => cache.close())
  await calls(cache, 15, 'down')
  const server = new RedisServer()
  server.port = port
  t.after(() => server.dispose())
  await server.start()
  await callUntil(
    cache,
    'up',
    async () =>
      await cache.set('probe', 1).then(
        () => true,
        () => false,
      ),
    'Redis back',
  )
  await sleep(0)
  assert.ok(errors.length >= 1, 'onError heard of the outage')
  for (const { err, info } of errors) {
    assert.equal(err.code, 'ERR_REDIS')
    assert.match(info.op, /^redis:/)
  }
  assert.equal(warnings.length, 0, warnings.map((w) => w.message).join(' | '))
})

test('a change Redis could not take rejects saying why, never quoting the password', { timeout: 30_000 }, async (t) => {
  const warnings = collectWarnings(t)
  const port = await freePort()
  const password = 'hunter2-secret'
  const cache = new StampedeCache({ redis: { host: '127.0.0.1', port, password, connectTimeout: 300 }, onError: () => {} })
  t.after(() => cache.close())
  for (const change of [() => cache.set('k', 1), () => cache.delete('k'), () => cache.deleteByTag('t'), () => cache.clear()]) {
    const err = await change().then(
      () => assert.fail('Redis is down: the change cannot land'),
      (e) => e,
    )
    assert.equal(err.code, 'ERR_REDIS')
    assert.doesNotMatch(err.message, /see onError/)
    assert.match(err.message, /refused|connect/i, `the cause is stated: ${err.message}`)
    assert.ok(!err.message.includes(password), err.message)
  }
  assert.equal(warnings.length, 0)
})
