'use strict'
// Helpers for benches that need their own redis-server on a free loopback port.
const { spawn, execFileSync } = require('node:child_process')
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

/** Sends one command (RESP) to 127.0.0.1:port; resolves with a simple or bulk string reply. */
function command(port, ...args) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1')
    let buf = Buffer.alloc(0)
    sock.once('error', reject)
    sock.once('connect', () => {
      sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join(''))
    })
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d])
      const eol = buf.indexOf('\r\n')
      if (eol < 0) return
      const head = buf.subarray(0, eol).toString()
      if (head[0] === '-') {
        sock.destroy()
        reject(new Error(head.slice(1)))
      } else if (head[0] === '$') {
        const len = Number(head.slice(1))
        if (len < 0 || buf.length >= eol + 2 + len) {
          sock.destroy()
          resolve(len < 0 ? null : buf.subarray(eol + 2, eol + 2 + len).toString())
        }
      } else {
        sock.destroy()
        resolve(head.slice(1))
      }
    })
  })
}

/**
 * A private redis-server on a free port. `callgrind: true` runs it under valgrind's callgrind,
 * and the answer's `instructions()` reads how many user-space instructions it has executed so far
 * (`callgrind_control -e`, summed over its threads): a count that does not move with what else
 * the machine runs, unlike its CPU time. It leaves out the kernel's work (sockets), and the server
 * runs some 50 times slower.
 */
async function startRedis({ callgrind = false } = {}) {
  const port = await freePort()
  // REDIS_SERVER=valkey-server measures against Valkey.
  const server = [process.env.REDIS_SERVER || 'redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']
  const argv = callgrind ? ['valgrind', '--tool=callgrind', '--callgrind-out-file=/dev/null', ...server] : server
  const proc = spawn(argv[0], argv.slice(1), { stdio: 'ignore' })
  const stop = () => {
    if (proc.exitCode === null) proc.kill('SIGKILL')
  }
  process.once('exit', stop)
  const instructions = () => {
    const text = execFileSync('callgrind_control', ['-e', String(proc.pid)]).toString()
    return [...text.matchAll(/^\s*Th \d+\s+([\d,]+)/gm)].reduce((n, m) => n + Number(m[1].replaceAll(',', '')), 0)
  }
  for (let i = 0; i < (callgrind ? 600 : 100); i++) {
    if (await ping(port)) {
      return {
        port,
        url: `redis://127.0.0.1:${port}`,
        stop,
        flushAll: () => command(port, 'FLUSHALL'),
        command: (...args) => command(port, ...args),
        instructions: callgrind ? instructions : null,
      }
    }
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

module.exports = { startRedis, freePort, percentile, command }
