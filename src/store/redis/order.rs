//! One instance's writes reach Redis in the order they were asked for. Each write would
//! otherwise be its own task on a multi-threaded runtime, and `set(k, 1); set(k, 2)` could land
//! as 2 then 1. Writes of one key run one after another; writes of different keys do not wait
//! for each other.
//!
//! A namespace-wide write (`deleteByTag`, `clear`) is ordered against every write: it waits for
//! the writes asked for before it, and the writes asked for after it wait for it. So
//! `set(k, v, { tags: ['t'] }); deleteByTag('t')` deletes the value, and
//! `deleteByTag('t'); set(k, v, { tags: ['t'] })` keeps it, awaited or not.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::sync::LockOrRecover;
use tokio::runtime::Handle;
use tokio::sync::Notify;

pub type Job = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

#[derive(Default)]
pub struct WriteOrder {
    /// The queues, and which writes are unfinished.
    state: Mutex<State>,
    /// Woken whenever a write finishes (barriers look again).
    finished: Notify,
}

#[derive(Default)]
struct State {
    /// Per key with a write running: the writes queued behind it. A key is present exactly
    /// while a drain task runs for it.
    queues: HashMap<String, VecDeque<Job>>,
    /// Numbers every write in the order it was asked for.
    next: u64,
    /// Writes asked for and not finished, by number.
    unfinished: BTreeSet<u64>,
    /// The namespace-wide ones among them.
    global: BTreeSet<u64>,
}

impl WriteOrder {
    /// Queues `job` behind the key's earlier writes (and any namespace-wide write asked for
    /// before it). Call it in call order (the JS thread does, synchronously, when the write is
    /// asked for).
    pub fn push(self: &Arc<Self>, runtime: &Handle, key: &str, job: Job) {
        let mut state = self.lock();
        let n = state.next;
        state.next += 1;
        state.unfinished.insert(n);
        let me = self.clone();
        let job: Job = Box::pin(async move {
            me.wait_until(|s| s.global.range(..n).next().is_none())
                .await;
            job.await;
            me.done(n);
        });
        if let Some(queue) = state.queues.get_mut(key) {
            queue.push_back(job);
            return;
        }
        state.queues.insert(key.to_string(), VecDeque::new());
        drop(state);
        runtime.spawn(self.clone().drain(key.to_string(), job));
    }

    /// Runs `job` once every write asked for before it has finished; writes asked for after it
    /// wait for it.
    pub fn push_global(self: &Arc<Self>, runtime: &Handle, job: Job) {
        let mut state = self.lock();
        let n = state.next;
        state.next += 1;
        state.unfinished.insert(n);
        state.global.insert(n);
        drop(state);
        let me = self.clone();
        runtime.spawn(async move {
            me.wait_until(|s| s.unfinished.range(..n).next().is_none())
                .await;
            job.await;
            me.done(n);
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    async fn wait_until(&self, ready: impl Fn(&State) -> bool) {
        loop {
            // Registered before looking, so a finish between the look and the wait still wakes.
            let notified = self.finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(&self.lock()) {
                return;
            }
            notified.await;
        }
    }

    fn done(&self, n: u64) {
        let mut state = self.lock();
        state.unfinished.remove(&n);
        state.global.remove(&n);
        drop(state);
        self.finished.notify_waiters();
    }

    async fn drain(self: Arc<Self>, key: String, first: Job) {
        let mut job = first;
        loop {
            job.await;
            let mut state = self.lock();
            match state.queues.get_mut(&key).and_then(VecDeque::pop_front) {
                Some(next) => job = next,
                None => {
                    state.queues.remove(&key);
                    return;
                }
            }
        }
    }

    /// Writes queued or running (for tests: none may be left behind).
    /// Whether a write of `key` was asked for and has not finished (queued, or sent and not
    /// answered yet): a read of the key sent meanwhile may be run by Redis before it.
    pub fn busy(&self, key: &str) -> bool {
        self.lock().queues.contains_key(key)
    }

    pub fn pending(&self) -> usize {
        self.lock().unfinished.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap()
    }

    fn settle(rt: &tokio::runtime::Runtime, order: &WriteOrder) {
        rt.block_on(async {
            while order.pending() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }

    #[test]
    fn writes_of_a_key_run_in_push_order_and_keys_run_side_by_side() {
        let rt = runtime();
        let order = Arc::new(WriteOrder::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..50u64 {
            for key in ["a", "b"] {
                let log = log.clone();
                order.push(
                    rt.handle(),
                    key,
                    Box::pin(async move {
                        // Later writes are quicker: unordered tasks would finish out of order.
                        tokio::time::sleep(Duration::from_micros(50 * (50 - i))).await;
                        log.lock().unwrap().push((key, i));
                    }),
                );
            }
        }
        settle(&rt, &order);
        let log = log.lock().unwrap();
        for key in ["a", "b"] {
            let seen: Vec<u64> = log.iter().filter(|(k, _)| *k == key).map(|e| e.1).collect();
            assert_eq!(seen, (0..50).collect::<Vec<_>>());
        }
        assert_eq!(order.pending(), 0);
    }

    #[test]
    fn a_namespace_wide_write_runs_between_the_writes_before_and_after_it() {
        let rt = runtime();
        let order = Arc::new(WriteOrder::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let job = |name: &'static str, ms: u64| -> Job {
            let log = log.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                log.lock().unwrap().push(name);
            })
        };
        order.push(rt.handle(), "a", job("a1", 30));
        order.push(rt.handle(), "b", job("b1", 10));
        order.push_global(rt.handle(), job("tag", 1));
        order.push(rt.handle(), "c", job("c1", 0));
        order.push(rt.handle(), "a", job("a2", 0));
        settle(&rt, &order);
        let log = log.lock().unwrap();
        let at = |name| log.iter().position(|n| *n == name).unwrap();
        assert!(at("tag") > at("a1") && at("tag") > at("b1"), "{log:?}");
        assert!(at("tag") < at("c1") && at("tag") < at("a2"), "{log:?}");
        assert!(at("a1") < at("a2"));
    }
}
