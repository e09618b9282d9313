//! The cross-process lock's own state in this process: how long a lock lives (`lockTtl`), who
//! waits here for a key's holder to finish (woken by the bus's announcement of the key, or by
//! a change of the bus, after which announcements may have been missed), and how long one bid
//! may wait. The bids themselves (`cold_gate.lua`, `refresh_gate.lua`) and the release run on
//! the tier's connection (`gates.rs`).
//!
//! It also keeps what the gates need to know of the bus for the namespace clock a load is born
//! at (see `Lock::vouched`): how often the bus changed (went up or down), and when Redis's clock
//! was last read while it stayed up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::sync::LockOrRecover;

/// While the bus is down, lock waiters look again this often (no notification can come).
const POLL_WITHOUT_BUS: Duration = Duration::from_millis(100);

/// How long a read of Redis's namespace clock, made with the bus up, vouches for the clock this
/// process knows (see `Lock::vouched`).
pub const CLOCK_VOUCHED_FOR: Duration = Duration::from_secs(1);

/// The lock's life and its waiters here.
pub struct Lock {
    /// `lockTtl`, at least 1 ms.
    ttl_ms: u64,
    waiters: Waiters,
    /// Changes of the bus (up, down) and the cache's close: every one wakes every waiter.
    bus_changes: AtomicU64,
    /// The last read of Redis's clock that vouches (see `vouch`): the bus changes as it was
    /// sent, and when.
    vouched: Mutex<Option<(u64, Instant)>>,
}

/// A read of Redis's namespace clock as it is sent (see `Lock::vouch`).
#[derive(Debug, Clone, Copy)]
pub struct ClockRead {
    bus_changes: u64,
    bus_up: bool,
    at: Instant,
}

impl Lock {
    pub fn new(ttl_ms: u64) -> Self {
        Lock {
            ttl_ms: ttl_ms.max(1),
            waiters: Waiters::default(),
            bus_changes: AtomicU64::new(0),
            vouched: Mutex::new(None),
        }
    }

    /// A read of Redis's namespace clock about to be sent, at `now`, with the bus as `bus_up`.
    pub fn clock_read(&self, bus_up: bool, now: Instant) -> ClockRead {
        ClockRead {
            bus_changes: self.bus_changes.load(Ordering::Acquire),
            bus_up,
            at: now,
        }
    }

    /// `read` answered, and what it answered is known here (raised first if Redis had lost the
    /// clock): it vouches for the clock known here, if the bus was up as it was sent and has not
    /// changed since.
    pub fn vouch(&self, read: ClockRead) {
        if read.bus_up && self.bus_changes.load(Ordering::Acquire) == read.bus_changes {
            *self.vouched.lock_or_recover() = Some((read.bus_changes, read.at));
        }
    }

    /// Whether the namespace clock known here may stand for Redis's at `now`, so a load born now
    /// need not read it: Redis's clock was read less than `CLOCK_VOUCHED_FOR` ago, and the bus
    /// was up then and has stayed up since. Every advance of the clock is announced in the script
    /// that makes it (`tags.lua`, `clear.lua`; on a Cluster by the tag's record), so the clock
    /// known here is then Redis's, or behind it by an announcement still on its way: a load born
    /// too early is only ever conservative (its result is dead after a deleteByTag or clear it
    /// did not precede: one more load, never a value served past one). What the bus cannot tell
    /// is Redis losing its clock without a change of the bus (a FLUSHALL, the meta hash
    /// evicted): a read at least every `CLOCK_VOUCHED_FOR` finds that and raises it again
    /// (advance_of.lua), as loads already running when Redis lost it have to wait for too.
    pub fn vouched(&self, bus_up: bool, now: Instant) -> bool {
        if !bus_up {
            return false;
        }
        let changes = self.bus_changes.load(Ordering::Acquire);
        matches!(*self.vouched.lock_or_recover(),
            Some((c, at)) if c == changes && now.saturating_duration_since(at) < CLOCK_VOUCHED_FOR)
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

    /// Every waiter looks again (the bus went up or down, or the cache closed); no read of
    /// Redis's clock made before vouches any more.
    pub fn wake_all(&self) {
        self.bus_changes.fetch_add(1, Ordering::AcqRel);
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
    fn a_clock_read_vouches_only_while_the_bus_stays_up_and_for_a_second_at_most() {
        let lock = Lock::new(1_000);
        let t0 = Instant::now();
        assert!(!lock.vouched(true, t0), "nothing read yet");
        // Read with the bus down: vouches for nothing.
        lock.vouch(lock.clock_read(false, t0));
        assert!(!lock.vouched(true, t0));
        lock.vouch(lock.clock_read(true, t0));
        assert!(lock.vouched(true, t0));
        assert!(lock.vouched(true, t0 + CLOCK_VOUCHED_FOR - Duration::from_millis(1)));
        assert!(
            !lock.vouched(true, t0 + CLOCK_VOUCHED_FOR),
            "read again every second"
        );
        assert!(!lock.vouched(false, t0), "not while the bus is down");
        // A change of the bus voids it, and a read sent before the change vouches for nothing.
        let sent = lock.clock_read(true, t0);
        lock.wake_all();
        assert!(!lock.vouched(true, t0));
        lock.vouch(sent);
        assert!(!lock.vouched(true, t0));
        lock.vouch(lock.clock_read(true, t0));
        assert!(lock.vouched(true, t0));
    }

    #[test]
    fn a_lock_lives_at_least_a_millisecond() {
        assert_eq!(Lock::new(0).ttl_ms(), 1);
        assert_eq!(Lock::new(250).ttl_ms(), 250);
    }
}
