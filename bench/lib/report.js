'use strict'
// Goal checks, progress lines and the Markdown report, all from the results object of run.js.
const { CONFIGS, BASELINES } = require('./peers')

const SELF = 'stampede-cache'
const fmtInt = (n) => (n === undefined || n === null ? '–' : Math.round(n).toLocaleString('en-US'))
const fmtMs = (n) => (n === undefined || n === null ? '–' : n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n >= 1 ? n.toFixed(2) : n.toFixed(3))
const fmtX = (n) => (Number.isFinite(n) ? (n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2)) + 'x' : '–')
const label = (peer) => (CONFIGS[peer] ? CONFIGS[peer].label : peer)

function rowsOf(results, id) {
  const sc = results.scenarios.find((s) => s.id === id)
  return sc ? sc.rows : []
}

function cell(results, peer, size, mode) {
  const row = rowsOf(results, 4).find((r) => r.peer === peer)
  const c = row && row.cells && row.cells.find((x) => x.size === size && x.mode === mode)
  return c ? c.opsPerSec : undefined
}

/** The issue's goals as ratios measured in this run: { name, pass, detail }. */
function goalChecks(results) {
  const out = []
  const self = (id) => rowsOf(results, id).find((r) => r.peer === SELF && !r.error)
  const peers = (id) => rowsOf(results, id).filter((r) => r.peer !== SELF && !BASELINES.includes(r.peer) && !r.error)
  const add = (name, pass, detail) => out.push({ name, pass, detail })

  const s2 = self(2)
  if (s2)
    add(
      'scenario 2: 1 load',
      s2.loads === 1,
      `${s2.loads} load(s); peers ${peers(2)
        .map((r) => `${label(r.peer)} ${r.loads}`)
        .join(', ')}`,
    )

  const s3 = self(3)
  if (s3) {
    add(
      'scenario 3: <= 11 loads and no read slower than the loader',
      s3.loads <= 11 && s3.slowReads === 0,
      `${s3.loads} loads, ${s3.slowReads} read(s) over 20 ms (max ${fmtMs(s3.max)} ms); peers ${peers(3)
        .map((r) => `${label(r.peer)} ${r.loads}`)
        .join(', ')}`,
    )
  }

  for (const size of ['small', '100 KB']) {
    const mine = cell(results, SELF, size, 'sequential')
    const map = cell(results, 'map', size, 'sequential')
    const others = peers(4)
      .map((r) => ({ peer: r.peer, ops: cell(results, r.peer, size, 'sequential') }))
      .filter((x) => x.ops)
    if (mine && map && others.length) {
      const best = others.reduce((a, b) => (b.ops > a.ops ? b : a))
      const vsPeer = mine / best.ops
      const vsMap = mine / map
      add(
        `scenario 4 sequential, ${size}: >= 10x the best peer and >= 0.3x the Map`,
        vsPeer >= 10 && vsMap >= 0.3,
        `${fmtInt(mine)} ops/s = ${fmtX(vsPeer)} ${label(best.peer)} (${fmtInt(best.ops)}), ${fmtX(vsMap)} the Map (${fmtInt(map)})`,
      )
    }
  }

  // lru-cache is what most Node users reach for in process: every mode at >= 1.0x.
  for (const size of ['small', '100 KB']) {
    const modes = ['sequential', '64 in flight, 1 key', '64 in flight, 64 keys']
    const pairs = modes.map((mode) => [mode, cell(results, SELF, size, mode), cell(results, 'lru-cache', size, mode)])
    if (pairs.every(([, mine, lru]) => mine && lru)) {
      add(
        `scenario 4, ${size}: >= 1.0x lru-cache fetch in every mode`,
        pairs.every(([, mine, lru]) => mine >= lru),
        pairs.map(([mode, mine, lru]) => `${mode} ${fmtX(mine / lru)}`).join(', '),
      )
    }
  }

  const s5 = self(5)
  if (s5 && peers(5).length) {
    const best = peers(5).reduce((a, b) => (b.peakLoadsPer100ms < a.peakLoadsPer100ms ? b : a))
    const ratio = s5.peakLoadsPer100ms / best.peakLoadsPer100ms
    add(
      'scenario 5: peak loads per 100 ms <= 0.5x the best peer',
      ratio <= 0.5,
      `peak ${s5.peakLoadsPer100ms} = ${fmtX(ratio)} ${label(best.peer)} (${best.peakLoadsPer100ms})`,
    )
  }

  const s6 = self(6)
  if (s6) add('scenario 6: one load per missing id', s6.loads === s6.ids, `${s6.loads} loads for ${s6.ids} ids`)

  const s7 = self(7)
  if (s7 && peers(7).length) {
    const best = peers(7).reduce((a, b) => (b.failingLoads < a.failingLoads ? b : a))
    const ratio = best.failingLoads ? s7.failingLoads / best.failingLoads : Infinity
    add(
      "scenario 7: 100% of reads served and <= 0.2x the best peer's loads",
      s7.servedShare === 1 && ratio <= 0.2,
      `${(s7.servedShare * 100).toFixed(2)}% served, ${s7.failingLoads} load(s) hit the failing source = ${fmtX(ratio)} ${label(best.peer)} (${best.failingLoads})`,
    )
  }

  const s8 = self(8)
  if (s8 && s8.rows) {
    add(
      'scenario 8: Redis reads >= 1.0x raw ioredis in all four rows',
      s8.rows.length === 4 && s8.rows.every((r) => r.ratio >= 1),
      s8.rows.map((r) => `${r.name} ${fmtX(r.ratio)}`).join(', '),
    )
  }
  if (s8 && s8.cold) {
    add(
      "scenario 8: cold-process first read <= 0.2x ioredis's time",
      s8.cold.ratio <= 0.2,
      `stampede-cache ${fmtMs(s8.cold.scMs)} ms = ${fmtX(s8.cold.ratio)} ioredis (${fmtMs(s8.cold.ioMs)} ms), medians of ${s8.coldRuns ?? s8.cold.scRuns.length} fresh processes a side`,
    )
  }
  return out
}

function progressLine(scenario, row) {
  const head = `[${scenario.id}/8 ${scenario.slug.padEnd(16)}] ${label(row.peer).padEnd(20)}`
  const tail = `(${(row.caseMs / 1000).toFixed(1)} s)`
  if (row.error) return `${head} ERROR ${row.error} ${tail}`
  if (scenario.id === 8) {
    const ratios = row.rows.map((r) => `${r.name} ${fmtX(r.ratio)}`)
    return `${head} vs ioredis: ${ratios.join(', ')}; cold first read ${fmtMs(row.cold.scMs)} ms = ${fmtX(row.cold.ratio)} ${tail}`
  }
  if (row.cells) {
    const seq = row.cells.filter((c) => c.mode === 'sequential').map((c) => `${c.size} ${fmtInt(c.opsPerSec)}/s`)
    return `${head} sequential hits: ${seq.join(', ')} ${tail}`
  }
  const parts = [`loads ${fmtInt(row.loads)}`]
  if (row.failingLoads !== undefined) parts.push(`failing ${row.failingLoads}`, `served ${(row.servedShare * 100).toFixed(1)}%`)
  if (row.peakLoadsPer100ms !== undefined) parts.push(`peak/100ms ${row.peakLoadsPer100ms}`)
  if (row.slowReads !== undefined) parts.push(`slow ${row.slowReads}`)
  parts.push(`p50 ${fmtMs(row.p50)} ms`, `p99 ${fmtMs(row.p99)} ms`, `max ${fmtMs(row.max)} ms`)
  if (row.failed) parts.push(`failed ${row.failed}`)
  if (row.shed) parts.push(`shed ${row.shed}`)
  return `${head} ${parts.join('  ')} ${tail}`
}

function table(headers, rows, align) {
  const a = align || headers.map((_, i) => (i === 0 ? '---' : '---:'))
  return [`| ${headers.join(' | ')} |`, `| ${a.join(' | ')} |`, ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n')
}

function redisReadTable(sc) {
  const L = []
  for (const r of sc.rows) {
    if (r.error) {
      L.push(`${label(r.peer)}: error: ${r.error}`)
      continue
    }
    L.push(
      table(
        ['read', 'stampede-cache reads/s', 'ioredis reads/s', 'ratio (median of rounds)'],
        r.rows.map((x) => [x.name, fmtInt(x.scReadsPerSec), fmtInt(x.ioReadsPerSec), fmtX(x.ratio)]),
      ),
    )
    L.push('')
    L.push(
      `Cold process, first read (from process start to the value, median of ${r.coldRuns ?? r.cold.scRuns.length} fresh processes a side): ` +
        `stampede-cache ${fmtMs(r.cold.scMs)} ms, ioredis ${fmtMs(r.cold.ioMs)} ms (${fmtX(r.cold.ratio)} the time).`,
    )
  }
  return L.length ? L.join('\n') : '(not run: scenario 8 runs for stampede-cache only)'
}

function scenarioTable(sc) {
  const id = sc.id
  if (id === 8) return redisReadTable(sc)
  if (id === 4) {
    const map = sc.rows.find((r) => r.peer === 'map')
    const rows = []
    for (const r of sc.rows) {
      if (r.error) {
        rows.push([label(r.peer), 'error', r.error, '', '', ''])
        continue
      }
      for (const size of ['small', '100 KB']) {
        const get = (row, mode) => {
          const c = row && row.cells.find((x) => x.size === size && x.mode === mode)
          return c ? c.opsPerSec : undefined
        }
        const seq = get(r, 'sequential')
        const mapSeq = get(map, 'sequential')
        rows.push([
          label(r.peer),
          size,
          fmtInt(seq),
          seq ? (1e9 / seq).toFixed(0) : '–',
          fmtInt(get(r, '64 in flight, 1 key')),
          fmtInt(get(r, '64 in flight, 64 keys')),
          mapSeq && seq ? fmtX(seq / mapSeq) : '–',
        ])
      }
    }
    return table(['peer', 'value', 'sequential ops/s', 'ns/op', '64 in flight, 1 key ops/s', '64 in flight, 64 keys ops/s', 'sequential vs Map'], rows)
  }
  const extraCols = []
  if (id === 3) extraCols.push(['reads > 20 ms', (r) => fmtInt(r.slowReads)])
  if (id === 5) {
    extraCols.push(['peak loads / 100 ms', (r) => fmtInt(r.peakLoadsPer100ms)])
    extraCols.push(['keys loaded', (r) => fmtInt(r.distinctKeysLoaded)])
    extraCols.push(['fill ms', (r) => fmtMs(r.fillMs)])
  }
  if (id === 6) extraCols.push(['ids loaded', (r) => fmtInt(r.distinctIdsLoaded)])
  if (id === 7) {
    extraCols.push(['loads on the failing source', (r) => fmtInt(r.failingLoads)])
    extraCols.push(['served', (r) => (r.servedShare * 100).toFixed(2) + '%'])
  }
  const headers = ['peer', 'loads', ...extraCols.map((c) => c[0]), 'reads', 'failed', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', 'db max in flight']
  const rows = sc.rows.map((r) =>
    r.error
      ? [label(r.peer), `error: ${r.error}`, ...extraCols.map(() => ''), '', '', '', '', '', '', '']
      : [
          label(r.peer),
          fmtInt(r.loads),
          ...extraCols.map((c) => c[1](r)),
          fmtInt(r.reads) + (r.shed ? ` (+${fmtInt(r.shed)} shed)` : ''),
          fmtInt(r.failed),
          fmtMs(r.p50),
          fmtMs(r.p90),
          fmtMs(r.p99),
          fmtMs(r.max),
          fmtInt(r.maxDbInFlight),
        ],
  )
  return table(headers, rows)
}

/** The Markdown report. chartDir: path of the charts relative to the report (or null). */
function markdown(results, { chartDir, charts }) {
  const m = results.meta
  const L = []
  L.push(`# stampede-cache against its peers${m.quick ? ' (--quick, reduced sizes)' : ''}`)
  L.push('')
  L.push(
    `Run ${m.startedAt} on ${m.machine.cpu} (${m.machine.cores} cores, ${m.machine.memGiB} GiB), ${m.machine.os}, Node ${m.machine.node}, ` +
      `redis-server ${m.machine.redis} (private, 127.0.0.1, no persistence). Whole run: ${(m.totalMs / 1000).toFixed(0)} s. ` +
      '`npm run bench` reproduces it (`node bench/run.js --quick` for the reduced CI-sized run).',
  )
  L.push('')
  L.push('## Goal checks (ratios within this run)')
  L.push('')
  for (const g of results.goals) L.push(`- **${g.pass ? 'PASS' : 'MISS'}** ${g.name}: ${g.detail}`)
  L.push('')
  if (charts && chartDir !== null) {
    L.push('## Charts')
    L.push('')
    for (const c of charts) L.push(`![${c.title}](${chartDir}${c.file})`, '')
  }
  L.push('## How it is measured')
  L.push('')
  L.push(
    '- Every (scenario, peer) runs in fresh Node processes forked for it (4 real processes in scenarios 2, 3 and 7), against one private `redis-server` ' +
      'flushed between cases.',
  )
  L.push(
    '- Every loader call goes to one simulated database in the parent process, shared by all the workers of a case: a query takes 20 ms + 2 ms per query in flight, ' +
      'and queries already running slow down when more arrive, so a stampede feeds itself (`examples/demo/simulated-db.js`). ' +
      '"loads" counts its queries; latencies are per read, in the reading process.',
  )
  L.push('- Latency percentiles cover every read of the case, all processes together.')
  if (m.notes && m.notes.length) for (const n of m.notes) L.push(`- ${n}`)
  L.push('')
  L.push('## Peers and their configuration')
  L.push('')
  L.push(
    table(
      ['peer', 'configuration'],
      Object.keys(CONFIGS).map((k) => [label(k), CONFIGS[k].config.replace(/\|/g, '\\|')]),
      ['---', '---'],
    ),
  )
  L.push('')
  L.push('## Results')
  for (const sc of results.scenarios) {
    L.push('')
    L.push(`### ${sc.id}. ${sc.title}`)
    L.push('')
    L.push(sc.description + '.')
    L.push('')
    L.push(scenarioTable(sc))
  }
  const counters = results.scenarios.map((sc) => ({ sc, row: sc.rows.find((r) => r.peer === SELF && r.engineStats) })).filter((x) => x.row)
  if (counters.length) {
    const keys = Object.keys(counters[0].row.engineStats)
    L.push('')
    L.push(`### stampede-cache's own counters (\`stats()\`, summed over its processes; they include the untimed fill and warm-up reads)`)
    L.push('')
    L.push(
      table(
        ['scenario', ...keys],
        counters.map(({ sc, row }) => [String(sc.id), ...keys.map((k) => fmtInt(row.engineStats[k]))]),
      ),
    )
  }
  L.push('')
  return L.join('\n')
}

module.exports = { goalChecks, progressLine, markdown, label, SELF }
