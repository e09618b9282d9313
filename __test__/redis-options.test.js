'use strict'
// RedisOptions in ioredis's spelling (docs/CONTRACT.md, Constructing): `host`, `port`, `path`,
// `username`, `password`, `db` name the same server a URL would, alone or with `url` (each part
// given once), and every bad one is an ERR_INVALID_OPTION naming it, never quoting a password.
// A real redis-server on a free loopback port and a Unix socket, an ACL user and a db other than
// 0: a value written through one spelling is read through the others.

const { describe, test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { StampedeCache } = require('..')
const { RedisNode, addAclUser, killTopologySync } = require('./helpers/redis-topology')
const { newNamespace } = require('./helpers/redis-server')

after(() => killTopologySync())

// A password with every character a URL would need escaped.
const PASSWORD = 'p@ss:w/rd%?#&= x'
const USER = 'app'
const DB = 3

/** `fn` throws ERR_INVALID_OPTION naming `name`, and no message of it quotes `secret`. */
function assertRefused(fn, name, secret = PASSWORD) {
  assert.throws(fn, (err) => {
    assert.equal(err.code, 'ERR_INVALID_OPTION', err.message)
    assert.match(err.message, new RegExp(`\\b${name.replace('.', '\\.')}\\b`), err.message)
    assert.ok(!err.message.includes(secret), `the message quotes the password: ${err.message}`)
    assert.ok(!String(err.stack).includes(secret), 'the stack quotes the password')
    return true
  })
}

describe('RedisOptions in ioredis spelling', { timeout: 60_000 }, () => {
  let node
  let socket
  let namespace
  before(async () => {
    node = new RedisNode('options')
    socket = path.join(node.dir, 'redis.sock')
    node.confLines = () => [`unixsocket ${socket}`, 'unixsocketperm 700']
    await node.start()
    namespace = newNamespace('scopt')
    await addAclUser(node, { user: USER, password: PASSWORD, namespace })
  })
  after(() => node?.dispose())

  const url = () => `redis://${USER}:${encodeURIComponent(PASSWORD)}@127.0.0.1:${node.port}/${DB}`

  test('host, port, username, password and db reach the server the URL names; path its Unix socket', async () => {
    const viaParts = new StampedeCache({ namespace, redis: { host: '127.0.0.1', port: node.port, username: USER, password: PASSWORD, db: DB } })
    const viaUrl = new StampedeCache({ namespace, redis: url() })
    const viaSocket = new StampedeCache({ namespace, redis: { path: socket, username: USER, password: PASSWORD, db: DB } })
    try {
      await viaParts.set('k', { from: 'parts' })
      // In db 3, written as the ACL user: the raw server says so.
      const [, raw] = await node.pipeline([
        ['SELECT', String(DB)],
        ['EXISTS', `${namespace}:v:{k}`],
      ])
      assert.equal(raw, 1)
      assert.deepEqual(await viaUrl.get('k'), { from: 'parts' })
      assert.deepEqual(await viaSocket.get('k'), { from: 'parts' })
      await viaSocket.set('s', 2)
      assert.equal(await viaUrl.get('s'), 2)
      for (const c of [viaParts, viaUrl, viaSocket]) assert.equal(c.stats().redisErrors, 0)
    } finally {
      await Promise.all([viaParts.close(), viaUrl.close(), viaSocket.close()])
    }
  })

  test('a port alone means localhost; url plus the credentials and db it lacks', async () => {
    // The ACL user may not use the default user's keys; the default user here has no password.
    const portOnly = new StampedeCache({ namespace, redis: { port: node.port, db: DB } })
    const urlPlus = new StampedeCache({ namespace, redis: { url: `redis://127.0.0.1:${node.port}`, username: USER, password: PASSWORD, db: DB } })
    try {
      await urlPlus.set('u', 'plus')
      assert.equal(await portOnly.get('u'), 'plus')
      assert.equal(urlPlus.stats().redisErrors, 0)
      assert.equal(portOnly.stats().redisErrors, 0)
    } finally {
      await Promise.all([portOnly.close(), urlPlus.close()])
    }
  })

  test('a wrong password in the parts fails as a wrong one in the URL does, never quoted', async () => {
    const wrong = 'not-the-password-123'
    const errors = []
    const cache = new StampedeCache({
      namespace,
      redis: { host: '127.0.0.1', port: node.port, username: USER, password: wrong, connectTimeout: 500 },
      onError: (err) => errors.push(err),
    })
    try {
      assert.equal(await cache.getOrLoad('w', () => 'loaded'), 'loaded')
      await cache.set('w2', 1).catch(() => {})
      assert.ok(errors.length > 0, 'the refusal reaches onError')
      for (const err of errors) assert.ok(!err.message.includes(wrong), err.message)
    } finally {
      await cache.close()
    }
  })
})

describe('RedisOptions: what is refused, naming the option', () => {
  test('bad ports, dbs, hosts and paths', () => {
    for (const port of [0, -1, 65_536, 1.5, Number.NaN, Number.POSITIVE_INFINITY, '6379', null]) {
      assertRefused(() => new StampedeCache({ redis: { host: '127.0.0.1', port, password: PASSWORD } }), 'redis.port')
    }
    for (const db of [-1, 1.5, Number.NaN, 2 ** 32, '3', null]) {
      assertRefused(() => new StampedeCache({ redis: { host: '127.0.0.1', db, password: PASSWORD } }), 'redis.db')
    }
    for (const host of ['', 'a/b', 'a@b', 'a b', 5, null]) {
      assertRefused(() => new StampedeCache({ redis: { host, password: PASSWORD } }), 'redis.host')
    }
    for (const p of ['', 5]) {
      assertRefused(() => new StampedeCache({ redis: { path: p, password: PASSWORD } }), 'redis.path')
    }
    for (const name of ['username', 'password']) {
      assertRefused(() => new StampedeCache({ redis: { host: 'h', [name]: 5 } }), `redis.${name}`)
    }
  })

  test('combinations: each part given once, a Unix socket or a TCP address', () => {
    assertRefused(() => new StampedeCache({ redis: { url: 'redis://127.0.0.1:6380', host: 'h', password: PASSWORD } }), 'redis.host')
    assertRefused(() => new StampedeCache({ redis: { url: 'redis://127.0.0.1:6380', port: 6381, password: PASSWORD } }), 'redis.port')
    assertRefused(() => new StampedeCache({ redis: { url: 'redis://127.0.0.1:6380', path: '/tmp/s', password: PASSWORD } }), 'redis.path')
    assertRefused(() => new StampedeCache({ redis: { path: '/tmp/s', host: 'h', password: PASSWORD } }), 'redis.path')
    assertRefused(() => new StampedeCache({ redis: { path: '/tmp/s', port: 1, password: PASSWORD } }), 'redis.path')
    // Given in the URL and as an option: which one is meant is not guessed.
    const inUrl = 'url-secret-456'
    assertRefused(() => new StampedeCache({ redis: { url: `redis://:${inUrl}@127.0.0.1:6380`, password: PASSWORD } }), 'redis.password', inUrl)
    assertRefused(() => new StampedeCache({ redis: { url: `redis://:${inUrl}@127.0.0.1:6380`, password: PASSWORD } }), 'redis.password', PASSWORD)
    assertRefused(() => new StampedeCache({ redis: { url: `redis://u:${inUrl}@127.0.0.1:6380`, username: 'v' } }), 'redis.username', inUrl)
    assertRefused(() => new StampedeCache({ redis: { url: 'redis://127.0.0.1:6380/2', db: 3, password: PASSWORD } }), 'redis.db')
    assertRefused(() => new StampedeCache({ redis: { url: `unix:///tmp/s?db=2&pass=${inUrl}`, db: 3 } }), 'redis.db', inUrl)
    // A topology names its own servers.
    assertRefused(() => new StampedeCache({ redis: { cluster: ['redis://127.0.0.1:7000'], host: 'h', password: PASSWORD } }), 'redis.host')
    assertRefused(() => new StampedeCache({ redis: { cluster: ['redis://127.0.0.1:7000'], db: 1, password: PASSWORD } }), 'redis.db')
    assertRefused(() => new StampedeCache({ redis: { sentinels: ['redis://127.0.0.1:26379'], masterName: 'm', port: 1, password: PASSWORD } }), 'redis.port')
  })

  test('accepted: parts alone, with TLS, with a topology, and the unknown-name hint', async () => {
    const made = [
      new StampedeCache({ redis: { host: '127.0.0.1', port: 1, password: PASSWORD, connectTimeout: 50 } }),
      new StampedeCache({ redis: { host: '::1', port: 1, connectTimeout: 50 } }),
      new StampedeCache({ redis: { path: '/nonexistent/redis.sock', db: 2, connectTimeout: 50 } }),
      new StampedeCache({ redis: { host: 'localhost', port: 1, tls: { rejectUnauthorized: false }, connectTimeout: 50 } }),
      new StampedeCache({ redis: { cluster: ['redis://127.0.0.1:1'], password: PASSWORD, connectTimeout: 50 } }),
      new StampedeCache({ redis: { sentinels: ['redis://127.0.0.1:1'], masterName: 'm', password: PASSWORD, db: 1, connectTimeout: 50 } }),
      new StampedeCache({ redis: { url: 'redis://127.0.0.1:1', password: '', connectTimeout: 50 } }),
    ]
    await Promise.all(made.map((c) => c.close()))
    assert.throws(
      () => new StampedeCache({ redis: { host: 'h', keyPrefix: 'app:' } }),
      (err) => err.code === 'ERR_INVALID_OPTION' && /keyPrefix/.test(err.message) && /namespace/.test(err.message),
    )
    assert.throws(
      () => new StampedeCache({ redis: { hostname: 'h' } }),
      (err) => err.code === 'ERR_INVALID_OPTION' && /hostname/.test(err.message) && /host, port, path/.test(err.message),
    )
  })
})
