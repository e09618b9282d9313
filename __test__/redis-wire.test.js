'use strict'
// What no bytes can do (docs/CONTRACT.md, "What no bytes and no option can do"): a fault-injecting
// proxy between a cache and a private redis-server sends extra replies of every RESP type, a
// push frame, nesting 300,000 deep and a declared length of 1e12 followed by a flood of bytes.
// Each scenario runs in its own process (fixtures/wire-client.js), on the read lane, on the
// socket lane (STAMPEDE_CACHE_LANE=socket: the runtime's own socket, as Bun and Deno read) and on
// the command connection (STAMPEDE_CACHE_NO_LANE=1): the process must exit normally, no read may
// return another key's value, nothing wrong may stay in process, and memory must not follow a
// declared length: the connection that reads one closes at once.
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { runNode } = require('./helpers/child')
const { RedisServer, killAllSync } = require('./helpers/redis-server')
const { eventually } = require('./helpers/eventually')
const { loadOvertakenBySet } = require('./helpers/overtaken')

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
  return runNode([CLIENT, String(redis.port), scenario], { ...process.env, ...env })
}

for (const [path_, env] of [
  ['read lane', {}],
  ['socket lane', { STAMPEDE_CACHE_LANE: 'socket' }],
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
      // the cache connects again. The bounds are half the command timeout: a close by the
      // timeout would take all of it, and a loaded 2-core machine can stall a child for seconds.
      assert.ok(r.floods.length >= 1, `flooded: ${out}`)
      for (const f of r.floods) {
        assert.ok(f.closedAfter !== null && f.closedAfter < 10_000, `closed after ${f.closedAfter} ms: ${out}`)
        assert.ok(f.sent < 256 * 1024 * 1024, `filler taken before closing: ${f.sent}`)
      }
      assert.ok(r.rssGrowth < 64 * 1024 * 1024, `memory grew by ${r.rssGrowth} bytes`)
      assert.ok(r.reconnectedAfter !== null && r.reconnectedAfter < 10_000, `a new connection after the fault: ${out}`)
    })
  }
}

// The declared terabyte on a connection of a cache that reads nothing after it: the connection
// closes on the header, not when a later read would replace it (there is none).
for (const [path_, env] of [
  ['read lane', {}],
  ['socket lane', { STAMPEDE_CACHE_LANE: 'socket' }],
  ['command connection', { STAMPEDE_CACHE_NO_LANE: '1' }],
]) {
  test(`${path_}: huge, then idle: the flooded connection closes all the same`, { timeout: 90_000 }, async () => {
    await started
    const { code, signal, out, err } = await runClient('huge-idle', env)
    assert.equal(signal, null, `killed by ${signal}: ${err}`)
    assert.equal(code, 0, `exit ${code}: ${err}`)
    const r = JSON.parse(out.trim().split('\n').pop())
    assert.ok(r.got === 'value' || r.got === undefined, `read ${r.got}: ${out}`)
    assert.equal(r.floods.length, 1, `flooded once: ${out}`)
    const [f] = r.floods
    assert.ok(f.closedAfter !== null && f.closedAfter < 10_000, `closed after ${f.closedAfter} ms: ${out}`)
    assert.ok(f.sent < 256 * 1024 * 1024, `filler taken before closing: ${f.sent}`)
  })
}

// A script's reply moved by one: an extra integer reply in front of a load's write-back, whose
// own reply says it was fenced out (a set of the key since the load began). Read as written, the
// load's older value would be kept in process over the set's; proven out of step by the mark
// every script returns in its own reply, the write-back counts as dropped and nothing is kept.
// Bus messages to the reader are withheld, so only the write-back's reply decides.
test('command connection: a write-back reply moved by an extra reply is not read as written', { timeout: 90_000 }, async () => {
  await started
  const { StampedeCache } = require('..')
  const { FaultProxy } = require('./helpers/fault-proxy')
  const namespace = `wireshift${process.pid}`
  const proxy = await new FaultProxy(redis.port).start()
  let injectInteger = false
  proxy.tamperEvery((chunk) => {
    // The bus's messages (RESP3 pushes): the reader hears no announcement.
    if (chunk.toString('latin1', 0, 16).startsWith('>3\r\n$7\r\nmessage')) return Buffer.alloc(0)
    // The write-back's reply, {written, announced, mark}: an array of three opening with an integer.
    if (injectInteger && chunk.toString('latin1', 0, 5) === '*3\r\n:') {
      injectInteger = false
      return Buffer.concat([Buffer.from(':1\r\n'), chunk])
    }
    return null
  })
  const errors = []
  const reader = new StampedeCache({
    redis: { url: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 2_000 },
    namespace,
    ttl: 600_000,
    onError: (err) => errors.push(err.message),
  })
  const writer = new StampedeCache({ redis: `redis://127.0.0.1:${redis.port}`, namespace, ttl: 600_000, l1: false })
  try {
    await reader.get('warm')
    const read = await loadOvertakenBySet(reader, writer, 'k', () => {
      injectInteger = true
    })
    assert.equal(read, 'loaded before the set', "the caller gets its own load's value")
    // The write-back goes on after the caller has its value.
    await eventually(() => !injectInteger, { what: 'the extra reply injected' })
    await new Promise((r) => setTimeout(r, 200))
    // Whatever the reader kept must not be the load's value: the set came after it began.
    const after = await reader.get('k')
    assert.notEqual(after, 'loaded before the set', `kept the fenced-out value; errors: ${errors.join(' | ')}`)
  } finally {
    await reader.close()
    await writer.close()
    await proxy.close()
  }
})

// A tag clock read off a moved reply (fixtures/wire-client.js, tag-clock-moved): an entry
// deleted by tag, or a load's result whose tag was deleted after it, is never served; the moved
// replies are counted and reported. On both read paths (a tagged entry's clocks are read on the
// command connection either way).
for (const [path_, env] of [
  ['read lane', {}],
  ['socket lane', { STAMPEDE_CACHE_LANE: 'socket' }],
  ['command connection', { STAMPEDE_CACHE_NO_LANE: '1' }],
]) {
  test(`${path_}: a tag clock read off a moved reply never serves an entry deleted by tag`, { timeout: 90_000 }, async () => {
    await started
    const { code, signal, out, err } = await runClient('tag-clock-moved', env)
    assert.equal(signal, null, `the process was killed by ${signal}: ${err.slice(-2000)}`)
    assert.equal(code, 0, `exit ${code}: ${err.slice(-2000)}`)
    const r = JSON.parse(out.trim().split('\n').pop())
    assert.ok(r.moved.tagRead === 1 && r.moved.clockRead === 1, `the replies were moved: ${out}`)
    assert.deepEqual(r.served, [], `entries deleted by tag were served: ${out}`)
    assert.ok(r.redisErrors >= 2, `the moved replies were counted: ${out}`)
  })
}

// A step of clear()'s sweep answered by a reply that is not its own: a proxy puts one in front of
// the SCAN's (a SCAN-shaped "done, nothing found", or an integer). Read as the SCAN's, the sweep
// would end with the namespace's keys left in Redis, and clear() would resolve all the same; a
// reader that has not heard the clear on the bus yet (here: never, its bus messages are withheld)
// would serve them. Proven out of step by the echo sent with every sweep step, the step runs again
// on a new connection: once clear() resolved, no entry written before it is served by anyone.
for (const [shape, extra] of [
  ['a SCAN-shaped "done"', '*2\r\n$1\r\n0\r\n*0\r\n'],
  ['an integer', ':7\r\n'],
]) {
  test(`command connection: an extra reply (${shape}) in front of clear()'s SCAN leaves no entry served after it`, { timeout: 90_000 }, async () => {
    await started
    const { StampedeCache } = require('..')
    const { FaultProxy } = require('./helpers/fault-proxy')
    const namespace = `wiresweep${process.pid}${extra.length}`
    const clearerProxy = await new FaultProxy(redis.port).start()
    const readerProxy = await new FaultProxy(redis.port).start()
    // The reader's bus hears nothing (RESP3 pushes dropped): only Redis's keys decide what it serves.
    readerProxy.tamperEvery((chunk) => (chunk.toString('latin1', 0, 16).startsWith('>3\r\n$7\r\nmessage') ? Buffer.alloc(0) : null))
    const errors = []
    const clearer = new StampedeCache({
      redis: { url: `redis://127.0.0.1:${clearerProxy.port}`, commandTimeout: 2_000 },
      namespace,
      ttl: 600_000,
      onError: (err) => errors.push(err.message),
    })
    const reader = new StampedeCache({ redis: `redis://127.0.0.1:${readerProxy.port}`, namespace, ttl: 600_000, l1: false })
    const keys = Array.from({ length: 40 }, (_, i) => `k${i}`)
    try {
      for (const k of keys) await clearer.set(k, `old ${k}`)
      for (const k of keys) assert.equal(await reader.get(k), `old ${k}`)
      clearerProxy.tamperReplyTo(
        (request) => request.includes('\r\nSCAN\r\n'),
        (reply) => Buffer.concat([Buffer.from(extra), reply]),
      )
      await clearer.clear()
      assert.equal(clearerProxy.tampered, 1, 'the extra reply was injected')
      const served = []
      for (const k of keys) {
        const v = await reader.get(k)
        if (v !== undefined) served.push(`${k}=${v}`)
      }
      assert.deepEqual(served, [], `entries written before clear() served after it resolved; errors: ${errors.join(' | ')}`)
      assert.ok(
        errors.some((e) => /out of step/.test(e)),
        `the moved reply was reported: ${errors.join(' | ')}`,
      )
    } finally {
      await clearer.close()
      await reader.close()
      await clearerProxy.close()
      await readerProxy.close()
    }
  })
}
