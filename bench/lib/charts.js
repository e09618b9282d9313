'use strict'
// SVG charts from a results object: vega-lite specs compiled to vega and rendered to SVG by vega
// itself in Node (renderer 'none' + toSVG: no browser, no canvas).
const fs = require('node:fs')
const path = require('node:path')
const { label, SELF } = require('./report')
const { BASELINES } = require('./peers')

const PEER_ORDER = [
  'stampede-cache',
  'bentocache',
  'cache-manager',
  '@epic-web/cachified',
  'async-cache-dedupe',
  'naive cache-aside',
  'lru-cache 11 fetch',
  'plain Map (limit)',
]
const COLORS = ['#d62728', '#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd', '#7f7f7f', '#8c564b', '#111111']
const colorOf = (peers) => ({
  field: 'peer',
  type: 'nominal',
  sort: PEER_ORDER,
  scale: { domain: PEER_ORDER.filter((p) => peers.includes(p)), range: COLORS.filter((_, i) => peers.includes(PEER_ORDER[i])) },
  legend: { title: null, orient: 'bottom', columns: 4 },
})
const peersIn = (values) => [...new Set(values.map((v) => v.peer))]
const CONFIG = {
  font: 'Helvetica, Arial, sans-serif',
  view: { stroke: null },
  axis: { labelFontSize: 11, titleFontSize: 12 },
  title: { fontSize: 14, anchor: 'start' },
}

const SHORT = {
  1: '1. cold, 1 process',
  2: '2. cold, 4 processes',
  3: '3. hot key, ttl 1 s',
  5: '5. mass expiry, peak',
  6: '6. missing ids',
  7: '7. failing source',
}

function loadsSpec(results) {
  const values = []
  for (const sc of results.scenarios) {
    if (!SHORT[sc.id]) continue
    for (const r of sc.rows) {
      if (r.error || BASELINES.includes(r.peer)) continue
      const loads = sc.id === 7 ? r.failingLoads : sc.id === 5 ? r.peakLoadsPer100ms : r.loads
      values.push({ scenario: SHORT[sc.id], peer: label(r.peer), loads, plotted: Math.max(loads, 0.8) })
    }
  }
  return {
    title: {
      text: 'Loader calls per scenario (log scale; fewer is better)',
      subtitle: ['scenario 5: the peak of loads per 100 ms while the keys expire', 'scenario 7: loads that hit the failing source'],
    },
    width: 760,
    height: 300,
    data: { values },
    encoding: {
      x: { field: 'scenario', type: 'nominal', title: null, sort: Object.values(SHORT), axis: { labelAngle: 0, labelLimit: 200 } },
      xOffset: { field: 'peer', sort: PEER_ORDER },
      y: { field: 'plotted', type: 'quantitative', scale: { type: 'log', domainMin: 0.8 }, stack: null, title: 'loads' },
      color: colorOf(peersIn(values)),
    },
    layer: [
      { mark: { type: 'bar' }, encoding: { tooltip: [{ field: 'peer' }, { field: 'loads' }] } },
      {
        mark: { type: 'text', dy: -4, fontSize: 8, angle: 0 },
        encoding: { text: { field: 'loads', type: 'quantitative', format: '.3~s' }, color: { value: '#333' } },
      },
    ],
    config: CONFIG,
  }
}

function timelineSpec(results) {
  const sc = results.scenarios.find((s) => s.id === 5)
  const p = results.meta.sizes.mass
  const values = []
  const from = Math.floor(p.readFromMs / 100) - 5
  for (const r of sc.rows) {
    if (r.error || !r.timeline) continue
    const last = Math.ceil(p.readUntilMs / 100) + 10
    for (let b = Math.max(0, from); b < last; b++) values.push({ t: +(b / 10).toFixed(1), peer: label(r.peer), loads: r.timeline[b] || 0 })
  }
  return {
    title: {
      text: `Mass expiry: loads per 100 ms as ${p.keys.toLocaleString('en-US')} keys written together expire`,
      subtitle: [
        `ttl ${p.ttl / 1000} s; random reads at ${p.ratePerSec.toLocaleString('en-US')}/s from ${p.readFromMs / 1000} s`,
        'a lower, wider curve means expiry is spread',
        ...(sc.rows.some((r) => r.peer === 'naive' && r.shed)
          ? ['naive cache-aside stops loading once 4,000 of its reads', 'are stuck on the database: later arrivals are shed']
          : []),
      ],
    },
    width: 760,
    height: 300,
    data: { values },
    mark: { type: 'line', interpolate: 'step-after', strokeWidth: 1.6 },
    encoding: {
      x: { field: 't', type: 'quantitative', title: 'seconds after the write', scale: { zero: false } },
      y: { field: 'loads', type: 'quantitative', title: 'loads per 100 ms' },
      color: colorOf(peersIn(values)),
    },
    config: CONFIG,
  }
}

function hitSpec(results) {
  const sc = results.scenarios.find((s) => s.id === 4)
  const values = []
  for (const r of sc.rows) {
    if (r.error) continue
    for (const c of r.cells) values.push({ peer: label(r.peer), size: `${c.size} value`, mode: c.mode, ops: c.opsPerSec, isMap: r.peer === 'map' })
  }
  return {
    title: {
      text: 'Fresh-hit throughput in one process (ops/s, log scale)',
      subtitle: 'the black bar is a plain JS Map: the physical limit',
    },
    data: { values },
    facet: {
      column: { field: 'mode', type: 'nominal', title: null, sort: ['sequential', '64 in flight, 1 key', '64 in flight, 64 keys'] },
      row: { field: 'size', type: 'nominal', title: null, sort: ['small value', '100 KB value'] },
    },
    spec: {
      width: 230,
      height: 150,
      layer: [
        {
          mark: 'bar',
          encoding: {
            y: { field: 'peer', type: 'nominal', sort: PEER_ORDER, title: null },
            x: { field: 'ops', type: 'quantitative', scale: { type: 'log', domainMin: 100 }, stack: null, title: 'ops/s', axis: { format: '~s' } },
            color: { ...colorOf(peersIn(values)), legend: null },
          },
        },
        {
          mark: { type: 'text', align: 'left', dx: 3, fontSize: 9 },
          encoding: {
            y: { field: 'peer', type: 'nominal', sort: PEER_ORDER },
            x: { field: 'ops', type: 'quantitative', scale: { type: 'log', domainMin: 100 }, stack: null },
            text: { field: 'ops', type: 'quantitative', format: '.3~s' },
          },
        },
      ],
    },
    resolve: { scale: { x: 'shared' } },
    config: CONFIG,
  }
}

function redisReadSpec(results) {
  const sc = results.scenarios.find((s) => s.id === 8)
  const r = sc.rows.find((x) => x.peer === SELF && !x.error)
  const order = r.rows.map((x) => x.name)
  const values = r.rows.map((x) => ({
    read: x.name,
    ratio: x.ratio,
    faster: x.ratio >= 1 ? 'stampede-cache faster' : 'ioredis faster',
    sc: x.scReadsPerSec,
    io: x.ioReadsPerSec,
  }))
  const max = Math.max(1.25, ...values.map((v) => v.ratio * 1.15))
  const c = r.cold
  return {
    title: {
      text: 'Redis reads: stampede-cache (l1: false) / raw ioredis GET + JSON.parse',
      subtitle: [
        'reads/s ratio, median of interleaved rounds; right of the line = stampede-cache faster',
        `cold process, first read: stampede-cache ${c.scMs} ms, ioredis ${c.ioMs} ms (${c.ratio.toFixed(2)}x the time)`,
      ],
    },
    width: 560,
    height: 160,
    data: { values },
    layer: [
      {
        mark: { type: 'bar' },
        encoding: {
          y: { field: 'read', type: 'nominal', sort: order, title: null, axis: { labelLimit: 320 } },
          x: { field: 'ratio', type: 'quantitative', scale: { domain: [0, max] }, title: 'stampede-cache reads/s / ioredis reads/s', axis: { format: '.1f' } },
          color: {
            field: 'faster',
            type: 'nominal',
            scale: { domain: ['stampede-cache faster', 'ioredis faster'], range: [COLORS[0], COLORS[5]] },
            legend: null,
          },
          tooltip: [{ field: 'read' }, { field: 'ratio' }, { field: 'sc', title: 'stampede-cache reads/s' }, { field: 'io', title: 'ioredis reads/s' }],
        },
      },
      {
        mark: { type: 'text', align: 'left', dx: 3, fontSize: 10 },
        encoding: {
          y: { field: 'read', type: 'nominal', sort: order, title: null, axis: { labelLimit: 320 } },
          x: { field: 'ratio', type: 'quantitative' },
          text: { field: 'ratio', type: 'quantitative', format: '.2f' },
        },
      },
      {
        data: { values: [{ x: 1 }] },
        mark: { type: 'rule', color: '#111', strokeDash: [4, 3], strokeWidth: 1.2 },
        encoding: { x: { field: 'x', type: 'quantitative' } },
      },
    ],
    config: CONFIG,
  }
}

async function render(spec) {
  const vega = await import('vega')
  const vl = await import('vega-lite')
  const compiled = vl.compile({ $schema: 'https://vega.github.io/schema/vega-lite/v5.json', background: 'white', ...spec }).spec
  const view = new vega.View(vega.parse(compiled), { renderer: 'none' })
  const svg = await view.toSVG()
  view.finalize()
  return svg
}

/** Renders the charts that results has data for into dir; returns [{ file, title }]. */
async function writeCharts(results, dir, prefix) {
  fs.mkdirSync(dir, { recursive: true })
  const out = []
  const has = (id) => results.scenarios.some((s) => s.id === id && s.rows.some((r) => !r.error))
  const jobs = [
    [SHORT && results.scenarios.some((s) => SHORT[s.id]), 'loads.svg', 'Loader calls per scenario and peer', loadsSpec],
    [has(5), 'mass-expiry.svg', 'Mass-expiry timeline', timelineSpec],
    [has(4), 'hit-throughput.svg', 'Hit throughput against the Map limit', hitSpec],
    [has(8), 'redis-read.svg', 'Redis reads against a raw ioredis client', redisReadSpec],
  ]
  for (const [ok, file, title, spec] of jobs) {
    if (!ok) continue
    const name = `${prefix}${file}`
    fs.writeFileSync(path.join(dir, name), await render(spec(results)))
    out.push({ file: name, title })
  }
  return out
}

module.exports = { writeCharts, render, loadsSpec, timelineSpec, hitSpec, redisReadSpec }
