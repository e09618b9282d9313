'use strict'
// A bench worker process: one StampedeCache against the bench's Redis, driven over IPC.
// Commands: { cmd: 'cold', key, readers, loaderMs } and { cmd: 'hot', key, ttl, ratePerSec,
// seconds, loaderMs, startAt }. Each reply carries this process's loader calls and latencies.
const { StampedeCache } = require('../..')

const redis = process.env.BENCH_REDIS_URL
let loaderCalls = 0

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

function makeLoader(loaderMs) {
  return async () => {
    loaderCalls++
    await sleep(loaderMs)
    return { at: Date.now(), pid: process.pid }
  }
}

async function cold({ key, readers, loaderMs }) {
  const cache = new StampedeCache({ redis, namespace: 'bench' })
  await cache.get('warm-up-connection') // first connection set up before the barrier
  process.send({ ready: true })
  await new Promise((resolve) => process.once('message', resolve)) // the barrier
  const loader = makeLoader(loaderMs)
  const t0 = performance.now()
  const latencies = await Promise.all(
    Array.from({ length: readers }, async () => {
      const s = performance.now()
      await cache.getOrLoad(key, loader)
      return performance.now() - s
    }),
  )
  const stats = cache.stats()
  await cache.close()
  return { loaderCalls, latencies, wallMs: performance.now() - t0, stats }
}

async function hot({ key, ttl, ratePerSec, seconds, loaderMs, startAt }) {
  const cache = new StampedeCache({ redis, namespace: 'bench', ttl })
  const loader = makeLoader(loaderMs)
  await cache.get('warm-up-connection')
  process.send({ ready: true })
  await sleep(Math.max(0, startAt - Date.now()))
  const latencies = []
  const interval = 1000 / ratePerSec
  const total = Math.round(ratePerSec * seconds)
  const t0 = performance.now()
  const pending = []
  for (let i = 0; i < total; i++) {
    // Open-loop arrivals at a fixed rate: a slow read does not delay the next one.
    const due = t0 + i * interval
    const wait = due - performance.now()
    if (wait > 1) await sleep(wait)
    const s = performance.now()
    pending.push(cache.getOrLoad(key, loader).then(() => latencies.push(performance.now() - s)))
  }
  await Promise.all(pending)
  await cache.settle()
  const stats = cache.stats()
  await cache.close()
  return { loaderCalls, latencies, stats }
}

process.on('message', async (msg) => {
  if (!msg || !msg.cmd) return
  try {
    const result = msg.cmd === 'cold' ? await cold(msg) : await hot(msg)
    process.send({ result })
  } catch (err) {
    process.send({ error: String(err && err.stack) })
  }
})
