'use strict'
// Key encoding: what a key (a string or an array of parts) is in the engine.
const native = require('../binding.js')
const { StampedeCacheError, fromNative } = require('./errors.js')

const nativeEncodeKey = fromNative(native.encodeKey)
const SHORT_KEY_UNITS = Math.floor(native.MAX_KEY_BYTES / 3)

// A string with a lone surrogate has no UTF-8 form: converting it would alias another key
// ('a\uD800' and 'a\uFFFD'), so such keys are refused.
function encodeKey(key) {
  if (typeof key === 'string') {
    if (!key.isWellFormed()) throw new StampedeCacheError('ERR_INVALID_KEY', 'a key must not contain lone surrogates')
    // A well-formed string key is its own form; one of at most MAX_KEY_BYTES / 3 UTF-16 units
    // is within MAX_KEY_BYTES of UTF-8 (3 bytes a unit at most), so only its emptiness is left
    // to check. Longer ones are measured by the binding.
    if (key.length > 0 && key.length <= SHORT_KEY_UNITS) return key
  } else if (Array.isArray(key)) {
    for (const part of key) {
      if (typeof part === 'string' && !part.isWellFormed()) {
        throw new StampedeCacheError('ERR_INVALID_KEY', 'a key part must not contain lone surrogates')
      }
    }
  }
  return nativeEncodeKey(key)
}

module.exports = { encodeKey }
