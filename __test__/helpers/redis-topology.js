'use strict'
// Real Redis deployments for __test__/redis-deployments.test.js: TLS with a throwaway
// CA, ACL users, a 3-master 3-replica Redis Cluster and a Sentinel-managed primary, each built
// from `redis-server` processes on free 127.0.0.1 ports (never 6379, never another address).
//
// - makeCertificates(dir): a private CA, a server certificate for 127.0.0.1/localhost, a client
//   certificate, and a second CA nobody trusts (with its own client certificate), made by openssl.
// - RedisNode: one redis-server (plain, TLS, cluster node or sentinel) from a generated config
//   file; `cmd`/`pipeline` speak RESP to it (over TLS and with AUTH when the node needs them).
// - addAclUser / protectDefaultUser / aclDryRun: ACL users restricted to one namespace.
// - RedisCluster: start, CLUSTER INFO ok everywhere, the master owning a key's slot, and
//   killMaster (SIGKILL, then wait until a replica is promoted and every node agrees).
// - RedisSentinelGroup: a master, a replica and a sentinel; killMaster waits until the sentinel
//   names the promoted replica.
//
// Every process is stopped by PID in dispose(), and killed when the test process exits.
//
// `node __test__/helpers/redis-topology.js --self-check` starts each deployment, checks it with
// redis-cli, measures the failovers and prints what it found.

const { spawn, execFile, execFileSync } = require('node:child_process')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const net = require('node:net')
const tls = require('node:tls')
const { freePort, encodeCommand, parseReply, RespError, sleep, waitFor } = require('./redis-server')

const HOST = '127.0.0.1'

// ---- cleanup: nothing started here outlives the test process -------------------------------

const live = new Set()

function killTopologySync() {
  for (const child of live) {
    try {
      child.kill('SIGKILL')
    } catch {
      // already gone
    }
  }
  live.clear()
}

// redis-server.js turns SIGINT/SIGTERM/SIGHUP into process.exit, which runs this too.
process.on('exit', killTopologySync)

function track(child) {
  live.add(child)
  child.once('exit', () => live.delete(child))
  return child
}

function tmpDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix))
}

// ---- certificates --------------------------------------------------------------------------

// EC P-256 keys: generated in milliseconds, and accepted by both OpenSSL (redis-server) and rustls.
// Explicit extensions, because webpki (rustls) insists on CA:TRUE + keyCertSign for a CA, CA:FALSE
// and the right extendedKeyUsage for leaves, and matches 127.0.0.1 only against an IP SAN.
const OPENSSL_CNF = `
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`

function openssl(dir, args) {
  try {
    execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], timeout: 20_000 })
  } catch (err) {
    throw new Error(`openssl ${args.join(' ')} failed: ${err.stderr ? err.stderr.toString() : err.message}`)
  }
}

const EC_KEY = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes']

function makeCa(dir, name, cn) {
  openssl(dir, [
    'req',
    '-x509',
    '-new',
    ...EC_KEY,
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.crt`,
    '-days',
    '2',
    '-subj',
    `/CN=${cn}`,
    '-config',
    'openssl.cnf',
    '-extensions',
    'ca_ext',
  ])
}

function makeLeaf(dir, name, cn, ca, ext) {
  openssl(dir, ['req', '-new', ...EC_KEY, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`, '-config', 'openssl.cnf'])
  const serial = `0x${crypto.randomBytes(8).toString('hex')}`
  openssl(dir, [
    'x509',
    '-req',
    '-in',
    `${name}.csr`,
    '-CA',
    `${ca}.crt`,
    '-CAkey',
    `${ca}.key`,
    '-set_serial',
    serial,
    '-days',
    '2',
    '-out',
    `${name}.crt`,
    '-extfile',
    'openssl.cnf',
    '-extensions',
    ext,
  ])
}

/**
 * A throwaway PKI in `dir`: `ca` (trusted by the servers and by well-configured clients), a server
 * certificate for 127.0.0.1 and localhost, a client certificate (CN=app), and `otherCa`, an
 * unrelated CA, with a client certificate of its own. Returns file paths and PEM strings.
 */
function makeCertificates(dir) {
  fs.mkdirSync(dir, { recursive: true })
  fs.writeFileSync(path.join(dir, 'openssl.cnf'), OPENSSL_CNF)
  makeCa(dir, 'ca', 'stampede-cache test CA')
  makeLeaf(dir, 'server', 'localhost', 'ca', 'server_ext')
  makeLeaf(dir, 'client', 'app', 'ca', 'client_ext')
  makeCa(dir, 'other-ca', 'untrusted test CA')
  makeLeaf(dir, 'other-client', 'intruder', 'other-ca', 'client_ext')
  const file = (name) => path.join(dir, name)
  const pem = (name) => fs.readFileSync(file(name), 'utf8')
  return {
    dir,
    caFile: file('ca.crt'),
    serverCertFile: file('server.crt'),
    serverKeyFile: file('server.key'),
    clientCertFile: file('client.crt'),
    clientKeyFile: file('client.key'),
    otherCaFile: file('other-ca.crt'),
    otherClientCertFile: file('other-client.crt'),
    otherClientKeyFile: file('other-client.key'),
    ca: pem('ca.crt'),
    clientCert: pem('client.crt'),
    clientKey: pem('client.key'),
    otherCa: pem('other-ca.crt'),
    otherClientCert: pem('other-client.crt'),
    otherClientKey: pem('other-client.key'),
  }
}

// ---- RESP over TCP or TLS ------------------------------------------------------------------

/**
 * Sends `commands` on one fresh connection to `endpoint` ({ port, tls?: node:tls options,
 * auth?: [user, password] }) and resolves with their replies in order (error replies as RespError
 * values). With `auth`, an AUTH goes first; its failure rejects. Rejects on connection or TLS
 * errors, or when no full answer came within `timeout` ms.
 */
function respPipeline(endpoint, commands, { timeout = 2_000 } = {}) {
  const all = endpoint.auth ? [['AUTH', ...endpoint.auth], ...commands] : commands
  return new Promise((resolve, reject) => {
    const socket = endpoint.tls ? tls.connect({ host: HOST, port: endpoint.port, ...endpoint.tls }) : net.connect({ host: HOST, port: endpoint.port })
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
    const timer = setTimeout(
      () => finish(new Error(`redis ${commands.map((c) => c[0]).join(',')} on :${endpoint.port} timed out after ${timeout} ms`)),
      timeout,
    )
    socket.once('error', (err) => finish(err))
    socket.once('close', () => finish(new Error(`redis connection to :${endpoint.port} closed before the reply`)))
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk])
      const replies = []
      let i = 0
      for (let k = 0; k < all.length; k++) {
        const r = parseReply(buf, i)
        if (r === null) return // wait for more
        replies.push(r.value)
        i = r.next
      }
      if (endpoint.auth) {
        const authReply = replies.shift()
        if (authReply instanceof RespError) return finish(authReply)
      }
      finish(null, replies)
    })
    socket.write(Buffer.concat(all.map(encodeCommand)))
  })
}

/** `INFO`-style text ("k:v" lines) as an object. */
function parseInfo(text) {
  const out = {}
  for (const line of String(text).split(/\r?\n/)) {
    const i = line.indexOf(':')
    if (i > 0 && !line.startsWith('#')) out[line.slice(0, i)] = line.slice(i + 1)
  }
  return out
}

// ---- one redis-server ----------------------------------------------------------------------

const quote = (s) => `"${String(s).replace(/(["\\])/g, '\\$1')}"`

/**
 * One redis-server (or sentinel) on a free 127.0.0.1 port, run from a generated config file in
 * `dir` (sentinels and CONFIG REWRITE, which a Sentinel promotion issues, need one).
 *
 * options:
 *   tls: { certs, authClients: 'no' | 'optional' | 'yes' }  serve TLS only (`port 0`, `tls-port`)
 *   conf: (port) => string[] | Promise<string[]>             extra config lines
 *   sentinel: true                                           run as `redis-server <conf> --sentinel`
 *   auth: [user, password]                                   what cmd()/pipeline() authenticate as
 */
class RedisNode {
  constructor(name, { dir, tls: tlsOptions = null, conf = () => [], sentinel = false, auth = null } = {}) {
    this.name = name
    this.dir = dir ?? tmpDir('sc-topo-node-')
    this.ownDir = dir === undefined
    this.tlsOptions = tlsOptions
    this.confLines = conf
    this.sentinel = sentinel
    this.auth = auth
    this.paused = false
    this.port = null
    this.proc = null
    this.pid = null
    this.log = ''
  }

  get scheme() {
    return this.tlsOptions ? 'rediss' : 'redis'
  }

  get url() {
    return `${this.scheme}://${HOST}:${this.port}`
  }

  get alive() {
    return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null
  }

  /** How cmd() reaches this node: with the trusted CA and the client certificate over TLS. */
  get endpoint() {
    const c = this.tlsOptions && this.tlsOptions.certs
    return {
      port: this.port,
      auth: this.auth,
      tls: c ? { ca: c.ca, cert: c.clientCert, key: c.clientKey } : null,
    }
  }

  async start() {
    if (this.proc) throw new Error(`${this.name} is already running`)
    for (let attempt = 0; ; attempt++) {
      this.port = await freePort()
      if (this.port === 6379) continue
      try {
        await this.#spawnAndWait()
        return this
      } catch (err) {
        // Someone took the port between freePort() and the listen: try another one.
        if (attempt >= 3 || !/Address already in use|bind|Could not create/i.test(this.log)) throw err
      }
    }
  }

  async #spawnAndWait() {
    const port = this.port
    const t = this.tlsOptions
    const lines = [`bind ${HOST}`, t ? 'port 0' : `port ${port}`, `dir ${quote(this.dir)}`, 'daemonize no', 'loglevel warning', 'logfile ""']
    // A replica's first sync would otherwise wait 5 s (repl-diskless-sync-delay) for more replicas.
    if (!this.sentinel) lines.push('save ""', 'appendonly no', 'repl-diskless-sync-delay 0')
    if (t) {
      lines.push(
        `tls-port ${port}`,
        `tls-cert-file ${quote(t.certs.serverCertFile)}`,
        `tls-key-file ${quote(t.certs.serverKeyFile)}`,
        `tls-ca-cert-file ${quote(t.certs.caFile)}`,
        `tls-auth-clients ${t.authClients ?? 'optional'}`,
      )
    }
    lines.push(...(await this.confLines(port)))
    const confFile = path.join(this.dir, `${this.name}-${port}.conf`)
    fs.writeFileSync(confFile, `${lines.join('\n')}\n`)
    const args = this.sentinel ? [confFile, '--sentinel'] : [confFile]
    this.log = ''
    const proc = track(spawn(process.env.REDIS_SERVER || 'redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] }))
    this.proc = proc
    this.pid = proc.pid
    const keep = (chunk) => {
      this.log = (this.log + chunk.toString()).slice(-8_000)
    }
    proc.stdout.on('data', keep)
    proc.stderr.on('data', keep)
    proc.once('exit', () => {
      if (this.proc === proc) this.proc = null
    })
    const deadline = Date.now() + 10_000
    while (Date.now() < deadline) {
      if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`${this.name} (redis-server) exited at start:\n${this.log}`)
      try {
        if ((await this.cmd('PING')) === 'PONG') return
      } catch {
        // not listening yet
      }
      await sleep(25)
    }
    proc.kill('SIGKILL')
    throw new Error(`${this.name} did not answer PING within 10 s:\n${this.log}`)
  }

  /** Stopped by `signal` and started again on the same port, from the same config (empty:
   * nothing is saved). */
  async restart(signal = 'SIGTERM') {
    this.resume()
    await this.kill(signal)
    await this.#spawnAndWait()
  }

  /** Starts it again on its port if it is not running. */
  async revive() {
    if (!this.alive) await this.#spawnAndWait()
  }

  /** SIGSTOP: the server holds its connections and answers nothing until `resume`. */
  pause() {
    if (!this.alive) throw new Error(`${this.name} is not running`)
    process.kill(this.proc.pid, 'SIGSTOP')
    this.paused = true
  }

  resume() {
    if (this.paused && this.alive) process.kill(this.proc.pid, 'SIGCONT')
    this.paused = false
  }

  /** Stops the process by PID (SIGKILL by default: a crash) and waits for it to exit. */
  async kill(signal = 'SIGKILL') {
    const proc = this.proc
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) {
      this.proc = null
      return
    }
    const exited = new Promise((resolve) => proc.once('exit', resolve))
    process.kill(proc.pid, signal)
    const timer = setTimeout(() => {
      try {
        process.kill(proc.pid, 'SIGKILL')
      } catch {
        // gone meanwhile
      }
    }, 5_000)
    await exited
    clearTimeout(timer)
    this.proc = null
  }

  async dispose() {
    this.resume()
    await this.kill('SIGKILL')
    if (this.ownDir) fs.rmSync(this.dir, { recursive: true, force: true })
  }

  /** One command; an error reply rejects. */
  async cmd(...args) {
    const [reply] = await respPipeline(this.endpoint, [args], { timeout: 2_000 })
    if (reply instanceof RespError) throw reply
    return reply
  }

  /** Several commands on one connection (error replies as RespError values). */
  pipeline(commands, options) {
    return respPipeline(this.endpoint, commands, options)
  }

  async info(section) {
    return parseInfo(await this.cmd('INFO', section))
  }
}

// ---- ACL -----------------------------------------------------------------------------------

/**
 * `ACL SETUSER <user> on ><password> ~<ns>:* &<ns>:* +@all -@dangerous`: every key and channel of
 * the namespace, every command but the dangerous ones (KEYS, FLUSHDB, CONFIG, INFO, ROLE, ...).
 */
async function addAclUser(node, { user, password, namespace }) {
  await node.cmd('ACL', 'SETUSER', user, 'reset', 'on', `>${password}`, `~${namespace}:*`, `&${namespace}:*`, '+@all', '-@dangerous')
}

/** Gives the default user a password, so nothing reaches the server without AUTH; cmd() then uses it. */
async function protectDefaultUser(node, password) {
  await node.cmd('ACL', 'SETUSER', 'default', 'on', 'resetpass', `>${password}`)
  node.auth = ['default', password]
}

/** `ACL DRYRUN` of each command (arrays of args): { 'GET ns:a': 'OK' | the refusal }. */
async function aclDryRun(node, user, commands) {
  const replies = await node.pipeline(commands.map((c) => ['ACL', 'DRYRUN', user, ...c]))
  const out = {}
  commands.forEach((c, i) => {
    out[c.join(' ')] = replies[i] instanceof RespError ? replies[i].message : replies[i]
  })
  return out
}

/** What the Redis tier sends (and what the redis crate sends while connecting), for aclDryRun. */
function tierCommands(ns) {
  const v = `${ns}:v:{k}`
  const l = `${ns}:lock:{k}`
  return [
    ['PING'],
    ['HELLO', '3'],
    ['SELECT', '0'],
    ['CLIENT', 'SETNAME', 'x'],
    ['GET', v],
    ['SET', v, 'x', 'PX', '1000'],
    ['SET', l, 'token', 'NX', 'PX', '1000'],
    ['DEL', v],
    ['UNLINK', v],
    ['INCR', `${ns}:gen`],
    ['PEXPIRE', v, '1000'],
    ['PTTL', v],
    ['EVAL', "return redis.call('GET', KEYS[1])", '2', v, l],
    ['EVALSHA', '0000000000000000000000000000000000000000', '2', v, l],
    ['SCRIPT', 'LOAD', 'return 1'],
    ['SCRIPT', 'EXISTS', '0000000000000000000000000000000000000000'],
    ['PUBLISH', `${ns}:bus`, 'x'],
    ['SUBSCRIBE', `${ns}:bus`],
    ['SPUBLISH', `${ns}:bus`, 'x'],
    ['SSUBSCRIBE', `${ns}:bus`],
    ['MULTI'],
    ['EXEC'],
    ['SCAN', '0', 'MATCH', `${ns}:*`],
    ['SADD', `${ns}:tag:{t}`, 'k'],
    ['SMEMBERS', `${ns}:tag:{t}`],
    ['CLUSTER', 'SLOTS'],
    ['CLUSTER', 'SHARDS'],
    ['READONLY'],
    ['ROLE'],
    ['INFO', 'replication'],
    ['KEYS', `${ns}:*`],
    ['FLUSHDB'],
    ['GET', 'elsewhere:v:{k}'],
    ['PUBLISH', 'elsewhere:bus', 'x'],
  ]
}

// ---- Redis Cluster -------------------------------------------------------------------------

/** `CLUSTER NODES` as [{ id, port, flags: Set, masterId, slots: string[] }]. */
function parseClusterNodes(text) {
  return String(text)
    .trim()
    .split(/\r?\n/)
    .filter(Boolean)
    .map((line) => {
      const [id, addr, flags, masterId, , , , linkState, ...slots] = line.split(' ')
      return { id, port: Number(addr.split('@')[0].split(':').pop()), flags: new Set(flags.split(',')), masterId, linkState, slots }
    })
}

/** `CLUSTER SLOTS` as [{ start, end, master: port, replicas: [port] }]. */
function parseClusterSlots(reply) {
  return reply.map(([start, end, master, ...replicas]) => ({ start, end, master: master[1], replicas: replicas.map((r) => r[1]) }))
}

class RedisCluster {
  /** `nodeTimeout`: cluster-node-timeout, the main term of how long a failover takes. */
  constructor({ masters = 3, replicasPerMaster = 1, nodeTimeout = 1_000 } = {}) {
    this.masterCount = masters
    this.replicasPerMaster = replicasPerMaster
    this.nodeTimeout = nodeTimeout
    this.dir = tmpDir('sc-topo-cluster-')
    this.nodes = []
  }

  get liveNodes() {
    return this.nodes.filter((n) => n.alive)
  }

  /** Seed URLs (every node, so a client can start from any that is up). */
  get seedUrls() {
    return this.liveNodes.map((n) => n.url)
  }

  async start({ timeout = 30_000 } = {}) {
    const total = this.masterCount * (1 + this.replicasPerMaster)
    const nodeTimeout = this.nodeTimeout
    this.nodes = Array.from(
      { length: total },
      (_, i) =>
        new RedisNode(`cluster${i}`, {
          dir: this.dir,
          conf: async (port) => [
            'cluster-enabled yes',
            `cluster-config-file nodes-${port}.conf`,
            `cluster-node-timeout ${nodeTimeout}`,
            // The bus port defaults to port + 10000, which may be taken or beyond 65535.
            `cluster-port ${await freePort()}`,
            // A replica that lost its master a little while ago may still be promoted.
            'cluster-replica-validity-factor 0',
          ],
        }),
    )
    await Promise.all(this.nodes.map((n) => n.start()))
    await execFileP(
      'redis-cli',
      ['--cluster', 'create', ...this.nodes.map((n) => `${HOST}:${n.port}`), '--cluster-replicas', String(this.replicasPerMaster), '--cluster-yes'],
      { timeout },
    )
    // Right after creation every replica must have attached too: a master killed before its
    // replica attached has nobody to take over (seen once in 15 fresh clusters).
    await this.waitHealthy({ timeout, replicas: this.masterCount * this.replicasPerMaster })
    return this
  }

  /**
   * Every live node says cluster_state:ok, knows the expected masters with all 16384 slots, sees
   * at least `replicas` replicas attached, and every replica's link to its master is up (a
   * replica that never synced cannot take over).
   */
  async waitHealthy({ timeout = 30_000, masters = this.masterCount, replicas = 0 } = {}) {
    await waitFor(
      async () => {
        for (const n of this.liveNodes) {
          const [infoText, nodesText, repl] = await n
            .pipeline([
              ['CLUSTER', 'INFO'],
              ['CLUSTER', 'NODES'],
              ['INFO', 'replication'],
            ])
            .catch(() => [])
          if (typeof infoText !== 'string' || typeof nodesText !== 'string') return false
          const info = parseInfo(infoText)
          if (info.cluster_state !== 'ok' || info.cluster_slots_assigned !== '16384') return false
          const view = parseClusterNodes(nodesText)
          const liveMasters = view.filter((x) => x.flags.has('master') && !x.flags.has('fail') && x.slots.length > 0)
          if (liveMasters.length !== masters) return false
          const attached = view.filter((x) => x.flags.has('slave') && !x.flags.has('fail') && x.masterId !== '-')
          if (attached.length < replicas) return false
          const r = parseInfo(repl)
          if (r.role === 'slave' && r.master_link_status !== 'up') return false
        }
        return true
      },
      { timeout, interval: 100, what: 'the cluster to be healthy on every node' },
    )
  }

  /** CLUSTER SLOTS, asked of the first live node that answers. */
  async slotMap() {
    let lastErr
    for (const n of this.liveNodes) {
      try {
        return parseClusterSlots(await n.cmd('CLUSTER', 'SLOTS'))
      } catch (err) {
        lastErr = err
      }
    }
    throw lastErr ?? new Error('no live cluster node')
  }

  /** The hash slot of each Redis key (CLUSTER KEYSLOT, one round trip). */
  async keySlots(redisKeys) {
    const node = this.liveNodes[0]
    const replies = await node.pipeline(redisKeys.map((k) => ['CLUSTER', 'KEYSLOT', k]))
    return replies.map((r) => {
      if (r instanceof RespError) throw r
      return r
    })
  }

  nodeByPort(port) {
    const n = this.nodes.find((x) => x.port === port)
    if (!n) throw new Error(`no cluster node on port ${port}`)
    return n
  }

  /** The node that owns `slot` now, by CLUSTER SLOTS. */
  async masterOfSlot(slot) {
    const range = (await this.slotMap()).find((r) => slot >= r.start && slot <= r.end)
    if (!range) throw new Error(`slot ${slot} is not served`)
    return this.nodeByPort(range.master)
  }

  /** The node that owns the slot of the Redis key `redisKey`. */
  async masterOfKey(redisKey) {
    const [slot] = await this.keySlots([redisKey])
    return this.masterOfSlot(slot)
  }

  /**
   * The replicas of `master`, by CLUSTER NODES (CLUSTER SLOTS leaves out a replica whose
   * replication offset it has not yet heard of, as after a cluster has just been created).
   */
  async replicasOf(master) {
    const view = parseClusterNodes(await master.cmd('CLUSTER', 'NODES'))
    const me = view.find((x) => x.flags.has('myself'))
    return view.filter((x) => x.masterId === me.id && x.flags.has('slave')).map((x) => this.nodeByPort(x.port))
  }

  /** The masters that serve slots now. */
  async masters() {
    const ports = [...new Set((await this.slotMap()).map((r) => r.master))]
    return ports.map((p) => this.nodeByPort(p))
  }

  /**
   * SIGKILLs `master` (a crash, not CLUSTER FAILOVER) and waits until one of its replicas has
   * been promoted and every live node agrees on the new owner of its slots with cluster_state:ok.
   * Returns { newMaster, promotedMs (the replica calls itself master), settledMs (everyone agrees) }.
   */
  async killMaster(master, { timeout = 30_000 } = {}) {
    const ranges = (await this.slotMap()).filter((r) => r.master === master.port)
    if (ranges.length === 0) throw new Error(`${master.name} (:${master.port}) owns no slots`)
    const replicaPorts = new Set((await this.replicasOf(master)).map((n) => n.port))
    if (replicaPorts.size === 0) throw new Error(`${master.name} (:${master.port}) has no replica`)
    const probeSlot = ranges[0].start
    const killedAt = Date.now()
    await master.kill('SIGKILL')
    let promotedAt = null
    let newPort = null
    await waitFor(
      async () => {
        if (promotedAt === null) {
          for (const port of replicaPorts) {
            const view = await this.nodeByPort(port)
              .cmd('CLUSTER', 'NODES')
              .catch(() => '')
            const me = parseClusterNodes(view).find((x) => x.flags.has('myself'))
            if (me && me.flags.has('master')) {
              promotedAt = Date.now()
              newPort = port
            }
          }
          if (promotedAt === null) return false
        }
        for (const n of this.liveNodes) {
          const [infoText, slots] = await n
            .pipeline([
              ['CLUSTER', 'INFO'],
              ['CLUSTER', 'SLOTS'],
            ])
            .catch(() => [])
          if (typeof infoText !== 'string' || !Array.isArray(slots)) return false
          if (parseInfo(infoText).cluster_state !== 'ok') return false
          const owner = parseClusterSlots(slots).find((r) => probeSlot >= r.start && probeSlot <= r.end)
          if (!owner || owner.master !== newPort) return false
        }
        return true
      },
      { timeout, interval: 50, what: `a replica of ${master.name} to be promoted and agreed on` },
    ).catch(async (err) => {
      throw new Error(`${err.message}\n${await this.describe()}`)
    })
    const settledAt = Date.now()
    return { newMaster: this.nodeByPort(newPort), killedAt, promotedAt, settledAt, promotedMs: promotedAt - killedAt, settledMs: settledAt - killedAt }
  }

  /** Every live node's view (CLUSTER INFO state, CLUSTER NODES) and log tail, for failure messages. */
  async describe() {
    const parts = []
    for (const n of this.liveNodes) {
      const [infoText, nodesText] = await n
        .pipeline([
          ['CLUSTER', 'INFO'],
          ['CLUSTER', 'NODES'],
        ])
        .catch((e) => [String(e), ''])
      parts.push(`--- ${n.name} :${n.port} cluster_state:${parseInfo(infoText).cluster_state}\n${nodesText}\n${n.log.slice(-1_500)}`)
    }
    return parts.join('\n')
  }

  async dispose() {
    await Promise.all(this.nodes.map((n) => n.dispose()))
    fs.rmSync(this.dir, { recursive: true, force: true })
  }
}

// ---- Sentinel ------------------------------------------------------------------------------

class RedisSentinelGroup {
  /** `downAfter`: down-after-milliseconds, the main term of how long a failover takes. */
  constructor({ masterName = 'mymaster', downAfter = 1_000, failoverTimeout = 10_000 } = {}) {
    this.masterName = masterName
    this.downAfter = downAfter
    this.failoverTimeout = failoverTimeout
    this.dir = tmpDir('sc-topo-sentinel-')
    this.master = null
    this.replica = null
    this.sentinel = null
    this.oldMasters = []
  }

  get sentinelUrls() {
    return [this.sentinel.url]
  }

  async start({ timeout = 20_000 } = {}) {
    this.master = await new RedisNode('master', { dir: this.dir }).start()
    const masterPort = this.master.port
    this.replica = await new RedisNode('replica', { dir: this.dir, conf: () => [`replicaof ${HOST} ${masterPort}`] }).start()
    // The replica must be attached before the sentinel's first INFO of the master, or the
    // sentinel learns of it only at the next INFO, 10 s later.
    await waitFor(async () => (await this.replica.info('replication')).master_link_status === 'up', { timeout, interval: 50, what: 'the replica to sync' })
    await waitFor(async () => (await this.master.info('replication')).connected_slaves === '1', {
      timeout,
      interval: 50,
      what: 'the master to list its replica',
    })
    const name = this.masterName
    this.sentinel = await new RedisNode('sentinel', {
      dir: this.dir,
      sentinel: true,
      conf: () => [
        `sentinel monitor ${name} ${HOST} ${masterPort} 1`,
        `sentinel down-after-milliseconds ${name} ${this.downAfter}`,
        `sentinel failover-timeout ${name} ${this.failoverTimeout}`,
        `sentinel parallel-syncs ${name} 1`,
      ],
    }).start()
    await waitFor(
      async () => {
        const replicas = await this.sentinel.cmd('SENTINEL', 'REPLICAS', name)
        return replicas.some((r) => {
          const o = pairs(r)
          return Number(o.port) === this.replica.port && !/s_down|disconnected/.test(o.flags)
        })
      },
      { timeout, interval: 50, what: 'the sentinel to know the replica' },
    )
    return this
  }

  /** The master's port as the sentinel names it. */
  async masterPort() {
    const [, port] = await this.sentinel.cmd('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.masterName)
    return Number(port)
  }

  /**
   * SIGKILLs the master and waits until the sentinel names the replica as master and the replica
   * says ROLE master. Returns { newMaster, failoverMs }; `master`/`replica` are updated.
   */
  async killMaster({ timeout = 30_000 } = {}) {
    const old = this.master
    const candidate = this.replica
    const killedAt = Date.now()
    await old.kill('SIGKILL')
    await waitFor(
      async () => {
        if ((await this.masterPort().catch(() => null)) !== candidate.port) return false
        const role = await candidate.cmd('ROLE').catch(() => null)
        return Array.isArray(role) && role[0] === 'master'
      },
      { timeout, interval: 50, what: 'the sentinel to promote the replica' },
    )
    const promotedAt = Date.now()
    this.oldMasters.push(old)
    this.master = candidate
    this.replica = null
    return { newMaster: candidate, killedAt, promotedAt, failoverMs: promotedAt - killedAt }
  }

  /**
   * SENTINEL FAILOVER (the old master stays up, writable until the sentinel demotes it seconds
   * later) and waits until the sentinel names the replica and the replica says ROLE master.
   * `switchedAt`: when the sentinel first named the replica (polled every `interval` ms): from
   * the replica's promotion on (+promoted-slave), before the failover ends (+switch-master).
   * `master`/`replica` are swapped.
   */
  async commandFailover({ timeout = 30_000, interval = 10 } = {}) {
    const old = this.master
    const candidate = this.replica
    const issuedAt = Date.now()
    await this.sentinel.cmd('SENTINEL', 'FAILOVER', this.masterName).catch((err) => {
      // A failover the sentinel began by itself (a pause that a loaded machine stretched past
      // down-after-milliseconds), or an answer lost to the load: the promotion awaited below is
      // what counts, and it fails the call if it does not come.
      if (!/INPROG|timed out/.test(err.message)) throw err
    })
    let switchedAt = null
    await waitFor(
      async () => {
        if ((await this.masterPort().catch(() => null)) !== candidate.port) return false
        switchedAt ??= Date.now()
        const role = await candidate.cmd('ROLE').catch(() => null)
        return Array.isArray(role) && role[0] === 'master'
      },
      { timeout, interval, what: 'the sentinel to promote the replica (SENTINEL FAILOVER)' },
    )
    this.master = candidate
    this.replica = old
    return { newMaster: candidate, oldMaster: old, issuedAt, switchedAt, failoverMs: switchedAt - issuedAt }
  }

  /** Waits until `node` (a former master) is a replica of the master, in sync. */
  async demoted(node, { timeout = 40_000 } = {}) {
    await waitFor(
      async () => {
        const role = await node.cmd('ROLE').catch(() => null)
        if (!Array.isArray(role) || role[0] !== 'slave' || Number(role[2]) !== this.master.port) return false
        return (await node.info('replication')).master_link_status === 'up'
      },
      { timeout, interval: 100, what: `:${node.port} to be demoted to a replica of :${this.master.port}` },
    )
  }

  async dispose() {
    await Promise.all([this.master, this.replica, this.sentinel, ...this.oldMasters].filter(Boolean).map((n) => n.dispose()))
    fs.rmSync(this.dir, { recursive: true, force: true })
  }
}

/** A flat [k1, v1, k2, v2, ...] reply as an object. */
function pairs(list) {
  const o = {}
  for (let i = 0; i + 1 < list.length; i += 2) o[list[i]] = list[i + 1]
  return o
}

function execFileP(file, args, { timeout = 30_000 } = {}) {
  return new Promise((resolve, reject) => {
    track(
      execFile(file, args, { timeout, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
        if (err) reject(new Error(`${file} ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`))
        else resolve({ stdout, stderr })
      }),
    )
  })
}

/** redis-cli with `args` (the binary checks what these helpers start); resolves { stdout, stderr } or rejects. */
function redisCli(args, options) {
  return execFileP('redis-cli', args, options)
}

// ---- self-check ----------------------------------------------------------------------------

async function selfCheck() {
  const t0 = Date.now()
  const cleanup = []
  const log = (...a) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s]`, ...a)
  const check = (cond, what) => {
    if (!cond) throw new Error(`self-check failed: ${what}`)
    log(`ok  ${what}`)
  }
  const cliFails = async (args) => {
    try {
      const { stdout } = await redisCli(args, { timeout: 10_000 })
      return /error|refused|I\/O/i.test(stdout) ? stdout.trim() : false
    } catch (err) {
      return err.message.split('\n')[0]
    }
  }
  try {
    // Certificates and TLS.
    const certDir = tmpDir('sc-topo-certs-')
    cleanup.push(() => fs.rmSync(certDir, { recursive: true, force: true }))
    const certs = makeCertificates(certDir)
    const verify = (ca, cert) => {
      try {
        execFileSync('openssl', ['verify', '-CAfile', ca, cert], { stdio: 'pipe' })
        return true
      } catch {
        return false
      }
    }
    check(verify(certs.caFile, certs.serverCertFile) && verify(certs.caFile, certs.clientCertFile), 'the CA signs the server and client certificates')
    check(!verify(certs.otherCaFile, certs.serverCertFile), 'the other CA does not vouch for the server certificate')

    const tlsOpt = new RedisNode('tls-optional', { tls: { certs, authClients: 'optional' } })
    const tlsReq = new RedisNode('tls-required', { tls: { certs, authClients: 'yes' } })
    cleanup.push(
      () => tlsOpt.dispose(),
      () => tlsReq.dispose(),
    )
    await Promise.all([tlsOpt.start(), tlsReq.start()])
    const cliTls = (node, extra) => ['-h', HOST, '-p', String(node.port), '--tls', ...extra]
    const okPing = async (node, extra) => (await redisCli([...cliTls(node, extra), 'PING'])).stdout.trim() === 'PONG'
    check(await okPing(tlsOpt, ['--cacert', certs.caFile]), 'TLS (optional client certs): redis-cli --tls with the private CA gets PONG')
    check(await cliFails([...cliTls(tlsOpt, ['--cacert', certs.otherCaFile]), 'PING']), 'TLS: redis-cli trusting only the other CA is refused')
    check(await cliFails(['-h', HOST, '-p', String(tlsOpt.port), 'PING']), 'TLS: a plaintext client is refused (port 0: no plain listener)')
    check(
      await okPing(tlsReq, ['--cacert', certs.caFile, '--cert', certs.clientCertFile, '--key', certs.clientKeyFile]),
      'mutual TLS: with the client certificate, PONG',
    )
    check(await cliFails([...cliTls(tlsReq, ['--cacert', certs.caFile]), 'PING']), 'mutual TLS: without a client certificate, refused')
    check(
      await cliFails([...cliTls(tlsReq, ['--cacert', certs.caFile, '--cert', certs.otherClientCertFile, '--key', certs.otherClientKeyFile]), 'PING']),
      'mutual TLS: a client certificate from the other CA is refused',
    )
    check((await tlsReq.cmd('SET', 'k', 'v')) === 'OK' && (await tlsReq.cmd('GET', 'k')) === 'v', 'node:tls RESP client works against the mutual-TLS server')

    // ACL.
    const acl = new RedisNode('acl')
    cleanup.push(() => acl.dispose())
    await acl.start()
    await addAclUser(acl, { user: 'app', password: 'secret', namespace: 'ns' })
    await protectDefaultUser(acl, 'adminpw')
    const dry = await aclDryRun(acl, 'app', tierCommands('ns'))
    log('ACL DRYRUN for app (~ns:* &ns:* +@all -@dangerous):')
    for (const [c, r] of Object.entries(dry)) log(`    ${r === 'OK' ? 'allowed' : 'REFUSED'}  ${c}${r === 'OK' ? '' : `  (${r})`}`)
    const appCli = ['-h', HOST, '-p', String(acl.port), '--user', 'app', '--pass', 'secret', '--no-auth-warning']
    check((await redisCli([...appCli, 'SET', 'ns:v:{k}', 'x'])).stdout.trim() === 'OK', 'ACL: app writes a key of its namespace')
    check(/NOPERM/.test((await redisCli([...appCli, 'SET', 'other:k', 'x'])).stdout), 'ACL: app cannot write outside its namespace')
    const wrong = await redisCli(['-h', HOST, '-p', String(acl.port), '--user', 'app', '--pass', 'nope', '--no-auth-warning', 'PING'])
    check(/WRONGPASS/.test(wrong.stderr) && /NOAUTH/.test(wrong.stdout), 'ACL: a wrong password gets WRONGPASS (and then NOAUTH)')
    check(/NOAUTH/.test((await redisCli(['-h', HOST, '-p', String(acl.port), 'GET', 'ns:v:{k}'])).stdout), 'ACL: without AUTH nothing is served')

    // Cluster.
    const cluster = new RedisCluster({ nodeTimeout: 1_000 })
    cleanup.push(() => cluster.dispose())
    let t = Date.now()
    await cluster.start()
    log(`cluster of ${cluster.nodes.length} nodes up and healthy in ${Date.now() - t} ms`)
    const masters = await cluster.masters()
    check(masters.length === 3, 'cluster: 3 masters serve slots')
    const seed = cluster.liveNodes[0]
    const clusterCli = ['-c', '-h', HOST, '-p', String(seed.port)]
    for (const k of ['a', 'b', 'c', 'd', 'e']) await redisCli([...clusterCli, 'SET', `ns:v:{${k}}`, k])
    const victim = await cluster.masterOfKey('ns:v:{a}')
    check((await victim.cmd('GET', 'ns:v:{a}')) === 'a', 'cluster: masterOfKey names the node that holds the key (redis-cli -c followed MOVED)')
    await sleep(200)
    const result = await cluster.killMaster(victim)
    log(
      `cluster failover: replica :${result.newMaster.port} called itself master ${result.promotedMs} ms after the SIGKILL; all nodes agreed after ${result.settledMs} ms`,
    )
    check((await cluster.masterOfKey('ns:v:{a}')) === result.newMaster, 'cluster: the promoted replica owns the slot')
    check(
      (await redisCli(['-h', HOST, '-p', String(result.newMaster.port), 'SET', 'ns:v:{a}', 'after'])).stdout.trim() === 'OK',
      'cluster: a write to that slot lands after the failover',
    )
    check((await result.newMaster.cmd('GET', 'ns:v:{a}')) === 'after', 'cluster: the new master holds it')

    // Sentinel.
    const group = new RedisSentinelGroup({ downAfter: 1_000 })
    cleanup.push(() => group.dispose())
    t = Date.now()
    await group.start()
    log(`sentinel group up in ${Date.now() - t} ms`)
    check((await group.masterPort()) === group.master.port, 'sentinel: names the master')
    const { stdout: sOut } = await redisCli(['-h', HOST, '-p', String(group.sentinel.port), 'SENTINEL', 'get-master-addr-by-name', group.masterName])
    check(sOut.includes(String(group.master.port)), 'sentinel: redis-cli SENTINEL get-master-addr-by-name agrees')
    await group.master.cmd('SET', 'before', '1')
    const sres = await group.killMaster()
    log(`sentinel failover: the sentinel named the promoted replica ${sres.failoverMs} ms after the SIGKILL`)
    check(
      (await redisCli(['-h', HOST, '-p', String(sres.newMaster.port), 'SET', 'after', '1'])).stdout.trim() === 'OK',
      'sentinel: the new master takes writes',
    )

    log('self-check passed')
  } finally {
    const pids = [...live].map((c) => c.pid)
    for (const fn of cleanup.reverse()) await fn()
    const stillThere = pids.filter((pid) => {
      try {
        process.kill(pid, 0)
        return true
      } catch {
        return false
      }
    })
    if (stillThere.length) console.log(`processes left running: ${stillThere.join(', ')}`)
    else log(`every process started (${pids.length}) has exited`)
  }
}

if (require.main === module && process.argv.includes('--self-check')) {
  selfCheck().catch((err) => {
    console.error(err)
    process.exitCode = 1
  })
}

module.exports = {
  makeCertificates,
  RedisNode,
  RedisCluster,
  RedisSentinelGroup,
  addAclUser,
  protectDefaultUser,
  aclDryRun,
  tierCommands,
  respPipeline,
  parseInfo,
  parseClusterNodes,
  parseClusterSlots,
  redisCli,
  killTopologySync,
}
