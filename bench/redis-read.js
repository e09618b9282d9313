'use strict'
// Redis reads: stampede-cache with `l1: false` (every read goes to Redis) against a raw ioredis
// client doing `JSON.parse(await redis.get(k))`, side by side in one process against one
// private redis-server. Runs under Node, Bun or Deno (`bun bench/redis-read.js`,
// `deno run --allow-all bench/redis-read.js`): both sides, and the cold processes, then run under
// that runtime. Rounds alternate between the two; each row reports the median of the
// per-round throughput ratios (stampede-cache / ioredis), so a noisy machine moves both sides.
//
//   node bench/redis-read.js [--rounds 7] [--reads 4000] [--cold 5] [--quick] [--tls] [--url redis://127.0.0.1:6379]
//
// --quick: 2 rounds of 300 reads, 3 cold processes a side (a check that it runs); --cold: how many
// cold processes each side starts (the median is reported). --tls: standalone only, both sides
// read over TLS from a private TLS-only redis-server with a throwaway CA (made by openssl, as in
// the tests), which is what managed Redis services serve; stampede-cache's reads then take the
// runtime path, not the read lane (which is plain TCP only).
//
// Rows: sequential reads of a 91 B and a 10 KB value, and 64 reads in flight on 64 keys (so
// the cache's in-process coalescing cannot help it). Then the first read of a cold process
// (process start to value), each side in its own fresh process.
//
// Standalone, it starts its own redis-server (bench/redis-lib.js) unless --url is given, and
// prints a table. Scenario 8 of `npm run bench` (bench/lib/scenarios.js) forks this file with an
// IPC channel and --url: it then prints nothing and sends { t: 'result', result } (the value of
// measureRedisReads) or { t: 'error', error } to its parent. measureRedisReads is also exported.

const { execFileSync } = require('node:child_process')
const path = require('node:path')

const ROOT = path.join(__dirname, '..')
const IOREDIS = require.resolve('ioredis', { paths: [path.join(__dirname, 'node_modules')] })
const NS = 'rb'

/** Sizes of a full measurement and of --quick (a check that it runs, not figures to quote). */
const DEFAULTS = {
  full: { rounds: 7, reads: 4000, warm: 500, coldRuns: 5 },
  quick: { rounds: 2, reads: 300, warm: 100, coldRuns: 3 },
}

const ROWS = [
  { name: 'sequential, 91 B', size: 91, inflight: 1, keys: 1 },
  { name: 'sequential, 10 KB', size: 10_000, inflight: 1, keys: 1 },
  { name: '64 in flight on 64 keys, 91 B', size: 91, inflight: 64, keys: 64 },
  { name: '64 in flight on 64 keys, 10 KB', size: 10_000, inflight: 64, keys: 64 },
]

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

/** The runtime this runs under (Node, Bun or Deno), and how it runs a script file. */
const RUNTIME = process.versions.deno
  ? { name: `Deno ${process.versions.deno}`, args: ['run', '--allow-all'] }
  : process.versions.bun
    ? { name: `Bun ${process.versions.bun}`, args: [] }
    : { name: `Node ${process.versions.node}`, args: [] }

const COLD_CHILD = `
const [kind, url, key, caFile] = process.argv.slice(2)
const t0 = process.hrtime.bigint()
;(async () => {
  let v
  const ca = caFile ? require('node:fs').readFileSync(caFile, 'utf8') : null
  if (kind === 'sc') {
    const { StampedeCache } = require(${JSON.stringify(ROOT)})
    const c = new StampedeCache({ redis: ca ? { url, tls: { ca } } : url, namespace: '${NS}', l1: false })
    v = await c.getOrLoad(key, () => { throw new Error('must come from Redis') })
    process.stdout.write(String(Number(process.hrtime.bigint() - t0) / 1e6))
    await c.close()
  } else {
    const Redis = require(${JSON.stringify(IOREDIS)})
    const r = new Redis(url, ca ? { tls: { ca } } : {})
    v = JSON.parse(await r.get('${NS}:v:{' + key + '}')).value
    process.stdout.write(String(Number(process.hrtime.bigint() - t0) / 1e6))
    r.disconnect()
  }
  if (!v) process.exit(1)
})()
`

/**
 * Measures Redis reads of stampede-cache (l1: false) against raw ioredis on the Redis at `url`.
 * Returns { rounds, reads, coldRuns, rows: [{ name, size, inflight, scReadsPerSec, ioReadsPerSec,
 * ratio, ratios }], cold: { scMs, ioMs, ratio, scRuns, ioRuns } }; ratio = the median of the
 * per-round ratios (stampede-cache / ioredis); cold.ratio = stampede-cache's time / ioredis's.
 * onRow(row) is called as each row is done. With `caFile` (a rediss:// url), both sides trust
 * that CA's PEM file and nothing else.
 */
async function measureRedisReads({ url, caFile = null, quick = false, rounds, reads, warm, coldRuns, onRow } = {}) {
  if (!url) throw new Error('measureRedisReads: url is required')
  const d = quick ? DEFAULTS.quick : DEFAULTS.full
  rounds = rounds || d.rounds
  reads = reads || d.reads
  warm = warm || d.warm
  coldRuns = coldRuns || d.coldRuns
  const Redis = require(IOREDIS)
  const { StampedeCache } = require(ROOT)

  const ca = caFile ? require('node:fs').readFileSync(caFile, 'utf8') : null
  const redis = ca ? { url, tls: { ca } } : url
  const io = new Redis(url, ca ? { tls: { ca } } : {})
  const cache = new StampedeCache({ redis, namespace: NS, l1: false, ttl: 3_600_000 })
  const fail = () => {
    throw new Error('a read went to the loader: the value must come from Redis')
  }
  const rows = []
  try {
    for (const row of ROWS) {
      const keys = Array.from({ length: row.keys }, (_, i) => `${row.size}:${i}`)
      for (const k of keys) await cache.set(k, valueOfSize(row.size))
      const sc = (i) => cache.getOrLoad(keys[i % keys.length], fail)
      const ior = async (i) => JSON.parse(await io.get(`${NS}:v:{${keys[i % keys.length]}}`)).value
      await throughput(sc, warm, row.inflight) // warm both
      await throughput(ior, warm, row.inflight)
      const ratios = []
      const a = []
      const b = []
      for (let r = 0; r < rounds; r++) {
        // Alternate who goes first, so neither always runs on a warmer machine.
        const first = r % 2 === 0
        const x = first ? await throughput(sc, reads, row.inflight) : null
        const y = await throughput(ior, reads, row.inflight)
        const x2 = first ? x : await throughput(sc, reads, row.inflight)
        a.push(x2)
        b.push(y)
        ratios.push(x2 / y)
      }
      const out = {
        name: row.name,
        size: row.size,
        inflight: row.inflight,
        scReadsPerSec: Math.round(median(a)),
        ioReadsPerSec: Math.round(median(b)),
        ratio: +median(ratios).toFixed(4),
        ratios: ratios.map((x) => +x.toFixed(4)),
      }
      rows.push(out)
      if (onRow) onRow(out)
    }
    if (cache.stats().loads !== 0) throw new Error('a read called the loader')
  } finally {
    await cache.close()
    io.disconnect()
  }

  const setter = new StampedeCache({ redis, namespace: NS })
  await setter.set('cold', valueOfSize(91))
  await setter.close()
  const runs = { sc: [], io: [] }
  // The cold process runs under this runtime too, from a file (Deno has no `-e`).
  const fs = require('node:fs')
  const os = require('node:os')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-bench-cold-'))
  const script = path.join(dir, 'cold.cjs')
  fs.writeFileSync(script, COLD_CHILD)
  try {
    for (let r = 0; r < coldRuns; r++) {
      for (const kind of ['sc', 'io']) {
        const args = [...RUNTIME.args, script, kind, url, 'cold', caFile || '']
        runs[kind].push(Number(execFileSync(process.execPath, args, { encoding: 'utf8', timeout: 60_000 })))
      }
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
  }
  const round1 = (xs) => xs.map((x) => +x.toFixed(1))
  const cold = {
    scMs: +median(runs.sc).toFixed(1),
    ioMs: +median(runs.io).toFixed(1),
    ratio: +(median(runs.sc) / median(runs.io)).toFixed(4),
    scRuns: round1(runs.sc),
    ioRuns: round1(runs.io),
  }
  return { rounds, reads, coldRuns, rows, cold }
}

function parseArgs(argv) {
  const a = { quick: false, tls: false, rounds: undefined, reads: undefined, cold: undefined, url: undefined }
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i]
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${x} needs a value`)
      return argv[++i]
    }
    if (x === '--quick') a.quick = true
    else if (x === '--tls') a.tls = true
    else if (x === '--rounds') a.rounds = Number(value())
    else if (x === '--reads') a.reads = Number(value())
    else if (x === '--cold') a.cold = Number(value())
    else if (x === '--url') a.url = value()
    else if (x === '--help' || x === '-h') {
      console.log('node bench/redis-read.js [--rounds 7] [--reads 4000] [--cold 5] [--quick] [--tls] [--url redis://127.0.0.1:PORT]')
      process.exit(0)
    } else throw new Error(`unknown argument ${x}`)
  }
  for (const k of ['rounds', 'reads', 'cold']) {
    if (a[k] !== undefined && !(Number.isInteger(a[k]) && a[k] > 0)) throw new Error(`--${k} must be a positive integer`)
  }
  if (a.tls && a.url) throw new Error('--tls starts its own TLS server: give it without --url')
  return a
}

/** A private TLS-only redis-server and the CA that signed its certificate. */
async function startTlsRedis() {
  const fs = require('node:fs')
  const os = require('node:os')
  const { makeCertificates, RedisNode } = require('../__test__/helpers/redis-topology')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-bench-tls-'))
  const certs = makeCertificates(dir)
  const node = await new RedisNode('bench-tls', { dir, tls: { certs, authClients: 'no' } }).start()
  return {
    url: node.url,
    caFile: certs.caFile,
    stop: async () => {
      await node.kill()
      fs.rmSync(dir, { recursive: true, force: true })
    },
  }
}

async function standalone(args) {
  const server = args.url ? null : args.tls ? await startTlsRedis() : await require('./redis-lib.js').startRedis()
  const url = args.url || server.url
  const d = args.quick ? DEFAULTS.quick : DEFAULTS.full
  try {
    console.log(
      `bench/redis-read (${RUNTIME.name}): ${args.rounds || d.rounds} interleaved rounds of ${args.reads || d.reads} reads${args.tls ? ' over TLS' : ''}; ` +
        'stampede-cache (l1: false) / ioredis GET + JSON.parse',
    )
    console.log('| read | stampede-cache reads/s | ioredis reads/s | ratio (median of rounds) |')
    console.log('|---|---:|---:|---:|')
    const { cold, coldRuns } = await measureRedisReads({
      url,
      caFile: server && server.caFile,
      quick: args.quick,
      rounds: args.rounds,
      reads: args.reads,
      coldRuns: args.cold,
      onRow: (r) => console.log(`| ${r.name} | ${r.scReadsPerSec} | ${r.ioReadsPerSec} | ${r.ratio.toFixed(2)}x |`),
    })
    console.log(
      `\ncold process, first read (median of ${coldRuns}, from process start to value): stampede-cache ${cold.scMs.toFixed(1)} ms, ` +
        `ioredis ${cold.ioMs.toFixed(1)} ms (${cold.ratio.toFixed(2)}x the time)`,
    )
  } finally {
    if (server) await server.stop()
  }
}

/** Forked by scenario 8 (bench/lib/scenarios.js): measure against --url, answer over IPC. */
async function child(args) {
  process.on('disconnect', () => process.exit(0))
  try {
    const result = await measureRedisReads({ url: args.url, quick: args.quick, rounds: args.rounds, reads: args.reads, coldRuns: args.cold })
    process.send({ t: 'result', result }, () => process.disconnect())
  } catch (err) {
    process.send({ t: 'error', error: String((err && err.stack) || err) }, () => process.disconnect())
  }
}

if (require.main === module) {
  let args
  try {
    args = parseArgs(process.argv.slice(2))
  } catch (err) {
    console.error(`bench/redis-read: ${err.message}`)
    process.exit(2)
  }
  const main = process.send && args.url ? child : standalone
  main(args).catch((err) => {
    console.error(err)
    process.exit(1)
  })
}

module.exports = { measureRedisReads, DEFAULTS, ROWS }
