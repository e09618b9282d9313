#!/usr/bin/env node
'use strict'
// What a cache costs its Redis: keys and bytes per entry, commands executed and server CPU per
// read, per cold load and per warm batch, side by side with what a user would pick instead (a
// raw ioredis cache-aside: GET; on a miss SET of the raw JSON with PX), bentocache and
// cache-manager 7 (+ @keyv/redis). Each side runs on its own private redis-server, so nothing
// one side does shows in another's figures.
//
//   node bench/redis-cost.js [--quick] [--entries 20000] [--sides raw,bentocache,...]
//                            [--baseline DIR] [--json out.json]
//   (--baseline DIR adds a side for another build of the library, a checkout of an older commit
//   with its addon built, so a change is measured before and after in one run)
//   node bench/redis-cost.js --instructions [--sides ...]
//   (each side's redis-server runs under valgrind's callgrind: adds the user-space instructions
//   the server executed per operation, a count the machine's load does not move; 2,000 entries)
//   node bench/redis-cost.js --large
//   (a 100 KB HTML page, as a Next.js entry: bytes in Redis and sequential read time, with the
//   envelope's compression and without it, STAMPEDE_CACHE_NO_COMPRESS=1, each in its own process)
//
// Per side and per value size, each row the mean over a few sizes so that no allocator size class
// decides it (~100 B: 80, 100, 120 B; ~1 KB: 0.6 to 1.4 KB in steps of 100 B):
// 1. Fill: `entries` keys through the side's own read-through call (getOrLoad, getOrSet, wrap, or
//    GET then SET), one after another: each is a cold load. Redis keys per entry are DBSIZE /
//    entries; bytes per entry the growth of INFO memory's used_memory / entries.
// 2. Sequential reads: every key once, through an instance without an in-process tier (l1: false,
//    bentocache with only its L2 layer, cache-manager with only its Keyv Redis store).
// 3. Warm batches: 1,000 keys a call (getOrLoadMany, MGET + JSON.parse, cache-manager mget;
//    bentocache has no batch read).
// Commands are INFO commandstats (which counts a script's inner calls) after CONFIG RESETSTAT at
// the start of each phase, leaving out INFO/CONFIG/DBSIZE themselves; server CPU is the growth of
// used_cpu_user + used_cpu_sys over the phase. Both per operation, CPU as a ratio to the raw side.
const path = require('node:path')
const fs = require('node:fs')
const { startRedis } = require('./redis-lib')

const args = process.argv.slice(2)
const flag = (name) => args.includes(name)
const valueOf = (name) => {
  const i = args.indexOf(name)
  return i >= 0 ? args[i + 1] : undefined
}
const QUICK = flag('--quick')
const INSTRUCTIONS = flag('--instructions')
const ENTRIES = Number(valueOf('--entries') ?? (QUICK ? 4_000 : INSTRUCTIONS ? 2_000 : 20_000))
const BATCH = 1_000
const SIZES = { '~100 B': [80, 100, 120], '~1 KB': [600, 700, 800, 900, 1_000, 1_100, 1_200, 1_300, 1_400] }
const jsonOut = valueOf('--json')
const baselineDir = valueOf('--baseline')
const SIDES = (valueOf('--sides') ?? 'raw,bentocache,cache-manager,stampede-cache').split(',')
if (baselineDir) SIDES.push('baseline')

const TTL = 600_000
const keyOf = (i) => `user:${i}`
/** A JSON value of `size` bytes (as JSON.stringify writes it), distinct per id. */
function valueFor(id, size) {
  const base = { id, name: `User ${id}`, email: `user${id}@example.com`, plan: id % 3 === 0 ? 'pro' : 'free', bio: '' }
  const pad = size - JSON.stringify(base).length
  base.bio = 'x'.repeat(Math.max(0, pad))
  return base
}
const mustNotLoad = () => {
  throw new Error('a warm read called its loader')
}
const withTimeout = (promise, ms) => Promise.race([promise, new Promise((resolve) => setTimeout(resolve, ms).unref())])

function libraryAt(dir) {
  return require(path.resolve(dir))
}

/**
 * One side: `fill(i)` is a cold load of key i, `read(i)` a warm read with no in-process tier,
 * `batch(ids)` a warm read of many keys (or null), `close()`; `beforeReads()`, if any, between
 * the fill and the reads.
 */
async function openSide(name, redisUrl, size) {
  const u = new URL(redisUrl)
  const connection = { host: u.hostname, port: Number(u.port) }
  const load = (key) => valueFor(Number(key.slice(5)), size)
  switch (name) {
    case 'raw': {
      const Redis = require('ioredis')
      const redis = new Redis(connection)
      await redis.ping()
      return {
        async fill(i) {
          const key = keyOf(i)
          const s = await redis.get(key)
          if (s !== null) return JSON.parse(s)
          const value = load(key)
          await redis.set(key, JSON.stringify(value), 'PX', TTL)
          return value
        },
        async read(i) {
          const s = await redis.get(keyOf(i))
          if (s === null) throw new Error('raw: a warm read missed')
          return JSON.parse(s)
        },
        async batch(ids) {
          const replies = await redis.mget(ids.map(keyOf))
          return replies.map((s) => JSON.parse(s))
        },
        close: () => withTimeout(redis.quit(), 2_000),
      }
    }
    case 'bentocache': {
      const { BentoCache, bentostore } = await import('bentocache')
      const { memoryDriver } = await import('bentocache/drivers/memory')
      const { redisDriver, redisBusDriver } = await import('bentocache/drivers/redis')
      const writer = new BentoCache({
        default: 'cache',
        ttl: TTL,
        stores: {
          cache: bentostore()
            .useL1Layer(memoryDriver({ maxItems: 10_000 }))
            .useL2Layer(redisDriver({ connection }))
            .useBus(redisBusDriver({ connection })),
        },
      })
      const reader = new BentoCache({
        default: 'cache',
        ttl: TTL,
        stores: { cache: bentostore().useL2Layer(redisDriver({ connection })) },
      })
      await writer.get({ key: '__warm__' })
      await reader.get({ key: '__warm__' })
      await new Promise((r) => setTimeout(r, 50))
      return {
        fill: (i) => writer.getOrSet({ key: keyOf(i), factory: () => load(keyOf(i)), ttl: TTL }),
        async read(i) {
          const v = await reader.get({ key: keyOf(i) })
          if (v === undefined) throw new Error('bentocache: a warm read missed')
          return v
        },
        batch: null,
        close: async () => {
          await withTimeout(writer.disconnect(), 2_000)
          await withTimeout(reader.disconnect(), 2_000)
        },
      }
    }
    case 'cache-manager': {
      const { createCache } = require('cache-manager')
      const { Keyv } = require('keyv')
      const { createKeyv } = require('@keyv/redis')
      const l1 = new Keyv()
      l1.serialize = undefined
      l1.deserialize = undefined
      const writerStore = createKeyv(redisUrl)
      const writer = createCache({ stores: [l1, writerStore], ttl: TTL })
      const readerStore = createKeyv(redisUrl)
      const reader = createCache({ stores: [readerStore], ttl: TTL })
      await writerStore.get('__warm__')
      await readerStore.get('__warm__')
      return {
        fill: (i) => writer.wrap(keyOf(i), () => load(keyOf(i))),
        async read(i) {
          const v = await reader.get(keyOf(i))
          if (v === undefined || v === null) throw new Error('cache-manager: a warm read missed')
          return v
        },
        batch: (ids) => reader.mget(ids.map(keyOf)),
        close: async () => {
          await withTimeout(writer.disconnect(), 2_000)
          await withTimeout(reader.disconnect(), 2_000)
        },
      }
    }
    case 'stampede-cache':
    case 'baseline': {
      const { StampedeCache } = name === 'baseline' ? libraryAt(baselineDir) : require('..')
      const writer = new StampedeCache({ redis: redisUrl, namespace: 'sc', ttl: TTL })
      await writer.get('__warm__')
      // Opened after the fill: one that heard the fill's announcements would serve the values
      // they carried (src/store/redis/carried.rs) instead of reading Redis.
      let reader = null
      const loader = (ctx) => load(ctx.key)
      return {
        async beforeReads() {
          reader = new StampedeCache({ redis: redisUrl, namespace: 'sc', ttl: TTL, l1: false })
          await reader.get('__warm__')
        },
        fill: (i) => writer.getOrLoad(keyOf(i), loader),
        read: (i) => reader.getOrLoad(keyOf(i), mustNotLoad),
        batch: (ids) => reader.getOrLoadMany(ids.map(keyOf), mustNotLoad),
        close: async () => {
          await writer.close()
          await reader.close()
        },
      }
    }
    default:
      throw new Error(`unknown side ${name}`)
  }
}

function infoFields(text) {
  const out = {}
  for (const line of text.split('\r\n')) {
    const at = line.indexOf(':')
    if (at > 0) out[line.slice(0, at)] = line.slice(at + 1)
  }
  return out
}

/** Commands executed since the last RESETSTAT, by name (INFO commandstats), without our own probes. */
async function commandCounts(redis) {
  const fields = infoFields(await redis.command('INFO', 'commandstats'))
  const counts = {}
  for (const [k, v] of Object.entries(fields)) {
    const name = k.replace(/^cmdstat_/, '')
    if (['info', 'config|resetstat', 'config', 'dbsize'].includes(name)) continue
    counts[name] = Number(/calls=(\d+)/.exec(v)[1])
  }
  return counts
}

async function serverCpu(redis) {
  const f = infoFields(await redis.command('INFO', 'cpu'))
  return Number(f.used_cpu_user) + Number(f.used_cpu_sys)
}

/** Runs `body` as one phase of `ops` operations: commands and server CPU seconds per op. */
async function phase(redis, ops, body) {
  await redis.command('CONFIG', 'RESETSTAT')
  const cpu0 = await serverCpu(redis)
  const ir0 = redis.instructions?.()
  await body()
  const ir1 = redis.instructions?.()
  const cpu1 = await serverCpu(redis)
  const counts = await commandCounts(redis)
  const total = Object.values(counts).reduce((a, b) => a + b, 0)
  const byName = Object.fromEntries(
    Object.entries(counts)
      .sort((a, b) => b[1] - a[1])
      .map(([k, v]) => [k, +(v / ops).toFixed(2)]),
  )
  return { commands: total / ops, byName, cpuUs: ((cpu1 - cpu0) * 1e6) / ops, instructions: redis.instructions ? (ir1 - ir0) / ops : null }
}

async function measure(name, size) {
  const redis = await startRedis({ callgrind: INSTRUCTIONS })
  try {
    const side = await openSide(name, redis.url, size)
    const mem0 = Number(infoFields(await redis.command('INFO', 'memory')).used_memory)
    const keys0 = Number(await redis.command('DBSIZE'))
    const cold = await phase(redis, ENTRIES, async () => {
      for (let i = 0; i < ENTRIES; i++) await side.fill(i)
    })
    const mem1 = Number(infoFields(await redis.command('INFO', 'memory')).used_memory)
    const keys1 = Number(await redis.command('DBSIZE'))
    if (side.beforeReads) await side.beforeReads()
    const read = await phase(redis, ENTRIES, async () => {
      for (let i = 0; i < ENTRIES; i++) {
        const v = await side.read(i)
        if (v.id !== i) throw new Error(`${name}: read a wrong value`)
      }
    })
    let batch = null
    if (side.batch) {
      const rounds = Math.floor(ENTRIES / BATCH)
      batch = await phase(redis, rounds, async () => {
        for (let r = 0; r < rounds; r++) {
          const ids = Array.from({ length: BATCH }, (_, j) => r * BATCH + j)
          const got = await side.batch(ids)
          if (got.some((v, j) => !v || v.id !== ids[j])) throw new Error(`${name}: a batch read wrong values`)
        }
      })
    }
    await side.close()
    return { keys: (keys1 - keys0) / ENTRIES, bytes: (mem1 - mem0) / ENTRIES, cold, read, batch }
  } finally {
    redis.stop()
  }
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length
function meanOf(runs) {
  const avg = (pick) => {
    const xs = runs.map(pick).filter((x) => x !== null && x !== undefined)
    return xs.length ? mean(xs) : null
  }
  const ph = (k) =>
    runs[0][k] && {
      commands: avg((r) => r[k].commands),
      cpuUs: avg((r) => r[k].cpuUs),
      instructions: avg((r) => r[k].instructions),
      byName: runs[0][k].byName,
    }
  return { keys: avg((r) => r.keys), bytes: avg((r) => r.bytes), cold: ph('cold'), read: ph('read'), batch: ph('batch') }
}

function table(results, label) {
  const sides = Object.keys(results)
  const raw = results.raw
  const lines = []
  lines.push(`\n### values ${label}, ${ENTRIES.toLocaleString('en-US')} entries\n`)
  lines.push(`| per entry / operation | ${sides.join(' | ')} |`)
  lines.push(`|---|${sides.map(() => '---:').join('|')}|`)
  const ratio = (x, base) => (raw && base ? ` (${(x / base).toFixed(2)}x)` : '')
  const row = (title, pick, fmt, withRatio) =>
    lines.push(
      `| ${title} | ${sides
        .map((s) => {
          const x = pick(results[s])
          if (x === null || x === undefined) return 'n/a'
          return fmt(x) + (withRatio && s !== 'raw' && raw ? ratio(x, pick(raw)) : '')
        })
        .join(' | ')} |`,
    )
  row(
    'Redis keys per entry',
    (r) => r.keys,
    (x) => x.toFixed(2),
    false,
  )
  row(
    'Redis bytes per entry',
    (r) => r.bytes,
    (x) => Math.round(x).toLocaleString('en-US'),
    true,
  )
  row(
    'commands per cold load',
    (r) => r.cold?.commands,
    (x) => x.toFixed(2),
    false,
  )
  row(
    'server CPU per cold load (µs)',
    (r) => r.cold?.cpuUs,
    (x) => x.toFixed(1),
    true,
  )
  row(
    'commands per sequential read',
    (r) => r.read?.commands,
    (x) => x.toFixed(2),
    false,
  )
  row(
    'server CPU per sequential read (µs)',
    (r) => r.read?.cpuUs,
    (x) => x.toFixed(1),
    true,
  )
  row(
    `commands per warm ${BATCH}-key batch`,
    (r) => r.batch?.commands,
    (x) => x.toFixed(1),
    false,
  )
  row(
    `server CPU per warm ${BATCH}-key batch (µs)`,
    (r) => r.batch?.cpuUs,
    (x) => x.toFixed(0),
    true,
  )
  if (INSTRUCTIONS) {
    const k = (x) => `${(x / 1000).toFixed(1)}k`
    row('server instructions per cold load', (r) => r.cold?.instructions, k, true)
    row('server instructions per sequential read', (r) => r.read?.instructions, k, true)
    row(`server instructions per warm ${BATCH}-key batch`, (r) => r.batch?.instructions, k, true)
  }
  lines.push('')
  for (const s of sides) {
    const r = results[s]
    lines.push(`- ${s}: cold load ${JSON.stringify(r.cold?.byName)}; read ${JSON.stringify(r.read?.byName)}`)
  }
  return lines.join('\n')
}

/** A page of about `size` bytes of HTML, distinct per `id` (a product list, as pages are). */
function htmlPage(id, size) {
  const rows = []
  let n = 0
  for (let i = 0; n < size; i++) {
    const row = `<li class="product-card" data-id="${id}-${i}"><a href="/p/${(id * 7919 + i * 104729) % 1000003}"><img src="/img/${i % 97}.webp" alt="Item ${i}" loading="lazy"><span class="name">Product ${i} of page ${id}</span><span class="price">$${((i * 37) % 500) + 0.99}</span></a></li>\n`
    rows.push(row)
    n += row.length
  }
  return `<!DOCTYPE html><html><head><title>Page ${id}</title></head><body><ul>\n${rows.join('')}</ul></body></html>`
}

/** One --large side in this process: `pages` pages written through getOrLoad, then read back. */
async function largeChild(pages) {
  const redis = await startRedis()
  try {
    const { StampedeCache } = require('..')
    const writer = new StampedeCache({ redis: redis.url, namespace: 'sc', ttl: TTL })
    await writer.get('__warm__')
    const mem0 = Number(infoFields(await redis.command('INFO', 'memory')).used_memory)
    for (let i = 0; i < pages; i++) await writer.getOrLoad(`page:${i}`, () => htmlPage(i, 100_000))
    const mem1 = Number(infoFields(await redis.command('INFO', 'memory')).used_memory)
    await writer.close()
    const reader = new StampedeCache({ redis: redis.url, namespace: 'sc', ttl: TTL, l1: false })
    await reader.get('__warm__')
    const times = []
    for (let round = 0; round < 5; round++) {
      const t0 = process.hrtime.bigint()
      for (let i = 0; i < pages; i++) {
        const v = await reader.getOrLoad(`page:${i}`, mustNotLoad)
        if (v.length < 100_000) throw new Error('a page read wrong')
      }
      times.push(Number(process.hrtime.bigint() - t0) / 1e6 / pages)
    }
    await reader.close()
    times.sort((a, b) => a - b)
    return { bytes: (mem1 - mem0) / pages, readMs: times[2], pageBytes: JSON.stringify(htmlPage(0, 100_000)).length }
  } finally {
    redis.stop()
  }
}

async function large() {
  const { execFileSync } = require('node:child_process')
  const run = (env) =>
    JSON.parse(
      execFileSync(process.execPath, [__filename, '--large-child'], { env: { ...process.env, ...env }, encoding: 'utf8' })
        .trim()
        .split('\n')
        .pop(),
    )
  const on = run({})
  const off = run({ STAMPEDE_CACHE_NO_COMPRESS: '1' })
  console.log(`\n### a ${on.pageBytes.toLocaleString('en-US')}-byte HTML page (as its JSON), 200 pages, sequential reads, l1: false\n`)
  console.log('| | compressed (default) | not compressed | ratio |')
  console.log('|---|---:|---:|---:|')
  console.log(
    `| Redis bytes per entry | ${Math.round(on.bytes).toLocaleString('en-US')} | ${Math.round(off.bytes).toLocaleString('en-US')} | ${(on.bytes / off.bytes).toFixed(2)}x |`,
  )
  console.log(`| read (ms, median of 5 rounds) | ${on.readMs.toFixed(3)} | ${off.readMs.toFixed(3)} | ${(on.readMs / off.readMs).toFixed(2)}x |`)
}

async function main() {
  if (flag('--large-child')) {
    console.log(JSON.stringify(await largeChild(200)))
    return
  }
  if (flag('--large')) return large()
  const out = {}
  for (const [label, sizes] of Object.entries(SIZES)) {
    const results = {}
    for (const side of SIDES) {
      const runs = []
      for (const size of sizes) {
        process.stderr.write(`${side} ${size} B ... `)
        runs.push(await measure(side, size))
        process.stderr.write('done\n')
      }
      results[side === 'baseline' ? `baseline (${path.basename(baselineDir)})` : side] = meanOf(runs)
    }
    out[label] = results
    console.log(table(results, label))
  }
  if (jsonOut) fs.writeFileSync(jsonOut, JSON.stringify({ entries: ENTRIES, results: out }, null, 2))
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err)
    process.exit(1)
  },
)
