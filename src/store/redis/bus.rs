//! The invalidation bus: one pub/sub subscriber per cache on `<ns>:bus:<db>`. An announcement
//! (`<origin> <key>`) drops other processes' in-process copies of the key (through the inbox) and
//! wakes the lock waiters of the key. Losing or regaining the subscription wakes every waiter
//! too, since announcements may have been missed meanwhile.
//!
//! Namespace-wide messages start with the byte 0xFF, which no UTF-8 key can start with (older
//! instances, which read messages as UTF-8, ignore them): `0xFF T <origin> <clock> <tag>` (a
//! deleteByTag) and `0xFF C <origin> <clock>` (a clear). Each subscription first learns the
//! namespace clock and the clear clock, which were decided before it (see `tags.rs`).

use std::sync::Arc;
use std::time::Duration;

use redis::{PushKind, RedisResult, Value};

use super::carried::{self, CARRIED_MESSAGE};
use super::envelopes::usable;
use super::tags::NAMESPACE_MESSAGE;
use super::{until_true, RedisTier, Remote};
use crate::inbox::tag_bucket;
use crate::inbox::Stamp;

/// The bus pings this often when no message arrives, to notice a Redis that stopped answering.
pub const BUS_PING_INTERVAL: Duration = Duration::from_secs(1);

/// The channel of one namespace in one database: apps on different databases of one server
/// never invalidate each other.
pub fn channel(namespace: &str, db: i64) -> String {
    format!("{namespace}:bus:{db}")
}

impl RedisTier {
    pub(super) fn announcement(&self, key: &str) -> String {
        format!("{} {key}", self.origin)
    }

    /// The announcement of a load's result that carries the envelope written, if it is small
    /// and untagged (see `carried.rs`).
    pub(super) fn carrying_announcement(&self, key: &str, envelope: &str, tagged: bool) -> Vec<u8> {
        (!tagged)
            .then(|| carried::message(&self.origin, key, envelope))
            .flatten()
            .unwrap_or_else(|| self.announcement(key).into_bytes())
    }

    /// The envelope another process's announcement carried for `key`, if nothing was heard of
    /// the key since (`stamp`, taken on the caller's thread, is still the announcement's): a
    /// read that needs no Redis round trip. Taken once; then the key is in process.
    pub fn take_carried(&self, key: &str, stamp: Stamp) -> Option<Remote> {
        let bytes = self.carried.take(key, stamp)?;
        // One naming another key is no more served than a reply would be.
        let found = usable(&bytes, self.policies.serializer, &self.value_key(key)).ok()??;
        // Tagged envelopes are never carried (their tags' clocks are checked in Redis).
        if !found.tags.is_empty() {
            return None;
        }
        Some(found.remote(stamp))
    }

    fn on_announcement(&self, payload: &[u8]) {
        if let Some(rest) = payload.strip_prefix(&[NAMESPACE_MESSAGE]) {
            self.on_namespace_message(rest);
            return;
        }
        if let Some(rest) = payload.strip_prefix(&[CARRIED_MESSAGE]) {
            if let Some((origin, key, envelope)) = carried::parse(rest) {
                if origin != self.origin {
                    let stamp = self.inbox.invalidate_stamped(key);
                    self.carried.keep(key, stamp, envelope);
                } else {
                    self.carried.own_heard(key);
                }
                self.lock.wake(key);
            }
            return;
        }
        let Ok(text) = std::str::from_utf8(payload) else {
            return;
        };
        let Some((origin, key)) = text.split_once(' ') else {
            return;
        };
        if origin != self.origin {
            self.inbox.invalidate(key);
            self.carried.forget(key);
        } else {
            self.carried.own_heard(key);
        }
        self.lock.wake(key);
    }

    /// A deleteByTag (`T <origin> <clock> <tag>`) or clear (`C <origin> <clock>`) anywhere,
    /// this instance's own included (the clock it was given may be newer than the mark it made).
    fn on_namespace_message(&self, text: &[u8]) {
        let Ok(text) = std::str::from_utf8(text) else {
            return;
        };
        let mut parts = text.splitn(4, ' ');
        let (Some(kind), Some(_origin), Some(clock)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let Ok(clock) = clock.parse::<u64>() else {
            return;
        };
        match (kind, parts.next()) {
            ("T", Some(tag)) => {
                self.inbox.observe_clock(clock);
                self.inbox.invalidate_tag(tag_bucket(tag), clock);
            }
            ("C", None) => {
                self.inbox.observe_clock(clock);
                self.inbox.clear_at(clock);
                // Untagged in-process entries are not checked against the clear clock on a
                // hit: they are dropped here (this instance's own too, in case a read made
                // between its clear call and now was kept).
                self.inbox.invalidate_all();
            }
            _ => {}
        }
    }

    fn set_bus_up(&self, up: bool) {
        self.health.set_bus_up(up);
        // Waiters may have missed the announcement they wait for: they look again now (and
        // poll while the bus is down).
        self.lock.wake_all();
    }

    /// The subscriber, resubscribing by itself until the cache closes, and on the new master
    /// when the Sentinel master moves. Each resubscription drops every in-process copy, since
    /// announcements may have been missed meanwhile. It is a RESP3
    /// connection whose pushes carry the messages, made like command connections (TLS, server
    /// name, timeouts); on a cluster each attempt tries the next node.
    pub async fn run_bus(self: Arc<Self>) {
        let mut shutdown = self.shutdown.subscribe();
        let mut backoff = Duration::from_millis(50);
        let mut first = true;
        let mut attempt = 0usize;
        let mut moves = self.link.topology.moves();
        while !self.closed() {
            // A move of the master after this ends the subscription, made where it was before.
            moves.borrow_and_update();
            let (pushes, mut messages) = tokio::sync::mpsc::unbounded_channel();
            let subscribed = tokio::time::timeout(self.link.connect_timeout, async {
                let mut command = self.link.current().map(|c| c.inner);
                let mut conn = self
                    .link
                    .topology
                    .subscriber(pushes, attempt, command.as_mut())
                    .await?;
                conn.subscribe(&self.channel).await?;
                RedisResult::Ok(conn)
            })
            .await;
            attempt = attempt.wrapping_add(1);
            if matches!(subscribed, Ok(Ok(_))) {
                // Before any call goes on: a load must not be born before a clear it could
                // have known of, nor an entry read from Redis be checked against nothing.
                self.sync_namespace().await;
            }
            // Calls waiting for the first attempt go on now, whatever its outcome.
            let first_succeeded = first && matches!(subscribed, Ok(Ok(_)));
            first = false;
            self.bus_attempted.send_replace(true);
            match subscribed {
                Ok(Ok(mut conn)) => {
                    backoff = Duration::from_millis(50);
                    // Copies made before this subscription may have missed announcements,
                    // unless it is the first one, which every Redis command waited for.
                    if !first_succeeded {
                        self.inbox.invalidate_all();
                        self.carried.clear();
                    }
                    self.set_bus_up(true);
                    let mut moved = false;
                    loop {
                        tokio::select! {
                            _ = until_true(&mut shutdown) => {
                                self.set_bus_up(false);
                                return;
                            }
                            Ok(()) = moves.changed() => {
                                moved = true;
                                break;
                            }
                            push = messages.recv() => match push {
                                Some(push) if push.kind == PushKind::Message => {
                                    if let Some(Value::BulkString(payload)) = push.data.get(1) {
                                        self.on_announcement(payload);
                                    }
                                }
                                Some(push) if push.kind == PushKind::Disconnection => break,
                                Some(_) => {}
                                None => break,
                            },
                            _ = tokio::time::sleep(BUS_PING_INTERVAL) => {
                                let pong = tokio::time::timeout(
                                    self.link.command_timeout,
                                    redis::cmd("PING").query_async::<Value>(&mut conn),
                                )
                                .await;
                                if !matches!(pong, Ok(Ok(_))) {
                                    break;
                                }
                            }
                        }
                    }
                    self.set_bus_up(false);
                    if moved {
                        // Not a failure: subscribed again at once, on the new master.
                        backoff = Duration::from_millis(50);
                        continue;
                    }
                    self.stats.redis_errors.incr();
                    self.report(
                        "bus",
                        None,
                        "Redis bus connection lost; resubscribing".to_string(),
                    );
                }
                Ok(Err(e)) => {
                    self.stats.redis_errors.incr();
                    self.report("bus", None, format!("Redis bus subscription failed: {e}"));
                }
                Err(_) => {
                    self.stats.redis_errors.incr();
                    self.report("bus", None, "Redis bus subscription timed out".to_string());
                }
            }
            tokio::select! {
                _ = until_true(&mut shutdown) => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_name_the_database() {
        assert_eq!(channel("app", 0), "app:bus:0");
        assert_eq!(channel("app", 3), "app:bus:3");
    }
}
