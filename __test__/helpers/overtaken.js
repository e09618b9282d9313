'use strict'
// A load overtaken by a set: the shape of every fenced write-back test.

/**
 * Starts `reader.getOrLoad(key)` with a load that waits until `writer.set(key)` has resolved,
 * runs `beforeReturn()` (a fault to arm, say), then lets the load return its older value.
 * Resolves with what the caller got. The load's value is 'loaded before the set', the set's
 * 'set during the load'.
 */
async function loadOvertakenBySet(reader, writer, key, beforeReturn) {
  let release
  const gate = new Promise((r) => (release = r))
  let loading
  const loaded = new Promise((r) => (loading = r))
  const read = reader.getOrLoad(key, async () => {
    loading()
    await gate
    return 'loaded before the set'
  })
  await loaded
  await writer.set(key, 'set during the load')
  beforeReturn()
  release()
  return read
}

module.exports = { loadOvertakenBySet }
