'use strict'
// The socket lane (lib/lane.js, src/node/lane.rs): the read lane on a socket of the runtime's own,
// which Bun and Deno take (their `uv_*` are not libuv's). Its chunks go to the same framer as the
// libuv lane's, one call each, so every check holds: the key mark, the alignment marks, the
// bounds, the busy thread, close().
//
// Under Node, STAMPEDE_CACHE_LANE=socket (set here before the addon loads, and inherited by the
// child processes the suites start) puts every read lane on it, and the libuv lane's suites run
// again that way: one server, a Unix socket, a Cluster, and the batch wire suite.
process.env.STAMPEDE_CACHE_LANE = 'socket'
require('./redis-lane.test.js')
require('./redis-unix-lane.test.js')
require('./redis-cluster-lane.test.js')
require('./batch-wire.test.js')
