'use strict'
// Polls an assertion until it holds: the way to wait for something that happens "within a bound"
// (a bus message, a release, a refresh) without a fixed sleep that is too short on a loaded 2-core
// machine and too long everywhere else. A wait for a condition that must NOT happen is a different
// thing (a bounded sleep followed by a check): this helper is only for positive outcomes.

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Calls `fn` (sync or async) until it returns without throwing, and returns what it returned.
 * After `timeout` ms, rethrows its last error with how long it was tried and `what` was awaited.
 * A returned `false` counts as not yet (so a predicate works as well as a block of asserts).
 * An error with `bail: true` is thrown at once: for an outcome that cannot change by waiting (a
 * loader that ran where it must not, say).
 */
async function eventually(fn, { timeout = 10_000, interval = 20, what = '' } = {}) {
  const started = Date.now()
  const deadline = started + timeout
  let lastError
  for (;;) {
    try {
      const v = await fn()
      if (v !== false) return v
      lastError = new Error('the condition returned false')
    } catch (err) {
      if (err && err.bail) throw err
      lastError = err
    }
    if (Date.now() >= deadline) {
      const message = `still failing after ${Date.now() - started} ms${what ? ` (waiting for ${what})` : ''}: ${lastError && lastError.message}`
      if (lastError instanceof Error) {
        lastError.message = message
        throw lastError
      }
      throw new Error(message)
    }
    await sleep(interval)
  }
}

/** An Error that `eventually` does not retry. */
function bail(message) {
  const err = new Error(message)
  err.bail = true
  return err
}

let barriers = 0

/**
 * Resolves once every invalidation announced before the call has reached every worker in
 * `workers` (CacheWorker processes of one namespace and serializer): the bus's own ordering is the
 * proof, not a sleep. Every announcement is a PUBLISH inside the script that makes the write, so
 * one published after an earlier write resolved reaches each subscriber after it. `writer`
 * (default workers[0]) sets a fresh key, each worker takes it into its in-process tier, the writer
 * sets it again, and each worker is polled until get() serves the new value, which it can only do
 * once its copy was dropped by that later announcement, so after every earlier one too. On a
 * single Redis only: a Cluster does not order PUBLISH made on different nodes.
 */
async function busFlushed(workers, { writer = workers[0], timeout = 15_000 } = {}) {
  const key = `__bus_barrier:${process.pid}:${++barriers}`
  const ok = (r, what) => {
    if (!r.ok) throw new Error(`bus barrier: ${what}: ${r.code} ${r.message}`)
    return r
  }
  ok(await writer.request('set', { key, value: 'before' }), `${writer.name} set`)
  for (const w of workers) {
    const r = await w.request('read', { key, loader: { value: 'bus-barrier-must-not-load' } })
    ok(r.results[0], `${w.name} read`)
    if (r.results[0].value !== 'before') throw new Error(`bus barrier: ${w.name} read ${JSON.stringify(r.results[0].value)}, not the barrier's value`)
  }
  ok(await writer.request('set', { key, value: 'after' }), `${writer.name} set`)
  for (const w of workers) {
    await eventually(
      async () => {
        const g = ok(await w.request('get', { key }), `${w.name} get`)
        if (g.value !== 'after') throw new Error(`${w.name} still serves ${JSON.stringify(g.value)}`)
      },
      { timeout, interval: 10, what: `${w.name} to hear the bus barrier` },
    )
  }
}

module.exports = { eventually, bail, busFlushed }
