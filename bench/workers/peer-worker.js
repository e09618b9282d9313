'use strict'
// One bench worker process: one cache (a "peer") driven by the parent (bench/lib/scenarios.js)
// through a role. The parent sends { t: 'run', role, params }; the worker answers with
// { t: 'sync', name, data } at each barrier and waits for { t: 'go', name, data }, then sends
// { t: 'result', result } (or { t: 'error', error }). Loads go to the parent's simulated database
// over IPC (bench/lib/db.js), so every process of a scenario shares one database.
const { createPeer } = require('../lib/peers')
const { valueOfSize } = require('../lib/values')
const { dbQuery } = require('../lib/db')
const { mulberry32 } = require('../../examples/demo/simulated-db')

process.on('disconnect', () => process.exit(0))

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const sleepUntil = (epochMs) => sleep(Math.max(0, epochMs - Date.now()))

const gos = new Map()
process.on('message', (m) => {
  if (!m) return
  if (m.t === 'go') {
    const w = gos.get(m.name)
    if (w) w.resolve(m.data)
    else gos.set(m.name, { data: m.data, early: true })
  } else if (m.t === 'run') {
    run(m).catch((err) => process.send({ t: 'error', error: String((err && err.stack) || err) }))
  }
})

function sync(name, data) {
  process.send({ t: 'sync', name, data })
}

function waitFor(name) {
  const early = gos.get(name)
  if (early && early.early) {
    gos.delete(name)
    return Promise.resolve(early.data)
  }
  return new Promise((resolve) => gos.set(name, { resolve }))
}

async function run({ role, params }) {
  const peer = await createPeer(params.peer, params.peerOptions)
  peer.setLoader(dbQuery)
  await peer.warm()
  const result = await roles[role](peer, params)
  if (peer.stats) result.engineStats = peer.stats()
  await peer.close()
  process.send({ t: 'result', result })
}

/** A read that records its latency and outcome. */
function timedRead(peer, key, out) {
  const s = performance.now()
  let p
  try {
    p = Promise.resolve(peer.get(key))
  } catch (err) {
    p = Promise.reject(err)
  }
  return p.then(
    (v) => {
      out.latencies.push(performance.now() - s)
      if (v === null || v === undefined) out.empty++
      else out.served++
    },
    (err) => {
      out.latencies.push(performance.now() - s)
      out.failed++
      if (out.errors.length < 3) out.errors.push(String(err && err.message))
    },
  )
}

function newOutcome() {
  return { latencies: [], served: 0, empty: 0, failed: 0, shed: 0, errors: [] }
}

/**
 * Open-loop arrivals at a fixed rate from startAt (epoch ms) for durationMs: a slow read does not
 * delay the next one. At most maxOutstanding reads in flight; arrivals beyond that are shed
 * (counted, not read) so a peer in a runaway stampede cannot exhaust the machine.
 */
async function openLoop(peer, { startAt, ratePerSec, durationMs, pickKey, maxOutstanding = 4_000 }) {
  const out = newOutcome()
  await sleepUntil(startAt)
  const interval = 1000 / ratePerSec
  const total = Math.round((ratePerSec * durationMs) / 1000)
  const t0 = performance.now()
  const pending = new Set()
  for (let i = 0; i < total; i++) {
    const due = t0 + i * interval
    const wait = due - performance.now()
    if (wait > 1) await sleep(wait)
    if (pending.size >= maxOutstanding) {
      out.shed++
      continue
    }
    const p = timedRead(peer, pickKey(i), out)
    pending.add(p)
    p.then(() => pending.delete(p))
  }
  await Promise.all(pending)
  return out
}

const roles = {
  /** Scenarios 1 and 2: `readers` concurrent cold reads of one key at startAt. */
  async cold(peer, { key, readers }) {
    sync('ready')
    const { startAt } = await waitFor('go')
    await sleepUntil(startAt)
    const out = newOutcome()
    await Promise.all(Array.from({ length: readers }, () => timedRead(peer, key, out)))
    return out
  },

  /** Scenarios 3 and 7: one key, filled by worker 0, warmed everywhere, then read at a fixed rate. */
  async rate(peer, { key, index, ratePerSec, durationMs }) {
    if (index === 0) await peer.get(key)
    sync('filled')
    await waitFor('warm')
    if (index !== 0) await peer.get(key)
    sync('warmed')
    const { startAt } = await waitFor('go')
    return openLoop(peer, { startAt, ratePerSec, durationMs, pickKey: () => key })
  },

  /** Scenario 5: `keys` keys written at once, then read at random while they expire. */
  async massExpiry(peer, { keys, ratePerSec, readFromMs, readUntilMs, seed }) {
    const names = Array.from({ length: keys }, (_, i) => `item:${i}`)
    peer.setLoader((key) => ({ key, version: 0, items: [{ id: 1, title: 'written at the start' }] }))
    const f0 = performance.now()
    await Promise.all(names.map((k) => peer.get(k)))
    const fillMs = performance.now() - f0
    const filledAt = Date.now()
    sync('filled', { fillMs })
    peer.setLoader(dbQuery)
    const random = mulberry32(seed)
    const out = await openLoop(peer, {
      startAt: filledAt + readFromMs,
      ratePerSec,
      durationMs: readUntilMs - readFromMs,
      pickKey: () => names[Math.floor(random() * keys)],
    })
    out.fillMs = fillMs
    return out
  },

  /** Scenario 6: `reads` reads over `ids` ids that do not exist, `concurrency` at a time. */
  async negative(peer, { ids, reads, concurrency, seed }) {
    const random = mulberry32(seed)
    const order = Array.from({ length: reads }, (_, i) => `missing:${i % ids}`)
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1))
      ;[order[i], order[j]] = [order[j], order[i]]
    }
    sync('ready')
    await waitFor('go')
    const out = newOutcome()
    let next = 0
    const t0 = performance.now()
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next < order.length) await timedRead(peer, order[next++], out)
      }),
    )
    out.wallMs = performance.now() - t0
    return out
  },

  /** Scenario 4: fresh-hit throughput, sequential and 64 in flight, small and 100 KB values. */
  async hit(peer, { durationMs, rounds }) {
    const cells = []
    for (const [size, value] of [
      ['small', { id: 1, name: 'small' }],
      ['100 KB', valueOfSize(100_000)],
    ]) {
      peer.setLoader(() => value)
      const keys = Array.from({ length: 64 }, (_, i) => `hit:${size}:${i}`)
      for (const k of keys) await peer.get(k)
      const get = peer.get
      for (const mode of ['sequential', '64 in flight, 1 key', '64 in flight, 64 keys']) {
        const lanes = mode === 'sequential' ? 1 : 64
        const keyOf = (lane) => (mode === '64 in flight, 64 keys' ? keys[lane] : keys[0])
        const measure = async (ms) => {
          const deadline = performance.now() + ms
          const t0 = performance.now()
          const counts = await Promise.all(
            Array.from({ length: lanes }, async (_, lane) => {
              const k = keyOf(lane)
              // Batches between clock reads: long for a fast cache (so reading the clock costs
              // nothing), one op for a slow one (so the cell ends on time).
              let n = 0
              let batch = 1
              for (;;) {
                const b0 = performance.now()
                for (let i = 0; i < batch; i++) await get(k)
                n += batch
                const now = performance.now()
                if (now >= deadline) return n
                if (now - b0 < 0.05 && batch < 64) batch *= 2
              }
            }),
          )
          const ops = counts.reduce((a, b) => a + b, 0)
          return ops / ((performance.now() - t0) / 1000)
        }
        await measure(durationMs / 4) // warm the JIT and the caches
        const opsPerSec = []
        for (let r = 0; r < rounds; r++) opsPerSec.push(await measure(durationMs / rounds))
        opsPerSec.sort((a, b) => a - b)
        cells.push({ size, mode, opsPerSec: opsPerSec[opsPerSec.length >> 1], rounds: opsPerSec })
      }
    }
    return { cells }
  },
}
