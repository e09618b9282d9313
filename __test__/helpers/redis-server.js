'use strict'
// Helpers for the Redis behaviour tests (__test__/redis.test.js):
//
// - RedisServer: a private `redis-server` on a free 127.0.0.1 port (never 6379, never another
//   address), without persistence, that a test can stop (SIGTERM or SIGKILL), restart on the
//   same port, pause (SIGSTOP) and resume (SIGCONT).
// - command / pipeline: a tiny raw RESP client to inspect keys and `INFO stats` (no npm client).
// - CacheWorker: a forked __test__/fixtures/redis-worker.js process with its own StampedeCache,
//   driven over IPC; `barrier` releases several workers at once.
//
// Every child process started here is killed when the test process exits, pass or fail.

const { spawn, fork } = require('node:child_process')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')
const { envelopeJson } = require('./envelope')

const WORKER_SCRIPT = path.join(__dirname, '..', 'fixtures', 'redis-worker.js')
/** The server binary the tests start: REDIS_SERVER=valkey-server runs them against Valkey. */
const SERVER_BIN = process.env.REDIS_SERVER || 'redis-server'
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// ---- cleanup: nothing started here outlives the test process -------------------------------

const live = new Set()

function killAllSync() {
  for (const child of live) {
    try {
      child.kill('SIGKILL') // also ends a SIGSTOPped process
    } catch {
      // already gone
    }
  }
  live.clear()
}

process.on('exit', killAllSync)
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => {
    killAllSync()
    process.exit(128 + (os.constants.signals[sig] ?? 1))
  })
}

function track(child) {
  live.add(child)
  child.once('exit', () => live.delete(child))
  return child
}

// ---- ports ---------------------------------------------------------------------------------

/** A port that was free on 127.0.0.1 a moment ago (listen on 0, read it, close). Never 6379. */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.unref()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => (port === 6379 ? freePort().then(resolve, reject) : resolve(port)))
    })
  })
}

// ---- a tiny RESP2 client -------------------------------------------------------------------

class RespError extends Error {
  constructor(message) {
    super(message)
    this.name = 'RespError'
  }
}

function encodeCommand(args) {
  const parts = [Buffer.from(`*${args.length}\r\n`)]
  for (const a of args) {
    const b = Buffer.isBuffer(a) ? a : Buffer.from(String(a))
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'))
  }
  return Buffer.concat(parts)
}

/** One reply at `i`: `{ value, next }`, or null while incomplete. Error replies become RespError values. */
function parseReply(buf, i) {
  if (i >= buf.length) return null
  const eol = buf.indexOf('\r\n', i)
  if (eol < 0) return null
  const type = String.fromCharCode(buf[i])
  const line = buf.toString('utf8', i + 1, eol)
  switch (type) {
    case '+':
      return { value: line, next: eol + 2 }
    case '-':
      return { value: new RespError(line), next: eol + 2 }
    case ':':
      return { value: Number(line), next: eol + 2 }
    case '$': {
      const len = Number(line)
      if (len < 0) return { value: null, next: eol + 2 }
      const end = eol + 2 + len
      if (buf.length < end + 2) return null
      // A binary envelope reads as the JSON layout (helpers/envelope.js), so tests can look in it.
      return { value: envelopeJson(buf.subarray(eol + 2, end)), next: end + 2 }
    }
    case '*': {
      const n = Number(line)
      if (n < 0) return { value: null, next: eol + 2 }
      const items = []
      let j = eol + 2
      for (let k = 0; k < n; k++) {
        const r = parseReply(buf, j)
        if (r === null) return null
        items.push(r.value)
        j = r.next
      }
      return { value: items, next: j }
    }
    default:
      throw new Error(`unexpected RESP reply type ${JSON.stringify(type)}`)
  }
}

/**
 * Sends `commands` (arrays of strings/Buffers) on one fresh connection to 127.0.0.1:`port` and
 * resolves with their replies in order (error replies as RespError values, not thrown).
 * Rejects on connection errors or when no full answer came within `timeout` ms.
 */
function pipeline(port, commands, { timeout = 2_000 } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port })
    let buf = Buffer.alloc(0)
    let done = false
    const finish = (err, value) => {
      if (done) return
      done = true
      clearTimeout(timer)
      socket.destroy()
      if (err) reject(err)
      else resolve(value)
    }
    const timer = setTimeout(() => finish(new Error(`redis ${commands.map((c) => c[0]).join(',')} timed out after ${timeout} ms`)), timeout)
    socket.once('error', (err) => finish(err))
    socket.once('close', () => finish(new Error('redis connection closed before the reply')))
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk])
      const replies = []
      let i = 0
      for (let k = 0; k < commands.length; k++) {
        const r = parseReply(buf, i)
        if (r === null) return // wait for more
        replies.push(r.value)
        i = r.next
      }
      finish(null, replies)
    })
    socket.write(Buffer.concat(commands.map(encodeCommand)))
  })
}

/** One command; an error reply rejects. */
async function command(port, args, options) {
  const [reply] = await pipeline(port, [args], options)
  if (reply instanceof RespError) throw reply
  return reply
}

// ---- the server ----------------------------------------------------------------------------

class RedisServer {
  constructor() {
    this.port = null
    this.proc = null
    this.dir = null
    this.paused = false
    this.log = ''
  }

  get url() {
    return `redis://127.0.0.1:${this.port}`
  }

  /** Starts redis-server (on a new free port the first time, on the same port afterwards) and waits for PING. */
  async start() {
    if (this.proc) throw new Error('redis-server already running')
    const firstStart = this.port === null
    for (let attempt = 0; ; attempt++) {
      if (this.port === null) this.port = await freePort()
      if (this.port === 6379) throw new Error('refusing to use port 6379')
      try {
        await this.#spawnAndWait()
        return this
      } catch (err) {
        // Someone took the port between freePort() and the listen: try another (first start only).
        if (!firstStart || attempt >= 3) throw err
        this.port = null
      }
    }
  }

  async #spawnAndWait() {
    this.dir ??= fs.mkdtempSync(path.join(os.tmpdir(), 'sc-redis-test-'))
    const args = [
      '--port',
      String(this.port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      this.dir,
      '--daemonize',
      'no',
      '--loglevel',
      'warning',
    ]
    const proc = track(spawn(SERVER_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] }))
    this.proc = proc
    this.paused = false
    const keep = (chunk) => {
      this.log = (this.log + chunk.toString()).slice(-8_000)
    }
    proc.stdout.on('data', keep)
    proc.stderr.on('data', keep)
    let exited = false
    proc.once('exit', () => {
      exited = true
      if (this.proc === proc) this.proc = null
    })
    const deadline = Date.now() + 10_000
    while (Date.now() < deadline) {
      if (exited) throw new Error(`redis-server exited at start:\n${this.log}`)
      try {
        if ((await command(this.port, ['PING'], { timeout: 500 })) === 'PONG') return
      } catch {
        // not listening yet
      }
      await sleep(25)
    }
    proc.kill('SIGKILL')
    throw new Error(`redis-server did not answer PING within 10 s:\n${this.log}`)
  }

  /** Stops the server (SIGTERM: a clean shutdown; SIGKILL: a crash) and waits for it to exit. */
  async stop(signal = 'SIGTERM') {
    const proc = this.proc
    if (!proc) return
    if (proc.exitCode !== null || proc.signalCode !== null) {
      this.proc = null
      return
    }
    const exited = new Promise((resolve) => proc.once('exit', resolve))
    if (this.paused && signal !== 'SIGKILL') proc.kill('SIGCONT')
    proc.kill(signal)
    const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000)
    await exited
    clearTimeout(timer)
    this.proc = null
    this.paused = false
  }

  /** Stops and starts again on the same port (an empty server: no persistence). */
  async restart(signal = 'SIGTERM') {
    await this.stop(signal)
    await this.start()
  }

  pause() {
    if (!this.proc) throw new Error('redis-server is not running')
    this.proc.kill('SIGSTOP')
    this.paused = true
  }

  resume() {
    if (this.proc && this.paused) this.proc.kill('SIGCONT')
    this.paused = false
  }

  /** Cleanup for t.after(): never leaves a paused or running server behind. */
  async dispose() {
    this.resume()
    await this.stop('SIGKILL')
    if (this.dir) fs.rmSync(this.dir, { recursive: true, force: true })
    this.dir = null
  }

  /** One command (error replies reject). */
  cmd(...args) {
    return command(this.port, args)
  }

  /** Several commands on one connection, back to back. */
  pipeline(commands, options) {
    return pipeline(this.port, commands, options)
  }

  /** `INFO <section>` as an object of strings. */
  async info(section = 'stats') {
    const text = await this.cmd('INFO', section)
    const out = {}
    for (const line of text.split('\r\n')) {
      const i = line.indexOf(':')
      if (i > 0 && !line.startsWith('#')) out[line.slice(0, i)] = line.slice(i + 1)
    }
    return out
  }

  async commandsProcessed() {
    return Number((await this.info('stats')).total_commands_processed)
  }
}

// ---- worker processes ----------------------------------------------------------------------

/**
 * A forked fixtures/redis-worker.js: its own StampedeCache built from `options`, commands over IPC.
 * `request(cmd, args)` resolves with the worker's result or rejects with its error.
 * `start(cmd, args)` returns `{ ready, result }`: `ready` resolves when the worker reports ready
 * (a barrier command is then waiting for `go`; a watch has polled once).
 */
class CacheWorker {
  #pending = new Map()
  #nextId = 1

  /**
   * `script`: another worker script speaking the same IPC protocol (default
   * fixtures/redis-worker.js); `build`: the directory of another build of the library for it to
   * require (a previous release, see helpers/previous-build.js).
   */
  constructor(name, options, { script = WORKER_SCRIPT, build } = {}) {
    this.name = name
    this.options = options
    this.child = track(
      fork(script, [JSON.stringify(options)], {
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
        serialization: 'json',
        env: build ? { ...process.env, STAMPEDE_CACHE_BUILD: build } : process.env,
      }),
    )
    this.pid = this.child.pid
    this.exitInfo = null
    this.exited = new Promise((resolve) => {
      this.child.once('exit', (code, signal) => {
        this.exitInfo = { code, signal }
        for (const p of this.#pending.values()) p.reject(new Error(`worker ${name} exited (${signal ?? code}) during ${p.cmd}`))
        this.#pending.clear()
        resolve(this.exitInfo)
      })
    })
    this.hello = new Promise((resolve, reject) => {
      this.child.once('error', reject)
      this.exited.then((info) => reject(new Error(`worker ${name} exited before ready: ${JSON.stringify(info)}`)))
      const onHello = (msg) => {
        if (msg && msg.type === 'hello') {
          this.child.off('message', onHello)
          resolve(msg)
        }
      }
      this.child.on('message', onHello)
    })
    this.child.on('message', (msg) => this.#onMessage(msg))
  }

  static async spawn(name, options, spawnOptions) {
    const w = new CacheWorker(name, options, spawnOptions)
    await w.hello
    return w
  }

  #onMessage(msg) {
    if (!msg || msg.id === undefined) return
    const p = this.#pending.get(msg.id)
    if (!p) return
    if (msg.type === 'ready') {
      p.onReady()
      return
    }
    this.#pending.delete(msg.id)
    if (msg.ok) p.resolve(msg.result)
    else p.reject(Object.assign(new Error(`worker ${this.name} ${p.cmd}: ${msg.error.message}`), { workerError: msg.error }))
  }

  /** `timeout` (ms, default 30 s): the result rejects if the worker has not answered by then (a hang fails, not blocks). */
  start(cmd, args = {}, { timeout = 30_000 } = {}) {
    const id = this.#nextId++
    let onReady
    const ready = new Promise((resolve) => {
      onReady = resolve
    })
    const result = new Promise((resolve, reject) => {
      if (this.exitInfo) {
        reject(new Error(`worker ${this.name} already exited`))
        return
      }
      const timer = setTimeout(() => {
        this.#pending.delete(id)
        reject(new Error(`worker ${this.name}: ${cmd} did not answer within ${timeout} ms`))
      }, timeout)
      const done = (fn) => (v) => {
        clearTimeout(timer)
        fn(v)
      }
      this.#pending.set(id, { resolve: done(resolve), reject: done(reject), onReady, cmd })
      this.child.send({ ...args, id, cmd })
    })
    // Callers that never await `result` (a worker killed on purpose) must not leave unhandled rejections.
    result.catch(() => {})
    return { id, ready, result }
  }

  request(cmd, args, options) {
    return this.start(cmd, args, options).result
  }

  /** Releases a barrier command started with `{ barrier: true }`. */
  go(id) {
    this.child.send({ type: 'go', id })
  }

  kill(signal = 'SIGKILL') {
    if (this.exitInfo) return this.exited
    this.child.kill(signal)
    return this.exited
  }
}

/**
 * Starts `cmd` with a barrier on every worker, waits until all are ready, then releases them
 * together; resolves with every worker's result (in order).
 */
async function barrier(workers, cmd, argsFor) {
  const runs = workers.map((w, i) => w.start(cmd, { ...(typeof argsFor === 'function' ? argsFor(w, i) : argsFor), barrier: true }))
  await Promise.race([Promise.all(runs.map((r) => r.ready)), Promise.all(runs.map((r) => r.result))])
  runs.forEach((r, i) => workers[i].go(r.id))
  return Promise.all(runs.map((r) => r.result))
}

/** Polls `fn` every `interval` ms until it returns truthy; returns that value or throws after `timeout`. */
async function waitFor(fn, { timeout = 10_000, interval = 20, what = 'condition' } = {}) {
  const deadline = Date.now() + timeout
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`)
    await sleep(interval)
  }
}

// ---- a test's own server and workers ------------------------------------------------------

let nsCounter = 0

/** A namespace no other test (or test process) uses. */
function newNamespace(prefix = 'sctest') {
  return `${prefix}${process.pid}n${++nsCounter}${Math.random().toString(36).slice(2, 6)}`
}

/**
 * A private redis-server plus `workers` worker processes built from `options`, all torn down
 * after the test. Returns the server, the workers, `spawnWorker(name, extraOptions)` for more,
 * the namespace, the workers' options (`base`), its key names (`vkey`, `lkey`) and `stored(k)`:
 * the value key as the raw client
 * sees it, `{ exists, value }`.
 */
async function setupRedis(t, { workers = 0, options = {}, prefix } = {}) {
  const redis = new RedisServer()
  t.after(() => redis.dispose())
  await redis.start()
  const namespace = newNamespace(prefix)
  const base = { redis: redis.url, namespace, jitter: 0, ...options }
  const spawned = []
  t.after(() => Promise.all(spawned.map((w) => w.kill('SIGKILL'))))
  const spawnWorker = async (name, extra = {}, workerOptions = {}) => {
    const w = new CacheWorker(name, { ...base, ...extra }, workerOptions)
    spawned.push(w)
    await w.hello
    return w
  }
  const ws = await Promise.all(Array.from({ length: workers }, (_, i) => spawnWorker(`w${i}`)))
  const vkey = (k) => `${namespace}:v:{${k}}`
  const lkey = (k) => `${namespace}:lock:{${k}}`
  const stored = async (k) => {
    const raw = await redis.cmd('GET', vkey(k))
    if (raw === null) return { exists: false }
    const envelope = JSON.parse(raw)
    // A marker (a load's fence while the key has no value, see envelope.lua) is no entry.
    return envelope.marker ? { exists: false } : { exists: true, value: envelope.value }
  }
  return { redis, ws, namespace, base, spawnWorker, vkey, lkey, stored }
}

module.exports = {
  SERVER_BIN,
  setupRedis,
  newNamespace,
  RedisServer,
  RespError,
  CacheWorker,
  barrier,
  freePort,
  command,
  pipeline,
  waitFor,
  sleep,
  killAllSync,
  encodeCommand,
  parseReply,
}
