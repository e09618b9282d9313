'use strict'
// Loads the native addon through the loader `napi build` generates (native.js), and turns its
// failure into an error a user can act on. napi's own message blames an npm bug with optional
// dependencies whatever went wrong, which misleads on a platform no binary is built for and hides
// the usual causes on one that has a binary (installed with optional dependencies off, or a
// lockfile made on another platform).

// The prebuilt binaries, one npm package each (`stampede-cache-<target>`), in the order of
// package.json's napi.targets; __test__/packaging.test.js checks that the two lists agree.
const PREBUILT = [
  { target: 'linux-x64-gnu', platform: 'linux', arch: 'x64', libc: 'glibc', label: 'Linux x64 (glibc)' },
  { target: 'linux-arm64-gnu', platform: 'linux', arch: 'arm64', libc: 'glibc', label: 'Linux arm64 (glibc)' },
  { target: 'linux-x64-musl', platform: 'linux', arch: 'x64', libc: 'musl', label: 'Linux x64 (musl, e.g. Alpine)' },
  { target: 'linux-arm64-musl', platform: 'linux', arch: 'arm64', libc: 'musl', label: 'Linux arm64 (musl, e.g. Alpine)' },
  { target: 'darwin-x64', platform: 'darwin', arch: 'x64', libc: null, label: 'macOS x64' },
  { target: 'darwin-arm64', platform: 'darwin', arch: 'arm64', libc: null, label: 'macOS arm64 (Apple silicon)' },
  { target: 'win32-x64-msvc', platform: 'win32', arch: 'x64', libc: null, label: 'Windows x64' },
]

const PACKAGE = 'stampede-cache'

// glibc or musl, the way napi's loader tells them apart (a glibc Node reports the glibc it runs
// on); null off Linux or when Node cannot say.
function detectLibc() {
  if (process.platform !== 'linux') return null
  try {
    if (typeof process.report?.getReport !== 'function') return null
    process.report.excludeNetwork = true
    const report = process.report.getReport()
    if (report.header?.glibcVersionRuntime) return 'glibc'
    if (Array.isArray(report.sharedObjects) && report.sharedObjects.some((f) => f.includes('libc.musl-') || f.includes('ld-musl-'))) {
      return 'musl'
    }
  } catch {
    // The report is a best effort; the message then names platform and arch only.
  }
  return null
}

// napi's chain of load errors (messages only, their codes dropped): the one from inside this
// platform's package says why a binary that is there did not load (a libc too old, a corrupt file).
function packageLoadError(cause, pkg) {
  for (let e = cause, depth = 0; e && depth < 50; e = e.cause, depth++) {
    const text = typeof e.message === 'string' ? e.message : ''
    if (text.includes(pkg) && !text.startsWith('Cannot find module')) return text.split('\n')[0]
  }
  return null
}

function isInstalled(pkg) {
  try {
    require.resolve(`${pkg}/package.json`)
    return true
  } catch {
    return false
  }
}

function nativeBindingError(cause) {
  const { platform, arch } = process
  const libc = detectLibc()
  const here = `${platform}-${arch}${libc ? ` (${libc})` : ''}`
  const supported = PREBUILT.map((p) => p.label).join(', ')
  const fromSource =
    'build the addon from source with a Rust toolchain (https://rustup.rs): clone the repository, run `npm install` there ' +
    '(it compiles the addon), then install that folder into your app; see "Build from source" in the README'
  const match = PREBUILT.find((p) => p.platform === platform && p.arch === arch && (p.libc === null || libc === null || p.libc === libc))
  let message
  if (match) {
    const pkg = `${PACKAGE}-${match.target}`
    if (isInstalled(pkg)) {
      const inner = packageLoadError(cause, pkg)
      message =
        `${PACKAGE}: the native binary for ${here} is installed (${pkg}) but failed to load` +
        `${inner ? `: ${inner}` : ''}. Supported platforms: ${supported}. ` +
        `Reinstall it (remove node_modules/${pkg} and run your package manager's install again), or ${fromSource}.`
    } else {
      message =
        `${PACKAGE}: the native binary for ${here} is missing: the package ${pkg} was not installed. ` +
        `It is an optional dependency of ${PACKAGE}, so installs with optional dependencies turned off skip it ` +
        '(npm --omit=optional or --no-optional, yarn --ignore-optional, pnpm --no-optional), and so do lockfiles made ' +
        `on another platform by some package managers. Install with optional dependencies enabled (or add ${pkg} ` +
        `to your dependencies), or ${fromSource}. Supported platforms: ${supported}.`
    }
  } else {
    message = `${PACKAGE}: no prebuilt native binary for ${here}. Supported platforms: ${supported}. ` + `On this platform, ${fromSource}.`
  }
  const err = new Error(message, { cause })
  err.code = 'ERR_NATIVE_BINDING'
  return err
}

// The runtime this is, when it cannot load a native addon at all (no N-API): the Next.js Edge
// runtime (it defines EdgeRuntime), Cloudflare Workers, a browser bundle, any host without Node's
// process.dlopen. null under Node.js, Bun and Deno, which load addons. Building from source cannot
// help there, so the error says which runtime to use instead.
function runtimeWithoutNapi() {
  if (typeof EdgeRuntime === 'string') return `the Next.js Edge runtime (EdgeRuntime = ${JSON.stringify(EdgeRuntime)})`
  if (typeof navigator === 'object' && navigator !== null && navigator.userAgent === 'Cloudflare-Workers') return 'Cloudflare Workers'
  const proc = typeof process === 'object' && process !== null ? process : undefined
  const browser = typeof window === 'object' || typeof document === 'object'
  if (typeof proc?.versions?.node !== 'string') return browser ? 'a browser bundle' : 'a JavaScript runtime that is not Node.js-compatible'
  if (typeof proc.dlopen !== 'function') return browser ? 'a browser bundle' : 'a runtime without native addons (no process.dlopen)'
  return null
}

function unsupportedRuntimeError(runtime) {
  const err = new Error(
    `${PACKAGE} cannot run under ${runtime}: it is a native addon (loaded through N-API), and this runtime cannot ` +
      "load native addons. Use the Node.js runtime: in Next.js, `export const runtime = 'nodejs'` in the route or page that " +
      'imports it (the cacheHandler and cacheHandlers files always run under Node.js); Bun and Deno work too.',
  )
  err.code = 'ERR_UNSUPPORTED_RUNTIME'
  return err
}

const unsupported = runtimeWithoutNapi()
if (unsupported !== null) throw unsupportedRuntimeError(unsupported)

let native
try {
  native = require('./native.js')
} catch (cause) {
  throw nativeBindingError(cause)
}

module.exports = native
