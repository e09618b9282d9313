import { StampedeCache } from 'stampede-cache'

export interface Feed {
  items: string[]
  version: number
  builtAt: string
}

/** Stands in for a slow query. Counts calls; `hold()` keeps them waiting (for the test's debug route). */
export class FeedSource {
  started = 0
  finished = 0
  private gate: Promise<void> | null = null
  private open: (() => void) | null = null

  async load(): Promise<Feed> {
    const version = ++this.started
    if (this.gate) await this.gate
    await new Promise((resolve) => setTimeout(resolve, 20))
    this.finished++
    return { items: ['post-1', 'post-2'], version, builtAt: new Date().toISOString() }
  }

  hold(): void {
    if (!this.gate) this.gate = new Promise((resolve) => (this.open = resolve))
  }

  release(): void {
    this.open?.()
    this.gate = null
    this.open = null
  }
}

interface FeedState {
  cache: StampedeCache
  source: FeedSource
  errors: string[]
}

// One cache per server process. Next.js may evaluate a module once per route bundle (and again on
// every edit under `next dev`), so the instance lives on globalThis, like a database client.
const g = globalThis as typeof globalThis & { __stampedeFeed?: FeedState }

function create(): FeedState {
  const errors: string[] = []
  const cache = new StampedeCache({
    redis: process.env.REDIS_URL, // absent: in-process only
    ttl: Number(process.env.FEED_TTL_MS ?? 30_000), // fresh this long
    hardTtl: 600_000, // then served stale (while one refresh runs) for up to 10 minutes
    // err is whatever the loader threw (unknown), or a StampedeCacheError for Redis failures.
    onError: (err, info) => errors.push(`${info.op}: ${err instanceof Error ? err.message : String(err)}`),
  })
  return { cache, source: new FeedSource(), errors }
}

export const { cache, source, errors } = (g.__stampedeFeed ??= create())
