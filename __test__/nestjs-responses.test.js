'use strict'
// stampede-cache/nestjs against @nestjs/cache-manager 12 (with cache-manager 7), over HTTP on
// loopback (API.md, "NestJS"): the same controller under both modules answers the same status,
// headers and body bytes for every result type a handler may return, on a miss and on a hit;
// nothing is logged per request that the original does not log; concurrent cold requests share a
// handler run only when they carry the same credentials; CACHE_MANAGER's events carry
// cache-manager 7's payloads; `stores: [createKeyv(url)]` is taken as `redis`.
const { test, after } = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const { Readable } = require('node:stream')
require('reflect-metadata')
const { NestFactory, APP_INTERCEPTOR } = require('@nestjs/core')
const { Controller, Get, Module, Param, Req, StreamableFile, UnauthorizedException } = require('@nestjs/common')
const { StampedeCache } = require('stampede-cache')
const ours = require('stampede-cache/nestjs')
const { RedisServer, killAllSync } = require('./helpers/redis-server.js')

after(() => killAllSync())

const ORIGINAL = '@nestjs/cache-manager'
const OURS = 'stampede-cache/nestjs'
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function until(what, predicate, ms = 15_000) {
  const deadline = Date.now() + ms
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(5)
  }
}

/** A GET on loopback: status, headers and the body's bytes. */
function get(port, path, headers = {}) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path, headers, agent: false }, (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }))
      })
      .on('error', reject)
  })
}

// Headers that differ between any two responses whatever the app (time, connection handling).
const NOISE = new Set(['date', 'connection', 'keep-alive'])
const comparable = (r) => ({
  status: r.status,
  headers: Object.fromEntries(Object.entries(r.headers).filter(([k]) => !NOISE.has(k))),
  body: r.body.toString('base64'),
})

/** Log lines a Nest app writes (its logger), by level; startup lines are dropped by the caller. */
function recordingLogger() {
  const lines = []
  const record =
    (level) =>
    (...args) =>
      lines.push({ level, text: args.map(String).join(' ') })
  return {
    lines,
    logger: { log: record('log'), error: record('error'), warn: record('warn'), debug: record('debug'), verbose: record('verbose'), fatal: record('fatal') },
  }
}

function moduleOf(metadata) {
  class M {}
  Object.defineProperty(M, 'name', { value: `M${Math.random().toString(36).slice(2)}` })
  Module(metadata)(M)
  return M
}

function route(cls, name, path, ...params) {
  Get(path)(cls.prototype, name, Object.getOwnPropertyDescriptor(cls.prototype, name))
  params.forEach((p, i) => p(cls.prototype, name, i))
}

/** An app over `pkg` with the global CacheInterceptor and `controller`; its port, logs and cache manager. */
async function startApp(t, pkg, controller, options = { ttl: 5_000 }) {
  const { CacheModule, CacheInterceptor, CACHE_MANAGER } = require(pkg)
  const logs = recordingLogger()
  const AppModule = moduleOf({
    imports: [CacheModule.register({ ...options, isGlobal: true })],
    controllers: [controller],
    providers: [{ provide: APP_INTERCEPTOR, useClass: CacheInterceptor }],
  })
  const app = await NestFactory.create(AppModule, { logger: logs.logger })
  t.after(() => app.close())
  await app.listen(0, '127.0.0.1')
  // From here on, every line is per request.
  logs.lines.length = 0
  return { app, port: app.getHttpServer().address().port, logs: logs.lines, cm: app.get(CACHE_MANAGER) }
}

class WithToJSON {
  constructor() {
    this.secret = 'not shown'
  }
  toJSON() {
    return { shown: 1 }
  }
}
class ToJSONString {
  toJSON() {
    return 'as a string'
  }
}
class Plain {
  constructor() {
    this.a = 1
    this.b = undefined
  }
  get c() {
    return 3
  }
  method() {}
}

// Every result type a handler may return, each under its own URL.
const RESULTS = {
  object: () => ({ a: 1, nested: { at: new Date(0), list: [1, { deep: true }] }, gone: undefined }),
  array: () => [1, 'two', null, undefined, { three: 3 }],
  string: () => 'hello <b>world</b>',
  empty: () => '',
  unicode: () => 'żółć ✓',
  number: () => 42.5,
  zero: () => 0,
  nan: () => Number.NaN,
  boolean: () => false,
  null: () => null,
  undefined: () => undefined,
  date: () => new Date(86_400_000),
  toJSON: () => new WithToJSON(),
  toJSONString: () => new ToJSONString(),
  instance: () => new Plain(),
  buffer: () => Buffer.from('raw bytes \u0000\u00ff'),
  typedArray: () => new Uint8Array([1, 2, 3]),
  map: () => new Map([['k', 'v']]),
  bigint: () => 10n,
  bigintInside: () => ({ n: 10n }),
  streamableFile: () => new StreamableFile(Buffer.from('file contents'), { type: 'text/plain' }),
  promise: async () => ({ later: true }),
}

function typesController(runs) {
  class TypesController {
    result(kind) {
      runs[kind] = (runs[kind] ?? 0) + 1
      return RESULTS[kind]()
    }
  }
  Controller('types')(TypesController)
  route(TypesController, 'result', ':kind', Param('kind'))
  return TypesController
}

test('every result type: the same status, headers and body bytes as @nestjs/cache-manager, on a miss and on a hit', async (t) => {
  const answers = {}
  const logged = {}
  for (const pkg of [ORIGINAL, OURS]) {
    const runs = {}
    const { port, logs } = await startApp(t, pkg, typesController(runs))
    answers[pkg] = {}
    for (const kind of Object.keys(RESULTS)) {
      const miss = await get(port, `/types/${kind}`)
      const hit = await get(port, `/types/${kind}`)
      answers[pkg][kind] = { miss: comparable(miss), hit: comparable(hit), runs: runs[kind] }
    }
    logged[pkg] = logs
  }
  // Only what the original logs too: Nest's own 500 for a body JSON cannot hold ({ n: 10n }).
  assert.deepEqual(logged[OURS], logged[ORIGINAL], 'the same log lines')
  assert.ok(logged[OURS].every((l) => l.text.includes('BigInt')))
  for (const kind of Object.keys(RESULTS)) {
    const [theirs, mine] = [answers[ORIGINAL][kind], answers[OURS][kind]]
    assert.deepEqual(mine.miss, theirs.miss, `${kind}: the miss`)
    if (kind === 'bigintInside') {
      // A body JSON cannot hold is a 500 in both; the original kept the object in memory and says
      // X-Cache: HIT for its second 500, ours cannot store it and runs the handler again (MISS).
      const { 'x-cache': x, ...rest } = mine.hit.headers
      assert.equal(x, 'MISS')
      assert.deepEqual({ ...mine.hit, headers: { ...rest, 'x-cache': 'HIT' } }, theirs.hit)
      continue
    }
    assert.deepEqual(mine.hit, theirs.hit, `${kind}: the hit`)
  }
  // The checks above compared what the scenario claims to exercise.
  const mine = answers[OURS]
  assert.equal(mine.date.hit.headers['content-type'], 'application/json; charset=utf-8')
  assert.equal(Buffer.from(mine.date.hit.body, 'base64').toString(), '"1970-01-02T00:00:00.000Z"')
  assert.equal(Buffer.from(mine.toJSONString.hit.body, 'base64').toString(), '"as a string"')
  assert.equal(mine.object.hit.headers['x-cache'], 'HIT')
  assert.ok(mine.object.hit.headers.etag, 'Express set an etag')
  assert.equal(mine.object.runs, 1, 'the hit did not run the handler')
  assert.equal(mine.streamableFile.runs, 2, 'a StreamableFile is never cached')
})

test('a Node stream a handler returns: streamed on a miss as by the original; never cached, so the next request streams again', async (t) => {
  const answers = {}
  for (const pkg of [ORIGINAL, OURS]) {
    let runs = 0
    class StreamController {
      stream() {
        runs++
        return Readable.from(['chunk-1 ', 'chunk-2'])
      }
    }
    Controller('stream')(StreamController)
    route(StreamController, 'stream', '')
    const { port } = await startApp(t, pkg, StreamController)
    answers[pkg] = { miss: comparable(await get(port, '/stream')), next: await get(port, '/stream'), runs }
    answers[pkg].runs = runs
  }
  assert.deepEqual(answers[OURS].miss, answers[ORIGINAL].miss)
  assert.equal(answers[OURS].miss.status, 200)
  // The original caches the stream object and hands the spent stream to the next request (a 500);
  // ours runs the handler again, as for a StreamableFile.
  assert.equal(answers[ORIGINAL].next.status, 500)
  assert.equal(answers[OURS].next.status, 200)
  assert.equal(answers[OURS].next.body.toString(), 'chunk-1 chunk-2')
  assert.equal(answers[OURS].next.headers['x-cache'], 'MISS')
  assert.equal(answers[OURS].runs, 2)
})

test('a URL over 1,024 bytes is cached as the original caches it, and nothing is logged', async (t) => {
  const long = `/types/object?${'q=x&'.repeat(400)}`
  assert.ok(Buffer.byteLength(long) > 1_024)
  const seen = {}
  for (const pkg of [ORIGINAL, OURS]) {
    const runs = {}
    const { port, logs, cm } = await startApp(t, pkg, typesController(runs))
    const first = await get(port, long)
    const second = await get(port, long)
    assert.deepEqual(comparable(second).body, comparable(first).body)
    assert.equal(second.headers['x-cache'], 'HIT', pkg)
    assert.equal(runs.object, 1, `${pkg}: served from the cache`)
    assert.deepEqual(logs, [], `${pkg}: nothing logged`)
    // The entry is the URL's, through CACHE_MANAGER too.
    seen[pkg] = await cm.get(long)
    await cm.del(long)
    assert.equal(await cm.get(long), undefined)
  }
  assert.deepEqual(seen[OURS], JSON.parse(JSON.stringify(seen[ORIGINAL])))
})

// A profile route whose handler checks the credentials itself (as an app without a guard does):
// two users' tokens, a bad token, and a session cookie per user.
function profileController(state) {
  const USERS = { 'Bearer ada-token': 'ada', 'Bearer bob-token': 'bob' }
  class ProfileController {
    async profile(req) {
      state.runs++
      await state.gate
      const user = USERS[req.headers.authorization] ?? /session=(\w+)/.exec(req.headers.cookie ?? '')?.[1]
      if (user === undefined) throw new UnauthorizedException('bad credentials')
      return { user, secret: `${user}'s secret` }
    }

    async boom() {
      state.boomRuns++
      throw new Error('not an HttpException')
    }
  }
  Controller('me')(ProfileController)
  route(ProfileController, 'profile', '', Req())
  route(ProfileController, 'boom', 'boom')
  return ProfileController
}

/** Holds the profile handler; resolves once all `n` requests are inside the interceptor. */
async function burst(t, pkg, requests) {
  const state = { runs: 0, boomRuns: 0, gate: null }
  let open
  state.gate = new Promise((resolve) => (open = resolve))
  const { app, port } = await startApp(t, pkg, profileController(state))
  // Ours: each request with credentials reads the cache once before it joins or leads a run.
  let reads = 0
  if (pkg === OURS) {
    const cache = app.get(StampedeCache)
    const read = cache.get.bind(cache)
    cache.get = async (...args) => {
      try {
        return await read(...args)
      } finally {
        reads++
      }
    }
  }
  const all = Promise.all(requests.map((headers) => get(port, '/me', headers)))
  if (pkg === OURS) {
    const anonymous = requests.filter((h) => Object.keys(h).length === 0).length
    await until('every request to be in the interceptor', () => reads >= requests.length - anonymous && (anonymous === 0 || state.runs >= 1))
    // A turn for the last reads' continuations to join their flights.
    await sleep(20)
  } else {
    await until('every handler to run', () => state.runs === requests.length)
  }
  open()
  const responses = await all
  return { responses, runs: state.runs, state, port }
}

const ADA = { authorization: 'Bearer ada-token' }
const BOB = { authorization: 'Bearer bob-token' }
const BAD = { authorization: 'Bearer stolen' }

test('10 concurrent cold requests with other credentials: each gets its own answer; the same credentials share one run', async (t) => {
  const requests = [ADA, BAD, BOB, ADA, BAD, BOB, ADA, BAD, BOB, ADA]
  for (const pkg of [ORIGINAL, OURS]) {
    const { responses, runs, port } = await burst(t, pkg, requests)
    requests.forEach((headers, i) => {
      const r = responses[i]
      const body = JSON.parse(r.body.toString())
      if (headers === BAD) {
        assert.equal(r.status, 401, `${pkg}: a bad token never gets the 200`)
        assert.ok(!r.body.toString().includes('secret'), pkg)
      } else {
        const user = headers === ADA ? 'ada' : 'bob'
        assert.equal(r.status, 200, `${pkg}: a good token never gets another's 401`)
        assert.deepEqual(body, { user, secret: `${user}'s secret` }, `${pkg}: its own user's answer`)
      }
    })
    t.diagnostic(`${pkg}: ${runs} handler runs for 10 requests with 3 sets of credentials`)
    assert.equal(runs, pkg === OURS ? 3 : 10)
    // Once cached, the entry is served by its key, to any credentials, as the original serves it.
    const later = await get(port, '/me', BAD)
    assert.equal(later.status, 200, pkg)
    assert.equal(later.headers['x-cache'], 'HIT', pkg)
  }
})

test('requests differing only by Cookie run their own handlers; requests without credentials share one run of their own', async (t) => {
  const A = { cookie: 'session=ada' }
  const B = { cookie: 'session=bob' }
  const NONE = {}
  const requests = [A, B, NONE, A, B, NONE, A, B, NONE, NONE]
  const { responses, runs } = await burst(t, OURS, requests)
  requests.forEach((headers, i) => {
    const r = responses[i]
    if (headers === NONE) assert.equal(r.status, 401)
    else assert.equal(JSON.parse(r.body.toString()).user, headers === A ? 'ada' : 'bob')
  })
  assert.equal(runs, 3, 'one run per set of credentials, none shared across them')
})

test('a handler error (an HttpException or any other) is never cached, in both', async (t) => {
  for (const pkg of [ORIGINAL, OURS]) {
    const { responses, state, port } = await burst(t, pkg, [BAD, BAD])
    assert.ok(responses.every((r) => r.status === 401))
    const before = state.runs
    state.gate = null
    assert.equal((await get(port, '/me', BAD)).status, 401)
    assert.equal((await get(port, '/me')).status, 401)
    assert.equal(state.runs, before + 2, `${pkg}: the 401 was not cached`)
    const first = await get(port, '/me/boom')
    const second = await get(port, '/me/boom', ADA)
    assert.equal(first.status, 500)
    assert.deepEqual(comparable(second).body, comparable(first).body)
    assert.equal(state.boomRuns, 2, `${pkg}: the 500 was not cached`)
  }
})

test("CACHE_MANAGER's events carry cache-manager 7's payloads, event for event", async () => {
  const { createCache } = await import('cache-manager')
  const recorded = {}
  for (const which of ['cache-manager', OURS]) {
    let cm
    let app
    if (which === OURS) {
      app = await NestFactory.createApplicationContext(moduleOf({ imports: [ours.CacheModule.register({ ttl: 60_000 })] }), { logger: false })
      cm = app.get(ours.CACHE_MANAGER)
    } else {
      cm = createCache({ ttl: 60_000 })
    }
    const events = []
    for (const name of ['get', 'mget', 'set', 'mset', 'del', 'mdel', 'clear', 'ttl', 'refresh']) {
      cm.on(name, (payload) => events.push([name, payload]))
    }
    await cm.set('a', { v: 1 })
    await cm.set('b', 'two', 30_000)
    await cm.get('a')
    await cm.get('missing')
    await cm.mget(['a', 'missing', 'b'])
    await cm.ttl('a')
    await cm.ttl('missing')
    await cm.mset([
      { key: 'c', value: 3 },
      { key: 'd', value: [4], ttl: 10_000 },
    ])
    await cm.del('c')
    await cm.mdel(['a', 'd'])
    await cm.wrap('w', () => ({ wrapped: true }))
    await cm.wrap('w', () => ({ wrapped: 'again' }))
    await cm.clear()
    // The expiry in a 'ttl' payload is a time: compare its presence.
    recorded[which] = events.map(([name, p]) =>
      name === 'ttl' && p?.value ? [name, { ...p, value: { ...p.value, expires: typeof p.value.expires } }] : [name, p],
    )
    await app?.close()
  }
  assert.deepEqual(recorded[OURS], recorded['cache-manager'])
  assert.ok(recorded[OURS].some(([name, p]) => name === 'get' && p.store === 'primary'))
})

test("stores: [createKeyv(url)], the original's documented Redis set-up, is taken as redis: <its URL>; in registerAsync too", async (t) => {
  const redis = await new RedisServer().start()
  t.after(() => redis.dispose())
  const { createKeyv } = require('@keyv/redis')
  const { Keyv } = require('keyv')
  const reader = new StampedeCache({ redis: redis.url, l1: false })
  t.after(() => reader.close())
  const registrations = [
    ['register, one store', ours.CacheModule.register({ stores: [createKeyv(redis.url)] })],
    ['register, an in-memory Keyv in front', ours.CacheModule.register({ stores: [new Keyv(), createKeyv(redis.url)], ttl: 30_000 })],
    ['registerAsync useFactory', ours.CacheModule.registerAsync({ useFactory: async () => ({ stores: [createKeyv(redis.url)] }) })],
    ['registerAsync, not an array', ours.CacheModule.registerAsync({ useFactory: () => ({ stores: createKeyv(redis.url) }) })],
  ]
  for (const [how, registration] of registrations) {
    const app = await NestFactory.createApplicationContext(moduleOf({ imports: [registration] }), { logger: false })
    const cm = app.get(ours.CACHE_MANAGER)
    await cm.set(`from ${how}`, { how })
    assert.deepEqual(await reader.get(`from ${how}`), { how }, `${how}: the entry is in Redis`)
    await app.close()
  }
  // The Keyv namespace becomes the namespace.
  const app = await NestFactory.createApplicationContext(
    moduleOf({ imports: [ours.CacheModule.register({ stores: [createKeyv(redis.url, { namespace: 'shop' })] })] }),
    {
      logger: false,
    },
  )
  await app.get(ours.CACHE_MANAGER).set('k', 1)
  assert.equal(app.get(StampedeCache).namespace, 'shop')
  await app.close()
})

test('other store options throw ERR_INVALID_OPTION naming the option; a password never appears in the message', async () => {
  const { createKeyv } = require('@keyv/redis')
  const { Keyv } = require('keyv')
  const { CacheModule } = ours
  const secretUrl = 'redis://user:hunter2@127.0.0.1:1/0'
  const cases = [
    [{ stores: [createKeyv(secretUrl), createKeyv('redis://127.0.0.1:2')] }, /`stores`.*several Redis stores.*use `redis`/],
    [{ stores: [new Keyv({ store: { get() {}, set() {}, delete() {}, clear() {} } })] }, /`stores`.*use `redis`/],
    [{ stores: [{}] }, /`stores`.*use `redis`/],
    [{ stores: [createKeyv(secretUrl)], redis: 'redis://127.0.0.1:3' }, /`redis` or a Redis store in `stores`/],
    [{ nonBlocking: true }, /`nonBlocking`/],
  ]
  for (const [options, message] of cases) {
    assert.throws(
      () => CacheModule.register(options),
      (err) => {
        assert.equal(err.code, 'ERR_INVALID_OPTION')
        assert.match(err.message, message)
        assert.ok(!err.message.includes('hunter2'), err.message)
        return true
      },
    )
  }
  const Async = moduleOf({ imports: [CacheModule.registerAsync({ useFactory: () => ({ stores: [createKeyv(secretUrl), createKeyv(secretUrl)] }) })] })
  await assert.rejects(NestFactory.createApplicationContext(Async, { logger: false, abortOnError: false }), { code: 'ERR_INVALID_OPTION', message: /`stores`/ })
})
