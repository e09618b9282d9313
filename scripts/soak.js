#!/usr/bin/env node
'use strict'
// The soak of the randomized history test: many seeds of __test__/helpers/history.js, each a
// private redis-server, 3 worker processes, a versioned database and seeded faults (see there).
// With --cluster, each seed runs against a 3-master, 3-replica Redis Cluster instead:
// node faults and one master SIGKILLed per run; a cluster serves runs until no master with a
// replica is left, then a new one is started.
//
//   npm run soak                          seeds from a random start, for 5 minutes
//   npm run soak -- --seeds 50            50 seeds (no time limit unless --minutes is given too)
//   npm run soak -- --minutes 20          as many seeds as fit in 20 minutes
//   npm run soak -- --seed 123 --repeat 5 replay one seed 5 times (a seed fixes the operations and
//                                         the faults, not the interleaving)
//   --cluster        run against a Redis Cluster (npm run soak -- --cluster --minutes 10)
//   --tls            run against a TLS-only redis-server (reads take the TLS read lane)
//   --mtls           the same, requiring client certificates (mutual TLS): every cache presents one
//   --sentinel       through Sentinel: a private master, replica and sentinel per seed; the caches
//                    find the master through the sentinel; master faults, sentinel pauses and one
//                    failover per run (SENTINEL FAILOVER or a SIGKILL of the master, drawn per seed)
//   --failover HOW   with --sentinel: force the failover, `command` (SENTINEL FAILOVER) or `kill`
//   --first S        start at seed S (then S+1, ...) instead of a random one
//   --duration MS    how long each run's clients and faults go on (default 6000)
//   --out DIR        write the full history (JSON) of every run with a violation there
//   --l1 off|BYTES   every worker with l1: false, or l1: { maxBytes: BYTES } (default: drawn per worker)
//   --serializer S   json, v8 or custom for the run (default: drawn per seed)
//   --tags on|off    tags on every entry, deleteByTag among the writes (default: drawn per seed)
//   --no-faults      no fault injection (the liveness and load-count checks then apply everywhere;
//                    such a run is not "empty" for lack of faults)
//   --verbose        print each run's progress and every violation kind in full
//
// Prints one line per run, the violations found (with seed and the key's history), and a summary
// (seeds run, operations, faults injected, configurations drawn, violations by kind with their
// seeds). Exits 1 on any violation, a run that could not complete (its error is printed), or a
// run that tested nothing (no operation, no loader call, or no fault injected: a green result
// from it would prove nothing); 2 on a bad argument.

const fs = require('node:fs')
const path = require('node:path')

const state = { startedAt: Date.now(), runs: [], failed: [], clusters: 0, cluster: false, tls: false, sentinel: false, interrupted: false }

// Registered before the helpers' own handler (which kills the children and exits), so an
// interrupted soak still prints what it found.
process.once('SIGINT', () => {
  state.interrupted = true
  printSummary()
})

const { runHistory, clusterUsable, formatViolations, summarize, countBy, DEFAULTS } = require('../__test__/helpers/history')
const { RedisCluster } = require('../__test__/helpers/redis-topology')

function usage(message) {
  if (message) console.error(`soak: ${message}`)
  console.error(
    'usage: node scripts/soak.js [--cluster | --tls | --mtls | --sentinel [--failover command|kill]] [--seeds N] [--minutes M] [--seed S [--repeat R]] [--first S] [--duration MS] [--out DIR] [--l1 off|BYTES] [--serializer json|v8|custom] [--tags on|off] [--no-faults] [--verbose]',
  )
  process.exit(2)
}

function parseArgs(argv) {
  const args = {
    seeds: null,
    minutes: null,
    seed: null,
    repeat: 1,
    first: null,
    duration: DEFAULTS.durationMs,
    out: null,
    verbose: false,
    cluster: false,
    tls: false,
    mtls: false,
    sentinel: false,
    failover: undefined,
    l1: undefined,
    serializer: undefined,
    tags: undefined,
    faults: true,
  }
  const number = (name, v, { integer = true, min = 0 } = {}) => {
    const n = Number(v)
    if (v === undefined || !Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min) usage(`--${name} needs a number >= ${min}, got ${v}`)
    return n
  }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const [flag, inline] = a.includes('=') ? a.split(/=(.*)/s) : [a, undefined]
    const value = () => (inline !== undefined ? inline : argv[++i])
    switch (flag) {
      case '--seeds':
        args.seeds = number('seeds', value(), { min: 1 })
        break
      case '--minutes':
        args.minutes = number('minutes', value(), { integer: false, min: 0.01 })
        break
      case '--seed':
        args.seed = number('seed', value()) >>> 0
        break
      case '--repeat':
        args.repeat = number('repeat', value(), { min: 1 })
        break
      case '--first':
        args.first = number('first', value()) >>> 0
        break
      case '--duration':
        args.duration = number('duration', value(), { min: 1_000 })
        break
      case '--out':
        args.out = value()
        if (!args.out) usage('--out needs a directory')
        break
      case '--l1': {
        const v = value()
        args.l1 = v === 'off' ? false : { maxBytes: number('l1', v, { min: 1 }) }
        break
      }
      case '--serializer':
        args.serializer = value()
        if (!['json', 'v8', 'custom'].includes(args.serializer)) usage(`--serializer is json, v8 or custom, got ${args.serializer}`)
        break
      case '--tags': {
        const v = value()
        if (v !== 'on' && v !== 'off') usage(`--tags is on or off, got ${v}`)
        args.tags = v === 'on'
        break
      }
      case '--no-faults':
        args.faults = false
        break
      case '--verbose':
        args.verbose = true
        break
      case '--cluster':
        args.cluster = true
        break
      case '--tls':
        args.tls = true
        break
      case '--mtls':
        args.mtls = true
        break
      case '--sentinel':
        args.sentinel = true
        break
      case '--failover': {
        const v = value()
        if (v !== 'command' && v !== 'kill') usage(`--failover is command or kill, got ${v}`)
        args.failover = v === 'kill' ? 'SIGKILL' : 'SENTINEL FAILOVER'
        break
      }
      case '--help':
      case '-h':
        usage()
        break
      default:
        usage(`unknown argument ${a}`)
    }
  }
  if (args.seed === null && args.seeds === null && args.minutes === null) args.minutes = 5
  if ([args.cluster, args.tls, args.mtls, args.sentinel].filter(Boolean).length > 1) usage('--cluster, --tls, --mtls and --sentinel are separate modes')
  if (args.failover && !args.sentinel) usage('--failover needs --sentinel')
  return args
}

function printSummary() {
  const runs = state.runs
  const minutes = (Date.now() - state.startedAt) / 60_000
  const ops = runs.reduce((s, h) => s + h.ops.length, 0)
  const faults = runs.flatMap((h) => h.faults)
  const byKind = {}
  for (const h of runs) {
    for (const v of h.violations) {
      byKind[v.kind] ??= { count: 0, seeds: new Set() }
      byKind[v.kind].count++
      byKind[v.kind].seeds.add(h.seed)
    }
  }
  const failing = [...new Set(runs.filter((h) => h.violations.length > 0).map((h) => h.seed))]
  const empty = runs.filter(testedNothing)
  console.log('')
  console.log(`soak summary${state.interrupted ? ' (interrupted)' : ''}`)
  console.log(`  runs:       ${runs.length} (${new Set(runs.map((h) => h.seed)).size} seeds) in ${minutes.toFixed(1)} min`)
  console.log(`  operations: ${ops} (${runs.reduce((s, h) => s + h.loads.length, 0)} loader calls)`)
  console.log(
    `  faults:     ${faults.length} (${
      Object.entries(countBy(faults, (f) => f.kind))
        .map(([k, n]) => `${k} ${n}`)
        .join(', ') || 'none'
    })`,
  )
  if (state.cluster) {
    const kills = faults.filter((f) => f.kind === 'kill-master' && f.newMaster)
    const promoted = kills.map((f) => f.promotedMs).sort((a, b) => a - b)
    const pct = (q) => promoted[Math.min(promoted.length - 1, Math.floor(q * promoted.length))]
    const moved = runs.reduce((s, h) => s + (h.cluster?.after ? h.keys.filter((k) => h.cluster.before.owners[k] !== h.cluster.after.owners[k]).length : 0), 0)
    console.log(
      `  cluster:    ${state.clusters} cluster(s) started; ${kills.length} masters killed and failed over${promoted.length ? ` (promotion ${promoted[0]}/${pct(0.5)}/${promoted[promoted.length - 1]} ms min/median/max)` : ''}; ${moved} key-master changes in all`,
    )
  }
  if (state.sentinel) {
    const fos = faults.filter((f) => f.kind === 'failover')
    const byHow = countBy(fos, (f) => `${f.how}${f.newMaster ? '' : ' (failed)'}`)
    const ms = fos.filter((f) => f.newMaster).map((f) => f.promotedMs)
    const lost = runs.reduce((s, h) => s + (h.lostInFailover ? h.lostInFailover.length : 0), 0)
    console.log(
      `  sentinel:   ${fos.length} failover(s) (${Object.entries(byHow)
        .map(([k, n]) => `${k} ${n}`)
        .join(
          ', ',
        )})${ms.length ? `, promotion ${Math.min(...ms)}-${Math.max(...ms)} ms` : ''}; ${lost} final state(s) explained by writes the old master took in a command failover's window (allowed)`,
    )
  }
  if (state.failed.length > 0) {
    console.log(
      `  incomplete: ${state.failed.length} run(s) could not complete: seeds ${state.failed.map((f) => f.seed).join(' ')} (first: ${state.failed[0].error.split('\n')[0]})`,
    )
  }
  const configs = countBy(runs, (h) => `${h.cfg.serializer}${h.cfg.tags ? '+tags' : ''}`)
  const l1s = countBy(
    runs.flatMap((h) => h.config),
    (c) => (c.l1 === false ? 'off' : c.l1 && c.l1.maxBytes ? 'maxBytes' : 'lru'),
  )
  console.log(
    `  configs:    ${Object.entries(configs)
      .map(([k, n]) => `${k} ${n}`)
      .join(', ')}; workers' l1: ${Object.entries(l1s)
      .map(([k, n]) => `${k} ${n}`)
      .join(', ')}`,
  )
  const opKinds = countBy(
    runs.flatMap((h) => h.ops),
    (o) => o.op,
  )
  console.log(
    `  op kinds:   ${Object.entries(opKinds)
      .map(([k, n]) => `${k} ${n}`)
      .join(', ')}`,
  )
  if (empty.length > 0)
    console.log(
      `  empty:      ${empty.length} run(s) tested nothing (${empty.map((h) => `seed ${h.seed}: ${testedNothing(h)}`).join('; ')}): that fails the soak`,
    )
  if (failing.length === 0) {
    console.log('  violations: none')
  } else {
    console.log(`  violations: ${runs.reduce((s, h) => s + h.violations.length, 0)} in ${failing.length} seed(s)`)
    for (const [kind, { count, seeds }] of Object.entries(byKind)) {
      const list = [...seeds]
      console.log(`    ${kind} x${count} in seeds ${list.slice(0, 20).join(' ')}${list.length > 20 ? ` (+${list.length - 20})` : ''}`)
    }
    console.log(
      `  replay:     npm run soak -- --seed ${failing[0]} --repeat 3${state.cluster ? ' --cluster' : state.sentinel ? ' --sentinel' : state.mtls ? ' --mtls' : state.tls ? ' --tls' : ''}`,
    )
  }
}

/** Why a run proves nothing (no operation, no loader call, no fault), or '' if it tested something. */
function testedNothing(h) {
  if (h.ops.length === 0) return 'no operation ran'
  if (h.loads.length === 0) return 'no loader was called'
  if (h.faults.length === 0 && h.faultsAsked) return 'no fault was injected'
  return ''
}

async function main() {
  const args = parseArgs(process.argv.slice(2))
  const deadline = args.minutes === null ? Infinity : state.startedAt + args.minutes * 60_000
  const maxRuns = args.seed !== null ? args.repeat : (args.seeds ?? Infinity)
  const first = args.seed ?? args.first ?? Math.floor(Math.random() * 2 ** 31)
  if (args.out) fs.mkdirSync(args.out, { recursive: true })
  state.cluster = args.cluster
  state.tls = args.tls
  state.mtls = args.mtls
  state.sentinel = args.sentinel
  const against = args.cluster
    ? ' against a Redis Cluster'
    : args.sentinel
      ? ' through Sentinel (a master, a replica and a sentinel per seed; one failover per run)'
      : args.mtls
        ? ' against a redis-server requiring client certificates (mutual TLS)'
        : args.tls
          ? ' against a TLS-only redis-server'
          : ''
  console.log(
    args.seed !== null
      ? `soak: replaying seed ${args.seed} ${args.repeat} time(s)${against}`
      : `soak: seeds from ${first}${maxRuns !== Infinity ? `, ${maxRuns} of them` : ''}${deadline !== Infinity ? `, for ${args.minutes} min` : ''}${against}`,
  )
  // Every run kills one master: a cluster serves runs while a master with a replica is left.
  let cluster = null
  const usableCluster = async () => {
    if (cluster && (await clusterUsable(cluster))) return cluster
    if (cluster) await cluster.dispose()
    cluster = null
    const c = new RedisCluster({ nodeTimeout: 1_000 })
    try {
      await c.start()
    } catch (err) {
      await c.dispose()
      throw err
    }
    state.clusters++
    cluster = c
    return cluster
  }
  for (let i = 0; i < maxRuns && Date.now() < deadline && !state.interrupted; i++) {
    const seed = args.seed !== null ? args.seed : (first + i) >>> 0
    let h
    try {
      h = await runHistory({
        seed,
        durationMs: args.duration,
        cluster: args.cluster ? await usableCluster() : null,
        tls: args.tls,
        mtls: args.mtls,
        sentinel: args.sentinel,
        sentinelFailover: args.failover,
        l1: args.l1,
        serializer: args.serializer,
        tags: args.tags,
        faults: args.faults,
        log: args.verbose ? (line) => console.log(`  ${line}`) : () => {},
      })
    } catch (err) {
      // Not a verdict on the cache (a Redis or cluster that would not start or heal): say so,
      // start afresh, go on.
      state.failed.push({ seed, error: String(err && err.stack ? err.stack : err) })
      console.log(`seed ${seed}: the run could not complete: ${String(err && err.stack ? err.stack : err).slice(0, 3_000)}`)
      if (cluster) await cluster.dispose()
      cluster = null
      continue
    }
    state.runs.push(h)
    console.log(summarize(h))
    if (testedNothing(h)) console.log(`seed ${seed}: this run tested nothing: ${testedNothing(h)}`)
    if (h.violations.length > 0) {
      console.log(formatViolations(h, { max: args.verbose ? 20 : 3, historyLines: args.verbose ? 80 : 40 }))
      if (args.out) {
        const file = path.join(args.out, `history-seed${seed}-${state.runs.length}.json`)
        fs.writeFileSync(file, JSON.stringify(h, null, 1))
        console.log(`  full history: ${file}`)
      }
    }
  }
  if (cluster) await cluster.dispose()
  printSummary()
  const verdictFails = state.runs.length === 0 || state.runs.some((h) => h.violations.length > 0 || testedNothing(h)) || state.failed.length > 0
  process.exitCode = verdictFails ? 1 : 0
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
