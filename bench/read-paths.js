'use strict'
// Every in-process read path of stampede-cache against what users compare it with, in one run:
// `await map.get(k)` on a plain Map (the physical limit), the same with one `Date.now()` (the
// floor of any cache whose expiry is exact), lru-cache 11's `fetch` (default, and exact with
// `ttlResolution: 0`) and awaited `get`, a fresh `getOrLoad` hit and `get`. 1,000 warm keys read in turn, sequentially and with
// 64 reads in flight (64 `await` loops at once); interleaved rounds so machine noise hits every
// row alike; the median round's ops/s. Prints ratios too: absolute numbers vary with the machine,
// ratios much less.
//
//   node bench/read-paths.js [--reads 2000000] [--rounds 3] [--json] [--baseline DIR]
//
// --baseline DIR adds the getOrLoad and get rows of another build of the library (a checkout of
// an older commit with its addon built), so a change is measured before and after in one run.

const path = require('node:path')
const { LRUCache } = require('lru-cache')
const { StampedeCache } = require('..')

function arg(name, fallback) {
  const i = process.argv.indexOf(name)
  return i >= 0 ? Number(process.argv[i + 1]) : fallback
}

const KEYS = 1_000
const HOUR = 3_600_000

/** The library's rows for `Cache` (this checkout's, or a baseline's), named with `suffix`. */
function libraryRows(Cache, suffix) {
  return {
    [`getOrLoad, fresh${suffix}`]: async (keys, valueOf) => {
      const cache = new Cache({ ttl: HOUR })
      const loader = (ctx) => valueOf(ctx.key)
      for (const k of keys) await cache.getOrLoad(k, loader)
      return { read: (k) => cache.getOrLoad(k, loader), close: () => cache.close(), cache }
    },
    [`get${suffix}`]: async (keys, valueOf) => {
      // Filled as the row above, so the two differ only in the read.
      const cache = new Cache({ ttl: HOUR })
      const loader = (ctx) => valueOf(ctx.key)
      for (const k of keys) await cache.getOrLoad(k, loader)
      return { read: (k) => cache.get(k), close: () => cache.close(), cache }
    },
  }
}

/** The rows: each makes its read function over `keys`, warm (every key present and fresh). */
function rowsToRun(baseline) {
  return {
    Map: async (keys, valueOf) => {
      const map = new Map(keys.map((k) => [k, valueOf(k)]))
      return { read: (k) => map.get(k), close: async () => {} }
    },
    'lru-cache fetch': async (keys, valueOf) => {
      const lru = new LRUCache({ max: 10_000, ttl: HOUR, fetchMethod: async (k) => valueOf(k) })
      for (const k of keys) await lru.fetch(k)
      return { read: (k) => lru.fetch(k), close: async () => {} }
    },
    // The floor for any cache whose expiry is exact: a Map lookup and one clock read per read.
    'Map + Date.now()': async (keys, valueOf) => {
      const map = new Map(keys.map((k) => [k, { value: valueOf(k), until: Date.now() + HOUR }]))
      return {
        read: (k) => {
          const e = map.get(k)
          return e !== undefined && Date.now() < e.until ? e.value : undefined
        },
        close: async () => {},
      }
    },
    // lru-cache with its clock read on every staleness check (its default caches one reading
    // until a 1 ms timer clears it, which a loop of awaits never lets run).
    'lru-cache fetch, ttlResolution 0': async (keys, valueOf) => {
      const lru = new LRUCache({ max: 10_000, ttl: HOUR, ttlResolution: 0, fetchMethod: async (k) => valueOf(k) })
      for (const k of keys) await lru.fetch(k)
      return { read: (k) => lru.fetch(k), close: async () => {} }
    },
    'lru-cache get, awaited': async (keys, valueOf) => {
      const lru = new LRUCache({ max: 10_000, ttl: HOUR })
      for (const k of keys) lru.set(k, valueOf(k))
      return { read: (k) => lru.get(k), close: async () => {} }
    },
    ...libraryRows(StampedeCache, ''),
    ...(baseline ? libraryRows(require(path.resolve(baseline)).StampedeCache, ' (baseline)') : {}),
  }
}

/** ns per read of `reads` reads through `lanes` concurrent await loops over `keys`. */
async function timeReads(read, keys, reads, lanes) {
  const perLane = Math.ceil(reads / lanes)
  const t0 = process.hrtime.bigint()
  await Promise.all(
    Array.from({ length: lanes }, async (_, lane) => {
      // Lanes start at different keys, so 64 in flight read 64 different keys at a time.
      let i = (lane * 97) % keys.length
      for (let n = 0; n < perLane; n++) {
        await read(keys[i])
        if (++i === keys.length) i = 0
      }
    }),
  )
  return Number(process.hrtime.bigint() - t0) / (perLane * lanes)
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b)
  return s[s.length >> 1]
}

async function main() {
  const reads = arg('--reads', 2_000_000)
  const rounds = arg('--rounds', 3)
  const b = process.argv.indexOf('--baseline')
  const baseline = b >= 0 ? process.argv[b + 1] : null
  const keys = Array.from({ length: KEYS }, (_, i) => `user:${i}`)
  const values = new Map(keys.map((k, i) => [k, { id: i, name: `user ${i}` }]))
  const valueOf = (k) => values.get(k)
  const out = []
  for (const [mode, lanes] of [
    ['sequential', 1],
    ['64 in flight', 64],
  ]) {
    const rows = {}
    for (const [name, make] of Object.entries(rowsToRun(baseline))) rows[name] = { ...(await make(keys, valueOf)), ns: [] }
    // Warm every row so the JIT has optimized each path before anything is timed.
    for (const r of Object.values(rows)) await timeReads(r.read, keys, reads >> 2, lanes)
    const order = Object.values(rows)
    for (let round = 0; round < rounds; round++) {
      // Each round starts one row later, so no row is always measured first or last.
      for (let i = 0; i < order.length; i++) {
        const r = order[(round + i) % order.length]
        r.ns.push(await timeReads(r.read, keys, reads, lanes))
      }
    }
    const opsOf = (name) => 1e9 / median(rows[name].ns)
    for (const [name, r] of Object.entries(rows)) {
      if (r.cache) {
        // Every read was a hit: nothing loaded past the warm-up, nothing missed.
        const s = r.cache.stats()
        if (s.misses > KEYS || s.loads > KEYS) throw new Error(`${name}: ${s.misses} misses, ${s.loads} loads`)
      }
      await r.close()
      out.push({
        mode,
        read: name,
        'ops/s': Math.round(opsOf(name)),
        rounds: r.ns.map((ns) => Math.round(1e9 / ns)),
        'x lru fetch': +(opsOf(name) / opsOf('lru-cache fetch')).toFixed(2),
        'x getOrLoad': +(opsOf(name) / opsOf('getOrLoad, fresh')).toFixed(2),
      })
    }
  }
  if (process.argv.includes('--json')) {
    console.log(JSON.stringify(out))
  } else {
    console.log(`${KEYS} warm keys, ${reads} reads a row x ${rounds} rounds (median), Node ${process.version}`)
    console.table(out.map(({ rounds: _r, ...row }) => row))
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
