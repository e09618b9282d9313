'use strict'
// Connection failures say what to do (docs/CONTRACT.md, Constructing: RedisOptions): a TLS/plain
// mismatch (rediss:// to a plain server, redis:// to a TLS-only port), a certificate this client
// does not trust, one that does not carry the name asked for, a server that wants a client
// certificate, and a refused password, each reach onError (and a rejected set) with the reason
// in plain words and the option that fixes it, never a Rust debug dump.
// A private TLS-only redis-server and a plain one on free loopback ports (helpers/redis-topology.js).

const { describe, test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { StampedeCache } = require('..')
const { makeCertificates, RedisNode, protectDefaultUser, killTopologySync } = require('./helpers/redis-topology')
const { waitFor } = require('./helpers/redis-server')

after(() => killTopologySync())

/** What onError and a set() rejection say for `redis`, once Redis was tried a few times. */
async function saysFor(t, redis) {
  const messages = []
  const cache = new StampedeCache({ redis: { connectTimeout: 500, commandTimeout: 500, ...redis }, onError: (err) => messages.push(err.message) })
  t.after(() => cache.close())
  assert.equal(await cache.getOrLoad('k', () => 'loaded'), 'loaded', 'a read the loader can serve never fails')
  await waitFor(
    async () => {
      await cache.getOrLoad(`k${messages.length}`, () => 1)
      return messages.length > 0
    },
    { timeout: 10_000, what: 'a report' },
  )
  const rejected = await cache.set('s', 1).then(
    () => assert.fail('Redis cannot take it'),
    (err) => err.message,
  )
  return [...messages, rejected]
}

function assertSays(all, pattern, label) {
  for (const m of all) {
    assert.match(m, pattern, `${label}: ${m}`)
    assert.doesNotMatch(m, /IpAddress\(|DnsName\(|Some\(|Error \{/, `${label}: a debug dump: ${m}`)
  }
}

describe('connection failures say what to do', { timeout: 120_000 }, () => {
  let certs
  let tlsNode
  let mtlsNode
  let plain
  before(async () => {
    certs = makeCertificates(fs.mkdtempSync(path.join(os.tmpdir(), 'sc-tls-hints-')))
    tlsNode = new RedisNode('tls', { tls: { certs, authClients: 'no' } })
    mtlsNode = new RedisNode('mtls', { tls: { certs, authClients: 'yes' } })
    plain = new RedisNode('plain')
    await Promise.all([tlsNode.start(), mtlsNode.start(), plain.start()])
    await protectDefaultUser(plain, 'right-password-1')
  })
  after(() => Promise.all([tlsNode?.dispose(), mtlsNode?.dispose(), plain?.dispose()]))

  test('rediss:// to a plain server: use redis://', async (t) => {
    assertSays(
      await saysFor(t, { url: `rediss://127.0.0.1:${plain.port}`, tls: { ca: certs.ca } }),
      /redis:\/\/.*(does not speak TLS|not TLS)|TLS.*redis:\/\//i,
      'rediss to plain',
    )
  })

  test('redis:// to a TLS-only port: use rediss://', async (t) => {
    assertSays(await saysFor(t, { url: `redis://127.0.0.1:${tlsNode.port}` }), /rediss:\/\//, 'redis to TLS')
    assertSays(await saysFor(t, { host: '127.0.0.1', port: tlsNode.port }), /rediss:\/\/|tls/i, 'host and port to TLS')
  })

  test('a certificate signed by a CA not trusted: give it as tls.ca', async (t) => {
    assertSays(await saysFor(t, { url: `rediss://127.0.0.1:${tlsNode.port}`, tls: { ca: certs.otherCa } }), /not trust.*tls\.ca/i, 'unknown issuer')
  })

  test('a certificate without the name asked for: tls.servername', async (t) => {
    const all = await saysFor(t, { url: `rediss://127.0.0.1:${tlsNode.port}`, tls: { ca: certs.ca, servername: 'cache.example' } })
    assertSays(all, /cache\.example.*tls\.servername/i, 'wrong name')
    assertSays(all, /localhost/, 'the names it carries')
  })

  test('a server that wants a client certificate: tls.cert and tls.key', async (t) => {
    assertSays(await saysFor(t, { url: `rediss://127.0.0.1:${mtlsNode.port}`, tls: { ca: certs.ca } }), /tls\.cert.*tls\.key/, 'client certificate')
  })

  test('a refused password: says which options carry it, never quotes it', async (t) => {
    const all = await saysFor(t, { host: '127.0.0.1', port: plain.port, password: 'wrong-password-2' })
    assertSays(all, /password/i, 'wrong password')
    for (const m of all) assert.ok(!m.includes('wrong-password-2'), m)
  })
})
