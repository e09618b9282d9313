import { unstable_cache } from 'next/cache'
import { connection } from 'next/server'
import { countRun } from '../../../lib/runs.js'

// unstable_cache goes through next.config `cacheHandler` (the incremental cache), as ISR does.
const slowLegacy = unstable_cache(
  async (k) => {
    const run = await countRun(`runs:legacy:${k}`)
    await new Promise((resolve) => setTimeout(resolve, 1500))
    return { k, run, nonce: Math.random().toString(36).slice(2, 10) }
  },
  ['legacy'],
  { tags: ['legacy'], revalidate: 3600 },
)

// GET /api/legacy?k=...
export async function GET(request) {
  await connection()
  const k = new URL(request.url).searchParams.get('k') ?? 'a'
  return Response.json(await slowLegacy(k))
}
