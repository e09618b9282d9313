'use strict'
// Following a Sentinel failover that leaves the old master up (`SENTINEL FAILOVER`, or an
// operator's switch): the old master keeps accepting writes for seconds until the sentinel
// demotes it, and whatever it accepts then is lost when it resyncs from the new master. The cache
// must leave it as soon as the sentinels announce the switch (+switch-master), not when its
// connections break: its command connection, its read lane and its bus subscriber.
//
// A private master, replica and sentinel (__test__/helpers/redis-topology.js); two caches in this
// process, one writing a new key per set() and one reading each back (its reads take the read
// lane). The assertions are causal, not timed, except for one generous bound: once one of the
// cache's writes begun after the switch has landed on the new master, no later write may land
// on the old one, and each survives the old master's demotion; no connection of the cache stays
// on the old master. Measured: how many acknowledged writes went to the old master after the
// sentinel announced the switch.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { RedisSentinelGroup, killTopologySync } = require('./helpers/redis-topology')
const { eventually } = require('./helpers/eventually')

after(() => killTopologySync())

/** Far below the sentinel's 11-15 s demotion of the old master, and far above a reaction to a pub/sub message. */
const FOLLOW_BOUND = 5_000

const vkey = (ns, k) => `${ns}:v:{${k}}`

/** Clients of `node` that are neither the sentinel's nor this CLIENT LIST's own. */
async function foreignClients(node) {
  const list = await node.cmd('CLIENT', 'LIST')
  return list
    .split('\n')
    .filter(Boolean)
    .filter((line) => !/\bname=sentinel-/.test(line) && !/\bcmd=client\|list\b/.test(line))
}

test('SENTINEL FAILOVER with the old master up: the cache leaves it at the announcement; later writes land on the new master and survive the demotion', {
  timeout: 90_000,
}, async (t) => {
  // A long down-after: only the command fails over, never a loaded machine's slow PING.
  const group = new RedisSentinelGroup({ downAfter: 10_000 })
  t.after(() => group.dispose())
  await group.start()
  const { StampedeCache } = require('..')
  const namespace = `scsfo${process.pid}${Math.random().toString(36).slice(2, 6)}`
  const redis = { sentinels: group.sentinelUrls, masterName: group.masterName }
  const writer = new StampedeCache({ redis, namespace, jitter: 0 })
  const reader = new StampedeCache({ redis, namespace, jitter: 0 })
  t.after(() => Promise.all([writer.close(), reader.close()]))

  await writer.set('before', 'v')
  assert.equal(await reader.get('before'), 'v')
  assert.ok(await group.master.cmd('GET', vkey(namespace, 'before')), 'the first write is on the master')

  // One new key per set(), each read back by the other cache: [{ i, start, end }].
  const writes = []
  let stop = false
  const loop = (async () => {
    for (let i = 0; !stop; i++) {
      const w = { i, start: Date.now(), end: null }
      await writer.set(`w${i}`, i).catch(() => {})
      w.end = Date.now()
      writes.push(w)
      await reader.get(`w${i}`).catch(() => {})
      await new Promise((r) => setTimeout(r, 2))
    }
  })()

  await new Promise((r) => setTimeout(r, 300))
  const fo = await group.commandFailover()
  const oldMaster = fo.oldMaster
  const newMaster = fo.newMaster
  const switched = fo.switchedAt
  const onNode = async (node, w) => (await node.cmd('GET', vkey(namespace, `w${w.i}`))) !== null

  // Within the bound, a write begun after the announcement lands on the new master.
  let followedAt
  try {
    followedAt = await eventually(
      async () => {
        for (const w of writes) if (w.start > switched && (await onNode(newMaster, w))) return w.start
        return false
      },
      { timeout: FOLLOW_BOUND, interval: 50, what: "the cache's writes to land on the new master" },
    )
  } finally {
    // Counted before the sentinel demotes the old master (which then resyncs and forgets them).
    setTimeout(() => {
      stop = true
    }, 1_000)
    await loop
    let toOld = 0
    let lastToOld = null
    for (const w of writes) {
      if (w.end > switched && (await onNode(oldMaster, w)) && !(await onNode(newMaster, w))) {
        toOld++
        lastToOld = w.end - switched
      }
    }
    const acked = writes.filter((w) => w.end > switched).length
    const figures = `${toOld} of ${acked} writes acknowledged after the announcement went to the old master${lastToOld === null ? '' : ` (the last ${lastToOld} ms after it)`}; the first begun after it and on the new master began ${followedAt === undefined ? 'never' : `${followedAt - switched} ms after it`}`
    t.diagnostic(`failover: announced ${fo.failoverMs} ms after SENTINEL FAILOVER; ${figures}`)
    console.log(`# ${figures}`)
  }

  // Nothing begun after the cache followed went to the old master.
  const late = writes.filter((w) => w.start >= followedAt)
  assert.ok(late.length > 0, 'writes went on after the cache followed')
  for (const w of late)
    assert.equal(await onNode(oldMaster, w), false, `w${w.i} (begun ${w.start - switched} ms after the announcement) went to the old master`)

  // No connection of the cache stays on the old master (command, read lane, bus).
  await eventually(
    async () => {
      await reader.get('before')
      await writer.set('after', 'v')
      const left = await foreignClients(oldMaster)
      assert.deepEqual(left, [], 'connections left on the old master')
    },
    { timeout: FOLLOW_BOUND, interval: 100, what: "the cache's connections to leave the old master" },
  )
  const [, subscribers] = await newMaster.cmd('PUBSUB', 'NUMSUB', `${namespace}:bus:0`)
  assert.equal(subscribers, 2, 'both caches subscribe on the new master')

  // Each write begun after the cache followed survives the old master's demotion.
  await group.demoted(oldMaster)
  for (const w of late) assert.equal(await onNode(newMaster, w), true, `w${w.i} is on the new master after the demotion`)
  assert.equal(await reader.get('after'), 'v')
})
