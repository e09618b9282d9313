'use strict'
// Runtimes (docs/CONTRACT.md, "Runtimes"): the whole API, the Redis tier included, under Node, Bun
// and Deno. Bun and Deno come from the npm registry as ordinary dev dependencies
// (@oven/bun-linux-x64, @deno/linux-x64-glibc). The package is installed by name into a scratch
// folder (its `files` and the built addon, as npm would lay it out), and
// __test__/runtimes/smoke.mjs runs there under each runtime against a private redis-server.
// Bun exports libuv's names as aborting stubs and Deno's loop never polls them: there the libuv
// read lane must stay off, and reads take the socket lane (a socket of the runtime's own,
// lib/lane.js) with every guarantee.
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const { RedisServer, killAllSync } = require('./helpers/redis-server')
const { RedisCluster, killTopologySync } = require('./helpers/redis-topology')

after(() => {
  killAllSync()
  killTopologySync()
})

const ROOT = path.join(__dirname, '..')
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'))

function binary(name, rel) {
  const p = path.join(ROOT, 'node_modules', name, rel)
  assert.ok(fs.existsSync(p), `${name} is a dev dependency: run npm install (${p} is missing)`)
  return p
}

const RUNTIMES = {
  node: () => [process.execPath, []],
  bun: () => [binary('@oven/bun-linux-x64', 'bin/bun'), []],
  deno: () => [binary('@deno/linux-x64-glibc', 'deno'), ['run', '--allow-all']],
}

let redis
let cluster
let scratch
const ready = (async () => {
  redis = new RedisServer()
  await redis.start()
  cluster = await new RedisCluster({ masters: 3, replicasPerMaster: 0 }).start()
  // The package as installed by name: its published files plus the addon built here.
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-runtimes-'))
  const dest = path.join(scratch, 'node_modules', 'stampede-cache')
  fs.mkdirSync(dest, { recursive: true })
  for (const f of [...pkg.files, 'package.json']) fs.cpSync(path.join(ROOT, f), path.join(dest, f), { recursive: true })
  for (const f of fs.readdirSync(ROOT).filter((f) => f.endsWith('.node'))) fs.copyFileSync(path.join(ROOT, f), path.join(dest, f))
  fs.writeFileSync(path.join(scratch, 'package.json'), JSON.stringify({ private: true, type: 'module', dependencies: { 'stampede-cache': '*' } }))
  // Deno resolves npm packages from node_modules as laid out here.
  fs.writeFileSync(path.join(scratch, 'deno.json'), JSON.stringify({ nodeModulesDir: 'manual' }))
  fs.copyFileSync(path.join(__dirname, 'runtimes', 'smoke.mjs'), path.join(scratch, 'smoke.mjs'))
})()
after(async () => {
  redis?.dispose()
  await cluster?.dispose()
  if (scratch) fs.rmSync(scratch, { recursive: true, force: true })
})

/** Runs `args` under runtime `name` (`bin`) in `cwd` to its end: it must exit 0; `seen`: the JSON of its last line. */
function runUnder(name, bin, args, cwd, env = {}) {
  const r = spawnSync(bin, args, {
    cwd,
    encoding: 'utf8',
    timeout: 90_000,
    env: { ...process.env, NO_COLOR: '1', DENO_NO_UPDATE_CHECK: '1', ...env },
  })
  assert.equal(r.signal, null, `${name} was killed by ${r.signal}: ${r.stderr}`)
  assert.equal(r.status, 0, `${name} exited ${r.status}: ${r.stderr}`)
  return { seen: JSON.parse(r.stdout.trim().split('\n').pop()), r }
}

for (const [name, command] of Object.entries(RUNTIMES)) {
  test(`${name}: the API with Redis, with and without the in-process tier, and a Cluster's reads`, { timeout: 120_000 }, async () => {
    await ready
    const [bin, args] = command()
    const { seen } = runUnder(name, bin, [...args, 'smoke.mjs', redis.url, cluster.seedUrls.join(',')], scratch)
    const { cluster: onCluster, ...single } = seen
    const where = `${name} cluster: ${JSON.stringify(onCluster)}`
    assert.equal(onCluster.wrong, 0, `every read its own key's value: ${where}`)
    assert.equal(onCluster.loads, 0, where)
    assert.equal(onCluster.redisErrors, 0, where)
    assert.ok(
      onCluster.lanes.every((n) => n >= 1),
      `a read lane on every master: ${where}`,
    )
    for (const [label, s] of Object.entries(single)) {
      const where = `${name} ${label}: ${JSON.stringify(s)}`
      assert.deepEqual(s.coldValues, [1], `one value for every cold read: ${where}`)
      assert.equal(s.missing, 0, `no read lost: ${where}`)
      assert.equal(s.w, 2, `read your writes: ${where}`)
      assert.equal(s.stale, 1, `the stale value at once: ${where}`)
      assert.equal(s.refreshed, 2, `refreshed once: ${where}`)
      assert.equal(s.loads, 2, where)
      assert.equal(s.tagGone, true, where)
      assert.equal(s.nested, 'same,other,many', `a loader's nested calls of its key answer with their own results: ${where}`)
      assert.equal(s.nestedFast, true, `at once, not after loadTimeout: ${where}`)
      assert.equal(s.nestedKept, 'same,other,many', `the enclosing load wrote the key: ${where}`)
      assert.equal(s.keyCode, 'ERR_INVALID_KEY', where)
      assert.equal(s.closedCode, 'ERR_CLOSED', where)
      assert.equal(s.redisErrors, 0, where)
      if (label === 'noL1') assert.ok(s.lanes >= 1, `reads from Redis take the read lane: ${where}`)
    }
  })
}

// The hostile wire under Bun and Deno, where reads take the socket lane: the scenarios of
// redis-wire.test.js (fixtures/wire-client.js) that move, repeat or flood the lane's replies.
for (const name of ['bun', 'deno']) {
  for (const scenario of ['extra-nil', 'duplicate', 'same-key-replay', 'push', 'huge']) {
    test(`${name}: ${scenario} on the read lane: no crash, never another key's value, nothing wrong kept`, { timeout: 120_000 }, async () => {
      await ready
      const [bin, args] = RUNTIMES[name]()
      // The fixture is CommonJS.
      const runArgs = name === 'deno' ? [...args, '--unstable-detect-cjs'] : args
      const { seen, r } = runUnder(name, bin, [...runArgs, path.join(__dirname, 'fixtures', 'wire-client.js'), String(redis.port), scenario], ROOT)
      assert.ok(seen.tampered >= 1, `the fault was injected: ${r.stdout}`)
      assert.equal(seen.wrong, 0, `reads that returned another key's value: ${r.stdout}`)
      assert.equal(seen.finalWrong, 0, `wrong values kept in process: ${r.stdout}`)
      for (const f of seen.floods || []) assert.ok(f.closedAfter !== null && f.closedAfter < 10_000, `closed after ${f.closedAfter} ms: ${r.stdout}`)
    })
  }
}

// A cache collected without close() while its read lane is open: no JS runs in its finalizer
// (which Bun and Deno may not allow), and the lane's socket is ended all the same, at the next
// lane call of a cache still open. Node runs it on the socket lane (STAMPEDE_CACHE_LANE=socket).
for (const [name, gcArgs, env] of [
  ['node', ['--expose-gc'], { STAMPEDE_CACHE_LANE: 'socket' }],
  ['bun', [], {}],
  ['deno', ['--unstable-detect-cjs', '--v8-flags=--expose-gc'], {}],
]) {
  test(`${name}: a cache collected with its socket lane open: no crash, and the lane closes`, { timeout: 120_000 }, async () => {
    await ready
    const [bin, args] = RUNTIMES[name]()
    const fixture = path.join(__dirname, 'fixtures', 'collected-lane.js')
    const { seen } = runUnder(name, bin, [...args, ...gcArgs, fixture, redis.url], ROOT, env)
    assert.equal(seen.both, 2, `both caches read on a lane: ${JSON.stringify(seen)}`)
    assert.equal(seen.after, 1, `the collected cache's lane closed: ${JSON.stringify(seen)}`)
  })
}

// The socket lane's flow against a stopped Redis (fixtures/lane-flow.js): a read in flight holds
// the process until it is answered, and then the idle lane lets it exit; requests far larger than
// the socket takes while Redis reads nothing are written whole, in order, as it drains. Node runs
// it on the socket lane (STAMPEDE_CACHE_LANE=socket); Bun on its own TCP API, Deno on `node:net`.
for (const [name, extra, env] of [
  ['node', [], { STAMPEDE_CACHE_LANE: 'socket' }],
  ['bun', [], {}],
  ['deno', ['--unstable-detect-cjs'], {}],
]) {
  test(`${name}: a socket lane holds the process for a read in flight, then lets it go; what the socket cannot take at once is written`, {
    timeout: 120_000,
  }, async () => {
    await ready
    const [bin, args] = RUNTIMES[name]()
    const fixture = path.join(__dirname, 'fixtures', 'lane-flow.js')
    const run = (scenario) => {
      try {
        return runUnder(name, bin, [...args, ...extra, fixture, String(redis.port), String(redis.proc.pid), scenario], ROOT, env)
      } finally {
        // Never leave the server stopped, whatever the fixture did.
        redis.proc.kill('SIGCONT')
      }
    }
    const held = run('hold').seen
    assert.equal(held.lanes, 1, `the reads took the lane: ${JSON.stringify(held)}`)
    assert.equal(held.late, 'v', `the read in flight was answered before the process exited: ${JSON.stringify(held)}`)
    assert.deepEqual(held.errors, [], JSON.stringify(held))
    const flooded = run('backpressure').seen
    assert.equal(flooded.lanes, 1, JSON.stringify(flooded))
    assert.equal(flooded.wrong, 0, `every value its own key's: ${JSON.stringify(flooded)}`)
    assert.equal(flooded.found, 100, JSON.stringify(flooded))
    assert.deepEqual(flooded.errors, [], `nothing timed out or failed: ${JSON.stringify(flooded)}`)
    assert.equal(flooded.lanesAfter, 1, `the lane stayed open: ${JSON.stringify(flooded)}`)
  })
}

// Worker threads reading on a lane, terminated from outside (fixtures/lane-worker.js): the
// process goes on and exits cleanly. Node on its libuv lane (on the socket lane, a worker
// terminated with reads in flight still aborts now and then: its finalizer asks them again of a
// Tokio runtime already shut down).
for (const [name, extra, env] of [
  ['node', [], {}],
  ['bun', [], {}],
  ['deno', ['--unstable-detect-cjs'], {}],
]) {
  test(`${name}: a worker thread reading on a lane, terminated, takes nothing down with it`, { timeout: 120_000 }, async () => {
    await ready
    const [bin, args] = RUNTIMES[name]()
    const fixture = path.join(__dirname, 'fixtures', 'lane-worker.js')
    const { seen } = runUnder(name, bin, [...args, ...extra, fixture, redis.url], ROOT, env)
    assert.deepEqual(seen.values, ['ok', 'ok', 'ok'])
  })
}
