import { cacheTag } from 'next/cache'
import { countRun } from './runs.js'

// A slow computation behind "use cache": 1.5 s, each run counted in Redis. One run serves every
// instance while the entry lives; revalidateTag('report') makes the next read compute it again.
export async function getReport(k) {
  'use cache'
  cacheTag('report')
  const run = await countRun(`runs:report:${k}`)
  await new Promise((resolve) => setTimeout(resolve, 1500))
  return { k, run, nonce: Math.random().toString(36).slice(2, 10) }
}
