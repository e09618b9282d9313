'use strict'
// A Redis Cluster of 3 masters (no replicas) on free 127.0.0.1 ports whose every master
// announces a CountingProxy in front of it as its address (cluster-announce-port): a cluster
// client learns the proxies from CLUSTER SLOTS and MOVED replies, so everything it sends a node
// is counted there (__test__/redis-cluster-batch.test.js, bench/batch.js). Slots can be moved
// between masters while clients run (`moveSlot`). Every process is stopped by PID in dispose().

const { RedisCluster, parseClusterSlots } = require('./redis-topology')
const { CountingProxy } = require('./counting-proxy')
const { waitFor } = require('./redis-server')

/** The body of echo.lua as the library sends it (EVAL, comment lines left out). */
const ECHO_BODY = 'return ARGV[1]'

class ProxiedCluster {
  constructor({ masters = 3 } = {}) {
    this.cluster = new RedisCluster({ masters, replicasPerMaster: 0, nodeTimeout: 1_000 })
    /** [{ node, proxy, id }] */
    this.masters = []
  }

  async start() {
    await this.cluster.start()
    for (const node of this.cluster.nodes) {
      const proxy = await new CountingProxy(node.port).start()
      const id = await node.cmd('CLUSTER', 'MYID')
      this.masters.push({ node, proxy, id })
    }
    for (const { node, proxy } of this.masters) {
      await node.cmd('CONFIG', 'SET', 'cluster-announce-ip', '127.0.0.1')
      await node.cmd('CONFIG', 'SET', 'cluster-announce-port', String(proxy.port))
    }
    const proxies = new Set(this.masters.map((m) => m.proxy.port))
    await waitFor(
      async () => {
        for (const { node } of this.masters) {
          const ranges = parseClusterSlots(await node.cmd('CLUSTER', 'SLOTS'))
          if (ranges.length === 0 || !ranges.every((r) => proxies.has(r.master))) return false
        }
        return true
      },
      { timeout: 20_000, interval: 50, what: 'every node to announce the proxies' },
    )
    return this
  }

  /** Seed URLs: the proxies. */
  get seedUrls() {
    return this.masters.map((m) => `redis://127.0.0.1:${m.proxy.port}`)
  }

  /** The hash slot of each Redis key (CLUSTER KEYSLOT). */
  keySlots(redisKeys) {
    return this.cluster.keySlots(redisKeys)
  }

  /** The proxy port of the master serving each Redis key now, as the first master's CLUSTER SLOTS says. */
  async ownerPorts(redisKeys) {
    const slots = await this.keySlots(redisKeys)
    const ranges = parseClusterSlots(await this.masters[0].node.cmd('CLUSTER', 'SLOTS'))
    return slots.map((s) => ranges.find((r) => s >= r.start && s <= r.end).master)
  }

  /** The master serving `slot` now, as the first master's CLUSTER SLOTS says. */
  async ownerOfSlot(slot) {
    const ranges = parseClusterSlots(await this.masters[0].node.cmd('CLUSTER', 'SLOTS'))
    const range = ranges.find((r) => slot >= r.start && slot <= r.end)
    return this.masters.find((m) => m.proxy.port === range.master)
  }

  /**
   * Moves `slot` with its keys from master `from` to master `to` (IMPORTING, MIGRATING, MIGRATE
   * of every key, then SETSLOT NODE on every master), as a resharding does.
   */
  async moveSlot(slot, from, to) {
    await to.node.cmd('CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', from.id)
    await from.node.cmd('CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', to.id)
    for (;;) {
      const keys = await from.node.cmd('CLUSTER', 'GETKEYSINSLOT', String(slot), '1000')
      if (keys.length === 0) break
      await from.node.cmd('MIGRATE', '127.0.0.1', String(to.node.port), '', '0', '5000', 'KEYS', ...keys)
    }
    for (const m of [to, from, ...this.masters.filter((x) => x !== to && x !== from)]) {
      await m.node.cmd('CLUSTER', 'SETSLOT', String(slot), 'NODE', to.id)
    }
  }

  /** Runs `fn`, noting what every master is sent meanwhile: `{ result, perMaster: [{ master, commands, rounds }] }`. */
  async record(fn) {
    for (const m of this.masters) m.proxy.begin()
    const ended = () => this.masters.map((master) => ({ master, ...master.proxy.end() }))
    let result
    try {
      result = await fn()
    } catch (err) {
      ended()
      throw err
    }
    return { result, perMaster: ended() }
  }

  async dispose() {
    for (const { proxy } of this.masters) await proxy.close()
    await this.cluster.dispose()
  }
}

/** Whether a command (its first arguments) is the library's keyed echo. */
const isEcho = (args) => args[0] === 'EVAL' && args[1] === ECHO_BODY

/**
 * The pipelines in `commands` (as CountingProxy records them): on each connection, the commands
 * up to and with each keyed echo (every batch pipeline ends with one). Returns [{ conn, commands }].
 */
function echoedPipelines(commands) {
  const open = new Map()
  const out = []
  for (const c of commands) {
    const list = open.get(c.conn) ?? []
    list.push(c.args)
    open.set(c.conn, list)
    if (isEcho(c.args)) {
      out.push({ conn: c.conn, commands: list })
      open.set(c.conn, [])
    }
  }
  return out
}

module.exports = { ProxiedCluster, echoedPipelines, isEcho, ECHO_BODY }
