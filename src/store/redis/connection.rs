//! The command connection: made on first use (concurrent callers share one attempt), replaced
//! (never reused) after it timed out or failed or the Sentinel master moved, and the classification of Redis failures that
//! decides what a failure costs: the connection, the whole tier for a while, or one command.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};

use super::net::timed_out;
use super::slots::SlotMap;
use super::topology::{Connection, Topology};
use crate::sync::LockOrRecover;

/// What a failed command costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// I/O error or timeout: the connection is replaced and Redis is skipped until a probe
    /// answers (reads are served without it meanwhile).
    Down,
    /// The server answered but cannot serve us as it is (READONLY after a failover, LOADING,
    /// MASTERDOWN): the connection is replaced, so the next command finds the node anew; this
    /// command fails alone.
    Reconnect,
    /// Any other error reply (NOPERM, WRONGTYPE, a script error): this command fails alone.
    Command,
}

pub fn classify(e: &RedisError) -> Fault {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return Fault::Down;
    }
    match e.kind() {
        ErrorKind::Io => Fault::Down,
        // A reply of a shape the command never gets: the connection is out of step with its
        // requests (an extra reply from a proxy, say), and every later reply on it would be
        // another command's. Replaced at once.
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => Fault::Reconnect,
        ErrorKind::Server(
            ServerErrorKind::ReadOnly | ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown,
        ) => Fault::Reconnect,
        _ => {
            // A write inside a Lua script on a demoted node fails with the script's error,
            // whose text carries the READONLY reply.
            let text = e.to_string();
            if text.contains("READONLY") || text.contains("LOADING") {
                Fault::Reconnect
            } else {
                Fault::Command
            }
        }
    }
}

/// One connection the tier hands out (commands go to `inner`); `id` names it, so a failure
/// replaces only that one.
#[derive(Clone)]
pub struct Conn {
    pub id: u64,
    pub inner: Connection,
}

pub struct Link {
    pub topology: Topology,
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    /// The connection commands share; `None` until made, and again once it failed.
    current: Mutex<Option<Conn>>,
    /// Held while making a connection, so concurrent callers share one attempt.
    connecting: tokio::sync::Mutex<()>,
    /// Numbers connections, so a failure reported late never drops a newer one.
    next_id: AtomicU64,
    /// How many connections were dropped (a read lane opened before a drop is dropped too).
    replaced: AtomicU64,
    /// A Cluster's slot map as a batch last read it (`Some(None)`: the reply was refused), with
    /// the count of connections dropped before it was read: a new connection is a new cluster
    /// client, which may meet another topology, so the map read before it is not used.
    slots: Mutex<Option<(u64, Option<Arc<SlotMap>>)>>,
}

impl Link {
    pub fn new(topology: Topology) -> Self {
        Link {
            connect_timeout: topology.connect_timeout,
            command_timeout: topology.command_timeout,
            topology,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            replaced: AtomicU64::new(0),
            slots: Mutex::new(None),
        }
    }

    /// The slot map read since the connection was last dropped: `None` when there is none
    /// (read it), `Some(None)` when its reply was refused (group by slot).
    pub fn slot_map(&self) -> Option<Option<Arc<SlotMap>>> {
        let slots = self.slots.lock_or_recover();
        match &*slots {
            Some((at, map)) if *at == self.replacements() => Some(map.clone()),
            _ => None,
        }
    }

    /// Keeps `map`, read while `at` connections had been dropped (see `replacements`).
    pub fn keep_slot_map(&self, at: u64, map: Option<Arc<SlotMap>>) {
        if at == self.replacements() {
            *self.slots.lock_or_recover() = Some((at, map));
        }
    }

    /// A node redirected a key (MOVED, ASK): the map is read again before the next batch.
    pub fn forget_slot_map(&self) {
        *self.slots.lock_or_recover() = None;
    }

    /// The shared connection if there is one (never makes one).
    pub fn current(&self) -> Option<Conn> {
        self.current.lock_or_recover().clone()
    }

    /// The shared connection, made within `connect_timeout` of `started` if there is none.
    pub async fn get(&self, started: Instant) -> RedisResult<Conn> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let left = || {
            self.connect_timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(50))
        };
        let _connecting = tokio::time::timeout(left(), self.connecting.lock())
            .await
            .map_err(|_| timed_out("timed out connecting to Redis"))?;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        loop {
            // A connection made while the master moved may reach the old one: made again.
            let moves = self.topology.moved();
            let made = self.topology.connect(left());
            let inner = match tokio::time::timeout(left(), made).await {
                Ok(Ok(inner)) => inner,
                failed => {
                    // The master may be gone from where it was followed to: ask again next time.
                    self.topology.forget_master();
                    return Err(match failed {
                        Ok(Err(e)) => e,
                        _ => timed_out("timed out connecting to Redis"),
                    });
                }
            };
            let mut current = self.current.lock_or_recover();
            if self.topology.moved() != moves {
                drop(current);
                if started.elapsed() >= self.connect_timeout {
                    return Err(timed_out("timed out connecting to Redis"));
                }
                continue;
            }
            let conn = Conn {
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                inner,
            };
            *current = Some(conn.clone());
            return Ok(conn);
        }
    }

    /// Drops connection `id` if it is still the shared one: the next command makes a new one,
    /// after asking the sentinels (if any) where the master is now.
    pub fn replace(&self, id: u64) {
        let mut current = self.current.lock_or_recover();
        if current.as_ref().is_some_and(|c| c.id == id) {
            *current = None;
            self.replaced.fetch_add(1, Ordering::Relaxed);
            drop(current);
            self.topology.forget_master();
        }
    }

    /// The master moved (Sentinel): the shared connection is dropped whatever it is, and so is
    /// any read lane opened or opening before (`replacements`), so that nothing goes on
    /// talking to the old master, which may take writes for seconds until it is demoted and
    /// then forgets them. Commands already sent on the old connection finish there.
    pub fn master_moved(&self) {
        *self.current.lock_or_recover() = None;
        self.replaced.fetch_add(1, Ordering::Relaxed);
    }

    /// How many connections were dropped so far.
    pub fn replacements(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_io_errors_and_timeouts_take_redis_down() {
        assert_eq!(classify(&timed_out("x")), Fault::Down);
        let refused = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(classify(&refused), Fault::Down);
        let readonly = redis::make_extension_error("READONLY".to_string(), None);
        assert_eq!(classify(&readonly), Fault::Reconnect);
        let noperm = redis::make_extension_error("NOPERM".to_string(), None);
        assert_eq!(classify(&noperm), Fault::Command);
    }
}
