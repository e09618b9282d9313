// This example depends on the working copy of stampede-cache ("file:../.."), which npm installs as
// a symlink. Turbopack resolves a symlink to its real path, outside this project, and then neither
// externalizes nor finds the package. So before `next build`/`next dev`, replace the symlink with a
// real copy of what the package publishes plus the native addon built in the working copy, which is
// what an install from the registry looks like. An app that installs stampede-cache from npm needs
// none of this.
import { cpSync, existsSync, lstatSync, mkdirSync, readFileSync, readdirSync, rmSync, unlinkSync } from 'node:fs'

const root = new URL('../../../', import.meta.url)
const dest = new URL('../node_modules/stampede-cache/', import.meta.url)
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8'))

if (existsSync(dest)) {
  // Never recurse through the symlink: that would delete the working copy itself.
  if (lstatSync(new URL('../node_modules/stampede-cache', import.meta.url)).isSymbolicLink()) {
    unlinkSync(new URL('../node_modules/stampede-cache', import.meta.url))
  } else {
    rmSync(dest, { recursive: true })
  }
}
mkdirSync(dest, { recursive: true })
const addons = readdirSync(root).filter((name) => name.endsWith('.node'))
if (addons.length === 0) throw new Error('no native addon in the working copy: run `npm install` at the repository root first')
for (const name of ['package.json', ...pkg.files, ...addons]) {
  const from = new URL(name, root)
  if (existsSync(from)) cpSync(from, new URL(name, dest), { recursive: true })
}
console.log(`stampede-cache copied into node_modules (${addons.join(', ')})`)
