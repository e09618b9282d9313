'use strict'
// stampede-cache/next driven the way Next.js 16 drives it (next/dist/server/lib/cache-handlers and
// incremental-cache), without Next.js: two handlers on one private redis-server stand for two
// instances. examples/next-cache (__test__/next-cache.test.js) runs the same with real `next start`s.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { execFile } = require('node:child_process')
const path = require('node:path')
const { RedisServer, command, newNamespace } = require('./helpers/redis-server.js')
const { createUseCacheHandler, createIncrementalCacheHandler } = require('../next.js')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
let redis
const open = []

before(async () => {
  redis = await new RedisServer().start()
})
after(async () => {
  await Promise.all(open.map((c) => c.close().catch(() => {})))
  await redis.stop('SIGKILL')
})

function useCache(options = {}) {
  const h = createUseCacheHandler({ redis: redis.url, ...options })
  open.push(h.cache)
  return h
}

function incremental(options = {}) {
  const C = createIncrementalCacheHandler({ redis: redis.url, ...options })
  open.push(C.cache)
  return C
}

// A stream delivering `bytes` in chunks, as Next streams an entry.
function streamOf(bytes, chunk = 7) {
  return new ReadableStream({
    start(c) {
      for (let i = 0; i < bytes.length; i += chunk) c.enqueue(bytes.slice(i, i + chunk))
      c.close()
    },
  })
}

const readBytes = async (stream) => new Uint8Array(await new Response(stream).arrayBuffer())

function entry(bytes, over = {}) {
  return { value: streamOf(bytes), tags: [], stale: 300, timestamp: Date.now(), expire: 3600, revalidate: 900, ...over }
}

// Next's "use cache" read: get, and on a miss compute and set (without awaiting the set).
async function render(handler, key, compute, softTags = []) {
  const hit = await handler.get(key, softTags)
  if (hit) return { hit: true, bytes: await readBytes(hit.value) }
  const { bytes, ...over } = await compute()
  handler.set(key, Promise.resolve(entry(bytes, over)))
  return { hit: false, bytes }
}

test('stampede-cache/next: require and import give the same functions', async () => {
  const esm = await import(path.join(__dirname, '..', 'next.mjs'))
  assert.equal(esm.createUseCacheHandler, createUseCacheHandler)
  assert.equal(esm.createIncrementalCacheHandler, createIncrementalCacheHandler)
  assert.equal(esm.default.createUseCacheHandler, createUseCacheHandler)
})

test("stampede-cache/next: bad options throw ERR_INVALID_OPTION; the serializer is the handler's", () => {
  for (const create of [createUseCacheHandler, createIncrementalCacheHandler]) {
    assert.throws(
      () => create({ serializer: 'json' }),
      (e) => e.code === 'ERR_INVALID_OPTION' && /serializer/.test(e.message),
    )
    assert.throws(
      () => create('redis://x'),
      (e) => e.code === 'ERR_INVALID_OPTION',
    )
    assert.throws(
      () => create({ ttl: -1 }),
      (e) => e.code === 'ERR_INVALID_OPTION' && /ttl/.test(e.message),
    )
  }
})

test('"use cache": the bytes round-trip exactly, a new stream on every get, in this and another instance', async () => {
  const ns = newNamespace('next')
  const a = useCache({ namespace: ns })
  const b = useCache({ namespace: ns })
  const bytes = new Uint8Array(5_000).map((_, i) => (i * 131 + 7) & 0xff)
  assert.equal(await a.get('k', []), undefined)
  await a.set('k', Promise.resolve(entry(bytes, { tags: ['t1'] })))
  const first = await a.get('k', [])
  const second = await a.get('k', [])
  assert.deepEqual(await readBytes(first.value), bytes)
  assert.deepEqual(await readBytes(second.value), bytes, 'a second get streams the bytes again')
  const other = await b.get('k', [])
  assert.deepEqual(await readBytes(other.value), bytes)
  assert.deepEqual(
    { tags: other.tags, stale: other.stale, expire: other.expire, revalidate: other.revalidate, timestamp: other.timestamp },
    { tags: ['t1'], stale: 300, expire: 3600, revalidate: 900, timestamp: first.timestamp },
  )
})

test('a value at the key that the handler did not store is a miss, never a crash', async () => {
  const ns = newNamespace('next')
  const { StampedeCache } = require('../index.js')
  const other = new StampedeCache({ redis: redis.url, namespace: ns, serializer: 'v8' })
  open.push(other)
  await other.set(['next:use-cache', 'k'], { value: 'not bytes' })
  await other.set(['next:incremental', '/p'], 42)
  assert.equal(await useCache({ namespace: ns }).get('k', []), undefined)
  const C = incremental({ namespace: ns })
  assert.equal(await new C({}).get('/p', { kind: 'APP_PAGE' }), null)
})

test('"use cache": a get while a set of the key is pending waits for it', async () => {
  const a = useCache({ namespace: newNamespace('next') })
  let complete
  const pending = new Promise((r) => (complete = r))
  const setting = a.set('k', pending)
  const got = a.get('k', [])
  await sleep(100)
  complete(entry(new TextEncoder().encode('late')))
  await setting
  assert.equal(new TextDecoder().decode(await readBytes((await got).value)), 'late')
})

test('"use cache": a cold key missed by two instances at once is computed by one; the others serve its set', async () => {
  const ns = newNamespace('next')
  const instances = [useCache({ namespace: ns }), useCache({ namespace: ns })]
  let computed = 0
  const compute = async () => {
    computed++
    await sleep(300)
    return { bytes: new TextEncoder().encode(`value ${computed}`) }
  }
  const results = await Promise.all(Array.from({ length: 10 }, (_, i) => render(instances[i % 2], 'cold', compute)))
  assert.equal(computed, 1)
  assert.equal(results.filter((r) => !r.hit).length, 1, 'one get answered a miss')
  assert.equal(new Set(results.map((r) => new TextDecoder().decode(r.bytes))).size, 1)
})

test('"use cache": an instance that misses and never sets frees the key within lockTtl; the waiters compute', async () => {
  const ns = newNamespace('next')
  const a = useCache({ namespace: ns, lockTtl: 400 })
  const b = useCache({ namespace: ns, lockTtl: 400 })
  assert.equal(await a.get('abandoned', []), undefined, 'a leads, and never calls set')
  const started = Date.now()
  assert.equal(await b.get('abandoned', []), undefined, 'b is handed the miss')
  assert.ok(Date.now() - started < 10_000)
  // An entry that is not cacheable (expire 0) frees the key at once as well.
  assert.equal(await a.get('dynamic', []), undefined)
  const waiting = b.get('dynamic', [])
  await sleep(50)
  await a.set('dynamic', Promise.resolve(entry(new Uint8Array([1]), { expire: 0 })))
  assert.equal(await waiting, undefined)
  assert.equal(await a.get('dynamic', []), undefined, 'nothing was stored')
})

test('"use cache": updateTags on one instance drops entries of a tag, or of a soft tag, on the others', async () => {
  const ns = newNamespace('next')
  const a = useCache({ namespace: ns })
  const b = useCache({ namespace: ns })
  const bytes = new Uint8Array([1, 2, 3])
  await render(a, 'tagged', async () => ({ bytes, tags: ['posts'] }), ['_N_T_/layout', '_N_T_/blog'])
  await render(a, 'other', async () => ({ bytes, tags: ['users'] }), ['_N_T_/layout', '_N_T_/users'])
  await sleep(100)
  assert.ok(await b.get('tagged', []))
  await a.updateTags(['posts'], { expire: 0 })
  await sleep(200)
  assert.equal(await b.get('tagged', []), undefined, 'the tagged entry is gone on b')
  assert.ok(await b.get('other', []), 'an entry of another tag stays')
  await a.set('tagged', Promise.resolve(entry(bytes, { tags: ['posts'] })))
  // revalidatePath('/users') reaches the entry computed for that path through its soft tags.
  await a.updateTags(['_N_T_/users'])
  await sleep(200)
  assert.equal(await b.get('other', []), undefined)
  assert.ok(await b.get('tagged', []))
  assert.equal(await a.getExpiration(['_N_T_/users']), Infinity, 'soft tags are checked by get')
})

test('incremental cache: values keep Buffers and Maps; tags of ISR entries and of fetch entries are revalidated', async () => {
  const ns = newNamespace('next')
  const A = incremental({ namespace: ns })
  const B = incremental({ namespace: ns })
  const page = {
    kind: 'APP_PAGE',
    html: '<p>hi</p>',
    rscData: Buffer.from([0, 1, 2, 250]),
    headers: { 'x-next-cache-tags': '_N_T_/layout,_N_T_/isr,posts' },
    postponed: undefined,
    status: 200,
    segmentData: new Map([['/_tree', Buffer.from('tree')]]),
  }
  assert.equal(await new A({}).get('/isr', { kind: 'APP_PAGE' }), null)
  await new A({}).set('/isr', page, { cacheControl: { revalidate: 60, expire: 3600 } })
  const got = await new B({}).get('/isr', { kind: 'APP_PAGE' })
  assert.deepEqual(got.value, page)
  assert.ok(Buffer.isBuffer(got.value.rscData) && got.value.segmentData instanceof Map)
  assert.deepEqual(got.cacheControl, { revalidate: 60, expire: 3600 })
  assert.ok(Math.abs(got.lastModified - Date.now()) < 60_000)

  const fetched = { kind: 'FETCH', data: { headers: {}, body: 'e30=', status: 200, url: 'http://x/' }, revalidate: 60 }
  await new A({}).get('f1', { kind: 'FETCH', tags: ['feed'], softTags: ['_N_T_/layout'] })
  await new A({}).set('f1', fetched, { fetchCache: true, tags: ['feed'] })
  assert.deepEqual((await new B({}).get('f1', { kind: 'FETCH', tags: ['feed'] })).value, fetched)

  await new B({}).revalidateTag('posts')
  await new B({}).revalidateTag(['feed'], { expire: 0 })
  await sleep(200)
  assert.equal(await new A({}).get('/isr', { kind: 'APP_PAGE' }), null)
  assert.equal(await new A({}).get('f1', { kind: 'FETCH', tags: ['feed'] }), null)
})

test('incremental cache: one class state across constructions (Next constructs it on every request)', async () => {
  const ns = newNamespace('next')
  const C = incremental({ namespace: ns })
  let computed = 0
  const renderIsr = async () => {
    const h = new C({})
    const hit = await h.get('/once', { kind: 'APP_PAGE' })
    if (hit) return hit.value.html
    computed++
    await sleep(200)
    const html = `<p>${computed}</p>`
    await new C({}).set('/once', { kind: 'APP_PAGE', html, headers: {}, status: 200 }, { cacheControl: { revalidate: 60, expire: 600 } })
    return html
  }
  const pages = await Promise.all(Array.from({ length: 5 }, renderIsr))
  assert.equal(computed, 1)
  assert.equal(new Set(pages).size, 1)
})

test('Redis down: get is a miss and set resolves, within commandTimeout-sized bounds; back up, sharing resumes', async () => {
  const ns = newNamespace('next')
  const a = useCache({ namespace: ns, redis: { url: redis.url, commandTimeout: 300, connectTimeout: 300 } })
  await a.get('warm', [])
  await redis.stop('SIGKILL')
  try {
    let started = Date.now()
    assert.equal(await a.get('down', []), undefined)
    await a.set('down', Promise.resolve(entry(new Uint8Array([9]))))
    assert.ok(Date.now() - started < 10_000, `get and set settled (${Date.now() - started} ms)`)
    started = Date.now()
    await a.updateTags(['x'])
    assert.ok(Date.now() - started < 10_000)
    assert.deepEqual(await readBytes((await a.get('down', [])).value), new Uint8Array([9]), 'served from the in-process tier')
  } finally {
    await redis.start()
  }
  const b = useCache({ namespace: ns })
  const deadline = Date.now() + 30_000
  for (let n = 0; ; n++) {
    await a.set(`back${n}`, Promise.resolve(entry(new Uint8Array([n & 0xff]))))
    const seen = await b.get(`back${n}`, [])
    if (seen) break
    assert.ok(Date.now() < deadline, 'a set on a reaches b again after Redis is back')
    await sleep(200)
  }
})

test('Redis slow (paused) or full (maxmemory, noeviction): get is a miss, set resolves, nothing hangs', async () => {
  const ns = newNamespace('next')
  const options = { namespace: ns, redis: { url: redis.url, commandTimeout: 300, connectTimeout: 300 } }
  const a = useCache(options)
  const b = useCache(options)
  await a.get('warm', [])
  await b.get('warm', [])
  redis.pause()
  try {
    const started = Date.now()
    assert.equal(await a.get('slow', []), undefined)
    await a.set('slow', Promise.resolve(entry(new Uint8Array([1]))))
    assert.equal(await b.get('slow', []), undefined, 'the other instance computes too: Redis could not share it')
    assert.ok(Date.now() - started < 10_000, `settled (${Date.now() - started} ms)`)
  } finally {
    redis.resume()
  }
  await command(redis.port, ['CONFIG', 'SET', 'maxmemory-policy', 'noeviction'])
  await command(redis.port, ['CONFIG', 'SET', 'maxmemory', '1'])
  try {
    const started = Date.now()
    assert.equal(await a.get('full', []), undefined)
    await a.set('full', Promise.resolve(entry(new Uint8Array(10_000))))
    const other = await b.get('full', [])
    if (other) assert.equal((await readBytes(other.value)).length, 10_000)
    assert.ok(Date.now() - started < 10_000, `settled (${Date.now() - started} ms)`)
  } finally {
    await command(redis.port, ['CONFIG', 'SET', 'maxmemory', '0'])
  }
})

test('next build (NEXT_PHASE=phase-production-build): nothing is written to Redis', async () => {
  const ns = newNamespace('nextbuild')
  const script = `
    const { createUseCacheHandler, createIncrementalCacheHandler } = require(${JSON.stringify(path.join(__dirname, '..', 'next.js'))})
    const h = createUseCacheHandler({ redis: process.env.URL, namespace: process.env.NS })
    const C = createIncrementalCacheHandler({ redis: process.env.URL, namespace: process.env.NS })
    const value = new ReadableStream({ start(c) { c.enqueue(new Uint8Array([1])); c.close() } })
    ;(async () => {
      await h.get('k', [])
      await h.set('k', Promise.resolve({ value, tags: ['t'], stale: 1, timestamp: Date.now(), expire: 60, revalidate: 60 }))
      await new C({}).set('/p', { kind: 'APP_PAGE', html: 'x', headers: {}, status: 200 }, { cacheControl: { revalidate: 60, expire: 60 } })
      await h.updateTags(['t'])
      const hit = await h.get('x', [])
      await h.cache.close(); await C.cache.close()
      console.log('done')
    })()`
  const out = await new Promise((resolve, reject) =>
    execFile(
      process.execPath,
      ['-e', script],
      { env: { ...process.env, URL: redis.url, NS: ns, NEXT_PHASE: 'phase-production-build' }, timeout: 30_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)),
    ),
  )
  assert.equal(out.trim(), 'done')
  assert.deepEqual(await command(redis.port, ['KEYS', `${ns}*`]), [])
})

test('tag keys expire a year after the last revalidation; entries live a year at most', async () => {
  const YEAR = 365 * 24 * 3_600_000
  // tagTtl plus the margin of 2 x commandTimeout (default 1 s) + 1 s (README, Tags).
  const MARGIN = 3_000
  const ns = newNamespace('nexttagttl')
  const h = useCache({ namespace: ns })
  const C = incremental({ namespace: ns })
  const pttl = async (key) => Number(await command(redis.port, ['PTTL', key]))
  await render(h, 'k', async () => ({ bytes: new Uint8Array([1]), tags: ['posts'], revalidate: 10 * YEAR, expire: 10 * YEAR }))
  await h.set('long', Promise.resolve(entry(new Uint8Array([2]), { tags: ['posts'], revalidate: 10 * YEAR, expire: 10 * YEAR })))
  await h.updateTags(['posts'])
  await new C({}).revalidateTag('feed')
  for (const tag of ['posts', 'feed']) {
    const left = await pttl(`${ns}:tag:{${tag}}`)
    assert.ok(left > YEAR - 60_000 && left <= YEAR + MARGIN, `${tag}: PTTL ${left} ≈ a year`)
  }
  // An entry given more than a year lives a year in Redis at most (as ever); so a tag key that
  // expired has nothing left to kill.
  await h.set('after', Promise.resolve(entry(new Uint8Array([3]), { tags: ['posts'], revalidate: 10 * YEAR, expire: 10 * YEAR })))
  const values = await command(redis.port, ['KEYS', `${ns}:v*`])
  assert.ok(values.length >= 1, 'the entry is in Redis')
  for (const key of values) {
    const left = await pttl(key)
    assert.ok(left > 0 && left <= YEAR, `${key}: PTTL ${left} <= a year`)
  }
  // A tagTtl given to the handler is kept.
  const ns2 = newNamespace('nexttagttl')
  const short = useCache({ namespace: ns2, tagTtl: 60_000 })
  await short.updateTags(['posts'])
  const shortLeft = await pttl(`${ns2}:tag:{posts}`)
  assert.ok(shortLeft > 0 && shortLeft <= 60_000 + MARGIN, `PTTL ${shortLeft} ≈ 60 s`)
})

// ---- maxEntryBytes, and records validated before Next is handed them ----------------------------

test('maxEntryBytes: bad values throw ERR_INVALID_OPTION naming it; Infinity turns the cap off', () => {
  for (const create of [createUseCacheHandler, createIncrementalCacheHandler]) {
    for (const bad of [0, -1, 1.5, Number.NaN, '4mb', null]) {
      assert.throws(
        () => create({ maxEntryBytes: bad }),
        (e) => e.code === 'ERR_INVALID_OPTION' && /maxEntryBytes/.test(e.message),
        String(bad),
      )
    }
    const made = create({ maxEntryBytes: Number.POSITIVE_INFINITY })
    open.push(made.cache)
  }
})

test('"use cache": an entry over maxEntryBytes is served from its render, not stored, counted and reported; the stream is not read past the cap; waiters are freed at once', async () => {
  const ns = newNamespace('next')
  const errors = []
  const onError = (err, info) => errors.push({ code: err.code, message: err.message, info })
  const a = useCache({ namespace: ns, maxEntryBytes: 10_000, lockTtl: 60_000, onError })
  const b = useCache({ namespace: ns, maxEntryBytes: 10_000, lockTtl: 60_000, onError })
  const big = new Uint8Array(50_000).fill(7)
  // The render serves its own bytes whatever the cache does with them.
  const first = await render(a, 'big', async () => ({ bytes: big }))
  assert.equal(first.hit, false)
  assert.equal(first.bytes.length, 50_000)
  await sleep(100)
  assert.equal(await b.get('big', []), undefined, 'not stored: a miss elsewhere too')
  // b now leads 'big'; a waits for it, and is freed by b's oversized set at once, not after lockTtl.
  const waiting = a.get('big', [])
  await sleep(50)
  // A stream whose chunks are pulled one at a time: reading stops once the cap is passed.
  let pulled = 0
  const stream = new ReadableStream({
    pull(c) {
      pulled++
      if (pulled > 100) c.close()
      else c.enqueue(new Uint8Array(1_000))
    },
  })
  await b.set('big', Promise.resolve({ ...entry(new Uint8Array(0)), value: stream }))
  const freed = await Promise.race([waiting, sleep(10_000).then(() => 'still waiting')])
  assert.equal(freed, undefined, 'the waiter is answered a miss, so its instance renders')
  assert.ok(pulled <= 12, `read ${pulled} chunks of 1,000 bytes for a cap of 10,000`)
  assert.equal(a.stats().oversizedEntries + b.stats().oversizedEntries, 2)
  assert.equal(errors.length, 2)
  for (const e of errors) {
    assert.equal(e.code, 'ERR_ENTRY_TOO_LARGE')
    assert.match(e.message, /maxEntryBytes \(10000\)/)
    assert.equal(e.info.op, 'next:set')
  }
  // Under the cap: stored as before.
  await render(a, 'small', async () => ({ bytes: new Uint8Array(9_000).fill(1) }))
  await sleep(100)
  const hit = await b.get('small', [])
  assert.equal((await readBytes(hit.value)).length, 9_000)
})

test('incremental cache: an entry over maxEntryBytes (the 4 MiB default) is not stored and is reported; one under it is', async () => {
  const ns = newNamespace('next')
  const errors = []
  const C = incremental({ namespace: ns, onError: (err) => errors.push(err.code) })
  const route = (bytes) => ({ kind: 'APP_ROUTE', body: Buffer.alloc(bytes, 1), status: 200, headers: { 'content-type': 'text/plain' } })
  await new C({}).get('/big', { kind: 'APP_ROUTE' })
  await new C({}).set('/big', route(5 * 1024 * 1024), { cacheControl: { revalidate: 60, expire: 3600 } })
  assert.equal(await new C({}).get('/big', { kind: 'APP_ROUTE' }), null)
  await new C({}).get('/fits', { kind: 'APP_ROUTE' })
  await new C({}).set('/fits', route(3 * 1024 * 1024), { cacheControl: { revalidate: 60, expire: 3600 } })
  assert.equal((await new C({}).get('/fits', { kind: 'APP_ROUTE' })).value.body.length, 3 * 1024 * 1024)
  assert.deepEqual(errors, ['ERR_ENTRY_TOO_LARGE'])
  assert.equal(C.stats().oversizedEntries, 1)
})

test('records of the wrong shape at a key (another writer, corruption) are misses, never handed to Next; counted', async () => {
  const ns = newNamespace('next')
  const { StampedeCache } = require('../index.js')
  const writer = new StampedeCache({ redis: redis.url, namespace: ns, serializer: 'v8' })
  open.push(writer)
  const C = incremental({ namespace: ns })
  const page = { kind: 'APP_PAGE', html: '<p>ok</p>', rscData: Buffer.from('rsc'), status: 200, headers: {}, segmentData: new Map([['/a', Buffer.from('s')]]) }
  const incrementalCases = {
    valid: { lastModified: 1, value: page, cacheControl: { revalidate: 60, expire: 3600 } },
    deleted: { lastModified: 1, value: null },
    noValue: { lastModified: 1 },
    badTime: { lastModified: 'yesterday', value: page },
    unknownKind: { lastModified: 1, value: { kind: 'EVIL', html: '<script>' } },
    htmlNotString: { lastModified: 1, value: { ...page, html: { toString: 1 } } },
    rscNotBytes: { lastModified: 1, value: { ...page, rscData: 'rsc' } },
    segmentsNotBytes: { lastModified: 1, value: { ...page, segmentData: new Map([['/a', 'str']]) } },
    badStatus: { lastModified: 1, value: { ...page, status: 'teapot' } },
    badHeaders: { lastModified: 1, value: { ...page, headers: { a: { nested: true } } } },
    fetchBodyNotString: { lastModified: 1, value: { kind: 'FETCH', data: { headers: {}, body: 5, url: 'http://x/' }, revalidate: 60 } },
    badCacheControl: { lastModified: 1, value: page, cacheControl: { revalidate: 'soon' } },
    notAnObject: 'a string',
  }
  for (const [name, record] of Object.entries(incrementalCases)) await writer.set(['next:incremental', name], record)
  for (const name of Object.keys(incrementalCases)) {
    const got = await new C({}).get(name, { kind: 'APP_PAGE' })
    if (name === 'valid') assert.deepEqual(got.value, page)
    else if (name === 'deleted') assert.equal(got.value, null)
    else assert.equal(got, null, name)
  }
  assert.equal(C.stats().invalidRecords, Object.keys(incrementalCases).length - 2)

  const u = useCache({ namespace: ns })
  const good = { value: new Uint8Array([1, 2]), tags: ['t'], stale: 300, timestamp: Date.now(), expire: 3600, revalidate: 900 }
  const useCases = {
    valid: good,
    tagsNotStrings: { ...good, tags: [1, 2] },
    staleNaN: { ...good, stale: Number.NaN },
    negativeExpire: { ...good, expire: -1 },
    valueNotBytes: { ...good, value: 'bytes' },
  }
  for (const [name, record] of Object.entries(useCases)) await writer.set(['next:use-cache', name], record)
  for (const name of Object.keys(useCases)) {
    const got = await u.get(name, [])
    if (name === 'valid') assert.deepEqual(await readBytes(got.value), new Uint8Array([1, 2]))
    else assert.equal(got, undefined, name)
  }
  assert.equal(u.stats().invalidRecords, Object.keys(useCases).length - 1)
})
