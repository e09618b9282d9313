// ESM entry of stampede-cache/next: the same functions as the CommonJS entry.
import cjs from './next.js'

export const { createUseCacheHandler, createIncrementalCacheHandler } = cjs
export default cjs
