'use strict'
// AbortSignals: a caller's own signal rejects its own promise only.
const { abortError } = require('./errors.js')

function isAbortSignal(s) {
  return typeof s === 'object' && s !== null && typeof s.aborted === 'boolean' && typeof s.addEventListener === 'function'
}

// Rejects this caller when its signal aborts; the shared promise goes on for the others.
function withSignal(promise, signal) {
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortError(signal))
    signal.addEventListener('abort', onAbort, { once: true })
    promise.then(
      (v) => {
        signal.removeEventListener('abort', onAbort)
        resolve(v)
      },
      (e) => {
        signal.removeEventListener('abort', onAbort)
        reject(e)
      },
    )
  })
}

module.exports = { isAbortSignal, withSignal }
