//! The cross-process refresh lock: `SET <ns>:lock:{key} <token> NX PX <lockTtl>`, released by a
//! Lua compare-and-delete, so a holder whose lock expired can never delete the next holder's.
//! An efficiency lock (it saves loads), never a correctness guarantee: if a load outlives the
//! lock, the worst case is one extra load.

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

/// Deletes the lock only while it still holds our token; then announces the key on the bus so
/// processes waiting for this lock look again at once instead of at the lock's expiry.
/// KEYS[1] lock key; ARGV[1] token, ARGV[2] channel ('' for none), ARGV[3] message.
pub const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
  return 1
end
return 0
";

/// A random token naming one holder.
pub fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Tries to take the lock; true when this caller now holds it.
pub async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    lock_key: &str,
    token: &str,
    ttl_ms: u64,
) -> RedisResult<bool> {
    let reply: Option<String> = redis::cmd("SET")
        .arg(lock_key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms.max(1))
        .query_async(conn)
        .await?;
    Ok(reply.is_some())
}

/// Releases the lock if `token` still holds it, announcing `message` on `channel` if given.
/// True when it was ours to release.
pub async fn release<C: ConnectionLike>(
    conn: &mut C,
    script: &Script,
    lock_key: &str,
    token: &str,
    announce: Option<(&str, &str)>,
) -> RedisResult<bool> {
    let (channel, message) = announce.unwrap_or(("", ""));
    let released: i64 = script
        .key(lock_key)
        .arg(token)
        .arg(channel)
        .arg(message)
        .invoke_async(conn)
        .await?;
    Ok(released == 1)
}

/// Milliseconds the lock has left; `None` when nobody holds it.
pub async fn remaining_ms<C: ConnectionLike>(
    conn: &mut C,
    lock_key: &str,
) -> RedisResult<Option<u64>> {
    let pttl: i64 = redis::cmd("PTTL").arg(lock_key).query_async(conn).await?;
    Ok((pttl >= 0).then_some(pttl as u64))
}
