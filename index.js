'use strict'
// The package's CommonJS entry (index.mjs re-exports it). The facade lives in lib/: cache.js (the
// StampedeCache class), core.js (its state), flight.js and many.js (the flight drivers for one
// key and for a batch), errors.js (and AbortSignals), codec.js (serializers), channels.js
// (diagnostics channels), scope.js (withWaitUntil), keys.js (and tags), batch.js (getOrLoadMany's
// batch) and engine.js (the binding as the facade calls it).

const { StampedeCache } = require('./lib/cache.js')
const { StampedeCacheError } = require('./lib/errors.js')
const { withWaitUntil } = require('./lib/scope.js')

module.exports = { StampedeCache, StampedeCacheError, withWaitUntil }
