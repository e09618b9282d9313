// How to point stampede-cache at the Redis you run: one function per deployment, each returning
// the constructor options. __test__/redis-deployments.test.js runs every one of them against a
// real server of that kind (TLS, mutual TLS, an ACL user, a 3+3 cluster, Sentinel), and
// docs/redis.md shows them.
import fs from 'node:fs'

// Managed Redis over TLS (Upstash, Redis Cloud, Azure Cache, ElastiCache with encryption): the
// provider's rediss:// URL, verified against the system's root certificates.
export function managed(url = process.env.REDIS_URL) {
  return { redis: url }
}

// Your own CA, and a client certificate if the server asks for one (mutual TLS).
export function privateCa(url, { caFile, certFile, keyFile }) {
  return {
    redis: {
      url, // rediss://user:password@redis.internal:6380/0
      tls: {
        ca: fs.readFileSync(caFile, 'utf8'),
        ...(certFile && { cert: fs.readFileSync(certFile, 'utf8'), key: fs.readFileSync(keyFile, 'utf8') }),
      },
    },
  }
}

// An ACL user that may touch only this namespace's keys and channel (see docs/redis.md for the
// ACL SETUSER line): its name and password go in the URL.
export function aclUser(url, namespace) {
  return { namespace, redis: url } // redis://feed-cache:s3cret@redis.internal:6379/0
}

// Redis Cluster: one seed is enough; slots, MOVED/ASK and failovers are followed.
export function cluster(seeds) {
  return { redis: { cluster: seeds } } // ['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379']
}

// Sentinel: the primary is found through the sentinels and followed across failovers. `url`
// (optional) gives the primary's password, db and TLS; its host is not used.
export function sentinel(sentinels, masterName, url) {
  return { redis: { sentinels, masterName, ...(url && { url }) } }
}
