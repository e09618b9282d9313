'use strict'
// The Redis tier (docs/CONTRACT.md, "Redis" and getOrLoad 2-5): cross-process coalescing, the
// refresh lock, shared error backoff, the invalidation bus, and degrading/recovering when Redis
// is killed, restarted or paused.
//
// Every test starts its own redis-server on a free 127.0.0.1 port (__test__/helpers/redis-server.js)
// and real worker processes (__test__/fixtures/redis-worker.js) that each build their own
// StampedeCache and count their own loader calls; the assertions are on totals across processes
// and on orderings (loader start/end times against reads and lock observations), not on durations,
// except a few "did not hang" bounds with large margins.
//
// Tests 1-12 are the Redis behaviours of the contract; 13-15 are races found while writing them
// (a read overtaken by an invalidation, XFetch with Redis, loads outliving lockTtl); 16 checks
// that a cold load's value is in Redis when getOrLoad resolves.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')
const { setupRedis, barrier, freePort, waitFor, sleep, killAllSync } = require('./helpers/redis-server')

const ROOT = path.join(__dirname, '..')
/** A hang fails its test instead of blocking the run. */
const TEST_TIMEOUT = 60_000

after(() => killAllSync())

/** Its own redis-server plus `workers` worker processes (see setupRedis). */
const setup = (t, { workers = 0, options = {} } = {}) => setupRedis(t, { workers, options, prefix: 'sctest' })

/** Every read of a `read` result resolved (none rejected). */
function assertAllOk(result, label) {
  for (const r of result.results) assert.ok(r.ok, `${label}: a read rejected: ${r.code} ${r.message}`)
}

function valuesOf(results) {
  return results.flatMap((r) => r.results.map((x) => (x.undef ? 'undefined' : JSON.stringify(x.value))))
}

/** After settle(): nothing in flight, no lock waiter, no unsent write, `entries` if given. */
async function assertIdle(w, label, entries) {
  const snap = await w.request('settle')
  // inboxKeys is not a leak: announcements heard while idle wait for the next call.
  const { entries: held, inboxKeys, ...rest } = snap.debug
  for (const field of ['engineFlights', 'facadeFlights', 'background', 'lockWaiters', 'unsentWrites']) {
    assert.ok(field in rest, `${label}: _debugCounts() has ${field}`)
  }
  for (const [field, n] of Object.entries(rest)) assert.equal(n, 0, `${label}: ${field} must be 0 when idle: ${JSON.stringify(snap.debug)}`)
  if (entries !== undefined) assert.equal(held, entries, `${label}: entries`)
  return snap
}

function note(t, text) {
  t.diagnostic(text)
}

// ---------------------------------------------------------------------------------------------

test('1. 4 processes x 200 concurrent cold reads: one loader call in total, one value everywhere, stored as an envelope', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const ttl = 60_000
  const hardTtl = 120_000
  const { redis, ws, vkey, lkey } = await setup(t, { workers: 4, options: { ttl, hardTtl } })
  const key = 'cold:one'

  const results = await barrier(ws, 'read', { key, n: 200, loader: { ms: 500 } })
  results.forEach((r, i) => assertAllOk(r, `w${i}`))
  const calls = results.reduce((s, r) => s + r.loaderCallsDuring, 0)
  assert.equal(calls, 1, 'exactly one loader call across 4 processes x 200 reads')
  const values = new Set(valuesOf(results))
  assert.equal(values.size, 1, `every read in every process got the same value: ${[...values].join(' | ')}`)
  const value = JSON.parse([...values][0])

  const [raw, pttl, lock] = await redis.pipeline([
    ['GET', vkey(key)],
    ['PTTL', vkey(key)],
    ['EXISTS', lkey(key)],
  ])
  assert.equal(typeof raw, 'string', 'the value key exists in Redis')
  const env = JSON.parse(raw)
  assert.equal(env.sc, 1)
  for (const f of ['freshUntil', 'hardUntil', 'computeMs', 'retryAfter']) assert.equal(typeof env[f], 'number', `envelope field ${f}`)
  assert.deepEqual(env.value, value, 'the envelope holds the value every process returned')
  assert.equal(env.negative, undefined, 'not negative')
  assert.ok(
    Math.abs(env.hardUntil - env.freshUntil - (hardTtl - ttl)) < 5,
    `hardUntil - freshUntil = hardTtl - ttl (jitter 0): ${env.hardUntil - env.freshUntil}`,
  )
  assert.ok(env.computeMs >= 400, `computeMs records the 500 ms load: ${env.computeMs}`)
  assert.ok(pttl > hardTtl - 10_000 && pttl <= hardTtl, `PTTL ~ hardTtl: ${pttl}`)
  assert.equal(lock, 0, 'the lock was released')

  const snaps = []
  for (const [i, w] of ws.entries()) snaps.push(await assertIdle(w, `w${i}`, 1))
  const lockWins = snaps.reduce((s, x) => s + x.stats.lockWins, 0)
  const lockWaits = snaps.reduce((s, x) => s + x.stats.lockWaits, 0)
  note(t, `lockWins=${lockWins} lockWaits=${lockWaits} PTTL=${pttl}`)
})

test('2. a stale key read by 4 processes: one refresh in total, every read served stale at once, then the new value everywhere', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { ws } = await setup(t, { workers: 4, options: { ttl: 60_000, hardTtl: 120_000 } })
  const key = 'stale:one'
  const s = await ws[0].request('set', { key, value: 'old', opts: { ttl: 300, hardTtl: 60_000 } })
  assert.ok(s.ok, s.message)
  // w0 (writer), w1 and w2 hold it in-process; w3 meets it in Redis only.
  for (const w of [ws[1], ws[2]]) assert.equal((await w.request('get', { key })).value, 'old')
  await sleep(700) // past its ttl (300 ms), far from its hardTtl

  const results = await barrier(ws, 'read', { key, n: 50, loader: { ms: 1_500 } })
  results.forEach((r, i) => assertAllOk(r, `w${i}`))
  for (const [i, r] of results.entries()) {
    for (const x of r.results) assert.equal(x.value, 'old', `w${i}: a stale read returns the stale value`)
  }
  await Promise.all(ws.map((w) => w.request('settle')))

  const logs = await Promise.all(ws.map((w) => w.request('loads', { key })))
  const all = logs.flatMap((l, i) => l.map((rec) => ({ ...rec, worker: i })))
  assert.equal(all.length, 1, `exactly one refresh loader call across processes: ${JSON.stringify(all)}`)
  const refresh = all[0]
  assert.equal(refresh.outcome, 'ok')
  const lastRead = Math.max(...results.flatMap((r) => r.results.map((x) => x.at)))
  assert.ok(lastRead < refresh.end, `every read resolved before the 1,500 ms refresh ended (last read ${lastRead - refresh.end} ms relative to its end)`)
  note(t, `refresh ran in w${refresh.worker}; last stale read resolved ${refresh.end - lastRead} ms before the refresh ended`)

  await sleep(200)
  const expected = { by: ws[refresh.worker].pid, seq: refresh.seq }
  for (const [i, w] of ws.entries()) {
    const r = await w.request('read', { key, loader: { value: 'must-not-load' } })
    assertAllOk(r, `w${i} after`)
    assert.deepEqual(r.results[0].value, expected, `w${i} sees the refreshed value`)
    assert.equal(r.loaderCallsDuring, 0, `w${i} did not load`)
  }
  for (const [i, w] of ws.entries()) await assertIdle(w, `w${i}`)
})

test('3. lock holder SIGKILLed mid-load: the waiter loads only after the lock expired, and resolves with its own value', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, lkey, vkey } = await setup(t)
  const A = await spawnWorker('A', { lockTtl: 1_500 })
  const B = await spawnWorker('B', { lockTtl: 1_500 })
  const key = 'holder:killed'
  const lk = lkey(key)

  A.start('read', { key, loader: { hang: true } }) // never resolves; A gets killed
  const tokenA = await waitFor(() => redis.cmd('GET', lk), { timeout: 5_000, interval: 5, what: 'A to take the lock' })
  await waitFor(async () => (await A.request('loads', { key })).length === 1, { what: "A's loader to run" })

  // Watch the lock: the last time it still held A's token, and a lower bound of its expiry
  // (PTTL is measured after `sentAt`, so expiry >= sentAt + pttl).
  let lastSeenA = 0
  let expiresNoEarlierThan = 0
  let watching = true
  const watcher = (async () => {
    while (watching) {
      const sentAt = Date.now()
      const [val, pttl] = await redis.pipeline([
        ['GET', lk],
        ['PTTL', lk],
      ])
      if (val === tokenA) {
        lastSeenA = sentAt
        if (pttl > 0) expiresNoEarlierThan = Math.max(expiresNoEarlierThan, sentAt + pttl)
      }
      await sleep(10)
    }
  })()

  const bRun = B.start('read', { key, loader: { ms: 50 } })
  await sleep(200)
  assert.equal((await B.request('loads', { key })).length, 0, 'B waits instead of loading while A holds the lock')
  await A.kill('SIGKILL')
  const b = await bRun.result
  watching = false
  await watcher

  assertAllOk(b, 'B')
  const bLoads = await B.request('loads', { key })
  assert.equal(bLoads.length, 1, 'B loaded once')
  assert.deepEqual(b.results[0].value, { by: B.pid, seq: bLoads[0].seq }, 'B resolves with its own value')
  assert.ok(lastSeenA > 0 && expiresNoEarlierThan > 0, 'the lock was observed')
  assert.ok(bLoads[0].start >= lastSeenA, `B's loader started ${lastSeenA - bLoads[0].start} ms before A's lock was last seen`)
  assert.ok(bLoads[0].start >= expiresNoEarlierThan, `B's loader started ${expiresNoEarlierThan - bLoads[0].start} ms before A's lock expired`)
  const snap = await assertIdle(B, 'B', 1)
  assert.ok(snap.stats.lockWaits >= 1, 'B counted a lock wait')
  assert.equal(await redis.cmd('EXISTS', lk), 0, 'B released its lock')
  assert.deepEqual(JSON.parse(await redis.cmd('GET', vkey(key))).value, b.results[0].value, "B's value is in Redis")
  note(t, `B's loader started ${bLoads[0].start - expiresNoEarlierThan} ms after A's lock expiry bound`)
})

test('4. Redis killed then restarted on the same port: reads never reject, coalesce in-process, errors counted and rate-limited, recovery by itself', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  const W1 = await spawnWorker('W1')
  const W2 = await spawnWorker('W2')

  const warm = await W1.request('read', { key: 'warm', loader: { value: 'warm-1' } })
  assertAllOk(warm, 'warm')
  assert.equal(await redis.cmd('EXISTS', vkey('warm')), 1)

  await redis.stop('SIGKILL')

  const hot = await W1.request('read', { key: 'warm', n: 10, loader: { value: 'must-not-load' } })
  assertAllOk(hot, 'hot while down')
  assert.deepEqual(new Set(valuesOf([hot])), new Set(['"warm-1"']), 'the in-process tier serves while Redis is down')
  assert.equal(hot.loaderCallsDuring, 0)

  const churn = await W1.request('churn', { prefix: 'down:', durationMs: 2_000, gapMs: 2 })
  assert.equal(churn.rejected, 0, 'no cold read rejected while Redis is down')
  assert.equal(churn.wrong, 0, 'every cold read got its own loader value')
  assert.ok(
    churn.slow.every((ms) => ms < 3_000),
    `no cold read hung: ${churn.slow.join(', ')} ms`,
  )
  assert.ok(churn.ops >= 50, `enough operations ran: ${churn.ops}`)

  const burst = await W1.request('read', { key: 'down-burst', n: 100, loader: { ms: 300, value: 'local' } })
  assertAllOk(burst, 'burst while down')
  assert.equal(burst.loaderCallsDuring, 1, '100 concurrent cold reads while Redis is down: one loader call')
  assert.deepEqual(new Set(valuesOf([burst])), new Set(['"local"']))

  const down = await W1.request('snapshot')
  assert.ok(down.stats.redisErrors > 0, 'redisErrors counted')
  assert.ok(down.onError.count > 0, 'onError called')
  assert.ok(down.onError.count * 10 <= churn.ops, `onError rate-limited: ${down.onError.count} calls for ${churn.ops} operations without Redis`)
  for (const e of down.onError.samples) {
    assert.ok(e.isError, 'onError gets an Error')
    assert.equal(e.code, 'ERR_REDIS', `onError code: ${JSON.stringify(e)}`)
    assert.match(e.op, /^redis:/, `onError op: ${JSON.stringify(e)}`)
  }
  note(
    t,
    `while down: ${churn.ops} cold reads, redisErrors=${down.stats.redisErrors}, onError calls=${down.onError.count} (${[...new Set(down.onError.samples.map((e) => e.op))].join(',')})`,
  )

  await redis.start() // same port, empty

  const recoveredAt = Date.now()
  let i = 0
  const written = await waitFor(
    async () => {
      const k = `after:${++i}`
      const r = await W1.request('read', { key: k, loader: { value: { after: i } } })
      assertAllOk(r, `W1 ${k}`)
      return (await redis.cmd('EXISTS', vkey(k))) === 1 ? { k, value: { after: i } } : null
    },
    { timeout: 15_000, interval: 100, what: 'W1 to write to Redis again' },
  )
  note(t, `W1 wrote to Redis again ${Date.now() - recoveredAt} ms after the restart (${i} reads)`)

  let j = 0
  await waitFor(
    async () => {
      const k = `w2probe:${++j}`
      const r = await W2.request('read', { key: k, loader: { value: j } })
      assertAllOk(r, `W2 ${k}`)
      return (await redis.cmd('EXISTS', vkey(k))) === 1
    },
    { timeout: 15_000, interval: 100, what: 'W2 to use Redis again' },
  )
  const seen = await W2.request('read', { key: written.k, loader: { value: 'W2-own' } })
  assertAllOk(seen, 'W2 reads W1 key')
  assert.deepEqual(seen.results[0].value, written.value, 'a second process sees the key W1 wrote after recovery')
  assert.equal(seen.loaderCallsDuring, 0)

  // The bus is back too: W2 holds written.k in-process; W1 replaces it; W2 sees the new value.
  const watch = W2.start('watch', { key: written.k, expect: '"replaced"', interval: 10, timeout: 5_000, loader: { value: 'must-not-load' } })
  await watch.ready
  const s = await W1.request('set', { key: written.k, value: 'replaced' })
  assert.ok(s.ok)
  const w = await watch.result
  assert.ok(w.seen, `after recovery, W2 never saw W1's set (last ${w.last})`)
  note(t, `after recovery, bus latency ${w.seenAt - s.startedAt} ms`)
  await assertIdle(W1, 'W1')
  await assertIdle(W2, 'W2')
})

test('5. Redis paused (SIGSTOP): cached reads served, cold reads load locally without hanging, recovery after SIGCONT', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  t.after(() => redis.resume())
  const W = await spawnWorker('W')
  assertAllOk(await W.request('read', { key: 'cached', loader: { value: 'c1' } }), 'warm')

  redis.pause()
  let t0 = Date.now()
  const hot = await W.request('read', { key: 'cached', n: 5, loader: { value: 'must-not-load' } }, { timeout: 10_000 })
  assertAllOk(hot, 'hot while paused')
  assert.deepEqual(new Set(valuesOf([hot])), new Set(['"c1"']))
  assert.equal(hot.loaderCallsDuring, 0)

  t0 = Date.now()
  const cold = await W.request('read', { key: 'cold-paused', n: 50, loader: { value: 'p1' } }, { timeout: 10_000 })
  const coldMs = Date.now() - t0
  assertAllOk(cold, 'cold while paused')
  assert.ok(coldMs < 5_000, `a cold read while Redis is paused resolved in ${coldMs} ms (must not hang)`)
  assert.equal(cold.loaderCallsDuring, 1, 'in-process coalescing while Redis is paused')
  assert.deepEqual(new Set(valuesOf([cold])), new Set(['"p1"']))

  const hot2 = await W.request('read', { key: 'cached', loader: { value: 'must-not-load' } }, { timeout: 10_000 })
  assert.equal(hot2.results[0].value, 'c1', 'still served after Redis was marked down')

  // A process whose first connection meets the paused server: waits about the connect timeout, then loads.
  const W2 = await spawnWorker('W2')
  t0 = Date.now()
  const first = await W2.request('read', { key: 'first-connect', n: 20, loader: { value: 'f1' } }, { timeout: 10_000 })
  const firstMs = Date.now() - t0
  assertAllOk(first, 'first connection while paused')
  assert.ok(firstMs < 5_000, `a cold read during the first connection to a paused Redis resolved in ${firstMs} ms`)
  assert.equal(first.loaderCallsDuring, 1)

  const snap = await W.request('snapshot')
  assert.ok(snap.stats.redisErrors > 0, 'redisErrors counted while paused')
  note(t, `cold read while paused: ${coldMs} ms; first-connection cold read: ${firstMs} ms; redisErrors=${snap.stats.redisErrors}`)

  redis.resume()
  const resumedAt = Date.now()
  let i = 0
  await waitFor(
    async () => {
      const k = `after:${++i}`
      assertAllOk(await W.request('read', { key: k, loader: { value: i } }), `W ${k}`)
      return (await redis.cmd('EXISTS', vkey(k))) === 1
    },
    { timeout: 15_000, interval: 100, what: 'W to write to Redis again after SIGCONT' },
  )
  note(t, `W wrote to Redis again ${Date.now() - resumedAt} ms after SIGCONT`)
  await assertIdle(W, 'W')
  await assertIdle(W2, 'W2')
})

test('6. garbage and wrong-type value keys are misses: loaded, replaced by an envelope, no error', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  const W = await spawnWorker('W')
  const now = Date.now()
  const cases = [
    ['g:hello', (k) => ['SET', k, 'hello']],
    ['g:other-json', (k) => ['SET', k, '{"value":1}']],
    ['g:bad-f', (k) => ['SET', k, '{"sc":1,"freshUntil":"x"}']],
    ['g:empty', (k) => ['SET', k, '']],
    ['g:json-null', (k) => ['SET', k, 'null']],
    ['g:not-utf8', (k) => ['SET', k, Buffer.from([0xff, 0xfe, 0x00, 0x80, 0x7b])]],
    ['g:sc2', (k) => ['SET', k, JSON.stringify({ sc: 2, freshUntil: now + 1e6, hardUntil: now + 2e6, computeMs: 0, retryAfter: 0, value: 'other-version' })]],
    ['g:h-before-f', (k) => ['SET', k, JSON.stringify({ sc: 1, freshUntil: now + 2e6, hardUntil: now + 1e6, computeMs: 0, retryAfter: 0, value: 'insane' })]],
    ['g:no-v', (k) => ['SET', k, JSON.stringify({ sc: 1, freshUntil: now + 1e6, hardUntil: now + 2e6, computeMs: 0, retryAfter: 0 })]],
    // Good metadata, a value that is not JSON (the binding does not scan values; the reader's parse fails).
    [
      'g:bad-value',
      (k) => ['SET', k, `{"sc":1,"gen":"x1","born":0,"freshUntil":${now + 1e6},"hardUntil":${now + 2e6},"computeMs":0,"retryAfter":0,"value":{oops}`],
    ],
    ['g:expired', (k) => ['SET', k, JSON.stringify({ sc: 1, freshUntil: 5, hardUntil: 10, computeMs: 0, retryAfter: 0, value: 'ancient' })]],
    ['g:list', (k) => ['LPUSH', k, 'a', 'b']],
    ['g:hash', (k) => ['HSET', k, 'f', 'v']],
    ['g:set', (k) => ['SADD', k, 'm']],
    ['g:zset', (k) => ['ZADD', k, '1', 'm']],
  ]
  for (const [key, make] of cases) await redis.cmd(...make(vkey(key)))

  for (const [key] of cases) {
    const g = await W.request('get', { key })
    assert.ok(g.ok, `${key}: get must not reject: ${g.message}`)
    assert.ok(g.undef, `${key}: get sees a miss, got ${JSON.stringify(g.value)}`)
    const r = await W.request('read', { key, loader: { value: { loaded: key } } })
    assertAllOk(r, key)
    assert.deepEqual(r.results[0].value, { loaded: key }, `${key}: the loader's value is returned`)
    assert.equal(r.loaderCallsDuring, 1, `${key}: treated as a miss`)
    assert.equal(await redis.cmd('TYPE', vkey(key)), 'string', `${key}: replaced by a string`)
    const env = JSON.parse(await redis.cmd('GET', vkey(key)))
    assert.equal(env.sc, 1, `${key}: now an envelope`)
    assert.deepEqual(env.value, { loaded: key })
  }
  const snap = await assertIdle(W, 'W', cases.length)
  assert.equal(snap.stats.redisErrors, 0, 'no redisErrors for garbage or WRONGTYPE')
  assert.equal(snap.onError.count, 0, `no onError: ${JSON.stringify(snap.onError.samples)}`)
  assert.equal(W.exitInfo, null, 'the worker did not crash')
})

test("7. a load that outlives its lock never deletes another holder's lock (cold, failed cold, refresh, failed refresh)", {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker, lkey, vkey } = await setup(t)
  const W = await spawnWorker('W', { lockTtl: 300, ttl: 60_000, errorBackoff: 5_000 })
  const cases = [
    { key: 'L:cold-ok', stale: false, loader: { ms: 2_000, value: 'slow' } },
    { key: 'L:cold-throw', stale: false, loader: { ms: 2_000, throw: true } },
    { key: 'L:refresh-ok', stale: true, loader: { ms: 2_000, value: 'slow' } },
    { key: 'L:refresh-throw', stale: true, loader: { ms: 2_000, throw: true } },
  ]
  for (const c of cases.filter((c) => c.stale)) {
    assert.ok((await W.request('set', { key: c.key, value: 'old', opts: { ttl: 200, hardTtl: 60_000 } })).ok)
  }
  await sleep(400)

  await Promise.all(
    cases.map(async (c) => {
      const lk = lkey(c.key)
      c.run = W.start('read', { key: c.key, loader: c.loader })
      c.token = await waitFor(() => redis.cmd('GET', lk), { timeout: 5_000, interval: 5, what: `${c.key}: the lock` })
      await waitFor(async () => (await redis.cmd('EXISTS', lk)) === 0, { timeout: 5_000, interval: 10, what: `${c.key}: the lock to expire mid-load` })
      const loads = await W.request('loads', { key: c.key })
      assert.equal(loads.length, 1)
      assert.equal(loads[0].outcome, 'running', `${c.key}: the loader is still running when the lock expired`)
      await redis.cmd('SET', lk, `other:${c.key}`, 'PX', '60000')
    }),
  )
  for (const c of cases) c.result = await c.run.result
  await W.request('settle')

  for (const c of cases) {
    const loads = await W.request('loads', { key: c.key })
    assert.equal(loads.length, 1, `${c.key}: one load`)
    assert.notEqual(loads[0].outcome, 'running', `${c.key}: the load ended`)
    assert.equal(await redis.cmd('GET', lkey(c.key)), `other:${c.key}`, `${c.key}: the other holder's lock is untouched`)
  }
  // Sanity: the outcomes were what each case meant.
  assert.equal(cases[0].result.results[0].value, 'slow')
  assert.equal(cases[1].result.results[0].ok, false)
  assert.equal(cases[2].result.results[0].value, 'old')
  assert.equal(cases[3].result.results[0].value, 'old')
  assert.deepEqual(JSON.parse(await redis.cmd('GET', vkey('L:cold-ok'))).value, 'slow', 'the value is still written')
  await assertIdle(W, 'W')
})

test('8. 4 processes x 50 readers waiting ~1 s on one slow load: few Redis commands (no tight polling)', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, ws } = await setup(t, { workers: 4 })
  const key = 'slow:wait'
  await sleep(300) // let the bus subscriptions settle
  const before = await redis.commandsProcessed()
  const results = await barrier(ws, 'read', { key, n: 50, loader: { ms: 1_000 } })
  const delta = (await redis.commandsProcessed()) - before
  results.forEach((r, i) => assertAllOk(r, `w${i}`))
  assert.equal(
    results.reduce((s, r) => s + r.loaderCallsDuring, 0),
    1,
    'one load in total',
  )
  assert.equal(new Set(valuesOf(results)).size, 1)
  const snaps = await Promise.all(ws.map((w) => w.request('snapshot')))
  const lockWaits = snaps.reduce((s, x) => s + x.stats.lockWaits, 0)
  assert.ok(lockWaits >= 1, 'some process waited on the lock (else this test measures nothing)')
  assert.ok(delta < 100, `Redis commands while waiting: ${delta} (expected < 100)`)
  note(t, `Redis commands processed during the 1 s wait: ${delta} (lockWaits=${lockWaits})`)
})

test('9. bus invalidation: set, delete and a completed refresh elsewhere reach the other in-process tier quickly', { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { ttl: 60_000 })
  const B = await spawnWorker('B', { ttl: 60_000 })
  const key = 'bus:k'
  const latencies = {}
  // docs/CONTRACT.md says 100 ms; a loaded 2-core machine cannot promise any bound measured from
  // an IPC call, so the latencies are reported, not asserted. What is asserted is that B sees each
  // change at all while its copy is still fresh (ttl and hardTtl 60 s): without the bus it would
  // serve the old value for a minute.
  const WATCH_MS = 10_000

  // set
  assert.ok((await A.request('set', { key, value: 'v1' })).ok)
  const b1 = await B.request('read', { key, n: 2, loader: { value: 'must-not-load' } })
  assert.deepEqual(new Set(valuesOf([b1])), new Set(['"v1"']))
  assert.equal(b1.loaderCallsDuring, 0)
  let watch = B.start('watch', { key, expect: '"v2"', interval: 10, timeout: WATCH_MS, loader: { value: 'must-not-load' } })
  await watch.ready
  await sleep(50)
  const s = await A.request('set', { key, value: 'v2' })
  let w = await watch.result
  assert.equal(w.first, '"v1"', 'B served its in-process copy before the set')
  assert.ok(w.seen, `B never saw the new value (last ${w.last})`)
  latencies.set = w.seenAt - s.startedAt
  assert.equal((await B.request('loads', { key })).length, 0, 'B took the new value from Redis, not its loader')

  // delete
  watch = B.start('watch', { key, expect: '"B-reloaded"', interval: 10, timeout: WATCH_MS, loader: { value: 'B-reloaded' } })
  await watch.ready
  await sleep(50)
  const d = await A.request('delete', { key })
  assert.equal(d.value, true)
  w = await watch.result
  assert.equal(w.first, '"v2"')
  assert.ok(w.seen, `B never noticed the delete (last ${w.last})`)
  latencies.delete = w.seenAt - d.startedAt

  // completed refresh: both hold a stale copy; B only looks with get() (which never refreshes),
  // so only the bus can bring it the value A's refresh wrote.
  const rk = 'bus:refresh'
  assert.ok((await A.request('set', { key: rk, value: 'r1', opts: { ttl: 300, hardTtl: 60_000 } })).ok)
  assert.equal((await B.request('get', { key: rk })).value, 'r1')
  await sleep(500)
  watch = B.start('watch', { key: rk, via: 'get', expect: '"r2"', interval: 10, timeout: WATCH_MS })
  await watch.ready
  const a = await A.request('read', { key: rk, loader: { ms: 200, value: 'r2' } })
  assert.equal(a.results[0].value, 'r1', 'A is served stale and refreshes in the background')
  await A.request('settle')
  w = await watch.result
  const [refresh] = await A.request('loads', { key: rk })
  assert.equal(w.first, '"r1"', 'B served its stale in-process copy before the refresh')
  assert.ok(w.seen, `B never saw the refreshed value (last ${w.last})`)
  latencies.refresh = w.seenAt - refresh.end

  note(t, `bus latency (ms, polling every 10 ms): set=${latencies.set} delete=${latencies.delete} refresh=${latencies.refresh}`)
  await assertIdle(A, 'A')
  await assertIdle(B, 'B')
})

function runChild(source, timeoutMs = 20_000) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['-e', source], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (c) => (stdout += c))
    child.stderr.on('data', (c) => (stderr += c))
    const started = Date.now()
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      child.kill('SIGKILL')
    }, timeoutMs)
    child.once('exit', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr, timedOut, ms: Date.now() - started })
    })
  })
}

const childScript = (url, namespace) => `
  const { StampedeCache } = require(${JSON.stringify(ROOT)})
  const cache = new StampedeCache({ redis: ${JSON.stringify(url)}, namespace: ${JSON.stringify(namespace)}, ttl: 100, hardTtl: 60000 })
  ;(async () => {
    const a = await cache.getOrLoad('k', async () => 'v1')
    // With Redis down, set applies in process and rejects with ERR_REDIS (the contract's choice).
    await cache.set('k2', { x: 1 }).catch((err) => { if (err.code !== 'ERR_REDIS') throw err })
    await new Promise((r) => setTimeout(r, 150))
    const b = await cache.getOrLoad('k', async () => 'v2') // stale: a background refresh
    await cache.settle()
    console.log('done ' + JSON.stringify([a, b]))
    // no close()
  })()
`

test('10. a process with redis configured that never calls close() exits by itself (Redis up, Redis down)', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, namespace, vkey } = await setup(t)
  const up = await runChild(childScript(redis.url, namespace))
  assert.equal(up.timedOut, false, `Redis up: the child did not exit within 20 s\n${up.stderr}`)
  assert.equal(up.code, 0, up.stderr)
  assert.match(up.stdout, /done \["v1","v1"\]/)
  assert.equal(await redis.cmd('EXISTS', vkey('k2')), 1, 'the child used Redis')

  const closedPort = await freePort()
  const down = await runChild(childScript(`redis://127.0.0.1:${closedPort}`, namespace))
  assert.equal(down.timedOut, false, `Redis down: the child did not exit within 20 s\n${down.stderr}`)
  assert.equal(down.code, 0, down.stderr)
  assert.match(down.stdout, /done \["v1","v1"\]/)
  note(t, `exit after: ${up.ms} ms (Redis up), ${down.ms} ms (Redis down)`)
})

test('11. shared error backoff: after a failed refresh in A, B does not refresh within errorBackoff and serves stale', { timeout: TEST_TIMEOUT }, async (t) => {
  const errorBackoff = 3_000
  const { redis, spawnWorker, vkey } = await setup(t, { options: { errorBackoff, ttl: 60_000 } })
  const A = await spawnWorker('A')
  const B1 = await spawnWorker('B1') // holds a stale in-process copy
  const B2 = await spawnWorker('B2') // meets the key in Redis only
  const key = 'backoff:k'
  assert.ok((await A.request('set', { key, value: 's1', opts: { ttl: 300, hardTtl: 60_000 } })).ok)
  assert.equal((await B1.request('get', { key })).value, 's1')
  await sleep(500)

  const a = await A.request('read', { key, n: 5, loader: { ms: 50, throw: 'source down' } })
  assert.deepEqual(new Set(valuesOf([a])), new Set(['"s1"']))
  const aSnap = await A.request('settle')
  const aLoads = await A.request('loads', { key })
  assert.equal(aLoads.length, 1)
  assert.equal(aLoads[0].outcome, 'threw')
  assert.equal(aSnap.stats.refreshErrors, 1)
  assert.ok(
    aSnap.onError.samples.some((e) => e.op === 'refresh'),
    'onError saw the refresh failure',
  )

  const env = JSON.parse(await redis.cmd('GET', vkey(key)))
  const now = Date.now()
  assert.ok(env.retryAfter > now, `the envelope's retryAfter is in the future: retryAfter=${env.retryAfter} now=${now}`)
  assert.ok(env.retryAfter <= now + errorBackoff + 100, `retryAfter ~ errorBackoff: ${env.retryAfter - now} ms ahead`)
  assert.equal(env.value, 's1', 'the stale value is kept')

  for (const [name, B] of [
    ['B1', B1],
    ['B2', B2],
    ['A', A],
  ]) {
    const r = await B.request('read', { key, n: 20, loader: { value: `${name}-new` } })
    assert.ok(r.startedAt < env.retryAfter - 200, `precondition: ${name} read inside the backoff window`)
    assertAllOk(r, name)
    assert.deepEqual(new Set(valuesOf([r])), new Set(['"s1"']), `${name} serves the stale value`)
    await B.request('settle')
    const loads = await B.request('loads', { key })
    assert.equal(loads.length, name === 'A' ? 1 : 0, `${name}: no refresh within errorBackoff`)
  }

  // Positive control: once retryAfter has passed, a read refreshes.
  await sleep(Math.max(0, env.retryAfter - Date.now() + 200))
  const late = await B2.request('read', { key, loader: { value: 'B2-new' } })
  assert.equal(late.results[0].value, 's1', 'still served stale while refreshing')
  await B2.request('settle')
  assert.equal((await B2.request('loads', { key })).length, 1, 'B2 refreshes once the backoff has passed')
  const fresh = await B2.request('read', { key, loader: { value: 'must-not-load' } })
  assert.equal(fresh.results[0].value, 'B2-new')
  for (const [name, w] of [
    ['A', A],
    ['B1', B1],
    ['B2', B2],
  ])
    await assertIdle(w, name)
})

test('12. negative caching through Redis: null/undefined loaded in A are served to B without loading', { timeout: TEST_TIMEOUT }, async (t) => {
  const negativeTtl = 3_000
  const { redis, spawnWorker, vkey } = await setup(t, { options: { negativeTtl } })
  const A = await spawnWorker('A')
  const B = await spawnWorker('B')

  const n = await A.request('read', { key: 'neg:null', loader: { null: true } })
  assertAllOk(n, 'A null')
  assert.equal(n.results[0].value, null)
  assert.equal(n.results[0].undef, false)
  const u = await A.request('read', { key: 'neg:undef', loader: { undefined: true } })
  assertAllOk(u, 'A undefined')
  assert.equal(u.results[0].undef, true)

  const [rawN, pttlN, rawU] = await redis.pipeline([
    ['GET', vkey('neg:null')],
    ['PTTL', vkey('neg:null')],
    ['GET', vkey('neg:undef')],
  ])
  const envN = JSON.parse(rawN)
  const envU = JSON.parse(rawU)
  assert.equal(envN.negative, true, 'negative envelope')
  assert.equal(envN.value, null)
  assert.equal(envN.undefined, undefined)
  assert.equal(envU.negative, true)
  assert.equal(envU.undefined, true, 'undefined is marked')
  assert.ok(pttlN > 0 && pttlN <= negativeTtl, `a negative entry lives negativeTtl in Redis: PTTL ${pttlN}`)

  const bn = await B.request('read', { key: 'neg:null', n: 3, loader: { value: 'B' } })
  assertAllOk(bn, 'B null')
  assert.equal(bn.loaderCallsDuring, 0, 'B did not load')
  for (const x of bn.results) assert.ok(x.value === null && !x.undef, 'B gets null')
  const bu = await B.request('read', { key: 'neg:undef', n: 3, loader: { value: 'B' } })
  assertAllOk(bu, 'B undefined')
  assert.equal(bu.loaderCallsDuring, 0, 'B did not load')
  for (const x of bu.results) assert.ok(x.undef, 'B gets undefined')
  for (const key of ['neg:null', 'neg:undef']) {
    const info = await B.request('inspect', { key })
    assert.equal(info.value && info.value.state, 'negative', `B holds ${key} as a negative entry: ${JSON.stringify(info)}`)
  }
  await assertIdle(A, 'A', 2)
  await assertIdle(B, 'B', 2)
})

// ---- beyond the list: behaviours of docs/CONTRACT.md found broken while writing the tests above --------

test('13. an invalidation that arrives while a Redis read is in flight is not lost (no old value kept past the set)', { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { ttl: 60_000 })
  const B = await spawnWorker('B', { ttl: 60_000 })
  for (const via of ['get', 'getOrLoad']) {
    const key = `race:${via}`
    assert.ok((await A.request('set', { key, value: 'v1' })).ok)
    // B reads the key from Redis (the reply, v1, comes back at once) but its JS thread is busy
    // for 400 ms before it can take the reply in; meanwhile A sets v2 and announces it.
    const run = B.start('readThenBlock', { key, via, blockMs: 400, loader: { value: 'B-loaded' } })
    await run.ready
    await sleep(100)
    const s = await A.request('set', { key, value: 'v2' })
    assert.ok(s.ok)
    const first = await run.result
    assert.ok(first.ok)
    // That read may return v1 (it started before the set); what B serves afterwards may not.
    const w = await B.request('watch', { key, expect: '"v2"', interval: 10, timeout: 1_500, loader: { value: 'B-loaded' } })
    assert.ok(w.seen, `${via}: B still serves ${w.last} 1.5 s after A's set replaced it (Redis holds "v2")`)
  }
  // A busy JS thread is not a Redis failure: Redis answered at once, so neither instance may
  // count an error or mark Redis down.
  for (const [label, w] of [
    ['A', A],
    ['B', B],
  ]) {
    const snap = await w.request('snapshot')
    assert.equal(snap.stats.redisErrors, 0, `${label}: redisErrors after a busy thread (onError: ${JSON.stringify(snap.onError.samples.slice(0, 3))})`)
  }
})

test('13b. a JS thread busy past commandTimeout is not a Redis failure: no error counted, no stampede', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const { redis, spawnWorker } = await setup(t)
  const A = await spawnWorker('A', { ttl: 60_000 })
  // commandTimeout 300 ms and a JS thread busy for 1 s (a GC pause, a CPU spike): Redis answers
  // within microseconds, the reply just waits in the socket for the thread.
  const B = await spawnWorker('B', { ttl: 60_000, redis: { url: redis.url, commandTimeout: 300 } })
  const keys = Array.from({ length: 20 }, (_, i) => `busy:${i}`)
  for (const key of keys) assert.ok((await A.request('set', { key, value: `A:${key}` })).ok)
  const r = await B.request('run', {
    args: { keys, blockMs: 1_000 },
    body: `
        const before = tools.snapshot().loaderCalls
        const ps = args.keys.map((k) => tools.outcome(cache.getOrLoad(k, tools.makeLoader(k, { value: 'B-loaded' }))))
        for (let i = 0; i < 10; i++) await null // up to the Redis reads
        const until = Date.now() + args.blockMs
        while (Date.now() < until) {} // busy: the event loop cannot run
        const out = await Promise.all(ps)
        return { out, loaderCalls: tools.snapshot().loaderCalls - before, redisErrors: cache.stats().redisErrors }
      `,
  })
  note(t, `busy 1 s with commandTimeout 300 ms: ${r.loaderCalls} of ${keys.length} reads ran their loader, redisErrors ${r.redisErrors}`)
  r.out.forEach((x, i) => assert.ok(x.ok, `${keys[i]}: ${x.code} ${x.message}`))
  assert.deepEqual(
    r.out.map((x) => x.value),
    keys.map((k) => `A:${k}`),
    "B served A's values from Redis",
  )
  assert.equal(r.loaderCalls, 0, 'B called its loaders although Redis held every value')
  assert.equal(r.redisErrors, 0, 'a busy thread counted as Redis errors')
})

test('14. XFetch early refresh still happens with Redis configured', { timeout: TEST_TIMEOUT }, async (t) => {
  const { spawnWorker } = await setup(t)
  const opts = { ttl: 5_000, hardTtl: 60_000, beta: 1_000 }
  // beta 1000 and a 200 ms load: each read in the first seconds draws an early refresh with
  // probability ~0.97 (now - 200 * 1000 * ln(u) >= freshUntil for u <= ~0.977).
  const control = await spawnWorker('in-process', { ...opts, redis: undefined })
  const W = await spawnWorker('redis', opts)
  const counts = {}
  for (const [name, w] of [
    ['in-process', control],
    ['redis', W],
  ]) {
    assert.ok((await w.request('read', { key: 'x', loader: { ms: 200 } })).results[0].ok)
    for (let i = 0; i < 5; i++) {
      await w.request('read', { key: 'x', loader: { ms: 200 } })
      await w.request('settle')
    }
    counts[name] = (await w.request('loads', { key: 'x' })).length
  }
  note(t, `loader calls after 1 load + 5 reads: ${JSON.stringify(counts)}`)
  assert.ok(counts['in-process'] >= 2, 'control: without Redis, XFetch refreshes early')
  assert.ok(counts.redis >= 2, `with Redis, no early refresh ever ran (${counts.redis} loader call)`)
})

test('15. a cold load that outlives lockTtl costs at most one extra load across processes', { timeout: TEST_TIMEOUT }, async (t) => {
  const { ws } = await setup(t, { workers: 4, options: { lockTtl: 1_000 } })
  // 1.6 x lockTtl: the holder's lock expires once before its value arrives.
  const results = await barrier(ws, 'read', { key: 'outlive', n: 20, loader: { ms: 1_600 } })
  results.forEach((r, i) => assertAllOk(r, `w${i}`))
  const calls = results.map((r) => r.loaderCallsDuring)
  note(t, `loader calls per process: ${calls.join(', ')}`)
  assert.ok(calls.reduce((a, b) => a + b, 0) <= 2, `docs/CONTRACT.md: "if a load outlives lockTtl, the worst case is one extra load"; got ${calls.join('+')}`)
})

test('16. a cold load resolves only once its value is in Redis', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, spawnWorker, vkey } = await setup(t)
  const W = await spawnWorker('W')
  // A large value makes the write take a while on the wire: a read resolved before its write
  // completed would find the key missing.
  const big = { blob: 'x'.repeat(8 * 1024 * 1024) }
  for (let i = 0; i < 3; i++) {
    const key = `big:${i}`
    const r = await W.request('readAndCheck', { key, n: 10, loader: { value: big }, valueKey: vkey(key) })
    assertAllOk(r, key)
    assert.equal(r.existsWhenResolved, 1, `${key}: the value was not in Redis yet when getOrLoad resolved`)
    // Stored compressed (a blob of one letter): read back whole.
    assert.equal(JSON.parse(await redis.cmd('GET', vkey(key))).value.blob.length, big.blob.length)
  }
  await assertIdle(W, 'W', 3)
})

test('17. set with a zero ttl removes the older copy from Redis too', { timeout: TEST_TIMEOUT }, async (t) => {
  const { redis, namespace, vkey } = await setup(t)
  const { StampedeCache } = require('..')
  const a = new StampedeCache({ redis: redis.url, namespace, jitter: 0 })
  const b = new StampedeCache({ redis: redis.url, namespace, jitter: 0 })
  t.after(() => Promise.all([a.close(), b.close()]))
  await a.set('k', 'old')
  assert.equal(await b.get('k'), 'old')
  await a.set('k', 'new', { ttl: 0, hardTtl: 0 })
  assert.equal(await redis.cmd('EXISTS', vkey('k')), 0, 'nothing left in Redis')
  assert.equal(await a.get('k'), undefined)
  await waitFor(async () => (await b.get('k')) === undefined, { timeout: 2_000, interval: 10, what: "b to drop 'old'" })
})
