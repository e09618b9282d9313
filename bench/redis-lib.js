'use strict'
// Helpers for benches that need their own redis-server on a free loopback port.
const { spawn } = require('node:child_process')
const net = require('node:net')

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.unref()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

function ping(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1')
    sock.once('error', () => resolve(false))
    sock.once('connect', () => sock.write('PING\r\n'))
    sock.once('data', (d) => {
      sock.destroy()
      resolve(d.toString().startsWith('+PONG'))
    })
  })
}

async function startRedis() {
  const port = await freePort()
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdio: 'ignore',
  })
  const stop = () => {
    if (proc.exitCode === null) proc.kill('SIGKILL')
  }
  process.once('exit', stop)
  for (let i = 0; i < 100; i++) {
    if (await ping(port)) return { port, url: `redis://127.0.0.1:${port}`, stop }
    await new Promise((r) => setTimeout(r, 50))
  }
  stop()
  throw new Error('redis-server did not start')
}

function percentile(xs, p) {
  if (xs.length === 0) return 0
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]
}

module.exports = { startRedis, freePort, percentile }
