// The API as a user of another runtime calls it (__test__/runtimes.test.js runs this under Node,
// Bun and Deno, importing the package by name). Prints one JSON line of what it saw; the parent
// asserts on it. Redis is the parent's private server (argument 1); argument 2, the seeds of its
// private Redis Cluster (comma-separated).
import net from 'node:net'
import { StampedeCache, StampedeCacheError } from 'stampede-cache'

const [url, seeds] = globalThis.Deno ? Deno.args : process.argv.slice(2)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const out = {}

/** How many connections the Redis at `at` lists under the read lane's name (raw RESP, one CLIENT LIST). */
function readLanes(at = url) {
  const { hostname, port } = new URL(at)
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: hostname, port: Number(port) })
    let text = ''
    socket.on('error', reject)
    socket.on('connect', () => socket.write('*2\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n'))
    socket.on('data', (d) => {
      text += d.toString('latin1')
      const head = text.indexOf('\r\n')
      if (head > 0 && text.length >= head + 2 + Number(text.slice(1, head)) + 2) {
        socket.destroy()
        resolve(text.split('\n').filter((line) => line.includes('name=stampede-cache:read-lane')).length)
      }
    })
  })
}
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
  // Many in flight at once, each its own answer.
  const many = await Promise.all(Array.from({ length: 200 }, () => b.get('k')))
  missing += many.filter((v) => v === undefined || v.n !== cold[0].n).length
  // With l1: false every read went to Redis, on the read lane (a socket of the runtime's own
  // under Bun and Deno).
  const lanes = await readLanes()
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
    lanes,
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

// A Redis Cluster: every read its own key's value, on a lane to each master.
if (seeds) {
  const redis = { cluster: seeds.split(',') }
  const writer = new StampedeCache({ redis, namespace: `${namespace}cl`, ttl: 60_000 })
  const reader = new StampedeCache({ redis, namespace: `${namespace}cl`, l1: false })
  const keys = Array.from({ length: 60 }, (_, i) => `c${i}`)
  for (const k of keys) await writer.set(k, { k })
  let wrong = 0
  for (let round = 0; round < 5; round++) for (const k of keys) if ((await reader.get(k))?.k !== k) wrong++
  const many = await Promise.all(keys.flatMap((k) => [reader.get(k), reader.get(k)]))
  wrong += many.filter((v, i) => v?.k !== keys[i >> 1]).length
  out.cluster = {
    wrong,
    loads: reader.stats().loads,
    redisErrors: reader.stats().redisErrors + writer.stats().redisErrors,
    lanes: await Promise.all(redis.cluster.map((seed) => readLanes(seed))),
  }
  await writer.close()
  await reader.close()
}
console.log(JSON.stringify(out))
