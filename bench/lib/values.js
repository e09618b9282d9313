'use strict'
// Bench values: a JSON object of about `bytes` bytes (a list of small items), the same shape in
// every benchmark so sizes compare.

function valueOfSize(bytes) {
  const items = []
  let size = 2
  for (let i = 0; size < bytes; i++) {
    const item = { id: i, name: `item-${i}`, price: i * 1.5, tags: ['a', 'b'] }
    size += JSON.stringify(item).length + 1
    items.push(item)
  }
  return { items }
}

module.exports = { valueOfSize }
