'use strict'
// examples/next-cache as a user deploys it: `next build` once, then two `next start` instances on
// loopback ports sharing one private redis-server, driven over HTTP. Its "use cache" function and
// its unstable_cache function each take 1.5 s and count their runs in Redis (INCR), so the counts
// are runs across both instances. The same build then runs with Next.js's own handlers
// (NEXT_CACHE_HANDLER=default, read by next.config.mjs at start) to show the difference.
//
// Installs examples/next-cache's own dependencies (its package-lock.json) when its node_modules is
// missing, which needs the npm registry. Nothing is skipped: if Next.js cannot be installed or
// built, this test fails.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { RedisServer, command, freePort } = require('./helpers/redis-server.js')

const app = path.join(__dirname, '..', 'examples', 'next-cache')
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
// No request may hang: each has this long (a cold render takes 1.5 s plus the machine's noise).
const REQUEST_BOUND = 60_000

function run(cmd, args, options) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { ...options, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (d) => (output += d))
    child.stderr.on('data', (d) => (output += d))
    child.on('error', reject)
    child.on('close', (code, signal) => {
      if (code === 0) resolve(output)
      else reject(new Error(`${cmd} ${args.join(' ')} exited with ${code ?? signal}:\n${output}`))
    })
  })
}

async function until(what, predicate, ms = 60_000) {
  const deadline = Date.now() + ms
  for (;;) {
    if (await predicate()) return
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

/** One `next start` on a free loopback port; resolves once it answers HTTP. */
async function startNext(t, env) {
  const port = await freePort()
  const server = spawn(process.execPath, [path.join(app, 'node_modules', 'next', 'dist', 'bin', 'next'), 'start', '-H', '127.0.0.1', '-p', String(port)], {
    cwd: app,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  server.stdout.on('data', (d) => (output += d))
  server.stderr.on('data', (d) => (output += d))
  const exited = new Promise((resolve) => server.on('exit', resolve))
  const stop = async () => {
    if (server.exitCode === null && server.signalCode === null) server.kill('SIGTERM')
    const timer = setTimeout(() => server.kill('SIGKILL'), 10_000)
    await exited
    clearTimeout(timer)
  }
  t.after(stop)
  const base = `http://127.0.0.1:${port}`
  await until(
    `next start on ${port}`,
    async () => {
      if (server.exitCode !== null) throw new Error(`next start exited:\n${output}`)
      try {
        await fetch(`${base}/nothing-here`, { signal: AbortSignal.timeout(2_000) })
        return true
      } catch {
        return false
      }
    },
    120_000,
  )
  return { base, stop, output: () => output }
}

/** GET /report?k=: the rendered "use cache" report as { k, run, nonce }. */
async function report(instance, k) {
  const res = await fetch(`${instance.base}/report?k=${encodeURIComponent(k)}`, { signal: AbortSignal.timeout(REQUEST_BOUND) })
  const html = await res.text()
  assert.equal(res.status, 200, html.slice(0, 500))
  const m = /report k=([^ ]+) run=(-?\d+) nonce=([a-z0-9]+)/.exec(html)
  assert.ok(m, `a report in the page:\n${html.slice(0, 2_000)}\n${instance.output().slice(-2_000)}`)
  return { k: m[1], run: Number(m[2]), nonce: m[3] }
}

/** GET /api/legacy?k=: the unstable_cache result as { k, run, nonce }. */
async function legacy(instance, k) {
  const res = await fetch(`${instance.base}/api/legacy?k=${encodeURIComponent(k)}`, { signal: AbortSignal.timeout(REQUEST_BOUND) })
  const body = await res.text()
  assert.equal(res.status, 200, body.slice(0, 500))
  return JSON.parse(body)
}

/** `n` concurrent requests, alternating between the instances. */
function spread(instances, n, call) {
  return Promise.all(Array.from({ length: n }, (_, i) => call(instances[i % instances.length])))
}

async function runs(redis, name) {
  return Number((await command(redis.port, ['GET', name])) ?? 0)
}

test('examples/next-cache: two next start instances share "use cache" and unstable_cache through Redis, computed once; Next.js default handlers compute per instance', {
  timeout: 900_000,
}, async (t) => {
  const env = { ...process.env, NEXT_TELEMETRY_DISABLED: '1', CI: process.env.CI ?? '' }
  delete env.NEXT_CACHE_HANDLER
  const timings = {}
  const began = Date.now()

  let started = Date.now()
  if (!fs.existsSync(path.join(app, 'node_modules'))) {
    const args = fs.existsSync(path.join(app, 'package-lock.json')) ? ['ci'] : ['install']
    await run(npm, [...args, '--no-audit', '--no-fund'], { cwd: app, env })
  }
  timings.install = Date.now() - started

  const redis = await new RedisServer().start()
  t.after(() => redis.stop('SIGKILL'))

  started = Date.now()
  // `npm run build`: the example's prebuild step, then `next build`. REDIS_URL is set, as in a CI
  // that builds next to a running deployment: the handlers must not write to it during the build.
  await run(npm, ['run', 'build'], { cwd: app, env: { ...env, REDIS_URL: redis.url } })
  timings.build = Date.now() - started
  assert.deepEqual(await command(redis.port, ['KEYS', '*']), [], 'next build wrote nothing to Redis')

  // ---- stampede-cache/next -------------------------------------------------------------------
  started = Date.now()
  const sharedEnv = { ...env, REDIS_URL: redis.url }
  const [a, b] = await Promise.all([startNext(t, sharedEnv), startNext(t, sharedEnv)])
  timings.start = Date.now() - started
  started = Date.now()

  // 20 concurrent requests, split across both instances, to a cold "use cache" page: one run.
  const cold = await spread([a, b], 20, (i) => report(i, 'cold'))
  assert.equal(await runs(redis, 'runs:report:cold'), 1, 'the "use cache" function ran once across both instances')
  assert.deepEqual(new Set(cold.map((r) => `${r.run}/${r.nonce}`)).size, 1, 'every request, on both instances, got the one computed value')
  assert.equal(cold[0].run, 1)
  const sharedColdRuns = await runs(redis, 'runs:report:cold')

  // revalidateTag(tag, 'max') on A: Next 16's stale-while-revalidate. Past the bus bound, B's next
  // request is served the old value at once (stale), while one instance regenerates it; then
  // both serve the new value, computed once.
  const revalidated = await fetch(`${a.base}/api/revalidate?tag=report`, { method: 'POST', signal: AbortSignal.timeout(REQUEST_BOUND) })
  assert.equal(revalidated.status, 200, await revalidated.text())
  await sleep(500)
  const staleStarted = Date.now()
  const served = await report(b, 'cold')
  timings.staleServe = Date.now() - staleStarted
  assert.equal(served.nonce, cold[0].nonce, "revalidateTag(tag, 'max'): the first request after it is served the old value")
  let fresh
  await until(
    'B to serve a newly computed report',
    async () => {
      fresh = await report(b, 'cold')
      return fresh.nonce !== cold[0].nonce
    },
    30_000,
  )
  const afterRevalidate = await spread([a, b], 10, (i) => report(i, 'cold'))
  assert.ok(
    afterRevalidate.every((r) => r.nonce === fresh.nonce && r.run === 2),
    'both instances serve the one recomputed value',
  )
  assert.equal(await runs(redis, 'runs:report:cold'), 2, 'recomputed once after revalidateTag')

  // revalidatePath on B reaches the entry through the implicit tags of the page that computed it.
  const byPath = await fetch(`${b.base}/api/revalidate?path=/report`, { method: 'POST', signal: AbortSignal.timeout(REQUEST_BOUND) })
  assert.equal(byPath.status, 200, await byPath.text())
  let afterPath
  await until(
    'A to serve a report computed after revalidatePath',
    async () => {
      afterPath = await report(a, 'cold')
      return afterPath.nonce !== fresh.nonce
    },
    30_000,
  )
  const pathServed = await spread([a, b], 10, (i) => report(i, 'cold'))
  assert.ok(
    pathServed.every((r) => r.nonce === afterPath.nonce && r.run === 3),
    'both instances serve the one recomputed value',
  )
  assert.equal(await runs(redis, 'runs:report:cold'), 3, 'recomputed once after revalidatePath')

  // revalidateTag(tag, { expire: 0 }) and the profile-less revalidateTag(tag): gone at once on
  // the other instance; its next request waits for a new value (never the old one), computed once.
  let before = afterPath
  let expected = 4
  for (const [form, on, other] of [
    ['now', a, b],
    ['legacy', b, a],
  ]) {
    const res = await fetch(`${on.base}/api/revalidate?tag=report&form=${form}`, { method: 'POST', signal: AbortSignal.timeout(REQUEST_BOUND) })
    assert.equal(res.status, 200, await res.text())
    await sleep(500)
    const next = await report(other, 'cold')
    assert.notEqual(next.nonce, before.nonce, `revalidateTag form=${form}: not served the old value`)
    const all = await spread([a, b], 10, (i) => report(i, 'cold'))
    assert.ok(
      all.every((r) => r.nonce === next.nonce),
      `form=${form}: both instances serve the one recomputed value`,
    )
    assert.equal(await runs(redis, 'runs:report:cold'), expected, `form=${form}: recomputed once`)
    before = next
    expected++
  }

  // unstable_cache (the incremental cache handler, as ISR): 20 concurrent requests, one run.
  const legacyCold = await spread([a, b], 20, (i) => legacy(i, 'cold'))
  assert.equal(await runs(redis, 'runs:legacy:cold'), 1, 'the unstable_cache function ran once across both instances')
  assert.equal(new Set(legacyCold.map((r) => r.nonce)).size, 1)
  const sharedLegacyRuns = await runs(redis, 'runs:legacy:cold')
  timings.shared = Date.now() - started

  // Redis stopped: both instances still render, a cached page and a cold one, without a hang.
  started = Date.now()
  await redis.stop('SIGKILL')
  for (const instance of [a, b]) {
    const cached = await report(instance, 'cold')
    assert.ok(cached.nonce.length > 0)
    const down = await report(instance, 'down')
    assert.equal(down.run, -1, 'computed with no Redis (the counter itself could not count)')
    const legacyDown = await legacy(instance, 'down')
    assert.equal(legacyDown.run, -1)
  }
  timings.redisDown = Date.now() - started

  // Redis back (empty: no persistence): sharing resumes by itself. A round is 10 concurrent
  // requests, split across both, to a new cold key; sharing is back once a round runs once.
  started = Date.now()
  await redis.start()
  let rounds = 0
  await until(
    'a cold key computed once across both instances again',
    async () => {
      const k = `back-${++rounds}`
      const got = await spread([a, b], 10, (i) => report(i, k))
      return (await runs(redis, `runs:report:${k}`)) === 1 && new Set(got.map((r) => r.nonce)).size === 1
    },
    120_000,
  )
  let legacyRounds = 0
  await until(
    'a cold unstable_cache key computed once across both instances again',
    async () => {
      const k = `back-${++legacyRounds}`
      const got = await spread([a, b], 10, (i) => legacy(i, k))
      return (await runs(redis, `runs:legacy:${k}`)) === 1 && new Set(got.map((r) => r.nonce)).size === 1
    },
    120_000,
  )
  timings.redisBack = Date.now() - started
  await Promise.all([a.stop(), b.stop()])

  // ---- Next.js's own handlers, same build, same flow -----------------------------------------
  started = Date.now()
  await command(redis.port, ['FLUSHALL'])
  const defaultEnv = { ...sharedEnv, NEXT_CACHE_HANDLER: 'default' }
  const [da, db] = await Promise.all([startNext(t, defaultEnv), startNext(t, defaultEnv)])
  // A key of this run only: Next's default incremental cache also keeps entries on disk, under
  // .next/cache, which outlives a run (and which the two instances of this one machine share).
  const k = `cold-${process.pid}-${Date.now()}`
  const defaultCold = await spread([da, db], 20, (i) => report(i, k))
  const defaultColdRuns = await runs(redis, `runs:report:${k}`)
  assert.ok(defaultColdRuns >= 2, `Next.js's default handler computes at least once per instance (${defaultColdRuns} runs)`)
  assert.ok(new Set(defaultCold.map((r) => r.nonce)).size >= 2, 'the instances serve different values')
  await spread([da, db], 20, (i) => legacy(i, k))
  const defaultLegacyRuns = await runs(redis, `runs:legacy:${k}`)
  assert.ok(defaultLegacyRuns >= 2, `unstable_cache with Next.js's default handler: ${defaultLegacyRuns} runs`)
  await Promise.all([da.stop(), db.stop()])
  timings.default = Date.now() - started

  t.diagnostic(
    `runs for 20 cold requests over 2 instances: "use cache" ${sharedColdRuns} with stampede-cache/next, ${defaultColdRuns} with Next.js's default; ` +
      `unstable_cache ${sharedLegacyRuns} vs ${defaultLegacyRuns}; sharing back after Redis restart in ${rounds} round(s) ("use cache"), ${legacyRounds} (unstable_cache)`,
  )
  t.diagnostic(
    `next-cache: ${Object.entries(timings)
      .map(([k, v]) => `${k} ${v} ms`)
      .join(', ')}, total ${Date.now() - began} ms`,
  )
})
