'use strict'
// Reads on a Redis Cluster take a read lane per master (src/node/lane/slot.rs `ready_node`), routed by
// the slot map the tier keeps for batches (src/store/redis/slots.rs). A stale map costs a
// redirect: the node answers MOVED, the lane hands that read to the command connection (whose
// client follows it) and the map is read again, so the next reads of the moved slot go to its
// new master's lane. Every master announces a CountingProxy (helpers/proxied-cluster.js), which
// notes what each connection sends: a lane is the connection that sends the lane's marks (ECHO
// of a sequence number; the command connection's echo is a script). redis-socket-lane.test.js
// runs this file again on the socket lane.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { ProxiedCluster } = require('./helpers/proxied-cluster')
const { parseInfo } = require('./helpers/redis-topology')
const { eventually } = require('./helpers/eventually')

const vkey = (ns, k) => `${ns}:v:{${k}}`
const mustNotLoad = () => {
  throw new Error('Redis has the value: it must come from there')
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
    onError: (err) => errors.push(err.message),
    ...options,
  })
}

/** Per master (by proxy port): the value keys its lanes (connections sending ECHO marks) were sent GETs of, and those sent elsewhere. */
function lanesRead(perMaster, namespace) {
  return new Map(
    perMaster.map(({ master, commands }) => {
      const lanes = new Set(commands.filter((c) => c.args[0] === 'ECHO').map((c) => c.conn))
      const gets = commands.filter((c) => c.args[0] === 'GET' && String(c.args[1]).startsWith(`${namespace}:v:`))
      return [
        master.proxy.port,
        {
          onLane: new Set(gets.filter((c) => lanes.has(c.conn)).map((c) => String(c.args[1]))),
          elsewhere: gets.filter((c) => !lanes.has(c.conn)).length,
        },
      ]
    }),
  )
}

async function movedErrors(master) {
  const info = parseInfo(await master.node.cmd('INFO', 'errorstats'))
  const moved = info.errorstat_MOVED
  return moved ? Number(/count=(\d+)/.exec(moved)[1]) : 0
}

/** Reads every key until the lanes carry them (they open in the background). */
async function warm(reader, namespace, keys) {
  await eventually(
    async () => {
      const seen = await pc.record(async () => {
        for (const k of keys) await reader.get(k)
      })
      return [...lanesRead(seen.perMaster, namespace).values()].every((m) => m.elsewhere === 0)
    },
    { what: 'every read on a lane' },
  )
}

test('Cluster: each read takes the lane to the master serving its key, values and counts as before', { timeout: 90_000 }, async (t) => {
  const namespace = `cl${process.pid}`
  const keys = Array.from({ length: 90 }, (_, i) => `k${i}`)
  const errors = []
  const writer = cacheFor(namespace, errors)
  const reader = cacheFor(namespace, errors, { l1: false })
  t.after(() => Promise.all([writer.close(), reader.close()]))
  for (const k of keys) await writer.set(k, { k, text: 'x'.repeat(k.length * 100) })
  await warm(reader, namespace, keys)
  const owners = await pc.ownerPorts(keys.map((k) => vkey(namespace, k)))
  const before = reader.stats()
  const seen = await pc.record(() => Promise.all(Array.from({ length: 270 }, (_, n) => reader.getOrLoad(keys[n % 90], mustNotLoad))))
  seen.result.forEach((v, n) => assert.deepEqual(v, { k: keys[n % 90], text: 'x'.repeat(keys[n % 90].length * 100) }))
  const per = lanesRead(seen.perMaster, namespace)
  for (const [port, m] of per) {
    const mine = keys.filter((_, i) => owners[i] === port).map((k) => vkey(namespace, k))
    assert.ok(mine.length > 0, `master :${port} serves some keys`)
    assert.deepEqual([...m.onLane].sort(), mine.sort(), `master :${port}: its lane read the keys it serves, and only those`)
    assert.equal(m.elsewhere, 0, `master :${port}: no GET off its lane`)
  }
  assert.equal(await reader.get('absent'), undefined)
  const after = reader.stats()
  assert.equal(after.loads, before.loads, 'no loads')
  assert.equal(after.redisErrors, 0)
  assert.deepEqual(errors, [])
})

test("Cluster: a slot moved under the lanes: its reads are redirected once (MOVED on the command connection), right, and then go to the new master's lane", {
  timeout: 90_000,
}, async (t) => {
  const namespace = `clmove${process.pid}`
  const keys = Array.from({ length: 200 }, (_, i) => `m${i}`)
  const errors = []
  const writer = cacheFor(namespace, errors)
  const reader = cacheFor(namespace, errors, { l1: false })
  t.after(() => Promise.all([writer.close(), reader.close()]))
  for (const k of keys) await writer.set(k, `v:${k}`)
  await warm(reader, namespace, keys)
  const [from, to] = pc.masters
  const vkeys = keys.map((k) => vkey(namespace, k))
  const owners = await pc.ownerPorts(vkeys)
  const slots = await pc.keySlots(vkeys)
  const slot = slots[owners.indexOf(from.proxy.port)]
  const moved = keys.filter((_, i) => slots[i] === slot)
  await pc.moveSlot(slot, from, to)

  const redirectsBefore = await movedErrors(from)
  const redisErrors = reader.stats().redisErrors
  for (let round = 0; round < 20; round++) {
    for (const k of moved) assert.equal(await reader.getOrLoad(k, mustNotLoad), `v:${k}`, `round ${round}: ${k}`)
  }
  const redirects = (await movedErrors(from)) - redirectsBefore
  assert.ok(redirects >= 1, 'the stale map sent a read to the old master')
  assert.ok(redirects <= 6, `the map was read again, not redirected every read (${redirects} MOVED for ${20 * moved.length} reads)`)
  assert.equal(reader.stats().redisErrors, redisErrors, `a redirect is not a failure: ${errors.join(' | ')}`)

  // A lane is known by its ECHO marks, and marks are amortised (up to 16 unmarked reads while
  // nothing changed): enough reads that the new master's lane writes at least one.
  const seen = await pc.record(async () => {
    for (let round = 0; round < 20; round++) {
      for (const k of moved) assert.equal(await reader.get(k), `v:${k}`)
    }
  })
  const onNew = lanesRead(seen.perMaster, namespace).get(to.proxy.port)
  assert.deepEqual([...onNew.onLane].sort(), moved.map((k) => vkey(namespace, k)).sort(), "the moved keys are read on the new master's lane")
  assert.deepEqual(errors, [])
})
