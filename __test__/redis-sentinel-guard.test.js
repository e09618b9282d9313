'use strict'
// A hostile sentinel. The cache's own connections to the sentinels (the subscription to failover
// announcements, and the asks where the master is) open through the same guard as its command
// connections: a reply declaring a huge length or nesting deeper than any answer the cache asks
// for closes the connection at once, so the sentinel cannot make the cache buffer it.
//
// Two fake sentinels (small TCP servers here): a hostile one, listed first, answering every
// command with the attack and then streaming filler until its writes fail, and an honest one
// naming a private redis-server as the master. Measured by the hostile one: how many filler
// bytes the cache accepted before it closed the connection (unguarded, the redis crate reads it
// all: FILLER_BYTES). Then the cache still serves through Redis and the loader.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const net = require('node:net')
const { RedisServer, killAllSync } = require('./helpers/redis-server')
const { eventually } = require('./helpers/eventually')
const { ACCEPTED_BOUND, ATTACK, ATTACKS, array, assertSurvived, bulk, hostileServer, listen, onCommands, runGuardClient } = require('./helpers/hostile-server')

after(() => killAllSync())

/** A sentinel naming `masterPort` as mymaster (config epoch 1), accepting subscriptions. */
async function honestSentinel(masterPort) {
  const sockets = new Set()
  const server = net.createServer((socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => {})
    onCommands(socket, (args) => {
      const [cmd, sub] = [args[0].toUpperCase(), (args[1] || '').toUpperCase()]
      if (cmd === 'SENTINEL' && sub === 'MASTER') {
        socket.write(array(['name', 'mymaster', 'ip', '127.0.0.1', 'port', String(masterPort), 'config-epoch', '1'].map(bulk)))
      } else if (cmd === 'SENTINEL' && sub === 'GET-MASTER-ADDR-BY-NAME') {
        socket.write(array([bulk('127.0.0.1'), bulk(String(masterPort))]))
      } else if (cmd === 'SUBSCRIBE') {
        args.slice(1).forEach((channel, i) => {
          socket.write(array([bulk('subscribe'), bulk(channel), `:${i + 1}\r\n`]))
        })
      } else {
        socket.write('+OK\r\n')
      }
    })
  })
  const port = await listen(server)
  return { port, close: () => (sockets.forEach((s) => s.destroy()), server.close()) }
}

/** A sentinel answering the first command of each connection with `attack`, then filler. */
const hostileSentinel = (attack) => hostileServer({ attack, answer: () => ATTACK })

for (const [name, attack] of Object.entries(ATTACKS)) {
  test(`a sentinel answering with ${name === 'length' ? 'a declared terabyte' : 'endless nesting'}: its connections close at once, and the cache keeps serving`, {
    timeout: 60_000,
  }, async (t) => {
    const redis = await new RedisServer().start()
    t.after(() => redis.stop())
    const hostile = await hostileSentinel(attack)
    t.after(() => hostile.close())
    const honest = await honestSentinel(redis.port)
    t.after(() => honest.close())
    const { StampedeCache } = require('..')
    const reports = []
    const cache = new StampedeCache({
      redis: { sentinels: [`redis://127.0.0.1:${hostile.port}`, `redis://127.0.0.1:${honest.port}`], masterName: 'mymaster' },
      namespace: `scsg${process.pid}${name}`,
      onError: (err, info) => reports.push(`${info.op}: ${err.message}`),
    })
    t.after(() => cache.close())

    // Through the honest sentinel's master, while the hostile one is subscribed to and asked.
    assert.equal(await cache.getOrLoad('k', async () => 'loaded'), 'loaded')
    await cache.set('s', 'v')
    await eventually(
      async () => {
        assert.equal(await cache.getOrLoad(`k${Math.random()}`, async () => 'again'), 'again')
        assert.ok(
          hostile.connections.some((c) => c.closed),
          'a connection to the hostile sentinel was closed',
        )
        assert.ok(
          reports.some((r) => /sentinel/i.test(r) && /512 MiB|nest|RESP|closed/.test(r)),
          `a report of the refused sentinel: ${reports.join(' | ')}`,
        )
      },
      { timeout: 30_000, what: 'the hostile sentinel refused and reported' },
    )
    const closed = hostile.connections.filter((c) => c.closed)
    t.diagnostic(`hostile connections closed: ${closed.length}; most filler taken by one: ${Math.max(...closed.map((c) => c.accepted))} bytes`)
    for (const c of closed) {
      assert.ok(c.accepted < ACCEPTED_BOUND, `filler taken before the connection closed: ${c.accepted} bytes`)
    }
    assert.equal(await cache.get('s'), 'v', 'the set value is still served')
  })
}

// The lookup for when no sentinel answers the cache's ask (SENTINEL MASTER and
// GET-MASTER-ADDR-BY-NAME): the one sentinel refuses those, so the cache looks the master up as
// the redis crate would (ROLE, SENTINEL MASTERS), and the sentinel answers that with the attack.
// That lookup opens through the guard too: in a process of its own, the cache survives, its
// memory stays far below the flood, the connection closes on the attack, and reads are loaded.
for (const [name, attack] of Object.entries(ATTACKS)) {
  test(`no sentinel answers the ask, and the lookup after it meets ${name === 'length' ? 'a declared terabyte' : 'endless nesting'}: the process survives, bounded`, {
    timeout: 90_000,
  }, async (t) => {
    const hostile = await hostileServer({
      attack,
      answer: (args) => {
        const [cmd, sub] = [args[0].toUpperCase(), (args[1] || '').toUpperCase()]
        if (cmd === 'SENTINEL' && (sub === 'MASTER' || sub === 'GET-MASTER-ADDR-BY-NAME')) return '-ERR No such master with that name\r\n'
        if (cmd === 'SUBSCRIBE')
          return args
            .slice(1)
            .map((channel, i) => array([bulk('subscribe'), bulk(channel), `:${i + 1}\r\n`]))
            .join('')
        if (cmd === 'CLIENT') return '+OK\r\n'
        return ATTACK
      },
    })
    t.after(() => hostile.close())
    const run = await runGuardClient({
      sentinels: [`redis://127.0.0.1:${hostile.port}`],
      masterName: 'mymaster',
      connectTimeout: 2_000,
      commandTimeout: 2_000,
    })
    const r = await assertSurvived(t, run, hostile.attacked(), 'the lookup')
    assert.ok(
      r.reports.some((m) => /sentinel 127\.0\.0\.1:\d+/.test(m) && /512 MiB|nest|RESP|closed/.test(m)),
      `the refused sentinel is reported by address, with the reason: ${r.reports.join(' | ')}`,
    )
  })
}
