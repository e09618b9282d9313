#!/usr/bin/env node
'use strict'
// `npm run bench`: stampede-cache against the caches users would otherwise pick (bentocache,
// cache-manager 7 + keyv, @epic-web/cachified, async-cache-dedupe, naive cache-aside on ioredis),
// seven scenarios, then scenario 8 (Redis reads: stampede-cache with l1: false against a raw
// ioredis client, bench/redis-read.js), one run, one private redis-server on a free 127.0.0.1
// port, one simulated database. See bench/README.md.
//
//   node bench/run.js [--quick] [--only 3,5] [--peers stampede-cache,bentocache] [--docs | --no-docs]
//   node bench/run.js --from bench/results/<timestamp>.json   # re-render report and charts, no run
//
// Writes bench/results/<timestamp>.json and .md; a full run also writes docs/bench-latest.md and
// the SVG charts under docs/ (--quick writes its report and charts under bench/results/ only,
// unless --docs).
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')

const BENCH = __dirname
const ROOT = path.join(BENCH, '..')
const DOCS = path.join(ROOT, 'docs')
const RESULTS = path.join(BENCH, 'results')

function ensureDeps() {
  if (fs.existsSync(path.join(BENCH, 'node_modules', 'bentocache'))) return
  console.log('bench: installing the bench dependencies (npm ci --prefix bench) ...')
  execFileSync('npm', ['ci', '--prefix', BENCH, '--no-audit', '--no-fund'], { stdio: 'inherit' })
}

function parseArgs(argv) {
  const a = { quick: false, only: null, peers: null, docs: null, from: null }
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i]
    if (x === '--quick') a.quick = true
    else if (x === '--only') a.only = argv[++i].split(',').map(Number)
    else if (x === '--peers') a.peers = argv[++i].split(',')
    else if (x === '--docs') a.docs = true
    else if (x === '--no-docs') a.docs = false
    else if (x === '--from') a.from = argv[++i]
    else if (x === '--help' || x === '-h') {
      console.log('node bench/run.js [--quick] [--only 1,2,...] [--peers a,b] [--docs|--no-docs] | --from results.json')
      process.exit(0)
    } else throw new Error(`unknown argument ${x}`)
  }
  if (a.docs === null && !a.from) a.docs = !a.quick && !a.only && !a.peers
  return a
}

/** Writes the results JSON, the Markdown report(s) and the charts; returns what it wrote. */
async function writeOutputs(results, base, docs) {
  const { markdown } = require('./lib/report')
  const { writeCharts } = require('./lib/charts')
  fs.mkdirSync(RESULTS, { recursive: true })
  fs.writeFileSync(path.join(RESULTS, `${base}.json`), JSON.stringify(results, null, 1) + '\n')
  const written = [`bench/results/${base}.json`, `bench/results/${base}.md`]
  let charts
  if (docs) {
    charts = await writeCharts(results, DOCS, 'bench-')
    fs.writeFileSync(path.join(DOCS, 'bench-latest.md'), markdown(results, { chartDir: '', charts }))
    fs.writeFileSync(path.join(RESULTS, `${base}.md`), markdown(results, { chartDir: '../../docs/', charts }))
    written.push('docs/bench-latest.md', ...charts.map((c) => `docs/${c.file}`))
  } else {
    charts = await writeCharts(results, RESULTS, `${base}-`)
    fs.writeFileSync(path.join(RESULTS, `${base}.md`), markdown(results, { chartDir: '', charts }))
    written.push(...charts.map((c) => `bench/results/${c.file}`))
  }
  return written
}

function notesFor(s) {
  const n = (x) => x.toLocaleString('en-US')
  return [
    'Where the issue gives no number, the bench chose: open-loop reads at a fixed rate split evenly over the 4 processes (scenarios 3 and 7); ' +
      `scenario 5: ttl ${n(s.mass.ttl / 1000)} s (±10 % jitter where the peer has it), ${n(s.mass.ratePerSec)} random reads/s in one process from ` +
      `${n(s.mass.readFromMs / 1000)} s to ${n(s.mass.readUntilMs / 1000)} s after the write; scenario 6: ${s.negative.concurrency} reads in flight; ` +
      `scenario 7: ${n(s.failing.ratePerSec)} reads/s in all, for the ${n(s.failing.failMs / 1000)} s of failure and ${n(s.failing.afterMs / 1000)} s after; ` +
      'a hot or failing key is loaded once and read once in every process before the timed reads.',
    'Open-loop readers shed an arrival when 4,000 of their reads are already in flight (counted as "shed", and as not served), so a runaway stampede cannot exhaust the machine.',
    'Scenario 5: with a 2 s ttl, ±10 % jitter spreads expiry over only 0.4 s, so without a bound every peer refreshes about every key read in the ' +
      `same few hundred ms (about ${n(Math.round(s.mass.ratePerSec / 10))} per 100 ms at this read rate). stampede-cache runs at most maxConcurrentRefreshes (16 by ` +
      'default) background refreshes at once and serves the stale value meanwhile, so its peak is set by the bound and the database latency, not by the read rate.',
  ]
}

function stamp(d) {
  return d.toISOString().replace(/[:]/g, '-').replace(/\..*/, 'Z')
}

async function main() {
  const args = parseArgs(process.argv.slice(2))
  ensureDeps()
  if (args.from) {
    const results = JSON.parse(fs.readFileSync(args.from, 'utf8'))
    results.goals = require('./lib/report').goalChecks(results)
    const base = path.basename(args.from, '.json')
    const docs = args.docs === null ? !results.meta.quick : args.docs
    console.log(`wrote: ${(await writeOutputs(results, base, docs)).join(', ')}`)
    return
  }
  const { startRedis } = require('./redis-lib')
  const { SCENARIOS, SIZES, runCase, killAll } = require('./lib/scenarios')
  const { PEERS, BASELINES } = require('./lib/peers')
  const { goalChecks, progressLine } = require('./lib/report')

  const started = new Date()
  const t0 = performance.now()
  const sizes = args.quick ? SIZES.quick : SIZES.full
  const redis = await startRedis()
  const stopAll = () => {
    killAll()
    redis.stop()
  }
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.once(sig, () => {
      console.error(`\nbench: ${sig}, stopping the workers and redis-server`)
      stopAll()
      process.exit(130)
    })
  }
  process.once('uncaughtException', (err) => {
    console.error(err)
    stopAll()
    process.exit(1)
  })

  const redisVersion = ((await redis.command('INFO', 'server')) || '').match(/redis_version:(\S+)/)
  const meta = {
    startedAt: started.toISOString(),
    quick: args.quick,
    sizes,
    machine: {
      cpu: os.cpus()[0].model.trim(),
      cores: os.cpus().length,
      memGiB: Math.round(os.totalmem() / 2 ** 30),
      os: `${os.type()} ${os.release()} ${os.arch()}`,
      node: process.version,
      redis: redisVersion ? redisVersion[1] : 'unknown',
    },
    notes: notesFor(sizes),
  }
  if (args.quick) {
    meta.notes.unshift(
      '--quick: every scenario and peer at reduced sizes (scenario 1: 200 readers; 2: 4 x 50; 3: 400 reads/s for 1.5 s; 4: 150 ms cells; ' +
        '5: 500 keys, ttl 1 s, 1,000 reads/s; 6: 2,000 reads over 100 ids; 7: 600 ms of failure at 400 reads/s; ' +
        '8: 2 rounds of 300 reads a side, 3 cold processes a side): a check that everything runs, not figures to quote.',
    )
  }

  console.log(
    `bench: ${args.quick ? 'quick' : 'full'} run, redis-server ${meta.machine.redis} on 127.0.0.1:${redis.port}, ` +
      `${meta.machine.cpu} x ${meta.machine.cores}, Node ${process.version}`,
  )
  const results = { meta, scenarios: [] }
  try {
    for (const sc of SCENARIOS) {
      if (args.only && !args.only.includes(sc.id)) continue
      const peers = (sc.peers || PEERS).filter((p) => !args.peers || args.peers.includes(p) || (BASELINES.includes(p) && args.peers.length))
      const entry = { id: sc.id, slug: sc.slug, title: sc.title, processes: sc.processes, description: sc.describe(sizes), rows: [] }
      results.scenarios.push(entry)
      for (const peer of peers) {
        await redis.flushAll()
        const row = await runCase(sc, peer, { redisUrl: redis.url, s: sizes })
        entry.rows.push(row)
        console.log(progressLine(sc, row))
      }
    }
  } finally {
    stopAll()
  }
  meta.totalMs = Math.round(performance.now() - t0)
  results.goals = goalChecks(results)

  const base = `${stamp(started)}${args.quick ? '-quick' : ''}`
  const written = await writeOutputs(results, base, args.docs)
  console.log('')
  console.log('goal checks (ratios within this run; reported, never asserted):')
  for (const g of results.goals) console.log(`  ${g.pass ? 'PASS' : 'MISS'}  ${g.name}: ${g.detail}`)
  console.log('')
  console.log(`wrote: ${written.join(', ')}`)
  console.log(`total: ${(meta.totalMs / 1000).toFixed(1)} s`)
  const errors = results.scenarios.flatMap((s) => s.rows.filter((r) => r.error))
  if (errors.length) {
    console.error(`bench: ${errors.length} case(s) failed`)
    process.exitCode = 1
  }
}

main().catch((err) => {
  console.error(err)
  process.exitCode = 1
})
