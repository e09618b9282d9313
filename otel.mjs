// ESM entry of stampede-cache/otel: the same function as the CommonJS entry.
import cjs from './otel.js'

export const { instrument } = cjs
export default cjs
