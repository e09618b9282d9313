import { dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))

/** @type {import('next').NextConfig} */
const nextConfig = {
  // stampede-cache loads a native addon (.node): Next.js must require it from node_modules at run
  // time instead of bundling it.
  serverExternalPackages: ['stampede-cache'],
  // This example sits inside the library's repository, which has its own lockfile.
  turbopack: { root: here },
  outputFileTracingRoot: here,
}

export default nextConfig
