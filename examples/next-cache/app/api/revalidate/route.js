import { revalidatePath, revalidateTag } from 'next/cache'

// POST /api/revalidate?tag=...: revalidateTag(tag, 'max') on this instance;
// POST /api/revalidate?path=...: revalidatePath(path).
export async function POST(request) {
  const params = new URL(request.url).searchParams
  const tag = params.get('tag')
  const path = params.get('path')
  if (tag) revalidateTag(tag, 'max')
  else if (path) revalidatePath(path)
  else return Response.json({ error: 'tag or path is required' }, { status: 400 })
  return Response.json({ revalidated: tag ?? path })
}
