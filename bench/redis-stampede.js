'use strict'
// Cross-process stampede figures for the Redis tier (issue "Redis tier"), from real processes:
//  1. cold key, 4 processes x 250 concurrent readers behind a barrier: loader calls in total;
//  2. hot key, ttl 1 s, read by 4 processes at 2,000 reads/s in all for 10 s: loader calls
//     and the slowest read.
// Starts its own redis-server on a free loopback port and stops it at the end.
//
//   node bench/redis-stampede.js [--seconds 10] [--json]
const { fork } = require('node:child_process')
const path = require('node:path')
const { startRedis, percentile } = require('./redis-lib')

const args = process.argv.slice(2)
const seconds = Number(args[args.indexOf('--seconds') + 1]) || 10
const PROCESSES = 4

function startWorkers(url) {
  return Array.from({ length: PROCESSES }, () => fork(path.join(__dirname, 'workers', 'stampede-worker.js'), { env: { ...process.env, BENCH_REDIS_URL: url } }))
}

function next(worker, field) {
  return new Promise((resolve, reject) => {
    const onMessage = (m) => {
      if (m.error) reject(new Error(m.error))
      else if (m[field] !== undefined) {
        worker.off('message', onMessage)
        resolve(m[field])
      }
    }
    worker.on('message', onMessage)
  })
}

async function coldScenario(url) {
  const workers = startWorkers(url)
  const ready = workers.map((w) => next(w, 'ready'))
  const results = workers.map((w) => next(w, 'result'))
  workers.forEach((w) => w.send({ cmd: 'cold', key: 'cold-key', readers: 250, loaderMs: 50 }))
  await Promise.all(ready)
  workers.forEach((w) => w.send('go'))
  const rs = await Promise.all(results)
  workers.forEach((w) => w.kill())
  const latencies = rs.flatMap((r) => r.latencies)
  return {
    scenario: 'cold key, 4 processes x 250 readers',
    loaderCalls: rs.reduce((n, r) => n + r.loaderCalls, 0),
    p50Ms: +percentile(latencies, 50).toFixed(1),
    p99Ms: +percentile(latencies, 99).toFixed(1),
    maxMs: +Math.max(...latencies).toFixed(1),
  }
}

async function hotScenario(url) {
  const workers = startWorkers(url)
  const ready = workers.map((w) => next(w, 'ready'))
  const results = workers.map((w) => next(w, 'result'))
  const startAt = Date.now() + 500
  workers.forEach((w) => w.send({ cmd: 'hot', key: 'hot-key', ttl: 1000, ratePerSec: 2000 / PROCESSES, seconds, loaderMs: 20, startAt }))
  await Promise.all(ready)
  const rs = await Promise.all(results)
  workers.forEach((w) => w.kill())
  const latencies = rs.flatMap((r) => r.latencies)
  return {
    scenario: `hot key ttl 1 s, 4 processes, 2,000 reads/s, ${seconds} s`,
    loaderCalls: rs.reduce((n, r) => n + r.loaderCalls, 0),
    reads: latencies.length,
    p50Ms: +percentile(latencies, 50).toFixed(2),
    p99Ms: +percentile(latencies, 99).toFixed(2),
    maxMs: +Math.max(...latencies).toFixed(1),
    readsOver40Ms: latencies.filter((l) => l > 40).length,
  }
}

async function main() {
  const redis = await startRedis()
  try {
    const rows = [await coldScenario(redis.url), await hotScenario(redis.url)]
    if (args.includes('--json')) console.log(JSON.stringify(rows))
    else console.table(rows)
  } finally {
    redis.stop()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
