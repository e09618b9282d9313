'use strict'
// Request scope: withWaitUntil() sets the waitUntil hook of every cache used inside the function
// it runs (README, "waitUntil"), through an AsyncLocalStorage.
const { AsyncLocalStorage } = require('node:async_hooks')
const { invalidArgument } = require('./errors.js')

/** The request-scoped waitUntil set by withWaitUntil(), for every cache used in that scope. */
const requestScope = new AsyncLocalStorage()

function withWaitUntil(waitUntil, fn) {
  if (typeof waitUntil !== 'function') throw invalidArgument('withWaitUntil needs a waitUntil function')
  if (typeof fn !== 'function') throw invalidArgument('withWaitUntil needs a function to run')
  return requestScope.run(waitUntil, fn)
}

module.exports = { requestScope, withWaitUntil }
