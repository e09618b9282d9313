'use strict'

// The promises of the flights in progress, by flight id. Each sits in a holder that `delete`
// empties: a V8 Map kept deleted values reachable until it next rehashed, so a promise resolved
// after its flight was deleted kept its value alive through scavenges and into the old
// generation (measured: MBs promoted per scavenge with 64 Redis reads of 10 KB in flight; none
// with holders).
class Flights {
  #m = new Map()
  get size() {
    return this.#m.size
  }
  get(id) {
    return this.#m.get(id)?.load
  }
  set(id, load) {
    this.#m.set(id, { load })
  }
  delete(id) {
    const held = this.#m.get(id)
    if (held === undefined) return
    held.load = undefined
    this.#m.delete(id)
  }
}

module.exports = { Flights }
