'use strict'
// The package as npm users get it. The release workflow (.github/workflows/release.yml) cannot run
// here, so everything it relies on is run here instead, the same way:
// - a staged copy of the package goes through `npm run release:manifest` (drops the source build,
//   then `napi prepublish -t npm` declares every per-platform package as an optional dependency),
//   and is packed WITHOUT a binary; every npm/<target> folder is packed too, linux-x64-gnu with the
//   binary built here, the others with a placeholder (they are never loaded on this machine);
// - a registry on 127.0.0.1 serves those tarballs, so `npm install stampede-cache` in a fresh app
//   resolves the optional dependencies itself and must pick the one for this os/cpu/libc, with no
//   Rust toolchain on PATH and no other network;
// - CommonJS and ESM apps then call getOrLoad; an install without optional dependencies, an
//   unsupported platform and a broken binary each get the ERR_NATIVE_BINDING message.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { execFile, execFileSync } = require('node:child_process')

const root = path.join(__dirname, '..')
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))
const binaryName = pkg.napi.binaryName
// The target built in this checkout: the one binary at the root (`npm install` builds it; a release
// job downloads it), e.g. linux-x64-gnu.
const builtBinaries = fs.readdirSync(root).filter((f) => f.startsWith(`${binaryName}.`) && f.endsWith('.node'))
const HOST_TARGET = builtBinaries.length === 1 ? builtBinaries[0].slice(binaryName.length + 1, -'.node'.length) : null
const hostBinary = HOST_TARGET && path.join(root, builtBinaries[0])
// How binding.js names this machine: platform-arch, and the libc on Linux.
const HERE = `${process.platform}-${process.arch}${HOST_TARGET?.endsWith('-gnu') ? ' (glibc)' : HOST_TARGET?.endsWith('-musl') ? ' (musl)' : ''}`

// The main tarball: the package's code and types, its README and LICENSE, and nothing else
// (no src/, no tests, no binary, no generated native.d.ts).
const MAIN_FILES = [
  'LICENSE',
  'README.md',
  'binding.js',
  'index.d.ts',
  'index.js',
  'index.mjs',
  'lib/batch.js',
  'lib/cache.js',
  'lib/channels.js',
  'lib/codec.js',
  'lib/core.js',
  'lib/engine.js',
  'lib/errors.js',
  'lib/flight.js',
  'lib/fresh.js',
  'lib/keys.js',
  'lib/lane.js',
  'lib/many.js',
  'lib/reentry.js',
  'lib/scope.js',
  'native.js',
  'nestjs.d.ts',
  'nestjs.js',
  'nestjs.mjs',
  'next.d.ts',
  'next.js',
  'next.mjs',
  'observability.js',
  'otel.d.ts',
  'otel.js',
  'otel.mjs',
  'package.json',
  'prometheus.d.ts',
  'prometheus.js',
  'prometheus.mjs',
]

// The rust targets of package.json, as napi names their packages (napi's own parser).
let targets
// Everything the tests share, made once in before(): the tarballs, the registry, the apps.
let work
let registry
let npmCli
let env
const tarballs = new Map() // package name -> { file, manifest }

/** Runs a command to the end; resolves with its output, rejects with it on failure. */
function run(cmd, args, options = {}) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { env, timeout: 180_000, maxBuffer: 64 << 20, ...options }, (err, stdout, stderr) => {
      if (err) {
        err.message += `\n${stdout}${stderr}`
        reject(err)
      } else {
        resolve({ stdout, stderr, output: `${stdout}${stderr}` })
      }
    })
  })
}

const npm = (args, cwd) => run(process.execPath, [npmCli, ...args], { cwd })

function sri(buf) {
  return `sha512-${crypto.createHash('sha512').update(buf).digest('base64')}`
}

/** Serves packuments and tarballs of the packed packages on 127.0.0.1; 404 for anything else. */
function startRegistry() {
  const requests = []
  const server = http.createServer((req, res) => {
    requests.push(req.url)
    const url = decodeURIComponent(req.url.split('?')[0])
    const name = url.slice(1)
    const entry = tarballs.get(name)
    if (entry) {
      const { port } = server.address()
      const base = `http://127.0.0.1:${port}`
      const version = entry.manifest.version
      const body = {
        name,
        'dist-tags': { latest: version },
        versions: {
          [version]: {
            ...entry.manifest,
            _id: `${name}@${version}`,
            dist: {
              tarball: `${base}/-/tarball/${path.basename(entry.file)}`,
              integrity: entry.integrity,
              shasum: entry.shasum,
            },
          },
        },
      }
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify(body))
      return
    }
    if (url.startsWith('/-/tarball/')) {
      const found = [...tarballs.values()].find((t) => path.basename(t.file) === url.slice('/-/tarball/'.length))
      if (found) {
        res.writeHead(200, { 'content-type': 'application/octet-stream' })
        res.end(fs.readFileSync(found.file))
        return
      }
    }
    res.writeHead(404, { 'content-type': 'application/json' })
    res.end('{"error":"not found"}')
  })
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({ server, requests, url: `http://127.0.0.1:${server.address().port}/` }))
  })
}

/** A fresh app; `npm install` of stampede-cache from the loopback registry with `extra` flags. */
async function installApp(name, extra = []) {
  const dir = path.join(work, name)
  fs.mkdirSync(dir)
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name, private: true, version: '1.0.0' }))
  const result = await npm(
    [
      'install',
      `stampede-cache@${pkg.version}`,
      `--registry=${registry.url}`,
      `--cache=${path.join(work, `npm-cache-${name}`)}`,
      '--no-audit',
      '--no-fund',
      '--no-update-notifier',
      '--loglevel=warn',
      ...extra,
    ],
    dir,
  )
  return { dir, output: result.output }
}

const installed = (dir) =>
  fs
    .readdirSync(path.join(dir, 'node_modules'))
    .filter((n) => !n.startsWith('.'))
    .sort()

before(async () => {
  assert.ok(HOST_TARGET, `exactly one built ${binaryName}.*.node at the root, found: ${builtBinaries.join(', ') || 'none'}`)
  const cli = await import('@napi-rs/cli')
  targets = pkg.napi.targets.map((t) => cli.parseTriple(t))
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-packaging-'))
  // npm's own entry point, run with this node, so the PATH below needs nothing else.
  npmCli = fs.realpathSync(path.join(path.dirname(process.execPath), process.platform === 'win32' ? 'npm.cmd' : 'npm'))
  // No Rust on PATH (no ~/.cargo/bin), no npm_* variables from an enclosing `npm test`, and a HOME
  // of our own so no ~/.npmrc applies. napi's CLI is added only for the release:manifest step.
  const PATH = [...new Set([path.dirname(process.execPath), '/usr/bin', '/bin'])].join(path.delimiter)
  env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k) && k !== 'PATH'))
  Object.assign(env, { PATH, HOME: path.join(work, 'home'), NO_UPDATE_NOTIFIER: '1' })
  fs.mkdirSync(env.HOME)
  for (const tool of ['cargo', 'rustc']) {
    assert.throws(() => execFileSync('sh', ['-c', `command -v ${tool}`], { env, stdio: 'pipe' }), `${tool} must not be on the test PATH`)
  }

  // Stage the package as a release checkout would have it after `napi artifacts`.
  const stage = path.join(work, 'stage')
  fs.mkdirSync(stage)
  for (const file of ['package.json', 'README.md', 'LICENSE', ...pkg.files]) fs.cpSync(path.join(root, file), path.join(stage, file))
  // No binary in the main package, even though the working copy has one.
  fs.cpSync(path.join(root, 'npm'), path.join(stage, 'npm'), { recursive: true })
  for (const t of targets) {
    const dest = path.join(stage, 'npm', t.platformArchABI, `${binaryName}.${t.platformArchABI}.node`)
    if (t.platformArchABI === HOST_TARGET) fs.copyFileSync(hostBinary, dest)
    // napi prepublish wants every target's artifact; these are never loaded here.
    else fs.writeFileSync(dest, `placeholder for ${t.triple}\n`)
  }
  // The workflow's step, minus what needs the network (publishing, a GitHub release).
  await run(process.execPath, [npmCli, 'run', 'release:manifest', '--', '--skip-optional-publish', '--no-gh-release'], {
    cwd: stage,
    env: { ...env, PATH: [path.join(root, 'node_modules', '.bin'), env.PATH].join(path.delimiter) },
  })

  // Pack everything with npm itself; packing must not build either (no Rust on PATH).
  const dest = path.join(work, 'tarballs')
  fs.mkdirSync(dest)
  const dirs = [stage, ...targets.map((t) => path.join(stage, 'npm', t.platformArchABI))]
  const { stdout } = await npm(['pack', ...dirs, `--pack-destination=${dest}`, '--json', '--loglevel=warn'], stage)
  for (const packed of JSON.parse(stdout)) {
    const file = path.join(dest, packed.filename)
    const buf = fs.readFileSync(file)
    const manifestDir = packed.name === 'stampede-cache' ? stage : path.join(stage, 'npm', packed.name.slice('stampede-cache-'.length))
    tarballs.set(packed.name, {
      file,
      files: packed.files.map((f) => f.path).sort(),
      manifest: JSON.parse(fs.readFileSync(path.join(manifestDir, 'package.json'), 'utf8')),
      integrity: sri(buf),
      shasum: crypto.createHash('sha1').update(buf).digest('hex'),
    })
  }
  registry = await startRegistry()
})

after(() => {
  registry?.server.close()
  if (work) fs.rmSync(work, { recursive: true, force: true })
})

test('the main tarball holds the code, types, README and LICENSE only; each platform tarball its binary', { timeout: 60_000 }, () => {
  assert.deepEqual(tarballs.get('stampede-cache').files, MAIN_FILES)
  for (const t of targets) {
    const name = `stampede-cache-${t.platformArchABI}`
    assert.deepEqual(tarballs.get(name)?.files, ['README.md', `${binaryName}.${t.platformArchABI}.node`, 'package.json'].sort(), name)
  }
  const hostTarball = tarballs.get(`stampede-cache-${HOST_TARGET}`)
  assert.ok(fs.statSync(hostTarball.file).size > 100_000, 'the linux-x64-gnu tarball carries the real binary')
})

test('the published package.json: every platform package optional at this version, no build on install', { timeout: 60_000 }, () => {
  const manifest = tarballs.get('stampede-cache').manifest
  const expected = Object.fromEntries(targets.map((t) => [`stampede-cache-${t.platformArchABI}`, pkg.version]))
  assert.deepEqual(manifest.optionalDependencies, expected)
  // npm runs none of these for a registry install, but it warns about `prepare` on every install
  // ("install scripts not yet covered by allowScripts"); a user's install must build nothing.
  for (const script of ['preinstall', 'install', 'postinstall', 'prepare']) {
    assert.equal(manifest.scripts?.[script], undefined, `published scripts.${script}`)
  }
  assert.equal(manifest.dependencies, undefined, 'no runtime dependencies')
  for (const field of ['repository', 'homepage', 'license', 'keywords', 'engines']) assert.ok(manifest[field], field)
  assert.equal(manifest.license, 'MIT')
  // A fresh clone still builds the addon on `npm install` (docs/CONTRACT.md): that is what `prepare` is for.
  assert.equal(pkg.scripts.prepare, 'npm run build')
  assert.match(pkg.scripts['release:manifest'], /^npm pkg delete scripts\.prepare && napi prepublish -t npm$/)
  for (const t of targets) {
    const platformPkg = tarballs.get(`stampede-cache-${t.platformArchABI}`).manifest
    assert.deepEqual(platformPkg.os, [t.platform], t.triple)
    assert.deepEqual(platformPkg.cpu, [t.arch], t.triple)
    if (t.abi === 'gnu' || t.abi === 'musl') assert.deepEqual(platformPkg.libc, [t.abi === 'gnu' ? 'glibc' : 'musl'], t.triple)
    assert.equal(platformPkg.version, pkg.version, t.triple)
    assert.equal(platformPkg.main, `${binaryName}.${t.platformArchABI}.node`)
  }
})

test('npm/ has one folder per target, binding.js lists the same targets, the release workflow builds them all', { timeout: 60_000 }, () => {
  const abis = targets.map((t) => t.platformArchABI).sort()
  assert.deepEqual(fs.readdirSync(path.join(root, 'npm')).sort(), abis)
  const listed = [...fs.readFileSync(path.join(root, 'binding.js'), 'utf8').matchAll(/\{ target: '([^']+)'/g)].map((m) => m[1])
  assert.deepEqual(listed.sort(), abis, "binding.js's PREBUILT list")
  for (const required of ['x86_64-unknown-linux-musl', 'aarch64-unknown-linux-musl', 'aarch64-unknown-linux-gnu']) {
    assert.ok(pkg.napi.targets.includes(required), required)
  }
  const workflow = fs.readFileSync(path.join(root, '.github', 'workflows', 'release.yml'), 'utf8')
  for (const t of targets) assert.match(workflow, new RegExp(`target: ${t.triple}\\b`), `the workflow builds ${t.triple}`)
  const manifestStep = workflow.indexOf('npm run release:manifest')
  const publishStep = workflow.indexOf('npm publish')
  assert.ok(manifestStep > 0 && publishStep > manifestStep, 'the workflow rewrites the manifest before npm publish')
})

test('npm install stampede-cache: the platform package comes as an optional dependency, no Rust, no build; CJS and ESM work', {
  timeout: 180_000,
}, async () => {
  const { dir, output } = await installApp('app')
  // Exactly this platform's package: npm chose it by os, cpu and libc (glibc or musl, not both).
  assert.deepEqual(installed(dir), ['stampede-cache', `stampede-cache-${HOST_TARGET}`])
  assert.doesNotMatch(output, /install-scripts|prepare|napi build|cargo/, 'npm neither ran nor warned about build scripts')
  assert.ok(registry.requests.some((u) => u.includes(`stampede-cache-${HOST_TARGET}`)))
  // Everything came from the loopback registry (no other network), and the lockfile records every
  // platform's package, so it installs the right one on another platform too.
  const lock = JSON.parse(fs.readFileSync(path.join(dir, 'package-lock.json'), 'utf8'))
  const locked = Object.entries(lock.packages).filter(([, p]) => p.resolved)
  assert.deepEqual(locked.map(([k]) => k.replace(/^node_modules\//, '')).sort(), [...tarballs.keys()].sort())
  for (const [, p] of locked) assert.ok(p.resolved.startsWith(registry.url), p.resolved)

  const check = `
    const assert = require('node:assert/strict')
    module.exports = async function check(StampedeCache, StampedeCacheError) {
      const cache = new StampedeCache({ ttl: 60_000 })
      let loads = 0
      const loader = async () => {
        loads++
        await new Promise((r) => setTimeout(r, 20))
        return { at: new Date(0), n: 1 }
      }
      const [a, b] = await Promise.all([cache.getOrLoad(['user', 1], loader), cache.getOrLoad(['user', 1], loader)])
      assert.equal(loads, 1, 'one load for two concurrent callers')
      assert.deepEqual(a, { at: '1970-01-01T00:00:00.000Z', n: 1 })
      assert.equal(a, b)
      assert.equal(await cache.getOrLoad(['user', 1], loader), a)
      await assert.rejects(cache.getOrLoad('', loader), (e) => e instanceof StampedeCacheError && e.code === 'ERR_INVALID_KEY')
      await cache.close()
    }`
  fs.writeFileSync(path.join(dir, 'check.cjs'), check)
  fs.writeFileSync(
    path.join(dir, 'main.cjs'),
    `const { StampedeCache, StampedeCacheError } = require('stampede-cache')
    const { StampedeCacheModule } = require('stampede-cache/nestjs')
    const { createUseCacheHandler } = require('stampede-cache/next')
    require('./check.cjs')(StampedeCache, StampedeCacheError).then(() => {
      const dynamic = StampedeCacheModule.forRoot({ ttl: 1000 })
      const handler = createUseCacheHandler()
      handler.cache.close()
      const addon = Object.keys(require.cache).find((f) => f.endsWith('.node'))
      console.log(JSON.stringify({ ok: dynamic.module === StampedeCacheModule && handler.cache instanceof StampedeCache, addon }))
    })`,
  )
  fs.writeFileSync(
    path.join(dir, 'main.mjs'),
    `import { StampedeCache, StampedeCacheError } from 'stampede-cache'
    import cjs from 'stampede-cache'
    import { createIncrementalCacheHandler } from 'stampede-cache/next'
    import { createRequire } from 'node:module'
    const check = createRequire(import.meta.url)('./check.cjs')
    await check(StampedeCache, StampedeCacheError)
    const Handler = createIncrementalCacheHandler()
    await Handler.cache.close()
    console.log(JSON.stringify({ ok: cjs.StampedeCache === StampedeCache && Handler.cache instanceof StampedeCache }))`,
  )
  const cjs = JSON.parse((await run(process.execPath, ['main.cjs'], { cwd: dir })).stdout)
  assert.equal(cjs.ok, true)
  assert.equal(
    fs.realpathSync(cjs.addon),
    path.join(fs.realpathSync(dir), 'node_modules', `stampede-cache-${HOST_TARGET}`, `${binaryName}.${HOST_TARGET}.node`),
  )
  assert.deepEqual(JSON.parse((await run(process.execPath, ['main.mjs'], { cwd: dir })).stdout), { ok: true })
})

// Requires the package in `dir` (optionally after a preload); returns the error it throws.
async function requireError(dir, preload) {
  const script = `try { require('stampede-cache'); console.log('{"loaded":true}') } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })) }`
  const args = preload ? ['--require', preload, '-e', script] : ['-e', script]
  return JSON.parse((await run(process.execPath, args, { cwd: dir })).stdout)
}

// An ES module app importing the package: it must stop with the error, as Node prints it.
async function importCrash(dir) {
  fs.writeFileSync(path.join(dir, 'esm-app.mjs'), "import { StampedeCache } from 'stampede-cache'\nnew StampedeCache()\n")
  const err = await run(process.execPath, ['esm-app.mjs'], { cwd: dir }).then(
    () => assert.fail('the ESM app must not start without the native binary'),
    (e) => e,
  )
  return err.message
}

const SUPPORTED_LABELS = ['Linux x64 (glibc)', 'Linux arm64 (glibc)', 'Linux x64 (musl', 'Linux arm64 (musl', 'macOS x64', 'macOS arm64', 'Windows x64']

function assertNamesEverything(message, here) {
  assert.ok(message.includes(here), `names the platform ${here}: ${message}`)
  for (const label of SUPPORTED_LABELS) assert.ok(message.includes(label), `lists ${label}: ${message}`)
  assert.match(message, /Rust toolchain/, 'says how to build from source')
  assert.doesNotMatch(message, /npm has a bug/, "not napi's npm-bug text")
}

test('installed without optional dependencies: require and import fail with ERR_NATIVE_BINDING naming the fix', { timeout: 180_000 }, async () => {
  const { dir } = await installApp('app-no-optional', ['--omit=optional'])
  assert.deepEqual(installed(dir), ['stampede-cache'])
  const err = await requireError(dir)
  assert.equal(err.code, 'ERR_NATIVE_BINDING')
  assertNamesEverything(err.message, HERE)
  assert.match(err.message, new RegExp(`stampede-cache-${HOST_TARGET} was not installed`))
  assert.match(err.message, /optional dependencies enabled/)
  const printed = await importCrash(dir)
  assert.match(printed, /code: 'ERR_NATIVE_BINDING'/)
  assert.ok(printed.includes(err.message), `the ESM app prints the same message:\n${printed}`)

  // A platform nothing is built for (simulated: Node reports FreeBSD).
  const freebsd = path.join(dir, 'freebsd.cjs')
  fs.writeFileSync(freebsd, "Object.defineProperty(process, 'platform', { value: 'freebsd' })\n")
  const unsupported = await requireError(dir, freebsd)
  assert.equal(unsupported.code, 'ERR_NATIVE_BINDING')
  assertNamesEverything(unsupported.message, `freebsd-${process.arch}`)
  assert.match(unsupported.message, new RegExp(`no prebuilt native binary for freebsd-${process.arch}`))

  // The platform package is there but its binary does not load: the loader's own reason is named.
  const broken = path.join(dir, 'node_modules', `stampede-cache-${HOST_TARGET}`)
  fs.mkdirSync(broken)
  fs.writeFileSync(path.join(broken, 'package.json'), JSON.stringify(tarballs.get(`stampede-cache-${HOST_TARGET}`).manifest))
  fs.writeFileSync(path.join(broken, `${binaryName}.${HOST_TARGET}.node`), 'not an ELF file\n')
  const failed = await requireError(dir)
  assert.equal(failed.code, 'ERR_NATIVE_BINDING')
  assertNamesEverything(failed.message, HERE)
  assert.match(failed.message, new RegExp(`installed \\(stampede-cache-${HOST_TARGET}\\) but failed to load: .*${binaryName}\\.${HOST_TARGET}\\.node`))
})
