'use strict'
// The demo (`npm run demo`): it runs, exits 0, and shows the stampede and its absence.
// No timing asserts: latencies on a small shared machine are too noisy to pin down.

const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const path = require('node:path')
const { runDemo } = require('../examples/demo/stampede-demo.js')

const root = path.join(__dirname, '..')

test('npm run demo: exits 0 and reports both runs', { timeout: 60_000 }, () => {
  const r = spawnSync(process.execPath, ['examples/demo/stampede-demo.js'], { cwd: root, encoding: 'utf8', timeout: 60_000 })
  assert.equal(r.error, undefined)
  assert.equal(r.status, 0, `exit ${r.status}, signal ${r.signal}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`)
  assert.match(r.stdout, /== naive cache-aside ==/)
  assert.match(r.stdout, /== stampede-cache ==/)
  assert.match(r.stdout, /^naive: \d+ quer(y|ies), p99 .* ms; stampede-cache: 1 query, p99 .* ms$/m)
})

test('runDemo: naive cache-aside stampedes, StampedeCache queries once', { timeout: 60_000 }, async () => {
  const { naive, stampede } = await runDemo({ requests: 1000, quiet: true })
  for (const run of [naive, stampede]) {
    assert.equal(run.requests, 1000)
    assert.equal(run.failures, 0, `${run.name}: every request gets the feed`)
  }
  // The first query cannot finish before the ~1 s burst is over (each wave adds 100 queries
  // that slow down all the others), so practically every request misses; >= 100 leaves room.
  assert.ok(naive.queries >= 100, `naive made only ${naive.queries} queries`)
  assert.ok(naive.maxInFlight >= 100, `naive peaked at ${naive.maxInFlight} in flight`)
  // Exactly 1: the entry is stale when the burst starts (runDemo checks with inspect()), so the
  // first request serves it and starts the key's only background refresh; requests during that
  // refresh get the stale value without starting another; the refreshed entry is fresh for
  // ttl = 30 s (+-10 % jitter), far beyond the burst. XFetch could refresh early only if
  // -ln(random) >= ~27 s / computeMs (~1000 for a ~25 ms query): probability about e^-1000.
  assert.equal(stampede.queries, 1)
  assert.equal(stampede.maxInFlight, 1)
  assert.equal(stampede.stats.refreshes, 1)
  assert.equal(stampede.stats.loads, 1)
  assert.equal(stampede.stats.misses, 0)
  assert.equal(stampede.stats.hits + stampede.stats.staleHits, 1000)
})
