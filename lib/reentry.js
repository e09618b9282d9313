'use strict'
// A loader never waits for itself (README, "Where the contract is silent"; docs/CONTRACT.md,
// "The rest"): every loader and loadMany call runs inside a scope naming the entries it loads, so a
// getOrLoad or getOrLoadMany made inside it for one of those entries (in this cache, or another
// one sharing its Redis and namespace) can tell, and run its own loader directly instead of
// joining the load it is part of. Only the slow path asks (a miss, a lead, a join): the hot path
// never reads the scope.
const { AsyncLocalStorage } = require('node:async_hooks')

/** The innermost load the running code is part of (a Scope), or undefined. */
const loadScope = new AsyncLocalStorage()

// Loader calls running now. While none runs the storage is disabled: on Node.js 20 and 22 an
// enabled AsyncLocalStorage hooks every promise the process makes (measured with
// bench/hit-path.js: a fresh hit's `await` took 2x to 3x longer, and so did a Map's), so a
// process that only reads its cache pays nothing; the next load enables it again.
let running = 0
const canDisable = typeof loadScope.disable === 'function'

// One load's entries: `one` (a single key's load) or `many` (a loadMany call's), and the scope it
// runs in. A chain as deep as the nesting of loads, never copied. `ended` once the loader's
// promise has settled: code it left behind (a timer, a promise chain) inherits the scope, but no
// longer runs inside that load.
class Scope {
  constructor(one, many, outer) {
    this.one = one
    this.many = many
    this.outer = outer
    this.ended = false
  }
}

// Runs `fn` (a loader call) in `scope`; returns what it returns, and ends the scope once that has
// settled.
function runIn(scope, fn) {
  running++
  const end = () => {
    scope.ended = true
    if (--running === 0 && canDisable) loadScope.disable()
  }
  let result
  try {
    result = loadScope.run(scope, fn)
  } catch (err) {
    end()
    throw err
  }
  if (result === null || typeof result !== 'object' || typeof result.then !== 'function') {
    end()
    return result
  }
  Promise.resolve(result).then(end, end)
  return result
}

/** Runs `fn` as the load of entry `id` (see `storeOf`). */
function asLoadOf(id, fn) {
  return runIn(new Scope(id, null, loadScope.getStore()), fn)
}

/** Runs `fn` as the load of every entry in the Set `ids`. */
function asLoadOfMany(ids, fn) {
  return runIn(new Scope(null, ids, loadScope.getStore()), fn)
}

/** Whether the running code is part of any load at all (cheap: no walk). */
function inLoad() {
  return loadScope.getStore() !== undefined
}

/** Whether the running code is part of a load of entry `id`. */
function inLoadOf(id) {
  for (let s = loadScope.getStore(); s !== undefined; s = s.outer) {
    if (!s.ended && (s.one === id || (s.many !== null && s.many.has(id)))) return true
  }
  return false
}

let nextLocal = 0

/**
 * The prefix of the entry identities of a cache built with `options` (an entry is this prefix and
 * its encoded key): caches sharing a Redis server, database and namespace share their entries, so
 * their prefixes are equal; an in-process cache shares its entries with no other.
 */
function storeOf(options) {
  const namespace = options?.namespace ?? 'sc'
  const redis = options?.redis
  const where = redis === undefined || redis === null ? `local#${nextLocal++}` : `redis ${redisPlace(redis)}`
  return `${where}\n${namespace}\n`
}

// Where a Redis configuration points (the server or cluster, and the database), without its
// credentials: two spellings of one place give one answer. An option the constructor refuses never
// gets here.
function redisPlace(redis) {
  if (typeof redis === 'string') return urlPlace(redis)
  if (Array.isArray(redis.cluster)) return `cluster ${redis.cluster.map(urlPlace).sort().join(' ')}`
  if (Array.isArray(redis.sentinels)) return `sentinel ${redis.masterName} ${redis.sentinels.map(urlPlace).sort().join(' ')} db ${redis.db ?? 0}`
  const url = typeof redis.url === 'string' ? urlPlace(redis.url) : null
  if (url !== null && redis.host === undefined && redis.port === undefined && redis.path === undefined && redis.db === undefined) return url
  if (typeof redis.path === 'string') return `unix ${redis.path} db ${redis.db ?? 0}`
  return `tcp ${host(redis.host ?? '127.0.0.1')}:${redis.port ?? 6379} db ${redis.db ?? 0}`
}

function urlPlace(text) {
  let url
  try {
    url = new URL(text)
  } catch {
    return `url ${text}`
  }
  const tls = url.protocol === 'rediss:' || url.protocol === 'valkeys:'
  const db = url.searchParams.get('db') ?? (url.pathname.replace(/^\//, '') || '0')
  if (url.protocol === 'unix:') return `unix ${url.pathname} db ${url.searchParams.get('db') ?? 0}`
  return `${tls ? 'tls' : 'tcp'} ${host(url.hostname)}:${url.port || 6379} db ${db}`
}

// localhost and the loopback address are one server.
function host(name) {
  const h = name.toLowerCase().replace(/^\[|\]$/g, '')
  return h === 'localhost' || h === '::1' ? '127.0.0.1' : h
}

module.exports = { asLoadOf, asLoadOfMany, inLoad, inLoadOf, storeOf }
