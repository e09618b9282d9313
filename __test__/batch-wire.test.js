'use strict'
// Batch reads under a hostile wire, and the batch answer's own checks. A batch of keys not held
// in process is read with one MGET and an ECHO (src/store/redis/batch.rs); its values cross to
// JS as one JSON array text (src/node/batch.rs). A FaultProxy between a cache and a private
// redis-server puts an extra reply in front of a batch's replies, or replays an old batch's
// reply in front of the next one (the key marks cannot tell it: it names the right keys). No
// key may ever be served another key's value, or a value older than the last write it saw;
// the batch is asked again (or its keys loaded), and nothing wrong stays in process.

const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const { StampedeCache } = require('..')
const { FaultProxy } = require('./helpers/fault-proxy')
const { setupRedis, killAllSync, waitFor } = require('./helpers/redis-server')
const { sleep } = require('./helpers/assertions')

after(() => killAllSync())

const KEYS = Array.from({ length: 64 }, (_, i) => `k${i}`)
const mustNotLoad = () => {
  throw new Error('a warm batch called loadMany')
}

async function throughProxy(t, base, options = {}) {
  const proxy = await new FaultProxy(Number(new URL(base.redis).port)).start()
  t.after(() => proxy.close())
  const errors = []
  const cache = new StampedeCache({
    ...base,
    redis: { url: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 1_000 },
    ttl: 600_000,
    l1: false,
    onError: (err) => errors.push(err),
    ...options,
  })
  t.after(() => cache.close())
  // Connected, the bus subscribed, before any fault.
  await cache.get('warm')
  return { proxy, cache, errors }
}

// The chunk that holds a batch's replies: an array reply first (the MGET's), not a bus message.
const isBatchReply = (chunk) => chunk[0] === 0x2a && !chunk.includes('message')

for (const [fault, tamper, inFront] of [
  ['an extra status reply', (chunk) => Buffer.concat([Buffer.from('+OK\r\n'), chunk]), true],
  ['an extra nil reply', (chunk) => Buffer.concat([Buffer.from('$-1\r\n'), chunk]), true],
  ['an extra array reply of the right length', (chunk) => Buffer.concat([Buffer.from(`*${KEYS.length}\r\n${'$-1\r\n'.repeat(KEYS.length)}`), chunk]), true],
  // Behind the batch's own replies, with no request waiting for them (the client drops them, or
  // the next batch finds its replies out of step).
  ['the batch reply twice', (chunk) => Buffer.concat([chunk, chunk]), false],
]) {
  test(`${fault} among a batch's replies: every key its own value, from Redis${inFront ? ', and the connection replaced' : ''}`, async (t) => {
    const { base } = await setupRedis(t, { prefix: 'bwire' })
    const writer = new StampedeCache({ ...base, ttl: 600_000 })
    t.after(() => writer.close())
    for (const k of KEYS) await writer.set(k, { key: k })
    const { proxy, cache, errors } = await throughProxy(t, base)
    for (const read of [() => cache.getOrLoadMany(KEYS, mustNotLoad), () => cache.getMany(KEYS)]) {
      const accepted = proxy.accepted
      proxy.tamper((chunk) => (isBatchReply(chunk) ? tamper(chunk) : null))
      const got = await read()
      assert.equal(proxy.tampered >= 1, true, 'the fault was injected')
      proxy.calm()
      // The batch after it too: a stray reply behind a batch's own is found by the next one.
      for (const values of [got, await read()]) {
        assert.deepEqual(
          values,
          KEYS.map((k) => ({ key: k })),
          'asked again on a new connection: every key its own value',
        )
      }
      if (inFront) assert.ok(proxy.accepted > accepted, 'the connection that delivered it was replaced')
      proxy.tampered = 0
    }
    if (inFront)
      assert.ok(
        errors.some((e) => /out of step/.test(e.message)),
        `reported: ${errors.map((e) => e.message)}`,
      )
    assert.equal(cache.stats().loads, 0)
  })
}

test("an old batch's reply replayed in front of the next one is refused: never the value a set replaced", async (t) => {
  const { base } = await setupRedis(t, { prefix: 'bwire' })
  const { proxy, cache } = await throughProxy(t, base)
  const keys = KEYS.slice(0, 8)
  for (let round = 0; round < 4; round++) {
    for (const k of keys) await cache.set(k, { round })
    let old = null
    proxy.tamper((chunk) => {
      if (!isBatchReply(chunk)) return null
      old = chunk
      return chunk
    })
    assert.deepEqual(
      await cache.getMany(keys),
      keys.map(() => ({ round })),
    )
    for (const k of keys) await cache.set(k, { round: round + 0.5 })
    proxy.tamper((chunk) => (isBatchReply(chunk) ? Buffer.concat([old, chunk]) : null))
    const got = await cache.getOrLoadMany(keys, (ks) => ks.map(() => ({ round: round + 0.5, loaded: true })))
    proxy.calm()
    for (const v of got) assert.equal(v.round, round + 0.5, `round ${round}: ${JSON.stringify(got)}`)
  }
})

test('a corrupt value among a batch\'s values ("1,2", unbalanced, not JSON) is a miss for its key alone; every other key keeps its own value', async (t) => {
  const { redis, base, vkey } = await setupRedis(t, { prefix: 'bwire' })
  const writer = new StampedeCache({ ...base, ttl: 600_000 })
  t.after(() => writer.close())
  const keys = ['a', 'b', 'c', 'd', 'e']
  for (const k of keys) await writer.set(k, { key: k })
  // An envelope this library wrote, with its value text replaced: what it read was never parsed
  // in Rust, so only the facade can find it unreadable.
  for (const [k, text] of [
    ['b', '1,2'],
    ['c', '[3'],
    // One element when joined, yet not JSON: the joined text fails to parse, and each is read apart.
    ['e', 'tru'],
  ]) {
    const raw = await redis.cmd('GET', vkey(k))
    const at = raw.indexOf('"value":')
    await redis.cmd('SET', vkey(k), `${raw.slice(0, at)}"value":${text}}`)
  }
  const reader = new StampedeCache({ ...base, ttl: 600_000, l1: false })
  t.after(() => reader.close())
  await reader.get('warm')
  assert.deepEqual(await reader.getMany(keys), [{ key: 'a' }, undefined, undefined, { key: 'd' }, undefined])
  // Without the texts that cannot be one element, the values are joined, and the text fails.
  assert.deepEqual(await reader.getMany(['a', 'e', 'd']), [{ key: 'a' }, undefined, { key: 'd' }])
  const loaded = []
  const got = await reader.getOrLoadMany(keys, (ks) => {
    loaded.push(...ks)
    return ks.map((k) => ({ key: k, loaded: true }))
  })
  assert.deepEqual(got, [{ key: 'a' }, { key: 'b', loaded: true }, { key: 'c', loaded: true }, { key: 'd' }, { key: 'e', loaded: true }])
  assert.deepEqual(loaded, ['b', 'c', 'e'], 'only the unreadable keys are loaded (past their values)')
})

test('a batch adopted into a small in-process tier keeps each value at its own key, as it evicts within the batch', async (t) => {
  const { base } = await setupRedis(t, { prefix: 'bwire' })
  const writer = new StampedeCache({ ...base, ttl: 600_000 })
  t.after(() => writer.close())
  for (const k of KEYS) await writer.set(k, { key: k })
  for (const l1 of [{ maxEntries: 5 }, { maxBytes: 200 }]) {
    const reader = new StampedeCache({ ...base, ttl: 600_000, l1 })
    t.after(() => reader.close())
    await reader.get('warm')
    assert.deepEqual(
      await reader.getOrLoadMany(KEYS, mustNotLoad),
      KEYS.map((k) => ({ key: k })),
    )
    // What the tier kept is served in process (the rest read again), each its own key's.
    for (const k of KEYS) assert.deepEqual(await reader.get(k), { key: k }, `${JSON.stringify(l1)}: ${k}`)
    assert.deepEqual(
      await reader.getMany(KEYS),
      KEYS.map((k) => ({ key: k })),
    )
  }
})

test('keys of any characters cross as one string and their lengths', async (t) => {
  const { base } = await setupRedis(t, { prefix: 'bwire' })
  const writer = new StampedeCache({ ...base, ttl: 600_000 })
  t.after(() => writer.close())
  const keys = ['plain', 'é', '😀x', '', 'a\u0000b', ['part', 'é😀'], '\u{10ffff}'].filter((k) => k !== '')
  for (const k of keys) await writer.set(k, { k })
  const reader = new StampedeCache({ ...base, ttl: 600_000, l1: false })
  t.after(() => reader.close())
  await reader.get('warm')
  assert.deepEqual(
    await reader.getMany(keys),
    keys.map((k) => ({ k })),
  )
  assert.deepEqual(
    await reader.getOrLoadMany(keys, mustNotLoad),
    keys.map((k) => ({ k })),
  )
})

// How many times `word` occurs in a request chunk.
const countOf = (chunk, word) => chunk.toString('latin1').split(word).length - 1

test("a reply moved in front of a batch's lock bids is never read as another key's bid: a lock held elsewhere is waited for, never loaded", async (t) => {
  const { redis, base } = await setupRedis(t, { prefix: 'bwire' })
  const { proxy, cache, errors } = await throughProxy(t, base, { lockTtl: 10_000 })
  const keys = ['held', 'free1', 'free2', 'free3']
  // Another process holds the lock of 'held': its load is under way.
  await redis.cmd('SET', `${base.namespace}:lock:{held}`, 'elsewhere', 'PX', '10000')
  const holder = new StampedeCache({ ...base, ttl: 600_000 })
  t.after(() => holder.close())
  // A won bid, as cold_gate.lua answers one (no value, a fence, state 1: the lock is the
  // bidder's), in front of the replies to the batch's pipeline of bids: each reply then sits in
  // the place of the bid after its own, and the first key's place holds a win it never had.
  const won = Buffer.from('*4\r\n$-1\r\n$4\r\nfake\r\n:1\r\n:0\r\n')
  proxy.tamperReplyTo(
    (request) => countOf(request, 'EVALSHA') >= keys.length,
    (chunk) => Buffer.concat([won, chunk]),
  )
  const loaded = []
  const got = cache.getOrLoadMany(keys, async (ks) => {
    loaded.push(...ks)
    return ks.map((k) => ({ k, loaded: true }))
  })
  await waitFor(() => proxy.tampered >= 1, { what: 'the bids to be answered' })
  // The holder's load ends: its write is announced, and whoever waits for 'held' is served it.
  await sleep(200)
  await holder.set('held', { k: 'held', by: 'the holder' })
  const values = await got
  assert.equal(proxy.tampered, 1)
  assert.ok(!loaded.includes('held'), `a lock held elsewhere was read as won: loadMany got ${loaded}`)
  assert.deepEqual(values, [{ k: 'held', by: 'the holder' }, ...keys.slice(1).map((k) => ({ k, loaded: true }))])
  assert.deepEqual(loaded.sort(), keys.slice(1).sort(), 'each free key loaded once')
  assert.ok(
    errors.some((e) => /out of step/.test(e.message)),
    `reported: ${errors.map((e) => e.message)}`,
  )
  // The connection that delivered it was replaced: later batches read and bid in step.
  const again = ['later1', 'later2']
  assert.deepEqual(
    await cache.getOrLoadMany(again, (ks) => ks.map((k) => ({ k }))),
    again.map((k) => ({ k })),
  )
})
