'use strict'
// The one simulated database every peer loads from, hosted in the parent process so that all the
// worker processes of a scenario share it (and its load): a query takes 20 ms + 2 ms for every
// query in flight, and queries already running slow down when more arrive (the model of
// examples/demo/simulated-db.js), so a stampede feeds itself.
//
// Workers call it over IPC (dbQuery below); the parent answers (DbHost.attach). The host counts
// every loader call with its start time, which is how loads per 100 ms and "loads that hit the
// failing source" are measured, the same way for every peer.
const { SimulatedDb } = require('../../examples/demo/simulated-db')

const BASE_MS = 20
const PER_QUERY_MS = 2

class DbHost {
  constructor({ seed = 1 } = {}) {
    this.db = new SimulatedDb({ baseMs: BASE_MS, perQueryMs: PER_QUERY_MS, seed })
    this.t0 = performance.now()
    /** Start time (performance.now()) of every query. */
    this.times = []
    this.failing = 0
    this.failFrom = Infinity
    this.failUntil = -Infinity
    this.keys = new Map()
  }

  /** Makes t0 "now": timelines are measured from here. */
  mark() {
    this.t0 = performance.now()
  }

  /** The source fails (after its usual latency) for queries started in [now, now + ms). */
  failFor(ms, from = performance.now()) {
    this.failFrom = from
    this.failUntil = from + ms
  }

  async query(key) {
    const now = performance.now()
    const failing = now >= this.failFrom && now < this.failUntil
    this.times.push(now)
    this.keys.set(key, (this.keys.get(key) || 0) + 1)
    if (failing) this.failing++
    const value = await this.db.query(key)
    if (failing) throw new Error('the database is down')
    if (key.startsWith('missing:')) return null
    return value
  }

  get maxInFlight() {
    return this.db.maxInFlight
  }

  get loads() {
    return this.times.length
  }

  /** Start times of every query in ms from t0 (negative before it). */
  get starts() {
    return this.times.map((t) => t - this.t0)
  }

  /** Answers the worker's dbQuery messages. */
  attach(worker) {
    worker.on('message', (m) => {
      if (!m || m.t !== 'q') return
      // A worker killed at the end of a case may still have queries running: drop their answers.
      const reply = (msg) => worker.connected && worker.send(msg, () => {})
      this.query(m.key).then(
        (value) => reply({ t: 'r', id: m.id, value }),
        (err) => reply({ t: 'r', id: m.id, error: err.message }),
      )
    })
  }
}

// Worker side: the loader every peer gets.
let nextId = 0
const pending = new Map()
function dbQuery(key) {
  return new Promise((resolve, reject) => {
    const id = nextId++
    pending.set(id, { resolve, reject })
    process.send({ t: 'q', id, key })
  })
}
if (process.send) {
  process.on('message', (m) => {
    if (!m || m.t !== 'r') return
    const p = pending.get(m.id)
    if (!p) return
    pending.delete(m.id)
    if (m.error !== undefined) p.reject(new Error(m.error))
    else p.resolve(m.value)
  })
}

module.exports = { DbHost, dbQuery, BASE_MS, PER_QUERY_MS }
