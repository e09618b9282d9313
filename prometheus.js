'use strict'
// stampede-cache/prometheus: the figures of stampede-cache/otel as prom-client metrics (an
// optional peer dependency), labelled by namespace. Counts stats() keeps are read from it at
// scrape time; load times, lock outcomes and invalidations come from the diagnostics channels.

const { Watched, loadOutcome, checkCache, checkOptions } = require('./observability.js')
const { StampedeCacheError } = require('./index.js')

let client
try {
  client = require('prom-client')
} catch (cause) {
  throw new Error('stampede-cache/prometheus needs prom-client: npm install prom-client', { cause })
}

const DEFAULT_PREFIX = 'stampede_cache_'
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]

// stats() counters as Prometheus counters: name, help, and the stats() field each reads.
const FROM_STATS = [
  ['coalesced_calls_total', 'Calls that joined a load already running for their key instead of starting one', 'coalesced'],
  ['loads_total', 'Loader calls (cold loads, background refreshes and forced refreshes)', 'loads'],
  ['refreshes_total', 'Loader calls that were background refreshes (stale or XFetch early)', 'refreshes'],
  ['refresh_errors_total', 'Background refreshes whose loader failed (the stale value stayed served)', 'refreshErrors'],
  ['redis_errors_total', 'Redis commands that failed or timed out (the cache degraded to the in-process tier)', 'redisErrors'],
  ['replay_dropped_total', 'Changes Redis could not take that were dropped past the replay bound (10,000 a cache)', 'replayDropped'],
]
const LOOKUP_RESULTS = [
  ['hit', 'hits'],
  ['stale_hit', 'staleHits'],
  ['negative_hit', 'negativeHits'],
  ['miss', 'misses'],
  // Missed in process, answered by Redis (not counted as misses).
  ['l2_hit', 'l2Hits'],
]

/** Metrics by registry, then prefix: every register() on one registry and prefix shares them. */
const byRegistry = new WeakMap()

function metricsFor(registry, prefix) {
  let byPrefix = byRegistry.get(registry)
  if (byPrefix === undefined) byRegistry.set(registry, (byPrefix = new Map()))
  let group = byPrefix.get(prefix)
  if (group !== undefined) return group
  const registers = [registry]
  const metrics = []
  const watched = new Watched({
    loadStart(context) {
      inProgress.inc({ namespace: context.namespace, reason: context.reason })
    },
    loadEnd(context, seconds) {
      inProgress.dec({ namespace: context.namespace, reason: context.reason })
      duration.observe({ namespace: context.namespace, reason: context.reason, outcome: loadOutcome(context) }, seconds)
    },
    lock(message) {
      lockAttempts.inc({ namespace: message.namespace, outcome: message.outcome, reason: message.reason })
    },
    invalidate(message) {
      invalidations.inc({ namespace: message.namespace, source: message.source })
    },
  })
  // Counters read from stats() at scrape time: reset, then set to the totals.
  metrics.push(
    new client.Counter({
      name: `${prefix}lookups_total`,
      help: 'Reads of the in-process tier (getOrLoad and get), by result: hit, stale_hit, negative_hit or miss',
      labelNames: ['namespace', 'result'],
      registers,
      collect() {
        this.reset()
        for (const [namespace, s] of watched.totals()) {
          for (const [result, field] of LOOKUP_RESULTS) this.inc({ namespace, result }, s[field])
        }
      },
    }),
  )
  for (const [name, help, field] of FROM_STATS) {
    metrics.push(
      new client.Counter({
        name: `${prefix}${name}`,
        help,
        labelNames: ['namespace'],
        registers,
        collect() {
          this.reset()
          for (const [namespace, s] of watched.totals()) this.inc({ namespace }, s[field])
        },
      }),
    )
  }
  metrics.push(
    new client.Gauge({
      name: `${prefix}replay_queued`,
      help: 'Changes Redis could not take, waiting to be replayed in order once it answers',
      labelNames: ['namespace'],
      registers,
      collect() {
        this.reset()
        for (const [namespace, queued] of watched.replayQueued()) this.set({ namespace }, queued)
      },
    }),
  )
  const duration = new client.Histogram({
    name: `${prefix}load_duration_seconds`,
    help: 'How long loader calls took, by reason (cold, refresh, force) and outcome (success, error, timeout)',
    labelNames: ['namespace', 'reason', 'outcome'],
    buckets: DURATION_BUCKETS,
    registers,
  })
  const inProgress = new client.Gauge({
    name: `${prefix}loads_in_progress`,
    help: 'Loader calls running now, by reason',
    labelNames: ['namespace', 'reason'],
    registers,
  })
  const lockAttempts = new client.Counter({
    name: `${prefix}lock_attempts_total`,
    help: 'Bids for the cross-process Redis lock, by outcome (won, waited, took_over, gave_up, skipped) and reason (cold, refresh)',
    labelNames: ['namespace', 'outcome', 'reason'],
    registers,
  })
  const invalidations = new client.Counter({
    name: `${prefix}invalidations_total`,
    help: 'In-process entries dropped or replaced, by source: local (set/delete here) or bus (another process)',
    labelNames: ['namespace', 'source'],
    registers,
  })
  metrics.push(duration, inProgress, lockAttempts, invalidations)
  group = { watched, metrics }
  byPrefix.set(prefix, group)
  return group
}

/**
 * Adds `cache`'s metrics to `registry` (default: prom-client's global registry), named with
 * `prefix` (default 'stampede_cache_') and labelled by namespace. Caches registered on one
 * registry with one prefix share the metrics; caches with the same namespace are summed.
 * Returns `{ stop() }`: stops reporting this cache (totals keep what it counted); the metrics
 * leave the registry with the last cache stopped.
 */
function register(cache, options) {
  checkCache(cache, 'register()')
  const o = checkOptions(options, 'register()', ['registry', 'prefix'])
  const registry = o.registry ?? client.register
  if (typeof registry?.registerMetric !== 'function' || typeof registry?.metrics !== 'function') {
    throw new StampedeCacheError('ERR_INVALID_OPTION', 'option `registry` of register() must be a prom-client Registry')
  }
  const prefix = o.prefix ?? DEFAULT_PREFIX
  if (typeof prefix !== 'string' || !/^[a-zA-Z_:][a-zA-Z0-9_:]*$|^$/.test(prefix)) {
    throw new StampedeCacheError('ERR_INVALID_OPTION', 'option `prefix` of register() must be a valid start of a Prometheus metric name')
  }
  const group = metricsFor(registry, prefix)
  group.watched.add(cache)
  let stopped = false
  return {
    stop() {
      if (stopped) return
      stopped = true
      if (!group.watched.delete(cache) || group.watched.caches.size > 0) return
      for (const metric of group.metrics) registry.removeSingleMetric(metric.name)
      byRegistry.get(registry)?.delete(prefix)
    },
  }
}

module.exports = { register }
