'use strict'
// A TCP proxy on 127.0.0.1 for fault tests (__test__/redis-faults.test.js).
//
// It forwards every connection it accepts to 127.0.0.1:`targetPort`. `freeze()` turns every
// connection that exists at that moment into a black hole: nothing is forwarded either way any
// more, but both sockets stay open (no FIN, no RST), which is what a failover behind a load
// balancer, a NAT entry that expired or a dead peer looks like to the client. Connections accepted
// after the freeze are forwarded normally, so a client that drops a silent socket and connects
// again gets through. `cut()` is the network between the client and Redis going away: every
// connection is reset and new ones are closed at once, until `mend()`.

const net = require('node:net')
const { listenLoopback } = require('./loopback')

class TcpProxy {
  #server = null
  /** Every live pair { client, upstream, frozen }; frozen pairs stay here until close(). */
  #pairs = new Set()

  constructor(targetPort) {
    this.targetPort = targetPort
    this.port = null
    /** Connections accepted since start (frozen ones included). */
    this.accepted = 0
  }

  /** Listens on a free 127.0.0.1 port. */
  async start() {
    this.#server = await listenLoopback((client) => this.#onConnection(client))
    this.port = this.#server.address().port
    return this
  }

  /** While true, connections are closed as they arrive (see cut). */
  #cut = false

  #onConnection(client) {
    this.accepted++
    if (this.#cut) {
      client.destroy()
      return
    }
    const upstream = net.connect({ host: '127.0.0.1', port: this.targetPort })
    const pair = { client, upstream, frozen: false }
    this.#pairs.add(pair)
    // Tear a live pair down when either side goes; a frozen pair is left exactly as it is (a
    // black hole does not pass a close on either).
    const teardown = () => {
      if (pair.frozen) return
      this.#pairs.delete(pair)
      client.destroy()
      upstream.destroy()
    }
    const forward = (from, to) => {
      from.on('data', (chunk) => {
        if (pair.frozen) return
        if (!to.write(chunk)) {
          from.pause()
          to.once('drain', () => {
            if (!pair.frozen) from.resume()
          })
        }
      })
    }
    forward(client, upstream)
    forward(upstream, client)
    for (const s of [client, upstream]) {
      s.on('error', teardown)
      s.on('close', teardown)
    }
  }

  /**
   * Stops forwarding on every connection open now, both ways, and keeps them open (their bytes
   * are no longer read: the peer's writes sit in kernel buffers, no reply ever comes). Returns how
   * many connections were frozen. New connections are still forwarded.
   */
  freeze() {
    let n = 0
    for (const pair of this.#pairs) {
      if (pair.frozen) continue
      pair.frozen = true
      pair.client.pause()
      pair.upstream.pause()
      n++
    }
    return n
  }

  /** Resets every connection open now and closes new ones at once, until mend(). */
  cut() {
    this.#cut = true
    for (const { client, upstream } of this.#pairs) {
      client.destroy()
      upstream.destroy()
    }
    this.#pairs.clear()
  }

  /** Forwards new connections again after cut(). */
  mend() {
    this.#cut = false
  }

  /** Connections open now (frozen ones included). */
  get open() {
    return this.#pairs.size
  }

  /** Stops listening and destroys every connection, frozen ones included. */
  close() {
    for (const { client, upstream } of this.#pairs) {
      client.destroy()
      upstream.destroy()
    }
    this.#pairs.clear()
    const server = this.#server
    this.#server = null
    if (!server) return Promise.resolve()
    return new Promise((resolve) => server.close(() => resolve()))
  }
}

module.exports = { TcpProxy }
