// ESM entry: the same classes as the CommonJS entry (one native addon, one class identity).
import cjs from './index.js'

export const { StampedeCache, StampedeCacheError, withWaitUntil } = cjs
export default cjs
