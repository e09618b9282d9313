'use strict'
// The read lanes a Redis server lists (CLIENT LIST, by the lane's name), for the lane suites.
// `server`: anything with `cmd(...args)` (RedisServer, RedisNode).
const { waitFor } = require('./redis-server')

const LANE = 'stampede-cache:read-lane'

/** CLIENT LIST entries, as objects of their fields. */
async function clients(redis) {
  const text = String(await redis.cmd('CLIENT', 'LIST'))
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) =>
      Object.fromEntries(
        line
          .trim()
          .split(' ')
          .map((kv) => kv.split('=', 2)),
      ),
    )
}

async function lanes(redis) {
  return (await clients(redis)).filter((c) => c.name === LANE)
}

// What the lane ran last once it carried reads: each batch of GETs ends with its ECHO mark
// (its handshake ends with CLIENT SETNAME, after its own ECHO).
const CARRIED = new Set(['get', 'echo'])

/** Reads until the lane is open and has carried a GET (it opens in the background). */
async function laneCarrying(redis, read) {
  await waitFor(
    async () => {
      await read()
      return (await lanes(redis)).some((c) => CARRIED.has(c.cmd))
    },
    { what: 'the read lane to carry GETs' },
  )
  return (await lanes(redis)).find((c) => CARRIED.has(c.cmd))
}

module.exports = { LANE, clients, lanes, laneCarrying }
