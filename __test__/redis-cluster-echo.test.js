'use strict'
// Alignment on Redis Cluster: every script call, clock read and GET on a Cluster travels with an
// echo that routes with it (echo.lua declaring the command's key), so a reply moved by an extra
// one in front is caught there as on a single server. The Cluster is one redis-server in cluster
// mode owning every slot, announcing a fault-injecting proxy's port as its own: the cache
// discovers the node through CLUSTER SLOTS and then speaks to it only through the proxy.

const { test, after, before } = require('node:test')
const assert = require('node:assert/strict')
const { RedisNode, killTopologySync } = require('./helpers/redis-topology')
const { FaultProxy } = require('./helpers/fault-proxy')
const { eventually } = require('./helpers/eventually')
const { loadOvertakenBySet } = require('./helpers/overtaken')

process.on('exit', killTopologySync)

let node
let proxy

before(async () => {
  node = new RedisNode('cluster-echo', {
    conf: async (port) => ['cluster-enabled yes', `cluster-config-file nodes-${port}.conf`, 'cluster-node-timeout 1000'],
  })
  await node.start()
  await node.cmd('CLUSTER', 'ADDSLOTSRANGE', '0', '16383')
  proxy = await new FaultProxy(node.port).start()
  await node.cmd('CONFIG', 'SET', 'cluster-announce-ip', '127.0.0.1')
  await node.cmd('CONFIG', 'SET', 'cluster-announce-port', String(proxy.port))
  await eventually(async () => /cluster_state:ok/.test(await node.cmd('CLUSTER', 'INFO')), { what: 'the one-node cluster ok' })
  const slots = await node.cmd('CLUSTER', 'SLOTS')
  assert.equal(Number(slots[0][2][1]), proxy.port, 'the node announces the proxy')
})

after(async () => {
  if (proxy) await proxy.close()
  if (node) await node.dispose()
})

/** A cache that finds the node as a Cluster and then speaks to it only through the proxy. */
function clusterReader(namespace, errors, options = {}) {
  const { StampedeCache } = require('..')
  return new StampedeCache({
    redis: { cluster: [`redis://127.0.0.1:${proxy.port}`], commandTimeout: 2_000 },
    namespace,
    ttl: 600_000,
    onError: (err) => errors.push(err.message),
    ...options,
  })
}

/** The bulk string of the last value reply the proxy passed (a key's value as it was then). */
function lastValueReply() {
  const reply = proxy.bulks.findLast((b) => b.includes('"old"'))
  assert.ok(reply, 'the old reply recorded')
  return reply.subarray(0, reply.indexOf('\r\n', reply.indexOf('\r\n') + 2) + 2)
}

/** Puts `reply` in front of the next reply to a request `matches` finds; the count of those. */
function putInFront(reply, matches) {
  const put = { count: 0 }
  proxy.tamperReplyTo(matches, (chunk) => {
    put.count++
    return Buffer.concat([reply, chunk])
  })
  return put
}

// A script's reply moved by one, on a Cluster: an extra integer reply in front of a load's
// write-back, whose own reply says it was fenced out (a set of the key since the load began).
// Read as written, the load's older value would be kept in process over the set's; proven out of
// step by the mark the script returns in its reply, the write-back counts as dropped and nothing
// is kept. Bus messages to
// the reader are withheld, so only the write-back's reply decides. The writer speaks to the node
// directly as a single server (it owns every slot), past the proxy.
test('cluster: a write-back reply moved by an extra reply is not read as written', { timeout: 60_000 }, async () => {
  const { StampedeCache } = require('..')
  const namespace = `clusterecho${process.pid}`
  let injectInteger = false
  let injected = 0
  proxy.tamperEvery((chunk) => {
    if (chunk.toString('latin1', 0, 16).startsWith('>3\r\n$7\r\nmessage')) return Buffer.alloc(0)
    // The write-back's reply, {written, announced, mark}: an array of three opening with an integer.
    if (injectInteger && chunk.toString('latin1', 0, 5) === '*3\r\n:') {
      injectInteger = false
      injected++
      return Buffer.concat([Buffer.from(':1\r\n'), chunk])
    }
    return null
  })
  const errors = []
  const reader = clusterReader(namespace, errors)
  const writer = new StampedeCache({ redis: `redis://127.0.0.1:${node.port}`, namespace, ttl: 600_000, l1: false })
  try {
    await reader.get('warm')
    const before = reader.stats().redisErrors
    const read = await loadOvertakenBySet(reader, writer, 'k', () => {
      injectInteger = true
    })
    assert.equal(read, 'loaded before the set', "the caller gets its own load's value")
    await eventually(() => injected === 1, { what: 'the extra reply injected' })
    await new Promise((r) => setTimeout(r, 200))
    // Whatever the reader kept must not be the load's value: the set came after it began.
    const after = await reader.get('k')
    assert.notEqual(after, 'loaded before the set', `kept the fenced-out value; errors: ${errors.join(' | ')}`)
    assert.equal(after, 'set during the load')
    await eventually(() => reader.stats().redisErrors > before, { what: 'the moved reply counted' })
  } finally {
    proxy.calm()
    await reader.close()
    await writer.close()
  }
})

// A GET's reply moved by an old reply of the same key, on a Cluster: the key mark cannot tell
// it (it names the right key), the echo can. The proxy answers the reader's GET of `k` with the
// value `k` held before a set, in front of the real reply; the read is refused (a miss, counted),
// never the older value after a resolved set.
test('cluster: a GET moved by an old reply of the same key is refused', { timeout: 60_000 }, async () => {
  const namespace = `clusterecho2${process.pid}`
  const errors = []
  const reader = clusterReader(namespace, errors, { l1: false })
  try {
    await reader.set('k', 'old')
    // Read from Redis (not from the set's announcement, which carries the value).
    await eventually(async () => (await reader.get('k')) === 'old' && proxy.bulks.some((b) => b.includes('"old"')), { what: 'a GET of the old value' })
    const oldGet = lastValueReply()
    await reader.set('k', 'new')
    const before = reader.stats().redisErrors
    const put = putInFront(oldGet, (request) => request.includes('GET') && request.includes('clusterecho2'))
    const got = await reader.get('k')
    assert.equal(put.count, 1, 'the old reply was put in front')
    assert.notEqual(got, 'old', `an older value after a resolved set; errors: ${errors.join(' | ')}`)
    assert.ok(reader.stats().redisErrors > before, 'the moved reply was counted')
    assert.equal(await reader.get('k'), 'new', 'read again on the replaced connection')
  } finally {
    proxy.calm()
    await reader.close()
  }
})

// A batch on a Cluster goes as one pipeline of GETs per node, each ending with its own keyed
// echo: an old reply of the same key put in front of a node's pipeline is refused (never the
// older value after a resolved set), counted, and the batch asked again. One key, so no other
// key's reply follows it on the connection to be caught by its key mark instead.
test('cluster: a getMany node pipeline moved by an old reply of the same key is refused', { timeout: 60_000 }, async () => {
  const namespace = `clusterecho3${process.pid}`
  const errors = []
  const reader = clusterReader(namespace, errors, { l1: false })
  try {
    await reader.set('a', 'old')
    assert.deepEqual(await reader.getMany(['a']), ['old'])
    const oldGet = lastValueReply()
    await reader.set('a', 'new')
    const before = reader.stats().redisErrors
    const put = putInFront(oldGet, (request) => request.includes('GET') && request.includes(`${namespace}:v:{a}`))
    const got = await reader.getMany(['a'])
    assert.equal(put.count, 1, 'the old reply was put in front')
    assert.notEqual(got[0], 'old', `an older value after a resolved set; errors: ${errors.join(' | ')}`)
    assert.deepEqual(got, ['new'], 'asked again on the replaced connection')
    assert.ok(reader.stats().redisErrors > before, 'the moved reply was counted')
  } finally {
    proxy.calm()
    await reader.close()
  }
})

// The slot map a batch groups keys by is read from the Cluster (CLUSTER SLOTS): bytes from the
// network. A reply whose ranges overlap (two owners for slots 0 to 5) is refused whole and
// reported; the batch goes per slot, as the redis crate routes it, and every key reads right.
test('cluster: a CLUSTER SLOTS reply with overlapping ranges is refused, and batches still read right', { timeout: 60_000 }, async () => {
  const namespace = `clusterslots${process.pid}`
  const errors = []
  const reader = clusterReader(namespace, errors, { l1: false })
  try {
    const keys = Array.from({ length: 40 }, (_, i) => `k${i}`)
    for (const k of keys) await reader.set(k, { k })
    const master = (id) => `*3\r\n$9\r\n127.0.0.1\r\n:${proxy.port}\r\n$${id.length}\r\n${id}\r\n`
    const overlapping = Buffer.from(`*2\r\n*3\r\n:0\r\n:16383\r\n${master('a')}*3\r\n:0\r\n:5\r\n${master('b')}`)
    const put = { count: 0 }
    proxy.tamperReplyTo(
      (request) => request.includes('CLUSTER') && request.includes('SLOTS'),
      () => {
        put.count++
        return overlapping
      },
    )
    const before = reader.stats().redisErrors
    assert.deepEqual(
      await reader.getMany(keys),
      keys.map((k) => ({ k })),
    )
    assert.equal(put.count, 1, 'the batch asked for the slot map, and got the overlapping one')
    assert.ok(reader.stats().redisErrors > before, 'counted')
    await eventually(() => errors.some((m) => /CLUSTER SLOTS reply was refused \(ranges overlap\)/.test(m)), {
      what: `the refusal reported: ${errors.join(' | ')}`,
    })
    assert.deepEqual(
      await reader.getOrLoadMany(keys, () => assert.fail('loaded')),
      keys.map((k) => ({ k })),
      'and again',
    )
  } finally {
    proxy.calm()
    await reader.close()
  }
})

// clear()'s sweep on a Cluster: the masters come from CLUSTER SLOTS and each is SCANned through
// its own node connection, each with an ECHO routed to that node. A reply put in front of either
// (no slots: nothing to sweep; a SCAN-shaped "done, nothing found") would end the sweep with
// the namespace's keys left in Redis; proven out of step, the step runs again on a new
// connection, and once clear() resolved no key of the namespace is left on the node.
for (const [what, asked, extra] of [
  ['SCAN', (r) => r.includes('\r\nSCAN\r\n'), '*2\r\n$1\r\n0\r\n*0\r\n'],
  ['CLUSTER SLOTS', (r) => r.includes('\r\nCLUSTER\r\n') && r.includes('\r\nSLOTS\r\n'), '*0\r\n'],
]) {
  test(`cluster: an extra reply in front of clear()'s ${what} leaves no key behind`, { timeout: 60_000 }, async () => {
    const namespace = `clustersweep${what.length}${process.pid}`
    const errors = []
    const cache = clusterReader(namespace, errors)
    try {
      for (let i = 0; i < 30; i++) await cache.set(`k${i}`, `old ${i}`)
      assert.equal((await node.cmd('KEYS', `${namespace}:v*`)).length, 30)
      const put = putInFront(Buffer.from(extra), asked)
      await cache.clear()
      assert.equal(put.count, 1, 'the extra reply was put in front')
      const left = await node.cmd('KEYS', `${namespace}:v*`)
      assert.deepEqual(left, [], `keys left after clear() resolved; errors: ${errors.join(' | ')}`)
      assert.ok(
        errors.some((e) => /out of step/.test(e)),
        `the moved reply was reported: ${errors.join(' | ')}`,
      )
    } finally {
      proxy.calm()
      await cache.close()
    }
  })
}
