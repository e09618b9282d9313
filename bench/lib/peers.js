'use strict'
// Every cache the bench compares, behind one tiny interface, each in its best documented
// stampede-protective configuration (CONFIGS below is what the report prints).
//
//   const peer = await createPeer(name, { redisUrl, ttl, hardTtl, negativeTtl })
//   peer.setLoader((key) => value | Promise<value>)   // what a miss or a refresh calls
//   await peer.warm()                                 // connections up before anything is timed
//   await peer.get(key)                               // the read under test
//   await peer.close()
//
// ttl is how long an entry is fresh; hardTtl how long it lives at all (stale included). Each peer
// maps the pair onto its own options, listed in CONFIGS.

const CONFIGS = {
  'stampede-cache': {
    label: 'stampede-cache',
    config:
      'new StampedeCache({ redis, ttl, hardTtl }) and its defaults: L1 10,000 entries, jitter 0.1, XFetch beta 1, lockTtl 10 s, ' +
      'errorBackoff 5 s; negativeTtl = the scenario ttl in scenario 6 (5 s default elsewhere); read: cache.getOrLoad(key, loader)',
  },
  bentocache: {
    label: 'bentocache',
    config:
      'bentostore().useL1Layer(memoryDriver({ maxItems: 10_000 })).useL2Layer(redisDriver(ioredis)).useBus(redisBusDriver(ioredis)); ' +
      'getOrSet({ key, factory, ttl, grace: hardTtl }), graceBackoff 5 s, timeout 0 (the default: a graced value is returned at once and the factory runs in the background)',
  },
  'cache-manager': {
    label: 'cache-manager',
    config:
      'createCache({ stores: [new Keyv() (no serialization), createKeyv(redisUrl) from @keyv/redis], ttl: hardTtl, refreshThreshold: hardTtl - ttl, refreshAllStores: true }); ' +
      'read: cache.wrap(key, loader) (coalesced per process; a value whose remaining ttl is under refreshThreshold is refreshed in the background)',
  },
  cachified: {
    label: '@epic-web/cachified',
    config:
      'cachified({ key, cache: ioredisAdapter, ttl, staleWhileRevalidate: hardTtl - ttl, getFreshValue: loader }); the adapter stores the CacheEntry as JSON with SET PX totalTtl(metadata) ' +
      '(pending values are deduplicated per process)',
  },
  'async-cache-dedupe': {
    label: 'async-cache-dedupe',
    config:
      "createCache({ ttl: ttl/1000, stale: (hardTtl - ttl)/1000, storage: { type: 'redis', options: { client: ioredis } } }).define('load', loader); read: cache.load(key) (ttl and stale are whole seconds)",
  },
  naive: {
    label: 'naive cache-aside',
    config: 'ioredis: GET; on a miss call the loader, then SET key JSON PX ttl; no coalescing, no stale serving',
  },
  'lru-cache': {
    label: 'lru-cache 11 fetch',
    config:
      'new LRUCache({ max: 10_000, ttl: hardTtl, fetchMethod: loader }); read: await lru.fetch(key) (in process only: what most Node users reach for; scenario 4 only)',
  },
  map: {
    label: 'plain Map (limit)',
    config: 'await map.get(key) on a prefilled JS Map: the physical limit of an in-process hit (scenario 4 only)',
  },
}

const PEERS = ['stampede-cache', 'bentocache', 'cache-manager', 'cachified', 'async-cache-dedupe', 'naive']
/** In-process baselines of scenario 4, beside the peers: not stampede-protective across processes. */
const BASELINES = ['lru-cache', 'map']

function redisConnection(url) {
  const u = new URL(url)
  return { host: u.hostname, port: Number(u.port) }
}

function withTimeout(promise, ms) {
  return Promise.race([promise, new Promise((resolve) => setTimeout(resolve, ms).unref())])
}

async function createPeer(name, { redisUrl, ttl, hardTtl, negativeTtl }) {
  let loader = () => {
    throw new Error('no loader set')
  }
  const callLoader = (key) => loader(key)
  const peer = { name, setLoader: (fn) => (loader = fn) }

  switch (name) {
    case 'stampede-cache': {
      const { StampedeCache } = require('../..')
      const opts = { redis: redisUrl, namespace: 'sc', ttl, hardTtl }
      if (negativeTtl !== undefined) opts.negativeTtl = negativeTtl
      const cache = new StampedeCache(opts)
      const load = (ctx) => callLoader(ctx.key)
      peer.get = (key) => cache.getOrLoad(key, load)
      peer.warm = () => cache.get('__warm__')
      peer.close = () => cache.close()
      peer.stats = () => cache.stats()
      return peer
    }
    case 'bentocache': {
      const { BentoCache, bentostore } = await import('bentocache')
      const { memoryDriver } = await import('bentocache/drivers/memory')
      const { redisDriver, redisBusDriver } = await import('bentocache/drivers/redis')
      const connection = redisConnection(redisUrl)
      const bento = new BentoCache({
        default: 'cache',
        ttl,
        grace: hardTtl,
        graceBackoff: 5_000,
        stores: {
          cache: bentostore()
            .useL1Layer(memoryDriver({ maxItems: 10_000 }))
            .useL2Layer(redisDriver({ connection }))
            .useBus(redisBusDriver({ connection })),
        },
      })
      peer.get = (key) => bento.getOrSet({ key, factory: () => callLoader(key), ttl, grace: hardTtl })
      peer.warm = async () => {
        await bento.get({ key: '__warm__' })
        // The bus subscribes on first use; give it a moment so invalidations are not lost.
        await new Promise((r) => setTimeout(r, 50))
      }
      peer.close = () => withTimeout(bento.disconnect(), 2_000)
      return peer
    }
    case 'cache-manager': {
      const { createCache } = require('cache-manager')
      const { Keyv } = require('keyv')
      const { createKeyv } = require('@keyv/redis')
      const l1 = new Keyv()
      // Keyv's documented switch for in-memory stores: keep the objects, skip the JSON.
      l1.serialize = undefined
      l1.deserialize = undefined
      const l2 = createKeyv(redisUrl)
      const cache = createCache({ stores: [l1, l2], ttl: hardTtl, refreshThreshold: hardTtl - ttl, refreshAllStores: true })
      peer.get = (key) => cache.wrap(key, () => callLoader(key))
      peer.warm = () => l2.get('__warm__')
      peer.close = () => withTimeout(cache.disconnect(), 2_000)
      return peer
    }
    case 'cachified': {
      const { cachified, totalTtl } = require('@epic-web/cachified')
      const Redis = require('ioredis')
      const redis = new Redis(redisConnection(redisUrl))
      // The "small ioredis adapter": cachified's Cache interface over GET / SET PX / DEL.
      const cache = {
        name: 'ioredis',
        async get(key) {
          const s = await redis.get(`cf:${key}`)
          return s === null ? null : JSON.parse(s)
        },
        async set(key, entry) {
          const ttlMs = totalTtl(entry && entry.metadata)
          const s = JSON.stringify(entry)
          if (ttlMs === Infinity) await redis.set(`cf:${key}`, s)
          else await redis.set(`cf:${key}`, s, 'PX', Math.max(1, Math.ceil(ttlMs)))
        },
        async delete(key) {
          await redis.del(`cf:${key}`)
        },
      }
      const swr = hardTtl - ttl
      peer.get = (key) => cachified({ key, cache, ttl, staleWhileRevalidate: swr, getFreshValue: () => callLoader(key) })
      peer.warm = () => redis.ping()
      peer.close = () => withTimeout(redis.quit(), 2_000)
      return peer
    }
    case 'async-cache-dedupe': {
      const { createCache } = require('async-cache-dedupe')
      const Redis = require('ioredis')
      const redis = new Redis(redisConnection(redisUrl))
      const cache = createCache({
        ttl: Math.max(1, Math.round(ttl / 1000)),
        stale: Math.round((hardTtl - ttl) / 1000),
        storage: { type: 'redis', options: { client: redis } },
      })
      cache.define('load', (key) => callLoader(key))
      peer.get = (key) => cache.load(key)
      peer.warm = () => redis.ping()
      peer.close = () => withTimeout(redis.quit(), 2_000)
      return peer
    }
    case 'naive': {
      const Redis = require('ioredis')
      const redis = new Redis(redisConnection(redisUrl))
      peer.get = async (key) => {
        const s = await redis.get(`naive:${key}`)
        if (s !== null) return JSON.parse(s)
        const value = await callLoader(key)
        await redis.set(`naive:${key}`, JSON.stringify(value), 'PX', ttl)
        return value
      }
      peer.warm = () => redis.ping()
      peer.close = () => withTimeout(redis.quit(), 2_000)
      return peer
    }
    case 'lru-cache': {
      const { LRUCache } = require('lru-cache')
      // fetch() coalesces concurrent misses of one key in process; ttl is the whole life (no
      // stale serving is configured, as a user swapping a Map for it would).
      const lru = new LRUCache({ max: 10_000, ttl: hardTtl, fetchMethod: (key) => callLoader(key) })
      peer.get = (key) => lru.fetch(key)
      peer.warm = async () => {}
      peer.close = async () => {}
      return peer
    }
    case 'map': {
      const map = new Map()
      // Synchronous on a hit, like `await map.get(k)` in bench/hit-path.js.
      peer.get = (key) => {
        const v = map.get(key)
        if (v !== undefined) return v
        return Promise.resolve(callLoader(key)).then((value) => {
          map.set(key, value)
          return value
        })
      }
      peer.warm = async () => {}
      peer.close = async () => {}
      return peer
    }
    default:
      throw new Error(`unknown peer ${name}`)
  }
}

module.exports = { createPeer, CONFIGS, PEERS, BASELINES }
