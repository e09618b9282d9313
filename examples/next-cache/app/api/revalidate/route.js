import { revalidatePath, revalidateTag } from 'next/cache'

// POST /api/revalidate?tag=...: revalidateTag(tag, 'max') on this instance (each tagged entry is
// served stale once while one instance regenerates it); &form=now: revalidateTag(tag, { expire: 0 })
// and &form=legacy: the profile-less revalidateTag(tag) (both: gone at once, the next read computes).
// POST /api/revalidate?path=...: revalidatePath(path).
export async function POST(request) {
  const params = new URL(request.url).searchParams
  const tag = params.get('tag')
  const path = params.get('path')
  const form = params.get('form') ?? 'max'
  if (tag && form === 'now') revalidateTag(tag, { expire: 0 })
  else if (tag && form === 'legacy') revalidateTag(tag)
  else if (tag) revalidateTag(tag, 'max')
  else if (path) revalidatePath(path)
  else return Response.json({ error: 'tag or path is required' }, { status: 400 })
  return Response.json({ revalidated: tag ?? path, form })
}
