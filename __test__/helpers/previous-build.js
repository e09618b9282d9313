'use strict'
// The previous release (today's main when the envelope changed: commit f38fe89), built once into
// target/previous-f38fe89 (a git worktree of that commit with its addon built there, its Rust
// build in target/previous-build), for the rolling-deploy test: instances of both builds share
// one Redis. `previousBuild()` resolves with the directory to require, or null when this is not
// a git checkout that has the commit (a packed tarball).

const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const COMMIT = 'f38fe89'
const ROOT = path.join(__dirname, '..', '..')
const DIR = path.join(ROOT, 'target', `previous-${COMMIT}`)

const built = () => fs.existsSync(DIR) && fs.readdirSync(DIR).some((f) => f.endsWith('.node'))

function previousBuild() {
  if (built()) return DIR
  try {
    execFileSync('git', ['cat-file', '-e', `${COMMIT}^{commit}`], { cwd: ROOT, stdio: 'ignore' })
  } catch {
    return null
  }
  if (!fs.existsSync(DIR)) {
    execFileSync('git', ['worktree', 'add', '--detach', DIR, COMMIT], { cwd: ROOT, stdio: 'ignore' })
  }
  const napi = path.join(ROOT, 'node_modules', '.bin', 'napi')
  execFileSync(napi, ['build', '--platform', '--release', '--js', 'native.js', '--dts', 'native.d.ts'], {
    cwd: DIR,
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, CARGO_TARGET_DIR: path.join(ROOT, 'target', 'previous-build') },
  })
  return built() ? DIR : null
}

module.exports = { previousBuild, PREVIOUS_COMMIT: COMMIT }
