'use strict'
// Runtimes without N-API (API.md, "Runtimes"): importing the package under Next.js's Edge runtime,
// Cloudflare Workers or a browser bundle throws an error that names the runtime and says to use
// the Node.js runtime, never one that asks to build the addon from source. binding.js runs in a
// vm context shaped like each runtime's globals, and in a child process shaped like Edge.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const vm = require('node:vm')
const { execFileSync, spawnSync } = require('node:child_process')

const root = path.join(__dirname, '..')
const source = fs.readFileSync(path.join(root, 'binding.js'), 'utf8')

/** Runs binding.js as a CommonJS module in a new context with `globals`; what it threw or exported. */
function loadIn(globals) {
  const required = []
  const module = { exports: {} }
  const requireStub = (id) => {
    required.push(id)
    return { loaded: id }
  }
  requireStub.resolve = (id) => {
    throw Object.assign(new Error(`Cannot find module '${id}'`), { code: 'MODULE_NOT_FOUND' })
  }
  const context = vm.createContext({ ...globals })
  const wrapped = vm.runInContext(`(function (exports, require, module, __filename, __dirname) {${source}\n})`, context)
  try {
    wrapped(module.exports, requireStub, module, path.join(root, 'binding.js'), root)
    return { exported: module.exports, required }
  } catch (error) {
    return { error, required }
  }
}

function assertRuntimeError({ error, required }, runtime) {
  assert.ok(error, 'the import threw')
  assert.equal(error.code, 'ERR_UNSUPPORTED_RUNTIME')
  assert.match(error.message, runtime, 'names the runtime')
  assert.match(error.message, /Use the Node\.js runtime/)
  assert.doesNotMatch(error.message, /from source|Rust|rustup|cargo|toolchain|npm install/i, 'never asks to build from source')
  assert.deepEqual(required, [], 'the native loader is never reached')
}

test('Next.js Edge runtime (EdgeRuntime is a string, no process.dlopen): the error names it and says to use Node.js', () => {
  const edgeProcess = { env: { NEXT_RUNTIME: 'edge' }, versions: {} }
  assertRuntimeError(loadIn({ EdgeRuntime: 'edge-runtime', process: edgeProcess }), /Next\.js Edge runtime/)
  // Even where a polyfill left a Node-looking process behind.
  assertRuntimeError(loadIn({ EdgeRuntime: 'edge-runtime', process }), /Next\.js Edge runtime/)
})

test('Cloudflare Workers, a browser bundle, a host without process.dlopen: each named', () => {
  assertRuntimeError(loadIn({ navigator: { userAgent: 'Cloudflare-Workers' } }), /Cloudflare Workers/)
  // With nodejs_compat a Worker has a process object with versions.node, still no dlopen.
  assertRuntimeError(loadIn({ navigator: { userAgent: 'Cloudflare-Workers' }, process: { versions: { node: '22.0.0' }, env: {} } }), /Cloudflare Workers/)
  // The `process` polyfill bundlers inject: versions is empty.
  assertRuntimeError(loadIn({ window: {}, document: {}, process: { env: {}, versions: {}, browser: true } }), /browser bundle/)
  assertRuntimeError(loadIn({ window: {}, document: {} }), /browser bundle/)
  assertRuntimeError(loadIn({ process: { versions: { node: '20.0.0' }, env: {} } }), /no process\.dlopen/)
  assertRuntimeError(loadIn({}), /not Node\.js-compatible/)
})

test('under Node.js the check lets the native loader run', () => {
  const { error, exported, required } = loadIn({ process })
  assert.equal(error, undefined)
  assert.deepEqual(required, ['./native.js'])
  assert.deepEqual(exported, { loaded: './native.js' })
})

test('a child process shaped like Edge: require and import of stampede-cache both throw ERR_UNSUPPORTED_RUNTIME', () => {
  // Node's own loader of .node files is process.dlopen: without it no addon can load, as at the edge.
  const edge = "globalThis.EdgeRuntime = 'edge-runtime'; delete process.dlopen;"
  const report = '(e) => console.log(JSON.stringify({ code: e.code, message: e.message }))'
  const run = (script, args = []) => JSON.parse(execFileSync(process.execPath, [...args, '-e', script], { cwd: root, encoding: 'utf8' }))
  const cjs = run(`${edge} try { require('stampede-cache') } catch (e) { (${report})(e) }`)
  // An ES module app crashes at its import, printing the error (as with ERR_NATIVE_BINDING).
  const esm = spawnSync(process.execPath, ['--input-type=module', '-e', `${edge} await import('stampede-cache')`], { cwd: root, encoding: 'utf8' })
  assert.notEqual(esm.status, 0)
  assert.match(esm.stderr, /code: 'ERR_UNSUPPORTED_RUNTIME'/)
  assert.ok(esm.stderr.includes(cjs.message), esm.stderr)
  assert.equal(cjs.code, 'ERR_UNSUPPORTED_RUNTIME')
  assert.match(cjs.message, /Next\.js Edge runtime/)
  assert.doesNotMatch(cjs.message, /from source|Rust/)
})
