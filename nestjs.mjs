// ESM entry of stampede-cache/nestjs: the same objects as the CommonJS entry (one class identity).
import cjs from './nestjs.js'

export const { StampedeCacheModule, InjectStampedeCache, STAMPEDE_CACHE, STAMPEDE_CACHE_OPTIONS, StampedeCache } = cjs
export default cjs
