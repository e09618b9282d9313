'use strict'
// The binding as the facade calls it: what runs once when the addon is loaded (the read lane's
// refusal on Bun and Deno, the maker of Redis answers), and the native calls that can fail,
// wrapped so they throw StampedeCacheErrors.
const native = require('../binding.js')
const { fromNative, rewrapped } = require('./errors.js')
const { encodeKey } = require('./keys.js')
const { openSocketLane } = require('./lane.js')

// The read lane drives its socket from libuv directly. Bun exports `uv_*` functions that abort
// and Deno's loop never polls them, so there the read lane takes a socket of the runtime's own
// (the socket lane, lib/lane.js).
if (typeof process.versions.bun === 'string' || typeof process.versions.deno === 'string' || typeof globalThis.Deno !== 'undefined') {
  native.refuseReadLane()
}
native.setLaneOpener(openSocketLane.bind(null, native))

const { HIT_STATES, LOCK_NONE } = native

// `lookup` is on every read that misses in process: called without the rest/spread of
// fromNative.
const nativeLookup = native.lookup
function lookup(id, k, policy, force) {
  try {
    return nativeLookup(id, k, policy, force)
  } catch (err) {
    throw rewrapped(err)
  }
}

const engine = {
  create: fromNative(native.createEngine),
  encodeKey,
  resolvePolicy: fromNative(native.resolvePolicy),
  lookup,
  setEntry: fromNative(native.setEntry),
  deleteEntry: fromNative(native.deleteEntry),
  getEntry: fromNative(native.getEntry),
  getEntries: fromNative(native.getEntries),
  inspectEntry: fromNative(native.inspectEntry),
}

// A Redis answer crosses as the arguments of this function, which the binding calls to make it
// (see `RedisAnswer` in src/node/answer.rs): an object literal made here is cheap, where one made
// by N-API calls is not. Its positional parameters are the one exception to the rule of six: they
// are the fields of the record it makes, and a record made to pass them would cost the N-API
// calls this saves. `state` is an index in HIT_STATES, or -1; `reported`: failures wait
// for onError (take them with #drainRedisReports).
// The last two are left out of an answer that has neither (most values found), and take their
// defaults here. What a gate answered for its flight's end (lock, fence, stamp) stays in the
// engine (src/node/flight.rs).
native.setAnswerMaker(function makeAnswer(
  kind,
  json,
  freshUntil,
  hardUntil,
  computeMs,
  negative,
  retryAfter,
  stamp,
  born,
  fmt,
  state,
  bytes,
  reported,
  lock = LOCK_NONE,
  tags = null,
) {
  return {
    kind,
    json,
    freshUntil,
    hardUntil,
    computeMs,
    negative,
    retryAfter,
    stamp,
    lock,
    born,
    tags,
    fmt,
    state: state >= 0 ? HIT_STATES[state] : null,
    bytes,
    reported,
  }
})
const deleteTags = fromNative(native.deleteTags)
const expireTags = fromNative(native.expireTags)
const expireEntry = fromNative(native.expireEntry)
const clearEntries = fromNative(native.clearEntries)

module.exports = { engine, deleteTags, expireTags, expireEntry, clearEntries }
