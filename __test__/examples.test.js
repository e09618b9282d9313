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

test("graphql example: a list of users is one loadMany call for the misses; a failed user is that item's field error", async (t) => {
  const { createUserDb, run: runQuery } = require('../examples/graphql/users.js')
  const cache = new StampedeCache({ ttl: 60_000 })
  t.after(() => cache.close())
  const db = createUserDb({ broken: new Set(['13']) })
  const source = 'query ($ids: [ID!]!) { users(ids: $ids) { id name } }'
  // graphql-js answers with null-prototype objects: compare them as the JSON a client gets.
  const run = async (args) => JSON.parse(JSON.stringify(await runQuery(args)))
  const ids = [...Array.from({ length: 50 }, (_, i) => String(i)), '99999', '7']
  const first = await run({ cache, db, source, variableValues: { ids } })
  assert.equal(first.data.users.length, 52)
  assert.deepEqual(first.data.users[7], { id: '7', name: 'User 7' })
  assert.equal(first.data.users[13], null, 'the broken user is null in the list')
  assert.equal(first.data.users[50], null, 'a missing user is null, with no error')
  assert.equal(first.errors.length, 1)
  assert.deepEqual(first.errors[0].path, ['users', 13])
  assert.match(first.errors[0].message, /corrupt/)
  assert.deepEqual([db.queries, db.idsAsked], [1, 51], 'one query; the duplicate id asked once')

  const second = await run({ cache, db, source, variableValues: { ids } })
  assert.deepEqual(second.data.users.slice(0, 5), first.data.users.slice(0, 5))
  assert.deepEqual([db.queries, db.idsAsked], [2, 52], 'only the failed user is asked again (errors are never cached)')

  // Nested lists: each team's members come from the cache too (the users above are hits).
  const nested = await run({ cache, db, source: '{ team(id: "3") { name members { id name } } }' })
  assert.deepEqual(
    nested.data.team.members.map((m) => m && m.id),
    ['3', null, '23', '33', '43'],
    'member 13 is the broken user',
  )
  assert.deepEqual(nested.errors[0].path, ['team', 'members', 1])
  assert.deepEqual([db.queries, db.idsAsked], [4, 53], 'the team query, and one users query for the failed member alone')
})
