'use strict'
// The published types, compiled the way a TypeScript user compiles against them: a fresh app whose
// node_modules/stampede-cache holds what the package publishes (package.json and its `files`),
// `tsc --noEmit` under strict + exactOptionalPropertyTypes with skipLibCheck off (so index.d.ts and
// nestjs.d.ts are checked too), as CommonJS and as ESM. fixtures/types/cases.ts holds the cases;
// fixtures/types/lie.ts is compiled beside it and must give exactly its two marked errors, which
// proves that a wrong type and an unused @ts-expect-error fail the run.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFile } = require('node:child_process')

const root = path.join(__dirname, '..')
// A directory link that needs no privileges on Windows.
const DIR_LINK = process.platform === 'win32' ? 'junction' : 'dir'
const fixtures = path.join(__dirname, 'fixtures', 'types')
const tscOf = (pkg) => path.join(path.dirname(require.resolve(`${pkg}/package.json`, { paths: [root] })), 'bin', 'tsc')
const tsc = tscOf('typescript')
// TypeScript 7 (the native compiler, a dev dependency under the name typescript7), beside 6.
const tsc7 = tscOf('typescript7')

const CONFIGS = {
  // A classic CommonJS project: module commonjs, the default resolution.
  commonjs: { type: 'commonjs', compilerOptions: { module: 'commonjs' } },
  // A CommonJS package compiled with Node's own resolution (package.json "exports", types condition).
  'nodenext-cjs': { type: 'commonjs', compilerOptions: { module: 'nodenext' } },
  // An ES module package: import from a CommonJS package with named exports.
  'nodenext-esm': { type: 'module', compilerOptions: { module: 'nodenext' } },
}

/**
 * A fresh app with the package as published (its `files`) and @types/node, ready for tsc.
 * `files`: the fixtures it compiles; `types`: tsconfig's (null: none named, the compiler's default).
 */
function makeApp(t, name, config, { files = ['cases.ts', 'lie.ts'], types = ['node'] } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `sc-types-${name}-`))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const pkgDir = path.join(dir, 'node_modules', 'stampede-cache')
  fs.mkdirSync(pkgDir, { recursive: true })
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'))
  for (const file of ['package.json', ...pkg.files]) fs.cpSync(path.join(root, file), path.join(pkgDir, file))
  fs.mkdirSync(path.join(dir, 'node_modules', '@types'))
  fs.symlinkSync(path.join(root, 'node_modules', '@types', 'node'), path.join(dir, 'node_modules', '@types', 'node'), DIR_LINK)
  for (const file of files) fs.copyFileSync(path.join(fixtures, file), path.join(dir, file))
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: `types-${name}`, private: true, type: config.type }))
  const tsconfig = {
    compilerOptions: {
      strict: true,
      exactOptionalPropertyTypes: true,
      target: 'es2022',
      ...(types !== null && { types }),
      skipLibCheck: false,
      noEmit: true,
      ...config.compilerOptions,
    },
    files,
  }
  fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2))
  return dir
}

function runTsc(dir, compiler = tsc) {
  return new Promise((resolve) => {
    execFile(process.execPath, [compiler, '-p', dir, '--pretty', 'false'], { cwd: dir, timeout: 240_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? err.signal) : 0, output: `${stdout}${stderr}` })
    })
  })
}

// The lines of lie.ts marked LIE, with the error code each must produce.
function expectedLies() {
  const lines = fs.readFileSync(path.join(fixtures, 'lie.ts'), 'utf8').split('\n')
  const out = []
  lines.forEach((line, i) => {
    const m = /LIE: (TS\d+)/.exec(line)
    // An @ts-expect-error comment is reported on its own line; a type error on the marked line.
    if (m) out.push(`lie.ts:${i + 1}:${m[1]}`)
  })
  return out.sort()
}

// A project that uses no Node.js global itself and names no `types` (TypeScript 6 and 7 then
// load none, @types/node installed or not): each entry's declarations must find what they use of
// Node's types themselves (`Buffer`, `node:events`), or tsc fails inside them ("Cannot find name
// 'Buffer'"). One compilation per entry: one that loads Node's types would hide another's lack.
const ENTRIES = ['stampede-cache', 'stampede-cache/nestjs', 'stampede-cache/next', 'stampede-cache/otel', 'stampede-cache/prometheus']
for (const [version, compiler] of [
  ['6', tsc],
  ['7', tsc7],
]) {
  test(`types (TypeScript ${version}): strict, the default \`types\` (none named): every entry's declarations find Node's types themselves`, {
    timeout: 300_000,
  }, async (t) => {
    const failures = []
    for (const [i, entry] of ENTRIES.entries()) {
      const dir = makeApp(t, `no-types-${version}-${i}`, CONFIGS['nodenext-esm'], { files: [], types: null })
      fs.writeFileSync(path.join(dir, 'entry.ts'), `import * as entry from '${entry}'\nexport const used: object = entry\n`)
      const tsconfig = JSON.parse(fs.readFileSync(path.join(dir, 'tsconfig.json'), 'utf8'))
      tsconfig.files = ['entry.ts']
      fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify(tsconfig))
      const { code, output } = await runTsc(dir, compiler)
      if (code !== 0) failures.push(`${entry}:\n${output}`)
    }
    assert.deepEqual(failures, [])
  })
}

for (const [name, config] of Object.entries(CONFIGS)) {
  test(`types (TypeScript 7): strict + exactOptionalPropertyTypes, ${name}: every case holds, and only lie.ts's lies are reported`, {
    timeout: 300_000,
  }, async (t) => {
    const dir = makeApp(t, `ts7-all-${name}`, config)
    const { output } = await runTsc(dir, tsc7)
    const errors = [...output.matchAll(/^(\S+?\.ts)\((\d+),\d+\): error (TS\d+)/gm)].map(([, file, line, ts]) => `${file}:${line}:${ts}`)
    assert.deepEqual(
      errors.filter((e) => !e.startsWith('lie.ts:')),
      [],
      `cases.ts and the declarations must compile under tsc 7:\n${output}`,
    )
    assert.deepEqual(errors.sort(), expectedLies(), `exactly the marked lies must be reported by tsc 7:\n${output}`)
  })

  test(`types: strict + exactOptionalPropertyTypes, ${name}: every case holds, and only lie.ts's lies are reported`, { timeout: 300_000 }, async (t) => {
    const dir = makeApp(t, name, config)
    const { code, output } = await runTsc(dir)
    const errors = [...output.matchAll(/^(\S+?\.ts)\((\d+),\d+\): error (TS\d+)/gm)].map(([, file, line, ts]) => `${file}:${line}:${ts}`)
    assert.notEqual(code, 0, 'tsc must fail on lie.ts')
    assert.deepEqual(
      errors.filter((e) => !e.startsWith('lie.ts:')),
      [],
      `cases.ts and the package's declarations must compile cleanly:\n${output}`,
    )
    assert.deepEqual(errors.sort(), expectedLies(), `exactly the marked lies must be reported:\n${output}`)
  })
}
