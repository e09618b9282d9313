'use strict'
// examples/next as a user runs it: `next build`, then `next start` on a loopback port, driven over
// HTTP. The server is preloaded with a stand-in for the hosting platform's request context
// (fixtures/next-request-context.js), the hook through which Next.js hands every promise given to
// `after()` to the platform's waitUntil, as on Vercel; it logs each promise handed over and settled.
//
// Installs examples/next's own dependencies (`npm ci`, its package-lock.json) when
// examples/next/node_modules is missing: that needs the npm registry (CONTRIBUTING.md, "Tests"). The
// install is bounded (NPM_CI_TIMEOUT) and fails with a message that says so. Nothing is skipped: if
// Next.js cannot be installed or built, this test fails.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')
const { spawn } = require('node:child_process')

const app = path.join(__dirname, '..', 'examples', 'next')
const preload = path.join(__dirname, 'fixtures', 'next-request-context.js')
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Generous: a cold `npm ci` of Next.js on a loaded 2-core machine takes a minute or two.
const NPM_CI_TIMEOUT = 300_000
const BUILD_TIMEOUT = 300_000

// Runs a command to the end; rejects with its output if it fails, or (killing it) after `timeout`
// ms with `hint` saying what that likely means.
function run(cmd, args, { timeout, hint = '', ...options }) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { ...options, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      child.kill('SIGKILL')
    }, timeout)
    child.stdout.on('data', (d) => (output += d))
    child.stderr.on('data', (d) => (output += d))
    child.on('error', (err) => {
      clearTimeout(timer)
      reject(err)
    })
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      if (timedOut) reject(new Error(`${cmd} ${args.join(' ')} did not finish within ${timeout / 1000} s${hint ? ` (${hint})` : ''}:\n${output}`))
      else if (code === 0) resolve(output)
      else reject(new Error(`${cmd} ${args.join(' ')} exited with ${code ?? signal}${hint ? ` (${hint})` : ''}:\n${output}`))
    })
  })
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

async function until(what, predicate, ms = 60_000) {
  const deadline = Date.now() + ms
  for (;;) {
    if (await predicate()) return
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}

test('examples/next: next build + next start; one load for 200 cold requests; stale answered at once, refresh kept alive by after()', {
  timeout: 900_000,
}, async (t) => {
  // No REDIS_URL: the example reads it (lib/feed.ts), and a Redis from the developer's shell (a
  // shared one on 6379, keys already there) must not reach this test; it runs in-process only.
  const { REDIS_URL: _fromShell, ...shellEnv } = process.env
  const env = { ...shellEnv, NEXT_TELEMETRY_DISABLED: '1', CI: process.env.CI ?? '' }
  const timings = {}

  let started = Date.now()
  if (!fs.existsSync(path.join(app, 'node_modules'))) {
    const args = fs.existsSync(path.join(app, 'package-lock.json')) ? ['ci'] : ['install']
    await run(npm, [...args, '--no-audit', '--no-fund'], {
      cwd: app,
      env,
      timeout: NPM_CI_TIMEOUT,
      hint: 'installing examples/next needs the npm registry; see CONTRIBUTING.md, "Tests"',
    })
  }
  timings.install = Date.now() - started

  started = Date.now()
  // `npm run build`: the example's prebuild step, then `next build`.
  await run(npm, ['run', 'build'], { cwd: app, env, timeout: BUILD_TIMEOUT, hint: 'next build' })
  timings.build = Date.now() - started

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'next-wait-until-'))
  const waitUntilLog = path.join(dir, 'wait-until.log')
  fs.writeFileSync(waitUntilLog, '')
  const events = () =>
    fs
      .readFileSync(waitUntilLog, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line))

  const port = await freePort()
  const base = `http://127.0.0.1:${port}`
  started = Date.now()
  const server = spawn(process.execPath, [path.join(app, 'node_modules', 'next', 'dist', 'bin', 'next'), 'start', '-H', '127.0.0.1', '-p', String(port)], {
    cwd: app,
    env: {
      ...env,
      NODE_OPTIONS: `${env.NODE_OPTIONS ?? ''} --require ${preload}`.trim(),
      WAIT_UNTIL_LOG: waitUntilLog,
      FEED_TTL_MS: '300',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let serverOutput = ''
  server.stdout.on('data', (d) => (serverOutput += d))
  server.stderr.on('data', (d) => (serverOutput += d))
  const exited = new Promise((resolve) => server.on('exit', resolve))
  t.after(async () => {
    if (server.exitCode === null && server.signalCode === null) server.kill('SIGTERM')
    await exited
    fs.rmSync(dir, { recursive: true, force: true })
  })

  const debug = async () => (await fetch(`${base}/api/debug`)).json()
  const control = async (action) => {
    const res = await fetch(`${base}/api/debug?action=${action}`, { method: 'POST' })
    assert.equal(res.status, 200, await res.text())
  }
  const feed = async () => {
    const res = await fetch(`${base}/api/feed`)
    assert.equal(res.status, 200)
    return res.json()
  }

  await until(
    'next start to answer',
    async () => {
      if (server.exitCode !== null) throw new Error(`next start exited:\n${serverOutput}`)
      try {
        return (await fetch(`${base}/api/debug`)).ok
      } catch {
        return false
      }
    },
    120_000,
  )
  timings.start = Date.now() - started
  started = Date.now()

  // Cold: hold the query until all 200 requests wait on it.
  await control('hold')
  const cold = Promise.all(Array.from({ length: 200 }, feed))
  await until('200 waiting readers', async () => (await debug()).stats.misses === 200)
  await control('release')
  const first = await cold
  assert.ok(
    first.every((f) => f.version === 1 && f.builtAt === first[0].builtAt),
    'every request got the one loaded feed',
  )
  let state = await debug()
  assert.equal(state.started, 1, 'the loader ran once')
  assert.equal(state.stats.loads, 1)
  assert.equal(state.stats.coalesced, 199)
  assert.deepEqual(events(), [], 'a cold load is awaited by its request, not handed to after()')

  // Stale: every request is answered while the refresh's query is held shut.
  await until('the entry to go stale', async () => (await debug()).entry?.state === 'stale')
  await control('hold')
  const stale = await Promise.all(Array.from({ length: 200 }, feed))
  assert.ok(
    stale.every((f) => f.version === 1),
    'the stale value was served',
  )
  state = await debug()
  assert.equal(state.started, 2, 'exactly one refresh started')
  assert.equal(state.finished, 1, 'the responses came while the refresh was still blocked')
  assert.equal(state.stats.staleHits, 200)
  assert.deepEqual(
    events().map((e) => [e.event, e.n]),
    [['handed', 1]],
    'the refresh was handed to the platform through after() during its request, and had not settled',
  )

  // The refresh completes after the responses, and the platform's waitUntil sees it settle.
  await control('release')
  await until('the refresh to settle', async () => events().length === 2)
  assert.deepEqual(
    events().map((e) => [e.event, e.n]),
    [
      ['handed', 1],
      ['settled', 1],
    ],
  )
  state = await debug()
  assert.equal(state.started, 2)
  assert.equal(state.finished, 2)
  assert.equal(state.stats.refreshes, 1)
  assert.deepEqual(state.errors, [], 'after() accepted the refresh (it throws outside a request)')
  assert.equal((await feed()).version, 2, 'the refreshed feed is served')
  timings.requests = Date.now() - started

  server.kill('SIGTERM')
  await exited
  t.diagnostic(`next: install ${timings.install} ms, build ${timings.build} ms, start ${timings.start} ms, requests ${timings.requests} ms`)
})
