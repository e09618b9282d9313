'use strict'
// Plain Node.js: an HTTP endpoint that reads through the cache. Run it with
//   node examples/plain/server.js            (in-process cache)
//   REDIS_URL=redis://127.0.0.1:6379 node examples/plain/server.js   (shared across instances)
// then: curl localhost:3000/feed/42
const http = require('node:http')
const { StampedeCache } = require('../..')

// Stands in for a slow query: 50 ms per call.
function createFeedSource() {
  const source = {
    queries: 0,
    async loadFeed(userId) {
      source.queries++
      await new Promise((resolve) => setTimeout(resolve, 50))
      return { userId, items: [`post-${userId}-1`, `post-${userId}-2`], builtAt: new Date().toISOString() }
    },
  }
  return source
}

function createServer({ cache, source }) {
  return http.createServer(async (req, res) => {
    const match = /^\/feed\/(\w+)$/.exec(req.url ?? '')
    if (!match) {
      res.writeHead(404).end()
      return
    }
    try {
      // One query per user feed per ttl, however many requests arrive at once.
      const feed = await cache.getOrLoad(['feed', match[1]], () => source.loadFeed(match[1]))
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(feed))
    } catch (err) {
      res.writeHead(500, { 'content-type': 'text/plain' }).end(String(err.message))
    }
  })
}

module.exports = { createServer, createFeedSource }

if (require.main === module) {
  const cache = new StampedeCache({ redis: process.env.REDIS_URL, ttl: 30_000 })
  const server = createServer({ cache, source: createFeedSource() })
  server.listen(Number(process.env.PORT ?? 3000), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}/feed/42`)
  })
  const shutdown = () => server.close(() => cache.close())
  process.once('SIGINT', shutdown)
  process.once('SIGTERM', shutdown)
}
