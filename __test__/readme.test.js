'use strict'
// Every code block of README.md compiles and runs as written. Each js/ts/json block is preceded by
// a marker (an HTML comment, invisible on GitHub and npm) that says what it is:
//   <!-- test: run <file> -->      a program: written to <file> in a fresh app and run (a .ts
//                                  file is compiled with tsc first, strict and
//                                  exactOptionalPropertyTypes); its output is checked below
//   <!-- test: nest <file> -->     a file of the NestJS app: the app is compiled with the README's
//                                  own tsconfig.json, started, asked over HTTP, and stopped
//   <!-- test: excerpt <path> -->  lines of an example file that another test runs; each stretch
//                                  between `// …` lines must appear in that file, in order
// A block without a marker fails the test, so no untested snippet gets in. No Redis is needed:
// REDIS_URL is unset, which the snippets treat as in-process only.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { execFile, spawn } = require('node:child_process')

const root = path.join(__dirname, '..')
// A directory link that needs no privileges on Windows.
const DIR_LINK = process.platform === 'win32' ? 'junction' : 'dir'
const readme = fs.readFileSync(path.join(root, 'README.md'), 'utf8')
const tsc = path.join(path.dirname(require.resolve('typescript/package.json', { paths: [root] })), 'bin', 'tsc')

// What each `run` block prints, line by line.
const EXPECTED_OUTPUT = {
  'quickstart.mjs': [/^1$/, /^string$/],
  'quickstart.cjs': [/^2$/],
  'types-demo.ts': [/^\d{4}$/, /^ERR_INVALID_KEY$/],
  'observe.cjs': [/^miss user:1$/, /^miss user:1$/, /^load user:1 cold$/, /^loaded user:1 \{"id":1\}$/, /^hit user:1 memory fresh$/],
  'otel.cjs': [/^100$/, /^stampede_cache\.load cold$/],
  'metrics.cjs': [/^stampede_cache_coalesced_calls_total\{namespace="feeds"\} 999$/, /^stampede_cache_loads_total\{namespace="feeds"\} 1$/],
  'loader-control.mjs': [/^1\.08$/, /^5$/, /^undefined$/],
  'tags.mjs': [/^Ada L\. Grace$/, /^0$/],
  'max-bytes.mjs': [/^2 true$/],
  'serializers.mjs': [/^true 10n$/, /^1970-01-02T00:00:00\.000Z$/],
  'batch.mjs': [/^\[\{"id":"u1"\},\{"id":"u2"\},null,\{"id":"u1"\}\] 1$/, /^u4$/],
}

// Code blocks whose language is code; shell commands and sample output are not run.
const CODE_LANGS = new Set(['js', 'mjs', 'cjs', 'javascript', 'ts', 'tsx', 'typescript', 'json', 'jsonc'])

function parseBlocks(text) {
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
      lang: open[1],
      line: start + 1,
      code: lines.slice(start + 1, end).join('\n') + '\n',
      kind: marker?.[1],
      target: marker?.[2],
    })
    i = end
  }
  return blocks
}

const blocks = parseBlocks(readme)
const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k) && k !== 'REDIS_URL'))
let work

/** A fresh app dir whose node_modules resolve stampede-cache (this checkout) and the dev dependencies. */
function makeApp(name, type) {
  const dir = path.join(work, name)
  fs.mkdirSync(path.join(dir, 'node_modules', '@types'), { recursive: true })
  fs.symlinkSync(root, path.join(dir, 'node_modules', 'stampede-cache'), DIR_LINK)
  for (const dep of ['@nestjs', 'reflect-metadata', 'rxjs', '@opentelemetry', 'prom-client']) {
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

before(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'sc-readme-'))
})

after(() => {
  if (work) fs.rmSync(work, { recursive: true, force: true })
})

test('README: every code block has a test marker, and the README links only to absolute URLs or its own headings', () => {
  const code = blocks.filter((b) => CODE_LANGS.has(b.lang))
  assert.ok(code.length >= 10, `found ${code.length} code blocks`)
  for (const b of code) {
    assert.ok(['run', 'nest', 'excerpt'].includes(b.kind), `README.md:${b.line}: a ${b.lang} block needs a <!-- test: run|nest|excerpt ... --> marker`)
  }
  for (const b of code.filter((c) => c.kind === 'run')) {
    assert.ok(EXPECTED_OUTPUT[b.target], `README.md:${b.line}: add the expected output of ${b.target} to EXPECTED_OUTPUT`)
  }
  // The README is also the package's page on npm, where relative links lead nowhere.
  const prose = readme.replace(/```[\s\S]*?```/g, '')
  for (const [, target] of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
    assert.ok(/^(https?:|#)/.test(target), `README link ${target} must be absolute or an anchor`)
    if (target.startsWith('#')) {
      const anchors = [...readme.matchAll(/^#+ (.+)$/gm)].map(
        ([, h]) =>
          `#${h
            .toLowerCase()
            .replace(/[^\w\- ]/g, '')
            .replace(/ /g, '-')}`,
      )
      assert.ok(anchors.includes(target), `README anchor ${target} names a heading`)
    }
  }
})

for (const block of blocks.filter((b) => b.kind === 'run')) {
  test(`README.md:${block.line}: ${block.target} runs and prints what it says`, { timeout: 120_000 }, async () => {
    const isTs = block.target.endsWith('.ts')
    const dir = makeApp(`run-${block.target.replace(/\W/g, '-')}`, isTs ? 'module' : 'commonjs')
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
    const { stdout, stderr } = await run(process.execPath, [entry], { cwd: dir, timeout: 60_000 })
    assert.equal(stderr, '', 'nothing on stderr')
    const lines = stdout.trimEnd().split('\n')
    const expected = EXPECTED_OUTPUT[block.target]
    assert.equal(lines.length, expected.length, `output:\n${stdout}`)
    expected.forEach((re, i) => assert.match(lines[i], re, `line ${i + 1} of:\n${stdout}`))
  })
}

test('README: the NestJS app, as its files say, compiles with its tsconfig, serves through the cache and shuts down on SIGTERM', {
  timeout: 180_000,
}, async (t) => {
  const files = blocks.filter((b) => b.kind === 'nest')
  assert.deepEqual(files.map((b) => b.target).sort(), ['package.json', 'src/feed.ts', 'src/main.ts', 'tsconfig.json'])
  const dir = makeApp('nest', 'module')
  for (const b of files) {
    fs.mkdirSync(path.dirname(path.join(dir, b.target)), { recursive: true })
    fs.writeFileSync(path.join(dir, b.target), b.code)
  }
  // The README's package.json says "type": "module" (Nest 12 is ESM-only); keep it as written.
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

  const [a, b] = await Promise.all([get(port, '/feed/42'), get(port, '/feed/42')])
  assert.equal(a.status, 200, a.body)
  const feed = JSON.parse(a.body)
  assert.deepEqual(Object.keys(feed), ['userId', 'items', 'builtAt'])
  assert.equal(feed.userId, '42')
  assert.equal(b.body, a.body, 'concurrent requests share one load')
  assert.equal((await get(port, '/feed/42')).body, a.body, 'a later request is a hit')

  child.kill('SIGTERM')
  let timer
  const end = await Promise.race([exited, new Promise((r) => (timer = setTimeout(() => r('timeout'), 30_000)))])
  clearTimeout(timer)
  assert.notEqual(end, 'timeout', `the app must exit on SIGTERM (enableShutdownHooks closes Nest and the cache):\n${output}`)
  assert.doesNotMatch(output, /TypeError|Cannot read properties of undefined/, 'no injection failure')
})

test('README: every excerpt is in the example file it names, in order', () => {
  const excerpts = blocks.filter((b) => b.kind === 'excerpt')
  assert.ok(excerpts.length >= 4)
  for (const b of excerpts) {
    const file = fs.readFileSync(path.join(root, b.target), 'utf8').split('\n')
    let lines = b.code.trimEnd().split('\n')
    // A first line naming the file (`// lib/feed.ts`) is a caption, not part of the excerpt.
    const caption = /^\/\/ (\S+)$/.exec(lines[0])
    if (caption && b.target.endsWith(caption[1])) lines = lines.slice(1)
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
      assert.ok(at >= 0, `README.md:${b.line}: this stretch is not in ${b.target} (after line ${from}):\n${stretch.join('\n')}`)
      from = at + stretch.length
    }
  }
})
