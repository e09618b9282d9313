// The API as a user of another runtime calls it (__test__/runtimes.test.js runs this under Node,
// Bun and Deno, importing the package by name). Prints one JSON line of what it saw; the parent
// asserts on it. Redis is the parent's private server (argument 1).
import { StampedeCache, StampedeCacheError } from 'stampede-cache'

const url = globalThis.Deno ? Deno.args[0] : process.argv[2]
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const out = {}
const namespace = `rt${Date.now()}${Math.random().toString(36).slice(2, 6)}`

for (const l1 of [undefined, false]) {
  const label = l1 === false ? 'noL1' : 'l1'
  const options = { redis: url, namespace: `${namespace}${label}`, ttl: 200, hardTtl: 60_000, jitter: 0, beta: 0 }
  if (l1 === false) options.l1 = false
  const a = new StampedeCache(options)
  const b = new StampedeCache(options)
  let loads = 0
  const load = async () => {
    loads++
    await sleep(20)
    return { n: loads }
  }
  // One load for 50 concurrent cold reads across two instances.
  const cold = await Promise.all(Array.from({ length: 50 }, (_, i) => (i % 2 ? a : b).getOrLoad('k', load)))
  // Many reads from Redis: none lost.
  let missing = 0
  for (let i = 0; i < 500; i++) if ((await b.get('k')) === undefined) missing++
  // Read your writes.
  await a.set('w', 1)
  await a.set('w', 2)
  const w = await a.get('w')
  // Stale: served at once, refreshed once in the background.
  await sleep(250)
  const stale = await b.getOrLoad('k', load)
  await b.settle()
  const refreshed = await b.getOrLoad('k', load)
  // Tags across instances.
  await a.getOrLoad('t', () => 'tagged', { tags: ['g'] })
  await b.deleteByTag('g')
  let tagGone = false
  for (let i = 0; i < 100 && !tagGone; i++) {
    tagGone = (await a.get('t')) === undefined
    if (!tagGone) await sleep(10)
  }
  // A loader never waits for itself: the nested call of its own key, in this cache and in the
  // other one sharing its namespace, answers at once (through the runtime's AsyncLocalStorage).
  const nestedStarted = Date.now()
  const nested = await a.getOrLoad('self', async () => {
    const same = await a.getOrLoad('self', async () => 'same')
    const other = await b.getOrLoad('self', async () => 'other')
    const many = await b.getOrLoadMany(['self'], async (keys) => keys.map(() => 'many'))
    return `${same},${other},${many[0]}`
  })
  const nestedMs = Date.now() - nestedStarted
  let keyCode = null
  try {
    await a.getOrLoad('', load)
  } catch (err) {
    keyCode = err instanceof StampedeCacheError ? err.code : `not ours: ${err}`
  }
  out[label] = {
    coldValues: [...new Set(cold.map((v) => v.n))],
    missing,
    w,
    stale: stale.n,
    refreshed: refreshed.n,
    loads,
    tagGone,
    nested,
    nestedFast: nestedMs < 5_000,
    nestedKept: await b.get('self'),
    keyCode,
    redisErrors: a.stats().redisErrors + b.stats().redisErrors,
  }
  await a.close()
  await b.close()
  let closedCode = null
  try {
    await a.get('k')
  } catch (err) {
    closedCode = err.code
  }
  out[label].closedCode = closedCode
}
console.log(JSON.stringify(out))
