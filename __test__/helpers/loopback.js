'use strict'
// A TCP server on a free 127.0.0.1 port, for the tests' proxies and doubles.
const net = require('node:net')

/** Resolves with the listening server once it has its port (`server.address().port`). */
function listenLoopback(onConnection) {
  return new Promise((resolve, reject) => {
    const server = net.createServer(onConnection)
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => resolve(server))
  })
}

module.exports = { listenLoopback }
