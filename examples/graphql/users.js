'use strict'
// A GraphQL API (graphql-js) whose list fields load users through getOrLoadMany: one cache call
// per list, one database query for only the users no cache tier holds, and a user that fails
// (or is missing) becomes that item's field error (or null), not the whole query's.
//
//   node examples/graphql/users.js            # runs a query twice and prints the database's count
//
// DataLoader and getOrLoadMany combine: DataLoader batches the ids that resolvers ask for in one
// tick of one request; getOrLoadMany caches them across requests and processes. Give DataLoader
// `(ids) => cache.getOrLoadMany(ids, (missing) => db.usersByIds(missing))` as its batch function.
const { graphql, buildSchema } = require('graphql')
const { StampedeCache } = require('../..')

const schema = buildSchema(`
  type User {
    id: ID!
    name: String!
    team: Team
  }
  type Team {
    id: ID!
    name: String!
    members: [User]!
  }
  type Query {
    users(ids: [ID!]!): [User]!
    team(id: ID!): Team
  }
`)

/** A users table behind a slow query; counts queries and the ids they asked for. */
function createUserDb({ size = 10_000, broken = new Set() } = {}) {
  const db = {
    queries: 0,
    idsAsked: 0,
    async usersByIds(ids) {
      db.queries++
      db.idsAsked += ids.length
      await new Promise((r) => setTimeout(r, 10))
      // DataLoader's convention: one result per id, in order; null for none, an Error for one that failed.
      return ids.map((id) => {
        if (broken.has(id)) return new Error(`user ${id}: row is corrupt`)
        const n = Number(id)
        if (!Number.isInteger(n) || n < 0 || n >= size) return null
        return { id, name: `User ${id}`, teamId: String(n % 10) }
      })
    },
    async teamById(id) {
      db.queries++
      return { id, name: `Team ${id}`, memberIds: Array.from({ length: 5 }, (_, i) => String(Number(id) + 10 * i)) }
    },
  }
  return db
}

/** The root value: resolvers over `cache` and `db`. */
function createRoot({ cache, db }) {
  const users = (ids) =>
    cache.getOrLoadMany(
      ids.map((id) => ['user', id]),
      (keys) => db.usersByIds(keys.map(([, id]) => id)),
    )
  const withTeam = (user) =>
    user instanceof Error || user === null ? user : { ...user, team: () => cache.getOrLoad(['team', user.teamId], () => db.teamById(user.teamId)).then(team) }
  const team = (t) => t && { ...t, members: () => users(t.memberIds).then((list) => list.map(withTeam)) }
  return {
    users: ({ ids }) => users(ids).then((list) => list.map(withTeam)),
    team: ({ id }) => cache.getOrLoad(['team', id], () => db.teamById(id)).then(team),
  }
}

function run({ cache, db, source, variableValues }) {
  return graphql({ schema, source, rootValue: createRoot({ cache, db }), variableValues })
}

module.exports = { schema, createUserDb, createRoot, run }

if (require.main === module) {
  ;(async () => {
    const cache = new StampedeCache({ ttl: 60_000 })
    const db = createUserDb()
    const source = 'query ($ids: [ID!]!) { users(ids: $ids) { id name team { name members { id } } } }'
    const ids = Array.from({ length: 100 }, (_, i) => String(i))
    const first = await run({ cache, db, source, variableValues: { ids } })
    console.log(`first query: ${first.data.users.length} users, ${db.queries} database queries`)
    await run({ cache, db, source, variableValues: { ids } })
    console.log(`second query: ${db.queries} database queries in all (all hits)`)
    await cache.close()
  })()
}
