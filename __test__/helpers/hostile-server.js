'use strict'
// Fake Redis endpoints on 127.0.0.1 for the guard tests (a hostile sentinel, a hostile cluster
// node): small TCP or TLS servers that read RESP commands and answer each one as the test says,
// or with an attack (a declared terabyte, endless nesting) followed by filler streamed until
// their writes fail or FILLER_BYTES are sent. Each connection records how many filler bytes the
// client took (`accepted`) and whether it was closed: unguarded, the redis crate takes them all.
// runGuardClient runs the cache facing one in a process of its own (fixtures/guard-client.js).

const { spawn } = require('node:child_process')
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
  return new Promise((resolve, reject) => {
    const script = path.join(__dirname, '..', 'fixtures', 'guard-client.js')
    const child = spawn(process.execPath, [script, JSON.stringify(redis)], { stdio: ['ignore', 'pipe', 'pipe'] })
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

module.exports = { ACCEPTED_BOUND, ATTACK, ATTACKS, FILLER_BYTES, array, bulk, hostileServer, listen, onCommands, runGuardClient }
