'use strict'
// What stampede-cache/otel and stampede-cache/prometheus share: the caches one exporter watches,
// their stats() summed by namespace, and the events of their loads, lock bids and
// invalidations, taken from the diagnostics channels the facade publishes (lib/channels.js).
//
// Counts that stats() already keeps (hits, misses, loads, ...) are read from it when the metrics
// are collected, so the hot path publishes nothing for them; only what stats() cannot say (load
// times by reason, lock outcomes, invalidations by source) comes from events, which are rare.

const dc = require('node:diagnostics_channel')
const { StampedeCache, StampedeCacheError } = require('./index.js')

const loadChannel = dc.tracingChannel('stampede-cache:load')
const LOCK = 'stampede-cache:lock'
const INVALIDATE = 'stampede-cache:invalidate'

/** The stats() counters the exporters publish (the rest are sizes, not counts). */
const COUNTERS = [
  'hits',
  'staleHits',
  'negativeHits',
  'misses',
  'l2Hits',
  'loads',
  'coalesced',
  'refreshes',
  'refreshErrors',
  'lockWins',
  'lockWaits',
  'redisErrors',
  'replayDropped',
]

function checkCache(cache, fn) {
  if (!(cache instanceof StampedeCache)) {
    throw new StampedeCacheError('ERR_INVALID_ARGUMENT', `${fn} needs a StampedeCache, got ${cache === null ? 'null' : typeof cache}`)
  }
}

function checkOptions(options, fn, allowed) {
  if (options === undefined) return {}
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new StampedeCacheError('ERR_INVALID_OPTION', `the options of ${fn} must be an object`)
  }
  for (const name of Object.keys(options)) {
    if (!allowed.includes(name)) throw new StampedeCacheError('ERR_INVALID_OPTION', `option \`${name}\` is not an option of ${fn}`)
  }
  return options
}

/** How a load ended: 'success', 'timeout' (loadTimeout) or 'error' (the loader failed). */
function loadOutcome(context) {
  if (!('error' in context)) return 'success'
  return context.error?.code === 'ERR_LOAD_TIMEOUT' ? 'timeout' : 'error'
}

/**
 * The caches one exporter watches. While it has any, it listens to the load, lock and
 * invalidation channels and hands their caches' events to `hooks`:
 * `loadStart(context)`, `loadEnd(context, seconds)`, `lock(message)`, `invalidate(message)`.
 */
class Watched {
  constructor(hooks) {
    this.hooks = hooks
    this.caches = new Set()
    /** Counters of caches no longer watched, by namespace, so totals never go down. */
    this.retired = new Map()
    /** When each load began, by its channel context. */
    this.started = new WeakMap()
    this.handlers = {
      start: (context) => {
        if (!this.caches.has(context.cache)) return
        this.started.set(context, performance.now())
        this.hooks.loadStart(context)
      },
      asyncEnd: (context) => this.#loadEnded(context),
      // A loader call that throws before it returns a promise ends here, not at asyncEnd.
      end: (context) => {
        if ('error' in context && !('result' in context)) this.#loadEnded(context)
      },
    }
    this.onLock = (message) => {
      if (this.caches.has(message.cache)) this.hooks.lock(message)
    }
    this.onInvalidate = (message) => {
      if (this.caches.has(message.cache)) this.hooks.invalidate(message)
    }
  }

  #loadEnded(context) {
    const began = this.started.get(context)
    if (began === undefined) return
    this.started.delete(context)
    this.hooks.loadEnd(context, (performance.now() - began) / 1_000)
  }

  add(cache) {
    if (this.caches.has(cache)) return false
    if (this.caches.size === 0) {
      loadChannel.subscribe(this.handlers)
      dc.subscribe(LOCK, this.onLock)
      dc.subscribe(INVALIDATE, this.onInvalidate)
    }
    this.caches.add(cache)
    return true
  }

  delete(cache) {
    if (!this.caches.delete(cache)) return false
    addTo(this.retired, cache.namespace, cache.stats())
    if (this.caches.size === 0) {
      loadChannel.unsubscribe(this.handlers)
      dc.unsubscribe(LOCK, this.onLock)
      dc.unsubscribe(INVALIDATE, this.onInvalidate)
    }
    return true
  }

  /** Changes waiting for Redis now (`stats().replayQueued`), summed by namespace: a size, so
   * only caches still watched count. */
  replayQueued() {
    const out = new Map()
    for (const cache of this.caches) {
      out.set(cache.namespace, (out.get(cache.namespace) ?? 0) + cache.stats().replayQueued)
    }
    return out
  }

  /** stats() counters summed by namespace, caches no longer watched included. */
  totals() {
    const out = new Map()
    for (const [namespace, counts] of this.retired) addTo(out, namespace, counts)
    for (const cache of this.caches) addTo(out, cache.namespace, cache.stats())
    return out
  }
}

function addTo(byNamespace, namespace, stats) {
  let sum = byNamespace.get(namespace)
  if (sum === undefined) {
    sum = Object.fromEntries(COUNTERS.map((c) => [c, 0]))
    byNamespace.set(namespace, sum)
  }
  for (const c of COUNTERS) sum[c] += stats[c] ?? 0
}

module.exports = { Watched, loadChannel, loadOutcome, checkCache, checkOptions, COUNTERS }
