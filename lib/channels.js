'use strict'
const dc = require('node:diagnostics_channel')

// Observability (README, "Observability"): a TracingChannel around every loader call and a plain
// channel per event. Every publication sits behind `hasSubscribers`, so nothing is built or
// published while nobody listens; the fresh hit pays one such check.
const loadChannel = dc.tracingChannel('stampede-cache:load')
const hitChannel = dc.channel('stampede-cache:hit')
const missChannel = dc.channel('stampede-cache:miss')
const coalesceChannel = dc.channel('stampede-cache:coalesce')
const lockChannel = dc.channel('stampede-cache:lock')
const invalidateChannel = dc.channel('stampede-cache:invalidate')
const loadTimeoutChannel = dc.channel('stampede-cache:load-timeout')
const redisErrorChannel = dc.channel('stampede-cache:redis-error')
// TracingChannel#hasSubscribers arrived in Node 20.13; before it, ask its five channels.
const loadTraced =
  typeof loadChannel.hasSubscribers === 'boolean'
    ? () => loadChannel.hasSubscribers
    : () =>
        loadChannel.start.hasSubscribers ||
        loadChannel.end.hasSubscribers ||
        loadChannel.asyncStart.hasSubscribers ||
        loadChannel.asyncEnd.hasSubscribers ||
        loadChannel.error.hasSubscribers

module.exports = {
  loadChannel,
  hitChannel,
  missChannel,
  coalesceChannel,
  lockChannel,
  invalidateChannel,
  loadTimeoutChannel,
  redisErrorChannel,
  loadTraced,
}
