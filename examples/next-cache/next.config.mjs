import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))

/** @type {import('next').NextConfig} */
const nextConfig = {
  cacheComponents: true, // "use cache" needs it
  partialPrefetching: true, // what Next.js 16.4 asks of a new Cache Components app
  cacheHandler: fileURLToPath(new URL('./cache-handler.mjs', import.meta.url)), // ISR, fetch, unstable_cache
  cacheHandlers: { default: fileURLToPath(new URL('./use-cache-handler.mjs', import.meta.url)) }, // "use cache"
  cacheMaxMemorySize: 0, // the handlers keep their own in-process tier
  // stampede-cache loads a native addon (.node): Next.js must require it from node_modules at run
  // time instead of bundling it.
  serverExternalPackages: ['stampede-cache'],
  // This example sits inside the library's repository, which has its own lockfile.
  turbopack: { root: here },
  outputFileTracingRoot: here,
}

// NEXT_CACHE_HANDLER=default runs the same build with Next.js's own handlers (in memory, one per
// instance). Read when `next start` loads this file: the test compares both on one build.
if (process.env.NEXT_CACHE_HANDLER === 'default') {
  delete nextConfig.cacheHandler
  delete nextConfig.cacheHandlers
  delete nextConfig.cacheMaxMemorySize
}

export default nextConfig
