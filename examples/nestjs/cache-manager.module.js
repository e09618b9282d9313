'use strict'
// The same feed app written the @nestjs/cache-manager way (CacheModule.register, a global
// CacheInterceptor, CACHE_MANAGER in a service), over stampede-cache/nestjs. An app written for
// @nestjs/cache-manager moves by changing one import, the `require` below; it then runs each
// cold handler once for all concurrent requests, and across instances with `redis`.
// Plain JavaScript with the decorators applied by hand, as in app.module.js.
require('reflect-metadata')
const { Controller, Get, Inject, Injectable, Module, Param } = require('@nestjs/common')
const { APP_INTERCEPTOR } = require('@nestjs/core')
// was: require('@nestjs/cache-manager')
const { CacheModule, CacheInterceptor, CacheTTL, CACHE_MANAGER } = require('stampede-cache/nestjs')
const { FeedDb } = require('./feed-db.js')

// @Injectable()
class FeedSummaryService {
  // constructor(@Inject(CACHE_MANAGER) private cacheManager: Cache, private db: FeedDb)
  constructor(cacheManager, db) {
    this.cacheManager = cacheManager
    this.db = db
  }

  /** cache-manager's wrap: one query per user for every concurrent caller, cached 10 s. */
  summary(userId) {
    return this.cacheManager.wrap(
      `summary:${userId}`,
      async () => {
        const feed = await this.db.loadFeed(userId)
        return { userId, count: feed.items.length }
      },
      10_000,
    )
  }
}
Injectable()(FeedSummaryService)
Inject(CACHE_MANAGER)(FeedSummaryService, undefined, 0)
Inject(FeedDb)(FeedSummaryService, undefined, 1)

// @Controller('feed')
class FeedController {
  constructor(db, summaries) {
    this.db = db
    this.summaries = summaries
  }

  // @Get(':userId/summary')
  summary(userId) {
    return this.summaries.summary(userId)
  }

  // @Get(':userId') @CacheTTL(30_000): cached by the global CacheInterceptor under the URL.
  feed(userId) {
    return this.db.loadFeed(userId)
  }
}
Controller('feed')(FeedController)
Inject(FeedDb)(FeedController, undefined, 0)
Inject(FeedSummaryService)(FeedController, undefined, 1)
for (const [name, route] of [
  ['summary', ':userId/summary'],
  ['feed', ':userId'],
]) {
  Get(route)(FeedController.prototype, name, Object.getOwnPropertyDescriptor(FeedController.prototype, name))
  Param('userId')(FeedController.prototype, name, 0)
}
CacheTTL(30_000)(FeedController.prototype, 'feed', Object.getOwnPropertyDescriptor(FeedController.prototype, 'feed'))

/**
 * The root module. `cache`: CacheModule's options (cache-manager's `ttl` and `refreshThreshold`,
 * and StampedeCache's, `redis` among them); `db`: the database to read.
 */
function createCacheManagerAppModule({ cache = { ttl: 30_000 }, db = new FeedDb() } = {}) {
  class AppModule {}
  Module({
    imports: [CacheModule.register({ ...cache, isGlobal: true })],
    controllers: [FeedController],
    providers: [FeedSummaryService, { provide: FeedDb, useValue: db }, { provide: APP_INTERCEPTOR, useClass: CacheInterceptor }],
  })(AppModule)
  return AppModule
}

module.exports = { createCacheManagerAppModule, FeedSummaryService, FeedController, FeedDb }
