'use strict'
// Fake Redis endpoints on 127.0.0.1 for the guard tests (a hostile sentinel, a hostile cluster
// node): small TCP or TLS servers that read RESP commands and answer each one as the test says,
// or with an attack (a declared terabyte, endless nesting) followed by filler streamed until
// their writes fail or FILLER_BYTES are sent. Each connection records how many filler bytes the
// client took (`accepted`) and whether it was closed: unguarded, the redis crate takes them all.
// runGuardClient runs the cache facing one in a process of its own (fixtures/guard-client.js).

const assert = require('node:assert/strict')
const { runNode } = require('./child')
const { eventually } = require('./eventually')
const net = require('node:net')
const path = require('node:path')
const tls = require('node:tls')
const { parseReply } = require('./redis-server')

/** What an attacked connection is offered: far more than the guard lets through. */
const FILLER_BYTES = 128 * 1024 * 1024
/** What a guarded connection may take before closing: socket buffers and a chunk or two. */
const ACCEPTED_BOUND = 8 * 1024 * 1024

const ATTACKS = {
  length: { head: '$1000000000000\r\n', chunk: Buffer.alloc(64 * 1024, 'x') },
  nesting: { head: '', chunk: Buffer.from('*1\r\n'.repeat(16 * 1024)) },
}

const bulk = (s) => `$${Buffer.byteLength(s)}\r\n${s}\r\n`
const array = (items) => `*${items.length}\r\n${items.join('')}`
/** The answer that makes a hostile server attack instead. */
const ATTACK = Symbol('attack')

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

/**
 * A server answering each command with `answer(args, port)`: a string to send, null to send
 * nothing, or ATTACK to send `attack` (see ATTACKS) and then filler, once per connection
 * (later commands on it get nothing). `tls`: { key, cert } to serve TLS.
 */
async function hostileServer({ answer, attack = ATTACKS.length, tls: tlsOptions = null }) {
  const connections = []
  const sockets = new Set()
  let port = null
  const onConnection = (socket) => {
    const c = { accepted: 0, closed: false, attacked: false }
    connections.push(c)
    sockets.add(socket)
    socket.on('error', () => {})
    socket.on('close', () => {
      c.closed = true
      sockets.delete(socket)
    })
    onCommands(socket, (args) => {
      if (c.attacked) return
      const reply = answer(args, port)
      if (reply === null) return
      if (reply !== ATTACK) return socket.write(reply)
      c.attacked = true
      socket.write(attack.head)
      const pump = () => {
        while (!socket.destroyed && c.accepted < FILLER_BYTES) {
          c.accepted += attack.chunk.length
          if (!socket.write(attack.chunk)) return socket.once('drain', pump)
        }
      }
      pump()
    })
  }
  const server = tlsOptions ? tls.createServer(tlsOptions, onConnection) : net.createServer(onConnection)
  // A client refusing the certificate ends the handshake; nothing to count.
  server.on('tlsClientError', () => {})
  port = await listen(server)
  return {
    port,
    connections,
    /** The attacked connections, and whether each was closed. */
    attacked: () => connections.filter((c) => c.attacked),
    close: () => (sockets.forEach((s) => s.destroy()), server.close()),
  }
}

/**
 * Runs fixtures/guard-client.js (a cache reading through the loader in a process of its own)
 * with these `redis` options: its exit code and signal, and what it printed.
 */
function runGuardClient(redis) {
  return runNode([path.join(__dirname, '..', 'fixtures', 'guard-client.js'), JSON.stringify(redis)])
}

/**
 * What every attack on a cache run by runGuardClient must end with (`run`: its result;
 * `attacked`: the hostile server's attacked connections): the process exited by itself with 0,
 * its reads were loaded, every attacked connection closed having taken under ACCEPTED_BOUND
 * bytes of filler, and its memory stayed bounded. The child's report (its last line), for the
 * caller's own checks.
 */
async function assertSurvived(t, run, attacked, what) {
  const { code, signal, out, err } = run
  assert.equal(signal, null, `the process was killed by ${signal}: ${err.slice(-2000)}`)
  assert.equal(code, 0, `exit ${code}: ${err.slice(-2000)}`)
  const r = JSON.parse(out.trim().split('\n').pop())
  assert.deepEqual(r.got, ['loaded'], `reads are loaded: ${out}`)
  assert.ok(attacked.length >= 1, `${what} was attacked: ${out}`)
  await eventually(() => attacked.every((c) => c.closed), { what: 'every attacked connection closed' })
  t.diagnostic(
    `attacked connections: ${attacked.length}; most filler taken by one: ${Math.max(...attacked.map((c) => c.accepted))} bytes; RSS growth ${r.rssGrowth}`,
  )
  for (const c of attacked) {
    assert.ok(c.accepted < ACCEPTED_BOUND, `filler taken before the connection closed: ${c.accepted} bytes`)
  }
  assert.ok(r.rssGrowth < 64 * 1024 * 1024, `memory grew by ${r.rssGrowth} bytes`)
  return r
}

module.exports = {
  assertSurvived,
  ACCEPTED_BOUND,
  ATTACK,
  ATTACKS,
  FILLER_BYTES,
  array,
  bulk,
  hostileServer,
  listen,
  onCommands,
  runGuardClient,
}
