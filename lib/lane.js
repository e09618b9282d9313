'use strict'
// The socket lane's transport (src/node/lane/socket.rs): where the read lane cannot drive its socket from
// libuv (Bun and Deno, whose `uv_*` are not libuv's), it reads on a `node:net` socket of the
// runtime's own. This file only moves bytes: each chunk read goes to the native
// framer in one call (`laneData`), which checks every reply (the key mark, the alignment marks,
// the bounds) and settles the reads it answers inside that call; requests come back as one
// `write` per batch. An idle lane keeps no process alive; one with reads in flight does.
const net = require('node:net')

/**
 * Opens socket lane `lane.id` to `lane.path` (a Unix socket) or `lane.host`:`lane.port`, writes
 * the handshake `lane.hello` at once, and answers the connection the native side drives:
 * { write(bytes), end() }. `lane.connectMs`: the socket is ended unless its handshake was
 * answered by then; `lane.commandMs`: a read in flight is checked this long after it was written
 * (`laneTimer`).
 */
function openSocketLane(native, { id, host, port, path, hello, connectMs, commandMs }) {
  const options = path ? { path } : { host, port, noDelay: true }
  // Chunks are read into one buffer of the lane's (`onread`: no Buffer and no stream machinery
  // per chunk; Node, Bun and Deno all take it); the framer copies what it keeps.
  options.onread = { buffer: Buffer.allocUnsafe(64 * 1024), callback: (n, buffer) => take(buffer, n) }
  const socket = net.connect(options)
  socket.unref()
  let held = false
  let timer = null
  let open = false
  let closed = false
  const connecting = setTimeout(() => socket.destroy(), connectMs)
  if (connecting.unref) connecting.unref()

  // A read's timer, checked after the chunks already read are fed (`setImmediate` runs after
  // the loop's poll): a reply that arrived while the thread was busy is used, not timed out.
  const check = () => {
    const left = native.laneTimer(id)
    if (left >= 0) arm(left)
  }
  const fire = () => {
    timer = null
    setImmediate(check)
  }
  const arm = (ms) => {
    timer = setTimeout(fire, ms + 1)
    if (timer.unref) timer.unref()
  }

  // The reads the answers' continuations send are held and written together once they have
  // run: a tick queued from a microtask runs after every microtask queued meanwhile.
  const release = () => native.laneRelease()
  const releaseAfterMicrotasks = () => process.nextTick(release)
  const take = (buffer, n) => {
    const answer = native.laneData(id, buffer, n)
    if (answer === -2) socket.destroy()
    else if (answer >= 0) {
      if (!open) {
        open = true
        clearTimeout(connecting)
      }
      if (answer & 1) queueMicrotask(releaseAfterMicrotasks)
      if (answer >> 1 === 0 && held) {
        held = false
        socket.unref()
      }
    }
  }
  // 'close' follows every 'error'; the error's message says why.
  let why = 'Redis closed the read lane'
  socket.on('error', (err) => {
    why = `Redis read lane failed: ${err && err.message}`
  })
  socket.once('close', () => {
    closed = true
    clearTimeout(connecting)
    if (timer !== null) clearTimeout(timer)
    native.laneClosed(id, why)
  })
  socket.write(hello)
  return {
    // `bytes`: a Latin-1 string, one character a byte.
    write(bytes) {
      if (closed) throw new Error('the read lane is closed')
      if (!held) {
        held = true
        socket.ref()
      }
      if (timer === null) arm(commandMs)
      socket.write(bytes, 'latin1')
    },
    end() {
      socket.destroy()
    },
  }
}

module.exports = { openSocketLane }
