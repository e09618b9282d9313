'use strict'
// What names an entry, and what groups entries: a key (a string or an array of parts) as the
// engine takes it, and tags (GetOrLoadOptions.tags, set's tags, deleteByTag), their limits and
// their validation.
const native = require('../binding.js')
const { StampedeCacheError, fromNative, invalidOption } = require('./errors.js')

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

// A tag's length at most. Their number is not bounded: an entry, a set, a deleteByTag or an
// expireByTag may carry any number (each costs one Redis key, read or written together).
const MAX_TAG_BYTES = 1024

// Validates tags (an array of non-empty strings) and returns them without repeats; `fail(why)`
// makes the error.
function checkTags(tags, fail) {
  if (!Array.isArray(tags)) return fail('must be an array of strings')
  for (const tag of tags) {
    if (typeof tag !== 'string' || tag.length === 0) return fail('must hold non-empty strings')
    if (!tag.isWellFormed()) return fail('must not hold lone surrogates')
    if (Buffer.byteLength(tag) > MAX_TAG_BYTES) return fail(`must hold tags of at most ${MAX_TAG_BYTES} bytes`)
  }
  return tags.length < 2 ? tags : [...new Set(tags)]
}

function tagsOption(tags) {
  return checkTags(tags, (why) => {
    throw invalidOption('tags', why)
  })
}

module.exports = { encodeKey, checkTags, tagsOption }
