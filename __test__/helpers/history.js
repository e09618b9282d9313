'use strict'
// The randomized history test (Jepsen-style, small), shared by __test__/history.test.js (a few
// seeds in `npm test`) and scripts/soak.js (many seeds for minutes). The same history also runs
// against a Redis Cluster (`cluster` option, see "Redis Cluster" below).
//
// One run: a private redis-server, N worker processes (fixtures/history-worker.js) each with its own
// StampedeCache on it, and a versioned "database" owned by this process (key -> version, served
// over IPC). Workers run seeded client loops: readers getOrLoad (plain, forceRefresh, with an
// aborting signal, with a loader slower than loadTimeout) and get, with a loader that reads the
// database FIRST and returns that snapshot up to 300 ms later; writers take the key's write slot
// here (we serialize writers of one key, as an application's row lock would: two uncoordinated
// cache-aside writers race by nature and that is not the cache's bug), bump the version, then
// delete or set the cache, retrying ERR_REDIS until the call resolves. Meanwhile a seeded fault
// injector kills normal and pub/sub connections (CLIENT KILL), pauses Redis (SIGSTOP/SIGCONT)
// and restarts it empty (SIGTERM or SIGKILL).
//
// In cluster mode the workers share a 3-master, 3-replica Redis Cluster instead (started by the
// caller, reused across runs), the keys are picked so that every master owns some of them
// (CLUSTER KEYSLOT), and the faults are per node: CLIENT KILL (normal, pub/sub) on one node,
// SIGSTOP/SIGCONT of one node (master or replica) for 200-1500 ms, and once per run a master
// owning some of the keys is SIGKILLed mid-run and stays dead while its replica is promoted. The
// operations of a seed are the same in both modes; the invariants are the same.
//
// In Sentinel mode each run has a private master, replica and sentinel; the caches find the master
// through the sentinel (`redis: { sentinels, masterName }`). The faults hit whichever node is
// master then (CLIENT KILL, SIGSTOP below down-after-milliseconds) and the sentinel (SIGSTOP), and
// once per run the master fails over: SENTINEL FAILOVER or a SIGKILL of the master (seeded).
//
// Every operation, loader call, version bump and fault is recorded with its time; after the run
// checkHistory() looks for (see there): hung calls, rejected reads, impossible values, writes that
// failed or never resolved, an older value read by the process whose write of a newer one had
// resolved, and, once the faults stopped and the run settled, any instance or Redis envelope not
// holding the database's current version. Each violation carries the seed and the key's recent
// history across processes, so it can be read and replayed (`npm run soak -- --seed S`, with
// `--cluster` for a cluster run).
//
// Everything random comes from the one seed (mulberry32 streams derived per use). Timing is not
// reproducible on a loaded machine, so a seed replays the same operations and faults, not the same
// interleaving: replay a failing seed a few times.

const fs = require('node:fs')
const v8 = require('node:v8')
const os = require('node:os')
const path = require('node:path')
const { RedisServer, CacheWorker, waitFor, sleep } = require('./redis-server')
const { parseClusterSlots, makeCertificates, RedisNode, RedisSentinelGroup } = require('./redis-topology')

const WORKER_SCRIPT = path.join(__dirname, '..', 'fixtures', 'history-worker.js')

// ---- randomness ------------------------------------------------------------------------------

/** mulberry32: a small, fast 32-bit PRNG; returns a function giving floats in [0, 1). */
function mulberry32(seed) {
  let a = seed >>> 0
  return function next() {
    a = (a + 0x6d2b79f5) | 0
    let t = Math.imul(a ^ (a >>> 15), 1 | a)
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** A 32-bit seed for one named stream of `seed` (FNV-1a of "seed/label", then a murmur finalizer). */
function streamSeed(seed, label) {
  let h = 0x811c9dc5
  for (const ch of `${seed}/${label}`) {
    h ^= ch.charCodeAt(0)
    h = Math.imul(h, 0x01000193)
  }
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

function makeRand(seed) {
  const next = mulberry32(seed)
  return {
    next,
    /** An integer in [lo, hi]. */
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    /** One of `weights`' keys, with probability proportional to its value. */
    weighted(weights) {
      const entries = Object.entries(weights)
      let r = next() * entries.reduce((s, [, w]) => s + w, 0)
      for (const [k, w] of entries) {
        r -= w
        if (r < 0) return k
      }
      return entries[entries.length - 1][0]
    },
  }
}

// ---- the database ----------------------------------------------------------------------------

/**
 * key -> version, starting at 1. Writers of one key are serialized by a FIFO write slot: beginWrite
 * waits for the slot, then bumps the version (n times) and returns the last one.
 */
class Database {
  constructor(keys) {
    this.versions = new Map(keys.map((k) => [k, 1]))
    /** key -> FIFO of { slot, owner, grant }; the head holds the slot. */
    this.queues = new Map(keys.map((k) => [k, []]))
    /** Every bump: { t, key, version, by }. */
    this.bumps = []
    this.nextSlot = 1
  }

  read(key) {
    return this.versions.get(key)
  }

  beginWrite(key, owner, n) {
    const q = this.queues.get(key)
    const slot = this.nextSlot++
    return new Promise((resolve) => {
      const grant = () => {
        let version = this.versions.get(key)
        for (let i = 0; i < n; i++) {
          version++
          this.versions.set(key, version)
          this.bumps.push({ t: Date.now(), key, version, by: owner })
        }
        resolve({ version, slot })
      }
      q.push({ slot, owner, grant })
      if (q.length === 1) grant()
    })
  }

  endWrite(key, slot) {
    const q = this.queues.get(key)
    const i = q.findIndex((e) => e.slot === slot)
    if (i < 0) return
    q.splice(i, 1)
    if (i === 0 && q.length > 0) q[0].grant()
  }

  /** A worker died: free the slots it held or waited for, so the others go on. */
  releaseAll(owner) {
    for (const [key, q] of this.queues) {
      for (const e of q.filter((x) => x.owner === owner)) this.endWrite(key, e.slot)
    }
  }

  /** The version a key had at time `t` (bumps are stamped before the writer hears of them). */
  versionAt(key, t) {
    let v = 1
    for (const b of this.bumps) if (b.key === key && b.t <= t) v = Math.max(v, b.version)
    return v
  }
}

/** Answers one worker's database requests (messages without `id`: CacheWorker ignores them). */
function serveDatabase(worker, db) {
  worker.child.on('message', async (msg) => {
    if (!msg || msg.type !== 'db') return
    let reply
    if (msg.op === 'read') reply = { version: db.read(msg.key) }
    else if (msg.op === 'beginWrite') reply = await db.beginWrite(msg.key, worker.name, msg.n ?? 1)
    else if (msg.op === 'endWrite') reply = (db.endWrite(msg.key, msg.slot), {})
    else return
    try {
      if (worker.child.connected) worker.child.send({ type: 'dbReply', rid: msg.rid, ...reply })
    } catch {
      // the worker is gone; its exit is reported elsewhere
    }
  })
  worker.exited.then(() => db.releaseAll(worker.name))
}

// ---- faults: one redis-server ----------------------------------------------------------------

const FAULT_WEIGHTS = { 'kill-normal': 3, 'kill-pubsub': 2, pause: 3, restart: 2 }

/**
 * Seeded faults until `until`, one at a time, 150-700 ms apart. Leaves Redis running and resumed.
 * Each fault is recorded as { kind, start, end, ... } in `faults`.
 */
async function injectFaults({ redis, rand, until, faults }) {
  for (;;) {
    await sleep(rand.int(150, 700))
    if (Date.now() >= until) break
    const kind = rand.weighted(FAULT_WEIGHTS)
    // Drawn whatever the kind, so one seed gives one sequence of faults.
    const pauseMs = rand.int(200, 1_500)
    const signal = rand.next() < 0.5 ? 'SIGTERM' : 'SIGKILL'
    const f = { kind, start: Date.now(), end: null }
    faults.push(f)
    try {
      if (kind === 'kill-normal') f.killed = await redis.cmd('CLIENT', 'KILL', 'TYPE', 'normal')
      else if (kind === 'kill-pubsub') f.killed = await redis.cmd('CLIENT', 'KILL', 'TYPE', 'pubsub')
      else if (kind === 'pause') {
        f.ms = pauseMs
        redis.pause()
        await sleep(pauseMs)
        redis.resume()
      } else {
        f.signal = signal
        await redis.restart(signal)
      }
    } catch (err) {
      f.error = err.message
      redis.resume()
      if (!redis.proc) await redis.start()
    }
    f.end = Date.now()
  }
}

/** The single-server mode: a private redis-server per run, restarted empty by the faults. */
function serverBackend() {
  const redis = new RedisServer()
  return {
    mode: 'server',
    async start() {
      await redis.start()
    },
    describe: () => `redis :${redis.port}`,
    keys: async (namespace, n) => ({ keys: Array.from({ length: n }, (_, i) => `k${i}`) }),
    cacheRedis: () => redis.url,
    faults: ({ seed, until, faults }) => injectFaults({ redis, rand: makeRand(streamSeed(seed, 'faults')), until, faults }),
    async recover() {
      redis.resume()
      if (!redis.proc) await redis.start()
      await waitFor(
        () =>
          redis.cmd('PING').then(
            (r) => r === 'PONG',
            () => false,
          ),
        { timeout: 15_000, what: 'Redis to answer PING' },
      )
    },
    envelopes: async (namespace, keys) => parseEnvelopes(keys, await redis.pipeline(keys.map((k) => ['GET', valueKey(namespace, k)]))),
    dispose: () => redis.dispose(),
  }
}

/**
 * The single-server mode over TLS: a private TLS-only redis-server with a throwaway CA, which the
 * caches trust (`tls.ca`), so their reads take the TLS read lane; the same faults, restarts on the
 * same port. With `mtls` the server requires client certificates, which every cache presents
 * (mutual TLS).
 */
function tlsServerBackend({ mtls = false } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-history-tls-'))
  const certs = makeCertificates(dir)
  const node = new RedisNode('history-tls', { dir, tls: { certs, authClients: mtls ? 'yes' : 'no' } })
  // What injectFaults drives: RedisServer's shape, restarting on the same port.
  const redis = {
    cmd: (...args) => node.cmd(...args),
    pause: () => node.pause(),
    resume: () => node.resume(),
    restart: (signal) => node.restart(signal),
    get proc() {
      return node.alive ? node.proc : null
    },
    start: () => node.revive(),
  }
  return {
    mode: mtls ? 'mtls' : 'tls',
    async start() {
      await node.start()
    },
    describe: () => `redis (${mtls ? 'mutual TLS' : 'TLS'}) :${node.port}`,
    keys: async (namespace, n) => ({ keys: Array.from({ length: n }, (_, i) => `k${i}`) }),
    cacheRedis: () => ({ url: node.url, tls: mtls ? { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } : { ca: certs.ca } }),
    faults: ({ seed, until, faults }) => injectFaults({ redis, rand: makeRand(streamSeed(seed, 'faults')), until, faults }),
    async recover() {
      node.resume()
      await node.revive()
      await waitFor(
        () =>
          node.cmd('PING').then(
            (r) => r === 'PONG',
            () => false,
          ),
        { timeout: 15_000, what: 'Redis to answer PING' },
      )
    },
    envelopes: async (namespace, keys) => parseEnvelopes(keys, await node.pipeline(keys.map((k) => ['GET', valueKey(namespace, k)]))),
    async dispose() {
      await node.dispose()
      fs.rmSync(dir, { recursive: true, force: true })
    },
  }
}

// ---- Sentinel --------------------------------------------------------------------------------

/**
 * How a Sentinel run's faults are drawn, all on the master the sentinel names at that moment:
 * CLIENT KILL (normal, pub/sub) and SIGSTOP; and SIGSTOP of the sentinel itself, which the caches
 * ask for the master when they (re)connect. No empty restarts: under Sentinel an empty master
 * would wipe its replica too (the operator's bug, not the cache's); the failover below is the
 * fault that loses what was not yet replicated.
 */
const SENTINEL_FAULT_WEIGHTS = { 'kill-normal': 3, 'kill-pubsub': 2, pause: 3, 'pause-sentinel': 1 }

/** down-after-milliseconds of the run's sentinel; pauses stay below it so that only the drawn failover fails over. */
const SENTINEL_DOWN_AFTER = 1_500
const SENTINEL_MAX_PAUSE = 900

/**
 * Seeded faults on a RedisSentinelGroup until `until`, one at a time, 150-700 ms apart; once, as
 * the first fault due after a seeded moment in KILL_WINDOW, a failover: either SENTINEL FAILOVER
 * (the old master is demoted to a replica of the new one) or a SIGKILL of the master (it stays
 * dead; the sentinel promotes the replica after down-after-milliseconds). The failover is awaited
 * until the sentinel names the replica and the replica says ROLE master.
 */
async function injectSentinelFaults({ group, seed, t0, durationMs, until, faults, failover }) {
  const rand = makeRand(streamSeed(seed, 'sentinel faults'))
  const foRand = makeRand(streamSeed(seed, 'sentinel failover'))
  const failoverAt = t0 + Math.round(durationMs * (KILL_WINDOW[0] + (KILL_WINDOW[1] - KILL_WINDOW[0]) * foRand.next()))
  const drawn = foRand.next() < 0.5 ? 'SENTINEL FAILOVER' : 'SIGKILL'
  const how = failover ?? drawn
  let failedOver = false
  for (;;) {
    await sleep(rand.int(150, 700))
    if (Date.now() >= until) break
    // Drawn whatever the kind, so one seed gives one sequence of faults.
    const kind = rand.weighted(SENTINEL_FAULT_WEIGHTS)
    const pauseMs = rand.int(200, SENTINEL_MAX_PAUSE)
    if (!failedOver && Date.now() >= failoverAt) {
      failedOver = true
      await sentinelFailover(group, how, faults)
      continue
    }
    const master = group.master
    const f = { kind, start: Date.now(), end: null, node: kind === 'pause-sentinel' ? group.sentinel.port : master.port }
    if (kind !== 'pause-sentinel') f.role = 'master'
    faults.push(f)
    const node = kind === 'pause-sentinel' ? group.sentinel : master
    try {
      if (kind === 'kill-normal') f.killed = await node.cmd('CLIENT', 'KILL', 'TYPE', 'normal')
      else if (kind === 'kill-pubsub') f.killed = await node.cmd('CLIENT', 'KILL', 'TYPE', 'pubsub')
      else {
        f.ms = pauseMs
        node.pause()
        await sleep(pauseMs)
        node.resume()
      }
    } catch (err) {
      f.error = err.message.split('\n')[0]
      node.resume()
    }
    f.end = Date.now()
  }
  // A run too short to reach the window still fails over once, so every Sentinel run has one.
  if (!failedOver) await sentinelFailover(group, how, faults)
}

/** One failover of `group` (see injectSentinelFaults), recorded as a 'failover' fault. */
async function sentinelFailover(group, how, faults) {
  const old = group.master
  const candidate = group.replica
  const f = { kind: 'failover', how, node: old.port, start: Date.now(), end: null }
  faults.push(f)
  try {
    if (!candidate) throw new Error('no replica left to promote')
    if (how === 'SIGKILL') {
      const r = await group.killMaster({ timeout: 30_000 })
      f.newMaster = r.newMaster.port
      f.promotedMs = r.failoverMs
    } else {
      // The sentinel turns the old master into a replica of the new one, seconds later.
      const r = await group.commandFailover({ timeout: 30_000 })
      f.newMaster = r.newMaster.port
      // When the sentinel first named the promoted replica to its clients (polled every 10 ms).
      f.namedAt = r.switchedAt
      f.promotedMs = Date.now() - f.start
    }
  } catch (err) {
    f.error = err.message.split('\n')[0]
  }
  f.end = Date.now()
}

/**
 * The Sentinel mode: a private RedisSentinelGroup per run (a master, a replica, one sentinel with
 * down-after-milliseconds SENTINEL_DOWN_AFTER); the caches find the master through the sentinel
 * (`redis: { sentinels, masterName }`) and must follow the run's failover.
 */
function sentinelBackend({ failover } = {}) {
  const group = new RedisSentinelGroup({ downAfter: SENTINEL_DOWN_AFTER })
  const info = { before: null, after: null }
  const backend = {
    mode: 'sentinel',
    info,
    async start() {
      await group.start()
      info.before = { master: group.master.port, replica: group.replica.port, sentinel: group.sentinel.port }
    },
    describe: () => `sentinel :${group.sentinel.port}, master :${group.master.port}, replica :${group.replica ? group.replica.port : '-'}`,
    keys: async (namespace, n) => ({ keys: Array.from({ length: n }, (_, i) => `k${i}`) }),
    cacheRedis: () => ({ sentinels: group.sentinelUrls, masterName: group.masterName }),
    faults: ({ seed, t0, durationMs, until, faults }) => injectSentinelFaults({ group, seed, t0, durationMs, until, faults, failover }),
    async recover() {
      for (const n of [group.master, group.replica, group.sentinel]) if (n) n.resume()
      // The sentinel names the master we think it is, and that master takes writes.
      await waitFor(
        async () => {
          if ((await group.masterPort().catch(() => null)) !== group.master.port) return false
          const role = await group.master.cmd('ROLE').catch(() => null)
          return Array.isArray(role) && role[0] === 'master'
        },
        { timeout: 20_000, what: 'the sentinel and the master to agree' },
      ).catch(async (err) => {
        throw new Error(`${err.message}: the sentinel names :${await group.masterPort().catch((e) => e.message)}, expected :${group.master.port}`)
      })
      info.after = { master: group.master.port, replica: group.replica ? group.replica.port : null }
    },
    envelopes: async (namespace, keys) => parseEnvelopes(keys, await group.master.pipeline(keys.map((k) => ['GET', valueKey(namespace, k)]))),
    dispose: () => group.dispose(),
  }
  return backend
}

// ---- Redis Cluster ---------------------------------------------------------------------------

/** How a cluster run's faults are drawn: CLIENT KILL and SIGSTOP of one node (no restarts: see below). */
const CLUSTER_FAULT_WEIGHTS = { 'kill-normal': 3, 'kill-pubsub': 2, pause: 3 }

/** The master is SIGKILLed at a seeded moment in this part of the run (fractions of durationMs). */
const KILL_WINDOW = [0.2, 0.45]

/** The cache's value key (docs/CONTRACT.md "Redis"); the test's keys hold no `}` (no hex form). */
const valueKey = (namespace, key) => `${namespace}:v:{${key}}`

/** Every node that is alive, in the cluster's fixed order (so a seeded pick is stable). */
const liveNodes = (cluster) => cluster.nodes.filter((n) => n.alive)

/**
 * CLUSTER SLOTS from the first live node not in `paused` that answers (RedisCluster.slotMap asks
 * the first live node, which may be stopped by a fault).
 */
async function slotMapOf(cluster, paused = new Set()) {
  let lastErr
  for (const n of liveNodes(cluster)) {
    if (paused.has(n)) continue
    try {
      return parseClusterSlots(await n.cmd('CLUSTER', 'SLOTS'))
    } catch (err) {
      lastErr = err
    }
  }
  throw lastErr ?? new Error('no live cluster node answers')
}

/** The masters that serve slots now, from `slotMap` (CLUSTER SLOTS). */
function mastersOf(cluster, slotMap) {
  const ports = new Set(slotMap.map((r) => r.master))
  return liveNodes(cluster).filter((n) => ports.has(n.port))
}

/** The live masters that have a live replica (one of them can be killed and failed over), but not those in `skip`. */
async function killableMasters(cluster, skip = new Set()) {
  const out = []
  for (const m of mastersOf(cluster, await slotMapOf(cluster, skip))) {
    if (skip.has(m)) continue
    const replicas = await cluster.replicasOf(m).catch(() => [])
    if (replicas.some((r) => r.alive)) out.push(m)
  }
  return out
}

/**
 * Whether `cluster` can host one more run: healthy on every node with 3 masters serving all slots,
 * and a master with a replica left to kill. The soak replaces a cluster that cannot.
 */
async function clusterUsable(cluster, { timeout = 10_000 } = {}) {
  try {
    await cluster.waitHealthy({ timeout })
    return (await killableMasters(cluster)).length > 0
  } catch {
    return false
  }
}

/**
 * `n` keys of the test's form (k0, k1, ...) whose value keys are spread over every master that
 * serves slots (CLUSTER KEYSLOT; at most ceil(n / masters) per master), in candidate order, so the
 * same seed gets the same keys on the same layout. Returns { keys, slots, owners } (owners: port).
 */
async function spreadKeys(cluster, namespace, n) {
  const candidates = Array.from({ length: 200 }, (_, i) => `k${i}`)
  const slots = await cluster.keySlots(candidates.map((k) => valueKey(namespace, k)))
  const map = await cluster.slotMap()
  const masters = [...new Set(map.map((r) => r.master))]
  const cap = Math.ceil(n / masters.length)
  const perMaster = new Map(masters.map((p) => [p, 0]))
  const out = { keys: [], slots: {}, owners: {} }
  candidates.forEach((k, i) => {
    if (out.keys.length >= n) return
    const owner = map.find((r) => slots[i] >= r.start && slots[i] <= r.end).master
    if (perMaster.get(owner) >= cap) return
    perMaster.set(owner, perMaster.get(owner) + 1)
    out.keys.push(k)
    out.slots[k] = slots[i]
    out.owners[k] = owner
  })
  const empty = [...perMaster].filter(([, c]) => c === 0).map(([p]) => `:${p}`)
  if (out.keys.length < n || (n >= masters.length && empty.length > 0)) {
    throw new Error(`could not spread ${n} keys over the masters ${masters.join(', ')}: ${JSON.stringify(out.owners)}`)
  }
  return out
}

function signalNode(node, signal) {
  if (!node.alive) return false
  try {
    process.kill(node.pid, signal)
    return true
  } catch {
    return false
  }
}

/**
 * Seeded faults on the cluster's nodes until `until`, one at a time, 150-700 ms apart: CLIENT KILL
 * TYPE normal on a master (where the cache's command connections are), CLIENT KILL TYPE pubsub on
 * any node (the bus subscribes on one node of its choice, replicas included), SIGSTOP of any node
 * for 200-1500 ms. A pause longer than cluster-node-timeout may fail a master over by itself:
 * that is a fault production has too, and the run records the layout before and after.
 *
 * Once, at a seeded moment in KILL_WINDOW, a master that owns some of the run's keys and has a
 * replica (and is not paused) is SIGKILLed, not restarted (a restarted empty master could take its
 * slots back empty, which is the operator's bug, not the cache's); the faults go on meanwhile.
 * Resolves when the faults have ended and that failover has settled (or failed: `error`).
 */
async function injectClusterFaults({ cluster, seed, t0, durationMs, until, faults, paused, keyOwners }) {
  const rand = makeRand(streamSeed(seed, 'cluster faults'))
  const killRand = makeRand(streamSeed(seed, 'cluster master kill'))
  const killAt = t0 + Math.round(durationMs * (KILL_WINDOW[0] + (KILL_WINDOW[1] - KILL_WINDOW[0]) * killRand.next()))
  const victimPick = killRand.next()
  const killMaster = async () => {
    const f = { kind: 'kill-master', start: Date.now(), end: null }
    faults.push(f)
    try {
      const owning = new Set(Object.values(keyOwners))
      let r = null
      for (let attempt = 1; r === null; attempt++) {
        // A paused master is no candidate (its CLUSTER NODES would not answer): wait for its pause to end.
        let candidates = []
        for (let tries = 0; candidates.length === 0 && tries < 40; tries++) {
          if (tries > 0) await sleep(100)
          candidates = (await killableMasters(cluster, paused)).filter((m) => owning.has(m.port))
        }
        if (candidates.length === 0) throw new Error('no master that owns some of the keys has a replica')
        const victim = candidates[Math.floor(victimPick * candidates.length)]
        f.node = victim.port
        f.keys = Object.keys(keyOwners).filter((k) => keyOwners[k] === victim.port)
        try {
          r = await cluster.killMaster(victim, { timeout: 30_000 })
        } catch (err) {
          // killMaster asks the victim for its replicas first: a pause that began since may have
          // failed that question. Try again while the victim lives; after the SIGKILL, report.
          if (!victim.alive || attempt >= 5) throw err
          f.retried = (f.retried ?? 0) + 1
          await sleep(200)
        }
      }
      f.newMaster = r.newMaster.port
      f.killedAt = r.killedAt
      f.promotedMs = r.promotedMs
      f.settledMs = r.settledMs
    } catch (err) {
      f.error = err.message.split('\n')[0]
      f.detail = err.message.slice(0, 4_000)
    }
    f.end = Date.now()
  }
  // On its own clock, not between two faults: the other faults go on during the failover (a pause
  // may even be running when the master dies), as they would in production.
  const failover = sleep(Math.max(0, killAt - Date.now())).then(killMaster)

  for (;;) {
    await sleep(rand.int(150, 700))
    if (Date.now() >= until) break
    const kind = rand.weighted(CLUSTER_FAULT_WEIGHTS)
    // Drawn whatever the kind, so one seed gives one sequence of faults.
    const pauseMs = rand.int(200, 1_500)
    const pick = rand.next()
    const f = { kind, start: Date.now(), end: null }
    faults.push(f)
    let node = null
    try {
      const map = await slotMapOf(cluster, paused)
      const pool = kind === 'kill-normal' ? mastersOf(cluster, map) : liveNodes(cluster)
      node = pool[Math.floor(pick * pool.length)]
      f.node = node.port
      f.role = map.some((r) => r.master === node.port) ? 'master' : 'replica'
      if (kind === 'kill-normal') f.killed = await node.cmd('CLIENT', 'KILL', 'TYPE', 'normal')
      else if (kind === 'kill-pubsub') f.killed = await node.cmd('CLIENT', 'KILL', 'TYPE', 'pubsub')
      else {
        f.ms = pauseMs
        if (signalNode(node, 'SIGSTOP')) paused.add(node)
        await sleep(pauseMs)
        paused.delete(node)
        signalNode(node, 'SIGCONT')
      }
    } catch (err) {
      f.error = err.message.split('\n')[0]
      if (node && paused.delete(node)) signalNode(node, 'SIGCONT')
    }
    f.end = Date.now()
  }
  await failover
}

/** Each node's port and role now, and the owner of each key's slot: what a pause may have changed. */
async function clusterLayout(cluster, keys) {
  const map = await cluster.slotMap()
  // The slot is the hash tag's ({key}): any namespace gives the same one.
  const slots = await cluster.keySlots(keys.map((k) => valueKey('x', k)))
  return {
    masters: mastersOf(cluster, map).map((n) => n.port),
    dead: cluster.nodes.filter((n) => !n.alive).map((n) => n.port),
    owners: Object.fromEntries(keys.map((k, i) => [k, map.find((r) => slots[i] >= r.start && slots[i] <= r.end).master])),
  }
}

/**
 * The cluster mode, on a started RedisCluster the caller owns (it outlives the run: one cluster
 * per test file; the soak replaces it once no master with a replica is left). Each worker gets
 * every live node as a seed, rotated, so the workers' bus subscribers start on different nodes.
 */
function clusterBackend(cluster) {
  const paused = new Set()
  let keyOwners = {}
  let seeds = []
  const backend = {
    mode: 'cluster',
    info: { nodes: [], keySlots: {}, before: null, after: null },
    async start() {
      await cluster.waitHealthy({ timeout: 20_000 })
      // Just after `redis-cli --cluster create` a master may not list its replica yet (waitHealthy
      // passes while a replica is still an empty master): give the replicas a moment to attach.
      await waitFor(async () => (await killableMasters(cluster)).length > 0, { timeout: 10_000, interval: 100, what: 'a master with a replica' }).catch(() => {
        throw new Error('the cluster has no master with a replica left to kill: start a new one')
      })
      seeds = liveNodes(cluster).map((n) => n.url)
      const map = await cluster.slotMap()
      backend.info.nodes = liveNodes(cluster).map((n) => ({ port: n.port, role: map.some((r) => r.master === n.port) ? 'master' : 'replica' }))
    },
    describe: () => `cluster ${backend.info.nodes.map((n) => `:${n.port}${n.role === 'master' ? '(m)' : ''}`).join(' ')}`,
    async keys(namespace, n) {
      const spread = await spreadKeys(cluster, namespace, n)
      keyOwners = spread.owners
      backend.info.keySlots = spread.slots
      backend.info.before = await clusterLayout(cluster, spread.keys)
      return spread
    },
    cacheRedis: (i) => ({ cluster: seeds.map((_, j) => seeds[(j + 2 * i) % seeds.length]) }),
    faults: ({ seed, t0, durationMs, until, faults }) => injectClusterFaults({ cluster, seed, t0, durationMs, until, faults, paused, keyOwners }),
    async recover(keys) {
      for (const n of paused) signalNode(n, 'SIGCONT')
      paused.clear()
      await cluster.waitHealthy({ timeout: 30_000 }).catch(async (err) => {
        throw new Error(`${err.message}\n${await cluster.describe()}`)
      })
      backend.info.after = await clusterLayout(cluster, keys)
    },
    async envelopes(namespace, keys) {
      const map = await cluster.slotMap()
      const slots = await cluster.keySlots(keys.map((k) => valueKey(namespace, k)))
      const replies = await Promise.all(
        keys.map(async (k, i) => {
          const owner = cluster.nodeByPort(map.find((r) => slots[i] >= r.start && slots[i] <= r.end).master)
          return owner.cmd('GET', valueKey(namespace, k))
        }),
      )
      return parseEnvelopes(keys, replies)
    },
    async dispose() {
      // Never leave a node stopped: the next run (or the cluster's dispose) needs it.
      for (const n of paused) signalNode(n, 'SIGCONT')
      paused.clear()
    },
  }
  return backend
}

// ---- one run ---------------------------------------------------------------------------------

const DEFAULTS = {
  workers: 3,
  /** Client loops per worker. */
  clients: 3,
  keys: 5,
  /** How long the clients issue operations (faults stop with them). */
  durationMs: 6_000,
  /** Each worker's ttl is drawn from this range; jitter stays at its default (0.1). */
  ttl: [300, 800],
  // Well above the ttls: a stale entry lives long enough for the liveness check to see it not refreshed.
  hardTtl: 10_000,
  lockTtl: 1_000,
  loadTimeout: 2_000,
  faults: true,
  /** The pub/sub bound of docs/CONTRACT.md ("Redis": 100 ms), with room for a loaded machine. */
  busBoundMs: 500,
  /** Each worker's errorBackoff is drawn from [50, this] ms. */
  maxErrorBackoff: 1_000,
  /** Force a configuration instead of drawing it: l1 (false or { maxBytes }), serializer ('json' | 'v8' | 'custom'), tags (boolean). */
  l1: undefined,
  serializer: undefined,
  tags: undefined,
  /** A started RedisCluster (helpers/redis-topology.js) to run against instead of a private redis-server. */
  cluster: null,
  /** Over TLS: a TLS-only server (the read lane speaks TLS); single-server mode only. */
  tls: false,
  /** Over mutual TLS: as tls, and the server requires the client certificate every cache presents. */
  mtls: false,
  /** Through Sentinel: a private master, replica and sentinel per run; the caches find the master through the sentinel and one failover is drawn. */
  sentinel: false,
  /** How the Sentinel run's failover is done: 'SENTINEL FAILOVER' or 'SIGKILL' (of the master); drawn per seed if undefined. */
  sentinelFailover: undefined,
  /** Called with progress lines (the soak prints them with --verbose). */
  log: () => {},
}
const JITTER = 0.1

/** Runs in this process, so two cluster runs of one seed (--repeat) never share a namespace. */
let runCount = 0

/**
 * Runs one seeded history and checks it. Resolves with the record: { seed, mode, t0, keys, config,
 * ops, loads, bumps, faults, finals, redisBefore, redisAfter, reports, violations, cluster, ... }.
 * Never leaves a process behind (in cluster mode the cluster stays: it is the caller's).
 */
async function runHistory(options = {}) {
  const o = { ...DEFAULTS, ...options }
  const seed = o.seed >>> 0
  const rand = makeRand(streamSeed(seed, 'config'))
  const backend = o.cluster
    ? clusterBackend(o.cluster)
    : o.sentinel
      ? sentinelBackend({ failover: o.sentinelFailover })
      : o.tls || o.mtls
        ? tlsServerBackend({ mtls: Boolean(o.mtls) })
        : serverBackend()
  const cfg = {
    maxLoadMs: 300,
    maxGapMs: 40,
    loadTimeout: o.loadTimeout,
    // A call that takes longer has hung: a load (loadTimeout) after a lock wait (lockTtl), plus a
    // few seconds for Redis timeouts, reconnects and a loaded machine.
    hangBound: o.loadTimeout + o.lockTtl + 4_000,
    // A write retried for this long without resolving, with the faults over long since, is lost.
    writeGiveUpMs: 20_000,
    busBoundMs: o.busBoundMs,
    maxErrorBackoff: o.maxErrorBackoff,
  }
  runCount++
  const namespace = backend.mode === 'cluster' ? `hist${seed}p${process.pid}c${runCount}` : `hist${seed}p${process.pid}`
  const h = {
    seed,
    mode: backend.mode,
    faultsAsked: Boolean(o.faults),
    keys: [],
    namespace,
    cfg,
    startedAt: Date.now(),
    t0: null,
    config: [],
    ops: [],
    loads: [],
    faults: [],
    finals: [],
    warms: [],
    bumps: [],
    db: null,
    redisBefore: null,
    redisAfter: null,
    reports: [],
    workerErrors: [],
    violations: [],
    cluster: backend.mode === 'cluster' ? backend.info : undefined,
    sentinel: backend.mode === 'sentinel' ? backend.info : undefined,
  }
  const workers = []
  try {
    await backend.start()
    const { keys } = await backend.keys(namespace, o.keys)
    h.keys = keys
    const db = new Database(keys)
    h.bumps = db.bumps
    // What the run draws besides the ttls (o.* forces one): the serializer and tags for the run
    // (every worker must read the others' entries), l1 per worker (default, off, or a byte
    // budget a few entries fill), negativeTtl and errorBackoff per worker (short, so a negative
    // entry or a refresh backoff never outlives the settle before the final reads).
    const serializer = o.serializer ?? rand.weighted({ json: 2, v8: 1, custom: 1 })
    const tags = o.tags ?? rand.next() < 0.5
    cfg.tags = tags
    cfg.serializer = serializer
    for (let i = 0; i < o.workers; i++) {
      const name = `w${i}`
      const ttl = rand.int(o.ttl[0], o.ttl[1])
      const l1Kind = rand.weighted({ default: 2, off: 1, bytes: 1 })
      const maxBytes = rand.int(40, 200)
      const l1 = o.l1 !== undefined ? o.l1 : l1Kind === 'off' ? false : l1Kind === 'bytes' ? { maxBytes } : undefined
      const cache = {
        redis: backend.cacheRedis(i),
        namespace,
        ttl,
        hardTtl: o.hardTtl,
        lockTtl: o.lockTtl,
        loadTimeout: o.loadTimeout,
        negativeTtl: rand.int(50, ttl),
        errorBackoff: rand.int(50, o.maxErrorBackoff),
        ...(l1 === undefined ? {} : { l1 }),
        ...(serializer === 'json' ? {} : { serializer }),
      }
      h.config.push({ name, ...cache })
      const w = new CacheWorker(name, { name, cache }, { script: WORKER_SCRIPT })
      workers.push(w)
      serveDatabase(w, db)
    }
    await Promise.all(workers.map((w) => w.hello))
    const maxTtl = Math.max(...h.config.map((c) => c.ttl))
    const where = backend.mode === 'cluster' ? ` (${keys.map((k) => `${k}@:${h.cluster.before.owners[k]}`).join(' ')})` : ''
    o.log(`seed ${seed}: ${backend.describe()}, ${o.workers} workers (ttl ${h.config.map((c) => c.ttl).join('/')} ms), keys ${keys.join(' ')}${where}`)

    h.t0 = Date.now() + 300
    const runTimeout = o.durationMs + 2 * cfg.hangBound + cfg.writeGiveUpMs + 10_000
    const runs = workers.map((w, i) =>
      w.request(
        'run',
        {
          startAt: h.t0,
          durationMs: o.durationMs,
          seeds: Array.from({ length: o.clients }, (_, c) => streamSeed(seed, `client ${i}.${c}`)),
          keys,
          cfg,
        },
        { timeout: runTimeout },
      ),
    )
    // Settles with the injector's error (or null), so a failure waits for the workers' runs.
    const faulting = o.faults
      ? sleep(h.t0 - Date.now())
          .then(() => backend.faults({ seed, t0: h.t0, durationMs: o.durationMs, until: h.t0 + o.durationMs, faults: h.faults }))
          .then(
            () => null,
            (err) => err,
          )
      : Promise.resolve(null)
    const results = await Promise.allSettled(runs)
    const faultError = await faulting
    if (faultError) throw faultError
    results.forEach((r, i) => {
      if (r.status === 'fulfilled') {
        h.ops.push(...r.value.ops)
        h.loads.push(...r.value.loads)
      } else {
        h.workerErrors.push({ proc: workers[i].name, phase: 'run', message: r.reason.message, exit: workers[i].exitInfo })
      }
    })
    h.opsEndedAt = Date.now()
    o.log(`seed ${seed}: ${h.ops.length} operations, ${h.faults.length} faults; settling`)

    // Settle: Redis answers (every node resumed, the cluster healthy), background refreshes end,
    // then the bus bound and the longest ttl (with jitter) pass. No operation and no fault runs
    // from here on.
    await backend.recover(keys)
    const live = workers.filter((w) => !w.exitInfo)
    const settles = await Promise.allSettled(live.map((w) => w.request('settle', {}, { timeout: cfg.hangBound + 5_000 })))
    settles.forEach((r, i) => {
      if (r.status === 'rejected') h.workerErrors.push({ proc: live[i].name, phase: 'settle', message: r.reason.message })
    })
    await sleep(o.busBoundMs + Math.ceil(maxTtl * (1 + JITTER)))
    h.db = Object.fromEntries(db.versions)
    h.checkedAt = Date.now()

    // One read of every key in every worker, which refreshes what a silent change or a null
    // load left stale; then those refreshes settle and their announcements pass. With l1: false a
    // stale entry was once served and never refreshed: the final reads below see that.
    const warms = await Promise.allSettled(live.map((w) => w.request('warm', { keys, cfg }, { timeout: keys.length * cfg.hangBound + 5_000 })))
    warms.forEach((r, i) => {
      if (r.status === 'fulfilled') h.warms.push(...r.value.warms)
      else h.workerErrors.push({ proc: live[i].name, phase: 'warm', message: r.reason.message })
    })
    await sleep(o.busBoundMs)
    h.checkedAt = Date.now()
    h.redisBefore = await backend.envelopes(namespace, keys)
    const finals = await Promise.allSettled(live.map((w) => w.request('final', { keys, cfg }, { timeout: keys.length * cfg.hangBound + 5_000 })))
    finals.forEach((r, i) => {
      if (r.status === 'fulfilled') {
        h.finals.push(...r.value.finals)
      } else {
        h.workerErrors.push({ proc: live[i].name, phase: 'final', message: r.reason.message })
      }
    })
    h.redisAfter = await backend.envelopes(namespace, keys)
    const reports = await Promise.allSettled(live.map((w) => w.request('report', {}, { timeout: 5_000 })))
    for (const r of reports) if (r.status === 'fulfilled') h.reports.push(r.value)
    // The full records: loader calls and late settlements that ended after `run` returned. A
    // worker that cannot answer keeps what its `run` returned.
    const full = await Promise.allSettled(live.map((w) => w.request('history', {}, { timeout: 5_000 })))
    full.forEach((r, i) => {
      if (r.status !== 'fulfilled') return
      const proc = live[i].name
      h.ops = [...h.ops.filter((x) => x.proc !== proc), ...r.value.ops.filter((x) => x.client !== 'final')]
      h.loads = [...h.loads.filter((x) => x.proc !== proc), ...r.value.loads]
    })
  } finally {
    await Promise.all(workers.map((w) => w.kill('SIGKILL')))
    await backend.dispose()
  }
  h.endedAt = Date.now()
  h.violations = checkHistory(h)
  return h
}

/** GET replies of the value keys as key -> { raw, v } (v: the version, null for none, 'bad' for unreadable). */
function parseEnvelopes(keys, replies) {
  const out = {}
  keys.forEach((k, i) => {
    const raw = replies[i]
    let v = null
    if (typeof raw === 'string') {
      try {
        const env = JSON.parse(raw)
        // The value as the run's serializer wrote it (src/envelope.rs: 'v8' is base64 of node:v8
        // bytes, 'custom' the custom serializer's text, see fixtures/history-worker.js).
        let value = env && env.value
        if (env && env.fmt === 'v8') value = v8.deserialize(Buffer.from(env.value, 'base64'))
        else if (env && env.fmt === 'custom') value = String(env.value).startsWith('h1:') ? JSON.parse(env.value.slice(3)) : undefined
        else if (env && env.fmt !== undefined) value = undefined
        v = value === null ? 'null' : value && Number.isInteger(value.v) ? value.v : 'bad'
      } catch {
        v = 'bad'
      }
    } else if (raw !== null) {
      v = 'bad'
    }
    out[k] = { raw: typeof raw === 'string' ? raw.slice(0, 300) : raw, v }
  })
  return out
}

// ---- the checks ------------------------------------------------------------------------------

const READS = new Set(['getOrLoad', 'forceRefresh', 'abortable', 'slow', 'failing', 'null-load', 'get'])
const LOADING_READS = new Set(['getOrLoad', 'forceRefresh', 'abortable', 'slow', 'failing', 'null-load', 'final-warm', 'final-getOrLoad'])
/** The writes that tell the cache (silent ones bump the database only: see 'not-refreshed'). */
const WRITES = new Set(['set', 'delete', 'set-set', 'tag-delete', 'clear'])
/** After a fault ends, how long reconnects, resubscription and backoffs may take before the bounds below apply again. */
const RECOVERY_MS = 2_500
/**
 * A command failover (SENTINEL FAILOVER) leaves the old master up and writable: what it
 * acknowledges after the replica's promotion is lost when it resyncs from the new master (Redis
 * replicates asynchronously; README "Guarantees"). The cache leaves the old master when a
 * sentinel names the promoted replica (it hears +promoted-slave, as the soak's poll sees the
 * answer change): a write whose acknowledged attempt began from the failover command to then, plus
 * this slack (the soak polls every 10 ms; the caches ask the sentinels once on hearing it), may
 * be lost; nothing begun after.
 */
const FOLLOW_SLACK_MS = 250
/** The message of a loader the test makes fail on purpose ('failing' operations). */
const PLANNED_FAILURE = /^planned loader failure/

/**
 * The invariants. Returns [{ kind, key, at, message }]:
 *  hung                 a cache call did not settle within cfg.hangBound (loadTimeout + lockTtl + 4 s)
 *  read-rejected        a read rejected, except AbortError of a call whose signal the test aborted
 *                       and ERR_LOAD_TIMEOUT of a call that met a loader the test made slower than
 *                       loadTimeout (its own, or one in the same process on the same key during it)
 *  bad-value            a read returned something no loader or writer produced, a getOrLoad
 *                       resolved with nothing, or a version the database did not have yet
 *  write-rejected       set/delete rejected with anything but ERR_REDIS
 *  write-lost           a write retried on ERR_REDIS for cfg.writeGiveUpMs never resolved
 *  older-after-own-write  a process whose write of version V had resolved later read an older
 *                       version (getOrLoad 10). A read that may have joined a load of that process
 *                       already running when the write resolved, and returned what that load read,
 *                       is not counted: the contract fences what such a load writes, and this test
 *                       asks no more.
 *  final-read           after the run settled, an instance's getOrLoad returned another version
 *                       than the database's
 *  final-redis          after the run settled (before or after those reads) a value key held
 *                       another version than the database's (nothing is fine)
 * After a Sentinel command failover, an older version in a final read or in Redis, and an older
 * read after the process's own write, are not violations if a write that the old master may have
 * acknowledged after the promotion explains them (see FOLLOW_SLACK_MS): such final states are
 * counted in h.lostInFailover instead.
 *  worker-failed        a worker process died or a command to it failed
 */
/** When writes sent to the old master may be lost (see FOLLOW_SLACK_MS): [{ from, to }]. */
function lossWindows(h) {
  return h.faults
    .filter((f) => f.kind === 'failover' && f.how === 'SENTINEL FAILOVER' && f.namedAt)
    .map((f) => ({ from: f.start, to: f.namedAt + FOLLOW_SLACK_MS }))
}

/** The attempt that resolved write `w` went out in a loss window (the old master may have acknowledged it). */
function mayBeLost(h, w) {
  if (!WRITES.has(w.op) || w.outcome !== 'ok') return false
  const last = w.attempts && w.attempts.length > 0 ? w.attempts[w.attempts.length - 1] : w
  return lossWindows(h).some((x) => last.end >= x.from && last.start <= x.to)
}

/**
 * Whether what Redis or an instance holds for `key` at the end may be what a lost write left
 * behind: the last write that touched the key (its own, a deleteByTag, a clear) may have been lost
 * in a failover, and none began after that failover's window.
 */
function lostInFailover(h, key) {
  const windows = lossWindows(h)
  if (windows.length === 0) return false
  const touching = h.ops.filter((w) => WRITES.has(w.op) && w.outcome === 'ok' && (w.key === key || w.op === 'clear' || w.op === 'tag-delete'))
  const lost = touching.filter((w) => mayBeLost(h, w))
  if (lost.length === 0) return false
  const end = Math.max(...windows.map((x) => x.to))
  return !touching.some((w) => {
    const last = w.attempts && w.attempts.length > 0 ? w.attempts[w.attempts.length - 1] : w
    return last.start > end
  })
}

function checkHistory(h) {
  const out = []
  // Final states explained by writes lost in a command failover (counted, not violations).
  h.lostInFailover = []
  const add = (kind, key, at, message, from) => out.push({ kind, key, at, from, message })
  const db = new Database([])
  db.bumps = h.bumps
  const all = [...h.ops, ...(h.warms ?? []), ...h.finals]
  const fmt = (t) => rel(h, t)

  for (const e of h.workerErrors)
    add('worker-failed', null, h.checkedAt ?? Date.now(), `${e.proc} ${e.phase}: ${e.message}${e.exit ? ` (exit ${JSON.stringify(e.exit)})` : ''}`)

  for (const op of all) {
    const where = `${op.proc} #${op.i} ${op.op}(${op.key}) started ${fmt(op.start)}`
    if (op.op === 'silent') continue
    if (op.outcome === 'hung') {
      add(
        'hung',
        op.key,
        op.start + h.cfg.hangBound,
        `${where} did not settle within ${h.cfg.hangBound} ms${op.lateEnd ? ` (settled ${op.lateEnd - op.start} ms after it started)` : ''}`,
      )
      continue
    }
    if (READS.has(op.op) || op.op === 'final-getOrLoad' || op.op === 'final-warm') {
      if (op.outcome === 'err') {
        const aborted = op.op === 'abortable' && op.name === 'AbortError'
        const timedOut = op.code === 'ERR_LOAD_TIMEOUT' && (op.op === 'slow' || slowLoaderDuring(h, op))
        // Only the test's failing loaders produce this message: the failure of one this call
        // ran or joined (no stale value to serve), or one kept for errorBackoff.
        const planned = PLANNED_FAILURE.test(String(op.message)) && LOADING_READS.has(op.op)
        if (!aborted && !timedOut && !planned) add('read-rejected', op.key, op.end, `${where} rejected: ${op.code ?? op.name}: ${op.message}`)
        continue
      }
      if (op.outcome !== 'ok') continue
      if (op.v === 'null') {
        // A negative entry: only from a loader that returned null (a 'null-load' of this key).
        if (!h.loads.some((l) => l.key === op.key && l.outcome === 'null' && l.start <= op.end))
          add('bad-value', op.key, op.end, `${where} returned null, and no loader of ${op.key} had returned null`)
      } else if (op.v === 'bad') add('bad-value', op.key, op.end, `${where} returned ${op.bad}, which no loader or writer produced`)
      else if (op.v === 'undefined' && LOADING_READS.has(op.op))
        add('bad-value', op.key, op.end, `${where} resolved with undefined; the loader never returns that`)
      else if (typeof op.v === 'number' && op.v > db.versionAt(op.key, op.end)) {
        add('bad-value', op.key, op.end, `${where} returned v${op.v} at ${fmt(op.end)}, when the database was at v${db.versionAt(op.key, op.end)}`)
      }
    } else if (WRITES.has(op.op)) {
      if (op.outcome === 'err')
        add(
          'write-rejected',
          op.key,
          op.end,
          `${where} (v${op.version}) rejected with ${op.code ?? op.name}: ${op.message} (only ERR_REDIS may reject a write)`,
        )
      else if (op.outcome === 'gave-up')
        add(
          'write-lost',
          op.key,
          op.end,
          `${where} (v${op.version}) was retried for ${op.end - op.slotAt} ms (${op.attempts.length} attempts) and never resolved; last: ${op.code}`,
        )
    }
  }

  // Read-your-writes in the writing process.
  for (const w of all) {
    if (!WRITES.has(w.op) || w.outcome !== 'ok') continue
    const tw = w.resolvedAt
    for (const r of all) {
      if (r.proc !== w.proc || r.key !== w.key || !(READS.has(r.op) || r.op === 'final-getOrLoad')) continue
      if (r.outcome !== 'ok' || typeof r.v !== 'number' || r.start <= tw || r.v >= w.version) continue
      if (LOADING_READS.has(r.op) && joinedEarlierLoad(h, all, r, tw)) continue
      if (mayBeLost(h, w)) continue
      add(
        'older-after-own-write',
        r.key,
        r.end,
        `${r.proc} #${r.i} ${r.op}(${r.key}) started ${fmt(r.start)} returned v${r.v}, after the same process's ${w.op} #${w.i} of v${w.version} resolved at ${fmt(tw)}${suspects(h, r.key, r.v, tw).text}`,
        w.start,
      )
    }
  }

  // Visibility across processes (docs/CONTRACT.md "Redis": other processes drop their copy
  // within the bus bound while Redis is healthy): once a write of version V resolved and
  // cfg.busBoundMs passed, a read started in another process returns V or newer. Not counted: a
  // read within RECOVERY_MS of a fault (Redis was not healthy), and one that may have joined a
  // load of its own process already running when the write resolved (as for read-your-writes).
  for (const w of all) {
    if (!WRITES.has(w.op) || w.outcome !== 'ok') continue
    const tw = w.resolvedAt
    for (const r of all) {
      if (r.proc === w.proc || r.key !== w.key || !(READS.has(r.op) || r.op === 'final-getOrLoad')) continue
      if (r.outcome !== 'ok' || typeof r.v !== 'number' || r.v >= w.version || r.start <= tw + h.cfg.busBoundMs) continue
      if (faultDuring(h, w.start, r.start)) continue
      if (LOADING_READS.has(r.op) && joinedEarlierLoad(h, all, r, tw)) continue
      add(
        'stale-in-other-process',
        r.key,
        r.end,
        `${r.proc} #${r.i} ${r.op}(${r.key}) started ${fmt(r.start)} returned v${r.v}, ${r.start - tw} ms after ${w.proc}'s ${w.op} #${w.i} of v${w.version} resolved at ${fmt(tw)} (bus bound ${h.cfg.busBoundMs} ms, no fault in between)${suspects(h, r.key, r.v, tw).text}`,
        w.start,
      )
    }
  }

  // Liveness: a change the cache was not told of ('silent') is in every process within a bound.
  // By S = bump + maxLoadMs + ttl * (1 + jitter) every entry holding an older version is stale
  // (a load that read it ended by then, and was fresh for at most ttl); the first getOrLoad in
  // a process after S serves it stale and starts a refresh (or another process's refresh, under
  // the lock, announces the new value); so from that read's end + maxLoadMs + busBoundMs + 1 s
  // on, every read there returns the new version. Not counted: near a fault, or with a failing
  // or slow loader of the key about (errorBackoff is shared; a timed-out refresh writes nothing).
  for (const b of all) {
    if (b.op !== 'silent' || b.outcome !== 'ok') continue
    const tb = b.slotAt
    for (const c of h.config ?? []) {
      const staleBy = tb + h.cfg.maxLoadMs + Math.ceil(c.ttl * (1 + JITTER))
      const reads = all.filter((r) => r.proc === c.name && r.key === b.key && r.outcome === 'ok').sort((x, y) => x.start - y.start)
      const trigger = reads.find((r) => (r.op === 'getOrLoad' || r.op === 'final-warm' || r.op === 'final-getOrLoad') && r.start >= staleBy)
      if (!trigger) continue
      const bound = trigger.end + h.cfg.maxLoadMs + h.cfg.busBoundMs + 1_000
      for (const r of reads) {
        if (r.start <= bound || typeof r.v !== 'number' || r.v >= b.version || !(READS.has(r.op) || r.op === 'final-warm' || r.op === 'final-getOrLoad'))
          continue
        if (faultDuring(h, tb, r.start) || troubledLoaderDuring(h, b.key, tb, r.start)) continue
        add(
          'not-refreshed',
          r.key,
          r.end,
          `${r.proc} #${r.i} ${r.op}(${r.key}) started ${fmt(r.start)} returned v${r.v}; the database changed to v${b.version} at ${fmt(tb)} without telling the cache, ${r.proc}'s entries were stale by ${fmt(staleBy)} (ttl ${c.ttl}), its read #${trigger.i} at ${fmt(trigger.start)} found it so, and no refresh brought v${b.version} by ${fmt(bound)}`,
          tb,
        )
        break // one per silent change and process
      }
    }
  }

  // Load counts: the lock and the bus make one load per key per expiry across processes. The run
  // is cut, per key, into epochs: at every multiple of the shortest ttl (an expiry), at each
  // invalidation of the key (delete, deleteByTag, a silent change; a failing or null load, which
  // retries after errorBackoff / negativeTtl) and at every clear. An epoch in which some process
  // read the key through a loader may cost one load, across all processes. Not counted: loads
  // that forceRefresh, slow, abortable and final reads asked for (they load by design), and loads
  // starting within RECOVERY_MS of a fault (without Redis each process loads for itself). Slack:
  // 25% plus one per worker (a lock that expires costs one extra load; XFetch may refresh
  // shortly before an expiry). Without the lock or the in-process coalescing a stale or cold key
  // costs a load per process or per caller, 2x to 9x: far past it.
  if (h.opsEndedAt && h.t0 !== null && h.t0 !== undefined && h.config && h.config.length) {
    const byDesign = new Set(['forceRefresh', 'slow', 'abortable', 'final-warm', 'final-getOrLoad'])
    const invalidating = new Set(['delete', 'tag-delete', 'silent', 'failing', 'null-load'])
    const opOf = new Map(all.map((op) => [`${op.proc}#${op.i}`, op]))
    const minTtl = Math.min(...h.config.map((c) => c.ttl))
    for (const key of h.keys) {
      const counted = h.loads.filter((l) => {
        if (l.key !== key || l.start > h.opsEndedAt) return false
        const op = opOf.get(`${l.proc}#${l.op}`)
        if (op && byDesign.has(op.op)) return false
        return !faultDuring(h, l.start, l.start)
      }).length
      const cuts = [h.t0]
      for (let t = h.t0 + minTtl; t < h.opsEndedAt; t += minTtl) cuts.push(t)
      for (const op of all) {
        if ((op.key === key && invalidating.has(op.op)) || op.op === 'clear') cuts.push(op.op === 'silent' ? op.slotAt : (op.end ?? op.start))
      }
      cuts.sort((a, b) => a - b)
      const reads = all
        .filter(
          (op) => op.key === key && op.start >= h.t0 && op.start <= h.opsEndedAt && (op.op === 'getOrLoad' || op.op === 'failing' || op.op === 'null-load'),
        )
        .map((op) => op.start)
      let epochs = 0
      for (let i = 0; i < cuts.length; i++) {
        const a = cuts[i]
        const b = cuts[i + 1] ?? Infinity
        if (reads.some((t) => t >= a && t < b)) epochs++
      }
      const allowed = Math.ceil(epochs * 1.25) + h.config.length
      if (counted > allowed) {
        add(
          'excess-loads',
          key,
          h.opsEndedAt,
          `${counted} loader calls of ${key} outside fault windows, in ${epochs} epochs that needed at most one load each (expiries of the ${minTtl} ms ttl, invalidations, clears); at most ${allowed} allowed`,
        )
      }
    }
  }

  // After the run settled.
  if (h.db) {
    for (const f of h.finals) {
      if (f.outcome !== 'ok') continue // reported above
      if (f.v !== h.db[f.key]) {
        if (typeof f.v === 'number' && f.v < h.db[f.key] && lostInFailover(h, f.key)) {
          h.lostInFailover.push({ key: f.key, where: `${f.proc} final read`, v: f.v })
          continue
        }
        const entry = f.entry
          ? ` (before the read its entry was ${f.entry.state}, freshUntil ${fmt(f.entry.freshUntil)}, hardUntil ${fmt(f.entry.hardUntil)})`
          : ' (no entry before the read)'
        const who = suspects(h, f.key, f.v, null)
        add(
          'final-read',
          f.key,
          f.end,
          `${f.proc} getOrLoad(${f.key}) after the run returned ${typeof f.v === 'number' ? `v${f.v}` : f.v}; the database holds v${h.db[f.key]}${entry}${who.text}`,
          who.from,
        )
      }
    }
    for (const [label, snap] of [
      ['before the final reads', h.redisBefore],
      ['after the final reads', h.redisAfter],
    ]) {
      if (!snap) continue
      for (const key of h.keys) {
        const { v, raw } = snap[key]
        if (v !== null && v !== h.db[key]) {
          if (typeof v === 'number' && v < h.db[key] && lostInFailover(h, key)) {
            h.lostInFailover.push({ key, where: `Redis ${label}`, v })
            continue
          }
          const what = v === 'bad' ? `something unreadable: ${raw}` : `v${v}`
          const who = suspects(h, key, v, null)
          add(
            'final-redis',
            key,
            label.startsWith('before') ? h.checkedAt : h.endedAt,
            `Redis ${h.namespace}:v:{${key}} ${label} holds ${what}; the database holds v${h.db[key]}${who.text}`,
            who.from,
          )
        }
      }
    }
  }
  return out
}

/**
 * Where an obsolete v of `key` may have come from: loader calls (any process) that read v and ended
 * after the database had moved past v (their snapshot was overtaken while they ran; fencing must
 * keep such a result out of every tier), last first; `since`: only those ending after it.
 * Returns { text, from: the earliest one's start, for the history window }.
 */
function suspects(h, key, v, since) {
  const none = { text: '', from: undefined }
  if (typeof v !== 'number') return none
  const overtaken = h.bumps.find((b) => b.key === key && b.version === v + 1)
  if (!overtaken) return none
  const found = h.loads
    .filter((l) => l.key === key && l.read === v && (l.end ?? Infinity) > overtaken.t && (since === null || (l.end ?? Infinity) > since))
    .sort((a, b) => (b.end ?? Infinity) - (a.end ?? Infinity))
    .slice(0, 3)
  if (found.length === 0) return none
  const list = found.map((l) => `${l.proc} loader (op #${l.op}) ${span(h, l.start, l.end)}${l.slow ? ' slow' : ''}${l.stale !== undefined ? ' refresh' : ''}`)
  return {
    text: `. Loads that read v${v} and outlived it (v${v + 1} at ${rel(h, overtaken.t)}): ${list.join('; ')}`,
    from: Math.min(...found.map((l) => l.start)),
  }
}

/** A fault started before `to` and ended (plus RECOVERY_MS) after `from`. */
function faultDuring(h, from, to) {
  return h.faults.some((f) => f.start <= to && (f.end ?? Infinity) + RECOVERY_MS >= from)
}

/** A failing or slow loader of `key` (any process) ran around [from, to] (errorBackoff before it included). */
function troubledLoaderDuring(h, key, from, to) {
  const backoff = h.cfg.maxErrorBackoff ?? 5_000
  return h.loads.some((l) => l.key === key && (l.slow || l.outcome === 'throws') && l.start <= to && (l.end ?? Infinity) + backoff + RECOVERY_MS >= from)
}

/** A loader slower than loadTimeout ran in op's process on op's key while op waited. */
function slowLoaderDuring(h, op) {
  return h.loads.some((l) => l.slow && l.proc === op.proc && l.key === op.key && l.start <= op.end && (l.end ?? Infinity) >= op.start)
}

/**
 * `r` may have joined a load of its process that was running when the write resolved (at `tw`)
 * and returned what that load read: a loader call that started before tw and read r.v, or a
 * getOrLoad call that started before tw and resolved with r.v, still running when r started.
 */
function joinedEarlierLoad(h, all, r, tw) {
  const sameLoad = (x) => x.proc === r.proc && x.key === r.key && x.start < tw
  if (h.loads.some((l) => sameLoad(l) && l.read === r.v && (l.end ?? Infinity) >= r.start)) return true
  return all.some((g) => g !== r && LOADING_READS.has(g.op) && sameLoad(g) && g.v === r.v && (g.end ?? Infinity) >= r.start)
}

// ---- reports ---------------------------------------------------------------------------------

function rel(h, t) {
  if (t === null || t === undefined) return '?'
  const ms = t - (h.t0 ?? h.startedAt)
  return `${ms >= 0 ? '+' : ''}${ms}ms`
}

function span(h, a, b) {
  return `[${rel(h, a)}..${b === null || b === undefined ? 'unfinished' : rel(h, b)}]`
}

function describeOp(h, op) {
  const head = `${op.proc}.${op.client} #${op.i} ${op.op} ${op.key} ${span(h, op.start, op.end)}`
  if (WRITES.has(op.op)) {
    const attempts = (op.attempts ?? []).map((a) => `${a.outcomes.join('+')}${span(h, a.start, a.end)}`).join(', ')
    const versions = op.op === 'set-set' ? `v${op.version - 1},v${op.version}` : op.op === 'set' ? `v${op.version}` : `(db v${op.version})`
    return `${head} ${versions} slot at ${rel(h, op.slotAt)} -> ${op.outcome}; attempts: ${attempts}`
  }
  let result
  if (op.outcome === 'ok') result = typeof op.v === 'number' ? `v${op.v}` : op.v === 'bad' ? `BAD ${op.bad}` : op.v
  else if (op.outcome === 'err') result = `rejected ${op.code ?? op.name}`
  else result = op.outcome
  const extra = [
    op.delay !== undefined ? `its loader would take ${op.delay} ms` : null,
    op.abortAfter !== undefined ? `abort at ${op.abortAfter} ms` : null,
    op.entry ? `entry ${op.entry.state}` : null,
  ].filter(Boolean)
  return `${head} -> ${result}${extra.length ? ` (${extra.join(', ')})` : ''}`
}

function describeFault(h, f) {
  const on = f.node ? ` on :${f.node}${f.role ? ` (${f.role})` : ''}` : ''
  let what
  if (f.kind === 'pause') what = `pause ${f.ms} ms${on}`
  else if (f.kind === 'restart') what = `restart ${f.signal}`
  else if (f.kind === 'pause-sentinel') what = `pause of the sentinel ${f.ms} ms${on}`
  else if (f.kind === 'failover')
    what = `failover (${f.how}) of master :${f.node}${f.newMaster ? `; replica :${f.newMaster} promoted after ${f.promotedMs} ms` : ''}`
  else if (f.kind === 'kill-master') {
    what = `kill-master SIGKILL :${f.node ?? '?'} (owns ${(f.keys ?? []).join(' ') || '?'})`
    if (f.newMaster)
      what += `; replica :${f.newMaster} promoted at ${rel(h, f.killedAt + f.promotedMs)}, every node agreed at ${rel(h, f.killedAt + f.settledMs)}`
  } else what = `${f.kind}${on} (${f.killed ?? '?'} clients)`
  return `${what} ${span(h, f.start, f.end)}${f.error ? ` error: ${f.error}` : ''}`
}

/**
 * The history of `key` across processes from `from` (or as far back as `n` events go) to `until`
 * (+100 ms), at most `n` events: when more, the first quarter and the last three quarters.
 */
function historyOf(h, key, until, n = 40, from = null) {
  const events = []
  for (const b of h.bumps) if (b.key === key) events.push({ t: b.t, text: `db       ${key} := v${b.version} (writer in ${b.by})` })
  for (const op of [...h.ops, ...h.finals]) if (op.key === key) events.push({ t: op.start, text: describeOp(h, op) })
  for (const l of h.loads) {
    if (l.key !== key) continue
    const flags = [
      l.slow ? 'slow' : null,
      l.stale !== undefined ? `stale v${l.stale}` : null,
      l.abortedAt ? `signal aborted ${rel(h, l.abortedAt)}` : null,
    ].filter(Boolean)
    events.push({
      t: l.start,
      text: `loader   ${l.proc} (op #${l.op}) ${key} ${span(h, l.start, l.end)} read v${l.read} at ${rel(h, l.readAt)}${flags.length ? ` (${flags.join(', ')})` : ''}`,
    })
  }
  for (const f of h.faults) events.push({ t: f.start, text: `FAULT    ${describeFault(h, f)}` })
  for (const r of h.reports) {
    for (const e of r.errors.samples) if (e.key === key) events.push({ t: e.at, text: `onError  ${r.proc} ${e.op} ${e.code}: ${e.message}` })
  }
  const limit = (until ?? Infinity) + 100
  const start = from === null ? -Infinity : from - 300
  const all = events.filter((e) => e.t <= limit && e.t >= start).sort((a, b) => a.t - b.t)
  const line = (e) => `  ${rel(h, e.t).padStart(9)}  ${e.text}`
  if (all.length <= n) return all.map(line)
  if (from === null) return all.slice(-n).map(line)
  const head = Math.floor(n / 4)
  return [...all.slice(0, head).map(line), `  ... ${all.length - n} events ...`, ...all.slice(-(n - head)).map(line)]
}

/** The modes a replay names (`npm run soak -- --seed S --<mode>`). */
const SPECIAL_MODES = new Set(['cluster', 'tls', 'mtls', 'sentinel'])

/** One violation, with the seed, how to replay it and the key's history. */
function formatViolation(h, v, { historyLines = 40 } = {}) {
  const special = SPECIAL_MODES.has(h.mode)
  const lines = [
    `[seed ${h.seed}${special ? ` ${h.mode}` : ''}] ${v.kind}: ${v.message}`,
    `  replay: npm run soak -- --seed ${h.seed}${special ? ` --${h.mode}` : ''}`,
  ]
  if (v.key) {
    lines.push(`  history of ${v.key} (ms from the run's start; db = the database; writers hold a per-key slot):`)
    lines.push(...historyOf(h, v.key, v.at, historyLines, v.from ?? null))
  }
  return lines.join('\n')
}

/** Every violation kind with its count, and the first `max` in full. */
function formatViolations(h, { max = 4, historyLines = 40 } = {}) {
  if (h.violations.length === 0) return `[seed ${h.seed}] no violation`
  const byKind = countBy(h.violations, (v) => v.kind)
  const head = `[seed ${h.seed}] ${h.violations.length} violation(s): ${Object.entries(byKind)
    .map(([k, n]) => `${k} x${n}`)
    .join(', ')}`
  // The first of each kind first, so one noisy kind does not hide another.
  const firsts = Object.keys(byKind).map((k) => h.violations.find((v) => v.kind === k))
  const rest = h.violations.filter((v) => !firsts.includes(v))
  const shown = [...firsts, ...rest].slice(0, max)
  return [head, ...shown.map((v) => formatViolation(h, v, { historyLines })), h.violations.length > max ? `  ... and ${h.violations.length - max} more` : '']
    .filter(Boolean)
    .join('\n')
}

function countBy(items, fn) {
  const out = {}
  for (const x of items) {
    const k = fn(x)
    out[k] = (out[k] ?? 0) + 1
  }
  return out
}

/** The drawn configuration in one phrase: serializer, tags, each worker's l1. */
function describeConfig(h) {
  const l1 = h.config.map((c) => (c.l1 === false ? 'off' : c.l1 && c.l1.maxBytes ? `${c.l1.maxBytes}B` : 'lru')).join('/')
  return `${h.cfg.serializer ?? 'json'}${h.cfg.tags ? '+tags' : ''} l1 ${l1}`
}

/** One line: operations, faults, loader calls, writes that needed retries, violations. */
function summarize(h) {
  const ops = h.ops.length
  const faults = countBy(h.faults, (f) => f.kind)
  const retried = h.ops.filter((o) => WRITES.has(o.op) && (o.attempts?.length ?? 0) > 1).length
  const rejectedWrites = h.ops.filter((o) => WRITES.has(o.op) && (o.attempts ?? []).some((a) => a.outcomes.some((x) => x === 'ERR_REDIS'))).length
  const redisErrors = h.reports.reduce((s, r) => s + (r.stats?.redisErrors ?? 0), 0)
  let cluster = ''
  if (h.mode === 'cluster') {
    const kill = h.faults.find((f) => f.kind === 'kill-master')
    const c = h.cluster
    const moved = c && c.before && c.after ? h.keys.filter((k) => c.before.owners[k] !== c.after.owners[k]).length : '?'
    const others = c && c.before && c.after ? c.after.masters.filter((p) => !c.before.masters.includes(p) && p !== kill?.newMaster).length : 0
    cluster =
      `, cluster: ${kill ? (kill.newMaster ? `master :${kill.node} killed at ${rel(h, kill.killedAt)}, :${kill.newMaster} promoted after ${kill.promotedMs} ms (agreed ${kill.settledMs} ms)` : `master kill failed: ${kill.error}`) : 'no master killed'}` +
      `${others ? `, ${others} more failover(s) from pauses` : ''}, ${moved}/${h.keys.length} keys changed master`
  }
  if (h.mode === 'sentinel') {
    const fo = h.faults.find((f) => f.kind === 'failover')
    cluster = `, sentinel: ${
      !fo ? 'no failover' : fo.newMaster ? `${fo.how} of :${fo.node}, :${fo.newMaster} promoted after ${fo.promotedMs} ms` : `failover failed: ${fo.error}`
    }${h.lostInFailover && h.lostInFailover.length ? `, ${h.lostInFailover.length} final state(s) from writes lost in the failover window` : ''}`
  }
  return (
    `seed ${h.seed}${SPECIAL_MODES.has(h.mode) ? ` [${h.mode}]` : ''}: ${ops} ops (${h.ops.filter((o) => WRITES.has(o.op)).length} writes, ${rejectedWrites} met ERR_REDIS, ${retried} retried), ` +
    `${h.loads.length} loader calls, ${h.faults.length} faults (${
      Object.entries(faults)
        .map(([k, n]) => `${k} ${n}`)
        .join(', ') || 'none'
    }), ` +
    `redisErrors ${redisErrors}${cluster}, config ${describeConfig(h)}, ${h.violations.length} violations ` +
    `(${((h.endedAt - h.startedAt) / 1000).toFixed(1)} s)`
  )
}

module.exports = {
  mulberry32,
  streamSeed,
  makeRand,
  runHistory,
  clusterUsable,
  checkHistory,
  formatViolation,
  formatViolations,
  summarize,
  historyOf,
  countBy,
  DEFAULTS,
}
