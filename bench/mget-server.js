#!/usr/bin/env node
'use strict'
// What one warm batch's MGET costs the server, by who sends it and what it reads: Redis's own
// time per MGET (INFO commandstats usec_per_call, reset before each side) for 1,000 keys, in one
// run on one private redis-server, the sides interleaved round by round:
//   raw:   ioredis MGET of values ioredis wrote raw (JSON, SET PX), plus JSON.parse of each;
//   ours:  ioredis MGET of this library's value keys (its envelopes), bytes not decoded;
//   lane:  getMany with l1: false, as the read lane sends it.
// raw against ours is what the envelopes and key names cost; ours against lane is what the lane
// adds (its requests or the way it reads replies). Printed as ratios to raw; never asserted.
//
//   node bench/mget-server.js [--rounds 3] [--batches 300] [--in-flight 1] [--keys 1000]
const path = require('node:path')
const { startRedis } = require('./redis-lib')
const { StampedeCache } = require('..')

const args = process.argv.slice(2)
const option = (name, fallback) => {
  const i = args.indexOf(name)
  return i >= 0 ? Number(args[i + 1]) : fallback
}
const ROUNDS = option('--rounds', 3)
const BATCHES = option('--batches', 300)
const IN_FLIGHT = option('--in-flight', 1)
const N = option('--keys', 1_000)

const keys = Array.from({ length: N }, (_, i) => `user:${i}`)
const userOf = (k) => {
  const id = Number(k.slice(5))
  return { id, name: `User ${id}`, email: `user${id}@example.com`, plan: id % 3 === 0 ? 'pro' : 'free', tags: ['a', 'b'] }
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

async function mgetUsec(io) {
  const m = /cmdstat_mget:calls=(\d+),usec=(\d+)/.exec(await io.info('commandstats'))
  if (m === null) throw new Error('no MGET was counted')
  return Number(m[2]) / Number(m[1])
}

async function side(io, batch) {
  await io.config('RESETSTAT')
  let next = 0
  const lane = async () => {
    while (next < BATCHES) {
      next++
      await batch()
    }
  }
  await Promise.all(Array.from({ length: IN_FLIGHT }, lane))
  return mgetUsec(io)
}

async function main() {
  const redis = await startRedis()
  const Redis = require(path.join(__dirname, 'node_modules', 'ioredis'))
  const io = new Redis(redis.url)
  const namespace = 'ms'
  const writer = new StampedeCache({ redis: redis.url, namespace, ttl: 600_000 })
  const reader = new StampedeCache({ redis: redis.url, namespace, ttl: 600_000, l1: false })
  try {
    await writer.getOrLoadMany(keys, (ids) => ids.map(userOf))
    for (let i = 0; i < 5; i++) {
      await reader.getMany(['__lane__'])
      await new Promise((r) => setTimeout(r, 20))
    }
    const raw = keys.map((k) => `raw:${k}`)
    const pipe = io.pipeline()
    keys.forEach((k, i) => pipe.set(raw[i], JSON.stringify(userOf(k)), 'PX', 600_000))
    await pipe.exec()
    // This library's value keys, as Redis holds them (found by the first key's name).
    const all = await io.keys(`${namespace}:v*`)
    const first = all.find((k) => k.endsWith(`{${keys[0]}}`))
    const ours = keys.map((k) => first.replace(`{${keys[0]}}`, `{${k}}`))
    const check = await reader.getMany(keys)
    if (check.some((v, i) => v.id !== i)) throw new Error('the lane answered wrong values')
    const sides = {
      raw: async () => {
        for (const v of await io.mget(raw)) JSON.parse(v)
      },
      ours: () => io.mgetBuffer(ours),
      lane: () => reader.getMany(keys),
    }
    const names = Object.keys(sides)
    const usec = Object.fromEntries(names.map((n) => [n, []]))
    for (let r = 0; r < ROUNDS; r++) {
      for (let j = 0; j < names.length; j++) {
        const name = names[(j + r) % names.length]
        usec[name].push(await side(io, sides[name]))
      }
    }
    const bytes = async (k) => (await io.getBuffer(k)).length
    console.log(`\nServer time per MGET of ${N} keys, median of ${ROUNDS} rounds of ${BATCHES} batches, ${IN_FLIGHT} in flight`)
    console.log(`(a value: raw ${await bytes(raw[0])} B, envelope ${await bytes(ours[0])} B; keys ${raw[0]} and ${ours[0]})\n`)
    console.log('| side | usec per MGET | against raw |\n|---|---:|---:|')
    const base = median(usec.raw)
    for (const n of names) console.log(`| ${n} | ${median(usec[n]).toFixed(1)} | ${(median(usec[n]) / base).toFixed(2)}x |`)
  } finally {
    io.disconnect()
    await writer.close()
    await reader.close()
    redis.stop()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
