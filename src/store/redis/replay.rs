//! The changes Redis could not take, waiting to be replayed in the order they were made (each
//! says when: its place in the queue, whatever order they were queued in): a bounded queue (the
//! oldest dropped past `REPLAY_BOUND`), the keys it holds changes of, and
//! whether a drain runs. Generic over what a change is (`replaying.rs` says, and replays them);
//! this part runs no command.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::sync::LockOrRecover;

/// At most this many changes wait per cache; past it the oldest are dropped.
pub const REPLAY_BOUND: usize = 10_000;

/// What the queue needs to know of a change: the key it changes (`None`: the namespace),
/// whether it changes every key (a clear), and when it was made (unique and increasing in the
/// order this instance made its changes).
pub trait Change {
    fn key(&self) -> Option<&str>;
    fn every_key(&self) -> bool;
    fn made_at(&self) -> u64;
}

/// How a change that waited behind others ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Redis holds it (or found it older than what it holds: superseded, never applied).
    Taken,
    /// Redis could not take it yet: it stays queued.
    Queued,
}

/// One waiting change: what it is, who waits for its outcome (a change made while others
/// waited, sent behind them), and how often Redis refused it while up.
pub struct Queued<C> {
    pub change: C,
    pub waiter: Option<oneshot::Sender<Replayed>>,
    pub refusals: u32,
}

impl<C> Queued<C> {
    pub fn new(change: C, waiter: Option<oneshot::Sender<Replayed>>) -> Self {
        Queued {
            change,
            waiter,
            refusals: 0,
        }
    }
}

pub struct Replay<C> {
    /// The queue, oldest first, and how many changes of each key it holds.
    state: Mutex<State<C>>,
    /// The queue's length (read without the lock on every write and every success).
    len: AtomicUsize,
    /// One drain at a time.
    draining: AtomicBool,
}

struct State<C> {
    queue: VecDeque<Queued<C>>,
    keys: HashMap<String, usize>,
    /// How many waiting changes change every key.
    every: usize,
}

impl<C> Default for Replay<C> {
    fn default() -> Self {
        Replay {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                keys: HashMap::new(),
                every: 0,
            }),
            len: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
        }
    }
}

impl<C: Change> Replay<C> {
    /// Queues `q` in its place: behind every change made before it (nearly always the back; a
    /// replay Redis refused goes back in front); answers the changes dropped to keep the bound,
    /// the oldest.
    pub fn push(&self, q: Queued<C>) -> Vec<Queued<C>> {
        let mut state = self.state.lock_or_recover();
        if let Some(key) = q.change.key() {
            *state.keys.entry(key.to_string()).or_default() += 1;
        }
        state.every += usize::from(q.change.every_key());
        let made = q.change.made_at();
        let at = state
            .queue
            .iter()
            .rposition(|w| w.change.made_at() <= made)
            .map_or(0, |i| i + 1);
        state.queue.insert(at, q);
        let mut dropped = Vec::new();
        while state.queue.len() > REPLAY_BOUND {
            let Some(q) = state.queue.pop_front() else {
                break;
            };
            state.forget(&q.change);
            dropped.push(q);
        }
        self.len.store(state.queue.len(), Ordering::Release);
        dropped
    }

    /// Takes the oldest change out to replay it.
    pub fn pop(&self) -> Option<Queued<C>> {
        let mut state = self.state.lock_or_recover();
        let q = state.queue.pop_front()?;
        state.forget(&q.change);
        self.len.store(state.queue.len(), Ordering::Release);
        Some(q)
    }

    /// Answers every change's waiter (Redis refused the oldest: all of them stay queued).
    pub fn answer_waiters(&self, answer: Replayed) {
        let mut state = self.state.lock_or_recover();
        for q in state.queue.iter_mut() {
            if let Some(waiter) = q.waiter.take() {
                let _ = waiter.send(answer);
            }
        }
    }

    /// Takes every waiting change out (the cache closed).
    pub fn take_all(&self) -> Vec<Queued<C>> {
        let mut state = self.state.lock_or_recover();
        state.keys.clear();
        state.every = 0;
        self.len.store(0, Ordering::Release);
        state.queue.drain(..).collect()
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A change of `key` waits (a read of it from Redis may predate it).
    pub fn holds(&self, key: &str) -> bool {
        !self.is_empty() && self.state.lock_or_recover().keys.contains_key(key)
    }

    /// What `read` makes of the newest waiting change of `key`, or of every key (`None`: none
    /// waits).
    pub fn newest_of<R>(&self, key: &str, read: impl FnOnce(&C) -> R) -> Option<R> {
        if self.is_empty() {
            return None;
        }
        let state = self.state.lock_or_recover();
        if state.every == 0 && !state.keys.contains_key(key) {
            return None;
        }
        let q = state
            .queue
            .iter()
            .rev()
            .find(|q| q.change.every_key() || q.change.key() == Some(key))?;
        Some(read(&q.change))
    }

    /// True for the one caller that may start the drain now.
    pub fn begin_drain(&self) -> bool {
        self.draining
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn end_drain(&self) {
        self.draining.store(false, Ordering::Release);
    }
}

impl<C: Change> State<C> {
    fn forget(&mut self, change: &C) {
        self.every -= usize::from(change.every_key());
        let Some(key) = change.key() else { return };
        if let Some(n) = self.keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set of a key, or (`*`) a clear.
    struct Set(String, u32);
    impl Change for Set {
        fn key(&self) -> Option<&str> {
            Some(self.0.as_str()).filter(|k| *k != "*")
        }
        fn every_key(&self) -> bool {
            self.0 == "*"
        }
        fn made_at(&self) -> u64 {
            u64::from(self.1)
        }
    }

    fn q(n: u32) -> Queued<Set> {
        Queued::new(Set(format!("k{}", n % 3), n), None)
    }

    #[test]
    fn changes_come_back_oldest_first_and_the_bound_drops_the_oldest() {
        let replay = Replay::default();
        let mut dropped = Vec::new();
        for n in 0..(REPLAY_BOUND as u32 + 5) {
            dropped.extend(replay.push(q(n)));
        }
        assert_eq!(replay.len(), REPLAY_BOUND);
        let gone: Vec<u32> = dropped.iter().map(|q| q.change.1).collect();
        assert_eq!(gone, vec![0, 1, 2, 3, 4]);
        let first = replay.pop().unwrap();
        assert_eq!(first.change.1, 5);
        assert!(replay.push(first).is_empty(), "put back in front");
        let mut seen = Vec::new();
        while let Some(q) = replay.pop() {
            seen.push(q.change.1);
        }
        assert_eq!(seen, (5..REPLAY_BOUND as u32 + 5).collect::<Vec<_>>());
        assert!(replay.is_empty());
        assert!(!replay.holds("k0"), "no key is left held");
    }

    #[test]
    fn changes_queued_out_of_order_wait_in_the_order_they_were_made() {
        let replay = Replay::default();
        for n in [3, 1, 4, 0, 2] {
            replay.push(q(n));
        }
        let order: Vec<u32> = std::iter::from_fn(|| replay.pop())
            .map(|q| q.change.1)
            .collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_key_is_held_while_a_change_of_it_waits() {
        let replay = Replay::default();
        replay.push(q(0));
        replay.push(q(3));
        assert!(replay.holds("k0") && !replay.holds("k1"));
        replay.pop();
        assert!(replay.holds("k0"));
        replay.pop();
        assert!(!replay.holds("k0"));
        replay.push(q(1));
        assert_eq!(replay.take_all().len(), 1);
        assert!(replay.is_empty() && !replay.holds("k1"));
    }

    #[test]
    fn the_newest_waiting_change_of_a_key_is_found() {
        let replay: Replay<Set> = Replay::default();
        assert_eq!(replay.newest_of("k0", |c| c.1), None);
        for n in [0, 1, 3, 4] {
            replay.push(q(n));
        }
        assert_eq!(replay.newest_of("k0", |c| c.1), Some(3));
        assert_eq!(replay.newest_of("k1", |c| c.1), Some(4));
        assert_eq!(replay.newest_of("k2", |c| c.1), None);
        replay.push(Queued::new(Set("*".into(), 5), None));
        assert_eq!(
            replay.newest_of("k2", |c| c.1),
            Some(5),
            "a clear changes every key"
        );
        replay.push(q(6));
        assert_eq!(replay.newest_of("k0", |c| c.1), Some(6));
        assert_eq!(replay.newest_of("k1", |c| c.1), Some(5));
        while replay.pop().is_some() {}
        assert_eq!(
            replay.newest_of("k1", |c| c.1),
            None,
            "no clear is left counted"
        );
    }

    #[test]
    fn one_drain_at_a_time() {
        let replay: Replay<Set> = Replay::default();
        assert!(replay.begin_drain());
        assert!(!replay.begin_drain());
        replay.end_drain();
        assert!(replay.begin_drain());
    }
}
