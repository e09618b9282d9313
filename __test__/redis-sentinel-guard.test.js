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
const { RedisServer, killAllSync, parseReply } = require('./helpers/redis-server')
const { eventually } = require('./helpers/eventually')

after(() => killAllSync())

/** What the hostile sentinel offers per connection: far more than the guard lets through. */
const FILLER_BYTES = 128 * 1024 * 1024
/** What a guarded connection may take before closing: socket buffers and a chunk or two. */
const ACCEPTED_BOUND = 8 * 1024 * 1024

const ATTACKS = {
  length: { head: '$1000000000000\r\n', chunk: Buffer.alloc(64 * 1024, 'x') },
  nesting: { head: '', chunk: Buffer.from('*1\r\n'.repeat(16 * 1024)) },
}

const bulk = (s) => `$${Buffer.byteLength(s)}\r\n${s}\r\n`
const array = (items) => `*${items.length}\r\n${items.join('')}`

/** Reads RESP commands off `socket` and calls `answer(args)` for each. */
function onCommands(socket, answer) {
  let buf = Buffer.alloc(0)
  socket.on('data', (data) => {
    buf = Buffer.concat([buf, data])
    for (;;) {
      let parsed
      try {
        parsed = parseReply(buf, 0)
      } catch {
        return
      }
      if (!parsed) return
      buf = buf.subarray(parsed.next)
      answer(parsed.value.map(String))
    }
  })
}

function listen(server) {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server.address().port)))
}

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
async function hostileSentinel(attack) {
  const connections = []
  const sockets = new Set()
  const server = net.createServer((socket) => {
    const c = { accepted: 0, closed: false }
    connections.push(c)
    sockets.add(socket)
    socket.on('error', () => {})
    socket.on('close', () => {
      c.closed = true
      sockets.delete(socket)
    })
    let attacking = false
    onCommands(socket, () => {
      if (attacking) return
      attacking = true
      socket.write(attack.head)
      const pump = () => {
        while (!socket.destroyed && c.accepted < FILLER_BYTES) {
          c.accepted += attack.chunk.length
          if (!socket.write(attack.chunk)) return socket.once('drain', pump)
        }
      }
      pump()
    })
  })
  const port = await listen(server)
  return { port, connections, close: () => (sockets.forEach((s) => s.destroy()), server.close()) }
}

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
