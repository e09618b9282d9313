'use strict'
// Tags (GetOrLoadOptions.tags, set's tags, deleteByTag): their limits and their validation.
const { invalidOption } = require('./errors.js')

// Tags per entry, and per deleteByTag call, at most.
const MAX_TAGS = 64
const MAX_TAG_BYTES = 1024

// Validates tags (an array of non-empty strings) and returns them without repeats; `fail(why)`
// makes the error.
function checkTags(tags, fail) {
  if (!Array.isArray(tags)) return fail('must be an array of strings')
  if (tags.length > MAX_TAGS) return fail(`must hold at most ${MAX_TAGS} tags, got ${tags.length}`)
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

module.exports = { checkTags, tagsOption }
