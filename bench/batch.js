#!/usr/bin/env node
'use strict'
// Many keys at once: getOrLoadMany side by side with what a user would do instead,
// in one run, on one machine, against one private redis-server. Ratios, never absolute times.
//
//   node bench/batch.js [--quick] [--rounds 7] [--keys 1000] [--json out.json] [--docs]
//                       [--in-process] [--cluster] [--redis] [--baseline DIR]
//   (--docs also renders the README's chart, docs/bench-batch.svg; --in-process runs case 2
//   alone, without Redis; --cluster runs case 5 alone; --redis runs case 1 alone (its
//   getOrLoadMany and getMany rows, and the baseline's with --baseline); --baseline DIR adds the getOrLoadMany rows
//   of cases 1, 2 and 5 for another build of the library, a checkout of an older commit with its
//   addon built, in the same rounds, so a change is measured before and after in one run)
//
// 1. Warm in Redis, `l1: false` (a serverless instance): getOrLoadMany over 1,000 keys, without
//    options and with `{ ttl }` (users of a batch API nearly always pass some), against one ioredis
//    MGET of the same values, stored raw by ioredis itself (JSON, SET PX), plus JSON.parse of each; sequential batches, then 16 batches
//    in flight; then getMany likewise (and the baseline build's getMany with --baseline). Rounds interleave the sides (each round in another order);
//    each ratio is the median of the rounds' (the MGET's time over the row's, in that round).
// 2. Warm in process: getOrLoadMany (without options and with `{ ttl }`), and getMany, against a
//    loop of Map.get over the same keys.
// 3. Cold, 1,000 ids, one process: stampede-cache's loadMany calls and ids, against bentocache
//    getOrSet and cache-manager wrap, one call per id (what their APIs offer), each in front of the
//    same simulated database: a query takes 20 ms, at most 10 run at once (a connection pool).
// 4. Redis commands per batch, as clients sent them (MONITOR), warm and cold.
// 5. Redis Cluster, 3 masters (no replicas), warm in Redis, `l1: false`: getOrLoadMany over 1,000
//    keys against an ioredis Cluster with enableAutoPipelining (a GET per key in one tick, which
//    ioredis sends as one pipeline per node) plus JSON.parse, sequential and 16 in flight; with
//    --baseline, against the baseline build's getOrLoadMany too. Then what one warm batch costs
//    each master (INFO commandstats: GETs, and EVALs, the keyed echo that ends each pipeline:
//    one per round trip).
const path = require('node:path')
const fs = require('node:fs')
const { startRedis } = require('./redis-lib')
const { monitorDuring } = require('../__test__/helpers/monitor')
const { StampedeCache } = require('..')

const args = process.argv.slice(2)
const flag = (name) => args.includes(name)
const option = (name, fallback) => {
  const i = args.indexOf(name)
  return i >= 0 ? Number(args[i + 1]) : fallback
}
const QUICK = flag('--quick')
const ROUNDS = option('--rounds', QUICK ? 3 : 7)
const N = option('--keys', 1_000)
const jsonOut = (() => {
  const i = args.indexOf('--json')
  return i >= 0 ? args[i + 1] : null
})()

const keys = Array.from({ length: N }, (_, i) => `user:${i}`)
const userOf = (k) => {
  const id = Number(k.slice(5))
  return { id, name: `User ${id}`, email: `user${id}@example.com`, plan: id % 3 === 0 ? 'pro' : 'free', tags: ['a', 'b'] }
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const mustNotLoad = () => {
  throw new Error('a warm batch called loadMany')
}
/** The options of the "with { ttl }" rows: a load's ttl, which changes nothing a read serves. */
const TTL = Object.freeze({ ttl: 600_000 })

/** Runs `batch()` `count` times with `inFlight` at once; ms taken. */
async function timed(batch, count, inFlight) {
  const t0 = performance.now()
  let next = 0
  const lane = async () => {
    while (next < count) {
      next++
      await batch()
    }
  }
  await Promise.all(Array.from({ length: inFlight }, lane))
  return performance.now() - t0
}

/**
 * Interleaved rounds of `sides` (by name) and `other`, each round in another order; a side's ratio
 * in a round is `other ms / side ms` (throughput ratio), and its row the median of its rounds'.
 */
async function rowsAgainst(sides, other, count, inFlight) {
  const names = Object.keys(sides)
  const run = (name) => (name === null ? other : sides[name])
  const order = [...names, null]
  for (const name of order) await timed(run(name), Math.max(5, count / 10), inFlight)
  const ms = new Map(order.map((name) => [name, []]))
  const ratios = new Map(names.map((name) => [name, []]))
  for (let r = 0; r < ROUNDS; r++) {
    const took = new Map()
    for (let i = 0; i < order.length; i++) {
      const name = order[(r + i) % order.length]
      took.set(name, await timed(run(name), count, inFlight))
    }
    for (const [name, t] of took) ms.get(name).push(t)
    for (const name of names) ratios.get(name).push(took.get(null) / took.get(name))
  }
  const otherBatchesPerSec = (count * 1000) / median(ms.get(null))
  return Object.fromEntries(
    names.map((name) => [name, { ratio: median(ratios.get(name)), oursBatchesPerSec: (count * 1000) / median(ms.get(name)), otherBatchesPerSec }]),
  )
}

/** Interleaved rounds of two sides (see rowsAgainst). */
async function sideBySide(ours, other, count, inFlight) {
  return (await rowsAgainst({ ours }, other, count, inFlight)).ours
}

/**
 * The commands clients sent while `fn` ran, by name, as MONITOR shows them (the commands a script
 * runs are shown as the script's and not counted; INFO commandstats would count them too).
 */
async function clientCommands(redis, fn) {
  const counts = {}
  await monitorDuring(redis.port, fn, (addr, name) => {
    const command = name.toLowerCase()
    if (addr !== 'lua' && command !== 'ping') counts[command] = (counts[command] ?? 0) + 1
  })
  return counts
}

/**
 * Reads until `cache`'s read lane has opened and carried a read (it opens in the background, with
 * a handshake of its own that MONITOR would count).
 */
async function laneOpen(cache) {
  for (let i = 0; i < 5; i++) {
    await cache.getMany(['__lane__'])
    await new Promise((r) => setTimeout(r, 20))
  }
}

/** A database whose queries take 20 ms, at most 10 at once; counts queries and ids asked. */
function database() {
  const db = { queries: 0, ids: 0, running: 0, waiting: [] }
  const slot = () => (db.running < 10 ? (db.running++, Promise.resolve()) : new Promise((r) => db.waiting.push(r)))
  const release = () => {
    const next = db.waiting.shift()
    if (next) next()
    else db.running--
  }
  db.query = async (ids) => {
    db.queries++
    db.ids += ids.length
    await slot()
    await new Promise((r) => setTimeout(r, 20))
    release()
    return ids.map(userOf)
  }
  return db
}

async function cold(name, redisUrl, namespace) {
  const db = database()
  const t0 = performance.now()
  let close
  if (name === 'stampede-cache') {
    const cache = new StampedeCache({ redis: redisUrl, namespace })
    await cache.get('__warm__')
    const t = performance.now()
    await cache.getOrLoadMany(keys, (ids) => db.query(ids))
    const ms = performance.now() - t
    await cache.close()
    return { name, queries: db.queries, ids: db.ids, ms, call: 'getOrLoadMany(ids, loadMany)' }
  }
  if (name === 'bentocache') {
    const { BentoCache, bentostore } = await import('bentocache')
    const { memoryDriver } = await import('bentocache/drivers/memory')
    const { redisDriver } = await import('bentocache/drivers/redis')
    const u = new URL(redisUrl)
    const bento = new BentoCache({
      default: 'cache',
      stores: {
        cache: bentostore()
          .useL1Layer(memoryDriver({ maxItems: 10_000 }))
          .useL2Layer(redisDriver({ connection: { host: u.hostname, port: Number(u.port) }, prefix: namespace })),
      },
    })
    await bento.get({ key: '__warm__' })
    const t = performance.now()
    await Promise.all(keys.map((key) => bento.getOrSet({ key, factory: async () => (await db.query([key]))[0], ttl: 60_000 })))
    const ms = performance.now() - t
    close = () => bento.disconnect()
    await close()
    return { name, queries: db.queries, ids: db.ids, ms, call: 'getOrSet({ key, factory }) per id' }
  }
  if (name === 'cache-manager') {
    const { createCache } = require('./node_modules/cache-manager')
    const { Keyv } = require('./node_modules/keyv')
    const { createKeyv } = require('./node_modules/@keyv/redis')
    const l2 = createKeyv(redisUrl, { namespace })
    const cache = createCache({ stores: [new Keyv(), l2], ttl: 60_000 })
    await l2.get('__warm__')
    const t = performance.now()
    await Promise.all(keys.map((key) => cache.wrap(key, async () => (await db.query([key]))[0])))
    const ms = performance.now() - t
    await cache.disconnect()
    return { name, queries: db.queries, ids: db.ids, ms, call: 'wrap(key, fn) per id' }
  }
  void t0
  throw new Error(name)
}

/** Case 2 for `Cache` (this checkout's, or a baseline's): getOrLoadMany and getMany against a Map.get loop. */
async function inProcess(Cache) {
  const local = new Cache()
  await local.getOrLoadMany(keys, (ids) => ids.map(userOf))
  const map = new Map(keys.map((k) => [k, userOf(k)]))
  const mapLoop = async () => {
    const r = new Array(keys.length)
    for (let i = 0; i < keys.length; i++) r[i] = map.get(keys[i])
    return r
  }
  const count = QUICK ? 500 : 3_000
  const many = await sideBySide(() => local.getOrLoadMany(keys, mustNotLoad), mapLoop, count, 1)
  const manyTtl = await sideBySide(() => local.getOrLoadMany(keys, mustNotLoad, TTL), mapLoop, count, 1)
  const get = await sideBySide(() => local.getMany(keys), mapLoop, count, 1)
  const s = local.stats()
  // Every read was a hit: nothing loaded past the warm-up.
  if (s.loads > N || s.misses > N) throw new Error(`in process: ${s.loads} loads, ${s.misses} misses`)
  await local.close()
  return { many, manyTtl, get }
}

/** Per master, the calls of each command since the last CONFIG RESETSTAT (INFO commandstats). */
async function commandStats(masters) {
  return Promise.all(
    masters.map(async (m) => {
      const info = await m.info('commandstats')
      const calls = (name) => Number((info[`cmdstat_${name}`] ?? 'calls=0').match(/calls=(\d+)/)[1])
      return { port: m.port, get: calls('get'), eval: calls('eval'), evalsha: calls('evalsha') }
    }),
  )
}

/**
 * Case 5: a warm batch on a 3-master Cluster, l1: false, against ioredis's Cluster client with
 * auto-pipelining (and the baseline build's, if any), and what one batch costs each master.
 */
async function clusterCase(Baseline) {
  const { RedisCluster } = require('../__test__/helpers/redis-topology')
  const Redis = require(path.join(__dirname, 'node_modules', 'ioredis'))
  const cluster = await new RedisCluster({ masters: 3, replicasPerMaster: 0 }).start()
  try {
    const masters = await cluster.masters()
    const redis = { cluster: cluster.seedUrls, commandTimeout: 5_000 }
    const namespace = 'bc'
    const writer = new StampedeCache({ redis, namespace, ttl: 600_000 })
    await writer.getOrLoadMany(keys, (ids) => ids.map(userOf))
    await writer.close()
    // The writer's last write-backs land (close does not wait for them): a reader subscribed
    // meanwhile would hear their announcements and serve those keys without a GET.
    await new Promise((r) => setTimeout(r, 500))
    const reader = new StampedeCache({ redis, namespace, ttl: 600_000, l1: false })
    // The baseline in its own namespace, written by its own writer: the envelope's layout may differ.
    if (Baseline) {
      const baseWriter = new Baseline({ redis, namespace: `${namespace}base`, ttl: 600_000 })
      await baseWriter.getOrLoadMany(keys, (ids) => ids.map(userOf))
      await baseWriter.close()
      await new Promise((r) => setTimeout(r, 500))
    }
    const base = Baseline && new Baseline({ redis, namespace: `${namespace}base`, ttl: 600_000, l1: false })
    const check = (values) => {
      if (values.some((v, i) => v.id !== i)) throw new Error('a warm Cluster batch answered wrong values')
      return values
    }
    const ours = async () => check(await reader.getOrLoadMany(keys, mustNotLoad))
    const baseline = base && (async () => check(await base.getOrLoadMany(keys, mustNotLoad)))
    const io = new Redis.Cluster(
      masters.map((m) => ({ host: '127.0.0.1', port: m.port })),
      { enableAutoPipelining: true },
    )
    // The raw values ioredis wrote itself (JSON, SET PX), not our envelopes.
    const vkeys = keys.map((k) => `raw:{${k}}`)
    await Promise.all(keys.map((k, i) => io.set(vkeys[i], JSON.stringify(userOf(k)), 'PX', 600_000)))
    const auto = async () => (await Promise.all(vkeys.map((k) => io.get(k)))).map((s) => JSON.parse(s))
    const out = {}
    // Each side warmed up (connections, slot maps) before counting and timing.
    await ours()
    if (baseline) await baseline()
    if ((await auto()).length !== N) throw new Error('ioredis read the wrong number of keys')
    const perMaster = async (fn) => {
      await Promise.all(masters.map((m) => m.cmd('CONFIG', 'RESETSTAT')))
      await fn()
      return commandStats(masters)
    }
    out.commands = await perMaster(ours)
    if (baseline) out.baselineCommands = await perMaster(baseline)
    const count = QUICK ? 20 : 100
    out.sequential = await sideBySide(ours, auto, count, 1)
    out.inFlight16 = await sideBySide(ours, auto, count, 16)
    if (baseline) {
      out.baselineSequential = await sideBySide(ours, baseline, count, 1)
      out.baseline16 = await sideBySide(ours, baseline, count, 16)
    }
    io.disconnect()
    await reader.close()
    if (base) await base.close()
    return out
  } finally {
    await cluster.dispose()
  }
}

async function main() {
  const out = { keys: N, rounds: ROUNDS, quick: QUICK, node: process.version, at: new Date().toISOString() }
  const b = args.indexOf('--baseline')
  const Baseline = b >= 0 ? require(path.resolve(args[b + 1])).StampedeCache : null
  if (Baseline !== null && !flag('--cluster') && !flag('--redis')) {
    const base = await inProcess(Baseline)
    out.baselineInProcess = base.many
    out.baselineInProcessTtl = base.manyTtl
    out.baselineInProcessGetMany = base.get
  }
  if (flag('--cluster')) {
    out.cluster = await clusterCase(Baseline)
    printCluster(out)
    if (jsonOut) fs.writeFileSync(jsonOut, JSON.stringify(out, null, 1) + '\n')
    return out
  }
  if (flag('--in-process')) {
    const ours = await inProcess(StampedeCache)
    out.inProcess = ours.many
    out.inProcessTtl = ours.manyTtl
    out.inProcessGetMany = ours.get
    printInProcess(out)
    return out
  }
  const redis = await startRedis()
  try {
    const Redis = require(path.join(__dirname, 'node_modules', 'ioredis'))
    const namespace = 'bb'
    const writer = new StampedeCache({ redis: redis.url, namespace, ttl: 600_000 })
    // Connected, the scripts loaded in Redis and the read lane open, before counting.
    await writer.getOrLoadMany(['__warm__'], (ids) => ids)
    await laneOpen(writer)
    out.coldCommands = await clientCommands(redis, () => writer.getOrLoadMany(keys, (ids) => ids.map(userOf)))

    // Built after the writes: it heard none of their announcements, so every key is read from Redis.
    const reader = new StampedeCache({ redis: redis.url, namespace, ttl: 600_000, l1: false })
    await laneOpen(reader)
    let check
    out.warmCommands = await clientCommands(redis, async () => {
      check = await reader.getOrLoadMany(keys, mustNotLoad)
    })
    if (check.some((v, i) => v.id !== i)) throw new Error('warm batch answered wrong values')
    out.warmCommandsTtl = await clientCommands(redis, async () => {
      check = await reader.getOrLoadMany(keys, mustNotLoad, TTL)
    })
    if (check.some((v, i) => v.id !== i)) throw new Error('warm batch with { ttl } answered wrong values')

    // What an ioredis user reads: the raw values it wrote itself (JSON, SET PX), not our envelopes.
    const io = new Redis(redis.url)
    const vkeys = keys.map((k) => `raw:${k}`)
    {
      const pipe = io.pipeline()
      keys.forEach((k, i) => pipe.set(vkeys[i], JSON.stringify(userOf(k)), 'PX', 600_000))
      await pipe.exec()
    }
    const sides = {
      plain: () => reader.getOrLoadMany(keys, mustNotLoad),
      ttl: () => reader.getOrLoadMany(keys, mustNotLoad, TTL),
    }
    let baseline = null
    if (Baseline !== null) {
      // Its own namespace, written by its own writer: the envelope's layout may differ.
      const baseWriter = new Baseline({ redis: redis.url, namespace: 'bbase', ttl: 600_000 })
      await baseWriter.getOrLoadMany(keys, (ids) => ids.map(userOf))
      baseline = { writer: baseWriter, reader: new Baseline({ redis: redis.url, namespace: 'bbase', ttl: 600_000, l1: false }) }
      await laneOpen(baseline.reader)
      for (const options of [undefined, TTL]) {
        const got = await baseline.reader.getOrLoadMany(keys, mustNotLoad, options)
        if (got.some((v, i) => v.id !== i)) throw new Error('the baseline answered wrong values')
      }
      sides.basePlain = () => baseline.reader.getOrLoadMany(keys, mustNotLoad)
      sides.baseTtl = () => baseline.reader.getOrLoadMany(keys, mustNotLoad, TTL)
    }
    const mget = async () => (await io.mget(vkeys)).map((s) => JSON.parse(s))
    const count = QUICK ? 40 : 200
    for (const [key, inFlight] of [
      ['Sequential', 1],
      ['16', 16],
    ]) {
      const rows = await rowsAgainst(sides, mget, count, inFlight)
      out[`redis${key}`] = rows.plain
      out[`redis${key}Ttl`] = rows.ttl
      if (baseline !== null) {
        out[`baselineRedis${key}`] = rows.basePlain
        out[`baselineRedis${key}Ttl`] = rows.baseTtl
      }
    }
    const getMany = (cache) => async () => {
      const r = await cache.getMany(keys)
      if (r[0] === undefined) throw new Error('a warm getMany missed')
      return r
    }
    const manySides = { ours: getMany(reader) }
    if (baseline !== null) manySides.base = getMany(baseline.reader)
    for (const [key, inFlight] of [
      ['Sequential', 1],
      ['16', 16],
    ]) {
      const rows = await rowsAgainst(manySides, mget, count, inFlight)
      out[`getMany${key}`] = rows.ours
      if (baseline !== null) out[`baselineGetMany${key}`] = rows.base
    }
    if (baseline !== null) {
      await baseline.reader.close()
      await baseline.writer.close()
    }
    io.disconnect()
    await reader.close()
    await writer.close()
    if (flag('--redis')) {
      print(out)
      if (jsonOut) fs.writeFileSync(jsonOut, JSON.stringify(out, null, 1) + '\n')
      return out
    }

    const local = await inProcess(StampedeCache)
    out.inProcess = local.many
    out.inProcessTtl = local.manyTtl
    out.inProcessGetMany = local.get

    out.cold = []
    for (const name of ['stampede-cache', 'bentocache', 'cache-manager']) {
      await redis.flushAll()
      out.cold.push(await cold(name, redis.url, `cold${name.replace(/[^a-z]/g, '')}`))
    }
  } finally {
    redis.stop()
  }
  out.cluster = await clusterCase(Baseline)
  print(out)
  printCluster(out)
  if (jsonOut) fs.writeFileSync(jsonOut, JSON.stringify(out, null, 1) + '\n')
  if (flag('--docs')) {
    const { render } = require('./lib/charts')
    fs.writeFileSync(path.join(__dirname, '..', 'docs', 'bench-batch.svg'), await render(chartSpec(out)))
    console.log('\nwrote docs/bench-batch.svg')
  }
  return out
}

/** The README's chart: each warm case's throughput ratio, and the cold case's queries. */
function chartSpec(o) {
  const rows = [
    { read: 'Redis, l1: false, sequential / MGET', ratio: o.redisSequential.ratio },
    { read: 'Redis, l1: false, 16 in flight / MGET', ratio: o.redis16.ratio },
    { read: 'getMany, Redis, l1: false, sequential / MGET', ratio: o.getManySequential.ratio },
    { read: 'getMany, Redis, l1: false, 16 in flight / MGET', ratio: o.getMany16.ratio },
    { read: 'in process / a loop of Map.get', ratio: o.inProcess.ratio },
  ].map((r) => ({ ...r, faster: r.ratio >= 1 ? 'stampede-cache faster' : 'other faster' }))
  const q = Object.fromEntries(o.cold.map((c) => [c.name, c.queries]))
  const order = rows.map((r) => r.read)
  const max = Math.max(1.25, ...rows.map((r) => r.ratio * 1.15))
  const y = { field: 'read', type: 'nominal', sort: order, title: null, axis: { labelLimit: 420 } }
  return {
    title: {
      text: `getOrLoadMany over ${o.keys.toLocaleString('en-US')} warm keys: batches/s against ioredis MGET + JSON.parse, and Map.get`,
      subtitle: [
        `median of ${o.rounds} interleaved rounds; right of the line = stampede-cache faster`,
        `cold, ${o.keys.toLocaleString('en-US')} ids: database queries: stampede-cache ${q['stampede-cache']}, bentocache ${q.bentocache}, cache-manager ${q['cache-manager']} (one call per id)`,
      ],
    },
    width: 520,
    height: 170,
    data: { values: rows },
    layer: [
      {
        mark: { type: 'bar' },
        encoding: {
          y,
          x: {
            field: 'ratio',
            type: 'quantitative',
            scale: { domain: [0, max] },
            title: 'stampede-cache batches/s / other batches/s',
            axis: { format: '.1f' },
          },
          color: {
            field: 'faster',
            type: 'nominal',
            scale: { domain: ['stampede-cache faster', 'other faster'], range: ['#4c78a8', '#e45756'] },
            legend: null,
          },
        },
      },
      {
        mark: { type: 'text', align: 'left', dx: 3, fontSize: 10 },
        encoding: { y, x: { field: 'ratio', type: 'quantitative' }, text: { field: 'ratio', type: 'quantitative', format: '.2f' } },
      },
      { data: { values: [{ x: 1 }] }, mark: { type: 'rule', color: '#111', strokeDash: [4, 3] }, encoding: { x: { field: 'x', type: 'quantitative' } } },
    ],
    config: { font: 'Helvetica, Arial, sans-serif', view: { stroke: null } },
  }
}

function print(o) {
  const x = (r) => `${r.toFixed(2)}x`
  const n = (v) => Math.round(v).toLocaleString('en-US')
  console.log(`\nMany keys at once, ${o.keys} keys a batch, median of ${o.rounds} rounds (Node ${o.node})\n`)
  console.log('| case | stampede-cache batches/s | other batches/s | ratio (ours/other) |')
  console.log('|---|---:|---:|---:|')
  const row = (name, r) => {
    if (r !== undefined) console.log(`| ${name} | ${n(r.oursBatchesPerSec)} | ${n(r.otherBatchesPerSec)} | ${x(r.ratio)} |`)
  }
  for (const [mode, key] of [
    ['sequential', 'Sequential'],
    ['16 in flight', '16'],
  ]) {
    row(`warm in Redis, l1: false, ${mode}, vs ioredis MGET + JSON.parse`, o[`redis${key}`])
    row(`warm in Redis, l1: false, ${mode}, getOrLoadMany with { ttl }, vs the same MGET`, o[`redis${key}Ttl`])
    row(`warm in Redis, l1: false, ${mode} (baseline), vs the same MGET`, o[`baselineRedis${key}`])
    row(`warm in Redis, l1: false, ${mode}, getOrLoadMany with { ttl } (baseline), vs the same MGET`, o[`baselineRedis${key}Ttl`])
  }
  console.log(
    `| getMany, warm in Redis, l1: false, sequential, vs ioredis MGET + JSON.parse | ${n(o.getManySequential.oursBatchesPerSec)} | ${n(o.getManySequential.otherBatchesPerSec)} | ${x(o.getManySequential.ratio)} |`,
  )
  console.log(
    `| getMany, warm in Redis, l1: false, 16 in flight, vs ioredis MGET + JSON.parse | ${n(o.getMany16.oursBatchesPerSec)} | ${n(o.getMany16.otherBatchesPerSec)} | ${x(o.getMany16.ratio)} |`,
  )
  row('getMany, warm in Redis, l1: false, sequential (baseline), vs the same MGET', o.baselineGetManySequential)
  row('getMany, warm in Redis, l1: false, 16 in flight (baseline), vs the same MGET', o.baselineGetMany16)
  printInProcessRows(o)
  if (o.cold === undefined) {
    console.log(`\nRedis commands for a warm batch of ${o.keys} (l1: false): ${fmtCounts(o.warmCommands)}`)
    return
  }
  console.log('\n| cold, 1 process | call | database queries | ids asked | ms |')
  console.log('|---|---|---:|---:|---:|')
  for (const c of o.cold) console.log(`| ${c.name} | \`${c.call}\` | ${n(c.queries)} | ${n(c.ids)} | ${n(c.ms)} |`)
  const fmt = fmtCounts
  console.log(`\nRedis commands for a cold batch of ${o.keys}: ${fmt(o.coldCommands)}`)
  console.log(`Redis commands for a warm batch of ${o.keys} (l1: false): ${fmt(o.warmCommands)}`)
  console.log(`Redis commands for a warm batch of ${o.keys} (l1: false) with { ttl }: ${fmt(o.warmCommandsTtl)}`)
}

function fmtCounts(c) {
  return Object.entries(c)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ')
}

function printCluster(o) {
  const c = o.cluster
  const x = (r) => `${r.toFixed(2)}x`
  const n = (v) => Math.round(v).toLocaleString('en-US')
  console.log(`\nRedis Cluster, 3 masters, ${o.keys} warm keys a batch, l1: false, median of ${o.rounds} rounds\n`)
  console.log('| case | stampede-cache batches/s | other batches/s | ratio (ours/other) |')
  console.log('|---|---:|---:|---:|')
  const row = (name, r) => {
    if (r !== undefined) console.log(`| ${name} | ${n(r.oursBatchesPerSec)} | ${n(r.otherBatchesPerSec)} | ${x(r.ratio)} |`)
  }
  row('sequential, vs ioredis Cluster auto-pipelined GETs + JSON.parse', c.sequential)
  row('16 in flight, vs ioredis Cluster auto-pipelined GETs + JSON.parse', c.inFlight16)
  row('sequential, vs the baseline build', c.baselineSequential)
  row('16 in flight, vs the baseline build', c.baseline16)
  const per = (stats) => stats.map((m) => `:${m.port} ${m.get} GET, ${m.eval} EVAL (pipelines)`).join('; ')
  console.log(`\nOne warm Cluster batch of ${o.keys}, per master: ${per(c.commands)}`)
  if (c.baselineCommands) console.log(`The baseline build's, per master: ${per(c.baselineCommands)}`)
}

function printInProcessRows(o) {
  const x = (r) => `${r.toFixed(2)}x`
  const n = (v) => Math.round(v).toLocaleString('en-US')
  const row = (name, r) => {
    if (r !== undefined) console.log(`| ${name} | ${n(r.oursBatchesPerSec)} | ${n(r.otherBatchesPerSec)} | ${x(r.ratio)} |`)
  }
  row('warm in process, vs a loop of Map.get', o.inProcess)
  row('warm in process, getOrLoadMany with { ttl }, vs a loop of Map.get', o.inProcessTtl)
  row('warm in process, getMany, vs a loop of Map.get', o.inProcessGetMany)
  row('warm in process, vs a loop of Map.get (baseline)', o.baselineInProcess)
  row('warm in process, getOrLoadMany with { ttl }, vs a loop of Map.get (baseline)', o.baselineInProcessTtl)
  row('warm in process, getMany, vs a loop of Map.get (baseline)', o.baselineInProcessGetMany)
}

function printInProcess(o) {
  console.log(`\nMany keys at once, in process, ${o.keys} keys a batch, median of ${o.rounds} rounds (Node ${o.node})\n`)
  console.log('| case | stampede-cache batches/s | other batches/s | ratio (ours/other) |')
  console.log('|---|---:|---:|---:|')
  printInProcessRows(o)
}

if (require.main === module) {
  main().then(
    () => process.exit(0),
    (err) => {
      console.error(err)
      process.exit(1)
    },
  )
}

module.exports = { main, chartSpec }
