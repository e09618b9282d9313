'use strict'
// What clients sent a private redis-server while a function ran, as its MONITOR shows them.
// MONITOR prints commands in the order Redis ran them, so once a marker sent after `fn` shows,
// every command of `fn` has been seen.
const net = require('node:net')
const { once } = require('node:events')
const { eventually } = require('./eventually')

/**
 * Runs `fn` while MONITOR watches the server on `port`; `onCommand(addr, name, line)` is called
 * for each command seen before the marker (`addr`: the sending connection, or "lua" for commands
 * a script ran; `name`: the command as sent, e.g. "MGET").
 */
async function monitorDuring(port, fn, onCommand) {
  const socket = net.connect({ host: '127.0.0.1', port })
  await once(socket, 'connect')
  socket.setEncoding('utf8')
  const marker = `marker-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`
  let buf = ''
  let monitoring = false
  let marked = false
  socket.on('data', (chunk) => {
    buf += chunk
    for (let i = buf.indexOf('\r\n'); i >= 0; i = buf.indexOf('\r\n')) {
      const line = buf.slice(0, i)
      buf = buf.slice(i + 2)
      if (line === '+OK') monitoring = true
      if (line.includes(marker)) marked = true
      const m = line.match(/^\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"/)
      if (m && !marked) onCommand(m[1], m[2], line)
    }
  })
  try {
    socket.write('MONITOR\r\n')
    await eventually(() => monitoring, { what: 'MONITOR to start' })
    await fn()
    const sender = net.connect({ host: '127.0.0.1', port })
    await once(sender, 'connect')
    sender.end(`ECHO ${marker}\r\n`)
    await eventually(() => marked, { what: 'the MONITOR marker' })
    sender.destroy()
  } finally {
    socket.destroy()
  }
}

module.exports = { monitorDuring }
