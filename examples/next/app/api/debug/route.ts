// For the test (__test__/next.test.js) only; an app of yours does not need this route.
import { cache, errors, source } from '../../../lib/feed'

export const runtime = 'nodejs'
export const dynamic = 'force-dynamic'

export async function GET() {
  return Response.json({
    started: source.started,
    finished: source.finished,
    stats: cache.stats(),
    entry: (await cache.inspect('feed')) ?? null,
    errors,
  })
}

/** ?action=hold keeps the next queries waiting; ?action=release lets them go. */
export async function POST(request: Request) {
  const action = new URL(request.url).searchParams.get('action')
  if (action === 'hold') source.hold()
  else if (action === 'release') source.release()
  else return Response.json({ error: 'action must be hold or release' }, { status: 400 })
  return Response.json({ ok: true })
}
