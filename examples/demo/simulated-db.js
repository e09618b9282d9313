'use strict'
// A simulated database whose query latency grows with its load: the feedback loop behind a
// cache stampede.
//
// Each query needs one unit of work (scaled by a small seeded random factor, so runs are
// comparable). While n queries are in flight, each one progresses at 1 / (baseMs + perQueryMs * n)
// units per ms; at a steady concurrency n a query therefore takes baseMs + perQueryMs * n ms.
// Unlike fixing the latency when a query starts, this slows down queries that are already
// running whenever more arrive, the way a real database's CPU, locks and connection pool do.
// So every extra miss delays the first result, and a longer wait lets in more misses.

/** mulberry32: a tiny seeded PRNG; Math.random cannot be seeded. */
function mulberry32(seed) {
  let a = seed >>> 0
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

class SimulatedDb {
  /** Total queries started. */
  queries = 0
  /** Highest number of queries in flight at once. */
  maxInFlight = 0
  /** { t, inFlight, started } per query start and end, t in performance.now() ms. */
  events = []

  #running = new Set()
  #lastAdvance = 0
  #timer = null
  #random
  #baseMs
  #perQueryMs
  #tickMs

  constructor({ baseMs = 20, perQueryMs = 4, seed = 1, tickMs = 2 } = {}) {
    this.#baseMs = baseMs
    this.#perQueryMs = perQueryMs
    this.#tickMs = tickMs
    this.#random = mulberry32(seed)
  }

  get inFlight() {
    return this.#running.size
  }

  /** Runs the (simulated) home-feed query for `key`; resolves with a fresh feed. */
  query(key) {
    const now = performance.now()
    // Settle everyone's progress at the old concurrency before the new query raises it.
    this.#advance(now)
    const version = ++this.queries
    return new Promise((resolve) => {
      const work = 0.85 + 0.3 * this.#random() // +-15 % per query
      this.#running.add({ remaining: work, resolve, value: { key, version, items: feedItems(version) } })
      this.#record(now, true)
      if (this.#timer === null) this.#timer = setInterval(this.#tick, this.#tickMs)
    })
  }

  #advance(now) {
    if (this.#running.size > 0) {
      const progress = (now - this.#lastAdvance) / (this.#baseMs + this.#perQueryMs * this.#running.size)
      for (const q of this.#running) q.remaining -= progress
    }
    this.#lastAdvance = now
  }

  // Completion is noticed at the next tick, so a query can run up to ~tickMs (plus timer lag) long.
  #tick = () => {
    const now = performance.now()
    this.#advance(now)
    for (const q of this.#running) {
      if (q.remaining > 0) continue
      this.#running.delete(q)
      this.#record(now, false)
      q.resolve(q.value)
    }
    if (this.#running.size === 0) {
      clearInterval(this.#timer)
      this.#timer = null
    }
  }

  #record(t, started) {
    const inFlight = this.#running.size
    if (inFlight > this.maxInFlight) this.maxInFlight = inFlight
    this.events.push({ t, inFlight, started })
  }
}

function feedItems(version) {
  return Array.from({ length: 5 }, (_, i) => ({ id: version * 100 + i, title: `post ${i} of build ${version}` }))
}

module.exports = { SimulatedDb, mulberry32 }
