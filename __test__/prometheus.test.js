'use strict'
// stampede-cache/prometheus with the real prom-client, scraped over HTTP from a /metrics endpoint
// as Prometheus would scrape it: during a 1,000-caller stampede with one load, the metrics say so.
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const client = require('prom-client')
const { StampedeCache } = require('..')
const { register } = require('../prometheus')
const { RedisServer, waitFor, killAllSync } = require('./helpers/redis-server')
const { deferred, throwsWithCode } = require('./helpers/assertions')

after(() => killAllSync())

/** A /metrics endpoint for `registry` on a free port; closed after the test. */
async function serveMetrics(t, registry) {
  const server = http.createServer(async (req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end()
      return
    }
    res.writeHead(200, { 'content-type': registry.contentType })
    res.end(await registry.metrics())
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => new Promise((resolve) => server.close(resolve)))
  const { port } = server.address()
  return async function scrape() {
    const { status, type, body } = await new Promise((resolve, reject) => {
      http
        .get({ host: '127.0.0.1', port, path: '/metrics', agent: false }, (res) => {
          let text = ''
          res.setEncoding('utf8')
          res.on('data', (d) => (text += d))
          res.on('end', () => resolve({ status: res.statusCode, type: res.headers['content-type'], body: text }))
        })
        .on('error', reject)
    })
    assert.equal(status, 200)
    assert.match(type, /^text\/plain; version=0\.0\.4/)
    return parseExposition(body)
  }
}

/** The text exposition format as { types: name -> type, value(name, labels) }. */
function parseExposition(text) {
  const types = new Map()
  const samples = []
  for (const line of text.split('\n')) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line)
    if (type) types.set(type[1], type[2])
    if (line === '' || line.startsWith('#')) continue
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    assert.ok(m, `a sample line: ${line}`)
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map(([, k, v]) => [k, v]))
    samples.push({ name: m[1], labels, value: Number(m[3]) })
  }
  return {
    types,
    samples,
    /** The value of the one sample of `name` whose labels include `labels`; undefined if none. */
    value(name, labels = {}) {
      const found = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
      assert.ok(found.length <= 1, `one sample of ${name} ${JSON.stringify(labels)}`)
      return found[0]?.value
    },
  }
}

test('a 1,000-caller stampede with one load, scraped from /metrics while it runs and after', { timeout: 30_000 }, async (t) => {
  const registry = new client.Registry()
  const scrape = await serveMetrics(t, registry)
  const cache = new StampedeCache({ namespace: 'feeds' })
  t.after(() => cache.close())
  const handle = register(cache, { registry })
  t.after(() => handle.stop())

  const source = deferred()
  let loaderCalls = 0
  const callers = Array.from({ length: 1_000 }, () =>
    cache.getOrLoad('feed:42', () => {
      loaderCalls++
      return source.promise
    }),
  )
  await waitFor(() => loaderCalls === 1, { what: 'the load to start' })

  // During the stampede: 1,000 misses, 999 of them joined the one load that is running.
  let m = await scrape()
  const ns = { namespace: 'feeds' }
  assert.equal(m.value('stampede_cache_lookups_total', { ...ns, result: 'miss' }), 1_000)
  assert.equal(m.value('stampede_cache_lookups_total', { ...ns, result: 'hit' }), 0)
  assert.equal(m.value('stampede_cache_coalesced_calls_total', ns), 999)
  assert.equal(m.value('stampede_cache_loads_total', ns), 1)
  assert.equal(m.value('stampede_cache_loads_in_progress', { ...ns, reason: 'cold' }), 1)
  assert.equal(m.value('stampede_cache_load_duration_seconds_count', { ...ns, reason: 'cold' }), undefined, 'not ended yet')

  source.resolve({ items: [1, 2, 3] })
  const values = await Promise.all(callers)
  assert.ok(values.every((v) => v.items.length === 3))
  for (let i = 0; i < 100; i++) await cache.getOrLoad('feed:42', () => null)

  // After: the one load ended, and the next 100 reads were hits.
  m = await scrape()
  assert.equal(loaderCalls, 1)
  assert.equal(m.value('stampede_cache_loads_total', ns), 1)
  assert.equal(m.value('stampede_cache_loads_in_progress', { ...ns, reason: 'cold' }), 0)
  assert.equal(m.value('stampede_cache_load_duration_seconds_count', { ...ns, reason: 'cold', outcome: 'success' }), 1)
  assert.equal(m.value('stampede_cache_load_duration_seconds_bucket', { ...ns, reason: 'cold', outcome: 'success', le: '+Inf' }), 1)
  assert.ok(m.value('stampede_cache_load_duration_seconds_sum', { ...ns, reason: 'cold', outcome: 'success' }) < 30, 'seconds')
  assert.equal(m.value('stampede_cache_lookups_total', { ...ns, result: 'hit' }), 100)
  assert.equal(m.value('stampede_cache_lookups_total', { ...ns, result: 'miss' }), 1_000)
  const s = cache.stats()
  for (const [result, field] of [
    ['hit', 'hits'],
    ['stale_hit', 'staleHits'],
    ['negative_hit', 'negativeHits'],
    ['miss', 'misses'],
  ]) {
    assert.equal(m.value('stampede_cache_lookups_total', { ...ns, result }), s[field], result)
  }
  for (const [name, field] of [
    ['refreshes_total', 'refreshes'],
    ['refresh_errors_total', 'refreshErrors'],
    ['redis_errors_total', 'redisErrors'],
    ['replay_dropped_total', 'replayDropped'],
  ]) {
    assert.equal(m.value(`stampede_cache_${name}`, ns), s[field], name)
  }
  // Prometheus types and names: counters end in _total, the histogram is in seconds.
  assert.equal(m.types.get('stampede_cache_lookups_total'), 'counter')
  assert.equal(m.types.get('stampede_cache_load_duration_seconds'), 'histogram')
  assert.equal(m.types.get('stampede_cache_loads_in_progress'), 'gauge')
  assert.equal(m.types.get('stampede_cache_replay_queued'), 'gauge')
  assert.equal(m.value('stampede_cache_replay_queued', ns), 0)
  for (const [name, type] of m.types) if (type === 'counter') assert.match(name, /_total$/)
})

test('Redis: 1,000 callers over two instances, one load; lock outcomes and invalidations labelled; one registry sums the namespace', {
  timeout: 60_000,
}, async (t) => {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const registry = new client.Registry()
  const scrape = await serveMetrics(t, registry)
  const options = { redis: redis.url, namespace: `prom${process.pid}`, jitter: 0, beta: 0, lockTtl: 10_000 }
  const a = new StampedeCache(options)
  const b = new StampedeCache(options)
  t.after(() => Promise.all([a.close(), b.close()]))
  const handles = [a, b].map((cache) => register(cache, { registry, prefix: 'app_cache_' }))
  t.after(() => handles.forEach((h) => h.stop()))

  const source = deferred()
  let loaderCalls = 0
  const loader = () => {
    loaderCalls++
    return source.promise
  }
  const fromA = Array.from({ length: 500 }, () => a.getOrLoad('hot', loader))
  await waitFor(() => loaderCalls === 1, { what: 'A loading' })
  const fromB = Array.from({ length: 500 }, () => b.getOrLoad('hot', loader))
  await waitFor(() => b._debugCounts().lockWaiters === 1, { what: 'B waiting for the lock' })
  let m = await scrape()
  const ns = { namespace: options.namespace }
  assert.equal(m.value('app_cache_lookups_total', { ...ns, result: 'miss' }), 1_000)
  assert.equal(m.value('app_cache_coalesced_calls_total', ns), 998)
  assert.equal(m.value('app_cache_lock_attempts_total', { ...ns, outcome: 'won', reason: 'cold' }), 1)
  assert.equal(m.value('app_cache_loads_in_progress', { ...ns, reason: 'cold' }), 1)

  source.resolve('v1')
  assert.ok((await Promise.all([...fromA, ...fromB])).every((v) => v === 'v1'))
  await b.delete('hot')
  await waitFor(() => a._debugCounts().inboxKeys === 1, { what: 'A hearing the delete' })
  assert.equal(await a.get('hot'), undefined)
  m = await scrape()
  assert.equal(loaderCalls, 1)
  assert.equal(m.value('app_cache_loads_total', ns), 1)
  assert.equal(m.value('app_cache_lock_attempts_total', { ...ns, outcome: 'waited', reason: 'cold' }), 1)
  assert.equal(m.value('app_cache_invalidations_total', { ...ns, source: 'local' }), 1)
  // A's write-back woke B (heard as k dropped there), and B's delete reached A.
  assert.equal(m.value('app_cache_invalidations_total', { ...ns, source: 'bus' }), 2)
  assert.equal(m.value('app_cache_redis_errors_total', ns), 0)
  assert.equal(m.value('stampede_cache_loads_total', ns), undefined, 'the prefix is honoured')
})

test('caches share metrics by registry and prefix; stop() keeps totals and the last one out removes the metrics', { timeout: 30_000 }, async (t) => {
  const registry = new client.Registry()
  const scrape = await serveMetrics(t, registry)
  const a = new StampedeCache({ namespace: 'one' })
  const b = new StampedeCache({ namespace: 'one' })
  const c = new StampedeCache({ namespace: 'two' })
  t.after(() => Promise.all([a.close(), b.close(), c.close()]))
  const [ha, hb, hc] = [a, b, c].map((cache) => register(cache, { registry }))
  await a.getOrLoad('k', () => 1)
  await b.getOrLoad('k', () => 1)
  await c.getOrLoad('k', () => 1)
  let m = await scrape()
  assert.equal(m.value('stampede_cache_loads_total', { namespace: 'one' }), 2)
  assert.equal(m.value('stampede_cache_loads_total', { namespace: 'two' }), 1)
  hb.stop()
  await b.getOrLoad('j', () => 1)
  m = await scrape()
  assert.equal(m.value('stampede_cache_loads_total', { namespace: 'one' }), 2, "b's load before stop() stays, the one after is not counted")
  ha.stop()
  hc.stop()
  hc.stop()
  m = await scrape()
  assert.equal(m.samples.length, 0, 'no metric left')
  assert.equal(registry.getSingleMetric('stampede_cache_loads_total'), undefined)
  // Registering again works (the names are free again).
  const again = register(a, { registry })
  t.after(() => again.stop())
  assert.equal((await scrape()).value('stampede_cache_loads_total', { namespace: 'one' }), a.stats().loads)
})

test('register() uses the global registry by default and refuses bad arguments, naming them', async () => {
  const cache = new StampedeCache({ namespace: 'global' })
  const handle = register(cache)
  try {
    await cache.getOrLoad('k', () => 1)
    assert.match(await client.register.metrics(), /stampede_cache_loads_total\{namespace="global"\} 1/)
  } finally {
    handle.stop()
  }
  assert.equal(client.register.getSingleMetric('stampede_cache_loads_total'), undefined)
  throwsWithCode(() => register('cache'), 'ERR_INVALID_ARGUMENT', 'StampedeCache')
  throwsWithCode(() => register(cache, { registry: {} }), 'ERR_INVALID_OPTION', 'registry')
  throwsWithCode(() => register(cache, { prefix: 'bad-prefix' }), 'ERR_INVALID_OPTION', 'prefix')
  throwsWithCode(() => register(cache, { labels: {} }), 'ERR_INVALID_OPTION', 'labels')
  await cache.close()
})

test('changes waiting for Redis are a gauge, and the replay bound a counter, per namespace', { timeout: 30_000 }, async (t) => {
  const registry = new client.Registry()
  const scrape = await serveMetrics(t, registry)
  // A port nobody listens on: every change is applied here, queued and rejected.
  const closed = await new Promise((resolve) => {
    const server = require('node:net').createServer()
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
  const cache = new StampedeCache({ redis: `redis://127.0.0.1:${closed}`, namespace: 'queued', onError() {} })
  t.after(() => cache.close())
  const handle = register(cache, { registry })
  t.after(() => handle.stop())
  for (const k of ['a', 'b', 'c']) {
    await assert.rejects(cache.set(k, 1), (err) => err.code === 'ERR_REDIS' && err.queued === true)
  }
  const m = await scrape()
  assert.equal(cache.stats().replayQueued, 3)
  assert.equal(m.value('stampede_cache_replay_queued', { namespace: 'queued' }), 3)
  assert.equal(m.value('stampede_cache_replay_dropped_total', { namespace: 'queued' }), 0)
})
