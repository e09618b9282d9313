'use strict'
// A batch on Redis Cluster goes in one pipeline per node, not per slot: getOrLoadMany's reads in
// one round trip per master and its lock bids in one more, whatever slots its keys hash to. The
// cluster is 3 masters, each announcing a counting proxy as its address, so what the cache sends
// each node is counted there from outside: pipelines (each ends with the library's keyed echo),
// the keys in them, and round trips (a client sending after the node answered). A slot moved to
// another master under the cache (its slot map stale) costs a redirect, never a key: every key
// still reads right, is loaded once, and the next batch goes by node again.

const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { ProxiedCluster, echoedPipelines, isEcho } = require('./helpers/proxied-cluster')
const { killTopologySync } = require('./helpers/redis-topology')
const { eventually } = require('./helpers/eventually')

process.on('exit', killTopologySync)

const N = 300
/**
 * The lock bid's hash, as the redis crate sends it: the script's text is the envelope.lua
 * functions it calls and cold_gate.lua (src/store/redis/scripts.rs), so its hash is learned from
 * a cold batch's bids (`warmUp`), not computed here.
 */
let coldGateSha = null

const vkey = (ns, k) => `${ns}:v:{${k}}`
const valueOf = (k) => ({ key: k, at: k.length })
const mustNotLoad = () => {
  throw new Error('a warm batch called loadMany')
}

let pc

before(
  async () => {
    pc = await new ProxiedCluster().start()
  },
  { timeout: 90_000 },
)

after(() => pc && pc.dispose())

function cacheFor(namespace, errors, options = {}) {
  const { StampedeCache } = require('..')
  return new StampedeCache({
    redis: { cluster: pc.seedUrls, commandTimeout: 5_000 },
    namespace,
    ttl: 600_000,
    lockTtl: 20_000,
    l1: false,
    onError: (err) => errors.push(err.message),
    ...options,
  })
}

/** A cold batch of other keys: connected, the slot map read and the lock bid's script loaded on every node it reaches; learns the bid's hash. */
async function warmUp(cache, namespace) {
  const { perMaster } = await pc.record(() => cache.getOrLoadMany(['other:1', 'other:2'], (missing) => missing.map(valueOf)))
  const bid = perMaster.flatMap((m) => m.commands.map((c) => c.args)).find((a) => a[0] === 'EVALSHA' && a[3] === vkey(namespace, 'other:1'))
  assert.ok(bid, "the warm-up's lock bid for other:1")
  coldGateSha = bid[1]
}

/** Per master: its batch read pipelines (GETs of value keys) and lock bid pipelines, the keys in each kind, echoes and round trips. */
function tally(perMaster, namespace) {
  return perMaster.map(({ master, commands, rounds }) => {
    const pipes = echoedPipelines(commands)
    const isGet = (a) => a[0] === 'GET' && a[1].startsWith(`${namespace}:v:`)
    const isBid = (a) => a[0] === 'EVALSHA' && a[1] === coldGateSha
    const reads = pipes.filter((p) => p.commands.some(isGet))
    const bids = pipes.filter((p) => p.commands.some(isBid))
    return {
      port: master.proxy.port,
      reads: reads.length,
      bids: bids.length,
      read: reads.flatMap((p) => p.commands.filter(isGet).map((a) => a[1])).sort(),
      bid: bids.flatMap((p) => p.commands.filter(isBid).map((a) => a[3])).sort(),
      echoes: commands.filter((c) => isEcho(c.args)).length,
      rounds,
    }
  })
}

/** Waits until the loads' write-backs are in and their locks released. */
async function settled(cache, namespace, keys) {
  await eventually(async () => (await cache.getMany(keys)).every((v) => v !== undefined), { what: 'every value written back' })
  await eventually(
    async () => {
      for (const { node } of pc.masters) if ((await node.cmd('KEYS', `${namespace}:lock:*`)).length > 0) return false
      return true
    },
    { what: 'every lock released' },
  )
}

test('a cold and a warm getOrLoadMany of 300 keys on 3 masters: one read pipeline and one bid pipeline per node', { timeout: 60_000 }, async () => {
  const namespace = `cbatch${process.pid}`
  const keys = Array.from({ length: N }, (_, i) => `item:${i}`)
  const errors = []
  const cache = cacheFor(namespace, errors)
  try {
    // Connected, the slot map read and the lock bid's script loaded on every node, on other keys.
    await warmUp(cache, namespace)
    const owners = await pc.ownerPorts(keys.map((k) => vkey(namespace, k)))
    const mine = (port) =>
      keys
        .filter((_, i) => owners[i] === port)
        .map((k) => vkey(namespace, k))
        .sort()
    const slots = new Set(await pc.keySlots(keys.map((k) => vkey(namespace, k))))
    assert.ok(slots.size > 250, `the keys span many slots (${slots.size})`)

    const loads = []
    const cold = await pc.record(() =>
      cache.getOrLoadMany(keys, (missing) => {
        loads.push([...missing])
        return missing.map(valueOf)
      }),
    )
    assert.deepEqual(cold.result, keys.map(valueOf), 'every value right, per key')
    assert.equal(loads.length, 1, 'one loadMany')
    assert.deepEqual(loads[0], keys, 'every key loaded, once, in order')
    for (const t of tally(cold.perMaster, namespace)) {
      assert.ok(mine(t.port).length > 50, `:${t.port} serves some of the keys`)
      assert.equal(t.reads, 1, `:${t.port}: one read pipeline (got ${t.reads})`)
      assert.equal(t.bids, 1, `:${t.port}: one lock bid pipeline (got ${t.bids})`)
      assert.deepEqual(t.read, mine(t.port), `:${t.port}: read its own keys, each once`)
      assert.deepEqual(t.bid, mine(t.port), `:${t.port}: bid for its own keys, each once`)
    }

    await settled(cache, namespace, keys)
    const warm = await pc.record(() => cache.getOrLoadMany(keys, mustNotLoad))
    assert.deepEqual(warm.result, keys.map(valueOf), 'warm: every value right, per key, from Redis')
    for (const t of tally(warm.perMaster, namespace)) {
      assert.equal(t.reads, 1, `warm :${t.port}: one read pipeline (got ${t.reads})`)
      assert.equal(t.echoes, 1, `warm :${t.port}: one pipeline in all (got ${t.echoes} echoes)`)
      assert.equal(t.rounds, 1, `warm :${t.port}: one round trip (got ${t.rounds})`)
      assert.equal(t.bids, 0)
      assert.deepEqual(t.read, mine(t.port), `warm :${t.port}: read its own keys, each once`)
    }
    assert.deepEqual(errors, [])
  } finally {
    await cache.close()
  }
})

/** `count` slots of `keys`' value keys that master `from` serves, as many keys of each as there are. */
async function slotsServedBy(from, namespace, keys, count) {
  const vkeys = keys.map((k) => vkey(namespace, k))
  const [slots, owners] = [await pc.keySlots(vkeys), await pc.ownerPorts(vkeys)]
  const out = []
  for (let i = 0; i < keys.length && out.length < count; i++) {
    if (owners[i] === from.proxy.port && !out.includes(slots[i])) out.push(slots[i])
  }
  assert.equal(out.length, count, 'enough slots on the source master')
  return out
}

test('slots moved to another master under a warm batch: every key reads right, the next batch goes by node again', { timeout: 90_000 }, async () => {
  const namespace = `cbmove${process.pid}`
  const keys = Array.from({ length: N }, (_, i) => `moved:${i}`)
  const errors = []
  const cache = cacheFor(namespace, errors)
  try {
    assert.deepEqual(await cache.getOrLoadMany(keys, (missing) => missing.map(valueOf)), keys.map(valueOf))
    await settled(cache, namespace, keys)
    const [from, to] = pc.masters
    for (const slot of await slotsServedBy(from, namespace, keys, 3)) await pc.moveSlot(slot, from, to)

    const redisErrors = cache.stats().redisErrors
    const stale = await pc.record(() => cache.getOrLoadMany(keys, mustNotLoad))
    assert.deepEqual(stale.result, keys.map(valueOf), 'every key its own value, none loaded')
    assert.deepEqual(await cache.getMany(keys), keys.map(valueOf), 'getMany too')
    assert.equal(cache.stats().redisErrors, redisErrors, `a redirect is not a failure: ${errors.join(' | ')}`)
    const t = tally(stale.perMaster, namespace)
    assert.ok(
      t.reduce((s, x) => s + x.reads, 0) > pc.masters.length,
      `the refused node pipeline was sent again by slot (read pipelines: ${t.map((x) => x.reads)})`,
    )

    const owners = await pc.ownerPorts(keys.map((k) => vkey(namespace, k)))
    const again = await pc.record(() => cache.getOrLoadMany(keys, mustNotLoad))
    assert.deepEqual(again.result, keys.map(valueOf))
    for (const x of tally(again.perMaster, namespace)) {
      const mine = keys.filter((_, i) => owners[i] === x.port).map((k) => vkey(namespace, k))
      assert.equal(x.reads, 1, `after the move :${x.port}: one read pipeline (got ${x.reads})`)
      assert.deepEqual(x.read, mine.sort(), `after the move :${x.port}: the keys it serves now`)
    }
    assert.deepEqual(errors, [])
  } finally {
    await cache.close()
  }
})

// The slots move between a cold batch's read and its lock bids: the bid pipeline is held at the
// proxy until they have. The node runs the bids of its keys and refuses the moved ones (MOVED);
// the redis crate sends the whole pipeline to the new owner, which runs those and refuses the
// rest, and so on until its retries are spent: some of the locks are this cache's by then. They
// are given back before the keys bid again per slot, or each such key would find its own lock
// held and wait out lockTtl, then load again.
test("slots moved between a cold batch's reads and its lock bids: each key loaded once, every lock let go", { timeout: 90_000 }, async () => {
  const namespace = `cbbid${process.pid}`
  const keys = Array.from({ length: N }, (_, i) => `bid:${i}`)
  const errors = []
  const cache = cacheFor(namespace, errors)
  try {
    // The slot map read, on a batch of other keys.
    await warmUp(cache, namespace)
    const [from, to] = pc.masters
    const slots = await slotsServedBy(from, namespace, keys, 3)
    const held = from.proxy.holdNext((chunk) => chunk.includes(coldGateSha))
    const moved = held.then(async ({ release }) => {
      for (const slot of slots) await pc.moveSlot(slot, from, to)
      release()
    })
    const loads = []
    const { result: got, perMaster } = await pc.record(() =>
      cache.getOrLoadMany(keys, (missing) => {
        loads.push([...missing])
        return missing.map(valueOf)
      }),
    )
    await moved
    const t = tally(perMaster, namespace)
    assert.ok(t.reduce((s, x) => s + x.bids, 0) > pc.masters.length, `the refused bid pipeline was sent again by slot (bid pipelines: ${t.map((x) => x.bids)})`)
    assert.deepEqual(got, keys.map(valueOf), 'every value right, per key')
    assert.equal(loads.length, 1, `one loadMany (got ${loads.map((l) => l.length)} keys in each)`)
    assert.deepEqual(loads[0], keys)
    await settled(cache, namespace, keys)
    assert.deepEqual(await cache.getOrLoadMany(keys, mustNotLoad), keys.map(valueOf))
    assert.deepEqual(errors, [])
  } finally {
    await cache.close()
  }
})
