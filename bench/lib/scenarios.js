'use strict'
// The eight scenarios of the bench, parent side: each (scenario, peer) forks fresh worker
// processes (bench/workers/peer-worker.js), drives them through barriers, and measures loads on
// the shared simulated database (bench/lib/db.js). Scenario 8 (Redis reads against raw ioredis)
// forks bench/redis-read.js instead, once, and uses no database.
const { fork } = require('node:child_process')
const path = require('node:path')
const { DbHost, BASE_MS } = require('./db')
const { PEERS, BASELINES } = require('./peers')

const WORKER = path.join(__dirname, '..', 'workers', 'peer-worker.js')
const REDIS_READ = path.join(__dirname, '..', 'redis-read.js')
const n = (x) => x.toLocaleString('en-US')
const sec = (ms) => `${n(ms / 1000)} s`
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** The sizes of a full run (the numbers) and of --quick (every scenario, reduced). */
const SIZES = {
  full: {
    cold1: { readers: 1_000 },
    cold4: { readers: 250 },
    hot: { ttl: 1_000, hardTtl: 10_000, ratePerSec: 2_000, durationMs: 10_000 },
    hit: { durationMs: 1_000, rounds: 5 },
    mass: { keys: 5_000, ttl: 2_000, hardTtl: 120_000, ratePerSec: 5_000, readFromMs: 1_000, readUntilMs: 4_000 },
    negative: { ids: 1_000, reads: 20_000, concurrency: 64 },
    failing: { ttl: 1_000, hardTtl: 60_000, failMs: 3_000, afterMs: 1_000, ratePerSec: 2_000 },
    redisRead: { rounds: 5, reads: 4_000, coldRuns: 5 },
    caseTimeoutMs: 120_000,
  },
  quick: {
    cold1: { readers: 200 },
    cold4: { readers: 50 },
    hot: { ttl: 1_000, hardTtl: 10_000, ratePerSec: 400, durationMs: 1_500 },
    hit: { durationMs: 150, rounds: 3 },
    mass: { keys: 500, ttl: 1_000, hardTtl: 10_000, ratePerSec: 1_000, readFromMs: 700, readUntilMs: 2_000 },
    negative: { ids: 100, reads: 2_000, concurrency: 64 },
    failing: { ttl: 1_000, hardTtl: 10_000, failMs: 600, afterMs: 300, ratePerSec: 400 },
    redisRead: { rounds: 2, reads: 300, coldRuns: 3 },
    caseTimeoutMs: 30_000,
  },
}

/** Every worker process alive, so a timed-out or crashed case can still end them all. */
const live = new Set()

class Workers {
  constructor(n, db) {
    this.list = Array.from({ length: n }, () => fork(WORKER, [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }))
    for (const w of this.list) {
      live.add(w)
      w.once('exit', () => live.delete(w))
    }
    this.waiters = new Map() // sync name -> { got: [], resolve }
    this.results = new Array(n)
    this.failure = null
    let resolveAll
    let rejectAll
    this.done = new Promise((resolve, reject) => {
      resolveAll = resolve
      rejectAll = reject
    })
    this.done.catch(() => {})
    let remaining = n
    this.list.forEach((w, i) => {
      db.attach(w)
      w.on('message', (m) => {
        if (!m) return
        if (m.t === 'sync') this.#arrive(m.name, i, m.data)
        else if (m.t === 'result') {
          this.results[i] = m.result
          if (--remaining === 0) resolveAll(this.results)
        } else if (m.t === 'error') rejectAll(new Error(`worker ${i}: ${m.error}`))
      })
      w.on('exit', (code, signal) => {
        if (this.results[i] === undefined) rejectAll(new Error(`worker ${i} exited (${code ?? signal}) before its result`))
      })
    })
    this.rejectAll = rejectAll
  }

  #waiter(name) {
    let w = this.waiters.get(name)
    if (!w) {
      w = { got: new Array(this.list.length), count: 0 }
      w.promise = new Promise((resolve) => (w.resolve = resolve))
      this.waiters.set(name, w)
    }
    return w
  }

  #arrive(name, i, data) {
    const w = this.#waiter(name)
    w.got[i] = data
    if (++w.count === this.list.length) w.resolve(w.got)
  }

  /** Resolves when every worker has reached barrier `name` (or rejects if one fails first). */
  sync(name) {
    return Promise.race([this.#waiter(name).promise, this.done.then(() => Promise.reject(new Error(`ended before ${name}`)))])
  }

  go(name, data) {
    for (const w of this.list) if (w.connected) w.send({ t: 'go', name, data }, () => {})
  }

  run(role, paramsOf) {
    this.list.forEach((w, i) => w.send({ t: 'run', role, params: paramsOf(i) }))
  }

  kill() {
    for (const w of this.list) if (w.exitCode === null && w.signalCode === null) w.kill('SIGKILL')
  }
}

/** Forks bench/redis-read.js against redisUrl; resolves with its measureRedisReads result. */
function redisReadChild(redisUrl, p) {
  const args = ['--url', redisUrl, '--rounds', String(p.rounds), '--reads', String(p.reads), '--cold', String(p.coldRuns)]
  const child = fork(REDIS_READ, args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  live.add(child)
  child.once('exit', () => live.delete(child))
  return new Promise((resolve, reject) => {
    let settled = false
    child.on('message', (m) => {
      if (!m || settled) return
      settled = true
      if (m.t === 'result') resolve(m.result)
      else reject(new Error(`redis-read: ${m.error}`))
    })
    child.once('exit', (code, signal) => {
      if (!settled) reject(new Error(`redis-read exited (${code ?? signal}) before its result`))
    })
  }).finally(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
}

function summarize(latencies) {
  const xs = Float64Array.from(latencies).sort()
  const at = (p) => (xs.length ? xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))] : 0)
  return { p50: at(50), p90: at(90), p99: at(99), max: xs.length ? xs[xs.length - 1] : 0 }
}

function merge(outs) {
  const all = { latencies: [], served: 0, empty: 0, failed: 0, shed: 0, errors: [] }
  for (const o of outs) {
    for (const l of o.latencies) all.latencies.push(l)
    all.served += o.served
    all.empty += o.empty
    all.failed += o.failed
    all.shed += o.shed
    for (const e of o.errors) if (all.errors.length < 3) all.errors.push(e)
  }
  return all
}

function readRow(db, outs) {
  const all = merge(outs)
  const row = {
    loads: db.loads,
    reads: all.latencies.length,
    served: all.served,
    empty: all.empty,
    failed: all.failed,
    shed: all.shed,
    ...roundAll(summarize(all.latencies)),
    maxDbInFlight: db.maxInFlight,
  }
  if (all.errors.length) row.sampleErrors = all.errors
  const engine = outs.map((o) => o.engineStats).filter(Boolean)
  if (engine.length) row.engineStats = sumStats(engine)
  return { row, latencies: all.latencies }
}

function sumStats(list) {
  const out = {}
  for (const s of list) for (const [k, v] of Object.entries(s)) out[k] = (out[k] || 0) + v
  return out
}

function roundAll(o) {
  const r = {}
  for (const [k, v] of Object.entries(o)) r[k] = v >= 10 ? +v.toFixed(1) : +v.toFixed(3)
  return r
}

const SCENARIOS = [
  {
    id: 1,
    slug: 'cold-1-process',
    title: 'cold key, 1 process x 1,000 concurrent readers',
    processes: 1,
    describe: (s) => `one key nobody has cached; ${n(s.cold1.readers)} concurrent reads in one process`,
    async run({ peer, redisUrl, s, db }) {
      const ws = new Workers(1, db)
      try {
        ws.run('cold', () => ({ peer, peerOptions: { redisUrl, ttl: 60_000, hardTtl: 600_000 }, key: 'cold', readers: s.cold1.readers }))
        await ws.sync('ready')
        db.mark()
        ws.go('go', { startAt: Date.now() + 20 })
        return readRow(db, await ws.done).row
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 2,
    slug: 'cold-4-processes',
    title: 'cold key, 4 processes x 250 concurrent readers behind a barrier',
    processes: 4,
    describe: (s) => `one key nobody has cached; 4 processes, each fires ${n(s.cold4.readers)} concurrent reads at the same instant (a shared start time)`,
    async run({ peer, redisUrl, s, db }) {
      const ws = new Workers(4, db)
      try {
        ws.run('cold', () => ({ peer, peerOptions: { redisUrl, ttl: 60_000, hardTtl: 600_000 }, key: 'cold', readers: s.cold4.readers }))
        await ws.sync('ready')
        db.mark()
        ws.go('go', { startAt: Date.now() + 100 })
        return readRow(db, await ws.done).row
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 3,
    slug: 'hot-key',
    title: 'hot key, ttl 1 s, 4 processes at 2,000 reads/s for 10 s',
    processes: 4,
    describe: (s) =>
      `one key loaded once (then read once in every process), then read by 4 processes at ${n(s.hot.ratePerSec)} reads/s in all (open loop) for ${sec(s.hot.durationMs)}; ` +
      `ttl ${sec(s.hot.ttl)}, stale values kept until ${sec(s.hot.hardTtl)}; loads include the first fill; "reads > 20 ms" are reads slower than a lone loader call (${BASE_MS} ms)`,
    async run({ peer, redisUrl, s, db }) {
      const p = s.hot
      const ws = new Workers(4, db)
      try {
        ws.run('rate', (index) => ({
          peer,
          peerOptions: { redisUrl, ttl: p.ttl, hardTtl: p.hardTtl },
          key: 'hot',
          index,
          ratePerSec: p.ratePerSec / 4,
          durationMs: p.durationMs,
        }))
        await ws.sync('filled')
        ws.go('warm')
        await ws.sync('warmed')
        ws.go('go', { startAt: Date.now() + 100 })
        db.t0 = performance.now() + 100
        const { row, latencies } = readRow(db, await ws.done)
        row.slowReads = latencies.filter((l) => l > BASE_MS).length
        // When each load started, in ms from the first timed read (the fill is negative).
        if (db.loads <= 200) row.loadStartsMs = db.starts.map((t) => Math.round(t))
        return row
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 4,
    slug: 'hit-throughput',
    title: 'hit throughput, 1 process: sequential, 64 in flight on 1 key, 64 in flight on 64 keys; small and 100 KB values',
    processes: 1,
    peers: [...PEERS, ...BASELINES],
    describe: (s) =>
      `fresh hits only (ttl 1 h), values from an in-process loader; each cell: a warm-up of ${s.hit.durationMs / 4} ms, then ${s.hit.rounds} rounds of ${s.hit.durationMs / s.hit.rounds} ms, ` +
      'median ops/s; "64 in flight" runs 64 sequential `await` loops at once; ns/op = 1e9 / sequential ops/s',
    async run({ peer, redisUrl, s, db }) {
      const ws = new Workers(1, db)
      try {
        ws.run('hit', () => ({ peer, peerOptions: { redisUrl, ttl: 3_600_000, hardTtl: 7_200_000 }, ...s.hit }))
        const [r] = await ws.done
        return { cells: r.cells.map((c) => ({ ...c, opsPerSec: Math.round(c.opsPerSec), rounds: c.rounds.map(Math.round) })) }
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 5,
    slug: 'mass-expiry',
    title: '5,000 keys written together, then read at random as they expire',
    processes: 1,
    describe: (s) =>
      `${n(s.mass.keys)} keys loaded at once by one process (an in-process loader, so the fill itself is not a database load; ttl ${sec(s.mass.ttl)}, ` +
      `stale values kept until ${sec(s.mass.hardTtl)}), then read at random (seeded) at ${n(s.mass.ratePerSec)} reads/s from ${sec(s.mass.readFromMs)} to ` +
      `${sec(s.mass.readUntilMs)} after the write; loads counted per 100 ms from the end of the write`,
    async run({ peer, redisUrl, s, db }) {
      const p = s.mass
      const ws = new Workers(1, db)
      try {
        ws.run('massExpiry', () => ({
          peer,
          peerOptions: { redisUrl, ttl: p.ttl, hardTtl: p.hardTtl },
          keys: p.keys,
          ratePerSec: p.ratePerSec,
          readFromMs: p.readFromMs,
          readUntilMs: p.readUntilMs,
          seed: 5,
        }))
        const [{ fillMs }] = await ws.sync('filled')
        db.mark()
        const outs = await ws.done
        const { row } = readRow(db, outs)
        const buckets = new Array(Math.ceil(p.readUntilMs / 100) + 20).fill(0)
        for (const t of db.starts) {
          const b = Math.floor(t / 100)
          if (b >= 0 && b < buckets.length) buckets[b]++
        }
        while (buckets.length && buckets[buckets.length - 1] === 0) buckets.pop()
        row.fillMs = +fillMs.toFixed(1)
        row.peakLoadsPer100ms = Math.max(0, ...buckets)
        row.distinctKeysLoaded = db.keys.size
        row.timeline = buckets
        return row
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 6,
    slug: 'negative',
    title: '20,000 reads over 1,000 ids that do not exist',
    processes: 1,
    describe: (s) =>
      `${n(s.negative.reads)} reads in a seeded random order over ${n(s.negative.ids)} ids the database answers null for, ${s.negative.concurrency} in flight, one process; ` +
      'every peer caches the null result for the ttl (60 s); naive cache-aside caches it too (it stores the JSON `null`)',
    async run({ peer, redisUrl, s, db }) {
      const p = s.negative
      const ws = new Workers(1, db)
      try {
        ws.run('negative', () => ({
          peer,
          peerOptions: { redisUrl, ttl: 60_000, hardTtl: 600_000, negativeTtl: 60_000 },
          ids: p.ids,
          reads: p.reads,
          concurrency: p.concurrency,
          seed: 6,
        }))
        await ws.sync('ready')
        db.mark()
        ws.go('go')
        const outs = await ws.done
        const { row } = readRow(db, outs)
        row.ids = p.ids
        row.distinctIdsLoaded = db.keys.size
        row.wallMs = +outs[0].wallMs.toFixed(1)
        return row
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 7,
    slug: 'failing-source',
    title: 'loader failing for 3 s on an expired key',
    processes: 4,
    describe: (s) =>
      `one key loaded (ttl ${sec(s.failing.ttl)}, stale values kept until ${sec(s.failing.hardTtl)}) and read once in each of 4 processes; once it has expired everywhere, ` +
      `the 4 processes read it at ${n(s.failing.ratePerSec)} reads/s in all while the database fails every query for ${sec(s.failing.failMs)}, ` +
      `and ${sec(s.failing.afterMs)} more after it recovers; "served" = reads answered with a value; "loads on the failing source" = loader calls started while it was down; ` +
      '"loads" includes the first fill and loads after the recovery',
    async run({ peer, redisUrl, s, db }) {
      const p = s.failing
      const ws = new Workers(4, db)
      try {
        ws.run('rate', (index) => ({
          peer,
          peerOptions: { redisUrl, ttl: p.ttl, hardTtl: p.hardTtl },
          key: 'flaky',
          index,
          ratePerSec: p.ratePerSec / 4,
          durationMs: p.failMs + p.afterMs,
        }))
        await ws.sync('filled')
        const filledAt = Date.now()
        ws.go('warm')
        await ws.sync('warmed')
        // Past the longest jittered ttl everywhere.
        await sleep(Math.max(0, filledAt + p.ttl * 1.1 + 300 - Date.now()))
        const startAt = Date.now() + 100
        db.failFor(p.failMs, performance.now() + 100)
        const fillLoads = db.loads
        ws.go('go', { startAt })
        const { row } = readRow(db, await ws.done)
        row.fillLoads = fillLoads
        row.failingLoads = db.failing
        row.servedShare = row.reads ? +(row.served / (row.reads + row.shed)).toFixed(4) : 0
        return row
      } finally {
        ws.kill()
      }
    },
  },
  {
    id: 8,
    slug: 'redis-read',
    title: 'Redis reads: stampede-cache (l1: false) against a raw ioredis client',
    processes: 1,
    // One measurement with both sides in it, not one per peer: its row is stampede-cache's.
    peers: ['stampede-cache'],
    describe: (s) =>
      'every read goes to Redis: stampede-cache with `l1: false` (`get`) against `JSON.parse(await redis.get(k))` on ioredis of raw JSON it wrote itself, over 1,000 keys a side, ' +
      `in one fresh process (bench/redis-read.js), no simulated database; ${s.redisRead.rounds} interleaved rounds of ${n(s.redisRead.reads)} reads a side per row, ` +
      'reads/s = the median of the rounds, ratio = the median of the per-round ratios (stampede-cache / ioredis; above 1 = stampede-cache faster); ' +
      '"64 in flight" runs 64 sequential `await` loops over the keys in turn, so in-process coalescing cannot help; ' +
      `cold first read: from process start to the value of one 91 B key, each side in its own fresh process, median of ${s.redisRead.coldRuns} (below 1 = stampede-cache faster)`,
    async run({ redisUrl, s }) {
      return redisReadChild(redisUrl, s.redisRead)
    },
  },
]

async function runCase(scenario, peer, { redisUrl, s }) {
  const db = new DbHost({ seed: scenario.id })
  const t0 = performance.now()
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${s.caseTimeoutMs} ms`)), s.caseTimeoutMs)
  })
  try {
    const row = await Promise.race([scenario.run({ peer, redisUrl, s, db }), timeout])
    return { peer, ...row, caseMs: Math.round(performance.now() - t0) }
  } catch (err) {
    return { peer, error: String(err.message || err), loads: db.loads, caseMs: Math.round(performance.now() - t0) }
  } finally {
    clearTimeout(timer)
    killAll()
  }
}

function killAll() {
  for (const w of live) if (w.exitCode === null && w.signalCode === null) w.kill('SIGKILL')
}

module.exports = { SCENARIOS, SIZES, runCase, killAll }
