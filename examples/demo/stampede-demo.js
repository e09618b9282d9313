'use strict'
// A cache stampede, with and without stampede-cache.
//
// A hot key (a home feed) is cached; a burst of requests arrives just as its cached copy
// expires. The database slows down with every query in flight (see simulated-db.js), so with
// naive cache-aside every request that misses adds a query, which delays the first result,
// which lets more requests miss. StampedeCache instead serves the stale feed at once and
// refreshes it with one background query.
//
//   npm run demo                                  (1,000 requests)
//   node examples/demo/stampede-demo.js [requests]
//
// Exits 1 if StampedeCache needed more than MAX_STAMPEDE_QUERIES queries or a request failed.

const { setTimeout: sleep } = require('node:timers/promises')
const { StampedeCache } = require('../..')
const { SimulatedDb } = require('./simulated-db')

const KEY = 'home-feed'
const TTL_MS = 30_000 // how long a feed is fresh
const HARD_TTL_MS = 300_000 // how long StampedeCache may still serve it stale
const WAVES = 10 // the burst: requests split into WAVES waves...
const WAVE_GAP_MS = 100 // ...this far apart (a ~1 s burst)
const BUCKET_MS = 100 // timeline resolution
const BAR_WIDTH = 50
const SEED = 42 // both runs see the same simulated database
const MAX_STAMPEDE_QUERIES = 2

// The copy of the feed that was cached TTL_MS ago and is now expiring.
const OLD_FEED = { key: KEY, version: 0, items: [] }

function isFeed(value) {
  return value !== null && typeof value === 'object' && value.key === KEY && Array.isArray(value.items)
}

// Scheduled against the burst's origin, not the previous wave, so timer lag does not accumulate.
// Loops because a timer can fire up to ~1 ms early by performance.now(), which would put a wave
// into the previous timeline bucket.
async function sleepUntil(t) {
  for (let wait = t - performance.now(); wait > 0; wait = t - performance.now()) await sleep(wait)
}

/** Sends `requests` requests for KEY through `get`, in waves; measures each one. */
async function fireBurst(requests, get) {
  const origin = performance.now()
  const latencies = []
  const pending = []
  let failures = 0
  for (let w = 0; w < WAVES; w++) {
    // Spread requests evenly over the waves, whatever the total.
    const size = Math.floor((requests * (w + 1)) / WAVES) - Math.floor((requests * w) / WAVES)
    await sleepUntil(origin + w * WAVE_GAP_MS)
    for (let i = 0; i < size; i++) {
      const start = performance.now()
      pending.push(
        get(KEY).then(
          (feed) => {
            latencies.push(performance.now() - start)
            if (!isFeed(feed)) failures++
          },
          () => failures++,
        ),
      )
    }
  }
  await Promise.all(pending)
  return { origin, end: performance.now(), latencies, failures }
}

/** Naive cache-aside: a Map with expiry; every miss queries the database and sets the entry. */
async function runNaive(requests) {
  const db = new SimulatedDb({ seed: SEED })
  const map = new Map()
  // The feed's TTL ends right now.
  map.set(KEY, { value: OLD_FEED, expiresAt: performance.now() })

  async function get(key) {
    const entry = map.get(key)
    if (entry !== undefined && entry.expiresAt > performance.now()) return entry.value
    const value = await db.query(key)
    map.set(key, { value, expiresAt: performance.now() + TTL_MS })
    return value
  }

  const burst = await fireBurst(requests, get)
  return summarize('naive cache-aside', db, burst)
}

/** The same burst through StampedeCache; the feed has just gone stale (past ttl, before hardTtl). */
async function runStampedeCache(requests) {
  const db = new SimulatedDb({ seed: SEED })
  const cache = new StampedeCache({ ttl: TTL_MS, hardTtl: HARD_TTL_MS })
  try {
    // There is no clock to fast-forward, so stand in for "written TTL_MS ago" with an entry whose
    // ttl is short: after the sleep it is stale. Refreshes then write ordinary TTL_MS entries.
    await cache.set(KEY, OLD_FEED, { ttl: 50, hardTtl: HARD_TTL_MS })
    await sleep(100) // > 50 ms plus the default 10 % jitter
    const info = await cache.inspect(KEY)
    if (info?.state !== 'stale') throw new Error(`expected the seeded entry to be stale, got ${info?.state}`)

    const burst = await fireBurst(requests, (key) => cache.getOrLoad(key, (ctx) => db.query(ctx.key)))
    await cache.settle() // the background refresh's query belongs to this run
    return { ...summarize('stampede-cache', db, burst), stats: cache.stats() }
  } finally {
    await cache.close()
  }
}

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] // nearest rank
}

function summarize(name, db, { origin, end, latencies, failures }) {
  const sorted = [...latencies].sort((a, b) => a - b)
  return {
    name,
    requests: latencies.length + failures,
    failures,
    queries: db.queries,
    maxInFlight: db.maxInFlight,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    durationMs: end - origin,
    timeline: timeline(db.events, origin, end),
  }
}

/** Per BUCKET_MS from the burst's start: queries started, and the most in flight at any moment. */
function timeline(events, origin, end) {
  const lastT = Math.max(end, ...events.map((e) => e.t)) - origin
  const buckets = Array.from({ length: Math.floor(lastT / BUCKET_MS) + 1 }, () => ({ started: 0, peak: 0 }))
  let inFlight = 0 // carried into buckets that have no events of their own
  let b = 0
  for (const e of events) {
    const eb = Math.max(0, Math.floor((e.t - origin) / BUCKET_MS))
    for (; b < eb; b++) buckets[b + 1].peak = Math.max(buckets[b + 1].peak, inFlight)
    if (e.started) buckets[eb].started++
    buckets[eb].peak = Math.max(buckets[eb].peak, e.inFlight)
    inFlight = e.inFlight
  }
  for (; b < buckets.length - 1; b++) buckets[b + 1].peak = Math.max(buckets[b + 1].peak, inFlight)
  return buckets
}

function fmtMs(ms) {
  if (!Number.isFinite(ms)) return '-'
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2)
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`
}

function report(run, perHash, log) {
  log(`== ${run.name} ==`)
  log(`  database queries      ${run.queries}`)
  log(`  max DB in flight      ${run.maxInFlight}`)
  log(`  request latency       p50 ${fmtMs(run.p50)} ms, p99 ${fmtMs(run.p99)} ms`)
  log(`  all answered after    ${fmtMs(run.durationMs)} ms${run.failures ? `  (${run.failures} FAILED)` : ''}`)
  if (run.stats) {
    const s = run.stats
    log(`  cache stats           hits ${s.hits}, staleHits ${s.staleHits}, misses ${s.misses}, refreshes ${s.refreshes}, loads ${s.loads}`)
  }
  log(`  DB load per ${BUCKET_MS} ms     started  in flight (max)   # = ${plural(perHash, 'query', 'queries')} in flight`)
  // Runs of identical buckets (a plateau, an idle tail) collapse into one line.
  let previous = null
  let repeats = 0
  const flush = () => {
    if (repeats > 0) log(`    ${''.padStart(7)}   ... same for ${plural(repeats, 'more bucket', 'more buckets')}`)
    repeats = 0
  }
  run.timeline.forEach((bucket, i) => {
    const line = `${String(bucket.started).padStart(7)}  ${String(bucket.peak).padStart(9)}  ${'#'.repeat(Math.ceil(bucket.peak / perHash))}`
    if (line === previous) {
      repeats++
      return
    }
    flush()
    log(`    ${String(i * BUCKET_MS).padStart(5)} ms  ${line}`.trimEnd())
    previous = line
  })
  flush()
  log('')
}

/**
 * Runs the burst through naive cache-aside, then through StampedeCache.
 * Resolves with { naive, stampede }: each { queries, maxInFlight, p50, p99, failures, timeline, ... }.
 */
async function runDemo({ requests = 1000, quiet = false } = {}) {
  const log = quiet ? () => {} : (line) => console.log(line)
  log(`stampede-cache demo: ${requests} requests for one hot key ("${KEY}") in ${WAVES} waves ${WAVE_GAP_MS} ms apart,`)
  log(`arriving just as its cached copy expires. Simulated database: latency = 20 ms + 4 ms per query in flight.`)
  log('')
  const perHash = Math.max(1, Math.ceil(requests / BAR_WIDTH))
  const naive = await runNaive(requests)
  report(naive, perHash, log)
  const stampede = await runStampedeCache(requests)
  report(stampede, perHash, log)
  log(
    `naive: ${plural(naive.queries, 'query', 'queries')}, p99 ${fmtMs(naive.p99)} ms; ` +
      `stampede-cache: ${plural(stampede.queries, 'query', 'queries')}, p99 ${fmtMs(stampede.p99)} ms`,
  )
  return { naive, stampede }
}

async function main() {
  const requests = process.argv[2] === undefined ? 1000 : Number(process.argv[2])
  if (!Number.isInteger(requests) || requests < 1) {
    console.error(`usage: node ${require('node:path').relative(process.cwd(), __filename)} [requests]`)
    process.exitCode = 2
    return
  }
  const { naive, stampede } = await runDemo({ requests })
  const problems = []
  if (stampede.queries > MAX_STAMPEDE_QUERIES) {
    problems.push(`StampedeCache made ${stampede.queries} database queries (expected at most ${MAX_STAMPEDE_QUERIES})`)
  }
  for (const run of [naive, stampede]) {
    if (run.failures > 0) problems.push(`${run.name}: ${run.failures} of ${run.requests} requests failed`)
  }
  for (const p of problems) console.error(`FAIL: ${p}`)
  if (problems.length > 0) process.exitCode = 1
}

if (require.main === module) {
  main().catch((err) => {
    console.error(err)
    process.exitCode = 1
  })
}

module.exports = { runDemo }
