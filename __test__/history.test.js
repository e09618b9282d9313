'use strict'
// The randomized history test (docs/CONTRACT.md getOrLoad 9-10, "The rest", "Redis"),
// Jepsen-style and small: 3 worker processes share one private redis-server, the test owns a
// versioned database, seeded readers and writers run while connections are killed, Redis is
// paused and restarted; then every instance and Redis must hold the database's version, no call
// may have hung, and no read may have been rejected. The harness and the checks are in
// helpers/history.js (shared with `npm run soak`, which runs many more seeds).
//
// A failure prints the seed, the kinds of violation and, for the first of each kind, the key's
// history across processes. Replay a seed with `npm run soak -- --seed S` (a seed fixes the
// operations and faults, not the interleaving: replay it a few times, `--repeat 5`).
// HISTORY_SEEDS=4,5,6 runs other seeds here.
//
// Besides the ttl, each seed draws its configuration: the serializer (json, v8 or a custom one),
// tags (deleteByTag among the writes), and per worker l1 (default, false, or a small maxBytes),
// negativeTtl and errorBackoff. The operations include loaders that throw, return null or hang
// past loadTimeout, clear(), and silent database changes the cache is not told of. Besides the
// final state, the checks are: liveness (a silent change reaches every process within a bound),
// visibility across processes (after a write resolved and the bus bound passed, no other process
// serves an older version), and load counts (at most one load per key per epoch, with slack).
//
// The same history also runs against a 3-master, 3-replica Redis Cluster: keys on every
// master, CLIENT KILL and SIGSTOP of single nodes, and one master SIGKILLed mid-run while its
// replica is promoted. One cluster serves this file (HISTORY_CLUSTER_SEEDS=1,2 picks the seeds;
// each run kills one master, so a new cluster is started when none with a replica is left).
// `npm run soak -- --cluster` runs many more.

const { test, describe, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { killAllSync } = require('./helpers/redis-server')
const { RedisCluster, killTopologySync } = require('./helpers/redis-topology')
const { runHistory, clusterUsable, checkHistory, formatViolations, summarize, countBy } = require('./helpers/history')

after(() => {
  killAllSync()
  killTopologySync()
})

// ---- the checker itself, on made-up histories (no processes): each kind fires, each excuse holds

/** A one-key history at v3 (bumped at 10 and 100 ms by w1), clean; `edit` adds to it. */
function syntheticHistory(edit) {
  const h = {
    seed: 0,
    t0: 0,
    startedAt: 0,
    keys: ['k'],
    namespace: 'ns',
    cfg: { hangBound: 1_000, busBoundMs: 500, maxLoadMs: 300, maxErrorBackoff: 1_000 },
    bumps: [
      { t: 10, key: 'k', version: 2, by: 'w1' },
      { t: 100, key: 'k', version: 3, by: 'w1' },
    ],
    ops: [
      { i: 0, proc: 'w1', client: 0, op: 'set', key: 'k', start: 9, end: 20, outcome: 'ok', version: 2, slotAt: 10, resolvedAt: 20, attempts: [] },
      { i: 1, proc: 'w1', client: 0, op: 'delete', key: 'k', start: 99, end: 120, outcome: 'ok', version: 3, slotAt: 100, resolvedAt: 120, attempts: [] },
      { i: 0, proc: 'w0', client: 0, op: 'getOrLoad', key: 'k', start: 130, end: 150, outcome: 'ok', v: 3 },
    ],
    loads: [{ proc: 'w0', key: 'k', op: 0, start: 131, readAt: 132, read: 3, end: 149, slow: false }],
    finals: [{ i: 1, proc: 'w0', client: 'final', op: 'final-getOrLoad', key: 'k', start: 900, end: 910, outcome: 'ok', v: 3 }],
    faults: [],
    reports: [],
    workerErrors: [],
    db: { k: 3 },
    redisBefore: { k: { v: null, raw: null } },
    redisAfter: { k: { v: 3, raw: '{}' } },
    checkedAt: 890,
    endedAt: 1_000,
  }
  edit?.(h)
  return h
}
const kinds = (h) =>
  checkHistory(h)
    .map((v) => v.kind)
    .sort()

test('history checker: a clean history passes; each kind of violation is reported, with the seed and the key history', () => {
  assert.deepEqual(kinds(syntheticHistory()), [])
  const read = (fields) => ({ i: 9, proc: 'w0', client: 1, op: 'getOrLoad', key: 'k', start: 200, end: 210, outcome: 'ok', v: 3, ...fields })

  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ outcome: 'hung', end: null })))), ['hung'])
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ outcome: 'err', code: 'ERR_REDIS', message: 'x' })))), ['read-rejected'])
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ op: 'get', outcome: 'err', code: 'ERR_REDIS', message: 'x' })))), ['read-rejected'])
  assert.deepEqual(
    kinds(syntheticHistory((h) => h.ops.push(read({ outcome: 'err', name: 'AbortError', message: 'x' })))),
    ['read-rejected'],
    'AbortError only where the test aborted',
  )
  assert.deepEqual(
    kinds(syntheticHistory((h) => h.ops.push(read({ outcome: 'err', code: 'ERR_LOAD_TIMEOUT', message: 'x' })))),
    ['read-rejected'],
    'ERR_LOAD_TIMEOUT only where a slow loader ran',
  )
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ v: 4 })))), ['bad-value'], 'a version the database did not have yet')
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ v: 'bad', bad: '"x"' })))), ['bad-value'])
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ v: 'undefined' })))), ['bad-value'], 'getOrLoad resolved with nothing')
  const write = (fields) => ({ i: 8, proc: 'w1', client: 1, op: 'set', key: 'k', start: 300, end: 310, version: 3, slotAt: 300, attempts: [], ...fields })
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(write({ outcome: 'err', code: 'ERR_INVALID_KEY' })))), ['write-rejected'])
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(write({ outcome: 'gave-up', code: 'ERR_REDIS' })))), ['write-lost'])
  // w0's final read of v2 is also stale after w1's delete (of v3) resolved long before.
  assert.deepEqual(kinds(syntheticHistory((h) => (h.finals[0].v = 2))), ['final-read', 'stale-in-other-process'])
  assert.deepEqual(kinds(syntheticHistory((h) => (h.redisBefore.k = { v: 2, raw: '{}' }))), ['final-redis'])
  assert.deepEqual(kinds(syntheticHistory((h) => (h.redisAfter.k = { v: 'bad', raw: 'junk' }))), ['final-redis'])
  assert.deepEqual(kinds(syntheticHistory((h) => h.workerErrors.push({ proc: 'w2', phase: 'run', message: 'exited' }))), ['worker-failed'])

  // A SENTINEL FAILOVER issued at 90 whose promoted replica a sentinel named at 110: w1's delete
  // (99-120) may have been acknowledged by the old master and lost, so Redis or a final read still
  // holding v2 is counted in lostInFailover, not reported. Not after a SIGKILL (the old master
  // acknowledges nothing after it), nor for a write made before the failover, nor when a write of
  // the key began after the window (250 ms after the naming): that one must have landed.
  const failover = (fields) => (h) =>
    h.faults.push({ kind: 'failover', how: 'SENTINEL FAILOVER', node: 1, start: 90, end: 400, namedAt: 110, newMaster: 2, ...fields })
  const lost = syntheticHistory((h) => {
    failover()(h)
    h.redisBefore.k = { v: 2, raw: '{}' }
    h.finals[0].v = 2
  })
  assert.deepEqual(kinds(lost), [])
  assert.deepEqual(
    lost.lostInFailover.map((x) => x.where),
    ['w0 final read', 'Redis before the final reads'],
  )
  const stillLost = (edit) =>
    kinds(
      syntheticHistory((h) => {
        edit(h)
        h.redisBefore.k = { v: 2, raw: '{}' }
      }),
    )
  assert.deepEqual(stillLost(failover({ how: 'SIGKILL', namedAt: undefined })), ['final-redis'])
  assert.deepEqual(stillLost(failover({ start: 130, namedAt: 140 })), ['final-redis'], 'a write resolved before the failover')
  assert.deepEqual(
    stillLost((h) => {
      failover()(h)
      h.ops.push(write({ op: 'delete', start: 361, end: 370, slotAt: 361, resolvedAt: 370, outcome: 'ok' }))
    }),
    ['final-redis'],
    'a write begun after the window',
  )

  // A cluster run's report says how to replay it and shows the master kill in the key's history.
  const inCluster = syntheticHistory((h) => {
    h.mode = 'cluster'
    h.finals[0].v = 2
    h.faults.push({ kind: 'kill-master', node: 7001, keys: ['k'], start: 40, end: 2_600, killedAt: 41, promotedMs: 2_000, settledMs: 2_100, newMaster: 7004 })
  })
  inCluster.violations = checkHistory(inCluster)
  const clusterText = formatViolations(inCluster)
  assert.match(clusterText, /replay: npm run soak -- --seed 0 --cluster/)
  assert.match(clusterText, /FAULT +kill-master SIGKILL :7001 \(owns k\); replica :7004 promoted at \+2041ms/)
  const overTls = syntheticHistory((h) => {
    h.mode = 'tls'
    h.finals[0].v = 2
  })
  overTls.violations = checkHistory(overTls)
  assert.match(formatViolations(overTls), /\[seed 0 tls\][\s\S]*replay: npm run soak -- --seed 0 --tls/)
  overTls.mode = 'mtls'
  assert.match(formatViolations(overTls), /\[seed 0 mtls\][\s\S]*replay: npm run soak -- --seed 0 --mtls/)
  overTls.mode = 'sentinel'
  assert.match(formatViolations(overTls), /\[seed 0 sentinel\][\s\S]*replay: npm run soak -- --seed 0 --sentinel/)

  // w1's delete of v3 resolved at 120: a later read in w1 that returns v2 is an older value...
  const older = syntheticHistory((h) => h.ops.push(read({ proc: 'w1', v: 2 })))
  older.violations = checkHistory(older)
  assert.deepEqual(
    older.violations.map((v) => v.kind),
    ['older-after-own-write'],
  )
  const text = formatViolations(older)
  assert.match(text, /\[seed 0\] older-after-own-write/)
  assert.match(text, /replay: npm run soak -- --seed 0/)
  assert.match(text, /db +k := v3 \(writer in w1\)/, 'the key history is printed')
  // ...unless it may have joined a load of w1 that read v2 before the write and was still running...
  const joined = syntheticHistory((h) => {
    h.ops.push(read({ proc: 'w1', v: 2 }))
    h.loads.push({ proc: 'w1', key: 'k', op: 7, start: 90, readAt: 91, read: 2, end: 205, slow: false })
  })
  assert.deepEqual(kinds(joined), [])
  // ...which a get() cannot have done; and in another process it is no violation of this kind.
  assert.deepEqual(
    kinds(
      syntheticHistory((h) => {
        h.ops.push(read({ proc: 'w1', op: 'get', v: 2 }))
        h.loads.push({ proc: 'w1', key: 'k', op: 7, start: 90, readAt: 91, read: 2, end: 205, slow: false })
      }),
    ),
    ['older-after-own-write'],
  )
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ proc: 'w2', v: 2 })))), [])

  // Visibility across processes: w1's delete of v3 resolved at 120; past the 500 ms bus bound, w2
  // may not read v2 (within it, or near a fault, it may).
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ proc: 'w2', v: 2, start: 700, end: 710 })))), ['stale-in-other-process'])
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ proc: 'w2', v: 2, start: 600, end: 610 })))), [])
  assert.deepEqual(
    kinds(
      syntheticHistory((h) => {
        h.ops.push(read({ proc: 'w2', v: 2, start: 700, end: 710 }))
        h.faults.push({ kind: 'kill-pubsub', start: 300, end: 310 })
      }),
    ),
    [],
  )
  // Liveness: the database moves to v4 at 1000 without the cache being told; w0 (ttl 100) finds
  // its entry stale at 1500; 1.8 s later it may no longer serve v3.
  const silently = (h) => {
    h.config = [{ name: 'w0', ttl: 100 }]
    h.bumps.push({ t: 1_000, key: 'k', version: 4, by: 'w1' })
    h.ops.push({
      i: 5,
      proc: 'w1',
      client: 0,
      op: 'silent',
      key: 'k',
      start: 999,
      end: 1_001,
      outcome: 'ok',
      version: 4,
      slotAt: 1_000,
      resolvedAt: 1_000,
      attempts: [],
    })
    h.ops.push(read({ i: 10, proc: 'w0', v: 3, start: 1_500, end: 1_510 }))
    h.db.k = 4
    Object.assign(h.finals[0], { v: 4, start: 5_000, end: 5_010 })
    h.redisAfter.k = { v: 4, raw: '{}' }
    h.checkedAt = 4_990
    h.endedAt = 6_000
  }
  assert.deepEqual(kinds(syntheticHistory(silently)), [])
  assert.deepEqual(
    kinds(
      syntheticHistory((h) => {
        silently(h)
        h.ops.push(read({ i: 11, proc: 'w0', v: 3, start: 3_400, end: 3_410 }))
      }),
    ),
    ['not-refreshed'],
  )
  assert.deepEqual(
    kinds(
      syntheticHistory((h) => {
        silently(h)
        h.ops.push(read({ i: 11, proc: 'w0', v: 4, start: 3_400, end: 3_410 }))
      }),
    ),
    [],
  )
  // Load counts: one epoch (from w1's delete at 120 on, read at 130) and one worker allow 3 loads.
  const loaded = (n) => (h) => {
    h.config = [{ name: 'w0', ttl: 10_000 }]
    h.opsEndedAt = 1_000
    h.loads = Array.from({ length: n }, (_, j) => ({ proc: 'w0', key: 'k', op: 0, start: 131 + j, readAt: 132 + j, read: 3, end: 149 + j, slow: false }))
  }
  assert.deepEqual(kinds(syntheticHistory(loaded(3))), [])
  assert.deepEqual(kinds(syntheticHistory(loaded(4))), ['excess-loads'])
  // A negative entry only where a loader returned null; a planned loader failure may reject a read.
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ v: 'null' })))), ['bad-value'])
  assert.deepEqual(
    kinds(
      syntheticHistory((h) => {
        h.ops.push(read({ v: 'null' }))
        h.loads.push({ proc: 'w2', key: 'k', op: 3, start: 150, readAt: 151, read: 3, end: 160, slow: false, outcome: 'null' })
      }),
    ),
    [],
  )
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ op: 'failing', outcome: 'err', message: 'planned loader failure (w0 op #9)' })))), [])
  assert.deepEqual(
    kinds(syntheticHistory((h) => h.ops.push(read({ op: 'get', outcome: 'err', message: 'planned loader failure (w0 op #9)' })))),
    ['read-rejected'],
    'get never runs a loader',
  )

  // The excuses: AbortError of an aborted call; ERR_LOAD_TIMEOUT meeting a slow loader of that key in that process.
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ op: 'abortable', outcome: 'err', name: 'AbortError' })))), [])
  assert.deepEqual(kinds(syntheticHistory((h) => h.ops.push(read({ op: 'slow', outcome: 'err', code: 'ERR_LOAD_TIMEOUT' })))), [])
  assert.deepEqual(
    kinds(
      syntheticHistory((h) => {
        h.ops.push(read({ outcome: 'err', code: 'ERR_LOAD_TIMEOUT' }))
        h.loads.push({ proc: 'w0', key: 'k', op: 5, start: 150, readAt: 151, read: 3, end: null, slow: true })
      }),
    ),
    [],
  )
})

// ---- the histories -----------------------------------------------------------------------------

const SEEDS = process.env.HISTORY_SEEDS ? process.env.HISTORY_SEEDS.split(',').map((s) => Number(s.trim())) : [1, 2, 3]
/** A run takes ~10 s; a hang fails its test instead of blocking the suite. */
const TEST_TIMEOUT = 120_000

/** A single-server run (plain or TLS) did what it is for, and found nothing. */
function assertRanClean(h, seed) {
  {
    // The run did what it is for (else a green result would prove nothing).
    const writes = h.ops.filter((o) => o.op === 'set' || o.op === 'delete' || o.op === 'set-set')
    assert.ok(h.ops.length >= 100, `seed ${seed}: only ${h.ops.length} operations ran`)
    assert.ok(writes.length >= 20, `seed ${seed}: only ${writes.length} writes ran`)
    assert.ok(h.loads.length >= 20, `seed ${seed}: only ${h.loads.length} loader calls ran`)
    assert.ok(h.faults.length >= 2, `seed ${seed}: only ${h.faults.length} faults were injected`)
    assert.deepEqual(
      h.faults.filter((f) => f.error).map((f) => `${f.kind}: ${f.error}`),
      [],
      `seed ${seed}: a fault could not be injected`,
    )
    assert.ok(h.redisBefore && h.redisAfter, `seed ${seed}: the final Redis state was not read`)
    const finalsPerWorker = countBy(h.finals, (f) => f.proc)
    assert.equal(h.finals.length, h.config.length * h.keys.length, `seed ${seed}: final reads per worker: ${JSON.stringify(finalsPerWorker)}`)
    // Every worker built its cache with the options drawn for it (loadTimeout included: a build
    // refusing one fails the worker, no fallback) and answered the report.
    assert.equal(h.reports.length, h.config.length, `seed ${seed}: reports from ${h.reports.map((r) => r.proc)}`)
    assert.ok(
      h.config.every((c) => c.loadTimeout === h.cfg.loadTimeout),
      `seed ${seed}: loadTimeout in every worker`,
    )
    // The new checks had something to look at.
    assert.ok(
      h.ops.some((o) => o.op === 'silent'),
      `seed ${seed}: no silent change ran (the liveness check saw nothing)`,
    )
    assert.ok(h.warms.length === h.finals.length, `seed ${seed}: warm reads ${h.warms.length}, final reads ${h.finals.length}`)

    assert.equal(h.violations.length, 0, `\n${formatViolations(h)}\n`)
  }
}

for (const seed of SEEDS) {
  test(`history, seed ${seed}: after faults, every instance and Redis hold the database's version; nothing hung, no read rejected`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const h = await runHistory({ seed })
    t.diagnostic(summarize(h))
    assertRanClean(h, seed)
  })
}

// l1: false in every worker, without faults (with l1: false a stale entry was once served and
// never refreshed; only workers reading straight from Redis show it, and faults would excuse
// most of the run). The liveness check and the warm + final reads must find every stale entry
// refreshed.
test('history, l1: false in every worker, no faults: stale entries are refreshed (liveness), one load per epoch, final state matches', {
  timeout: TEST_TIMEOUT,
}, async (t) => {
  const h = await runHistory({ seed: 2, l1: false, faults: false })
  t.diagnostic(summarize(h))
  assert.ok(
    h.config.every((c) => c.l1 === false),
    `l1 in every worker: ${h.config.map((c) => c.l1)}`,
  )
  assert.ok(h.ops.length >= 100, `only ${h.ops.length} operations ran`)
  assert.ok(
    h.ops.some((o) => o.op === 'silent'),
    'no silent change ran',
  )
  assert.equal(h.violations.length, 0, `\n${formatViolations(h)}\n`)
})

// The same over TLS: the caches' reads take the TLS read lane, which the faults kill, pause and
// restart under them.
const TLS_SEEDS = process.env.HISTORY_TLS_SEEDS ? process.env.HISTORY_TLS_SEEDS.split(',').map((s) => Number(s.trim())) : [1]

for (const seed of TLS_SEEDS) {
  test(`TLS history, seed ${seed}: the same faults against a TLS-only server; every instance and Redis hold the database's version, nothing hung`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const h = await runHistory({ seed, tls: true })
    t.diagnostic(summarize(h))
    assert.equal(h.mode, 'tls')
    assertRanClean(h, seed)
  })
}

// Through Sentinel: the caches find the master through the sentinel; the faults hit the master and
// the sentinel, and mid-run SENTINEL FAILOVER promotes the replica while the old master stays up
// and writable until the sentinel demotes it: the caches must leave it at the announcement
// (`npm run soak -- --sentinel` also draws a SIGKILL of the master).
// Seed 22: every fault kind (master kills and pauses, a sentinel pause) and silent changes early
// in the clients' sequences. A failover costs seconds of degraded calls, so a run does fewer
// operations than a plain one; seed 1's first silent change came too late to be reached reliably.
const SENTINEL_SEEDS = process.env.HISTORY_SENTINEL_SEEDS ? process.env.HISTORY_SENTINEL_SEEDS.split(',').map((s) => Number(s.trim())) : [22]

for (const seed of SENTINEL_SEEDS) {
  test(`Sentinel history, seed ${seed}: master faults and a SENTINEL FAILOVER (the old master stays up); every instance and Redis hold the database's version, nothing hung`, {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const h = await runHistory({ seed, sentinel: true, sentinelFailover: 'SENTINEL FAILOVER' })
    t.diagnostic(summarize(h))
    assert.equal(h.mode, 'sentinel')
    const failovers = h.faults.filter((f) => f.kind === 'failover')
    assert.equal(failovers.length, 1, `seed ${seed}: one failover`)
    const [fo] = failovers
    assert.equal(fo.how, 'SENTINEL FAILOVER')
    assert.equal(fo.newMaster, h.sentinel.before.replica, `seed ${seed}: the replica was promoted (${fo.error ?? ''})`)
    assert.equal(h.sentinel.after.master, fo.newMaster, `seed ${seed}: the sentinel names the promoted replica after the run`)
    // The final Redis state is read from that master: the caches followed the failover there.
    assertRanClean(h, seed)
  })
}

// ---- the histories against a Redis Cluster -----------------------------------------------------

const CLUSTER_SEEDS = process.env.HISTORY_CLUSTER_SEEDS ? process.env.HISTORY_CLUSTER_SEEDS.split(',').map((s) => Number(s.trim())) : [1, 2]

describe('history against a Redis Cluster (3 masters, 3 replicas)', () => {
  let cluster = null
  /** The file's cluster, replaced when it has no master with a replica left to kill. */
  async function usableCluster() {
    if (cluster && (await clusterUsable(cluster))) return cluster
    if (cluster) await cluster.dispose()
    cluster = new RedisCluster({ nodeTimeout: 1_000 })
    await cluster.start()
    return cluster
  }

  before(() => usableCluster(), { timeout: 60_000 })
  after(() => cluster && cluster.dispose())

  for (const seed of CLUSTER_SEEDS) {
    test(`cluster history, seed ${seed}: keys on every master, node faults and a master killed; every instance and Redis hold the database's version, nothing hung`, {
      timeout: TEST_TIMEOUT,
    }, async (t) => {
      const h = await runHistory({ seed, cluster: await usableCluster() })
      t.diagnostic(summarize(h))

      // The run did what it is for: load, writes, node faults, keys on all three masters, and
      // one master (owning some of them) killed and failed over.
      const writes = h.ops.filter((o) => o.op === 'set' || o.op === 'delete' || o.op === 'set-set')
      assert.ok(h.ops.length >= 100, `seed ${seed}: only ${h.ops.length} operations ran`)
      assert.ok(writes.length >= 20, `seed ${seed}: only ${writes.length} writes ran`)
      assert.ok(h.loads.length >= 20, `seed ${seed}: only ${h.loads.length} loader calls ran`)
      assert.deepEqual(
        h.faults.filter((f) => f.error).map((f) => `${f.kind}: ${f.error}`),
        [],
        `seed ${seed}: a fault could not be injected`,
      )
      assert.ok(h.faults.filter((f) => f.kind !== 'kill-master').length >= 2, `seed ${seed}: only ${h.faults.length} faults were injected`)
      const { before: layout, after: later } = h.cluster
      assert.equal(layout.masters.length, 3, `seed ${seed}: masters at the start: ${layout.masters}`)
      assert.deepEqual(
        [...new Set(Object.values(layout.owners))].sort(),
        [...layout.masters].sort(),
        `seed ${seed}: every master owns some of the keys: ${JSON.stringify(layout.owners)}`,
      )
      const kills = h.faults.filter((f) => f.kind === 'kill-master')
      assert.equal(kills.length, 1, `seed ${seed}: one master killed`)
      const [kill] = kills
      assert.ok(kill.keys.length >= 1, `seed ${seed}: the killed master :${kill.node} owned some of the keys`)
      assert.ok(later.dead.includes(kill.node), `seed ${seed}: :${kill.node} stays dead`)
      for (const k of kill.keys) assert.notEqual(later.owners[k], kill.node, `seed ${seed}: ${k} has a live master after the failover`)
      assert.ok(h.redisBefore && h.redisAfter, `seed ${seed}: the final Redis state was not read`)
      const finalsPerWorker = countBy(h.finals, (f) => f.proc)
      assert.equal(h.finals.length, h.config.length * h.keys.length, `seed ${seed}: final reads per worker: ${JSON.stringify(finalsPerWorker)}`)

      assert.equal(h.violations.length, 0, `\n${formatViolations(h)}\n`)
    })
  }
})
