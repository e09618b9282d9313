// next.config `cacheHandler`: ISR pages, fetch and unstable_cache, shared through Redis.
import { createIncrementalCacheHandler } from 'stampede-cache/next'

export default createIncrementalCacheHandler({ redis: process.env.REDIS_URL, namespace: 'next-cache-example' })
