'use strict'
// Fresh-hit throughput of `await cache.getOrLoad(k, f)` against `await map.get(k)` on a plain
// JS Map, for small, 10 KB and 100 KB values, in one run; then the small value again with
// observers attached: prom-client metrics (stampede-cache/prometheus, which reads stats() at
// scrape time and listens to no hit), and a subscriber of the `stampede-cache:hit` channel (a
// message built and published per hit). Prints ratios (throughput relative to the Map); absolute
// numbers vary with the machine, ratios much less.
//
//   node bench/hit-path.js [--json]

const dc = require('node:diagnostics_channel')
const { StampedeCache } = require('..')
const { valueOfSize } = require('./lib/values')

/** What can watch a cache while it is measured: each returns a function that stops it. */
const OBSERVERS = {
  none: () => () => {},
  'prometheus metrics': (cache) => {
    const client = require('prom-client')
    const { register } = require('../prometheus')
    const handle = register(cache, { registry: new client.Registry() })
    return () => handle.stop()
  },
  'hit subscriber': () => {
    let hits = 0
    const onHit = () => {
      hits++
    }
    dc.subscribe('stampede-cache:hit', onHit)
    return () => {
      dc.unsubscribe('stampede-cache:hit', onHit)
      if (hits === 0) throw new Error('the hit subscriber saw no hit')
    }
  },
}

async function timeLoop(n, fn) {
  const t0 = process.hrtime.bigint()
  for (let i = 0; i < n; i++) await fn()
  return Number(process.hrtime.bigint() - t0) / n // ns per op
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b)
  return s[s.length >> 1]
}

async function measure(label, value, n, rounds, observer = 'none') {
  const key = 'bench:hot'
  const map = new Map([[key, value]])
  const cache = new StampedeCache({ ttl: 3_600_000 })
  const stop = OBSERVERS[observer](cache)
  const loader = () => value
  await cache.getOrLoad(key, loader)
  const mapFn = () => map.get(key)
  const cacheFn = () => cache.getOrLoad(key, loader)
  // Warm both paths so the JIT has optimized them before anything is timed.
  await timeLoop(n, mapFn)
  await timeLoop(n, cacheFn)
  const mapNs = []
  const cacheNs = []
  for (let r = 0; r < rounds; r++) {
    // Interleaved rounds: machine noise hits both sides alike.
    mapNs.push(await timeLoop(n, mapFn))
    cacheNs.push(await timeLoop(n, cacheFn))
  }
  const s = cache.stats()
  if (s.loads !== 1) throw new Error(`expected one load, saw ${s.loads}`)
  stop()
  await cache.close()
  const m = median(mapNs)
  const c = median(cacheNs)
  return { value: label, observer, mapNsPerOp: +m.toFixed(1), cacheNsPerOp: +c.toFixed(1), throughputRatio: +(m / c).toFixed(3) }
}

async function main() {
  const n = Number(process.env.HIT_BENCH_N ?? 1_000_000)
  const rounds = Number(process.env.HIT_BENCH_ROUNDS ?? 7)
  const rows = []
  for (const [label, bytes] of [
    ['small', 0],
    ['10 KB', 10_000],
    ['100 KB', 100_000],
  ]) {
    const value = bytes === 0 ? { id: 1, name: 'small' } : valueOfSize(bytes)
    rows.push(await measure(label, value, n, rounds))
  }
  for (const observer of ['prometheus metrics', 'hit subscriber']) {
    rows.push(await measure('small', { id: 1, name: 'small' }, n, rounds, observer))
  }
  if (process.argv.includes('--json')) {
    console.log(JSON.stringify(rows))
  } else {
    console.log(`fresh hit, sequential await, ${n} ops x ${rounds} rounds (median), Node ${process.version}`)
    console.table(rows)
    console.log('throughputRatio = Map ns/op / cache ns/op (goal >= 0.3)')
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
