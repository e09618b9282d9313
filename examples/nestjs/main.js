'use strict'
// node examples/nestjs/main.js, then: curl 127.0.0.1:3000/feed/42
// EXAMPLE=cache-manager node examples/nestjs/main.js: the app written the @nestjs/cache-manager way
// (also: curl 127.0.0.1:3000/feed/42/summary).
// (REDIS_URL=redis://127.0.0.1:6379 shares the cache across instances.)
const { NestFactory } = require('@nestjs/core')
const { createAppModule } = require('./app.module.js')
const { createCacheManagerAppModule } = require('./cache-manager.module.js')

async function bootstrap() {
  const cache = { redis: process.env.REDIS_URL, ttl: 30_000 }
  const AppModule = process.env.EXAMPLE === 'cache-manager' ? createCacheManagerAppModule({ cache }) : createAppModule({ cache })
  const app = await NestFactory.create(AppModule)
  app.enableShutdownHooks() // SIGTERM/SIGINT run app.close(), which closes the cache
  await app.listen(Number(process.env.PORT ?? 3000), '127.0.0.1')
  console.log(`listening on ${await app.getUrl()}/feed/42`)
}

bootstrap()
