// A Vercel Function (Node.js runtime): GET /api/feed?user=42. A stale feed is answered at once;
// its one background refresh is handed to waitUntil from @vercel/functions, so the instance is
// kept alive until the refresh ends instead of being frozen with it half done.
// Deploy: a package.json with `stampede-cache` and `@vercel/functions` as dependencies.
import { cache, source } from '../lib/feed.mjs'

export async function GET(request) {
  const user = new URL(request.url).searchParams.get('user') ?? 'anonymous'
  const feed = await cache.getOrLoad(['feed', user], () => source.load(user))
  return Response.json(feed)
}
