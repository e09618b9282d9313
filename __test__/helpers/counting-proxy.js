'use strict'
// A TCP proxy on 127.0.0.1 that counts what clients ask of the redis-server behind it
// (__test__/redis-cluster-batch.test.js, bench/batch.js): every connection it accepts is
// forwarded to 127.0.0.1:`targetPort` untouched, and between `begin()` and `end()` it notes each command
// a client sends (its first arguments), on which connection, and in which round trip of that
// connection: a round trip begins when the client sends after the server has answered (or first).
// A Redis Cluster node announcing the proxy's port (cluster-announce-port) is then reached by the
// cluster client only through it, so the counts are per node.

const net = require('node:net')
const { listenLoopback } = require('./loopback')

/** How many arguments of each command are kept, and how many bytes of each. */
const KEPT_ARGS = 6
const KEPT_BYTES = 200

class CountingProxy {
  #server = null
  #sockets = new Set()
  #nextConnection = 0
  #log = null
  #hold = null

  constructor(targetPort) {
    this.targetPort = targetPort
    this.port = null
  }

  async start() {
    this.#server = await listenLoopback((client) => this.#onConnection(client))
    this.port = this.#server.address().port
    return this
  }

  #onConnection(client) {
    const id = this.#nextConnection++
    const upstream = net.connect({ host: '127.0.0.1', port: this.targetPort })
    this.#sockets.add(client).add(upstream)
    const conn = { id, round: 0, answered: true, parser: new CommandParser(), held: null }
    client.on('data', (chunk) => {
      if (conn.held) conn.held.push(chunk)
      else if (this.#hold && this.#hold.asked(chunk)) {
        const hold = this.#hold
        this.#hold = null
        conn.held = [chunk]
        hold.held(() => {
          for (const c of conn.held) upstream.write(c)
          conn.held = null
        })
      } else upstream.write(chunk)
      if (!this.#log) return
      if (conn.answered) {
        conn.round++
        conn.answered = false
      }
      for (const args of conn.parser.feed(chunk)) this.#log.push({ conn: id, round: conn.round, args })
    })
    upstream.on('data', (chunk) => {
      client.write(chunk)
      conn.answered = true
    })
    const teardown = () => {
      client.destroy()
      upstream.destroy()
      this.#sockets.delete(client)
      this.#sockets.delete(upstream)
    }
    for (const s of [client, upstream]) {
      s.on('error', teardown)
      s.on('close', teardown)
    }
  }

  /**
   * Holds back the next chunk a client sends for which `asked(chunk)` is true, and whatever
   * that connection sends after it, until the returned promise's `release()` is called: resolves
   * with `{ release }` once a chunk is held.
   */
  holdNext(asked) {
    return new Promise((resolve) => {
      this.#hold = { asked, held: (release) => resolve({ release }) }
    })
  }

  /** Starts noting commands (what was noted before is dropped). */
  begin() {
    this.#log = []
  }

  /**
   * Stops noting and returns what clients sent since `begin`: `{ commands: [{ conn, round, args
   * }], rounds }`, `rounds` being the round trips begun (summed over connections).
   */
  end() {
    const commands = this.#log ?? []
    this.#log = null
    const rounds = new Set(commands.map((c) => `${c.conn}:${c.round}`)).size
    return { commands, rounds }
  }

  close() {
    for (const s of this.#sockets) s.destroy()
    this.#sockets.clear()
    const server = this.#server
    this.#server = null
    if (!server) return Promise.resolve()
    return new Promise((resolve) => server.close(() => resolve()))
  }
}

/**
 * Client-to-server RESP (arrays of bulk strings, as clients send commands), fed in chunks split
 * anywhere, read into each complete command's first arguments as strings. Inline commands are not
 * parsed (no client here sends them).
 */
class CommandParser {
  #buf = Buffer.alloc(0)

  /** The commands `chunk` completes, each as its first arguments. */
  feed(chunk) {
    this.#buf = this.#buf.length ? Buffer.concat([this.#buf, chunk]) : chunk
    const out = []
    let i = 0
    for (;;) {
      const parsed = this.#command(i)
      if (!parsed) break
      i = parsed.next
      out.push(parsed.args)
    }
    this.#buf = this.#buf.subarray(i)
    return out
  }

  #line(i) {
    const eol = this.#buf.indexOf('\r\n', i)
    return eol < 0 ? null : { text: this.#buf.toString('latin1', i, eol), next: eol + 2 }
  }

  #command(i) {
    const head = this.#line(i)
    if (!head) return null
    if (head.text[0] !== '*') throw new Error(`not a RESP command: ${JSON.stringify(head.text.slice(0, 40))}`)
    const n = Number(head.text.slice(1))
    const args = []
    let at = head.next
    for (let k = 0; k < n; k++) {
      const len = this.#line(at)
      if (!len) return null
      const size = Number(len.text.slice(1))
      if (this.#buf.length < len.next + size + 2) return null
      if (k < KEPT_ARGS) args.push(this.#buf.toString('utf8', len.next, len.next + Math.min(size, KEPT_BYTES)))
      at = len.next + size + 2
    }
    return { args, next: at }
  }
}

module.exports = { CountingProxy, CommandParser }
