// Counts the runs of a computation in Redis (INCR on a counter key), so runs are counted across
// every instance. A few lines of RESP instead of a Redis client: the example depends on nothing
// but Next.js and stampede-cache. With no Redis (down, or REDIS_URL unset), the run counts as -1
// within 500 ms: the computation itself never fails because of the counter.
import net from 'node:net'

export function countRun(key) {
  const url = process.env.REDIS_URL
  if (!url) return Promise.resolve(-1)
  const { hostname, port } = new URL(url)
  return new Promise((resolve) => {
    const socket = net.connect({ host: hostname, port: Number(port || 6379) })
    let reply = ''
    const done = (n) => {
      socket.destroy()
      resolve(n)
    }
    socket.setTimeout(500, () => done(-1))
    socket.on('error', () => done(-1))
    socket.on('connect', () => socket.write(`*2\r\n$4\r\nINCR\r\n$${Buffer.byteLength(key)}\r\n${key}\r\n`))
    socket.on('data', (chunk) => {
      reply += chunk
      const m = /^:(-?\d+)\r\n/.exec(reply)
      if (m) done(Number(m[1]))
      else if (reply.includes('\r\n')) done(-1)
    })
  })
}
