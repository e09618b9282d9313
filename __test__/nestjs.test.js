'use strict'
// stampede-cache/nestjs in a real Nest application (@nestjs/core + platform-express), over HTTP on
// loopback, and the module's registration forms on their own.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
require('reflect-metadata')
const { NestFactory } = require('@nestjs/core')
const { Inject, Injectable, Module } = require('@nestjs/common')
const { StampedeCache } = require('..')
const nest = require('stampede-cache/nestjs')
const { StampedeCacheModule, InjectStampedeCache, STAMPEDE_CACHE, STAMPEDE_CACHE_OPTIONS } = nest
const { createAppModule, FeedDb } = require('../examples/nestjs/app.module.js')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function until(what, predicate) {
  for (let i = 0; ; i++) {
    if (await predicate()) return
    if (i > 3000) throw new Error(`timed out waiting for ${what}`)
    await sleep(5)
  }
}

function get(port, urlPath) {
  return new Promise((resolve, reject) => {
    const agent = new http.Agent({ keepAlive: false })
    http
      .get({ host: '127.0.0.1', port, path: urlPath, agent }, (res) => {
        let body = ''
        res.on('data', (d) => (body += d))
        res.on('end', () => resolve({ status: res.statusCode, body }))
      })
      .on('error', reject)
  })
}

test('example Nest app: one load for 200 cold requests, stale answered at once with one refresh, closed on app.close()', async (t) => {
  const db = new FeedDb()
  // beta 0: no early refresh, so the only refresh is the one the stale reads start.
  const AppModule = createAppModule({ cache: { ttl: 300, hardTtl: 60_000, jitter: 0, beta: 0 }, db })
  const app = await NestFactory.create(AppModule, { logger: false })
  t.after(() => app.close())
  await app.listen(0, '127.0.0.1')
  const { port } = app.getHttpServer().address()
  const cache = app.get(StampedeCache)
  assert.ok(cache instanceof StampedeCache)
  assert.equal(app.get(STAMPEDE_CACHE), cache, 'the string token is the same instance')

  // Cold: hold the query until all 200 requests are waiting on it.
  let release = db.hold()
  const cold = Promise.all(Array.from({ length: 200 }, () => get(port, '/feed/42')))
  await until('200 waiting readers', () => cache.stats().misses === 200)
  release()
  const first = await cold
  assert.ok(first.every((r) => r.status === 200))
  assert.equal(new Set(first.map((r) => r.body)).size, 1, 'every request got the same feed')
  assert.deepEqual(JSON.parse(first[0].body), { userId: '42', items: ['post-42-1', 'post-42-2'], version: 1 })
  assert.equal(db.queries, 1, 'the loader ran once')
  assert.equal(cache.stats().loads, 1)
  assert.equal(cache.stats().coalesced, 199)

  // Stale: every request is answered while the refresh's query is still held shut.
  await until('the entry to go stale', async () => (await cache.inspect(['feed', '42']))?.state === 'stale')
  release = db.hold()
  const stale = await Promise.all(Array.from({ length: 200 }, () => get(port, '/feed/42')))
  assert.ok(
    stale.every((r) => r.status === 200 && JSON.parse(r.body).version === 1),
    'stale value served',
  )
  assert.equal(db.queries, 2, 'exactly one refresh started')
  assert.equal(db.finished, 1, 'the responses came while the refresh was still blocked')
  assert.equal(cache.stats().staleHits, 200)
  release()
  await cache.settle()
  assert.equal(db.queries, 2)
  assert.equal(cache.stats().refreshes, 1)
  assert.equal(JSON.parse((await get(port, '/feed/42')).body).version, 2, 'the refreshed value is served')

  // app.close() closes the cache (after the HTTP server has stopped).
  await app.close()
  await assert.rejects(
    cache.getOrLoad('k', () => 1),
    { code: 'ERR_CLOSED' },
  )
  await assert.rejects(get(port, '/feed/42'), { code: 'ECONNREFUSED' })
})

// Manual decorators, as in the example: @Injectable() class ... { constructor(@Inject(token) x) }.
function injectable(cls, ...tokens) {
  Injectable()(cls)
  tokens.forEach((token, i) => Inject(token)(cls, undefined, i))
  return cls
}
function moduleOf(metadata) {
  class M {}
  Object.defineProperty(M, 'name', { value: `M${Math.random().toString(36).slice(2)}` })
  Module(metadata)(M)
  return M
}

test('forRootAsync: options from an injected provider of an imported module; every token is one instance', async () => {
  const CONFIG = 'CONFIG'
  const ConfigModule = moduleOf({ providers: [{ provide: CONFIG, useValue: { cacheTtl: 1234 } }], exports: [CONFIG] })
  const factoryArgs = []
  const Users = injectable(
    class Users {
      constructor(cache, byString, byDecorator) {
        Object.assign(this, { cache, byString, byDecorator })
      }
    },
    StampedeCache,
    STAMPEDE_CACHE,
    StampedeCache,
  )
  // @InjectStampedeCache() as a parameter decorator, replacing index 2's token.
  InjectStampedeCache()(Users, undefined, 2)
  const AppModule = moduleOf({
    imports: [
      StampedeCacheModule.forRootAsync({
        imports: [ConfigModule],
        inject: [CONFIG],
        useFactory: async (config) => {
          factoryArgs.push(config)
          await sleep(1)
          return { ttl: config.cacheTtl, jitter: 0 }
        },
      }),
    ],
    providers: [Users],
  })
  const app = await NestFactory.createApplicationContext(AppModule, { logger: false })
  const users = app.get(Users)
  assert.deepEqual(factoryArgs, [{ cacheTtl: 1234 }])
  assert.ok(users.cache instanceof StampedeCache)
  assert.equal(users.byString, users.cache)
  assert.equal(users.byDecorator, users.cache)
  assert.deepEqual(app.get(STAMPEDE_CACHE_OPTIONS), { ttl: 1234, jitter: 0 })
  await users.cache.set('k', 'v')
  const info = await users.cache.inspect('k')
  assert.equal(info.hardUntil - info.freshUntil, 9 * 1234, 'ttl 1234 from the factory (hardTtl 10 x ttl)')
  await app.close()
  await assert.rejects(users.cache.get('k'), { code: 'ERR_CLOSED' })
})

test('isGlobal makes the cache injectable in modules that do not import it; without it they cannot', async () => {
  const Feature = () => {
    const Reader = injectable(
      class Reader {
        constructor(cache) {
          this.cache = cache
        }
      },
      StampedeCache,
    )
    return { Reader, FeatureModule: moduleOf({ providers: [Reader], exports: [Reader] }) }
  }

  for (const flag of ['isGlobal', 'global']) {
    const { Reader, FeatureModule } = Feature()
    const AppModule = moduleOf({ imports: [StampedeCacheModule.forRoot({ ttl: 1000, [flag]: true }), FeatureModule] })
    const app = await NestFactory.createApplicationContext(AppModule, { logger: false })
    assert.ok(app.get(Reader).cache instanceof StampedeCache, flag)
    await app.close()
  }

  const { FeatureModule } = Feature()
  const AppModule = moduleOf({ imports: [StampedeCacheModule.forRoot({ ttl: 1000 }), FeatureModule] })
  await assert.rejects(NestFactory.createApplicationContext(AppModule, { logger: false, abortOnError: false }), /can't resolve dependencies/)
})

test('a bad option fails the bootstrap with ERR_INVALID_OPTION naming it; bad forRootAsync arguments throw at once', async () => {
  const AppModule = moduleOf({ imports: [StampedeCacheModule.forRoot({ ttl: -1 })] })
  await assert.rejects(NestFactory.createApplicationContext(AppModule, { logger: false, abortOnError: false }), {
    code: 'ERR_INVALID_OPTION',
    message: /ttl/,
  })
  const Async = moduleOf({ imports: [StampedeCacheModule.forRootAsync({ useFactory: () => ({ tll: 5 }) })] })
  await assert.rejects(NestFactory.createApplicationContext(Async, { logger: false, abortOnError: false }), {
    code: 'ERR_INVALID_OPTION',
    message: /tll/,
  })
  assert.throws(() => StampedeCacheModule.forRootAsync({}), { code: 'ERR_INVALID_OPTION', message: /useFactory/ })
  assert.throws(() => StampedeCacheModule.forRootAsync({ useFactory: () => ({}), useClass: class {} }), {
    code: 'ERR_INVALID_OPTION',
    message: /useClass/,
  })
  assert.throws(() => StampedeCacheModule.forRoot('ttl'), { code: 'ERR_INVALID_OPTION' })
})

test('neither entry loads Nest until asked; the ESM entry shares the CommonJS classes', () => {
  const root = path.join(__dirname, '..')
  const script = `
    require('stampede-cache'); require('stampede-cache/nestjs')
    const loaded = Object.keys(require.cache).filter((f) => f.includes('@nestjs'))
    import('stampede-cache/nestjs').then((esm) => {
      const cjs = require('stampede-cache/nestjs')
      console.log(JSON.stringify({ loaded, same: esm.StampedeCacheModule === cjs.StampedeCacheModule
        && esm.StampedeCache === require('stampede-cache').StampedeCache && esm.STAMPEDE_CACHE === 'STAMPEDE_CACHE' }))
    })`
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { cwd: root, encoding: 'utf8' }))
  assert.deepEqual(out, { loaded: [], same: true })
})
