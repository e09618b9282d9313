'use strict'
// A hostile Redis Cluster node over TLS. The redis crate opens a cluster's node connections
// itself; over TLS the cache opens them through the guard as well, with the TLS configuration
// the cluster's options describe (the same CA, verified as the crate would), so a node's reply
// declaring a huge length or nesting past any answer the cache asks for closes that connection
// at once, before the crate's parser buffers it.
//
// The node is a small TLS server here, serving a certificate for 127.0.0.1 from a throwaway CA
// the cache trusts (`tls.ca`): it owns every slot (CLUSTER SLOTS names itself), answers the
// crate's handshake, and answers anything else (a GET, the bus's HELLO) with the attack and then
// filler. The cache runs in a process of its own: it must survive, its memory must stay far
// below the flood, and each attacked connection must close having taken little of it.

const { test, after, before } = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { makeCertificates } = require('./helpers/redis-topology')
const { ATTACK, ATTACKS, array, assertSurvived, bulk, hostileServer, runGuardClient } = require('./helpers/hostile-server')

let certDir
let certs

before(() => {
  certDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-cluster-tls-'))
  certs = makeCertificates(certDir)
})

after(() => {
  if (certDir) fs.rmSync(certDir, { recursive: true, force: true })
})

const NODE_ID = crypto.randomBytes(20).toString('hex')

/** One cluster node owning every slot, at `port`: CLUSTER SLOTS as Redis answers it. */
const slots = (port) => array([array([':0\r\n', ':16383\r\n', array([bulk('127.0.0.1'), `:${port}\r\n`, bulk(NODE_ID)])])])

for (const [name, attack] of Object.entries(ATTACKS)) {
  test(`a TLS cluster node answering with ${name === 'length' ? 'a declared terabyte' : 'endless nesting'}: the process survives, bounded`, {
    timeout: 90_000,
  }, async (t) => {
    const node = await hostileServer({
      attack,
      tls: { key: fs.readFileSync(certs.serverKeyFile), cert: fs.readFileSync(certs.serverCertFile) },
      answer: (args, port) => {
        const [cmd, sub] = [args[0].toUpperCase(), (args[1] || '').toUpperCase()]
        if (cmd === 'CLIENT') return '+OK\r\n'
        if (cmd === 'PING') return '+PONG\r\n'
        if (cmd === 'CLUSTER' && sub === 'SLOTS') return slots(port)
        return ATTACK
      },
    })
    t.after(() => node.close())
    const run = await runGuardClient({
      cluster: [`rediss://127.0.0.1:${node.port}`],
      tls: { ca: certs.ca },
      connectTimeout: 2_000,
      commandTimeout: 2_000,
    })
    const r = await assertSurvived(t, run, node.attacked(), 'a node connection')
    assert.ok(
      r.reports.some((m) => /512 MiB|nest|RESP|closed/.test(m)),
      `the refused reply is reported: ${r.reports.join(' | ')}`,
    )
  })
}
