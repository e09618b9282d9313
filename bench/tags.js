'use strict'
// What tags cost, measured in one run:
//  1. deleteByTag of a tag carried by 1,000 / 10,000 / 100,000 keys in Redis: the time it takes,
//     the Redis commands it sends, and how soon another instance drops its copies. The
//     invalidation touches one Redis key per tag, whatever the number of keys carrying it.
//  2. a fresh in-process hit on a key with 1 or 3 tags against an untagged one and a plain Map
//     (sequential `await`, as bench/hit-path.js).
//  3. a read answered by Redis (l1: false) of a tagged key against an untagged one.
// Starts its own redis-server on a free loopback port and stops it at the end. Absolute numbers
// vary with the machine; compare within a run.
//
//   node bench/tags.js [--json] [--keys 1000,10000,100000]

const { StampedeCache } = require('..')
const { startRedis, percentile } = require('./redis-lib')

const args = process.argv.slice(2)
const keyCounts = (args.includes('--keys') ? args[args.indexOf('--keys') + 1] : '1000,10000,100000').split(',').map(Number)
const json = args.includes('--json')

const median = (xs) => percentile(xs, 50)

async function commandsProcessed(redis) {
  const info = await redis.command('INFO', 'stats')
  return Number(/total_commands_processed:(\d+)/.exec(info)[1])
}

/** Sets `n` keys tagged `tag` through the cache, 500 at a time. */
async function fill(cache, n, tag) {
  for (let i = 0; i < n; i += 500) {
    const batch = []
    for (let j = i; j < Math.min(n, i + 500); j++) batch.push(cache.set(`item:${j}`, { id: j, name: `item ${j}` }, { tags: [tag] }))
    await Promise.all(batch)
  }
}

async function deleteByTagScenario(redis, n) {
  await redis.flushAll()
  const options = { redis: redis.url, namespace: 'bench', ttl: 600_000 }
  const writer = new StampedeCache(options)
  const reader = new StampedeCache(options)
  const t0 = performance.now()
  await fill(writer, n, 'big')
  const fillMs = performance.now() - t0
  // The reader holds 1,000 of them in process, as a busy instance would.
  const sample = Array.from({ length: Math.min(n, 1_000) }, (_, i) => `item:${Math.floor((i * n) / Math.min(n, 1_000))}`)
  for (const k of sample) await reader.getOrLoad(k, () => 'LOADED')
  const dbsize = Number(await redis.command('DBSIZE'))
  await new Promise((r) => setTimeout(r, 200))

  const c0 = await commandsProcessed(redis)
  const d0 = performance.now()
  await writer.deleteByTag('big')
  const deleteMs = performance.now() - d0
  // -1: the INFO that read c0 is counted in c1.
  const commands = (await commandsProcessed(redis)) - c0 - 1
  // How soon the reader stops serving its copies (the bus), polled every 1 ms.
  let busMs = null
  const b0 = performance.now()
  while (performance.now() - b0 < 2_000) {
    if ((await reader.get(sample[0])) === undefined) {
      busMs = performance.now() - d0
      break
    }
    await new Promise((r) => setTimeout(r, 1))
  }
  let stillServed = 0
  for (const k of sample) if ((await reader.get(k)) !== undefined) stillServed++
  await writer.close()
  await reader.close()
  return {
    taggedKeys: n,
    redisKeys: dbsize,
    fillSeconds: +(fillMs / 1_000).toFixed(1),
    deleteByTagMs: +deleteMs.toFixed(2),
    redisCommands: commands,
    readerDroppedAfterMs: busMs === null ? null : +busMs.toFixed(1),
    stillServedOf1000: stillServed,
  }
}

async function timeLoop(n, fn) {
  const t0 = process.hrtime.bigint()
  for (let i = 0; i < n; i++) await fn()
  return Number(process.hrtime.bigint() - t0) / n
}

async function hitScenario() {
  const n = Number(process.env.HIT_BENCH_N ?? 1_000_000)
  const rounds = Number(process.env.HIT_BENCH_ROUNDS ?? 7)
  const value = { id: 1, name: 'small' }
  const map = new Map([['k', value]])
  const cache = new StampedeCache({ ttl: 3_600_000 })
  const loader = () => value
  await cache.getOrLoad('plain', loader)
  await cache.getOrLoad('one', loader, { tags: ['user:1'] })
  await cache.getOrLoad('three', loader, { tags: ['user:1', 'feed', 'org:7'] })
  const cases = {
    Map: () => map.get('k'),
    untagged: () => cache.getOrLoad('plain', loader),
    '1 tag': () => cache.getOrLoad('one', loader),
    '3 tags': () => cache.getOrLoad('three', loader),
  }
  const ns = Object.fromEntries(Object.keys(cases).map((k) => [k, []]))
  for (const fn of Object.values(cases)) await timeLoop(n, fn)
  for (let r = 0; r < rounds; r++) for (const [k, fn] of Object.entries(cases)) ns[k].push(await timeLoop(n, fn))
  if (cache.stats().loads !== 3) throw new Error(`expected 3 loads, saw ${cache.stats().loads}`)
  await cache.close()
  const mapNs = median(ns.Map)
  return Object.entries(ns).map(([k, xs]) => ({ hit: k, nsPerOp: +median(xs).toFixed(1), throughputVsMap: +(mapNs / median(xs)).toFixed(3) }))
}

async function l2Scenario(redis) {
  await redis.flushAll()
  const options = { redis: redis.url, namespace: 'l2', ttl: 3_600_000 }
  const writer = new StampedeCache(options)
  await writer.set('plain', { id: 1 })
  await writer.set('one', { id: 1 }, { tags: ['a'] })
  await writer.set('three', { id: 1 }, { tags: ['a', 'b', 'c'] })
  await writer.close()
  const reader = new StampedeCache({ ...options, l1: false })
  const loader = () => {
    throw new Error('must be read from Redis')
  }
  const n = 2_000
  const us = { untagged: [], '1 tag': [], '3 tags': [] }
  const keys = { untagged: 'plain', '1 tag': 'one', '3 tags': 'three' }
  for (let r = 0; r < 5; r++) {
    for (const [label, key] of Object.entries(keys)) us[label].push((await timeLoop(n, () => reader.getOrLoad(key, loader))) / 1_000)
  }
  await reader.close()
  const base = median(us.untagged)
  return Object.entries(us).map(([label, xs]) => ({ redisRead: label, usPerOp: +median(xs).toFixed(1), vsUntagged: +(median(xs) / base).toFixed(2) }))
}

async function main() {
  const redis = await startRedis()
  try {
    const deletes = []
    for (const n of keyCounts) deletes.push(await deleteByTagScenario(redis, n))
    const hits = await hitScenario()
    const l2 = await l2Scenario(redis)
    if (json) {
      console.log(JSON.stringify({ deletes, hits, l2 }))
      return
    }
    console.log(`deleteByTag in Redis (Node ${process.version}):`)
    console.table(deletes)
    console.log('fresh in-process hit, sequential await (median of 7 rounds):')
    console.table(hits)
    console.log('read answered by Redis, l1: false, sequential (median of 5 rounds x 2,000):')
    console.table(l2)
  } finally {
    redis.stop()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
