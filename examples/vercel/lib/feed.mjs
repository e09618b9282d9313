// The cache and the data source of examples/vercel/api/feed.mjs, at module scope: a warm function
// instance keeps them between invocations (each cold start begins with an empty in-process tier;
// give `redis` to share entries across instances).
import { waitUntil } from '@vercel/functions'
import { StampedeCache } from 'stampede-cache'

// @vercel/functions' waitUntil finds the current invocation's context each time it is called, and
// the cache calls it synchronously inside the request that found the entry stale, so it can be given
// once, to the constructor. (Per call, `{ waitUntil }`, works too.)
export const cache = new StampedeCache({
  redis: process.env.REDIS_URL,
  ttl: Number(process.env.FEED_TTL_MS ?? 30_000),
  hardTtl: 600_000,
  waitUntil,
})

/** Stands in for a slow query. Counts calls; `hold()` keeps them waiting (for the test). */
export const source = {
  started: 0,
  finished: 0,
  gate: null,
  async load(user) {
    const version = ++source.started
    if (source.gate) await source.gate.promise
    await new Promise((resolve) => setTimeout(resolve, 20))
    source.finished++
    return { user, items: [`post-${user}-1`, `post-${user}-2`], version }
  },
  hold() {
    let open
    const promise = new Promise((resolve) => (open = resolve))
    source.gate = { promise, open }
  },
  release() {
    source.gate?.open()
    source.gate = null
  },
}
