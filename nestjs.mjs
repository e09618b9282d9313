// ESM entry of stampede-cache/nestjs: the same objects as the CommonJS entry (one class identity).
import cjs from './nestjs.js'

export const {
  StampedeCacheModule,
  InjectStampedeCache,
  STAMPEDE_CACHE,
  STAMPEDE_CACHE_OPTIONS,
  StampedeCache,
  CacheModule,
  CACHE_MANAGER,
  CACHE_KEY_METADATA,
  CACHE_TTL_METADATA,
  CACHE_MODULE_OPTIONS,
  Cache,
  CacheInterceptor,
  CacheKey,
  CacheTTL,
} = cjs
export default cjs
