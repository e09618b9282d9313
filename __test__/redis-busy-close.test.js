'use strict'
// Two promises of "What no bytes and no option can do" (docs/CONTRACT.md) that no fault injector
// reaches: a busy JS thread is not a Redis failure, and close() with reads in flight never turns
// a value that exists into `undefined`. Each runs on the read lane, on the socket lane and on the
// command connection (the latter two in a child process: STAMPEDE_CACHE_LANE and
// STAMPEDE_CACHE_NO_LANE are read once per process).
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const { StampedeCache } = require('..')
const { RedisServer, newNamespace, killAllSync } = require('./helpers/redis-server')

after(() => killAllSync())

let redis
const started = (async () => {
  redis = new RedisServer()
  await redis.start()
})()
after(() => redis?.dispose())

/** Blocks the JS thread for `ms` (a GC pause or a CPU spike, as the event loop sees it). */
function block(ms) {
  const until = Date.now() + ms
  while (Date.now() < until) {
    // busy
  }
}

async function busyThread(url) {
  const namespace = newNamespace('busy')
  const writer = new StampedeCache({ redis: url, namespace })
  const keys = Array.from({ length: 20 }, (_, i) => `k${i}`)
  for (const k of keys) await writer.set(k, { key: k })
  const cache = new StampedeCache({ redis: { url, commandTimeout: 1_000 }, namespace, l1: false })
  // The connections (and the read lane) open.
  for (let i = 0; i < 10; i++) await cache.get('warm')
  let loads = 0
  const reads = keys.map((k) =>
    cache.getOrLoad(k, () => {
      loads++
      return { key: k, loaded: true }
    }),
  )
  // The requests are on the wire; the replies arrive while the thread is blocked past
  // commandTimeout.
  await new Promise((r) => setImmediate(r))
  block(1_300)
  const got = await Promise.all(reads)
  const stats = cache.stats()
  await cache.close()
  await writer.close()
  return { loads, redisErrors: stats.redisErrors, wrong: got.filter((v, i) => v?.key !== keys[i] || v.loaded).length }
}

async function closeInFlight(url) {
  const namespace = newNamespace('close')
  const writer = new StampedeCache({ redis: url, namespace })
  await writer.set('k', 'there')
  const cache = new StampedeCache({ redis: url, namespace, l1: false })
  for (let i = 0; i < 10; i++) await cache.get('warm')
  const outcomes = { value: 0, closed: 0, undefined: 0, other: 0 }
  const reads = Array.from({ length: 50 }, () =>
    cache.get('k').then(
      (v) => (v === 'there' ? outcomes.value++ : outcomes.undefined++),
      (err) => (err.code === 'ERR_CLOSED' ? outcomes.closed++ : outcomes.other++),
    ),
  )
  await cache.close()
  await Promise.all(reads)
  await writer.close()
  return outcomes
}

const SCENARIOS = { busyThread, closeInFlight }

if (process.argv[2] === '--child') {
  SCENARIOS[process.argv[3]](process.argv[4]).then((r) => {
    process.stdout.write(JSON.stringify(r))
    process.exit(0)
  })
} else {
  const inChild = (name, env) => {
    const r = spawnSync(process.execPath, [__filename, '--child', name, redis.url], {
      env: { ...process.env, ...env },
      encoding: 'utf8',
      timeout: 60_000,
    })
    assert.equal(r.status, 0, r.stderr)
    return JSON.parse(r.stdout)
  }
  for (const [label, run] of [
    ['read lane', (name, url) => SCENARIOS[name](url)],
    ['socket lane', (name) => inChild(name, { STAMPEDE_CACHE_LANE: 'socket' })],
    ['command connection', (name) => inChild(name, { STAMPEDE_CACHE_NO_LANE: '1' })],
  ]) {
    test(`${label}: a JS thread blocked past commandTimeout is not a Redis failure: no loader runs`, { timeout: 60_000 }, async () => {
      await started
      const r = await run('busyThread', redis.url)
      assert.equal(r.wrong, 0, JSON.stringify(r))
      assert.equal(r.loads, 0, `loaders ran: ${JSON.stringify(r)}`)
      assert.equal(r.redisErrors, 0, `Redis was taken for down: ${JSON.stringify(r)}`)
    })

    test(`${label}: close() with gets in flight: each resolves with the value or rejects ERR_CLOSED, never undefined`, { timeout: 60_000 }, async () => {
      await started
      const r = await run('closeInFlight', redis.url)
      assert.equal(r.undefined, 0, JSON.stringify(r))
      assert.equal(r.other, 0, JSON.stringify(r))
      assert.equal(r.value + r.closed, 50)
    })
  }
}
