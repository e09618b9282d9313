//! The bus's subscription, on the tier's connections: subscribes, hears, pings, and
//! resubscribes until the cache closes (what the messages mean is the `bus` part's).

use std::sync::Arc;
use std::time::Duration;

use redis::{PushKind, RedisResult, Value};

use super::bus::BUS_PING_INTERVAL;
use super::{until_true, RedisTier};

impl RedisTier {
    fn set_bus_up(&self, up: bool) {
        self.health.set_bus_up(up);
        // Waiters may have missed the announcement they wait for: they look again now (and
        // poll while the bus is down).
        self.lock.wake_all();
    }

    /// The subscriber, resubscribing by itself until the cache closes, and on the new master
    /// when the Sentinel master moves. After each resubscription the in-process copies are
    /// checked against Redis (`verify.rs`), since announcements may have been missed meanwhile:
    /// those changed meanwhile go (all of them after a clear). It is a RESP3
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
                conn.subscribe(self.bus.channel()).await?;
                RedisResult::Ok(conn)
            })
            .await;
            attempt = attempt.wrapping_add(1);
            let cleared_before = self.inbox.cleared();
            if matches!(subscribed, Ok(Ok(_))) {
                // Before any call goes on: a load must not be born before a clear it could
                // have known of, nor an entry read from Redis be checked against nothing.
                self.sync_namespace().await;
            }
            // Calls waiting for the first attempt go on now, whatever its outcome.
            let first_succeeded = first && matches!(subscribed, Ok(Ok(_)));
            first = false;
            self.bus.attempted();
            match subscribed {
                Ok(Ok(mut conn)) => {
                    backoff = Duration::from_millis(50);
                    // Copies made before this subscription may have missed announcements,
                    // unless it is the first one, which every Redis command waited for.
                    if !first_succeeded {
                        self.bus
                            .missed_announcements(self.inbox.cleared() > cleared_before);
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
                                        if let Some(key) = self.bus.hear(payload) {
                                            self.lock.wake(key);
                                        }
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
