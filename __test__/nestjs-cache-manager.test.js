'use strict'
// stampede-cache/nestjs as a drop-in for @nestjs/cache-manager: one app, written as the original's
// documentation teaches (fixtures/nest-cache-app.js), run over the original packages and over
// stampede-cache/nestjs (the one line an app changes), over HTTP on loopback. Same responses; and
// the handler-run counts the drop-in exists for: concurrent cold requests run a handler once, in
// one process and across processes sharing a Redis.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const path = require('node:path')
const { fork, execFileSync } = require('node:child_process')
require('reflect-metadata')
const { NestFactory } = require('@nestjs/core')
const { Injectable, Module } = require('@nestjs/common')
const { StampedeCache } = require('stampede-cache')
const ours = require('stampede-cache/nestjs')
const original = require('@nestjs/cache-manager')
const { createAppModule, Counters } = require('./fixtures/nest-cache-app.js')
const { RedisServer } = require('./helpers/redis-server.js')

const ORIGINAL = '@nestjs/cache-manager'
const OURS = 'stampede-cache/nestjs'
const APP_SCRIPT = path.join(__dirname, 'fixtures', 'nest-cache-app.js')
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

function deferred() {
  let resolve
  const promise = new Promise((r) => (resolve = r))
  return { promise, resolve }
}

/** Polls `predicate` (sync or async) every 5 ms until it holds; fails after `ms`. */
async function until(what, predicate, ms = 15_000) {
  const deadline = Date.now() + ms
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(5)
  }
}

function request(port, method, urlPath, body, extraHeaders = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body)
    const headers = { ...extraHeaders, ...(data === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) }) }
    http
      .request({ host: '127.0.0.1', port, method, path: urlPath, headers, agent: false }, (res) => {
        let text = ''
        res.on('data', (d) => (text += d))
        res.on('end', () => resolve({ status: res.statusCode, body: text, xCache: res.headers['x-cache'] ?? null }))
      })
      .on('error', reject)
      .end(data)
  })
}

async function startApp(t, pkg, options) {
  const counters = new Counters()
  const app = await NestFactory.create(createAppModule(pkg, { options, counters }), { logger: false })
  t.after(() => {
    // A held handler would keep app.close() waiting for its requests: open the gate first.
    counters.open?.()
    return app.close()
  })
  await app.listen(0, '127.0.0.1')
  return { app, counters, port: app.getHttpServer().address().port }
}

// The scenario both packages run, in order; each step's response (and X-Cache) recorded.
const STEPS = [
  ['GET', '/items/1'],
  ['GET', '/items/1'],
  ['GET', '/items/custom'],
  ['POST', '/store/get', { key: 'custom_key' }], // @CacheKey's entry, through CACHE_MANAGER
  ['GET', '/items/observable/3'],
  ['GET', '/items/observable/3'],
  ['GET', '/items/nothing'],
  ['GET', '/items/missing'],
  ['GET', '/items/missing'],
  ['POST', '/items/1', { name: 'renamed' }],
  ['POST', '/items/1', { name: 'renamed' }],
  ['POST', '/store/get', { key: '/items/1' }], // the interceptor's entry (the URL), through CACHE_MANAGER
  ['POST', '/store/set', { key: 'user:1', value: { name: 'Ada', roles: ['admin'] }, ttl: 60_000 }],
  ['POST', '/store/get', { key: 'user:1' }],
  [
    'POST',
    '/store/mset',
    {
      list: [
        { key: 'a', value: 1 },
        { key: 'b', value: 'two', ttl: 30_000 },
      ],
    },
  ],
  ['POST', '/store/mget', { keys: ['a', 'b', 'nope'] }],
  ['POST', '/store/del', { key: 'a' }],
  ['POST', '/store/mget', { keys: ['a', 'b'] }],
  ['POST', '/store/set', { key: '/items/2', value: { id: '2', name: 'set by CACHE_MANAGER' } }],
  ['GET', '/items/2'], // read through the interceptor: the entry CACHE_MANAGER set
  ['POST', '/store/wrap', { key: 'report', n: 100 }],
  ['POST', '/store/wrap', { key: 'report', n: 100 }],
  ['POST', '/store/clear', {}],
  ['POST', '/store/get', { key: 'user:1' }],
]

async function runScenario(t, pkg) {
  const { app, counters, port } = await startApp(t, pkg, { ttl: 5_000 })
  const responses = []
  for (const [method, urlPath, body] of STEPS) {
    const r = await request(port, method, urlPath, body)
    responses.push({ step: `${method} ${urlPath} ${body ? JSON.stringify(body) : ''}`, ...r })
  }
  // ttl(key): when the entry expires, epoch ms; undefined for a missing key.
  await request(port, 'POST', '/store/set', { key: 't', value: 1, ttl: 10_000 })
  const ttl = JSON.parse((await request(port, 'POST', '/store/ttl', { key: 't' })).body)
  const noTtl = JSON.parse((await request(port, 'POST', '/store/ttl', { key: 'absent' })).body)
  // @CacheTTL as a function of the ExecutionContext.
  const ttlFn = {}
  for (const url of ['/items/ttl-fn', '/items/ttl-fn?long=1']) {
    await request(port, 'GET', url)
    const { expires, now } = JSON.parse((await request(port, 'POST', '/store/ttl', { key: url })).body)
    ttlFn[url] = expires - now
  }
  await app.close()
  return { responses, runs: counters.runs, ttl, noTtl, ttlFn }
}

/** `n` concurrent cold GETs of one URL, the handler held until they have all arrived (or 10 s). */
async function concurrentGets(t, pkg, { urlPath = '/items/7', run = 'item:7', n = 50 } = {}) {
  const { app, counters, port } = await startApp(t, pkg, { ttl: 5_000 })
  const release = counters.hold()
  const all = Promise.all(Array.from({ length: n }, () => request(port, 'GET', urlPath)))
  if (pkg === OURS) {
    const cache = app.get(StampedeCache)
    // Every request is in the interceptor: one leads the load, n - 1 wait for it.
    await until(`${n - 1} coalesced requests`, () => cache.stats().coalesced === n - 1, 10_000)
  } else {
    // The original runs the handler per request: wait for all n (none can finish while held).
    await until(`${n} handler runs`, () => counters.runs[run] === n, 10_000).catch(() => {})
  }
  release()
  const responses = await all
  return { responses, runs: counters.runs[run] ?? 0, app, counters, port }
}

test('the documented app answers the same over @nestjs/cache-manager and stampede-cache/nestjs', async (t) => {
  const theirs = await runScenario(t, ORIGINAL)
  const mine = await runScenario(t, OURS)
  for (let i = 0; i < STEPS.length; i++) {
    const [a, b] = [theirs.responses[i], mine.responses[i]]
    assert.equal(b.status, a.status, `status of ${a.step}`)
    assert.deepEqual(b.body === '' ? '' : JSON.parse(b.body), a.body === '' ? '' : JSON.parse(a.body), `body of ${a.step}`)
    assert.equal(b.xCache, a.xCache, `X-Cache of ${a.step}`)
  }
  const byStep = (r, i) => JSON.parse(r.responses[i].body)
  // Spot checks that the shared scenario exercised what it claims, in both.
  for (const r of [theirs, mine]) {
    assert.deepEqual(byStep(r, 1), { id: '1', name: 'item-1', tags: ['a', 'b'] })
    assert.equal(r.responses[1].xCache, 'HIT')
    assert.deepEqual(byStep(r, 3), { value: ['custom', 1] }, '@CacheKey("custom_key") is the CACHE_MANAGER key')
    assert.equal(r.responses[7].status, 404)
    assert.deepEqual(byStep(r, 11), { value: { id: '1', name: 'item-1', tags: ['a', 'b'] } }, 'the URL is the key')
    assert.deepEqual(byStep(r, 15), { values: [1, 'two', null] })
    assert.deepEqual(byStep(r, 19), { id: '2', name: 'set by CACHE_MANAGER' })
    assert.deepEqual(byStep(r, 20), { answers: 100, distinct: 1, value: { key: 'report', computed: true } })
    assert.deepEqual(byStep(r, 23), { value: null }, 'clear emptied the cache')
    assert.ok(r.ttl.expires > r.ttl.now && r.ttl.expires <= r.ttl.now + 10_000, `ttl() is the expiry in epoch ms: ${JSON.stringify(r.ttl)}`)
    assert.equal(r.noTtl.expires, null)
    const { '/items/ttl-fn': short, '/items/ttl-fn?long=1': long } = r.ttlFn
    assert.ok(short > 0 && short <= 1_500 && long > 1_500 && long <= 60_000, `@CacheTTL(fn): ${JSON.stringify(r.ttlFn)}`)
  }
  // Handler runs: each cached GET once; errors and POSTs every time; wrap's fn once for 2 x 100 calls.
  for (const r of [theirs, mine]) {
    assert.equal(r.runs['item:1'], 1)
    assert.equal(r.runs.custom, 1)
    assert.equal(r.runs['observable:3'], 1)
    assert.equal(r.runs.missing, 2, 'errors are not cached')
    assert.equal(r.runs['post:1'], 2, 'POST is not cached')
    assert.equal(r.runs['item:2'], undefined, 'the entry CACHE_MANAGER set answered the GET')
  }
  assert.equal(mine.runs['wrap:report'], 1, 'ours: 200 wraps, one fn call')
  t.diagnostic(`wrap x100 (twice): original fn calls ${theirs.runs['wrap:report']}, ours ${mine.runs['wrap:report']}`)
})

test('50 concurrent cold GETs: the original runs the handler per request, ours once', async (t) => {
  const theirs = await concurrentGets(t, ORIGINAL)
  const mine = await concurrentGets(t, OURS)
  const expected = JSON.stringify({ id: '7', name: 'item-7', tags: ['a', 'b'] })
  for (const r of [...theirs.responses, ...mine.responses]) {
    assert.equal(r.status, 200)
    assert.equal(r.body, expected)
  }
  t.diagnostic(`handler runs for 50 concurrent GETs: original ${theirs.runs}, stampede-cache ${mine.runs}`)
  assert.ok(theirs.runs > 1, `original: ${theirs.runs}`)
  assert.equal(mine.runs, 1)
  // The one request that ran the handler says MISS; the 49 that shared its run were not computed for.
  assert.equal(mine.responses.filter((r) => r.xCache === 'MISS').length, 1)
})

test('concurrent requests: a handler error is shared and not cached; a StreamableFile is sent by each request, never cached', async (t) => {
  for (const pkg of [ORIGINAL, OURS]) {
    const burst = await concurrentGets(t, pkg, { urlPath: '/items/missing', run: 'missing', n: 10 })
    const { app, counters, port } = burst
    assert.ok(
      burst.responses.every((r) => r.status === 404 && JSON.parse(r.body).message === 'no such item'),
      pkg,
    )
    const runsAfterBurst = burst.runs
    assert.equal((await request(port, 'GET', '/items/missing')).status, 404)
    assert.equal(counters.runs.missing, runsAfterBurst + 1, `${pkg}: the error was not cached`)
    const sets = []
    app.get(pkg === OURS ? ours.CACHE_MANAGER : original.CACHE_MANAGER).on('set', ({ key }) => sets.push(key))
    const files = await Promise.all(Array.from({ length: 5 }, () => request(port, 'GET', '/items/file')))
    assert.ok(
      files.every((r) => r.status === 200 && r.body === 'file contents'),
      `${pkg}: every request got the whole file`,
    )
    assert.equal((await request(port, 'GET', '/items/file')).body, 'file contents')
    assert.equal(counters.runs.file, 6, `${pkg}: one stream per request`)
    assert.deepEqual(sets, [], `${pkg}: nothing was set`)
    assert.equal(runsAfterBurst, pkg === OURS ? 1 : 10, 'ours: the 10 concurrent requests shared one failing run')
    t.diagnostic(`${pkg}: 10 concurrent failing GETs ran the handler ${runsAfterBurst} time(s)`)
  }
})

test('the interceptor with refreshThreshold: stale responses at once, the handler refreshed once in the background', async (t) => {
  const { app, counters, port } = await startApp(t, OURS, { ttl: 60_000, refreshThreshold: 59_900 })
  const cache = app.get(StampedeCache)
  assert.equal((await request(port, 'GET', '/items/5')).status, 200)
  assert.equal(counters.runs['item:5'], 1)
  await until('the entry to need a refresh', async () => (await cache.inspect('/items/5')).state === 'stale')
  const release = counters.hold()
  const responses = await Promise.all(Array.from({ length: 20 }, () => request(port, 'GET', '/items/5')))
  assert.ok(
    responses.every((r) => r.status === 200 && r.xCache === 'HIT' && JSON.parse(r.body).id === '5'),
    'answered while the refresh is held',
  )
  assert.equal(counters.runs['item:5'], 2, 'one background refresh')
  release()
  await cache.settle()
  assert.equal(counters.runs['item:5'], 2)
  assert.equal((await cache.inspect('/items/5')).state, 'fresh')
})

test('wrap called 100 times at once runs fn once; a rejected fn rejects every caller and is not cached', async (t) => {
  const { app } = await startApp(t, OURS, { ttl: 5_000 })
  const cm = app.get(ours.CACHE_MANAGER)
  let calls = 0
  let open
  const gate = new Promise((resolve) => (open = resolve))
  const fn = async () => {
    calls++
    await gate
    return { n: calls }
  }
  const all = Promise.all(Array.from({ length: 100 }, () => cm.wrap('w', fn, 1_000)))
  await until('the call to start', () => calls >= 1)
  open()
  const values = await all
  assert.equal(calls, 1)
  assert.ok(values.every((v) => v.n === 1))
  assert.equal(app.get(ours.Cache), cm, 'the Cache class token is the same object')
  assert.deepEqual(await app.get(StampedeCache).get('w'), { n: 1 }, 'the StampedeCache holds the entry wrap wrote')
  await app.get(StampedeCache).set('from-core', [1, 2])
  assert.deepEqual(await cm.get('from-core'), [1, 2], 'and wrap reads what the StampedeCache wrote')

  let failures = 0
  const boom = async () => {
    failures++
    await sleep(5)
    throw new Error('upstream down')
  }
  const failed = await Promise.allSettled(Array.from({ length: 20 }, () => cm.wrap('f', boom)))
  assert.ok(failed.every((r) => r.status === 'rejected' && r.reason.message === 'upstream down'))
  assert.equal(failures, 1)
  assert.equal(await cm.wrap('f', () => 'ok'), 'ok', 'the error was not cached')
})

test('ttl is the whole life; refreshThreshold serves and refreshes once in the background, with cache-manager events', async (t) => {
  const { app } = await startApp(t, OURS, { ttl: 60_000, refreshThreshold: 59_900 })
  const cm = app.get(ours.CACHE_MANAGER)
  const cache = app.get(StampedeCache)
  const events = []
  for (const name of ['set', 'del', 'clear', 'refresh']) cm.on(name, (data) => events.push([name, data]))
  let version = 0
  let open = null
  const fn = async () => {
    version++
    if (open) await open.promise
    return { version }
  }
  assert.deepEqual(await cm.wrap('k', fn), { version: 1 })
  const info = await cache.inspect('k')
  assert.equal(info.hardUntil - info.freshUntil, 59_900, 'fresh for ttl - refreshThreshold, alive for ttl')
  const expires = await cm.ttl('k')
  assert.ok(expires <= Date.now() + 60_000 && expires > Date.now() + 55_000, 'ttl() is the end of its life')

  await until('the entry to need a refresh', async () => (await cache.inspect('k')).state === 'stale')
  open = deferred()
  const served = await Promise.all(Array.from({ length: 30 }, () => cm.wrap('k', fn)))
  assert.ok(
    served.every((v) => v.version === 1),
    'the current value is served at once',
  )
  assert.equal(version, 2, 'one background refresh')
  open.resolve()
  await cache.settle()
  assert.deepEqual(await cm.get('k'), { version: 2 })

  await cm.set('s', 'v', 1_000)
  await cm.del('s')
  await cm.clear()
  // cache-manager 7's payloads: a set is reported per store ('primary') and then for the call; a
  // refresh sets, then reports the refresh.
  assert.deepEqual(events, [
    ['set', { key: 'k', value: { version: 1 }, store: 'primary' }],
    ['set', { key: 'k', value: { version: 1 } }],
    ['set', { key: 'k', value: { version: 2 }, store: 'primary' }],
    ['set', { key: 'k', value: { version: 2 } }],
    ['refresh', { key: 'k', value: { version: 2 } }],
    ['set', { key: 's', value: 'v', store: 'primary' }],
    ['set', { key: 's', value: 'v' }],
    ['del', { key: 's' }],
    ['clear', undefined],
  ])
  assert.throws(() => cm.on('got', () => {}), { code: 'ERR_INVALID_ARGUMENT', message: /'set'/ })
})

test("wrap's per-call ttl and refreshThreshold: numbers, an options object, functions of the value, raw", async (t) => {
  const { app } = await startApp(t, OURS, { ttl: 60_000 })
  const cm = app.get(ours.CACHE_MANAGER)
  const cache = app.get(StampedeCache)
  // What is left of the entry's life (at most `life`, less only by the time since it was written)
  // and its stale-while-revalidate window.
  const span = async (key, life, window) => {
    const info = await cache.inspect(key)
    const left = info.hardUntil - Date.now()
    assert.ok(left <= life && left > life - 5_000, `${key}: ${left} ms left of ${life}`)
    assert.equal(Math.round(info.hardUntil - info.freshUntil), window, key)
  }
  await cm.wrap('a', () => 1)
  await span('a', 60_000, 0) // the module's ttl
  await cm.wrap('b', () => 1, 10_000, 2_500)
  await span('b', 10_000, 2_500)
  await cm.wrap('c', () => 1, { ttl: 20_000, refreshThreshold: 5_000 })
  await span('c', 20_000, 5_000)
  await cm.wrap('d', () => ({ life: 30_000 }), { ttl: (v) => v.life, refreshThreshold: (v) => v.life / 10 })
  await span('d', 30_000, 3_000)
  const raw = await cm.wrap('e', () => 'v', { ttl: 40_000, raw: true })
  assert.equal(raw.value, 'v')
  assert.ok(raw.expires <= Date.now() + 40_000 && raw.expires > Date.now() + 35_000)
  await cm.set('f', 1, 0)
  assert.equal(await cm.ttl('f'), undefined, 'ttl 0: no expiry, as in cache-manager')
  assert.equal(await cm.get('f'), 1)
  await assert.rejects(
    cm.wrap('g', () => 1, -5),
    { code: 'ERR_INVALID_ARGUMENT' },
  )
  await assert.rejects(cm.wrap('g', 'not a function'), { code: 'ERR_INVALID_ARGUMENT' })
})

test('without refreshThreshold an entry is never served after ttl: the next read loads it, once', async (t) => {
  const { app } = await startApp(t, OURS, { ttl: 150 })
  const cm = app.get(ours.CACHE_MANAGER)
  const cache = app.get(StampedeCache)
  let loads = 0
  const fn = async () => {
    loads++
    await sleep(20)
    return loads
  }
  assert.equal(await cm.wrap('k', fn), 1)
  const info = await cache.inspect('k')
  assert.ok(info.hardUntil - info.freshUntil === 0 && info.hardUntil <= Date.now() + 150)
  await until('the entry to expire', async () => (await cm.get('k')) === undefined)
  const after = await Promise.all(Array.from({ length: 20 }, () => cm.wrap('k', fn)))
  assert.ok(
    after.every((v) => v === 2),
    'the expired value was not served',
  )
  assert.equal(loads, 2)
})

test('two app instances sharing a Redis: requests with other credentials each run their own handler; 2 x 25 concurrent cold GETs without run it once in total', async (t) => {
  const redis = await new RedisServer().start()
  t.after(() => redis.dispose())
  const spawnInstance = () =>
    new Promise((resolve, reject) => {
      const child = fork(APP_SCRIPT, [], {
        env: { ...process.env, CACHE_PACKAGE: OURS, HOLD: '1', CACHE_OPTIONS: JSON.stringify({ ttl: 30_000, redis: redis.url }) },
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      })
      t.after(() => child.kill('SIGKILL'))
      const replies = []
      let waiting = null
      child.on('message', (msg) => {
        if (msg.error) reject(new Error(msg.error))
        else if (msg.port) resolve({ child, port: msg.port, ask })
        else if (waiting) waiting(msg)
        else replies.push(msg)
      })
      child.once('exit', (code) => reject(new Error(`instance exited with ${code}`)))
      function ask(what) {
        return new Promise((res, rej) => {
          const timer = setTimeout(() => rej(new Error(`no answer to ${what}`)), 10_000)
          waiting = (msg) => {
            clearTimeout(timer)
            waiting = null
            res(msg)
          }
          child.send(what)
        })
      }
    })
  const [a, b] = await Promise.all([spawnInstance(), spawnInstance()])
  // Requests with credentials never share a run across instances either: with the handler held,
  // each instance gets one cold request per token, and every one runs its own handler.
  const tokens = { ada: 'Bearer ada-token', bob: 'Bearer bob-token', bad: 'Bearer stolen' }
  const profiles = Promise.all(
    [a, b].flatMap(({ port }) =>
      Object.entries(tokens).map(async ([who, token]) => [who, await request(port, 'GET', '/items/me', undefined, { authorization: token })]),
    ),
  )
  await until('6 profile handler runs', async () => ((await a.ask('runs')).runs.me ?? 0) + ((await b.ask('runs')).runs.me ?? 0) === 6)
  await Promise.all([a.ask('release'), b.ask('release')])
  for (const [who, r] of await profiles) {
    if (who === 'bad') assert.equal(r.status, 401, 'a bad token never gets the 200')
    else assert.deepEqual(JSON.parse(r.body), { user: who, secret: `${who}'s secret` }, `${who} gets its own answer`)
  }
  await Promise.all([a.ask('hold'), b.ask('hold')])
  const all = Promise.all([a, b].flatMap(({ port }) => Array.from({ length: 25 }, () => request(port, 'GET', '/items/9'))))
  // Both instances have every request waiting: 24 coalesced in each, and one instance's leader
  // waiting for the other's lock.
  await until('48 coalesced requests and a lock wait', async () => {
    const [sa, sb] = [(await a.ask('runs')).stats, (await b.ask('runs')).stats]
    return sa.coalesced + sb.coalesced === 48 && sa.lockWaits + sb.lockWaits >= 1
  })
  await Promise.all([a.ask('release'), b.ask('release')])
  const responses = await all
  assert.ok(responses.every((r) => r.status === 200 && r.body === JSON.stringify({ id: '9', name: 'item-9', tags: ['a', 'b'] })))
  const [ra, rb] = [await a.ask('runs'), await b.ask('runs')]
  const total = (ra.runs['item:9'] ?? 0) + (rb.runs['item:9'] ?? 0)
  t.diagnostic(`handler runs across 2 instances x 25 GETs: ${total} (a: ${ra.runs['item:9'] ?? 0}, b: ${rb.runs['item:9'] ?? 0})`)
  assert.equal(total, 1)
  for (const { child } of [a, b]) child.send('close')
})

test('examples/nestjs, the @nestjs/cache-manager way: 200 cold requests per route, one query each', async (t) => {
  const { createCacheManagerAppModule, FeedDb } = require('../examples/nestjs/cache-manager.module.js')
  const db = new FeedDb()
  const app = await NestFactory.create(createCacheManagerAppModule({ cache: { ttl: 30_000 }, db }), { logger: false })
  t.after(() => app.close())
  await app.listen(0, '127.0.0.1')
  const { port } = app.getHttpServer().address()
  const cache = app.get(StampedeCache)
  for (const [urlPath, queries] of [
    ['/feed/42', 1],
    ['/feed/42/summary', 2],
  ]) {
    const release = db.hold()
    const before = cache.stats().coalesced
    const all = Promise.all(Array.from({ length: 200 }, () => request(port, 'GET', urlPath)))
    await until(`199 requests of ${urlPath} waiting`, () => cache.stats().coalesced - before === 199)
    release()
    const responses = await all
    assert.ok(
      responses.every((r) => r.status === 200 && r.body === responses[0].body),
      urlPath,
    )
    assert.equal(db.queries, queries, `${urlPath}: one query`)
  }
  assert.deepEqual(JSON.parse((await request(port, 'GET', '/feed/42/summary')).body), { userId: '42', count: 2 })
  const feed = await request(port, 'GET', '/feed/42')
  assert.equal(feed.xCache, 'HIT')
  assert.equal(JSON.parse(feed.body).version, 1)
  assert.equal(db.queries, 2)
  const info = await cache.inspect('/feed/42')
  assert.ok(info.hardUntil - Date.now() <= 30_000, "@CacheTTL(30_000) is the entry's life")
})

test('a CacheInterceptor subclass overriding trackBy and isRequestCacheable, as the original allows', async (t) => {
  const { Controller, Get, Req } = require('@nestjs/common')
  const { APP_INTERCEPTOR } = require('@nestjs/core')
  for (const pkg of [ORIGINAL, OURS]) {
    const { CacheModule, CacheInterceptor } = require(pkg)
    // @Injectable() class TenantCacheInterceptor extends CacheInterceptor { ... }
    class TenantCacheInterceptor extends CacheInterceptor {
      trackBy(context) {
        const url = super.trackBy(context)
        return url && `tenant:${context.switchToHttp().getRequest().headers['x-tenant'] ?? 'none'}:${url}`
      }

      isRequestCacheable(context) {
        return super.isRequestCacheable(context) && context.switchToHttp().getRequest().headers['cache-control'] !== 'no-cache'
      }
    }
    Injectable()(TenantCacheInterceptor)
    let runs = 0
    class ReportController {
      report(req) {
        runs++
        return { url: req.url, run: runs }
      }
    }
    Controller('reports')(ReportController)
    Get(':id')(ReportController.prototype, 'report', Object.getOwnPropertyDescriptor(ReportController.prototype, 'report'))
    Req()(ReportController.prototype, 'report', 0)
    const AppModule = moduleOf({
      imports: [CacheModule.register({ ttl: 5_000, isGlobal: true })],
      controllers: [ReportController],
      providers: [{ provide: APP_INTERCEPTOR, useClass: TenantCacheInterceptor }],
    })
    const app = await NestFactory.create(AppModule, { logger: false })
    t.after(() => app.close())
    await app.listen(0, '127.0.0.1')
    const { port } = app.getHttpServer().address()
    const first = await request(port, 'GET', '/reports/1')
    const again = await request(port, 'GET', '/reports/1')
    assert.deepEqual(JSON.parse(again.body), JSON.parse(first.body), pkg)
    assert.equal(runs, 1, `${pkg}: served from the key trackBy made`)
    assert.equal(JSON.parse((await request(port, 'GET', '/reports/1', undefined, { 'x-tenant': 'acme' })).body).run, 2, `${pkg}: another tenant, another key`)
    assert.equal(JSON.parse((await request(port, 'GET', '/reports/1', undefined, { 'cache-control': 'no-cache' })).body).run, 3, `${pkg}: not cacheable`)
    assert.equal(JSON.parse((await request(port, 'GET', '/reports/1', undefined, { 'x-tenant': 'acme' })).body).run, 2, pkg)
    const cm = app.get(pkg === OURS ? ours.CACHE_MANAGER : original.CACHE_MANAGER)
    assert.deepEqual(await cm.get('tenant:none:/reports/1'), { url: '/reports/1', run: 1 }, pkg)
  }
})

// Manual decorators, as in the fixture.
function moduleOf(metadata) {
  class M {}
  Object.defineProperty(M, 'name', { value: `M${Math.random().toString(36).slice(2)}` })
  Module(metadata)(M)
  return M
}

test('registerAsync: useFactory with inject and imports, useClass and useExisting with createCacheOptions()', async () => {
  const CONFIG = 'CONFIG'
  const ConfigModule = moduleOf({ providers: [{ provide: CONFIG, useValue: { ttl: 4_000 } }], exports: [CONFIG] })
  class CacheConfig {
    createCacheOptions() {
      return { ttl: 3_000, refreshThreshold: 1_000 }
    }
  }
  Injectable()(CacheConfig)
  const ConfigClassModule = moduleOf({ providers: [CacheConfig], exports: [CacheConfig] })
  const cases = [
    [{ imports: [ConfigModule], inject: [CONFIG], useFactory: async (config) => ({ ttl: config.ttl }) }, 4_000, 4_000],
    [{ useClass: CacheConfig }, 3_000, 2_000],
    [{ imports: [ConfigClassModule], useExisting: CacheConfig }, 3_000, 2_000],
  ]
  for (const [options, life, fresh] of cases) {
    const app = await NestFactory.createApplicationContext(moduleOf({ imports: [ours.CacheModule.registerAsync(options)] }), { logger: false })
    const cm = app.get(ours.CACHE_MANAGER)
    await cm.set('k', 1)
    const info = await app.get(StampedeCache).inspect('k')
    assert.equal(Math.round(info.hardUntil - info.freshUntil), life - fresh, Object.keys(options).join())
    assert.ok(info.hardUntil <= Date.now() + life)
    await app.close()
    await assert.rejects(cm.get('k'), { code: 'ERR_CLOSED' }, 'closed with the app')
  }
})

test('bad options: ERR_INVALID_OPTION naming the option, at register time (registerAsync: at bootstrap)', async () => {
  const { CacheModule } = ours
  assert.throws(() => CacheModule.register({ ttl: 1_000, tll: 5 }), { code: 'ERR_INVALID_OPTION', message: /`tll`/ })
  assert.throws(() => CacheModule.register({ stores: [{}] }), { code: 'ERR_INVALID_OPTION', message: /`stores`.*use `redis`/ })
  assert.throws(() => CacheModule.register({ nonBlocking: true }), { code: 'ERR_INVALID_OPTION', message: /`nonBlocking`/ })
  assert.throws(() => CacheModule.register({ ttl: -1 }), { code: 'ERR_INVALID_OPTION', message: /`ttl`/ })
  assert.throws(() => CacheModule.register({ refreshThreshold: 'soon' }), { code: 'ERR_INVALID_OPTION', message: /`refreshThreshold`/ })
  assert.throws(() => CacheModule.register({ hardTtl: 10 }), { code: 'ERR_INVALID_OPTION', message: /`hardTtl`/ })
  assert.throws(() => CacheModule.register({ jitter: 2 }), { code: 'ERR_INVALID_OPTION', message: /jitter/ })
  assert.throws(() => CacheModule.registerAsync({}), { code: 'ERR_INVALID_OPTION', message: /useFactory/ })
  assert.throws(() => CacheModule.registerAsync({ useFactory: () => ({}), useClass: class {} }), { code: 'ERR_INVALID_OPTION', message: /useClass/ })
  assert.throws(() => CacheModule.registerAsync({ useFactory: () => ({}), ttl: 5 }), { code: 'ERR_INVALID_OPTION', message: /`ttl`/ })
  const Async = moduleOf({ imports: [CacheModule.registerAsync({ useFactory: () => ({ store: 'redis' }) })] })
  await assert.rejects(NestFactory.createApplicationContext(Async, { logger: false, abortOnError: false }), {
    code: 'ERR_INVALID_OPTION',
    message: /`store`/,
  })
  // The same app with the original: no such checks (shown so the difference is deliberate).
  assert.doesNotThrow(() => original.CacheModule.register({ ttl: 1_000, tll: 5 }))
})

test('the drop-in shares the original metadata keys and token, and is a named export of both entries', () => {
  assert.equal(ours.CACHE_MANAGER, original.CACHE_MANAGER)
  assert.equal(ours.CACHE_KEY_METADATA, original.CACHE_KEY_METADATA)
  assert.equal(ours.CACHE_TTL_METADATA, original.CACHE_TTL_METADATA)
  // @CacheKey/@CacheTTL of either package mark a handler the same way.
  class C {
    h() {}
  }
  const d = Object.getOwnPropertyDescriptor(C.prototype, 'h')
  original.CacheKey('from-original')(C.prototype, 'h', d)
  assert.equal(Reflect.getMetadata(ours.CACHE_KEY_METADATA, C.prototype.h), 'from-original')
  ours.CacheTTL(1234)(C.prototype, 'h', d)
  assert.equal(Reflect.getMetadata(original.CACHE_TTL_METADATA, C.prototype.h), 1234)

  const names = [
    'CacheModule',
    'CacheInterceptor',
    'CACHE_MANAGER',
    'CacheKey',
    'CacheTTL',
    'Cache',
    'CACHE_KEY_METADATA',
    'CACHE_TTL_METADATA',
    'StampedeCacheModule',
  ]
  const script = `
    const cjs = require('stampede-cache/nestjs')
    const loaded = Object.keys(require.cache).filter((f) => f.includes('@nestjs'))
    import('stampede-cache/nestjs').then((esm) => {
      console.log(JSON.stringify({ loaded, same: ${JSON.stringify(names)}.filter((n) => esm[n] === undefined || esm[n] !== cjs[n]) }))
    })`
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { cwd: path.join(__dirname, '..'), encoding: 'utf8' }))
  assert.deepEqual(out, { loaded: [], same: [] })
})

// ---- cache-manager 7's own behaviours (its suite, packages/cache-manager/test), over CACHE_MANAGER ----

/** A CACHE_MANAGER of CacheModule.register(options), in an application context closed after the test. */
async function managerOf(t, options) {
  const app = await NestFactory.createApplicationContext(moduleOf({ imports: [ours.CacheModule.register(options)] }), { logger: false })
  t.after(() => app.close())
  return { cm: app.get(ours.CACHE_MANAGER), cache: app.get(StampedeCache) }
}

test('cache-manager behaviours: get, set, mget, mset, del, mdel, clear; ttl() and expiry; cacheId; stores of in-memory Keyvs', async (t) => {
  const { Keyv } = require('keyv')
  const { cm } = await managerOf(t, { stores: [new Keyv()], cacheId: 'my-cache-id' })
  assert.equal(cm.cacheId(), 'my-cache-id')
  assert.equal(typeof (await managerOf(t, {})).cm.cacheId(), 'string')
  assert.equal(await cm.set('k', 'v'), 'v')
  assert.equal(await cm.get('k'), 'v')
  assert.equal(await cm.get('nope'), undefined)
  assert.equal(await cm.ttl('k'), undefined, 'no ttl: kept until deleted')
  const list = [
    { key: 'a', value: 1 },
    { key: 'b', value: 'two', ttl: 60_000 },
    { key: 'c', value: { three: 3 } },
  ]
  assert.deepEqual(await cm.mset(list), [
    { key: 'a', value: 1, ttl: undefined },
    { key: 'b', value: 'two', ttl: 60_000 },
    { key: 'c', value: { three: 3 }, ttl: undefined },
  ])
  assert.deepEqual(await cm.mget(['a', 'b', 'c', 'nope']), [1, 'two', { three: 3 }, undefined])
  assert.equal(await cm.mdel(['a', 'b']), true)
  assert.deepEqual(await cm.mget(['a', 'b', 'c']), [undefined, undefined, { three: 3 }])
  assert.equal(await cm.del('c'), true)
  assert.equal(await cm.get('c'), undefined)
  // ttl(key): the expiry in epoch ms; an expired entry is gone, from get and ttl.
  await cm.set('short', 'v', 300)
  const expires = await cm.ttl('short')
  assert.ok(expires > Date.now() && expires <= Date.now() + 300, String(expires))
  await until('the entry to expire', async () => (await cm.get('short')) === undefined)
  assert.equal(await cm.ttl('short'), undefined)
  assert.equal(await cm.clear(), true)
  assert.equal(await cm.get('k'), undefined)
  // The module's ttl is every entry's default.
  const timed = (await managerOf(t, { ttl: 60_000 })).cm
  await timed.set('d', 1)
  assert.ok((await timed.ttl('d')) <= Date.now() + 60_000)
})

test("cache-manager behaviours: wrap's per-call refreshThreshold decides each call's refresh, and a read right after sees it", async (t) => {
  const { cm } = await managerOf(t, {})
  const life = 4_000
  const threshold = 2_000
  assert.equal(await cm.wrap('k', async () => 0, life, threshold), 0)
  await sleep(life - threshold + 100)
  // Less than the threshold left: the current value at once, and a background refresh...
  assert.equal(await cm.wrap('k', async () => 1, life, threshold), 0)
  // ...whose value the next call gets.
  assert.equal(await cm.wrap('k', async () => 2, life, threshold), 1)
  // Another threshold, judged by this call: 4 s of life left is more than 1 s, so no refresh.
  assert.equal(await cm.wrap('k', async () => 3, undefined, 1_000), 1)
  assert.equal(await cm.get('k'), 1)
  await until('less than 1 s of life left', async () => (await cm.ttl('k')) - Date.now() < 1_000)
  assert.equal(await cm.wrap('k', async () => 4, undefined, 1_000), 1, 'refreshed in the background')
  assert.equal(await cm.wrap('k', async () => 5, undefined, 1_000), 4)
})

test('cache-manager behaviours: ttl and refreshThreshold functions are evaluated on each value, refreshes included; refresh events', async (t) => {
  const { cm, cache } = await managerOf(t, {})
  const events = []
  cm.on('refresh', (payload) => events.push(payload))
  const ttlOf = []
  let value = 10
  const ttl = (v) => {
    ttlOf.push(v)
    return 3_000
  }
  assert.equal(await cm.wrap('k', async () => ++value, ttl, 1_500), 11)
  assert.deepEqual(ttlOf, [11])
  await until('less than 1.5 s left', async () => (await cm.ttl('k')) - Date.now() < 1_500)
  assert.equal(await cm.wrap('k', async () => ++value, ttl, 1_500), 11)
  await until('the refresh', () => ttlOf.length === 2)
  assert.deepEqual(ttlOf, [11, 12], 'evaluated on the refreshed value')
  await until('the refresh event', () => events.length === 1)
  assert.deepEqual(events, [{ key: 'k', value: 12 }])
  // A refresh whose fn throws: the current value stays, and the event carries it and the error.
  await until('the refreshed entry in place', async () => (await cm.ttl('k')) - Date.now() > 2_000)
  await until('less than 1.5 s left again', async () => (await cm.ttl('k')) - Date.now() < 1_500)
  const boom = new Error('source down')
  assert.equal(
    await cm.wrap(
      'k',
      () => {
        throw boom
      },
      ttl,
      1_500,
    ),
    12,
  )
  await until('the failed refresh event', () => events.length === 2)
  await cache.settle()
  assert.equal(await cm.get('k'), 12, 'the current value stays')
  assert.deepEqual(events[1], { key: 'k', value: 12, error: boom })
})

test('cache-manager behaviours: nested wraps of other caches share no state; disconnect closes the cache', async (t) => {
  const { cm } = await managerOf(t, {})
  const other = (await managerOf(t, {})).cm
  let a = 0
  let b = 0
  const got = await cm.wrap('k', async () =>
    other
      .wrap('k', () => {
        b++
        return 'B'
      })
      .then((v) => {
        a++
        return `${v}A`
      }),
  )
  assert.equal(got, 'BA')
  assert.deepEqual([a, b], [1, 1])
  assert.equal(await other.get('k'), 'B')
  assert.equal(await other.disconnect(), undefined)
  await assert.rejects(other.get('k'), { code: 'ERR_CLOSED' })
  assert.equal(await cm.get('k'), 'BA', 'the other cache is untouched')
})
