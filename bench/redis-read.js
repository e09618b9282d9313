'use strict'
// Redis reads: stampede-cache with `l1: false` (every read goes to Redis) against a raw ioredis
// client doing `JSON.parse(await redis.get(k))`, side by side in one process against one
// private redis-server. Rounds alternate between the two; each row reports the median of the
// per-round throughput ratios (stampede-cache / ioredis), so a noisy machine moves both sides.
//
//   node bench/redis-read.js [--rounds 7] [--reads 4000]
//
// Rows: sequential reads of a 91 B and a 10 KB value, and 64 reads in flight on 64 keys (so
// the cache's in-process coalescing cannot help it). Then the first read of a cold process
// (process start to value), each side in its own fresh process.

const { execFileSync } = require('node:child_process')
const path = require('node:path')

const ROOT = path.join(__dirname, '..')
const Redis = require(require.resolve('ioredis', { paths: [path.join(__dirname, 'node_modules')] }))
const { StampedeCache } = require(ROOT)
const { startRedis } = require('./redis-lib.js')

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : dflt
}
const ROUNDS = arg('rounds', 7)
const READS = arg('reads', 4000)
const NS = 'rb'

function valueOfSize(bytes) {
  // {"data":"xxx…"} is 11 bytes of JSON around the string.
  return { data: 'x'.repeat(Math.max(0, bytes - 11)) }
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.floor(s.length / 2)]
}

/** Reads per second of `read(i)` run `total` times, `inflight` at a time. */
async function throughput(read, total, inflight) {
  let next = 0
  const t0 = process.hrtime.bigint()
  await Promise.all(
    Array.from({ length: inflight }, async () => {
      while (next < total) await read(next++)
    }),
  )
  return total / (Number(process.hrtime.bigint() - t0) / 1e9)
}

const COLD_CHILD = `
const [kind, url, key] = process.argv.slice(1)
const t0 = process.hrtime.bigint()
;(async () => {
  let v
  if (kind === 'sc') {
    const { StampedeCache } = require(${JSON.stringify(ROOT)})
    const c = new StampedeCache({ redis: url, namespace: '${NS}', l1: false })
    v = await c.getOrLoad(key, () => { throw new Error('must come from Redis') })
    process.stdout.write(String(Number(process.hrtime.bigint() - t0) / 1e6))
    await c.close()
  } else {
    const Redis = require(${JSON.stringify(require.resolve('ioredis', { paths: [path.join(__dirname, 'node_modules')] }))})
    const r = new Redis(url)
    v = JSON.parse(await r.get('${NS}:v:{' + key + '}')).value
    process.stdout.write(String(Number(process.hrtime.bigint() - t0) / 1e6))
    r.disconnect()
  }
  if (!v) process.exit(1)
})()
`

async function main() {
  const server = await startRedis()
  const { url, stop } = server
  const io = new Redis(url)
  const cache = new StampedeCache({ redis: url, namespace: NS, l1: false, ttl: 3_600_000 })
  const rows = [
    { name: 'sequential, 91 B', size: 91, inflight: 1, keys: 1 },
    { name: 'sequential, 10 KB', size: 10_000, inflight: 1, keys: 1 },
    { name: '64 in flight on 64 keys, 91 B', size: 91, inflight: 64, keys: 64 },
    { name: '64 in flight on 64 keys, 10 KB', size: 10_000, inflight: 64, keys: 64 },
  ]
  const fail = () => {
    throw new Error('a read went to the loader: the value must come from Redis')
  }
  console.log(`bench/redis-read: ${ROUNDS} interleaved rounds of ${READS} reads; stampede-cache (l1: false) / ioredis GET + JSON.parse`)
  console.log('| read | stampede-cache reads/s | ioredis reads/s | ratio (median of rounds) |')
  console.log('|---|---:|---:|---:|')
  for (const row of rows) {
    const keys = Array.from({ length: row.keys }, (_, i) => `${row.size}:${i}`)
    for (const k of keys) await cache.set(k, valueOfSize(row.size))
    const sc = (i) => cache.getOrLoad(keys[i % keys.length], fail)
    const ior = async (i) => JSON.parse(await io.get(`${NS}:v:{${keys[i % keys.length]}}`)).value
    await throughput(sc, 500, row.inflight) // warm both
    await throughput(ior, 500, row.inflight)
    const ratios = []
    const a = []
    const b = []
    for (let r = 0; r < ROUNDS; r++) {
      // Alternate who goes first, so neither always runs on a warmer machine.
      const first = r % 2 === 0
      const x = first ? await throughput(sc, READS, row.inflight) : null
      const y = await throughput(ior, READS, row.inflight)
      const x2 = first ? x : await throughput(sc, READS, row.inflight)
      a.push(x2)
      b.push(y)
      ratios.push(x2 / y)
    }
    console.log(`| ${row.name} | ${Math.round(median(a))} | ${Math.round(median(b))} | ${median(ratios).toFixed(2)}x |`)
  }
  if (cache.stats().loads !== 0) throw new Error('a read called the loader')
  await cache.close()

  const setter = new StampedeCache({ redis: url, namespace: NS })
  await setter.set('cold', valueOfSize(91))
  await setter.close()
  const cold = { sc: [], io: [] }
  for (let r = 0; r < 5; r++) {
    for (const kind of ['sc', 'io']) {
      cold[kind].push(Number(execFileSync(process.execPath, ['-e', COLD_CHILD, kind, url, 'cold'], { encoding: 'utf8' })))
    }
  }
  const ms = (xs) => median(xs).toFixed(1)
  console.log(`\ncold process, first read (median of 5, from process start to value): stampede-cache ${ms(cold.sc)} ms, ioredis ${ms(cold.io)} ms (${(median(cold.sc) / median(cold.io)).toFixed(2)}x the time)`)
  io.disconnect()
  stop()
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
