'use strict'
// Process and thread lifetime: an idle cache never keeps the process alive, and each worker
// thread gets its own working instance.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const { Worker } = require('node:worker_threads')
const path = require('node:path')

const root = path.join(__dirname, '..')

function runNode(source) {
  return spawnSync(process.execPath, ['-e', source], { cwd: root, encoding: 'utf8', timeout: 30_000 })
}

test('a script that never calls close() exits by itself', () => {
  const r = runNode(`
    const { StampedeCache } = require('.')
    const cache = new StampedeCache({ ttl: 50, hardTtl: 60_000 })
    ;(async () => {
      await cache.getOrLoad('k', () => 1)
      await new Promise((r) => setTimeout(r, 80))
      // Stale now: this read starts a background refresh, which ends on its own.
      const v = await cache.getOrLoad('k', async () => 2)
      console.log('value', v)
    })()
  `)
  assert.equal(r.signal, null, `killed by ${r.signal} (hung past the timeout?)`)
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /value 1/)
})

test('an idle cache with a hung loader elsewhere does not matter once the loader is gone', () => {
  // The cache itself holds no timer or handle: only the user's own pending work keeps Node alive.
  const r = runNode(`
    const { StampedeCache } = require('.')
    const cache = new StampedeCache()
    cache.getOrLoad('never', () => new Promise(() => {})) // never settles, holds nothing
    console.log('done')
  `)
  assert.equal(r.signal, null)
  assert.equal(r.status, 0, r.stderr)
  assert.match(r.stdout, /done/)
})

function runWorker(source) {
  return new Promise((resolve, reject) => {
    const w = new Worker(source, { eval: true, workerData: { root } })
    w.once('message', resolve)
    w.once('error', reject)
  })
}

test('worker threads each get their own working instance', async () => {
  const source = `
    const { parentPort, workerData, threadId } = require('node:worker_threads')
    const { StampedeCache } = require(workerData.root)
    ;(async () => {
      const cache = new StampedeCache()
      let calls = 0
      const loader = async () => { calls++; await new Promise((r) => setTimeout(r, 10)); return { threadId } }
      const values = await Promise.all(Array.from({ length: 300 }, () => cache.getOrLoad('k', loader)))
      const again = await cache.getOrLoad('k', loader)
      parentPort.postMessage({ calls, threadId, same: values.every((v) => v.threadId === threadId), again, stats: cache.stats() })
      await cache.close()
    })()
  `
  const results = await Promise.all([runWorker(source), runWorker(source), runWorker(source)])
  for (const r of results) {
    assert.equal(r.calls, 1)
    assert.ok(r.same)
    assert.deepEqual(r.again, { threadId: r.threadId })
    assert.equal(r.stats.loads, 1)
    assert.equal(r.stats.coalesced, 299)
    assert.equal(r.stats.hits, 1)
  }
  assert.equal(new Set(results.map((r) => r.threadId)).size, 3)
})

test('terminating a worker in the middle of a load exits cleanly', async () => {
  const w = new Worker(
    `
    const { parentPort, workerData } = require('node:worker_threads')
    const { StampedeCache } = require(workerData.root)
    const cache = new StampedeCache()
    cache.getOrLoad('k', () => new Promise((r) => setTimeout(() => r(1), 60_000)))
    parentPort.postMessage('loading')
  `,
    { eval: true, workerData: { root } },
  )
  await new Promise((resolve) => w.once('message', resolve))
  const code = await w.terminate()
  assert.equal(code, 1) // terminate() reports 1 for a worker stopped from outside
  // The main thread's own instance is unaffected.
  const { StampedeCache } = require('..')
  const cache = new StampedeCache()
  assert.equal(await cache.getOrLoad('k', () => 'main'), 'main')
  await cache.close()
})
