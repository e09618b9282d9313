'use strict'
// A small Nest app in plain JavaScript: a controller, a service that reads through the cache, and
// a simulated database. The decorators are applied by hand (no TypeScript build step); in
// TypeScript you would write @Injectable(), @Controller('feed'), @Get(':userId') and so on.
require('reflect-metadata')
const { Controller, Get, Inject, Injectable, Module, Param } = require('@nestjs/common')
const { StampedeCache, StampedeCacheModule } = require('stampede-cache/nestjs')
const { FeedDb } = require('./feed-db.js')

// @Injectable()
class FeedService {
  // constructor(private readonly cache: StampedeCache, private readonly db: FeedDb)
  constructor(cache, db) {
    this.cache = cache
    this.db = db
  }

  /** One query per user feed per ttl, however many requests arrive at once. */
  getFeed(userId) {
    return this.cache.getOrLoad(['feed', userId], () => this.db.loadFeed(userId))
  }
}
Injectable()(FeedService)
Inject(StampedeCache)(FeedService, undefined, 0)
Inject(FeedDb)(FeedService, undefined, 1)

// @Controller('feed')
class FeedController {
  constructor(feeds) {
    this.feeds = feeds
  }

  // @Get(':userId') feed(@Param('userId') userId: string)
  feed(userId) {
    return this.feeds.getFeed(userId)
  }
}
Controller('feed')(FeedController)
Inject(FeedService)(FeedController, undefined, 0)
Get(':userId')(FeedController.prototype, 'feed', Object.getOwnPropertyDescriptor(FeedController.prototype, 'feed'))
Param('userId')(FeedController.prototype, 'feed', 0)

/** The root module; `cache` are the StampedeCache options, `db` the database to read. */
function createAppModule({ cache = { ttl: 30_000 }, db = new FeedDb() } = {}) {
  class AppModule {}
  Module({
    imports: [StampedeCacheModule.forRoot({ ...cache, isGlobal: true })],
    controllers: [FeedController],
    providers: [FeedService, { provide: FeedDb, useValue: db }],
  })(AppModule)
  return AppModule
}

module.exports = { createAppModule, FeedService, FeedController, FeedDb }
