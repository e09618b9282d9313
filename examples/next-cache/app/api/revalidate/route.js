import { revalidateTag } from 'next/cache'

// POST /api/revalidate?tag=...: revalidateTag(tag, 'max') on this instance.
export async function POST(request) {
  const tag = new URL(request.url).searchParams.get('tag')
  if (!tag) return Response.json({ error: 'tag is required' }, { status: 400 })
  revalidateTag(tag, 'max')
  return Response.json({ revalidated: tag })
}
