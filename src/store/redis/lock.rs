//! The cross-process lock's own state in this process: how long a lock lives (`lockTtl`), who
//! waits here for a key's holder to finish (woken by the bus's announcement of the key, or by
//! a change of the bus, after which announcements may have been missed), and how long one bid
//! may wait. The bids themselves (`cold_gate.lua`, `refresh_gate.lua`) and the release run on
//! the tier's connection (`gates.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::sync::LockOrRecover;

/// While the bus is down, lock waiters look again this often (no notification can come).
const POLL_WITHOUT_BUS: Duration = Duration::from_millis(100);

/// The lock's life and its waiters here.
pub struct Lock {
    /// `lockTtl`, at least 1 ms.
    ttl_ms: u64,
    waiters: Waiters,
}

impl Lock {
    pub fn new(ttl_ms: u64) -> Self {
        Lock {
            ttl_ms: ttl_ms.max(1),
            waiters: Waiters::default(),
        }
    }

    /// How long a lock taken now lives in Redis (PX of the bid).
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// A waiter for `key`'s holder, registered now (before the look, so an announcement
    /// between the look and the wait still wakes it).
    pub fn register(&self, key: &str) -> Waiter<'_> {
        self.waiters.register(key)
    }

    /// The key's holder announced its end: its waiters look again.
    pub fn wake(&self, key: &str) {
        self.waiters.wake(key);
    }

    /// Every waiter looks again (the bus went up or down, or the cache closed).
    pub fn wake_all(&self) {
        self.waiters.wake_all();
    }

    /// Keys with a waiter registered (for tests: none may be left behind).
    pub fn waiting_keys(&self) -> usize {
        self.waiters.len()
    }

    /// The patience of a bid that begins at `started`.
    pub fn patience(&self, started: Instant) -> Patience {
        let ttl = Duration::from_millis(self.ttl_ms);
        Patience {
            ttl,
            deadline: started + ttl,
            give_up: started + 2 * ttl,
            waited: false,
        }
    }
}

/// How long one bid may still wait: no wait for one holder lasts longer than lockTtl, and no
/// bid waits for more than two holders (2 x lockTtl in all).
pub struct Patience {
    ttl: Duration,
    /// When the holder waited for now is taken to be gone.
    deadline: Instant,
    give_up: Instant,
    waited: bool,
}

impl Patience {
    /// True the first time only: the bid waits from now on (counted once as a lockWait).
    pub fn begins_waiting(&mut self) -> bool {
        !std::mem::replace(&mut self.waited, true)
    }

    pub fn waited(&self) -> bool {
        self.waited
    }

    /// Another process holds the lock for `left_ms` more (as of `now`): how long to wait
    /// before looking again, or `None` once two holders' lockTtl are spent (the bid then loads
    /// without the lock). Past the first holder's deadline, the holder that took over is waited
    /// for too (or the first holder's late value), never past the end.
    pub fn held(&mut self, left_ms: u64, now: Instant) -> Option<Duration> {
        let left = Duration::from_millis(left_ms + 1);
        if now >= self.deadline {
            if now >= self.give_up {
                return None;
            }
            self.deadline = (now + left.min(self.ttl)).min(self.give_up);
        }
        Some(left.min(self.deadline - now))
    }

    /// A wait of `wait`, or shorter while the bus is down (no announcement can wake it then).
    pub fn paced(wait: Duration, bus_up: bool) -> Duration {
        if bus_up {
            wait
        } else {
            wait.min(POLL_WITHOUT_BUS)
        }
    }
}

/// Lock waiters by key.
#[derive(Default)]
struct Waiters {
    /// Per key: what wakes its waiters, and how many are registered (the last one out removes
    /// the entry; counting explicitly, not by Arc count, so a wake in progress cannot leave an
    /// empty entry behind).
    map: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

/// One registered waiter; dropping it unregisters.
pub struct Waiter<'a> {
    waiters: &'a Waiters,
    key: String,
    pub notify: Arc<Notify>,
}

impl Waiters {
    fn register(&self, key: &str) -> Waiter<'_> {
        let mut map = self.map.lock_or_recover();
        let entry = map.entry(key.to_string()).or_default();
        entry.1 += 1;
        Waiter {
            waiters: self,
            key: key.to_string(),
            notify: entry.0.clone(),
        }
    }

    fn wake(&self, key: &str) {
        let notify = self.map.lock_or_recover().get(key).map(|e| e.0.clone());
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .map
            .lock_or_recover()
            .values()
            .map(|e| e.0.clone())
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }

    fn len(&self) -> usize {
        self.map.lock_or_recover().len()
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.map.lock_or_recover();
        if let Some(entry) = map.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_waiter_out_removes_the_key_even_while_a_wake_holds_the_notify() {
        let lock = Lock::new(1_000);
        let a = lock.register("k");
        let b = lock.register("k");
        // A wake in progress holds a clone of the Notify, as the bus does while it wakes.
        let held = a.notify.clone();
        drop(a);
        drop(b);
        assert_eq!(lock.waiting_keys(), 0);
        drop(held);
        assert_eq!(lock.waiting_keys(), 0);
    }

    #[test]
    fn a_bid_waits_one_holder_at_most_lock_ttl_and_two_at_most_twice_that() {
        let lock = Lock::new(100);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut p = lock.patience(t0);
        assert!(!p.waited());
        assert!(p.begins_waiting());
        assert!(!p.begins_waiting(), "counted once");
        // The first holder: what its lock has left (and a millisecond), within lockTtl.
        assert_eq!(p.held(50, t0), Some(ms(51)));
        assert_eq!(p.held(5_000, t0 + ms(30)), Some(ms(70)));
        // Past it, another took over: waited for up to lockTtl more, never past 2 x lockTtl.
        assert_eq!(p.held(5_000, t0 + ms(100)), Some(ms(100)));
        assert_eq!(p.held(5_000, t0 + ms(150)), Some(ms(50)));
        assert_eq!(p.held(5_000, t0 + ms(200)), None);
    }

    #[test]
    fn without_the_bus_a_waiter_polls() {
        let ms = Duration::from_millis;
        assert_eq!(Patience::paced(ms(5_000), true), ms(5_000));
        assert_eq!(Patience::paced(ms(5_000), false), POLL_WITHOUT_BUS);
        assert_eq!(Patience::paced(ms(20), false), ms(20));
    }

    #[test]
    fn a_lock_lives_at_least_a_millisecond() {
        assert_eq!(Lock::new(0).ttl_ms(), 1);
        assert_eq!(Lock::new(250).ttl_ms(), 250);
    }
}
