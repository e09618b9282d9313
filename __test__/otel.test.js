'use strict'
// stampede-cache/otel with the real OpenTelemetry SDK: metrics read through
// @opentelemetry/sdk-metrics' in-memory exporter, spans through @opentelemetry/sdk-trace-base's
// in-memory span exporter, with the async-hooks context manager a Node app registers.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { createHash } = require('node:crypto')
const dc = require('node:diagnostics_channel')
const api = require('@opentelemetry/api')
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks')
const { MeterProvider, PeriodicExportingMetricReader, InMemoryMetricExporter, AggregationTemporality, DataPointType } = require('@opentelemetry/sdk-metrics')
const { BasicTracerProvider, SimpleSpanProcessor, InMemorySpanExporter } = require('@opentelemetry/sdk-trace-base')
const { StampedeCache } = require('..')
const { instrument } = require('../otel')
const { RedisServer, waitFor, killAllSync } = require('./helpers/redis-server')
const { deferred, sleep, throwsWithCode } = require('./helpers/assertions')

let contextManager
before(() => {
  contextManager = new AsyncLocalStorageContextManager().enable()
  api.context.setGlobalContextManager(contextManager)
})
after(() => {
  api.context.disable()
  killAllSync()
})

/** A meter provider whose metrics a test reads on demand. */
function metricsSdk(t) {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE)
  // Exports only when the test flushes.
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 })
  const meterProvider = new MeterProvider({ readers: [reader] })
  t.after(() => meterProvider.shutdown())
  return {
    meterProvider,
    /** The metrics now, by name: { descriptor, points: [{ attributes, value }] }. */
    async collect() {
      await reader.forceFlush()
      const out = new Map()
      const last = exporter.getMetrics().at(-1)
      exporter.reset()
      for (const scope of last?.scopeMetrics ?? []) {
        assert.equal(scope.scope.name, 'stampede-cache')
        for (const m of scope.metrics) out.set(m.descriptor.name, { descriptor: m.descriptor, type: m.dataPointType, points: m.dataPoints })
      }
      return out
    },
  }
}

/** The value of the point of `metric` whose attributes include `attrs` (0 when none). */
function valueOf(metrics, name, attrs = {}) {
  const m = metrics.get(name)
  assert.ok(m, `metric ${name} reported`)
  const matching = m.points.filter((p) => Object.entries(attrs).every(([k, v]) => p.attributes[k] === v))
  if (matching.length === 0) return 0
  assert.equal(matching.length, 1, `one point of ${name} for ${JSON.stringify(attrs)}`)
  const v = matching[0].value
  return typeof v === 'number' ? v : v.count
}

function tracingSdk(t) {
  const exporter = new InMemorySpanExporter()
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] })
  t.after(() => tracerProvider.shutdown())
  return { tracerProvider, exporter, tracer: tracerProvider.getTracer('app') }
}

const parentOf = (span) => span.parentSpanContext?.spanId ?? span.parentSpanId

test('metrics: every stats() count, loads by reason with error.type, names and units in the semantic-convention style', { timeout: 30_000 }, async (t) => {
  const sdk = metricsSdk(t)
  const cache = new StampedeCache({ namespace: 'feeds', ttl: 2_000, jitter: 0, beta: 0 })
  t.after(() => cache.close())
  const handle = instrument(cache, { meterProvider: sdk.meterProvider, traces: false })
  t.after(() => handle.stop())
  // Metrics read stats() when collected: nothing listens to the hit channel, so hits stay free.
  assert.equal(dc.channel('stampede-cache:hit').hasSubscribers, false)

  const gate = deferred()
  const callers = Array.from({ length: 50 }, () => cache.getOrLoad('a', () => gate.promise))
  await sleep(10)
  let m = await sdk.collect()
  assert.equal(valueOf(m, 'stampede_cache.load.active', { 'stampede_cache.load.reason': 'cold' }), 1, 'one load running')
  gate.resolve({ v: 1 })
  await Promise.all(callers)
  for (let i = 0; i < 10; i++) await cache.getOrLoad('a', () => 0)
  await cache.getOrLoad('missing', () => undefined)
  await cache.getOrLoad('missing', () => 0)
  await assert.rejects(
    cache.getOrLoad('bad', async () => {
      throw Object.assign(new Error('source down'), { code: 'ESOURCE' })
    }),
  )
  await sleep(2_100)
  await cache.getOrLoad('a', () => ({ v: 2 }))
  await cache.settle()
  await cache.getOrLoad('a', () => ({ v: 3 }), { forceRefresh: true })

  m = await sdk.collect()
  const s = cache.stats()
  const ns = { 'stampede_cache.namespace': 'feeds' }
  const lookup = (result) => valueOf(m, 'stampede_cache.lookups', { ...ns, 'stampede_cache.lookup.result': result })
  assert.deepEqual(
    { hit: lookup('hit'), stale: lookup('stale_hit'), negative: lookup('negative_hit'), miss: lookup('miss') },
    { hit: s.hits, stale: s.staleHits, negative: s.negativeHits, miss: s.misses },
  )
  assert.deepEqual([s.hits, s.staleHits, s.negativeHits, s.misses], [10, 1, 1, 53])
  assert.equal(valueOf(m, 'stampede_cache.coalesced_calls', ns), 49)
  assert.equal(valueOf(m, 'stampede_cache.loads', ns), s.loads)
  assert.equal(s.loads, 5)
  assert.equal(valueOf(m, 'stampede_cache.refreshes', ns), 1)
  assert.equal(valueOf(m, 'stampede_cache.refresh.errors', ns), 0)
  assert.equal(valueOf(m, 'stampede_cache.redis.errors', ns), 0)
  assert.equal(valueOf(m, 'stampede_cache.replay.dropped', ns), s.replayDropped)
  assert.equal(valueOf(m, 'stampede_cache.replay.queued', ns), s.replayQueued)

  // Load times by reason; a failed load carries error.type (the error's code).
  const duration = m.get('stampede_cache.load.duration')
  assert.equal(duration.type, DataPointType.HISTOGRAM)
  const loads = duration.points.map((p) => [p.attributes['stampede_cache.load.reason'], p.attributes['error.type'] ?? null, p.value.count]).sort()
  assert.deepEqual(loads, [
    ['cold', null, 2],
    ['cold', 'ESOURCE', 1],
    ['force', null, 1],
    ['refresh', null, 1],
  ])
  assert.deepEqual(duration.points[0].value.buckets.boundaries, [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10])
  assert.ok(
    duration.points.every((p) => p.value.sum >= 0 && p.value.sum < 30),
    'seconds, not milliseconds',
  )
  assert.equal(valueOf(m, 'stampede_cache.load.active', { 'stampede_cache.load.reason': 'cold' }), 0)
  assert.ok(
    m.get('stampede_cache.load.active').points.every((p) => p.value === 0),
    'no load left running',
  )

  // Names and units (the lock and invalidation counters have points only with Redis or writes:
  // see the Redis test).
  const units = Object.fromEntries([...m].map(([name, x]) => [name, x.descriptor.unit]))
  assert.deepEqual(units, {
    'stampede_cache.lookups': '{lookup}',
    'stampede_cache.coalesced_calls': '{call}',
    'stampede_cache.loads': '{load}',
    'stampede_cache.refreshes': '{refresh}',
    'stampede_cache.refresh.errors': '{error}',
    'stampede_cache.redis.errors': '{error}',
    'stampede_cache.replay.dropped': '{change}',
    'stampede_cache.replay.queued': '{change}',
    'stampede_cache.load.duration': 's',
    'stampede_cache.load.active': '{load}',
  })
  for (const [name, x] of m) assert.ok(x.descriptor.description.length > 20, `${name} is described`)
  // No _total, no capitals: the semantic conventions' naming.
  for (const name of m.keys()) assert.match(name, /^stampede_cache(\.[a-z][a-z_]*)+$/)
})

test('metrics: two caches of one namespace are summed, other namespaces apart; stop() keeps the totals and ends the reporting', {
  timeout: 30_000,
}, async (t) => {
  const sdk = metricsSdk(t)
  const a = new StampedeCache({ namespace: 'one' })
  const b = new StampedeCache({ namespace: 'one' })
  const c = new StampedeCache({ namespace: 'two' })
  t.after(() => Promise.all([a.close(), b.close(), c.close()]))
  const handles = [a, b, c].map((cache) => instrument(cache, { meterProvider: sdk.meterProvider }))
  t.after(() => handles.forEach((h) => h.stop()))
  await a.getOrLoad('k', () => 1)
  await b.getOrLoad('k', () => 1)
  await b.getOrLoad('j', () => 1)
  await c.getOrLoad('k', () => 1)
  let m = await sdk.collect()
  assert.equal(valueOf(m, 'stampede_cache.loads', { 'stampede_cache.namespace': 'one' }), 3)
  assert.equal(valueOf(m, 'stampede_cache.loads', { 'stampede_cache.namespace': 'two' }), 1)
  handles[1].stop()
  handles[1].stop()
  await a.getOrLoad('x', () => 1)
  await b.getOrLoad('x', () => 1)
  m = await sdk.collect()
  // b's 2 loads so far stay counted; its later load is not reported.
  assert.equal(valueOf(m, 'stampede_cache.loads', { 'stampede_cache.namespace': 'one' }), 4)
  for (const h of handles) h.stop()
  await a.getOrLoad('y', () => 1)
  await c.getOrLoad('y', () => 1)
  m = await sdk.collect()
  // Every cache stopped: nothing new is observed (the SDK may repeat the last cumulative points).
  assert.ok([0, 4].includes(valueOf(m, 'stampede_cache.loads', { 'stampede_cache.namespace': 'one' })))
  assert.ok([0, 1].includes(valueOf(m, 'stampede_cache.loads', { 'stampede_cache.namespace': 'two' })))
  // And the channels are quiet again: nothing of ours still listens.
  assert.equal(dc.tracingChannel('stampede-cache:load').hasSubscribers, false)
  assert.equal(dc.channel('stampede-cache:lock').hasSubscribers, false)
  assert.equal(dc.channel('stampede-cache:invalidate').hasSubscribers, false)
})

test("spans: one per loader call, under the caller's span, with what the loader does under it; keys hashed by default", { timeout: 30_000 }, async (t) => {
  const { tracerProvider, exporter, tracer } = tracingSdk(t)
  const cache = new StampedeCache({ namespace: 'users' })
  t.after(() => cache.close())
  const handle = instrument(cache, { tracerProvider, metrics: false })
  t.after(() => handle.stop())

  // A request span; 20 callers inside it share one load, whose loader queries a "database".
  await tracer.startActiveSpan('GET /users/42', async (request) => {
    const values = await Promise.all(
      Array.from({ length: 20 }, () =>
        cache.getOrLoad('user:42', async () => {
          const query = tracer.startSpan('SELECT users')
          await sleep(5)
          query.end()
          return { id: 42 }
        }),
      ),
    )
    assert.ok(values.every((v) => v.id === 42))
    request.end()
  })
  // A hit makes no span.
  await cache.getOrLoad('user:42', () => 0)
  const spans = exporter.getFinishedSpans()
  const byName = (name) => spans.filter((s) => s.name === name)
  assert.deepEqual(spans.map((s) => s.name).sort(), ['GET /users/42', 'SELECT users', 'stampede_cache.load'])
  const [request] = byName('GET /users/42')
  const [load] = byName('stampede_cache.load')
  const [query] = byName('SELECT users')
  assert.equal(parentOf(load), request.spanContext().spanId, 'the load is under the request that led it')
  assert.equal(parentOf(query), load.spanContext().spanId, "the loader's work is under the load")
  assert.equal(load.spanContext().traceId, request.spanContext().traceId)
  assert.equal(load.kind, api.SpanKind.INTERNAL)
  assert.equal(load.status.code, api.SpanStatusCode.UNSET)
  assert.deepEqual(load.attributes, {
    'stampede_cache.namespace': 'users',
    'stampede_cache.load.reason': 'cold',
    'stampede_cache.key.hash': createHash('sha256').update('user:42').digest('hex').slice(0, 16),
  })
  assert.ok(!JSON.stringify(spans.map((s) => s.attributes)).includes('user:42'), 'the key itself is nowhere')
})

test('spans: an Error from another realm (a vm context) is recorded as an exception, with its message', async (t) => {
  const { tracerProvider, exporter } = tracingSdk(t)
  const cache = new StampedeCache()
  t.after(() => cache.close())
  instrument(cache, { tracerProvider, metrics: false })
  const foreign = require('node:vm').runInNewContext('new Error("from a sandbox")')
  await assert.rejects(
    cache.getOrLoad('v:1', () => Promise.reject(foreign)),
    (err) => err === foreign,
  )
  const [span] = exporter.getFinishedSpans()
  assert.equal(span.status.message, 'from a sandbox')
  assert.equal(span.events.filter((e) => e.name === 'exception').length, 1)
})

test('spans: a failed or timed-out load is an error span; keys omitted, raw or mapped by option; stop() ends the spans', { timeout: 30_000 }, async (t) => {
  const { tracerProvider, exporter } = tracingSdk(t)
  const mk = (keys) => {
    const cache = new StampedeCache({ loadTimeout: 100 })
    t.after(() => cache.close())
    return [cache, instrument(cache, { tracerProvider, metrics: false, keys })]
  }
  const [omit] = mk('omit')
  const [raw] = mk('raw')
  const [mapped, mappedHandle] = mk((key) => `tenant-${key.split(':')[0]}`)
  const failure = Object.assign(new Error('source down'), { code: 'ESOURCE' })
  await assert.rejects(
    omit.getOrLoad('o:1', () => Promise.reject(failure)),
    failure,
  )
  await assert.rejects(
    raw.getOrLoad('r:1', () => new Promise((resolve) => setTimeout(resolve, 1_000))),
    { code: 'ERR_LOAD_TIMEOUT' },
  )
  await mapped.getOrLoad('acme:7', () => 1)
  const spans = exporter.getFinishedSpans()
  assert.equal(spans.length, 3)
  const [failed, timedOut, ok] = spans.sort((x, y) => x.startTime[0] - y.startTime[0] || x.startTime[1] - y.startTime[1])
  assert.equal(failed.status.code, api.SpanStatusCode.ERROR)
  assert.equal(failed.status.message, 'source down')
  assert.equal(failed.attributes['error.type'], 'ESOURCE')
  assert.equal(failed.events.filter((e) => e.name === 'exception').length, 1, 'the exception is recorded')
  assert.ok(!('stampede_cache.key' in failed.attributes) && !('stampede_cache.key.hash' in failed.attributes), 'omitted')
  assert.equal(timedOut.attributes['error.type'], 'ERR_LOAD_TIMEOUT')
  assert.equal(timedOut.attributes['stampede_cache.key'], 'r:1')
  assert.equal(ok.attributes['stampede_cache.key'], 'tenant-acme')
  assert.equal(ok.status.code, api.SpanStatusCode.UNSET)

  mappedHandle.stop()
  await mapped.getOrLoad('acme:8', () => 1)
  await raw.getOrLoad('r:2', () => 1)
  assert.deepEqual(
    exporter
      .getFinishedSpans()
      .slice(3)
      .map((s) => s.attributes['stampede_cache.key']),
    ['r:2'],
    'no span for a stopped cache',
  )
})

test('Redis: lock outcomes and bus invalidations as metrics, from two instances sharing a Redis', { timeout: 60_000 }, async (t) => {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const sdk = metricsSdk(t)
  const options = { redis: redis.url, namespace: `otel${process.pid}`, jitter: 0, beta: 0, lockTtl: 10_000 }
  const a = new StampedeCache(options)
  const b = new StampedeCache(options)
  t.after(() => Promise.all([a.close(), b.close()]))
  const handles = [a, b].map((cache) => instrument(cache, { meterProvider: sdk.meterProvider, traces: false }))
  t.after(() => handles.forEach((h) => h.stop()))

  // 500 callers in each instance, one load in all: A's lock, B waits for its value.
  const gate = deferred()
  const fromA = Array.from({ length: 500 }, () => a.getOrLoad('hot', () => gate.promise))
  await waitFor(() => a.stats().lockWins === 1, { what: 'A holding the lock' })
  const fromB = Array.from({ length: 500 }, () => b.getOrLoad('hot', () => 'B loaded'))
  await waitFor(() => b._debugCounts().lockWaiters === 1, { what: 'B waiting' })
  gate.resolve('A loaded')
  const values = await Promise.all([...fromA, ...fromB])
  assert.ok(values.every((v) => v === 'A loaded'))
  // B replaces the value; A hears it and drops its copy at its next call.
  await b.set('hot', 'B set')
  await waitFor(() => a._debugCounts().inboxKeys === 1, { what: 'A hearing the set' })
  assert.equal(await a.getOrLoad('hot', () => 'x'), 'B set')

  const m = await sdk.collect()
  const ns = { 'stampede_cache.namespace': options.namespace }
  const attempts = (outcome) =>
    valueOf(m, 'stampede_cache.lock.attempts', { ...ns, 'stampede_cache.lock.outcome': outcome, 'stampede_cache.load.reason': 'cold' })
  assert.deepEqual({ won: attempts('won'), waited: attempts('waited') }, { won: 1, waited: 1 })
  assert.equal(m.get('stampede_cache.lock.attempts').descriptor.unit, '{attempt}')
  assert.equal(m.get('stampede_cache.invalidations').descriptor.unit, '{invalidation}')
  assert.equal(valueOf(m, 'stampede_cache.loads', ns), 1, 'one load for 1,000 callers')
  assert.equal(valueOf(m, 'stampede_cache.coalesced_calls', ns), 998)
  // A's write-back woke B and is heard as an invalidation there; B's set is local to B and
  // heard on the bus by A.
  const invalidations = (source) => valueOf(m, 'stampede_cache.invalidations', { ...ns, 'stampede_cache.invalidation.source': source })
  assert.deepEqual({ local: invalidations('local'), bus: invalidations('bus') }, { local: 1, bus: 2 })
})

test('instrument() refuses what is not a cache and bad options, naming them', () => {
  const cache = new StampedeCache()
  throwsWithCode(() => instrument({}), 'ERR_INVALID_ARGUMENT', 'StampedeCache')
  throwsWithCode(() => instrument(cache, { keys: 'sha1' }), 'ERR_INVALID_OPTION', 'keys')
  throwsWithCode(() => instrument(cache, { meterProvider: {} }), 'ERR_INVALID_OPTION', 'meterProvider')
  throwsWithCode(() => instrument(cache, { tracerProvider: 1 }), 'ERR_INVALID_OPTION', 'tracerProvider')
  throwsWithCode(() => instrument(cache, { metrics: 'yes' }), 'ERR_INVALID_OPTION', 'metrics')
  throwsWithCode(() => instrument(cache, { meter: {} }), 'ERR_INVALID_OPTION', 'meter')
  throwsWithCode(() => instrument(cache, null), 'ERR_INVALID_OPTION', 'options')
  return cache.close()
})
