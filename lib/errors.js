'use strict'
// The errors stampede-cache raises itself (README, "Errors"): one class with a stable `code`, the
// makers of each kind, and the rewrapping of the binding's errors; and a caller's AbortSignal,
// which rejects that caller alone with an AbortError.

const { types } = require('node:util')

/** An error raised by stampede-cache itself; `code` is stable (see README, "Errors"). */
class StampedeCacheError extends Error {
  constructor(code, message, options) {
    super(message, options)
    this.name = 'StampedeCacheError'
    this.code = code
  }
}

// Native calls that can fail throw plain errors whose `code` is one of ours; rewrap them so users
// can rely on `instanceof StampedeCacheError`. Loader errors never pass through here.
function fromNative(fn) {
  return function (...args) {
    try {
      return fn(...args)
    } catch (err) {
      throw rewrapped(err)
    }
  }
}

function rewrapped(err) {
  return err && typeof err.code === 'string' && err.code.startsWith('ERR_') ? new StampedeCacheError(err.code, err.message) : err
}

function invalidArgument(message) {
  return new StampedeCacheError('ERR_INVALID_ARGUMENT', message)
}

function invalidOption(name, why) {
  return new StampedeCacheError('ERR_INVALID_OPTION', `option \`${name}\` ${why}`)
}

// A call's options that are not an object; a number is cache-manager's ttl argument.
function notAnOptionsObject(method, options) {
  if (typeof options === 'number') {
    return invalidOption('options', `of ${method} must be an object, got the number ${options}: for a ttl of ${options} ms pass { ttl: ${options} }`)
  }
  return invalidOption('options', `of ${method} must be an object, got ${options === null ? 'null' : typeof options}`)
}

function closedError() {
  return new StampedeCacheError('ERR_CLOSED', 'the cache is closed')
}

// `cause`: the latest Redis failure's message (the binding's, passwords scrubbed), if known.
// `queued`: the change waits in this cache and is replayed, in order, once Redis answers again
// (err.queued === true); else it was not sent at all (the cache closed meanwhile).
function redisError(op, cause, queued = false) {
  const why = cause ? `: ${cause}` : ' (Redis is unavailable)'
  if (!queued) {
    return new StampedeCacheError(
      'ERR_REDIS',
      `Redis could not take the ${op}${why}. It is applied in this process only; other instances keep their copies until Redis answers again`,
    )
  }
  const err = new StampedeCacheError(
    'ERR_REDIS',
    `Redis could not take the ${op} now${why}. It is applied in this process and will be replayed to Redis, in order, once it answers again, so every instance gets it`,
  )
  err.queued = true
  return err
}

// Without onError, an outage's first failure and its end are told once each (README, "Errors"):
// a Redis that is down, mistyped or refusing the password is never silent.
const WARNING = { type: 'StampedeCacheWarning', code: 'STAMPEDE_CACHE_REDIS' }
function warnRedisOutage(report, namespace) {
  const where = `stampede-cache (namespace '${namespace}')`
  const text =
    report.outage === 'up'
      ? `${where}: Redis answers again; the outage is over`
      : `${where}: ${report.message}. The cache serves and loads in this process until Redis answers again (told once an outage; pass onError to handle every Redis error)`
  process.emitWarning(text, WARNING)
}

// An Error whatever realm made it: a vm context's or a test sandbox's Error fails `instanceof
// Error` here (its prototype chain is its realm's), and treating it as a value would cache it.
function isError(x) {
  return x instanceof Error || types.isNativeError(x)
}

function abortError(signal) {
  const reason = signal.reason
  if (isError(reason) && reason.name === 'AbortError') return reason
  const err = new Error('The operation was aborted', { cause: reason })
  err.name = 'AbortError'
  err.code = 'ABORT_ERR'
  return err
}

function notSerializable(message, cause) {
  return new StampedeCacheError('ERR_VALUE_NOT_SERIALIZABLE', message, cause === undefined ? undefined : { cause })
}

function isClosedError(err) {
  return err instanceof StampedeCacheError && err.code === 'ERR_CLOSED'
}

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

module.exports = {
  StampedeCacheError,
  fromNative,
  rewrapped,
  invalidArgument,
  invalidOption,
  notAnOptionsObject,
  closedError,
  redisError,
  warnRedisOutage,
  abortError,
  isAbortSignal,
  withSignal,
  notSerializable,
  isClosedError,
  isError,
}
