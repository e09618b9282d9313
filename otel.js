'use strict'
// stampede-cache/otel: OpenTelemetry metrics and load spans for a StampedeCache, through
// @opentelemetry/api (an optional peer dependency: install it, and an SDK, to use this).
//
// Names follow the OpenTelemetry semantic-convention style: a `stampede_cache.` namespace,
// attributes rather than one metric per variant, UCUM units (`s`, `{lookup}`), no `_total`.
// Counts stats() keeps are read from it at collection time (asynchronous counters), so metrics
// cost the hot path nothing; load times, lock outcomes and invalidations come from the
// diagnostics channels (README, "Observability").

const { createHash } = require('node:crypto')
const { isError } = require('./lib/errors.js')
const { Watched, loadChannel, loadOutcome, checkCache, checkOptions } = require('./observability.js')

let api
try {
  api = require('@opentelemetry/api')
} catch (cause) {
  throw new Error('stampede-cache/otel needs @opentelemetry/api: npm install @opentelemetry/api', { cause })
}

const { version } = require('./package.json')

const SCOPE = 'stampede-cache'
const NAMESPACE = 'stampede_cache.namespace'
// The semantic conventions' own buckets for durations in seconds (as for http.*.duration).
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]

/** One meter's instruments and the caches it reports, shared by every instrument() on it. */
const byMeter = new WeakMap()

function meterGroup(meter) {
  let group = byMeter.get(meter)
  if (group !== undefined) return group
  const lookups = meter.createObservableCounter('stampede_cache.lookups', {
    unit: '{lookup}',
    description: 'Reads of the in-process tier (getOrLoad and get), by stampede_cache.lookup.result: hit, stale_hit, negative_hit or miss',
  })
  const counters = {
    coalesced: meter.createObservableCounter('stampede_cache.coalesced_calls', {
      unit: '{call}',
      description: 'Calls that joined a load already running for their key instead of starting one',
    }),
    loads: meter.createObservableCounter('stampede_cache.loads', {
      unit: '{load}',
      description: 'Loader calls (cold loads, background refreshes and forced refreshes)',
    }),
    refreshes: meter.createObservableCounter('stampede_cache.refreshes', {
      unit: '{refresh}',
      description: 'Loader calls that were background refreshes (stale or XFetch early)',
    }),
    refreshErrors: meter.createObservableCounter('stampede_cache.refresh.errors', {
      unit: '{error}',
      description: 'Background refreshes whose loader failed (the stale value stayed served)',
    }),
    redisErrors: meter.createObservableCounter('stampede_cache.redis.errors', {
      unit: '{error}',
      description: 'Redis commands that failed or timed out (the cache degraded to the in-process tier)',
    }),
    replayDropped: meter.createObservableCounter('stampede_cache.replay.dropped', {
      unit: '{change}',
      description: 'Changes Redis could not take that were dropped past the replay bound (10,000 a cache)',
    }),
  }
  const replayQueued = meter.createObservableGauge('stampede_cache.replay.queued', {
    unit: '{change}',
    description: 'Changes Redis could not take, waiting to be replayed in order once it answers',
  })
  const watched = new Watched({
    loadStart(context) {
      group.activeLoads.add(1, loadAttributes(context))
    },
    loadEnd(context, seconds) {
      const attributes = loadAttributes(context)
      group.activeLoads.add(-1, attributes)
      const outcome = loadOutcome(context)
      if (outcome !== 'success') attributes['error.type'] = errorType(context.error)
      group.loadDuration.record(seconds, attributes)
    },
    lock(message) {
      group.lockAttempts.add(1, {
        [NAMESPACE]: message.namespace,
        'stampede_cache.lock.outcome': message.outcome,
        'stampede_cache.load.reason': message.reason,
      })
    },
    invalidate(message) {
      group.invalidations.add(1, { [NAMESPACE]: message.namespace, 'stampede_cache.invalidation.source': message.source })
    },
  })
  const observe = (result) => {
    for (const [namespace, s] of watched.totals()) {
      const ns = { [NAMESPACE]: namespace }
      result.observe(lookups, s.hits, { ...ns, 'stampede_cache.lookup.result': 'hit' })
      result.observe(lookups, s.staleHits, { ...ns, 'stampede_cache.lookup.result': 'stale_hit' })
      result.observe(lookups, s.negativeHits, { ...ns, 'stampede_cache.lookup.result': 'negative_hit' })
      result.observe(lookups, s.misses, { ...ns, 'stampede_cache.lookup.result': 'miss' })
      // Missed in process, answered by Redis (not counted as misses).
      result.observe(lookups, s.l2Hits, { ...ns, 'stampede_cache.lookup.result': 'l2_hit' })
      for (const [field, instrument] of Object.entries(counters)) result.observe(instrument, s[field], ns)
    }
    for (const [namespace, queued] of watched.replayQueued()) result.observe(replayQueued, queued, { [NAMESPACE]: namespace })
  }
  group = {
    watched,
    observe,
    observables: [lookups, replayQueued, ...Object.values(counters)],
    loadDuration: meter.createHistogram('stampede_cache.load.duration', {
      unit: 's',
      description: 'How long loader calls took, by stampede_cache.load.reason (and error.type when one failed or timed out)',
      advice: { explicitBucketBoundaries: DURATION_BUCKETS },
    }),
    activeLoads: meter.createUpDownCounter('stampede_cache.load.active', {
      unit: '{load}',
      description: 'Loader calls running now, by stampede_cache.load.reason',
    }),
    lockAttempts: meter.createCounter('stampede_cache.lock.attempts', {
      unit: '{attempt}',
      description: 'Bids for the cross-process Redis lock, by stampede_cache.lock.outcome: won, waited, took_over, gave_up or skipped',
    }),
    invalidations: meter.createCounter('stampede_cache.invalidations', {
      unit: '{invalidation}',
      description: 'In-process entries dropped or replaced, by stampede_cache.invalidation.source: local (set/delete here) or bus (another process)',
    }),
  }
  byMeter.set(meter, group)
  return group
}

function loadAttributes(context) {
  return { [NAMESPACE]: context.namespace, 'stampede_cache.load.reason': context.reason }
}

// Low-cardinality, as error.type asks: the error's code, else its class name.
function errorType(err) {
  if (typeof err?.code === 'string' && err.code !== '') return err.code
  const name = err?.constructor?.name
  return typeof name === 'string' && name !== '' ? name : '_OTHER'
}

function hashKey(key) {
  return createHash('sha256').update(key).digest('hex').slice(0, 16)
}

// Spans: one bound "store" on the load channel's start makes the load span the active context
// while the loader runs, so what the loader does (a database query, an HTTP call) is traced
// under it. Node runs `store.run(transform(context), loader)`; our store runs the loader inside
// the span's OpenTelemetry context. Tracers by cache: every instrument()ed cache shares it.
const tracedCaches = new Map()
const spans = new WeakMap()
const spanStore = {
  run(otelContext, fn, ...args) {
    return api.context.with(otelContext, fn, undefined, ...args)
  },
}

function startSpan(context) {
  const active = api.context.active()
  const traced = tracedCaches.get(context.cache)
  if (traced === undefined) return active
  const attributes = {
    [NAMESPACE]: context.namespace,
    'stampede_cache.load.reason': context.reason,
  }
  if (traced.keys === 'raw') attributes['stampede_cache.key'] = context.key
  else if (traced.keys === 'hash') attributes['stampede_cache.key.hash'] = hashKey(context.key)
  else if (typeof traced.keys === 'function') attributes['stampede_cache.key'] = String(traced.keys(context.key))
  const span = traced.tracer.startSpan('stampede_cache.load', { kind: api.SpanKind.INTERNAL, attributes }, active)
  spans.set(context, span)
  return api.trace.setSpan(active, span)
}

const spanHandlers = {
  error(context) {
    const span = spans.get(context)
    if (span === undefined) return
    const err = context.error
    span.setAttribute('error.type', errorType(err))
    // A loader's Error from another realm (a vm context, a test sandbox) is an Error too.
    if (isError(err)) span.recordException(err)
    span.setStatus({ code: api.SpanStatusCode.ERROR, message: isError(err) ? err.message : String(err) })
  },
  asyncEnd(context) {
    endSpan(context)
  },
  end(context) {
    // A loader call that threw before returning a promise has no asyncEnd.
    if ('error' in context && !('result' in context)) endSpan(context)
  },
}

function endSpan(context) {
  const span = spans.get(context)
  if (span === undefined) return
  spans.delete(context)
  span.end()
}

function traceCache(cache, tracer, keys) {
  if (tracedCaches.size === 0) {
    loadChannel.start.bindStore(spanStore, startSpan)
    loadChannel.subscribe(spanHandlers)
  }
  tracedCaches.set(cache, { tracer, keys })
}

function untraceCache(cache) {
  if (!tracedCaches.delete(cache) || tracedCaches.size > 0) return
  loadChannel.start.unbindStore(spanStore)
  loadChannel.unsubscribe(spanHandlers)
}

const OPTIONS = ['meterProvider', 'tracerProvider', 'metrics', 'traces', 'keys']

/**
 * Reports `cache` to OpenTelemetry: metrics through `meterProvider` (default: the global one) and
 * a span per loader call through `tracerProvider` (default: the global one). `keys` says what a
 * span tells of the key: 'hash' (default: a SHA-256 prefix), 'omit', 'raw', or a function.
 * Returns `{ stop() }`, which ends the reporting (counters keep their totals).
 */
function instrument(cache, options) {
  checkCache(cache, 'instrument()')
  const o = checkOptions(options, 'instrument()', OPTIONS)
  const keys = o.keys ?? 'hash'
  if (!['hash', 'omit', 'raw'].includes(keys) && typeof keys !== 'function') {
    throw invalidOption('keys', "must be 'hash', 'omit', 'raw' or a function")
  }
  for (const name of ['metrics', 'traces']) {
    if (o[name] !== undefined && typeof o[name] !== 'boolean') throw invalidOption(name, 'must be a boolean')
  }
  if (o.meterProvider !== undefined && typeof o.meterProvider?.getMeter !== 'function') {
    throw invalidOption('meterProvider', 'must be a MeterProvider (an object with getMeter)')
  }
  if (o.tracerProvider !== undefined && typeof o.tracerProvider?.getTracer !== 'function') {
    throw invalidOption('tracerProvider', 'must be a TracerProvider (an object with getTracer)')
  }
  let group
  if (o.metrics !== false) {
    const meter = (o.meterProvider ?? api.metrics.getMeterProvider()).getMeter(SCOPE, version)
    group = meterGroup(meter)
    if (group.watched.caches.size === 0) meter.addBatchObservableCallback(group.observe, group.observables)
    group.watched.add(cache)
    group.meter = meter
  }
  const traced = o.traces !== false
  if (traced) traceCache(cache, (o.tracerProvider ?? api.trace.getTracerProvider()).getTracer(SCOPE, version), keys)
  let stopped = false
  return {
    stop() {
      if (stopped) return
      stopped = true
      if (group !== undefined && group.watched.delete(cache) && group.watched.caches.size === 0) {
        // Nothing left to observe: the totals of the caches reported so far stay in `retired`
        // and come back with the next cache instrumented on this meter.
        group.meter.removeBatchObservableCallback(group.observe, group.observables)
      }
      if (traced) untraceCache(cache)
    },
  }
}

function invalidOption(name, why) {
  const { StampedeCacheError } = require('./index.js')
  return new StampedeCacheError('ERR_INVALID_OPTION', `option \`${name}\` of instrument() ${why}`)
}

module.exports = { instrument }
