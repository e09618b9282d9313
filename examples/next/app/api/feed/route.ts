import { after } from 'next/server'
import { cache, source } from '../../../lib/feed'

// stampede-cache is a native addon: the Node.js runtime only, never 'edge'.
export const runtime = 'nodejs'
export const dynamic = 'force-dynamic'

export async function GET() {
  // Fresh: at once. Stale: at once too, and the one background refresh is handed to after(), so
  // the platform keeps the function alive until it ends. Cold: one query however many requests.
  const feed = await cache.getOrLoad('feed', () => source.load(), { waitUntil: after })
  return Response.json(feed)
}
