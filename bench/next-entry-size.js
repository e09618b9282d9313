'use strict'
// What one large entry costs the stampede-cache/next handlers: the process's RSS growth, the
// longest event-loop stall while it is set, and the bytes it takes in Redis; for entries of 1, 16
// and 64 MiB, with the handlers' maxEntryBytes default and with no cap (maxEntryBytes: Infinity).
//
//   node --expose-gc bench/next-entry-size.js            # with its own redis-server
//
// Each case runs in a fresh process (a child of this one), so one case's heap never inflates the
// next one's RSS. Figures are medians of 3 runs: trust their ratios, not their absolute values.
const { fork } = require('node:child_process')
const { monitorEventLoopDelay } = require('node:perf_hooks')

const MiB = 1024 * 1024
const SIZES = [1, 16, 64]
const RUNS = 3

async function oneCase({ mib, cap, redisUrl, handler }) {
  const { createUseCacheHandler, createIncrementalCacheHandler } = require('../next.js')
  // BEFORE=1: the handlers as they were before maxEntryBytes (no such option, no cap).
  const uncapped = cap === 'none' && process.env.BEFORE !== '1' ? { maxEntryBytes: Infinity } : {}
  const options = { redis: redisUrl, namespace: `bench-${process.pid}`, ...uncapped, onError: () => {} }
  const bytes = Buffer.alloc(mib * MiB, 7)
  global.gc?.()
  const rssBefore = process.memoryUsage().rss
  const loop = monitorEventLoopDelay({ resolution: 5 })
  let cache
  loop.enable()
  if (handler === 'use-cache') {
    const h = createUseCacheHandler(options)
    cache = h.cache
    const stream = new ReadableStream({
      start(c) {
        for (let i = 0; i < bytes.length; i += 64 * 1024) c.enqueue(new Uint8Array(bytes.buffer, bytes.byteOffset + i, Math.min(64 * 1024, bytes.length - i)))
        c.close()
      },
    })
    await h.get('big', [])
    await h.set('big', Promise.resolve({ value: stream, tags: [], stale: 300, timestamp: Date.now(), expire: 3600, revalidate: 900 }))
  } else {
    const C = createIncrementalCacheHandler(options)
    cache = C.cache
    await new C({}).get('/big', { kind: 'APP_ROUTE' })
    await new C({}).set('/big', { kind: 'APP_ROUTE', body: bytes, status: 200, headers: {} }, { cacheControl: { revalidate: 60, expire: 3600 } })
  }
  await cache.settle()
  loop.disable()
  const rssAfter = process.memoryUsage().rss
  const stored = await cache.get(handler === 'use-cache' ? ['next:use-cache', 'big'] : ['next:incremental', '/big'])
  await cache.close()
  return { rssMiB: (rssAfter - rssBefore) / MiB, stallMs: loop.max / 1e6, stored: stored !== undefined }
}

if (process.env.NEXT_ENTRY_CASE) {
  oneCase(JSON.parse(process.env.NEXT_ENTRY_CASE)).then(
    (r) => process.send(r, () => process.exit(0)),
    (err) => {
      console.error(err)
      process.exit(1)
    },
  )
} else {
  main()
}

function runChild(spec) {
  return new Promise((resolve, reject) => {
    const child = fork(__filename, [], { env: { ...process.env, NEXT_ENTRY_CASE: JSON.stringify(spec) }, execArgv: ['--expose-gc'] })
    child.once('message', resolve)
    child.once('exit', (code) => code !== 0 && reject(new Error(`case ${JSON.stringify(spec)} exited ${code}`)))
  })
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

async function main() {
  const { RedisServer } = require('../__test__/helpers/redis-server.js')
  const redis = await new RedisServer().start()
  try {
    const rows = []
    for (const handler of ['use-cache', 'incremental']) {
      for (const mib of SIZES) {
        for (const cap of process.env.BEFORE === '1' ? ['none'] : ['none', 'default']) {
          const usedMemory = async () => Number(/used_memory:(\d+)/.exec(String(await redis.cmd('INFO', 'memory')))[1])
          const baseline = await usedMemory()
          const runs = []
          // Each run writes under its own namespace: Redis holds RUNS entries at the end.
          for (let i = 0; i < RUNS; i++) runs.push(await runChild({ mib, cap, redisUrl: redis.url, handler }))
          const perEntry = (await usedMemory()) - baseline
          rows.push({
            handler,
            entry: `${mib} MiB`,
            cap: cap === 'none' ? 'no cap' : 'default cap',
            'RSS growth (MiB)': median(runs.map((r) => r.rssMiB)).toFixed(0),
            'longest stall (ms)': median(runs.map((r) => r.stallMs)).toFixed(0),
            stored: runs[0].stored ? 'yes' : 'no',
            'Redis memory per entry (MiB)': (perEntry / RUNS / MiB).toFixed(1),
          })
          await redis.cmd('FLUSHALL')
        }
      }
    }
    console.table(rows)
  } finally {
    await redis.dispose()
  }
}
