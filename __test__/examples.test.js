'use strict'
// The runnable examples, exercised as a user would run them.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const { StampedeCache } = require('..')
const { createServer, createFeedSource } = require('../examples/plain/server.js')

function get(port, path) {
  return new Promise((resolve, reject) => {
    const agent = new http.Agent({ keepAlive: false })
    http
      .get({ host: '127.0.0.1', port, path, agent }, (res) => {
        let body = ''
        res.on('data', (d) => (body += d))
        res.on('end', () => resolve({ status: res.statusCode, body }))
      })
      .on('error', reject)
  })
}

test('plain node:http example: 200 concurrent requests to a cold feed make one query', async (t) => {
  const cache = new StampedeCache({ ttl: 60_000 })
  const source = createFeedSource()
  const server = createServer({ cache, source })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(async () => {
    server.close()
    await cache.close()
  })
  const { port } = server.address()
  const responses = await Promise.all(Array.from({ length: 200 }, () => get(port, '/feed/42')))
  assert.ok(responses.every((r) => r.status === 200))
  const bodies = new Set(responses.map((r) => r.body))
  assert.equal(bodies.size, 1, 'every request got the same feed')
  assert.equal(JSON.parse([...bodies][0]).userId, '42')
  assert.equal(source.queries, 1)
  // Another user's feed is another key: one more query, no more.
  await Promise.all(Array.from({ length: 20 }, () => get(port, '/feed/7')))
  assert.equal(source.queries, 2)
  assert.equal((await get(port, '/nope')).status, 404)
})
