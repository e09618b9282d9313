'use strict'
// node examples/nestjs/main.js, then: curl 127.0.0.1:3000/feed/42
// (REDIS_URL=redis://127.0.0.1:6379 shares the cache across instances.)
const { NestFactory } = require('@nestjs/core')
const { createAppModule } = require('./app.module.js')

async function bootstrap() {
  const app = await NestFactory.create(createAppModule({ cache: { redis: process.env.REDIS_URL, ttl: 30_000 } }))
  app.enableShutdownHooks() // SIGTERM/SIGINT run app.close(), which closes the cache
  await app.listen(Number(process.env.PORT ?? 3000), '127.0.0.1')
  console.log(`listening on ${await app.getUrl()}/feed/42`)
}

bootstrap()
