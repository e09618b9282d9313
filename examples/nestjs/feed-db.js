'use strict'
// Stands in for a slow database: counts queries, and can be held shut so a test can see what is
// answered while a query is still running.
class FeedDb {
  queries = 0
  finished = 0
  /** Resolves when the running query gate opens; null while open. */
  #gate = null
  #arrived = []

  async loadFeed(userId) {
    this.queries++
    for (const wake of this.#arrived.splice(0)) wake()
    if (this.#gate) await this.#gate
    await new Promise((resolve) => setTimeout(resolve, 20))
    this.finished++
    return { userId, items: [`post-${userId}-1`, `post-${userId}-2`], version: this.queries }
  }

  /** Holds every query until the returned function is called. */
  hold() {
    let open
    this.#gate = new Promise((resolve) => (open = resolve))
    return () => {
      this.#gate = null
      open()
    }
  }

  /** Resolves once `n` queries have started. */
  async started(n) {
    while (this.queries < n) await new Promise((resolve) => this.#arrived.push(resolve))
  }
}

module.exports = { FeedDb }
