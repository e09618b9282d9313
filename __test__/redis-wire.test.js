'use strict'
// What no bytes can do (docs/CONTRACT.md, "What no bytes and no option can do"): a fault-injecting
// proxy between a cache and a private redis-server sends extra replies of every RESP type, a
// push frame, nesting 300,000 deep and a declared length of 1e12 followed by a flood of bytes.
// Each scenario runs in its own process (fixtures/wire-client.js), on the read lane and on the
// command connection (STAMPEDE_CACHE_NO_LANE=1): the process must exit normally, no read may
// return another key's value, nothing wrong may stay in process, and memory must not follow a
// declared length: the connection that reads one closes at once.
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { RedisServer, killAllSync } = require('./helpers/redis-server')

after(() => killAllSync())

const CLIENT = path.join(__dirname, 'fixtures', 'wire-client.js')
const SCENARIOS = ['extra-status', 'extra-integer', 'extra-error', 'extra-nil', 'duplicate', 'same-key-replay', 'push', 'deep', 'huge']

let redis
const started = (async () => {
  redis = new RedisServer()
  await redis.start()
})()
after(() => redis?.dispose())

function runClient(scenario, env) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLIENT, String(redis.port), scenario], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => (out += d))
    child.stderr.on('data', (d) => (err += d))
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000)
    child.on('error', reject)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, out, err })
    })
  })
}

for (const [path_, env] of [
  ['read lane', {}],
  ['command connection', { STAMPEDE_CACHE_NO_LANE: '1' }],
]) {
  for (const scenario of SCENARIOS) {
    test(`${path_}: ${scenario}: no crash, never another key's value, nothing wrong kept`, { timeout: 90_000 }, async () => {
      await started
      const { code, signal, out, err } = await runClient(scenario, env)
      assert.equal(signal, null, `the process was killed by ${signal}: ${err.slice(-2000)}`)
      assert.equal(code, 0, `exit ${code}: ${err.slice(-2000)}`)
      const r = JSON.parse(out.trim().split('\n').pop())
      assert.ok(r.tampered >= 1, `the fault was injected: ${out}`)
      assert.equal(r.wrong, 0, `reads that returned another key's value: ${out}`)
      assert.equal(r.finalWrong, 0, `wrong values kept in process: ${out}`)
      if (scenario !== 'huge') {
        assert.ok(r.rssGrowth < 256 * 1024 * 1024, `memory grew by ${r.rssGrowth} bytes`)
        return
      }
      // The declared terabyte: the connection that got it closes on its header, long before
      // the 20 s command timeout, having taken little of the flood; memory stays flat; and
      // the cache connects again.
      assert.ok(r.floods.length >= 1, `flooded: ${out}`)
      for (const f of r.floods) {
        assert.ok(f.closedAfter !== null && f.closedAfter < 5_000, `closed after ${f.closedAfter} ms: ${out}`)
        assert.ok(f.sent < 256 * 1024 * 1024, `filler taken before closing: ${f.sent}`)
      }
      assert.ok(r.rssGrowth < 64 * 1024 * 1024, `memory grew by ${r.rssGrowth} bytes`)
      assert.ok(r.reconnectedAfter !== null && r.reconnectedAfter < 5_000, `a new connection after the fault: ${out}`)
    })
  }
}
