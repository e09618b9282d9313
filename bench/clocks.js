'use strict'
// What each clock a fresh hit could read costs here, in one run: Date.now() (what lib/fresh.js
// reads), performance.now() alone and anchored to the epoch (timeOrigin + performance.now(), the
// anchored monotonic clock), process.hrtime() and hrtime.bigint(), and lru-cache 11's cached
// clock (performance.now() kept until a ttlResolution timer of 1 ms clears it). Each clock is read
// N times in a loop that consumes every reading; interleaved rounds; median ns per read.
//
//   node bench/clocks.js [--reads 5000000] [--rounds 5]
//
// The cached clock is cheap because it is not read: during synchronous work (and during a loop
// of awaits on resolved promises, which never yields to timers) it returns the time it was
// cached, so it cannot keep expiry exact (see __test__/fresh-index.test.js).

function arg(name, fallback) {
  const i = process.argv.indexOf(name)
  return i >= 0 ? Number(process.argv[i + 1]) : fallback
}

const origin = performance.timeOrigin
// Anchored as an exact upper bound of the wall clock would be: Date.now() bracketed by two
// monotonic readings, plus 1 ms for Date.now()'s truncation.
const before = performance.now()
const wall = Date.now()
const anchor = wall + 1 - before

// lru-cache 11's getNow()/cachedNow, as in its dist/commonjs/index.js.
let cachedNow = 0
const lruNow = () => {
  if (cachedNow) return cachedNow
  const n = performance.now()
  cachedNow = n
  const t = setTimeout(() => (cachedNow = 0), 1)
  if (t.unref) t.unref()
  return n
}

const CLOCKS = {
  'Date.now()': () => Date.now(),
  'performance.now()': () => performance.now(),
  'performance.timeOrigin + performance.now()': () => origin + performance.now(),
  'anchor + performance.now() (upper bound)': () => anchor + performance.now(),
  'process.hrtime.bigint()': () => process.hrtime.bigint(),
  'process.hrtime()': () => process.hrtime(),
  "lru-cache's cached clock": lruNow,
}

function nsPerRead(read, n) {
  let sink = 0
  const t0 = process.hrtime.bigint()
  for (let i = 0; i < n; i++) if (read() === -1) sink++
  const ns = Number(process.hrtime.bigint() - t0) / n
  if (sink !== 0) throw new Error('a clock read -1')
  return ns
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function main() {
  const reads = arg('--reads', 5_000_000)
  const rounds = arg('--rounds', 5)
  const names = Object.keys(CLOCKS)
  const ns = Object.fromEntries(names.map((name) => [name, []]))
  // Warm every clock so each loop is optimized before anything is timed.
  for (const name of names) nsPerRead(CLOCKS[name], reads >> 2)
  for (let round = 0; round < rounds; round++) {
    for (let i = 0; i < names.length; i++) {
      const name = names[(round + i) % names.length]
      ns[name].push(nsPerRead(CLOCKS[name], reads))
      // Lets lru-cache's timer clear its cached reading between cells, as a server's event loop would.
      await sleep(5)
    }
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
  const dateNow = median(ns['Date.now()'])
  console.log(`${reads} reads a clock x ${rounds} rounds (median), Node ${process.version}`)
  console.table(
    names.map((name) => ({
      clock: name,
      'ns/read': +median(ns[name]).toFixed(1),
      min: +Math.min(...ns[name]).toFixed(1),
      max: +Math.max(...ns[name]).toFixed(1),
      'x Date.now()': +(median(ns[name]) / dateNow).toFixed(2),
    })),
  )
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
