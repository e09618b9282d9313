'use strict'
// A TCP proxy on 127.0.0.1 that can corrupt what Redis sends back (__test__/redis-wire.test.js):
// every connection it accepts is forwarded to 127.0.0.1:`targetPort`, and `tamper(fn)` hands the
// next chunk Redis sends on any connection to `fn(chunk)`, whose result is sent instead (an
// extra reply in front, the chunk twice, crafted bytes; null: leave this chunk alone and wait for
// the next). `tamperEvery(fn)` does it to every chunk until `calm()`. `fn` may also return
// `{ head, flood }`: `head` is sent instead of the chunk, then `flood` bytes of filler follow on
// that connection as fast as the client takes them, until it closes; `floods` records each
// (bytes sent, milliseconds until the client closed, null while it has not).
// `tamperReplyTo(asked, fn)` waits for a client to send a chunk for which `asked(request)` is
// true, then hands the next chunk Redis sends on that connection to `fn` (once): on a connection
// with nothing else in flight, the reply to that very command.

const net = require('node:net')
const { listenLoopback } = require('./loopback')

/** A read lane's own replies: a mark alone (the echo of a sequence number), or its handshake's (the echo of its name). */
const LANE_MARK = /^\$\d+\r\n(\d+|stampede-cache:read-lane)\r\n/
class FaultProxy {
  #server = null
  #pairs = new Set()
  #once = null
  #every = null
  #replyTo = null

  constructor(targetPort) {
    this.targetPort = targetPort
    this.port = null
    this.accepted = 0
    /** Chunks changed so far. */
    this.tampered = 0
    /** The last chunk Redis sent that starts with a bulk reply of a value (a GET's), for replaying it. */
    this.lastBulk = null
    /** The last 64 of those, oldest first (other connections' replies may follow a GET's). */
    this.bulks = []
    this.floods = []
  }

  async start() {
    this.#server = await listenLoopback((client) => this.#onConnection(client))
    this.port = this.#server.address().port
    return this
  }

  tamper(fn) {
    this.#once = fn
  }

  tamperEvery(fn) {
    this.#every = fn
  }

  tamperReplyTo(asked, fn) {
    this.#replyTo = { asked, fn }
  }

  calm() {
    this.#once = null
    this.#every = null
    this.#replyTo = null
  }

  /** Sends `bytes` to every client now, as if Redis had (an unsolicited reply). */
  injectNow(bytes) {
    for (const { client } of this.#pairs) client.write(bytes)
  }

  #onConnection(client) {
    this.accepted++
    const upstream = net.connect({ host: '127.0.0.1', port: this.targetPort })
    const pair = { client, upstream, armed: null }
    this.#pairs.add(pair)
    const teardown = () => {
      this.#pairs.delete(pair)
      client.destroy()
      upstream.destroy()
    }
    client.on('data', (chunk) => {
      if (this.#replyTo?.asked(chunk)) {
        pair.armed = this.#replyTo.fn
        this.#replyTo = null
      }
      upstream.write(chunk)
    })
    upstream.on('data', (chunk) => {
      // A value (not a nil), and not a read lane's own replies (its marks and handshake).
      if (chunk[0] === 0x24 && chunk[1] !== 0x2d && !LANE_MARK.test(chunk.toString('latin1'))) {
        this.lastBulk = chunk
        this.bulks.push(chunk)
        if (this.bulks.length > 64) this.bulks.shift()
      }
      let out = chunk
      if (pair.armed) {
        const fn = pair.armed
        pair.armed = null
        this.tampered++
        client.write(fn(chunk))
        return
      }
      const fn = this.#once ?? this.#every
      // `fn` returning null passes the chunk on untouched and stays armed (not the reply it
      // waits for: a bus message, say).
      const changed = fn ? fn(chunk) : null
      if (changed !== null) {
        if (this.#once) this.#once = null
        this.tampered++
        out = changed
      }
      if (out && !Buffer.isBuffer(out) && out.flood) {
        client.write(out.head)
        this.#flood(client, out.flood)
        return
      }
      client.write(out)
    })
    for (const s of [client, upstream]) {
      s.on('error', teardown)
      s.on('close', teardown)
    }
  }

  async #flood(client, bytes) {
    const record = { sent: 0, closedAfter: null }
    this.floods.push(record)
    const started = Date.now()
    const closed = new Promise((r) => client.once('close', r))
    closed.then(() => {
      record.closedAfter = Date.now() - started
    })
    const filler = Buffer.alloc(1 << 20, 0x78)
    while (record.sent < bytes && !client.destroyed) {
      record.sent += filler.length
      if (!client.write(filler)) await Promise.race([new Promise((r) => client.once('drain', r)), closed])
    }
  }

  async close() {
    for (const pair of this.#pairs) {
      pair.client.destroy()
      pair.upstream.destroy()
    }
    this.#pairs.clear()
    if (this.#server) await new Promise((r) => this.#server.close(() => r()))
  }
}

module.exports = { FaultProxy }
