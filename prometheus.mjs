// ESM entry of stampede-cache/prometheus: the same function as the CommonJS entry.
import cjs from './prometheus.js'

export const { register } = cjs
export default cjs
