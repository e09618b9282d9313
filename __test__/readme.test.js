'use strict'
// Every code block of README.md, CONTRIBUTING.md and docs/*.md compiles and runs as written. Each
// js/ts/json block is preceded by a marker (an HTML comment, invisible on GitHub and npm) that says
// what it is:
//   <!-- test: run <file> -->        a program: written to <file> in a fresh app and run (a .ts file
//                                    is compiled with tsc first, strict and exactOptionalPropertyTypes);
//                                    SAMPLES below says what it prints, and whether it gets a private
//                                    redis-server as REDIS_URL or a driver that imports and calls it
//   <!-- test: nest:<app> <file> --> a file of a NestJS app: the app is compiled with its own
//                                    tsconfig.json, started, asked over HTTP (NEST_APPS), and stopped
//   <!-- test: file <path> -->       the whole of an example file that another test runs
//                                    (next.test.js, vercel.test.js, redis-deployments.test.js, ...)
//   <!-- test: excerpt <path> -->    lines of such a file; each stretch between `// …` lines must
//                                    appear in that file, in order
// A block without a marker fails the test, so no untested snippet gets in. Outside `redis` samples
// REDIS_URL is unset, which the snippets treat as in-process only.
//
// docs/CONTRACT.md is the specification (its blocks are signatures, not programs) and
// docs/bench-latest.md is written by `npm run bench`: neither holds samples.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { execFile, spawn } = require('node:child_process')
const { RedisServer } = require('./helpers/redis-server.js')

const root = path.join(__dirname, '..')
// A directory link that needs no privileges on Windows.
const DIR_LINK = process.platform === 'win32' ? 'junction' : 'dir'
const NOT_SAMPLES = new Set(['CONTRACT.md', 'bench-latest.md'])
const DOCS = [
  'README.md',
  'CONTRIBUTING.md',
  ...fs
    .readdirSync(path.join(root, 'docs'))
    .filter((f) => f.endsWith('.md') && !NOT_SAMPLES.has(f))
    .sort()
    .map((f) => `docs/${f}`),
]
const GUIDES = ['nestjs', 'nextjs', 'serverless', 'redis', 'api', 'performance', 'operations', 'migrating-from-cache-manager']
const tsc = path.join(path.dirname(require.resolve('typescript/package.json', { paths: [root] })), 'bin', 'tsc')

// What each `run` block prints, line by line. `redis`: REDIS_URL names a private redis-server.
// `driver`: the block is written to its file and this program, which uses it as a user's code would
// (a platform calling a route handler, a client asking a server), is what runs.
const SAMPLES = {
  'quickstart.mjs': { expect: [/^1$/, /^string$/] },
  'quickstart-redis.mjs': { redis: true, expect: [/^1$/, /^\{"id":"42","items":\["post-1","post-2"\]\}$/] },
  'types-demo.ts': { expect: [/^\d{4}$/, /^ERR_INVALID_KEY$/] },
  'observe.cjs': { expect: [/^miss user:1$/, /^miss user:1$/, /^load user:1 cold$/, /^loaded user:1 \{"id":1\}$/, /^hit user:1 memory fresh$/] },
  'otel.cjs': { expect: [/^100$/, /^stampede_cache\.load cold$/] },
  'metrics.cjs': { expect: [/^stampede_cache_coalesced_calls_total\{namespace="feeds"\} 999$/, /^stampede_cache_loads_total\{namespace="feeds"\} 1$/] },
  'loader-control.mjs': { expect: [/^1\.08$/, /^5$/, /^undefined$/] },
  'tags.mjs': { expect: [/^Ada L\. Grace$/, /^0$/] },
  'max-bytes.mjs': { expect: [/^2 true$/] },
  'serializers.mjs': { expect: [/^true 10n$/, /^1970-01-02T00:00:00\.000Z$/] },
  'batch.mjs': { expect: [/^\[\{"id":"u1"\},\{"id":"u2"\},null,\{"id":"u1"\}\] 1$/, /^u4$/] },
  'expire.mjs': { expect: [/^stale$/, /^1$/, /^2$/, /^2$/, /^3$/] },
  'shared.mjs': { redis: true, expect: [/^loads 1$/, /^b sees it: true$/, /^after set: 2$/] },
  'wait-until.mjs': { expect: [/^v1$/, /^handed 1$/, /^v2$/] },
  'server.mjs': {
    driver: `process.env.PORT = '0'
const { once } = await import('node:events')
const { server, cache } = await import('./server.mjs')
if (!server.listening) await once(server, 'listening')
const base = \`http://127.0.0.1:\${server.address().port}\`
const feeds = await Promise.all(Array.from({ length: 20 }, () => fetch(\`\${base}/feed/42\`).then((r) => r.json())))
console.log(new Set(feeds.map((f) => f.builtAt)).size, feeds[0].userId)
console.log((await fetch(\`\${base}/nope\`)).status)
server.close()
await cache.close()
`,
    expect: [/^1 42$/, /^404$/],
  },
  'api/feed.mjs': {
    driver: `import { GET, cache } from './api/feed.mjs'
const responses = await Promise.all(Array.from({ length: 10 }, () => GET(new Request('http://localhost/api/feed?user=42'))))
const feeds = await Promise.all(responses.map((r) => r.json()))
console.log(responses[0].status, feeds[0].user, new Set(feeds.map((f) => f.version)).size)
await cache.close()
`,
    expect: [/^200 42 1$/],
  },
}

// Each NestJS app, by the name in its markers: the files it must have and what it answers.
const NEST_APPS = {
  feed: {
    files: ['package.json', 'src/app.module.ts', 'src/main.ts', 'tsconfig.json'],
    async check(port) {
      const [a, b] = await Promise.all([get(port, '/feed/42'), get(port, '/feed/42')])
      assert.equal(a.status, 200, a.body)
      const feed = JSON.parse(a.body)
      assert.deepEqual(Object.keys(feed), ['userId', 'items', 'builtAt'])
      assert.equal(feed.userId, '42')
      assert.equal(b.body, a.body, 'concurrent requests share one load')
      assert.equal((await get(port, '/feed/42')).body, a.body, 'a later request is a hit')
    },
  },
  'cache-manager': {
    files: ['package.json', 'src/app.module.ts', 'src/main.ts', 'tsconfig.json'],
    async check(port) {
      // The interceptor: 20 concurrent cold requests run the handler once; later ones are hits.
      const feeds = await Promise.all(Array.from({ length: 20 }, () => get(port, '/feed/7')))
      assert.ok(
        feeds.every((r) => r.status === 200),
        feeds[0].body,
      )
      assert.equal(new Set(feeds.map((r) => r.body)).size, 1, 'one handler run for all')
      assert.equal(JSON.parse(feeds[0].body).run, 1)
      assert.equal((await get(port, '/feed/7')).body, feeds[0].body)
      // CACHE_MANAGER's wrap: one computation, cached.
      const [s1, s2] = await Promise.all([get(port, '/feed/7/summary'), get(port, '/feed/7/summary')])
      assert.equal(s1.status, 200, s1.body)
      assert.deepEqual(JSON.parse(s1.body), { userId: '7', count: 2 })
      assert.equal(s2.body, s1.body)
    },
  },
}

// Code blocks whose language is code; shell commands, diffs and sample output are not run.
const CODE_LANGS = new Set(['js', 'mjs', 'cjs', 'javascript', 'ts', 'tsx', 'typescript', 'json', 'jsonc', 'jsx'])

function parseBlocks(doc) {
  const text = fs.readFileSync(path.join(root, doc), 'utf8')
  const blocks = []
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)/.exec(lines[i])
    if (!open) continue
    const start = i
    let end = i + 1
    while (end < lines.length && !lines[end].startsWith('```')) end++
    let j = start - 1
    while (j >= 0 && lines[j].trim() === '') j--
    const marker = j >= 0 ? /^<!-- test: (\S+) (\S+) -->$/.exec(lines[j]) : null
    blocks.push({
      doc,
      lang: open[1],
      line: start + 1,
      where: `${doc}:${start + 1}`,
      code: lines.slice(start + 1, end).join('\n') + '\n',
      kind: marker?.[1],
      target: marker?.[2],
    })
    i = end
  }
  return { text, blocks }
}

const parsed = new Map(DOCS.map((doc) => [doc, parseBlocks(doc)]))
const blocks = [...parsed.values()].flatMap((p) => p.blocks)
const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k) && k !== 'REDIS_URL'))
let work
let redis

/** A fresh app dir whose node_modules resolve stampede-cache (this checkout) and the dev dependencies. */
function makeApp(name, type) {
  const dir = path.join(work, name)
  fs.mkdirSync(path.join(dir, 'node_modules', '@types'), { recursive: true })
  fs.symlinkSync(root, path.join(dir, 'node_modules', 'stampede-cache'), DIR_LINK)
  for (const dep of ['@nestjs', 'reflect-metadata', 'rxjs', '@opentelemetry', 'prom-client', '@vercel']) {
    fs.symlinkSync(path.join(root, 'node_modules', dep), path.join(dir, 'node_modules', dep), DIR_LINK)
  }
  fs.symlinkSync(path.join(root, 'node_modules', '@types', 'node'), path.join(dir, 'node_modules', '@types', 'node'), DIR_LINK)
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name, private: true, type }))
  return dir
}

function run(cmd, args, options) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { env, timeout: 180_000, ...options }, (err, stdout, stderr) => {
      if (err) {
        err.message += `\n${stdout}${stderr}`
        reject(err)
      } else {
        resolve({ stdout, stderr })
      }
    })
  })
}

function get(port, urlPath) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: urlPath, agent: false }, (res) => {
        let body = ''
        res.on('data', (d) => (body += d))
        res.on('end', () => resolve({ status: res.statusCode, body }))
      })
      .on('error', reject)
  })
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = require('node:net').createServer()
    srv.once('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/** GitHub's anchor of a heading. */
function anchorOf(heading) {
  return `#${heading
    .toLowerCase()
    .replace(/[^\w\- ]/g, '')
    .replace(/ /g, '-')}`
}

function anchorsOf(text) {
  return [...text.replace(/```[\s\S]*?```/g, '').matchAll(/^#+ (.+)$/gm)].map(([, h]) => anchorOf(h))
}

before(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-readme-'))
})

after(async () => {
  await redis?.stop()
  if (work) fs.rmSync(work, { recursive: true, force: true })
})

test('docs: the guides exist and the README stays short, with its first sample on the first screen', () => {
  for (const guide of GUIDES) assert.ok(parsed.has(`docs/${guide}.md`), `docs/${guide}.md`)
  const readme = parsed.get('README.md').text.split('\n')
  assert.ok(readme.length <= 400, `README.md has ${readme.length} lines; at most 400`)
  const firstCode = readme.findIndex((l) => l.startsWith('```js'))
  assert.ok(firstCode >= 0 && firstCode < 40, `the README's first code sample starts at line ${firstCode + 1}`)
  const firstTable = readme.findIndex((l) => l.startsWith('|'))
  assert.ok(firstTable > firstCode, 'the quick start comes before any table')
  // The README tells a contributor how to start.
  const text = parsed.get('README.md').text
  for (const cmd of ['npm install', 'npm test', 'npm run demo']) assert.ok(text.includes(cmd), cmd)
})

test('docs: every code block has a test marker, and every link leads somewhere', () => {
  const code = blocks.filter((b) => CODE_LANGS.has(b.lang))
  assert.ok(code.length >= 30, `found ${code.length} code blocks`)
  for (const b of code) {
    const known = ['run', 'file', 'excerpt'].includes(b.kind) || b.kind?.startsWith('nest:')
    assert.ok(known, `${b.where}: a ${b.lang} block needs a <!-- test: run|nest:<app>|file|excerpt ... --> marker`)
  }
  const runs = code.filter((c) => c.kind === 'run')
  for (const b of runs) assert.ok(SAMPLES[b.target], `${b.where}: add what ${b.target} prints to SAMPLES`)
  const targets = runs.map((b) => b.target)
  assert.deepEqual(targets, [...new Set(targets)], 'every run target is written once')
  for (const target of Object.keys(SAMPLES)) assert.ok(targets.includes(target), `SAMPLES.${target} is shown in a doc`)
  for (const app of new Set(code.filter((c) => c.kind.startsWith('nest:')).map((c) => c.kind.slice(5)))) {
    assert.ok(NEST_APPS[app], `add a check of the NestJS app ${app} to NEST_APPS`)
  }

  for (const [doc, { text }] of parsed) {
    const prose = text.replace(/```[\s\S]*?```/g, '')
    for (const [, target] of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (doc === 'README.md') {
        // The README is also the package's page on npm, where relative links lead nowhere.
        assert.ok(/^(https?:|#)/.test(target), `README link ${target} must be absolute or an anchor`)
      }
      const local = /^https:\/\/github\.com\/stampede-cache\/stampede-cache\/blob\/main\/([^#]+)(#.*)?$/.exec(target)
      let file
      let anchor
      if (local) [, file, anchor] = local
      else if (target.startsWith('#')) [file, anchor] = [doc, target]
      else if (!/^https?:/.test(target)) {
        const [rel, hash] = target.split('#')
        file = path.posix.normalize(path.posix.join(path.posix.dirname(doc), rel))
        anchor = hash && `#${hash}`
      }
      if (!file) continue
      assert.ok(fs.existsSync(path.join(root, file)), `${doc}: link ${target}: ${file} does not exist`)
      if (anchor && file.endsWith('.md')) {
        const linked = parsed.get(file)?.text ?? fs.readFileSync(path.join(root, file), 'utf8')
        assert.ok(anchorsOf(linked).includes(anchor), `${doc}: link ${target}: no heading ${anchor} in ${file}`)
      }
    }
  }
})

for (const block of blocks.filter((b) => b.kind === 'run')) {
  const sample = SAMPLES[block.target] ?? {}
  test(`${block.where}: ${block.target} runs and prints what it says`, { timeout: 120_000 }, async () => {
    const isTs = block.target.endsWith('.ts')
    const dir = makeApp(`run-${block.target.replace(/\W/g, '-')}`, isTs || sample.driver ? 'module' : 'commonjs')
    fs.mkdirSync(path.dirname(path.join(dir, block.target)), { recursive: true })
    fs.writeFileSync(path.join(dir, block.target), block.code)
    let entry = block.target
    if (isTs) {
      // A user's strict project: the snippet must compile cleanly, then run as compiled.
      const tsconfig = {
        compilerOptions: {
          module: 'nodenext',
          target: 'es2022',
          strict: true,
          exactOptionalPropertyTypes: true,
          noUnusedLocals: true,
          types: ['node'],
          outDir: 'dist',
        },
        files: [block.target],
      }
      fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify(tsconfig))
      await run(process.execPath, [tsc, '-p', dir, '--pretty', 'false'], { cwd: dir })
      entry = path.join('dist', block.target.replace(/\.ts$/, '.js'))
    }
    if (sample.driver) {
      entry = 'driver.mjs'
      fs.writeFileSync(path.join(dir, entry), sample.driver)
    }
    const runEnv = { ...env }
    if (sample.redis) {
      redis ??= await new RedisServer().start()
      runEnv.REDIS_URL = redis.url
    }
    const { stdout, stderr } = await run(process.execPath, [entry], { cwd: dir, timeout: 60_000, env: runEnv })
    assert.equal(stderr, '', 'nothing on stderr')
    const lines = stdout.trimEnd().split('\n')
    assert.equal(lines.length, sample.expect.length, `output:\n${stdout}`)
    sample.expect.forEach((re, i) => assert.match(lines[i], re, `line ${i + 1} of:\n${stdout}`))
  })
}

for (const [app, spec] of Object.entries(NEST_APPS)) {
  test(`docs: the NestJS app "${app}", as its files say, compiles with its tsconfig, serves through the cache and shuts down on SIGTERM`, {
    timeout: 180_000,
  }, async (t) => {
    const files = blocks.filter((b) => b.kind === `nest:${app}`)
    assert.deepEqual(files.map((b) => b.target).sort(), spec.files)
    const dir = makeApp(`nest-${app}`, 'commonjs')
    for (const b of files) {
      fs.mkdirSync(path.dirname(path.join(dir, b.target)), { recursive: true })
      fs.writeFileSync(path.join(dir, b.target), b.code)
    }
    // The guide's package.json is the whole file, so it replaces what `npm init` (npm 11: "type":
    // "commonjs") wrote; NestJS 12 is ESM-only, so it must say "module".
    assert.equal(JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).type, 'module')
    await run(process.execPath, [tsc, '-p', dir, '--pretty', 'false'], { cwd: dir })

    const port = await freePort()
    const child = spawn(process.execPath, ['dist/main.js'], { cwd: dir, env: { ...env, PORT: String(port) }, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (d) => (output += d))
    child.stderr.on('data', (d) => (output += d))
    const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })))
    t.after(() => child.kill('SIGKILL'))
    const deadline = Date.now() + 60_000
    while (!output.includes('listening on')) {
      if (child.exitCode !== null || Date.now() > deadline) assert.fail(`the app did not start:\n${output}`)
      await new Promise((r) => setTimeout(r, 50))
    }

    await spec.check(port)

    child.kill('SIGTERM')
    let timer
    const end = await Promise.race([exited, new Promise((r) => (timer = setTimeout(() => r('timeout'), 30_000)))])
    clearTimeout(timer)
    assert.notEqual(end, 'timeout', `the app must exit on SIGTERM (enableShutdownHooks closes Nest and the cache):\n${output}`)
    assert.doesNotMatch(output, /TypeError|Cannot read properties of undefined/, 'no injection failure')
  })
}

test('docs: every whole-file block is that file, and every excerpt is in the file it names, in order', () => {
  const shown = blocks.filter((b) => b.kind === 'excerpt' || b.kind === 'file')
  assert.ok(shown.length >= 8)
  for (const b of shown) {
    const text = fs.readFileSync(path.join(root, b.target), 'utf8')
    const file = text.split('\n')
    let lines = b.code.trimEnd().split('\n')
    // A first line naming the file (`// lib/feed.ts`) is a caption, not part of the file.
    const caption = /^\/\/ (\S+)$/.exec(lines[0])
    if (caption && b.target.endsWith(caption[1]) && file[0] !== lines[0]) lines = lines.slice(1)
    if (b.kind === 'file') {
      assert.equal(`${lines.join('\n')}\n`, text, `${b.where}: the block must be the whole of ${b.target}, as it is`)
      continue
    }
    // Stretches between `// …` lines: each contiguous in the file, in order.
    const stretches = [[]]
    for (const line of lines) {
      if (line.trim() === '// …') stretches.push([])
      else stretches.at(-1).push(line)
    }
    let from = 0
    for (const stretch of stretches.filter((s) => s.length > 0)) {
      let at = -1
      for (let i = from; i + stretch.length <= file.length && at < 0; i++) {
        if (stretch.every((l, k) => file[i + k] === l)) at = i
      }
      assert.ok(at >= 0, `${b.where}: this stretch is not in ${b.target} (after line ${from}):\n${stretch.join('\n')}`)
      from = at + stretch.length
    }
  }
})

test('README: an example it names is a link to the repository, since the npm package holds none', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))
  assert.ok(!pkg.files.some((f) => f.startsWith('examples')), 'the package holds no examples')
  // The README is read on npm too, where a bare `examples/...` path names nothing the reader has.
  const prose = parsed
    .get('README.md')
    .text.replace(/```[\s\S]*?```/g, '')
    .replace(/\[[^\]]*\]\(https:\/\/github\.com\/[^)]+\)/g, '')
  const bare = [...prose.matchAll(/`(examples\/[^`\s]*)`/g)].map((m) => m[1])
  assert.deepEqual(bare, [], 'link these on GitHub')
})
