'use strict'
// Production Redis deployments (docs/CONTRACT.md, RedisOptions and "Redis"): TLS with
// a private CA, mutual TLS, an untrusted server, an ACL user confined to the namespace, a wrong
// password, a 3-master 3-replica Redis Cluster with a master killed, and a Sentinel-managed
// primary with the master killed.
//
// Real servers only, on free 127.0.0.1 ports (__test__/helpers/redis-topology.js), one topology
// per describe; real worker processes (__test__/fixtures/redis-worker.js) that each build their
// own StampedeCache and count their own loader calls. The assertions are on loader-call totals
// across processes, on what the servers hold (asked of the node that owns the key), and on what
// reaches onError; the time bounds are "did not hang" bounds and the 500 ms bus bound.
// Failover times are logged (t.diagnostic and console.log).

const { describe, test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { CacheWorker, barrier, sleep, waitFor, killAllSync } = require('./helpers/redis-server')
const { makeCertificates, RedisNode, RedisCluster, RedisSentinelGroup, addAclUser, protectDefaultUser, killTopologySync } = require('./helpers/redis-topology')

/** A hang fails its test instead of blocking the run. */
// The README's connection examples: every deployment below is reached through them.
let connect
before(async () => {
  connect = await import('../examples/redis/connect.mjs')
})

const TEST_TIMEOUT = 60_000
const HOOK_TIMEOUT = 60_000
/** The connectTimeout the degrading tests pass, and the margin a loaded 2-core machine gets on top. */
const CONNECT_TIMEOUT = 1_000
const MARGIN = 3_000

after(() => {
  killAllSync()
  killTopologySync()
})

let nsCounter = 0
function newNamespace() {
  return `scdep${process.pid}n${++nsCounter}${Math.random().toString(36).slice(2, 6)}`
}
const vkey = (ns, k) => `${ns}:v:{${k}}`
const lkey = (ns, k) => `${ns}:lock:{${k}}`

/** A measurement for the test's output; `log` also prints it (the failover times). */
function note(t, text, { log = false } = {}) {
  t.diagnostic(text)
  if (log) console.log(`# ${text}`)
}

/** Spawns worker processes that are SIGKILLed after the test. */
function workers(t) {
  const spawned = []
  t.after(() => Promise.all(spawned.map((w) => w.kill('SIGKILL'))))
  return async (name, options) => {
    const w = new CacheWorker(name, options)
    spawned.push(w)
    await w.hello
    return w
  }
}

function assertAllOk(result, label) {
  for (const r of result.results) assert.ok(r.ok, `${label}: a read rejected: ${r.code} ${r.message}`)
}

function valuesOf(results) {
  return results.flatMap((r) => r.results.map((x) => (x.undef ? 'undefined' : JSON.stringify(x.value))))
}

/** The value an envelope in Redis holds (or undefined when the key is absent). */
async function storedValue(node, redisKey) {
  const raw = await node.cmd('GET', redisKey)
  return raw === null ? undefined : JSON.parse(raw).value
}

/** After settle(): no Redis error was counted or reported. */
async function assertNoRedisErrors(w, label) {
  const snap = await w.request('settle')
  assert.equal(snap.stats.redisErrors, 0, `${label}: redisErrors ${JSON.stringify(snap.onError.samples.slice(0, 3))}`)
  assert.equal(snap.onError.count, 0, `${label}: onError calls ${JSON.stringify(snap.onError.samples.slice(0, 3))}`)
  return snap
}

/** After settle(): Redis errors were counted, and every onError report is an ERR_REDIS Error. Returns the messages. */
async function assertRedisErrorsReported(w, label) {
  const snap = await w.request('settle')
  assert.ok(snap.stats.redisErrors > 0, `${label}: redisErrors counted`)
  assert.ok(snap.onError.count > 0, `${label}: onError called`)
  for (const e of snap.onError.samples) {
    assert.ok(e.isError, `${label}: onError gets an Error`)
    assert.equal(e.code, 'ERR_REDIS', `${label}: onError code: ${JSON.stringify(e)}`)
  }
  return snap.onError.samples.map((e) => e.message)
}

/**
 * `n` concurrent cold reads of `key` by a worker whose Redis is unusable: every read resolves
 * with the loader's value, one loader call (in-process coalescing), within the connect timeout
 * plus a margin. Returns how long the reads took.
 */
async function assertDegradedRead(w, key, label) {
  const r = await w.request('read', { key, n: 10, loader: { value: `local-${key}` } })
  assertAllOk(r, label)
  assert.deepEqual(new Set(valuesOf([r])), new Set([JSON.stringify(`local-${key}`)]), `${label}: served by the loader`)
  assert.equal(r.loaderCallsDuring, 1, `${label}: the 10 concurrent reads share one loader call`)
  const ms = r.endedAt - r.startedAt
  assert.ok(ms < CONNECT_TIMEOUT + MARGIN, `${label}: the reads took ${ms} ms (connect timeout ${CONNECT_TIMEOUT} ms)`)
  return ms
}

/**
 * `writer` sets `key` to `value` while `reader`, which holds the key in process, polls it with
 * get(): returns { seen, lagMs (from the start of the set), first }.
 */
async function propagate(writer, reader, key, value, { timeout = 3_000 } = {}) {
  const expect = JSON.stringify(value)
  const watch = reader.start('watch', { key, expect, via: 'get', interval: 10, timeout })
  await watch.ready
  const s = await writer.request('set', { key, value })
  assert.ok(s.ok, `set ${key}: ${s.code} ${s.message}`)
  const w = await watch.result
  assert.notEqual(w.first, expect, 'the reader served its older copy before the set')
  return { seen: w.seen, lagMs: w.seen ? w.seenAt - s.startedAt : null, first: w.first, last: w.last }
}

/** The bus delivers at all (first set seen within `timeout`), then within the bound (500 ms). */
async function assertBusWorks(writer, reader, key, label, { settleTimeout = 5_000 } = {}) {
  const loaded = await reader.request('read', { key, loader: { value: 'v0' } })
  assertAllOk(loaded, `${label}: reader`)
  const warm = await propagate(writer, reader, key, `${label}-1`, { timeout: settleTimeout })
  assert.ok(warm.seen, `${label}: the reader never saw the set within ${settleTimeout} ms (last ${warm.last})`)
  const p = await propagate(writer, reader, key, `${label}-2`)
  assert.ok(p.seen, `${label}: the reader never saw the second set (last ${p.last})`)
  assert.ok(p.lagMs <= 500, `${label}: the reader saw the set after ${p.lagMs} ms`)
  return { firstLagMs: warm.lagMs, lagMs: p.lagMs }
}

/** A worker `run` body: `n` concurrent getOrLoad calls of each of `keys`. */
const READ_KEYS = `
  const { keys, n, loader } = args
  const before = tools.snapshot().loaderCalls
  const startedAt = Date.now()
  const perKey = await Promise.all(keys.map(async (key) => ({
    key,
    results: await Promise.all(Array.from({ length: n }, () => tools.outcome(cache.getOrLoad(key, tools.makeLoader(key, loader))))),
  })))
  return { startedAt, endedAt: Date.now(), perKey, loaderCallsDuring: tools.snapshot().loaderCalls - before }
`

/**
 * After a failover, each process in turn sets `key` (a new value each attempt, every 200 ms at
 * most) until `master` itself holds it: what counts is the server, not the promise. Returns, per
 * process, how many ms after `since` its write was seen on the new master.
 */
async function assertWritesLand(ws, key, master, since, label) {
  const out = {}
  for (const w of ws) {
    const rk = vkey(w.options.namespace, key)
    const deadline = Date.now() + 15_000
    const failures = []
    for (let attempt = 1; ; attempt++) {
      const value = `${label}-${w.name}-${attempt}`
      const s = await w.request('set', { key, value })
      if (!s.ok && failures.length < 5) failures.push(`${s.code}: ${s.message}`)
      const held = await waitFor(async () => (await storedValue(master, rk).catch(() => undefined)) === value, { timeout: 1_000, interval: 50 }).catch(
        () => false,
      )
      if (held) {
        out[w.name] = { ms: Date.now() - since, attempts: attempt }
        break
      }
      assert.ok(Date.now() < deadline, `${label}: ${w.name}'s writes never reached the new master in 15 s: ${failures.join(' | ')}`)
      await sleep(200)
    }
    assert.ok(out[w.name].ms <= 10_000, `${label}: ${w.name}'s write reached the new master ${out[w.name].ms} ms after the promotion`)
  }
  return out
}

/** Cold reads across both processes share one loader call, and the value is on `master`. */
async function assertCoalesced(ws, key, master, label) {
  const results = await barrier(ws, 'read', { key, n: 20, loader: { ms: 300 } })
  results.forEach((r, i) => assertAllOk(r, `${label} ${ws[i].name}`))
  const calls = results.reduce((s, r) => s + r.loaderCallsDuring, 0)
  assert.equal(calls, 1, `${label}: one loader call across ${ws.length} processes x 20 reads`)
  const values = new Set(valuesOf(results))
  assert.equal(values.size, 1, `${label}: one value everywhere: ${[...values].join(' | ')}`)
  assert.deepEqual(await storedValue(master, vkey(ws[0].options.namespace, key)), JSON.parse([...values][0]), `${label}: the value is on the master`)
}

// ---------------------------------------------------------------------------------------------

describe('TLS (rediss://)', () => {
  let certDir
  let certs
  let server // TLS, client certificates optional
  let mtls // TLS, client certificates required

  before(
    async () => {
      certDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-dep-certs-'))
      certs = makeCertificates(certDir)
      server = new RedisNode('tls', { tls: { certs, authClients: 'optional' } })
      mtls = new RedisNode('mtls', { tls: { certs, authClients: 'yes' } })
      await Promise.all([server.start(), mtls.start()])
    },
    { timeout: HOOK_TIMEOUT },
  )

  after(async () => {
    await Promise.all([server && server.dispose(), mtls && mtls.dispose()])
    if (certDir) fs.rmSync(certDir, { recursive: true, force: true })
  })

  test('a private CA (tls.ca): two processes share one load, the value is in Redis, and the bus works over TLS', { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const options = { ...connect.privateCa(server.url, { caFile: certs.caFile }), namespace, jitter: 0 }
    const A = await spawn('A', options)
    const B = await spawn('B', options)
    const key = 'tls:cold'

    const results = await barrier([A, B], 'read', { key, n: 20, loader: { ms: 300 } })
    results.forEach((r, i) => assertAllOk(r, `w${i}`))
    assert.equal(results[0].loaderCallsDuring + results[1].loaderCallsDuring, 1, 'one loader call across 2 processes x 20 reads')
    const values = new Set(valuesOf(results))
    assert.equal(values.size, 1)
    assert.deepEqual(await storedValue(server, vkey(namespace, key)), JSON.parse([...values][0]), 'the value is in Redis')
    assert.equal(await server.cmd('EXISTS', lkey(namespace, key)), 0, 'the lock was released')

    const bus = await assertBusWorks(A, B, 'tls:bus', 'tls')
    note(t, `bus over TLS: first set seen after ${bus.firstLagMs} ms, then ${bus.lagMs} ms`)
    await assertNoRedisErrors(A, 'A')
    await assertNoRedisErrors(B, 'B')
  })

  test('valkeys:// is rediss://', { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const W = await spawn('W', { redis: { url: server.url.replace(/^rediss:/, 'valkeys:'), tls: { ca: certs.ca } }, namespace })
    assertAllOk(await W.request('read', { key: 'vk', loader: { value: 'over-valkeys' } }), 'W')
    assert.equal(await storedValue(server, vkey(namespace, 'vk')), 'over-valkeys')
    await assertNoRedisErrors(W, 'W')
  })

  test('mutual TLS: with tls.cert and tls.key the cache works; without a client certificate the server refuses and the cache degrades', {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const files = { caFile: certs.caFile, certFile: certs.clientCertFile, keyFile: certs.clientKeyFile }
    const A = await spawn('A', { ...connect.privateCa(mtls.url, files), namespace })
    const B = await spawn('B', { redis: { url: mtls.url, tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } }, namespace })
    const results = await barrier([A, B], 'read', { key: 'mtls:cold', n: 20, loader: { ms: 300 } })
    results.forEach((r, i) => assertAllOk(r, `w${i}`))
    assert.equal(results[0].loaderCallsDuring + results[1].loaderCallsDuring, 1, 'one loader call across 2 processes with client certificates')
    assert.deepEqual(await storedValue(mtls, vkey(namespace, 'mtls:cold')), JSON.parse(valuesOf(results)[0]))
    await assertNoRedisErrors(A, 'A')
    await assertNoRedisErrors(B, 'B')

    const N = await spawn('N', { redis: { url: mtls.url, tls: { ca: certs.ca }, connectTimeout: CONNECT_TIMEOUT }, namespace })
    const O = await spawn('O', {
      redis: { url: mtls.url, tls: { ca: certs.ca, cert: certs.otherClientCert, key: certs.otherClientKey }, connectTimeout: CONNECT_TIMEOUT },
      namespace,
    })
    const nMs = await assertDegradedRead(N, 'mtls:no-cert', 'no client certificate')
    const oMs = await assertDegradedRead(O, 'mtls:other-ca-cert', 'a client certificate from another CA')
    assert.equal(
      await mtls.cmd('EXISTS', vkey(namespace, 'mtls:no-cert'), vkey(namespace, 'mtls:other-ca-cert')),
      0,
      'nothing was written without an accepted client certificate',
    )
    const nMsgs = await assertRedisErrorsReported(N, 'no client certificate')
    const oMsgs = await assertRedisErrorsReported(O, 'other CA')
    note(t, `degraded reads took ${nMs} / ${oMs} ms; onError: ${JSON.stringify(nMsgs[0])} / ${JSON.stringify(oMsgs[0])}`)
  })

  test('an untrusted server (certificate from a CA the client does not trust): ERR_REDIS with the reason, degraded within the connect timeout, reads never reject, nothing written', {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    // Trusts only the other CA; and one with no tls options, for which the system roots apply
    // (they do not hold the test CA).
    const U = await spawn('U', { redis: { url: server.url, tls: { ca: certs.otherCa }, connectTimeout: CONNECT_TIMEOUT }, namespace })
    const S = await spawn('S', { redis: { url: server.url, connectTimeout: CONNECT_TIMEOUT }, namespace })

    const uMs = await assertDegradedRead(U, 'untrusted:cold', 'U')
    const sMs = await assertDegradedRead(S, 'system-roots:cold', 'S')
    const churn = await U.request('churn', { prefix: 'untrusted:churn:', durationMs: 1_000, gapMs: 2 })
    assert.equal(churn.rejected, 0, 'no cold read rejected')
    assert.equal(churn.wrong, 0, 'every cold read got its own loader value')
    assert.ok(
      churn.slow.every((ms) => ms < 3_000),
      `no cold read hung: ${churn.slow.join(', ')} ms`,
    )

    assert.equal(
      await server.cmd('EXISTS', vkey(namespace, 'untrusted:cold'), vkey(namespace, 'system-roots:cold')),
      0,
      'nothing was written to a server the client does not trust',
    )
    for (const [w, label] of [
      [U, 'untrusted CA'],
      [S, 'system roots'],
    ]) {
      const msgs = await assertRedisErrorsReported(w, label)
      assert.ok(
        msgs.some((m) => /certificate|issuer/i.test(m)),
        `${label}: onError says the certificate is not trusted: ${JSON.stringify(msgs.slice(0, 3))}`,
      )
    }
    note(t, `degraded reads took ${uMs} / ${sMs} ms; ${churn.ops} cold reads in 1 s while degraded`)
  })

  test('tls.servername is the name verified; rejectUnauthorized: false skips verification', { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    // The server certificate names 127.0.0.1 and localhost.
    const good = await spawn('good', { redis: { url: server.url, tls: { ca: certs.ca, servername: 'localhost' } }, namespace })
    const bad = await spawn('bad', {
      redis: { url: server.url, tls: { ca: certs.ca, servername: 'db.not-this-host.invalid' }, connectTimeout: CONNECT_TIMEOUT },
      namespace,
    })
    const lax = await spawn('lax', { redis: { url: server.url, tls: { ca: certs.otherCa, rejectUnauthorized: false } }, namespace })

    assertAllOk(await good.request('read', { key: 'sn:good', loader: { value: 'good' } }), 'good')
    assert.equal(await storedValue(server, vkey(namespace, 'sn:good')), 'good', 'servername localhost: stored')
    await assertNoRedisErrors(good, 'good')

    await assertDegradedRead(bad, 'sn:bad', 'wrong servername')
    assert.equal(await server.cmd('EXISTS', vkey(namespace, 'sn:bad')), 0, 'a servername the certificate does not name: nothing stored')
    const msgs = await assertRedisErrorsReported(bad, 'wrong servername')
    assert.ok(
      msgs.some((m) => /certificate|name/i.test(m)),
      `onError says why: ${JSON.stringify(msgs.slice(0, 3))}`,
    )

    assertAllOk(await lax.request('read', { key: 'sn:lax', loader: { value: 'lax' } }), 'lax')
    assert.equal(await storedValue(server, vkey(namespace, 'sn:lax')), 'lax', 'rejectUnauthorized: false connects to an untrusted certificate')
    await assertNoRedisErrors(lax, 'lax')
  })
})

// ---------------------------------------------------------------------------------------------

describe('valkey:// and unix://', () => {
  let node
  let socketPath

  before(
    async () => {
      node = new RedisNode('plain', {
        conf: () => {
          socketPath = path.join(node.dir, 'redis.sock')
          return [`unixsocket ${socketPath}`, 'unixsocketperm 700']
        },
      })
      await node.start()
    },
    { timeout: HOOK_TIMEOUT },
  )

  after(() => node && node.dispose())

  test('valkey://host:port and unix:///path reach the same server', { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const V = await spawn('V', { redis: `valkey://127.0.0.1:${node.port}`, namespace })
    const U = await spawn('U', { redis: `unix://${socketPath}`, namespace })
    assertAllOk(await V.request('read', { key: 'via-valkey', loader: { value: 'v' } }), 'V')
    assertAllOk(await U.request('read', { key: 'via-unix', loader: { value: 'u' } }), 'U')
    assert.equal(await storedValue(node, vkey(namespace, 'via-valkey')), 'v')
    assert.equal(await storedValue(node, vkey(namespace, 'via-unix')), 'u')
    // And they are one cache: what V stored, U reads without loading.
    const r = await U.request('read', { key: 'via-valkey', loader: { value: 'must-not-load' } })
    assert.equal(r.results[0].value, 'v')
    assert.equal(r.loaderCallsDuring, 0)
    await assertNoRedisErrors(V, 'V')
    await assertNoRedisErrors(U, 'U')
  })
})

// ---------------------------------------------------------------------------------------------

describe('ACL user', () => {
  let node
  const namespace = newNamespace()
  const url = (password) => `redis://app:${password}@127.0.0.1:${node.port}`

  before(
    async () => {
      node = new RedisNode('acl')
      await node.start()
      await addAclUser(node, { user: 'app', password: 'secret', namespace })
      // The default user gets a password too, so nothing the cache does can pass as it.
      await protectDefaultUser(node, 'adminpw')
    },
    { timeout: HOOK_TIMEOUT },
  )

  after(() => node && node.dispose())

  test('a user allowed only ~<ns>:* and &<ns>:* (+@all -@dangerous): one load across processes, values under the namespace, the bus, refresh, set and delete all work', {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const spawn = workers(t)
    const A = await spawn('A', { ...connect.aclUser(url('secret'), namespace), jitter: 0 })
    const B = await spawn('B', { redis: { url: url('secret') }, namespace, jitter: 0 })
    const key = 'acl:cold'

    const results = await barrier([A, B], 'read', { key, n: 20, loader: { ms: 300 } })
    results.forEach((r, i) => assertAllOk(r, `w${i}`))
    assert.equal(results[0].loaderCallsDuring + results[1].loaderCallsDuring, 1, 'one loader call across 2 processes')
    assert.deepEqual(await storedValue(node, vkey(namespace, key)), JSON.parse(valuesOf(results)[0]), 'the value is under the namespace')
    assert.equal(await node.cmd('EXISTS', lkey(namespace, key)), 0, 'the lock was released (the release script ran)')

    const bus = await assertBusWorks(A, B, 'acl:bus', 'acl')

    // A stale entry: the background refresh takes the lock, stores and releases under the ACL too.
    assert.ok((await A.request('set', { key: 'acl:stale', value: 'old', opts: { ttl: 200, hardTtl: 60_000 } })).ok)
    await sleep(400)
    const stale = await B.request('read', { key: 'acl:stale', loader: { value: 'refreshed' } })
    assert.equal(stale.results[0].value, 'old', 'served stale')
    await B.request('settle')
    assert.equal(await storedValue(node, vkey(namespace, 'acl:stale')), 'refreshed', 'the refresh was stored')

    const d = await A.request('delete', { key })
    assert.ok(d.ok && d.value === true, `delete: ${JSON.stringify(d)}`)
    assert.equal(await node.cmd('EXISTS', vkey(namespace, key)), 0, 'deleted in Redis')

    await assertNoRedisErrors(A, 'A')
    await assertNoRedisErrors(B, 'B')
    note(t, `bus under the ACL: ${bus.firstLagMs} ms, then ${bus.lagMs} ms`)
  })

  test('a wrong password: the cache degrades, reads never reject, onError says why', { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const W = await spawn('W', { redis: { url: url('not-the-password'), connectTimeout: CONNECT_TIMEOUT }, namespace })
    const ms = await assertDegradedRead(W, 'acl:wrongpass', 'wrong password')
    assert.equal(await node.cmd('EXISTS', vkey(namespace, 'acl:wrongpass')), 0, 'nothing stored')
    const msgs = await assertRedisErrorsReported(W, 'wrong password')
    assert.ok(
      msgs.some((m) => /WRONGPASS|password/i.test(m)),
      `onError says the password was refused: ${JSON.stringify(msgs.slice(0, 3))}`,
    )
    note(t, `degraded reads took ${ms} ms; onError: ${JSON.stringify(msgs[0])}`)
  })

  test("a namespace outside the user's key pattern: NOPERM reaches onError, reads are served by the loader", { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const elsewhere = newNamespace()
    const W = await spawn('W', { redis: { url: url('secret'), connectTimeout: CONNECT_TIMEOUT }, namespace: elsewhere })
    await assertDegradedRead(W, 'acl:elsewhere', 'other namespace')
    const msgs = await assertRedisErrorsReported(W, 'other namespace')
    assert.ok(
      msgs.some((m) => /NOPERM|permission/i.test(m)),
      `onError says why: ${JSON.stringify(msgs.slice(0, 3))}`,
    )
  })
})

// ---------------------------------------------------------------------------------------------

describe('Redis Cluster: 3 masters, 3 replicas', () => {
  let cluster
  let victim // the master the last test kills
  let seed // the one seed URL the caches get (not the victim, nor its replica)

  /** `perMaster` keys of `namespace` (prefix + i) whose value keys each master owns: Map(port -> keys). */
  async function keysByMaster(namespace, prefix, perMaster) {
    const candidates = Array.from({ length: 200 }, (_, i) => `${prefix}${i}`)
    const slots = await cluster.keySlots(candidates.map((k) => vkey(namespace, k)))
    const map = await cluster.slotMap()
    const byPort = new Map((await cluster.masters()).map((m) => [m.port, []]))
    candidates.forEach((k, i) => {
      const owner = map.find((r) => slots[i] >= r.start && slots[i] <= r.end).master
      const list = byPort.get(owner)
      if (list.length < perMaster) list.push(k)
    })
    for (const [port, list] of byPort) assert.equal(list.length, perMaster, `enough keys on :${port}`)
    return byPort
  }

  const optionsFor = (namespace) => ({ ...connect.cluster([seed]), namespace, jitter: 0 })

  before(
    async () => {
      const t0 = Date.now()
      cluster = new RedisCluster({ nodeTimeout: 1_000 })
      await cluster.start()
      const masters = await cluster.masters()
      victim = masters[0]
      const victimReplicas = await cluster.replicasOf(victim)
      seed = cluster.nodes.find((n) => n !== victim && !victimReplicas.includes(n)).url
      console.log(`# cluster of ${cluster.nodes.length} nodes healthy ${Date.now() - t0} ms after the first start`)
    },
    { timeout: HOOK_TIMEOUT },
  )

  after(() => cluster && cluster.dispose())

  test('cold keys on all three masters load once across two processes; each value is on the master that owns its slot', {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const A = await spawn('A', optionsFor(namespace))
    const B = await spawn('B', optionsFor(namespace))
    const byMaster = await keysByMaster(namespace, 'spread:', 4)
    const keys = [...byMaster.values()].flat()

    const results = await barrier([A, B], 'run', { body: READ_KEYS, args: { keys, n: 10, loader: { ms: 200 } } })
    const logs = await Promise.all([A, B].map((w) => w.request('loads')))
    for (const key of keys) {
      const calls = logs.reduce((s, l) => s + (l[key] ? l[key].length : 0), 0)
      assert.equal(calls, 1, `${key}: one loader call across 2 processes x 10 reads (got ${calls})`)
      const values = new Set()
      for (const [i, r] of results.entries()) {
        const mine = r.perKey.find((x) => x.key === key)
        assertAllOk(mine, `${key} w${i}`)
        for (const x of mine.results) values.add(JSON.stringify(x.value))
      }
      assert.equal(values.size, 1, `${key}: one value in both processes`)
      const owner = await cluster.masterOfKey(vkey(namespace, key))
      assert.deepEqual(await storedValue(owner, vkey(namespace, key)), JSON.parse([...values][0]), `${key}: stored on its master :${owner.port}`)
      assert.equal(await owner.cmd('EXISTS', lkey(namespace, key)), 0, `${key}: lock released`)
    }
    await assertNoRedisErrors(A, 'A')
    await assertNoRedisErrors(B, 'B')
    note(t, `${keys.length} keys on ${byMaster.size} masters: ${keys.length} loads in total`)
  })

  test("set in one process reaches the other process's in-process tier within 500 ms, for a key on each master", { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const A = await spawn('A', optionsFor(namespace))
    const B = await spawn('B', optionsFor(namespace))
    const byMaster = await keysByMaster(namespace, 'bus:', 1)
    const lags = []
    for (const [port, [key]] of byMaster) {
      const bus = await assertBusWorks(A, B, key, `key on :${port}`)
      lags.push(bus.firstLagMs, bus.lagMs)
    }
    await assertNoRedisErrors(A, 'A')
    await assertNoRedisErrors(B, 'B')
    note(t, `bus lags (ms): ${lags.join(', ')}`)
  })

  // Last in this describe: the victim stays dead.
  test('a master is killed: its replica is promoted, and within seconds writes to its slots land and cross-process coalescing works', {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const A = await spawn('A', optionsFor(namespace))
    const B = await spawn('B', optionsFor(namespace))
    const [warmKey, key, coldKey] = (await keysByMaster(namespace, 'fo:', 3)).get(victim.port)

    await assertCoalesced([A, B], warmKey, victim, 'before the failover')

    // A keeps reading cold keys (on every master) through the failover.
    const churn = A.start('churn', { prefix: 'fo:churn:', durationMs: 6_000, gapMs: 5 }, { timeout: 30_000 })
    await sleep(300)
    const fo = await cluster.killMaster(victim)
    note(
      t,
      `cluster failover: replica :${fo.newMaster.port} promoted ${fo.promotedMs} ms after SIGKILL of :${victim.port}; all nodes agreed after ${fo.settledMs} ms`,
      { log: true },
    )

    const landed = await assertWritesLand([A, B], key, fo.newMaster, fo.settledAt, 'cluster')
    note(t, `first write landed on the new master (ms after all nodes agreed): ${JSON.stringify(landed)}`, { log: true })
    // The churn's own loads would count as loader calls of the coalescing check: let it end first.
    const c = await churn.result
    await assertCoalesced([A, B], coldKey, fo.newMaster, 'after the failover')

    assert.equal(c.rejected, 0, 'no read rejected through the failover')
    assert.equal(c.wrong, 0, 'every read got its own value')
    assert.ok(
      c.slow.every((ms) => ms < 5_000),
      `no read hung through the failover: ${c.slow.join(', ')} ms`,
    )

    const bus = await assertBusWorks(A, B, coldKey, 'after the failover')
    note(t, `${c.ops} reads through the failover (${c.slow.length} over 1.5 s: ${c.slow.join(', ')}); bus after it: ${bus.firstLagMs} ms, then ${bus.lagMs} ms`)
    for (const w of [A, B]) {
      const snap = await w.request('settle')
      for (const e of snap.onError.samples) assert.equal(e.code, 'ERR_REDIS', `${w.name}: onError code: ${JSON.stringify(e)}`)
    }
  })
})

// ---------------------------------------------------------------------------------------------

describe('Sentinel: a master, a replica and a sentinel', () => {
  let group

  before(
    async () => {
      group = new RedisSentinelGroup({ downAfter: 1_000 })
      await group.start()
    },
    { timeout: HOOK_TIMEOUT },
  )

  after(() => group && group.dispose())

  const optionsFor = (namespace) => ({ ...connect.sentinel(group.sentinelUrls, group.masterName), namespace, jitter: 0 })

  test('an unknown master name: ERR_REDIS to onError, reads served by the loader within the connect timeout', { timeout: TEST_TIMEOUT }, async (t) => {
    const spawn = workers(t)
    const W = await spawn('W', {
      ...optionsFor(newNamespace()),
      redis: { sentinels: group.sentinelUrls, masterName: 'no-such-master', connectTimeout: CONNECT_TIMEOUT },
    })
    const ms = await assertDegradedRead(W, 'sentinel:unknown', 'unknown master name')
    const msgs = await assertRedisErrorsReported(W, 'unknown master name')
    assert.ok(
      msgs.some((m) => /master/i.test(m)),
      `onError says why: ${JSON.stringify(msgs.slice(0, 3))}`,
    )
    note(t, `degraded reads took ${ms} ms; onError: ${JSON.stringify(msgs[0])}`)
  })

  // Last in this describe: the old master stays dead.
  test('one load across processes; the master is killed; after promotion writes reach the new master and coalescing works', {
    timeout: TEST_TIMEOUT,
  }, async (t) => {
    const spawn = workers(t)
    const namespace = newNamespace()
    const A = await spawn('A', optionsFor(namespace))
    const B = await spawn('B', optionsFor(namespace))

    await assertCoalesced([A, B], 'se:warm', group.master, 'before the failover')
    await assertNoRedisErrors(A, 'A')

    const churn = A.start('churn', { prefix: 'se:churn:', durationMs: 6_000, gapMs: 5 }, { timeout: 30_000 })
    await sleep(300)
    const oldPort = group.master.port
    const fo = await group.killMaster()
    note(t, `sentinel failover: the sentinel named :${fo.newMaster.port} ${fo.failoverMs} ms after SIGKILL of :${oldPort}`, { log: true })

    const landed = await assertWritesLand([A, B], 'se:written', fo.newMaster, fo.promotedAt, 'sentinel')
    note(t, `first write landed on the new master (ms after the promotion): ${JSON.stringify(landed)}`, { log: true })
    // The churn's own loads would count as loader calls of the coalescing check: let it end first.
    const c = await churn.result
    await assertCoalesced([A, B], 'se:cold', fo.newMaster, 'after the failover')

    assert.equal(c.rejected, 0, 'no read rejected through the failover')
    assert.equal(c.wrong, 0, 'every read got its own value')
    assert.ok(
      c.slow.every((ms) => ms < 5_000),
      `no read hung through the failover: ${c.slow.join(', ')} ms`,
    )

    const bus = await assertBusWorks(A, B, 'se:bus', 'after the failover')
    note(t, `${c.ops} reads through the failover (${c.slow.length} over 1.5 s: ${c.slow.join(', ')}); bus after it: ${bus.firstLagMs} ms, then ${bus.lagMs} ms`)
    for (const w of [A, B]) {
      const snap = await w.request('settle')
      for (const e of snap.onError.samples) assert.equal(e.code, 'ERR_REDIS', `${w.name}: onError code: ${JSON.stringify(e)}`)
    }
  })
})
