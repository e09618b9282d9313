'use strict'
// No option value the constructor (or a call) accepts can abort the process (the
// contract's "What no bytes and no option can do"): every numeric option has a documented
// maximum (README, options table); at it the cache works, past it ERR_INVALID_OPTION names the
// option and the maximum. The values that used to abort (Number.MAX_VALUE, 1e300, 1e22 as a
// timeout) run in a child process, whose exit code and signal are checked.

const { describe, test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const { StampedeCache, StampedeCacheError } = require('..')
const { RedisServer } = require('./helpers/redis-server')

const WAIT = 2 ** 31 - 1 // the longest JS timer: loadTimeout, lockTtl, redis timeouts
const YEAR = 365 * 24 * 3_600_000 // ttl, negativeTtl, errorBackoff
const TEN_YEARS = 10 * YEAR // hardTtl, tagTtl
const MAX_BETA = 1e6
const MAX_COUNT = 2 ** 32 - 1 // l1.maxEntries, maxConcurrentRefreshes
const MAX_BYTES = Number.MAX_SAFE_INTEGER // l1.maxBytes
const ABORTED_BEFORE = [Number.MAX_VALUE, 1e300, 1e22]

// name, maximum, the options that set it (in-process).
const CONSTRUCTOR = [
  ['ttl', YEAR, (v) => ({ ttl: v })],
  ['hardTtl', TEN_YEARS, (v) => ({ hardTtl: v })],
  ['negativeTtl', YEAR, (v) => ({ negativeTtl: v })],
  ['beta', MAX_BETA, (v) => ({ beta: v })],
  ['lockTtl', WAIT, (v) => ({ lockTtl: v })],
  ['errorBackoff', YEAR, (v) => ({ errorBackoff: v })],
  ['tagTtl', TEN_YEARS, (v) => ({ tagTtl: v })],
  ['loadTimeout', WAIT, (v) => ({ loadTimeout: v })],
  ['l1.maxEntries', MAX_COUNT, (v) => ({ l1: { maxEntries: v } })],
  ['l1.maxBytes', MAX_BYTES, (v) => ({ l1: { maxBytes: v } })],
  ['maxConcurrentRefreshes', MAX_COUNT, (v) => ({ maxConcurrentRefreshes: v })],
]
// A call's options (getOrLoad), and set's.
const CALL = [
  ['ttl', YEAR],
  ['hardTtl', TEN_YEARS],
  ['negativeTtl', YEAR],
  ['beta', MAX_BETA],
  ['loadTimeout', WAIT],
]
const SET = [
  ['ttl', YEAR],
  ['hardTtl', TEN_YEARS],
]

/** The value past `max`: the next whole number for counts and ms (all maxima are whole). */
const past = (max) => (max === MAX_BYTES ? 2 ** 53 : max + 1)

function assertTooLarge(err, name, max) {
  assert.ok(err instanceof StampedeCacheError, `${name}: ${err}`)
  assert.equal(err.code, 'ERR_INVALID_OPTION', `${name}: ${err.message}`)
  assert.ok(err.message.includes(`\`${name}\``), `names ${name}: ${err.message}`)
  assert.ok(err.message.includes(String(max)), `names the maximum ${max}: ${err.message}`)
}

const warnings = []
const onWarning = (w) => warnings.push(w)
process.on('warning', onWarning)
after(() => process.off('warning', onWarning))

describe('every numeric constructor option has a maximum', () => {
  for (const [name, max, set] of CONSTRUCTOR) {
    test(`${name}: ${max} works, past it ERR_INVALID_OPTION naming ${name} and ${max}`, async () => {
      const cache = new StampedeCache(set(max))
      let calls = 0
      assert.equal(await cache.getOrLoad('k', () => ++calls), 1)
      assert.equal(await cache.getOrLoad('k', () => ++calls), 1, 'a hit')
      await cache.close()
      for (const v of [past(max), ...ABORTED_BEFORE]) {
        assert.throws(
          () => new StampedeCache(set(v)),
          (err) => (assertTooLarge(err, name, max), true),
        )
      }
    })
  }

  test('jitter stays below 1; Infinity still means none for loadTimeout and maxConcurrentRefreshes', async () => {
    for (const v of [1, ...ABORTED_BEFORE]) {
      assert.throws(() => new StampedeCache({ jitter: v }), { code: 'ERR_INVALID_OPTION', message: /`jitter`/ })
    }
    for (const options of [{ jitter: 0.999999 }, { loadTimeout: Infinity }, { maxConcurrentRefreshes: Infinity }]) {
      const cache = new StampedeCache(options)
      assert.equal(await cache.getOrLoad('k', () => 'v'), 'v')
      await cache.close()
    }
  })

  test('loadTimeout at its maximum does not fire at once (a longer JS timer would)', async () => {
    const cache = new StampedeCache({ loadTimeout: WAIT })
    const slow = () => new Promise((resolve) => setTimeout(() => resolve('slow'), 50))
    assert.equal(await cache.getOrLoad('k', slow), 'slow')
    assert.equal(await cache.getOrLoad('k2', slow, { loadTimeout: WAIT }), 'slow')
    await cache.close()
    assert.deepEqual(
      warnings.filter((w) => w.name === 'TimeoutOverflowWarning'),
      [],
    )
  })
})

describe("a call's numbers have the same maxima", () => {
  test('getOrLoad, set and ctx.setTtl: at the maximum they work, past it they are refused', async () => {
    const cache = new StampedeCache()
    for (const [name, max] of CALL) {
      // hardTtl >= ttl: a call's hardTtl at its maximum stands with the default ttl.
      assert.equal(await cache.getOrLoad(`max-${name}`, () => name, { [name]: max }), name)
      for (const v of [past(max), ...ABORTED_BEFORE]) {
        await assert.rejects(
          cache.getOrLoad(`past-${name}`, () => 1, { [name]: v }),
          (err) => (assertTooLarge(err, name, max), true),
        )
      }
    }
    assert.equal(await cache.getOrLoad('jitter', () => 'j', { jitter: 0.999999 }), 'j')
    await assert.rejects(
      cache.getOrLoad('jitter2', () => 1, { jitter: 1e300 }),
      { code: 'ERR_INVALID_OPTION', message: /`jitter`/ },
    )

    for (const [name, max] of SET) {
      await cache.set(`set-${name}`, 1, { [name]: max })
      assert.equal(await cache.get(`set-${name}`), 1)
      for (const v of [past(max), ...ABORTED_BEFORE]) {
        await assert.rejects(cache.set(`set-${name}`, 2, { [name]: v }), (err) => (assertTooLarge(err, name, max), true))
      }
    }

    assert.equal(await cache.getOrLoad('ctx-max', (ctx) => (ctx.setTtl(YEAR, TEN_YEARS), 'c')), 'c')
    for (const [ttl, hardTtl, name, max] of [
      [past(YEAR), undefined, 'ttl', YEAR],
      [1e300, undefined, 'ttl', YEAR],
      [1_000, past(TEN_YEARS), 'hardTtl', TEN_YEARS],
      [1_000, Number.MAX_VALUE, 'hardTtl', TEN_YEARS],
    ]) {
      await assert.rejects(
        cache.getOrLoad(`ctx-${ttl}-${hardTtl}`, (ctx) => {
          ctx.setTtl(ttl, hardTtl)
          return 'x'
        }),
        (err) => {
          assert.equal(err.code, 'ERR_INVALID_ARGUMENT', err.message)
          assert.match(err.message, /ctx\.setTtl/)
          assert.ok(err.message.includes(`\`${name}\``) && err.message.includes(String(max)), err.message)
          return true
        },
      )
    }
    await cache.close()
  })
})

describe('the redis timeouts', () => {
  let server
  before(async () => {
    server = new RedisServer()
    await server.start()
  })
  after(() => server.dispose())

  test('at their maximum the cache reads and writes Redis; past it ERR_INVALID_OPTION', async () => {
    for (const name of ['connectTimeout', 'commandTimeout']) {
      const cache = new StampedeCache({ redis: { url: server.url, [name]: WAIT }, namespace: `limits-${name}` })
      let calls = 0
      assert.equal(await cache.getOrLoad('k', () => ++calls), 1)
      await cache.set('s', 'v')
      // Another instance reads through Redis (the read lane on Node, with this timeout).
      const other = new StampedeCache({ redis: { url: server.url, [name]: WAIT }, namespace: `limits-${name}` })
      assert.equal(await other.get('s'), 'v')
      assert.equal(await other.getOrLoad('k', () => ++calls), 1)
      assert.equal(calls, 1)
      await Promise.all([cache.close(), other.close()])
      for (const v of [past(WAIT), ...ABORTED_BEFORE]) {
        assert.throws(
          () => new StampedeCache({ redis: { url: server.url, [name]: v } }),
          (err) => (assertTooLarge(err, `redis.${name}`, WAIT), true),
        )
      }
    }
  })

  test('every maximum at once against Redis: one load across two instances, Redis keeps the entry for ten years', async () => {
    const options = {
      redis: { url: server.url, connectTimeout: WAIT, commandTimeout: WAIT },
      namespace: 'limits-all',
      ttl: YEAR,
      hardTtl: TEN_YEARS,
      negativeTtl: YEAR,
      beta: MAX_BETA,
      lockTtl: WAIT,
      errorBackoff: YEAR,
      loadTimeout: WAIT,
      l1: { maxEntries: MAX_COUNT, maxBytes: MAX_BYTES },
      maxConcurrentRefreshes: MAX_COUNT,
    }
    const a = new StampedeCache(options)
    const b = new StampedeCache(options)
    let calls = 0
    const loader = () => new Promise((resolve) => setTimeout(() => resolve(++calls), 50))
    const got = await Promise.all([a.getOrLoad('k', loader), b.getOrLoad('k', loader)])
    assert.deepEqual(got, [1, 1])
    assert.equal(calls, 1, 'one load across the two (the lock at lockTtl 2^31-1 works)')
    const pttl = Number(await server.cmd('PTTL', 'limits-all:v:{k}'))
    // hardTtl with jitter 0.1: between 9 and 11 years, in ms.
    assert.ok(pttl > 0.9 * TEN_YEARS - 60_000 && pttl <= 1.1 * TEN_YEARS, `PTTL ${pttl}`)
    assert.equal(await b.getOrLoad('absent', () => null), null, 'a negative entry at negativeTtl a year')
    await Promise.all([a.close(), b.close()])
  })

  test('the values that used to abort are refused in a child process, which exits cleanly', () => {
    const root = path.join(__dirname, '..')
    const script = `
      const { StampedeCache } = require(${JSON.stringify(root)})
      const url = process.argv[1]
      const cases = [
        { redis: { url, commandTimeout: Number.MAX_VALUE } },
        { redis: { url, connectTimeout: 1e300 } },
        { redis: { url, commandTimeout: 1e22 } },
        { redis: { url, connectTimeout: 1e22, commandTimeout: 1e22 } },
        { redis: url, lockTtl: 1e300 },
        { redis: url, lockTtl: 2 ** 31 },
        { redis: url, hardTtl: Number.MAX_VALUE },
        { redis: url, ttl: 1e300 },
        { redis: url, errorBackoff: 1e300 },
        { redis: url, beta: Number.MAX_VALUE },
        { l1: { maxEntries: 2 ** 32 } },
        { l1: { maxEntries: 2 ** 32 - 1 } },
        { l1: { maxBytes: Number.MAX_VALUE } },
        { loadTimeout: 1e22 },
      ]
      ;(async () => {
        const codes = []
        for (const options of cases) {
          try {
            const cache = new StampedeCache(options)
            await cache.getOrLoad('k', () => 1)
            await cache.getOrLoad('cold', () => 2)
            await cache.close()
            codes.push('ok')
          } catch (err) {
            codes.push(err.code)
          }
        }
        console.log(JSON.stringify(codes))
      })()
    `
    const r = spawnSync(process.execPath, ['-e', script, server.url], { encoding: 'utf8', timeout: 60_000 })
    assert.equal(r.signal, null, `the child was killed: ${r.stderr}`)
    assert.equal(r.status, 0, r.stderr)
    const codes = JSON.parse(r.stdout.trim().split('\n').pop())
    // 2^32-1 entries is the maximum (allowed); everything else is past one.
    const expected = Array(14).fill('ERR_INVALID_OPTION')
    expected[11] = 'ok'
    assert.deepEqual(codes, expected)
  })
})
