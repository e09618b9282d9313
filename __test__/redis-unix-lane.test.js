'use strict'
// The read lane over a Unix socket (the libuv lane on Node; redis-socket-lane.test.js runs this
// file again on the socket lane, which Bun and Deno take): reads over one take the lane, a killed
// lane costs nothing, and a hostile reply on it (a proxy on a Unix socket between the cache and
// a private redis-server) closes it, with no read given another key's value.
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')
const { RedisNode, killTopologySync } = require('./helpers/redis-topology')
const { waitFor } = require('./helpers/redis-server')
const { LANE, lanes, laneCarrying } = require('./helpers/lanes')
const { StampedeCache } = require('..')

after(() => killTopologySync())

const mustNotLoad = () => {
  throw new Error('Redis is up: the value must come from it')
}

/** A private redis-server that listens on a Unix socket too: { node, socket }. */
async function unixServer(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-socket-lane-'))
  const socket = path.join(dir, 'redis.sock')
  const node = await new RedisNode('socket-lane', { dir, conf: () => [`unixsocket ${socket}`, 'unixsocketperm 700'] }).start()
  t.after(async () => {
    await node.dispose()
    fs.rmSync(dir, { recursive: true, force: true })
  })
  return { node, socket }
}

test('over a Unix socket: reads take the lane, values and counts as before; a killed lane costs the reads in flight nothing', {
  timeout: 60_000,
}, async (t) => {
  const { node, socket } = await unixServer(t)
  const writer = new StampedeCache({ redis: `unix://${socket}`, namespace: 'sl', ttl: 60_000 })
  const reader = new StampedeCache({ redis: `unix://${socket}`, namespace: 'sl', ttl: 60_000, l1: false })
  t.after(() => Promise.all([writer.close(), reader.close()]))
  for (let i = 0; i < 50; i++) await writer.set(`k${i}`, { i, text: 'x'.repeat(i * 300) })
  const first = await laneCarrying(node, () => reader.get('k0'))
  assert.match(first.addr, /redis\.sock/, `the lane reaches the Unix socket: ${JSON.stringify(first)}`)
  const values = await Promise.all(Array.from({ length: 500 }, (_, n) => reader.getOrLoad(`k${n % 50}`, mustNotLoad)))
  values.forEach((v, n) => assert.deepEqual(v, { i: n % 50, text: 'x'.repeat((n % 50) * 300) }))
  await writer.set('big', { data: 'y'.repeat(3_000_000) })
  const mixed = await Promise.all([reader.get('big'), reader.get('k1'), reader.get('absent'), reader.get('big')])
  assert.equal(mixed[0].data.length, 3_000_000)
  assert.deepEqual(mixed[1], { i: 1, text: 'x'.repeat(300) })
  assert.equal(mixed[2], undefined)
  assert.equal(mixed[3].data, mixed[0].data)
  for (let round = 0; round < 3; round++) {
    const lane = await laneCarrying(node, () => reader.get('k0'))
    const reads = Array.from({ length: 256 }, (_, n) => reader.getOrLoad(`k${n % 50}`, mustNotLoad))
    await node.cmd('CLIENT', 'KILL', 'ID', lane.id)
    ;(await Promise.all(reads)).forEach((v, n) => assert.equal(v.i, n % 50))
  }
  const after = await laneCarrying(node, () => reader.get('k2'))
  assert.notEqual(after.id, first.id, 'a new lane')
  assert.equal(reader.stats().loads, 0)
  assert.equal(reader.stats().redisErrors, 0, "a lane's loss alone does not take Redis down")
})

/**
 * A proxy on a Unix socket in front of `target` (another Unix socket). Once `arm()` is called,
 * the next chunk Redis sends the lane (the connection that named itself the read lane) gets
 * `extra` in front of it, once.
 */
async function unixProxy(t, target, extra) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-socket-proxy-'))
  const listen = path.join(dir, 'proxy.sock')
  const state = { armed: false, injected: 0 }
  const sockets = new Set()
  const server = net.createServer((client) => {
    const upstream = net.connect({ path: target })
    sockets.add(client)
    sockets.add(upstream)
    let lane = false
    client.on('data', (d) => {
      if (d.includes(LANE)) lane = true
      upstream.write(d)
    })
    upstream.on('data', (d) => {
      if (lane && state.armed) {
        state.armed = false
        state.injected++
        client.write(Buffer.concat([Buffer.from(extra), d]))
      } else client.write(d)
    })
    const end = () => {
      client.destroy()
      upstream.destroy()
    }
    client.on('error', end).on('close', end)
    upstream.on('error', end).on('close', end)
  })
  await new Promise((resolve) => server.listen(listen, resolve))
  t.after(() => {
    for (const s of sockets) s.destroy()
    server.close()
    fs.rmSync(dir, { recursive: true, force: true })
  })
  return { url: `unix://${listen}`, arm: () => (state.armed = true), state }
}

for (const [fault, extra] of [
  ['an extra status reply', '+OK\r\n'],
  ['an extra nil reply', '$-1\r\n'],
  ['a push frame', '>2\r\n$7\r\nmessage\r\n$1\r\nx\r\n'],
  ['a declared length above 512 MiB', '$1099511627776\r\n'],
]) {
  test(`over a Unix socket: ${fault} on the lane closes it; no read gets another key's value, and the lane opens again`, { timeout: 60_000 }, async (t) => {
    const { node, socket } = await unixServer(t)
    const proxy = await unixProxy(t, socket, extra)
    const errors = []
    const writer = new StampedeCache({ redis: `unix://${socket}`, namespace: 'sh', ttl: 60_000 })
    const reader = new StampedeCache({ redis: proxy.url, namespace: 'sh', ttl: 60_000, l1: false, onError: (e) => errors.push(e) })
    t.after(() => Promise.all([writer.close(), reader.close()]))
    for (let i = 0; i < 64; i++) await writer.set(`k${i}`, `v${i}`)
    const lane = await laneCarrying(node, () => reader.get('k0'))
    proxy.arm()
    const values = await Promise.all(Array.from({ length: 128 }, (_, n) => reader.getOrLoad(`k${n % 64}`, mustNotLoad)))
    values.forEach((v, n) => assert.equal(v, `v${n % 64}`, `read ${n}`))
    assert.equal(proxy.state.injected, 1, 'the fault was injected')
    await waitFor(async () => !(await lanes(node)).some((c) => c.id === lane.id), { what: 'the hostile lane to close' })
    const again = await laneCarrying(node, () => reader.get('k1'))
    assert.notEqual(again.id, lane.id, 'a new lane')
    for (let n = 0; n < 64; n++) assert.equal(await reader.get(`k${n}`), `v${n}`)
    assert.equal(reader.stats().loads, 0)
    assert.ok(errors.length >= 1, 'reported to onError')
  })
}
