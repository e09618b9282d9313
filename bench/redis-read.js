'use strict'
// Redis reads: stampede-cache's `get()` with `l1: false` (every read goes to Redis) against what a
// user would write instead: a raw ioredis client that stores each value itself as raw JSON
// (`SET k JSON.stringify(v)`) and reads it back with `JSON.parse(await redis.get(k))`. The two read
// different keys holding the same values, so ioredis never parses our envelopes. Both run in one
// process under one runtime against one private topology; rounds alternate who goes first, and each
// row reports the median of the per-round throughput ratios (stampede-cache / ioredis), so a noisy
// machine moves both sides.
//
//   node bench/redis-read.js [--rounds 5] [--reads 4000] [--keys 1000] [--cold 5] [--quick]
//                            [--tls | --unix | --sentinel | --cluster] [--runtimes node,bun,deno]
//                            [--before DIR]
//                            [--url redis://127.0.0.1:6379]
//
// Topologies (each started privately on 127.0.0.1, stopped by PID): one server over TCP (the
// default), --tls (a TLS-only server with a throwaway CA made by openssl, as in the tests), --unix
// (a server listening on a Unix socket too: both sides connect by its path), --sentinel (a primary,
// its replica and a sentinel monitoring them: stampede-cache with `{ sentinels, masterName }`,
// ioredis with its own Sentinel support, `{ sentinels, name }`; both find the primary through the
// sentinel and read from it) and --cluster (a 3-master Redis Cluster without replicas; ioredis's
// Cluster client on the other side).
// --runtimes: the same measurement under each runtime named (node, bun: the @oven/bun-linux-x64 dev
// dependency, deno: @deno/linux-x64-glibc), one child process each, against the same topology;
// without it, it runs under the runtime that runs this file. --before DIR: a copy of the package at
// an earlier commit (its files and its built addon), measured in the same rounds as a third side,
// so a change is shown before and after in the same runs.
//
// Rows: sequential reads and 64 reads in flight, of a 91 B and a 10 KB value, over --keys distinct
// keys (1,000; read in turn, so in-process coalescing cannot help). Then the first read of a cold
// process (process start to value), each side in its own fresh process. --quick: 2 rounds of 300
// reads, 3 cold processes a side (a check that it runs, not figures to quote).
//
// Scenario 8 of `npm run bench` (bench/lib/scenarios.js) forks this file with an IPC channel and
// --url: it then prints nothing and sends { t: 'result', result } (the value of measureRedisReads)
// or { t: 'error', error } to its parent. --json: prints the result as JSON on stdout's last line
// (how --runtimes collects each runtime's). measureRedisReads is also exported.

const { execFileSync, spawn } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const ROOT = path.join(__dirname, '..')
const IOREDIS = require.resolve('ioredis', { paths: [path.join(__dirname, 'node_modules')] })
const NS = 'rb'
/** Where ioredis keeps its own raw copies of the values (never an envelope). */
const RAW = 'raw'

/** Sizes of a full measurement and of --quick (a check that it runs, not figures to quote). */
const DEFAULTS = {
  full: { rounds: 5, reads: 4000, keys: 1000, coldRuns: 5 },
  quick: { rounds: 2, reads: 300, keys: 1000, coldRuns: 3 },
}

const ROWS = [
  { name: 'sequential, 91 B', size: 91, inflight: 1 },
  { name: 'sequential, 10 KB', size: 10_000, inflight: 1 },
  { name: '64 in flight, 91 B', size: 91, inflight: 64 },
  { name: '64 in flight, 10 KB', size: 10_000, inflight: 64 },
]

const RUNTIME_BINARIES = {
  node: () => [process.execPath, []],
  bun: () => [path.join(ROOT, 'node_modules', '@oven', 'bun-linux-x64', 'bin', 'bun'), []],
  deno: () => [path.join(ROOT, 'node_modules', '@deno', 'linux-x64-glibc', 'deno'), ['run', '--allow-all', '--unstable-detect-cjs']],
}

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
  ? { name: `Deno ${process.versions.deno}`, args: ['run', '--allow-all', '--unstable-detect-cjs'] }
  : process.versions.bun
    ? { name: `Bun ${process.versions.bun}`, args: [] }
    : { name: `Node ${process.versions.node}`, args: [] }

/**
 * How each side reaches the topology `where` describes: { kind: 'tcp' | 'tls' | 'unix' | 'sentinel'
 * | 'cluster', url?, caFile?, socket?, seeds?, sentinels?, masterName? }. `redis`: stampede-cache's option; `ioredis()`: a connected
 * raw client.
 */
function clientsOf(where) {
  const Redis = require(IOREDIS)
  const ca = where.caFile ? fs.readFileSync(where.caFile, 'utf8') : null
  switch (where.kind) {
    case 'cluster':
      return {
        redis: { cluster: where.seeds },
        ioredis: () =>
          new Redis.Cluster(
            where.seeds.map((u) => {
              const { hostname, port } = new URL(u)
              return { host: hostname, port: Number(port) }
            }),
          ),
      }
    case 'sentinel':
      return {
        redis: { sentinels: where.sentinels, masterName: where.masterName },
        ioredis: () =>
          new Redis({
            sentinels: where.sentinels.map((u) => {
              const { hostname, port } = new URL(u)
              return { host: hostname, port: Number(port) }
            }),
            name: where.masterName,
          }),
      }
    case 'unix':
      return { redis: `unix://${where.socket}`, ioredis: () => new Redis({ path: where.socket }) }
    default:
      return {
        redis: ca ? { url: where.url, tls: { ca } } : where.url,
        ioredis: () => new Redis(where.url, ca ? { tls: { ca } } : {}),
      }
  }
}

const COLD_CHILD = `
const [kind, root, ioredis, whereJson] = process.argv.slice(2)
const t0 = process.hrtime.bigint()
;(async () => {
  const { clientsOf } = require(${JSON.stringify(__filename)})
  const c = clientsOf(JSON.parse(whereJson))
  let v
  if (kind === 'sc') {
    const { StampedeCache } = require(root)
    const cache = new StampedeCache({ redis: c.redis, namespace: '${NS}', l1: false })
    v = await cache.get('cold')
    process.stdout.write(String(Number(process.hrtime.bigint() - t0) / 1e6))
    await cache.close()
  } else {
    const r = c.ioredis()
    v = JSON.parse(await r.get('${RAW}:cold'))
    process.stdout.write(String(Number(process.hrtime.bigint() - t0) / 1e6))
    r.disconnect()
  }
  if (!v || !v.data) process.exit(1)
})()
`

/**
 * Measures Redis reads of stampede-cache (`get()`, l1: false) against raw ioredis on the topology
 * `where` (see clientsOf; a bare `url` is one TCP server). Returns { runtime, rounds, reads, keys,
 * coldRuns, rows: [{ name, size, inflight, scReadsPerSec, ioReadsPerSec, ratio, ratios,
 * beforeReadsPerSec?, beforeRatio? }], cold: { scMs, ioMs, ratio, scRuns, ioRuns, beforeMs?,
 * beforeRatio? } }; ratio = the median of the per-round ratios (stampede-cache / ioredis);
 * cold.ratio = stampede-cache's time / ioredis's. `before`: the directory of an earlier copy of
 * the package, measured in the same rounds. onRow(row) is called as each row is done.
 */
async function measureRedisReads({ url, caFile = null, where, before = null, quick = false, rounds, reads, keys, coldRuns, onRow } = {}) {
  where = where || (url ? { kind: caFile ? 'tls' : 'tcp', url, caFile } : null)
  if (!where) throw new Error('measureRedisReads: url or where is required')
  const d = quick ? DEFAULTS.quick : DEFAULTS.full
  rounds = rounds || d.rounds
  reads = reads || d.reads
  keys = keys || d.keys
  coldRuns = coldRuns || d.coldRuns
  const clients = clientsOf(where)
  const sides = [{ name: 'sc', root: ROOT }]
  if (before) sides.push({ name: 'before', root: path.resolve(before) })
  for (const s of sides) {
    const { StampedeCache } = require(s.root)
    s.cache = new StampedeCache({ redis: clients.redis, namespace: NS, l1: false, ttl: 3_600_000 })
  }
  const io = clients.ioredis()
  const rows = []
  try {
    for (const row of ROWS) {
      const value = valueOfSize(row.size)
      const names = Array.from({ length: keys }, (_, i) => `${row.size}:${i}`)
      const raw = names.map((k) => `${RAW}:${k}`)
      // Each side writes its own copy: stampede-cache its envelopes, ioredis the raw JSON.
      const setter = sides[0].cache
      for (let i = 0; i < keys; i += 100) {
        await Promise.all(names.slice(i, i + 100).map((k) => setter.set(k, value)))
        await Promise.all(raw.slice(i, i + 100).map((k) => io.set(k, JSON.stringify(value))))
      }
      const readers = sides.map((s) => ({
        name: s.name,
        read: async (i) => {
          const v = await s.cache.get(names[i % keys])
          if (v === undefined) throw new Error(`${s.name}: a read missed: the value must come from Redis`)
          return v
        },
      }))
      readers.push({ name: 'io', read: async (i) => JSON.parse(await io.get(raw[i % keys])) })
      // Warm each side over every key (connections, lanes, slot maps).
      for (const r of readers) await throughput(r.read, Math.max(keys, 500), row.inflight)
      const perSide = Object.fromEntries(readers.map((r) => [r.name, []]))
      const ratios = []
      const beforeRatios = []
      for (let round = 0; round < rounds; round++) {
        // Rotate who goes first, so no side always runs on a warmer machine.
        const got = {}
        for (let j = 0; j < readers.length; j++) {
          const r = readers[(round + j) % readers.length]
          got[r.name] = await throughput(r.read, reads, row.inflight)
          perSide[r.name].push(got[r.name])
        }
        ratios.push(got.sc / got.io)
        if (before) beforeRatios.push(got.before / got.io)
      }
      const out = {
        name: row.name,
        size: row.size,
        inflight: row.inflight,
        scReadsPerSec: Math.round(median(perSide.sc)),
        ioReadsPerSec: Math.round(median(perSide.io)),
        ratio: +median(ratios).toFixed(4),
        ratios: ratios.map((x) => +x.toFixed(4)),
      }
      if (before) {
        out.beforeReadsPerSec = Math.round(median(perSide.before))
        out.beforeRatio = +median(beforeRatios).toFixed(4)
      }
      rows.push(out)
      if (onRow) onRow(out)
    }
    for (const s of sides) if (s.cache.stats().loads !== 0) throw new Error(`${s.name}: a read called the loader`)
  } finally {
    for (const s of sides) await s.cache.close()
    io.disconnect()
  }

  // The cold process reads one key each side wrote its own way; it runs under this runtime too,
  // from a file (Deno has no `-e`).
  {
    const { StampedeCache } = require(ROOT)
    const setter = new StampedeCache({ redis: clients.redis, namespace: NS })
    await setter.set('cold', valueOfSize(91))
    await setter.close()
    const raw = clients.ioredis()
    await raw.set(`${RAW}:cold`, JSON.stringify(valueOfSize(91)))
    raw.disconnect()
  }
  const runs = { sc: [], io: [], before: [] }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-bench-cold-'))
  const script = path.join(dir, 'cold.cjs')
  fs.writeFileSync(script, COLD_CHILD)
  try {
    for (let r = 0; r < coldRuns; r++) {
      for (const side of sides.map((s) => s.name).concat('io')) {
        const root = side === 'before' ? path.resolve(before) : ROOT
        const args = [...RUNTIME.args, script, side === 'io' ? 'io' : 'sc', root, IOREDIS, JSON.stringify(where)]
        runs[side].push(Number(execFileSync(process.execPath, args, { encoding: 'utf8', timeout: 60_000 })))
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
  if (before) {
    cold.beforeMs = +median(runs.before).toFixed(1)
    cold.beforeRatio = +(median(runs.before) / median(runs.io)).toFixed(4)
  }
  return { runtime: RUNTIME.name, where: where.kind, rounds, reads, keys, coldRuns, rows, cold }
}

const USAGE =
  'node bench/redis-read.js [--rounds 5] [--reads 4000] [--keys 1000] [--cold 5] [--quick] [--tls | --unix | --sentinel | --cluster] ' +
  '[--runtimes node,bun,deno] [--before DIR] [--url redis://127.0.0.1:PORT]'

function parseArgs(argv) {
  const a = { quick: false, kind: 'tcp', json: false, before: null, runtimes: null, where: null }
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i]
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${x} needs a value`)
      return argv[++i]
    }
    if (x === '--quick') a.quick = true
    else if (x === '--tcp') a.kind = 'tcp'
    else if (x === '--tls') a.kind = 'tls'
    else if (x === '--unix') a.kind = 'unix'
    else if (x === '--cluster') a.kind = 'cluster'
    else if (x === '--sentinel') a.kind = 'sentinel'
    else if (x === '--json') a.json = true
    else if (x === '--rounds' || x === '--reads' || x === '--keys' || x === '--cold') a[x.slice(2)] = Number(value())
    else if (x === '--url') a.url = value()
    else if (x === '--before') a.before = value()
    else if (x === '--runtimes') a.runtimes = value().split(',')
    else if (x === '--where') a.where = JSON.parse(value())
    else if (x === '--help' || x === '-h') {
      console.log(USAGE)
      process.exit(0)
    } else throw new Error(`unknown argument ${x}`)
  }
  for (const k of ['rounds', 'reads', 'keys', 'cold']) {
    if (a[k] !== undefined && !(Number.isInteger(a[k]) && a[k] > 0)) throw new Error(`--${k} must be a positive integer`)
  }
  for (const r of a.runtimes || []) if (!RUNTIME_BINARIES[r]) throw new Error(`--runtimes: unknown runtime ${r}`)
  if (a.kind !== 'tcp' && a.url) throw new Error(`--${a.kind} starts its own topology: give it without --url`)
  return a
}

/** Starts the private topology `kind` names: { where, stop }. */
async function startTopology(kind) {
  const { makeCertificates, RedisNode, RedisCluster, RedisSentinelGroup } = require('../__test__/helpers/redis-topology')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `sc-bench-${kind}-`))
  const done = async (stop, where) => ({
    where,
    stop: async () => {
      await stop()
      fs.rmSync(dir, { recursive: true, force: true })
    },
  })
  if (kind === 'cluster') {
    const cluster = await new RedisCluster({ masters: 3, replicasPerMaster: 0 }).start()
    return done(() => cluster.dispose(), { kind, seeds: cluster.seedUrls })
  }
  if (kind === 'sentinel') {
    // A long down-after: a busy machine's slow PING must not fail the primary over mid-run.
    const group = new RedisSentinelGroup({ downAfter: 60_000, failoverTimeout: 120_000 })
    await group.start()
    return done(() => group.dispose(), { kind, sentinels: group.sentinelUrls, masterName: group.masterName })
  }
  if (kind === 'tls') {
    const certs = makeCertificates(dir)
    const node = await new RedisNode('bench-tls', { dir, tls: { certs, authClients: 'no' } }).start()
    return done(() => node.kill(), { kind, url: node.url, caFile: certs.caFile })
  }
  const socket = path.join(dir, 'redis.sock')
  const conf = kind === 'unix' ? () => [`unixsocket ${socket}`, 'unixsocketperm 700'] : () => []
  const node = await new RedisNode(`bench-${kind}`, { dir, conf }).start()
  return done(() => node.kill(), kind === 'unix' ? { kind, socket } : { kind, url: node.url })
}

function measureArgs(args) {
  return { quick: args.quick, rounds: args.rounds, reads: args.reads, keys: args.keys, coldRuns: args.cold, before: args.before }
}

/** Runs this file under `runtime` against `where`; resolves with its measureRedisReads result. */
function underRuntime(runtime, where, args) {
  const [bin, pre] = RUNTIME_BINARIES[runtime]()
  const pass = ['--json', '--where', JSON.stringify(where)]
  if (args.quick) pass.push('--quick')
  for (const k of ['rounds', 'reads', 'keys', 'cold']) if (args[k]) pass.push(`--${k}`, String(args[k]))
  if (args.before) pass.push('--before', args.before)
  return new Promise((resolve, reject) => {
    const child = spawn(bin, [...pre, __filename, ...pass], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, NO_COLOR: '1', DENO_NO_UPDATE_CHECK: '1' },
    })
    let out = ''
    child.stdout.on('data', (d) => {
      out += d
    })
    child.once('error', reject)
    child.once('exit', (code) => {
      if (code !== 0) return reject(new Error(`${runtime} exited ${code}`))
      resolve(JSON.parse(out.trim().split('\n').pop()))
    })
  })
}

function printResult(r, where) {
  const b = r.rows[0] && r.rows[0].beforeRatio !== undefined
  console.log(
    `\n${r.runtime}, ${where}: ${r.rounds} interleaved rounds of ${r.reads} reads over ${r.keys} keys; ` +
      'stampede-cache get() (l1: false) / ioredis GET + JSON.parse of raw JSON it wrote',
  )
  console.log(
    b
      ? '| read | before reads/s | after reads/s | ioredis reads/s | before | after |\n|---|---:|---:|---:|---:|---:|'
      : '| read | stampede-cache reads/s | ioredis reads/s | ratio (median of rounds) |\n|---|---:|---:|---:|',
  )
  for (const x of r.rows) {
    console.log(
      b
        ? `| ${x.name} | ${x.beforeReadsPerSec} | ${x.scReadsPerSec} | ${x.ioReadsPerSec} | ${x.beforeRatio.toFixed(2)}x | ${x.ratio.toFixed(2)}x |`
        : `| ${x.name} | ${x.scReadsPerSec} | ${x.ioReadsPerSec} | ${x.ratio.toFixed(2)}x |`,
    )
  }
  const c = r.cold
  console.log(
    `cold process, first read (median of ${r.coldRuns}, process start to value): ` +
      (b ? `before ${c.beforeMs.toFixed(1)} ms (${c.beforeRatio.toFixed(2)}x), after ` : 'stampede-cache ') +
      `${c.scMs.toFixed(1)} ms (${c.ratio.toFixed(2)}x the time), ioredis ${c.ioMs.toFixed(1)} ms`,
  )
}

const DESCRIBED = {
  tcp: 'one server over TCP',
  tls: 'one server over TLS',
  unix: 'one server over a Unix socket',
  sentinel: 'a Sentinel primary (with a replica)',
  cluster: '3-master Redis Cluster',
}

async function standalone(args) {
  if (args.where) {
    const result = await measureRedisReads({ where: args.where, ...measureArgs(args) })
    if (args.json) console.log(JSON.stringify(result))
    else printResult(result, DESCRIBED[args.where.kind])
    return
  }
  const started = args.url ? { where: { kind: 'tcp', url: args.url }, stop: async () => {} } : await startTopology(args.kind)
  try {
    if (args.runtimes) {
      for (const runtime of args.runtimes) printResult(await underRuntime(runtime, started.where, args), DESCRIBED[started.where.kind])
    } else {
      const result = await measureRedisReads({ where: started.where, ...measureArgs(args) })
      if (args.json) console.log(JSON.stringify(result))
      else printResult(result, DESCRIBED[started.where.kind])
    }
  } finally {
    await started.stop()
  }
}

/** Forked by scenario 8 (bench/lib/scenarios.js): measure against --url, answer over IPC. */
async function child(args) {
  process.on('disconnect', () => process.exit(0))
  try {
    const result = await measureRedisReads({ url: args.url, ...measureArgs(args) })
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
  main(args).then(
    () => process.exit(0),
    (err) => {
      console.error(err)
      process.exit(1)
    },
  )
}

module.exports = { measureRedisReads, clientsOf, DEFAULTS, ROWS }
