// next.config `cacheHandlers.default`: every "use cache" entry, shared through Redis.
import { createUseCacheHandler } from 'stampede-cache/next'

export default createUseCacheHandler({ redis: process.env.REDIS_URL, namespace: 'next-cache-example' })
